"""`r1cloud eval`: score checkpoints, models and endpoints on held-out data, side by side."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from functools import partial
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from r1cloud.checkpoint.store import NotFound, parse_ref
from r1cloud.cli.common import app, err, fail, failing, load_blueprint, need_file, out
from r1cloud.cli.serving import MaxTokensOption, TemperatureOption, merging
from r1cloud.core.jobstore import JobStore, home
from r1cloud.core.paths import expand
from r1cloud.evaluation import run as ev
from r1cloud.evaluation.metrics import summarize
from r1cloud.jobs.supervise import last_error
from r1cloud.rewards.pool import RewardDeadline, from_config
from r1cloud.serving import serve as sv

ENGINES = ("auto", "vllm", "hf")


@app.command("eval")
def eval_(
    targets: Annotated[
        list[str],
        typer.Argument(
            help="What to score: a job (its last checkpoint) or JOB:step-N, a checkpoint or model folder, a "
            "Hub id, a bucket URL, or a running OpenAI-compatible endpoint (http://…/v1). Several: side by side."
        ),
    ],
    data: Annotated[
        str | None,
        typer.Option(
            "--data",
            help="Prompts with answers, EasyR1's syntax: name@split (Hub), a file or a folder. "
            "Default: the blueprint's (or the job's) data.val_files.",
        ),
    ] = None,
    blueprint: Annotated[
        Path | None,
        typer.Option(
            "--blueprint",
            help="Take prompt_key, answer_key, format_prompt, reward and sampling from it (default: the "
            "first job among the targets).",
        ),
    ] = None,
    n: Annotated[
        int | None,
        typer.Option("--n", min=1, max=10_000, help="Samples per prompt: pass@k and mean@k for k ≤ n."),
    ] = None,
    temperature: Annotated[float | None, TemperatureOption] = None,
    max_tokens: Annotated[int | None, MaxTokensOption] = None,
    reward: Annotated[str | None, typer.Option("--reward", help="The reward as FILE.py[:FUNCTION].")] = None,
    format_prompt: Annotated[
        Path | None, typer.Option("--format-prompt", help="A Jinja format prompt over `content`.")
    ] = None,
    prompt_key: Annotated[str | None, typer.Option("--prompt-key", help="The column of questions.")] = None,
    answer_key: Annotated[str | None, typer.Option("--answer-key", help="The column of answers.")] = None,
    image_key: Annotated[
        str | None, typer.Option("--image-key", help="The column of pictures (paths or images).")
    ] = None,
    image_dir: Annotated[
        Path | None, typer.Option("--image-dir", help="Where relative picture paths start.")
    ] = None,
    limit: Annotated[
        int | None, typer.Option("--limit", min=1, max=10**9, help="Only the first N prompts.")
    ] = None,
    engine: Annotated[str, typer.Option("--engine", help="auto (vLLM if installed), vllm or hf.")] = "auto",
    api_key: Annotated[
        str | None,
        typer.Option(
            "--api-key", envvar="R1CLOUD_API_KEY", help="Bearer key of endpoint targets.", show_default=False
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")] = False,
    out_dir: Annotated[
        Path | None,
        typer.Option(
            "--out",
            help="Write each target's samples (JSONL) and summary.json here (default: a new folder under "
            "R1CLOUD_HOME/evals).",
        ),
    ] = None,
) -> None:
    """Did RL help, and by how much, on data it never saw? Each target answers the same prompts with
    the same sampling; the run's reward scores them. Reports accuracy, pass@k (unbiased) and mean@k,
    each reward key, response length and truncation, by data_source when the data has one, with a 95%
    interval over prompts in every cell."""
    if engine not in ENGINES:
        fail("error: bad --engine", [f"{engine!r}: use {', '.join(ENGINES)}"])
    keys = {"prompt_key": prompt_key, "answer_key": answer_key, "image_key": image_key}
    spec = _spec(targets, blueprint, data, reward, format_prompt, keys, image_dir)
    sampling = ev.validation_sampling(spec, n, temperature, max_tokens)
    if sampling["n"] > 1 and sampling["temperature"] == 0:
        err.print(
            "warning: greedy samples are all alike: pass@k equals pass@1 (set --temperature)", style="yellow"
        )
    folder = out_dir or home() / "evals" / time.strftime("%Y%m%d-%H%M%S")
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
        fail(
            f"error: --out {folder} is not an empty folder",
            ["give a new folder: nothing there is overwritten"],
        )
    with failing(sv.ServeError):
        chosen = sv.pick_engine(engine, "hf")
    resolved = [_resolve(t, api_key, spec) for t in targets]
    for i, target in enumerate(resolved, 1):
        target.folder = folder / f"{i}-{re.sub(r'[^A-Za-z0-9_.-]+', '_', target.ref).strip('_')[:60]}"
        ev.prepare(target, spec, sampling, chosen, limit, api_key)
    code, ran = 0, []
    for target in resolved:
        ran.append(target)
        code = _run(target)
        if code:  # interrupted, or failed: the next targets are not started; what was scored is shown
            break
    summary = {"data": spec.data.val_files, "sampling": sampling, "engine": chosen, "targets": []}
    for target in ran:
        samples = ev.read_samples(target.folder)
        summary["targets"].append(
            {"target": target.ref, "model": target.origin, "samples": str(target.folder / "samples.jsonl")}
            | summarize(samples)
            | {"timing": ev.read_timing(target.folder)}
        )
    (folder / "summary.json").write_text(json.dumps(summary, indent=2))
    scored = any(t["all"]["samples"] for t in summary["targets"])
    if as_json:
        print(json.dumps(summary, indent=2))
    elif scored:
        _table(summary)
        err.print(f"samples and summary.json in {folder}", markup=False)
    if code not in (0, 130):
        _failed(ran[-1])
        raise typer.Exit(2 if code == 2 else 1)
    if code == 130:
        err.print("interrupted: the table holds what was scored", style="yellow")
        raise typer.Exit(130)


def _spec(targets, blueprint, data, reward, format_prompt, keys: dict, image_dir: Path | None):
    """The blueprint's spec (or the first job's), with the options set alone on top."""
    from r1cloud.spec.models import Spec  # loads the schema (pydantic): not at start-up
    from r1cloud.validate.files import reward_function_problems

    if blueprint is not None:
        base = load_blueprint(blueprint, [], {}, str(blueprint))
    else:
        base = next((s for s in map(_job_spec, targets) if s is not None), None) or Spec(name="eval")
    tree = base.model_dump()
    d, r = tree["data"], tree["worker"]["reward"]
    if data is not None:
        local = expand(data.rpartition("@")[0] if "@" in data else data)
        if local.suffix or data.startswith((".", "/", "~")):
            if not local.exists():
                fail(f"error: --data {data}: no such file or folder", ["give a file, a folder or name@split"])
            data = str(local.resolve()) + (f"@{data.rpartition('@')[2]}" if "@" in data else "")
        d["val_files"] = data
    d.update({key: value for key, value in keys.items() if value is not None})
    if image_dir is not None:
        if not image_dir.is_dir():
            fail(
                f"error: --image-dir {image_dir}: no such folder",
                ["give the folder the picture paths start in"],
            )
        d["image_dir"] = str(image_dir.resolve())
    if format_prompt is not None:
        need_file("--format-prompt", format_prompt, "give a Jinja template over `content`")
        d["format_prompt"] = str(format_prompt.resolve())
    if reward is not None:
        path, _, name = reward.partition(":")
        if not Path(path).is_file():
            fail(f"error: --reward {reward}: no such file", ["give FILE.py or FILE.py:FUNCTION"])
        r["reward_function"], r["reward_function_name"] = str(Path(path).resolve()), name or "compute_score"
        if problems := reward_function_problems(
            Path(path), r["reward_function_name"], r["reward_function_kwargs"]
        ):
            fail(f"error: --reward {reward}", problems)
    if not d["val_files"]:
        fail(
            "error: no data to score",
            ["give --data (name@split, a file or a folder), or a blueprint with data.val_files"],
        )
    if not r["reward_function"]:
        fail(
            "error: no reward to score with",
            ["give --reward FILE.py[:FUNCTION], or a blueprint that names one"],
        )
    spec = Spec.model_validate(tree)
    _check_before_starting(spec)
    return spec


def _check_before_starting(spec) -> None:
    """What would fail after the model is up, said first (exit 2): the rows and the format prompt
    (as validate reads them), and the reward on one row's own answer."""
    from r1cloud.validate.files import check_data  # loads the schema (pydantic): not at start-up

    if problems := [message for _, message in check_data(spec.data, keys=("val_files",))]:
        fail("error: the data cannot be scored", problems)
    d = spec.data
    values = d.val_files if isinstance(d.val_files, list) else [d.val_files]
    row = next((r for v in values if (r := _first_row(v)) is not None), {})
    answer = str(row.get(d.answer_key, "1"))
    try:
        reward = from_config(spec.worker.reward, bounded=True)
    except Exception as e:  # the module raised on import, or names no such function
        fail(f"error: the reward cannot be loaded: {type(e).__name__}: {str(e)[:200]}", [])
    try:
        probe = {"response": answer, "response_length": 1, "ground_truth": answer}
        asked = {k: row.get(d.prompt_key if k == "prompt" else k) for k in reward.wants}  # REWARD_INPUT_KEYS
        _, errors = reward([{**probe, **asked}])
    except RewardDeadline as e:
        fail(f"error: {e}", [])
    finally:
        reward.close()
    if errors:
        fail(f"error: the reward fails on a row's own answer ({answer[:40]!r})", sorted(reward.reasons)[:3])


def _first_row(value: str) -> dict | None:
    from r1cloud.validate import data_check as dc  # loads the schema (pydantic): not at start-up

    try:
        files = dc.local_files(value) if value else None
        return next((row for _, row in dc.rows(files[0], limit=1)), None) if files else None
    except dc.DataError:
        return None


def _job_spec(target: str):
    try:
        return sv.job_spec(target)
    except Exception as e:  # a damaged spec.yaml: one line
        path = JobStore().path(parse_ref(target)[0]) / "spec.yaml"
        fail(
            f"error: {path} cannot be read ({type(e).__name__})",
            ["give --blueprint BP for the prompts and reward"],
        )


def _resolve(ref: str, api_key: str | None, spec):
    with failing(sv.ServeError, NotFound):
        if ref.startswith(("http://", "https://")):
            from r1cloud.serving.chat import remote  # HTTP, the sandbox: not at start-up

            endpoint = remote(ref, api_key)
            return ev.Target(
                ref, url=endpoint.url, served=endpoint.model, origin=f"{endpoint.url} ({endpoint.model})"
            )
        # merged at the engine's dtype, so fp32 training is scored on fp32 weights
        merge = partial(
            merging, note=": merging its weights for the engine…", dtype=spec.worker.rollout.dtype
        )
        model = sv.resolve(ref, merge)
    return ev.Target(ref, model=model.path, origin=model.origin)


def _run(target) -> int:
    """Score one target in its own process, showing progress: the child's exit code (130 when
    interrupted with Ctrl-C). The child never outlives this call."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    log = target.folder / "engine.log"
    with (
        open(log, "w") as sink,
        Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=err,
        ) as bar,
    ):
        task = bar.add_task(f"{target.ref}: starting", total=None)
        proc = subprocess.Popen(
            [sys.executable, "-m", "r1cloud.evaluation.run", str(target.folder)],
            stdout=subprocess.PIPE,
            stderr=sink,
            text=True,
        )
        try:
            for line in proc.stdout:
                if m := re.match(r"\[eval\] (\d+)/(\d+)", line):
                    bar.update(task, description=target.ref, completed=int(m[1]), total=int(m[2]))
            return proc.wait()
        except KeyboardInterrupt:
            _stop(proc)
            return 130
        finally:
            if proc.poll() is None:  # an error here: the child goes too
                proc.kill()
                proc.wait()


def _stop(proc) -> None:
    """After Ctrl-C: the child, which had the same Ctrl-C from the terminal (or is sent one now),
    writes what it scored and exits; a second Ctrl-C, or a minute, ends it at once."""
    try:
        try:
            proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=60)
    except (KeyboardInterrupt, subprocess.TimeoutExpired):
        proc.kill()
        proc.wait()


def _failed(target) -> None:
    log = target.folder / "engine.log"
    cause = last_error(log).removeprefix("error: ")
    err.print(f"error: {target.ref}: {cause}", style="bold red", markup=False)
    err.print(f"  its log: {log}", markup=False)


def _table(summary: dict) -> None:
    targets = summary["targets"]
    table = Table(box=None, header_style="bold", title_justify="left")
    table.add_column("")
    for t in targets:
        table.add_column(t["target"], justify="right")
    sections = [("", [t["all"] for t in targets])]
    for source in sorted({s for t in targets for s in t.get("by_source", {})}):
        sections.append((f"[{source}] ", [t.get("by_source", {}).get(source, {}) for t in targets]))
    for prefix, columns in sections:
        for name in dict.fromkeys(k for figures in columns for k in figures if k != "n"):
            table.add_row(prefix + name, *(_cell(f.get(name)) for f in columns))
    out.print(table)
    out.print("± is a 95% interval over prompts (1.96 standard errors)", style="dim")


def _cell(value) -> str:
    if value is None:
        return "—"
    if isinstance(value, list | tuple):
        mean, se = value
        return f"{mean:.3f} ± {1.96 * se:.3f}" if mean == mean else "—"
    return str(value)
