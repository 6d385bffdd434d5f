"""`checkpoints` and `merge`: list a job's checkpoints, and write one as a Hugging Face model."""

from __future__ import annotations

import importlib.util
import tempfile
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from r1cloud.checkpoint.hub import HubError, push_folder
from r1cloud.checkpoint.store import (
    NotFound,
    human_size,
    job_checkpoint_root,
    list_checkpoints,
    locate,
    parse_ref,
    select,
)
from r1cloud.cli.common import app, err, fail, failing, find_job, out, when
from r1cloud.core.paths import expand


def _checkpoint_source(target: str | None) -> tuple[str, str, int | None]:
    """(checkpoints root, label for IDs, step or None) for a job, JOB:step-N, a folder or a URL."""
    ref, step = parse_ref(target) if target else (None, None)
    with failing(NotFound):
        found = locate(ref, step) if ref else None
    if found:
        return found
    store, job = find_job(ref)
    return job_checkpoint_root(store.path(job.name)), job.name, step


@app.command()
def checkpoints(
    target: Annotated[
        str | None,
        typer.Argument(help="A job (default: the latest), a checkpoints folder, or a URL (s3://…)."),
    ] = None,
) -> None:
    """List checkpoints: step, time, rewards, what they hold (all weights, or a LoRA run's adapters),
    size, INFERENCE READY, and the ID to merge or serve."""
    root, label, _ = _checkpoint_source(target)
    found = list_checkpoints(root, label)
    if not found:
        out.print(f"no checkpoints yet in {root}", markup=False)
        return
    table = Table(box=None, header_style="bold")
    for col in ("ID", "STEP", "TIME", "TRAIN REWARD", "VAL REWARD", "WEIGHTS", "SIZE", "INFERENCE READY"):
        table.add_column(col, no_wrap=True)
    for c in found:
        fmt = lambda v: f"{v:.3f}" if v is not None else "—"  # noqa: E731
        ready = "[green]yes[/]" if c.inference_ready else f"no — r1cloud merge {c.id}"
        table.add_row(
            c.id,
            str(c.step),
            when(c.time),
            fmt(c.train_reward),
            fmt(c.val_reward),
            f"LoRA r={c.lora_rank}" if c.lora_rank else "all",
            human_size(c.size),
            ready,
        )
    out.print(table)


@app.command()
def merge(
    target: Annotated[
        str, typer.Argument(help="JOB[:step-N], a checkpoint folder (r1cloud's or EasyR1's), or PATH:step-N.")
    ],
    out_dir: Annotated[
        Path | None, typer.Option("--out", help="Output folder (default: the checkpoint's huggingface/).")
    ] = None,
    dtype: Annotated[
        str, typer.Option("--dtype", help="bf16, fp16 or fp32 (as trained: fp32 keeps the bits).")
    ] = "bf16",
    push_to_hub: Annotated[
        str | None,
        typer.Option(
            "--push-to-hub",
            metavar="REPO",
            help="Then upload the folder to this Hub model repo (created if missing; token from HF_TOKEN).",
        ),
    ] = None,
    private: Annotated[bool, typer.Option("--private", help="Create the Hub repo private.")] = False,
    base: Annotated[
        Path | None,
        typer.Option(
            "--base",
            help="The base model's folder, whose config and tokenizer describe the merged model, for a "
            "checkpoint saved without huggingface/.",
        ),
    ] = None,
    force: Annotated[
        bool, typer.Option("--force", help="Replace a previous merge in --out (never other files).")
    ] = False,
    adapter_only: Annotated[
        bool,
        typer.Option(
            "--adapter-only",
            help="LoRA runs: write the adapter as peft does (adapter_config.json, adapter_model.safetensors;"
            " default folder: the checkpoint's adapter/), for PeftModel or `vllm serve --enable-lora`.",
        ),
    ] = False,
) -> None:
    """Write a Hugging Face model folder (config, tokenizer, sharded safetensors) from a checkpoint,
    streaming: memory stays about one output shard. A LoRA run's adapters are folded into its base
    model (or, with --adapter-only, written as a peft folder). A bucket checkpoint (s3://…) is
    merged locally and uploaded back into its huggingface/ folder unless --out is given."""
    if dtype not in ("bf16", "fp16", "fp32"):
        fail("error: bad --dtype", [f"{dtype!r}: use bf16, fp16 or fp32"])
    if importlib.util.find_spec("torch") is None or importlib.util.find_spec("safetensors") is None:
        fail(
            "error: merging needs torch and safetensors",
            ["install the training extra: scripts/install (or pip install 'r1cloud[train]')"],
        )
    with failing(NotFound):
        chosen = select(*_checkpoint_source(target))
    if push_to_hub and out_dir is None and "://" in chosen.path:
        # the Hub client uploads local files: merge a bucket checkpoint locally
        out_dir = Path(tempfile.mkdtemp(prefix="r1cloud-push-")) / "model"
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    from r1cloud.checkpoint.merge import MergeError, check_out
    from r1cloud.checkpoint.merge import merge as do_merge

    try:
        if out_dir is not None:  # one path for the check and the write (`--out=~/x`, `--out .`)
            out_dir = expand(out_dir).resolve()
            if base is not None and expand(base).resolve() == out_dir:
                raise MergeError(f"--out {out_dir} is the --base model's folder: give a new folder")
            check_out(out_dir, chosen, force)
        with Progress(
            TextColumn("merging {task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            console=err,
            disable=not err.is_terminal,
        ) as bar:
            task = bar.add_task(chosen.id, total=None)
            if base is not None and not (base / "config.json").is_file():
                fail(f"error: --base {base} has no config.json", ["give a Hugging Face model folder"])
            path = do_merge(
                chosen,
                out_dir,
                dtype,
                model_src=str(base) if base else None,
                progress=lambda i, n: bar.update(task, completed=i, total=n),
                adapter_only=adapter_only,
            )
    except MergeError as e:
        fail("error: cannot merge", [str(e)])
    out.print(f"merged {chosen.id} into {path}", markup=False)
    if push_to_hub:
        err.print(f"pushing {path} to the Hub as {push_to_hub} …", markup=False)
        try:
            url = push_folder(path, push_to_hub, private=private, message=f"r1cloud merge {chosen.id}")
        except HubError as e:
            fail("error: push to the Hub failed", [str(e), f"the merged model is kept in {path}"])
        out.print(f"pushed to {url}", markup=False)
