"""Merging a checkpoint into a Hugging Face model folder — config, generation config, tokenizer and
sharded safetensors with an index, loadable by `from_pretrained` and by vLLM — atomically, and
replacing only what a merge wrote. It streams: output shards are planned from metadata, then
filled one at a time (folder.py), from an r1cloud checkpoint (from_dcp.py) or EasyR1's (from_easyr1.py);
peak memory is about one output shard plus one tensor's pieces.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import safe_open

from r1cloud.checkpoint.dcp import remove
from r1cloud.checkpoint.folder import ADAPTER_CONFIG, DEFAULT_SHARD, MARK, WEIGHTS, MergeError, describes
from r1cloud.checkpoint.from_dcp import merge_dcp, write_adapter
from r1cloud.checkpoint.from_easyr1 import merge_easyr1
from r1cloud.checkpoint.store import SHARD_RE, bucket_errors, filesystem
from r1cloud.core.dtypes import torch_dtype
from r1cloud.core.records import load_object


def _merged_by_us(folder: Path) -> set[str] | None:
    """The files a merge wrote into `folder`, from its mark (None: no merge wrote it)."""
    try:
        files = load_object(folder / MARK).get("files")
    except (OSError, ValueError):
        return None
    return {f for f in files if isinstance(f, str)} if isinstance(files, list) else None


def check_out(out: Path, checkpoint, force: bool) -> None:
    """Refuse an --out whose contents a merge would lose: the checkpoint itself, a folder inside it
    or holding it, a file, or a folder that is not empty — with `force`, only a previous merge's
    folder (every file in it named in merge's mark) is replaced. The checkpoint's own huggingface/
    and adapter/ are merged into as with no --out: what merge did not write there stays."""
    target = out.expanduser().resolve()
    if "://" not in checkpoint.path:
        source = Path(checkpoint.path).resolve()
        own = {Path(checkpoint.hf_dir).resolve(), source / "adapter"}  # its own merge folders
        if target in own:
            return
        if target == source or source in target.parents:
            raise MergeError(f"--out {out} is inside the checkpoint {source}: give a folder elsewhere")
        if target in source.parents:
            raise MergeError(f"--out {out} holds the checkpoint {source}: give a folder elsewhere")
    if target.exists() and not target.is_dir():
        raise MergeError(f"--out {out} is a file: give a folder (it is created)")
    entries = sorted(p.name for p in target.iterdir()) if target.is_dir() else []
    if not entries:
        return
    ours = _merged_by_us(target) or set()
    others = [name for name in entries if name != MARK and name not in ours]
    if others:
        shown = ", ".join(others[:3]) + (f" and {len(others) - 3} more" if len(others) > 3 else "")
        raise MergeError(
            f"--out {out} holds files merge did not write ({shown}); nothing there is overwritten: "
            "give a new folder"
        )
    if not force:
        raise MergeError(f"--out {out} holds a previous merge: give a new folder, or --force to replace it")


def _carry(old: Path, new: Path) -> None:
    """Into the new merge folder, everything in the old one but the old weights (a file a user put
    there, the trainer's tokenizer extras), linked where it can be, so nothing is lost."""
    ours = _merged_by_us(old)
    for entry in old.iterdir():
        if entry.name == MARK or (new / entry.name).exists():
            continue
        if entry.name.endswith(WEIGHTS) and (ours is None or entry.name in ours):
            continue  # the weights a previous merge wrote (unmarked: the trainer's save_hf) give way
        if entry.is_dir() and not entry.is_symlink():
            shutil.copytree(entry, new / entry.name, symlinks=True, copy_function=_link_or_copy)
        else:
            _link_or_copy(entry, new / entry.name)


def _link_or_copy(src, dst) -> None:
    try:
        os.link(src, dst, follow_symlinks=False)
    except OSError:
        shutil.copy2(src, dst, follow_symlinks=False)


def merge(
    checkpoint,
    out: str | Path | None,
    dtype: str | None = "bf16",
    model_src: str | None = None,
    shard_bytes: int = DEFAULT_SHARD,
    progress=None,
    adapter_only: bool = False,
) -> str:
    """Merge `checkpoint` (a checkpoints.Checkpoint) into `out` (default: its huggingface/ folder;
    with `adapter_only`, a LoRA run's adapters as a peft folder, by default its adapter/ folder),
    atomically: written beside the target under a name of its own, then renamed into place. Into
    the checkpoint's own folder, what merge did not write there is kept. A bucket checkpoint (a
    URL) is copied to a local folder first — only the weights and the config/tokenizer files —
    and, with no `out`, the merged model is uploaded back into its huggingface/ folder, config.json
    last, so the bucket lists it INFERENCE READY only once every file is there."""
    if "://" in checkpoint.path:
        with tempfile.TemporaryDirectory(prefix="r1cloud-merge-") as tmp:
            with bucket_errors(checkpoint.path):
                local = _download(checkpoint, Path(tmp))
            args = (dtype, model_src, shard_bytes, progress, adapter_only)
            if out:
                return merge(local, out, *args)
            where = f"{checkpoint.path.rstrip('/')}/adapter" if adapter_only else checkpoint.hf_dir
            merged = Path(merge(local, None, *args))
            with bucket_errors(where):
                _upload(merged, where)
            return where
    default = Path(checkpoint.path) / "adapter" if adapter_only else Path(checkpoint.hf_dir)
    target = Path(out) if out else default
    own = target.resolve() == default.resolve()
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.merging-"))
    try:
        if adapter_only:
            if checkpoint.format != "r1cloud":
                raise MergeError("--adapter-only reads r1cloud's LoRA checkpoints; this one is EasyR1's")
            write_adapter(f"{checkpoint.path}/actor", tmp)
        elif checkpoint.format == "r1cloud":
            src = Path(checkpoint.path) / "huggingface"
            hf_src = src if (src / "config.json").exists() else model_src
            if hf_src is None:
                raise MergeError(
                    f"{checkpoint.path} has no huggingface/config.json to describe the model: give the base "
                    "model's folder with `r1cloud merge … --base FOLDER`"
                )
            merge_dcp(f"{checkpoint.path}/actor", hf_src, tmp, torch_dtype(dtype), shard_bytes, progress)
        else:
            merge_easyr1(Path(checkpoint.path) / "actor", tmp, torch_dtype(dtype), shard_bytes, progress)
        if own and target.is_dir():
            _carry(target, tmp)
        if target.exists():  # renamed away before deletion: never a half-deleted model in place
            remove(target)
        os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return str(target)


def _download(checkpoint, into: Path):
    """The files a merge reads (weights, config, tokenizer — not optimizer states), copied locally."""
    fs, base = filesystem(checkpoint.path)
    local = into / Path(base).name
    hf = "huggingface/" if checkpoint.format == "r1cloud" else "actor/huggingface/"
    for path in fs.find(base):
        rel = path[len(base) :].lstrip("/")
        if rel.startswith(hf):
            wanted = describes(rel[len(hf) :]) or rel[len(hf) :] == ADAPTER_CONFIG
        elif checkpoint.format == "r1cloud":
            wanted = rel.startswith("actor/")
        else:
            wanted = bool(SHARD_RE.search(rel))
        if wanted:
            (local / rel).parent.mkdir(parents=True, exist_ok=True)
            fs.get(path, str(local / rel))
    return dataclasses.replace(checkpoint, path=str(local))


def _upload(folder: Path, url: str) -> None:
    fs, base = filesystem(url)
    if fs.exists(f"{base}/config.json"):
        fs.rm(f"{base}/config.json")  # no longer INFERENCE READY while the weights are replaced
    for f in sorted(folder.iterdir(), key=lambda f: f.name == "config.json"):
        fs.put(str(f), f"{base}/{f.name}")


def iter_weights(folder: Path) -> Iterator[tuple[str, torch.Tensor]]:
    for f in sorted(folder.glob("*.safetensors")):
        with safe_open(str(f), "pt") as sf:
            for k in sf.keys():  # noqa: SIM118 - safe_open is not a dict
                yield k, sf.get_tensor(k)
