"""A model folder as merge writes it: the weights planned into safetensors shards of at most
`shard_bytes` and written one shard at a time; config, generation config and tokenizer files
copied beside them; and merge's mark, naming the files it wrote, so that a later merge replaces
only those.

The safetensors files are written here, in safetensors' own format (its `safe_open`,
`from_pretrained` and vLLM read them; the tests check), rather than by its `save_file`, for one
reason: speed. A tensor whose bytes lie plainly in a checkpoint file (`FileBytes`) is copied file
to file by the kernel (`os.copy_file_range`) and never read into this process; one in memory is
written in one call. benchmarks/merge.py measures what that buys (RESULTS.md).
"""

from __future__ import annotations

import json
import os
import shutil
import struct
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # light at import: trainer/lora.py takes peft_name from here
    import torch

DEFAULT_SHARD = 1024**3  # bytes per output file: the bound on merge memory
MARK = ".r1cloud-merge.json"  # in every folder a merge writes: the files it wrote, so it replaces only those
WEIGHTS = (".safetensors", ".safetensors.index.json")

ADAPTER = "default"  # peft's adapter name, as in the trainer's parameter names (`lora_A.default.weight`)
ADAPTER_CONFIG = "adapter_config.json"  # in a LoRA checkpoint's actor/ (never in a merged model)
ST_DTYPES = {  # torch's dtype names → safetensors'
    "float64": "F64",
    "float32": "F32",
    "bfloat16": "BF16",
    "float16": "F16",
    "int64": "I64",
    "int32": "I32",
    "int16": "I16",
    "int8": "I8",
    "uint8": "U8",
    "bool": "BOOL",
    "float8_e4m3fn": "F8_E4M3",
    "float8_e5m2": "F8_E5M2",
}


class MergeError(Exception):
    pass


@dataclass
class FileBytes:
    """A tensor whose bytes lie in files as its plain row-major data, in order: copied, never read."""

    dtype: torch.dtype
    shape: tuple[int, ...]
    spans: list[tuple[str, int, int]]  # (file, first byte, number of bytes)


def peft_name(name: str) -> str:
    """The name peft and vLLM give an adapter tensor of the model's parameter `name`
    (`model.layers.0.q_proj.lora_A.default.weight` → `base_model.model.model.layers.0.q_proj.lora_A.weight`)."""
    return "base_model.model." + name.replace(f".{ADAPTER}.", ".")


def plan(sizes: list[tuple[str, int]], shard_bytes: int) -> list[list[str]]:
    shards: list[list[str]] = [[]]
    used = 0
    for name, nbytes in sizes:
        if shards[-1] and used + nbytes > shard_bytes:
            shards.append([])
            used = 0
        shards[-1].append(name)
        used += nbytes
    return [s for s in shards if s]


def write(
    shards: list[list[str]],
    fill: Callable[[list[str]], dict[str, torch.Tensor | FileBytes]],
    out: Path,
    dtype: torch.dtype | None,
    progress=None,
) -> None:
    """Each shard's tensors from `fill` (in `dtype` where it is given: a FileBytes is already),
    written as one safetensors file; the index when there are several; the mark."""
    import torch

    if dtype is not None:  # the config says what the weights are, for from_pretrained and vLLM
        config = json.loads((out / "config.json").read_text())
        config["torch_dtype"] = config["dtype"] = str(dtype).removeprefix("torch.")
        (out / "config.json").write_text(json.dumps(config, indent=2))
    total = len(shards)
    weight_map, total_size = {}, 0
    with ThreadPoolExecutor(1) as syncer:  # a shard goes to disk while the next one is written
        synced = []
        for i, names in enumerate(shards, 1):
            fname = "model.safetensors" if total == 1 else f"model-{i:05d}-of-{total:05d}.safetensors"
            tensors = fill(names)
            if dtype is not None:
                tensors = {
                    k: v.to(dtype) if isinstance(v, torch.Tensor) and v.is_floating_point() else v
                    for k, v in tensors.items()
                }
            total_size += save_safetensors(tensors, out / fname, sync=False)
            synced.append(syncer.submit(fsync, out / fname))
            weight_map.update(dict.fromkeys(tensors, fname))
            del tensors
            if progress:
                progress(i, total)
        for done in synced:
            done.result()  # on disk before merge renames its folder into place
    if total > 1:
        index = {"metadata": {"total_size": total_size}, "weight_map": weight_map}
        (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    mark(out)


def save_safetensors(tensors: dict[str, torch.Tensor | FileBytes], path: Path, sync: bool = True) -> int:
    """One safetensors file (an 8-byte header length, the JSON header padded to 8 bytes, then the
    data in the header's order), synced to disk unless `sync` is False; returns the data's size in bytes."""
    import torch

    header: dict = {"__metadata__": {"format": "pt"}}
    at = 0
    for name, v in tensors.items():
        n = sum(s[2] for s in v.spans) if isinstance(v, FileBytes) else v.numel() * v.element_size()
        header[name] = {
            "dtype": ST_DTYPES[str(v.dtype).removeprefix("torch.")],
            "shape": list(v.shape),
            "data_offsets": [at, at + n],
        }
        at += n
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        _write_all(fd, struct.pack("<Q", len(text)) + text)
        for v in tensors.values():
            if isinstance(v, FileBytes):
                for span in v.spans:
                    _copy_span(*span, fd)
            elif v.numel():
                _write_all(fd, v.contiguous().reshape(-1).view(torch.uint8).numpy().data)
        if sync:
            os.fsync(fd)  # on disk before merge renames its folder into place
    finally:
        os.close(fd)
    return at


def fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_all(fd: int, data) -> None:
    view = memoryview(data).cast("B")
    while view:
        view = view[os.write(fd, view) :]


def _copy_span(file: str, start: int, n: int, fd: int) -> None:
    """`n` bytes of `file` from `start` to the end of `fd`, by the kernel where it can."""
    with open(file, "rb") as f:
        while n and hasattr(os, "copy_file_range"):
            try:
                done = os.copy_file_range(f.fileno(), fd, n, start)
            except OSError:  # a pair of filesystems it cannot copy between
                break
            if not done:
                break
            start, n = start + done, n - done
        f.seek(start)
        while n:  # through memory, in pieces
            piece = f.read(min(n, 64 << 20))
            if not piece:
                raise MergeError(f"{file} is cut short: the checkpoint is damaged")
            _write_all(fd, piece)
            n -= len(piece)


def mark(out: Path) -> None:
    names = sorted(p.name for p in out.iterdir() if p.name != MARK)
    (out / MARK).write_text(json.dumps({"written_by": "r1cloud merge", "files": names}, indent=1))


def describes(name: str) -> bool:
    """A file that describes a model rather than holding its weights: config, generation config,
    tokenizer and processor files (a VLM's video processor, added tokens, a chat template)."""
    if name.endswith(WEIGHTS) or name in (ADAPTER_CONFIG, MARK) or name.startswith("."):
        return False
    tokenizers = ("merges.txt", "tokenizer.model", "vocab.txt", "spiece.model")
    return name.endswith((".json", ".jinja", ".tiktoken")) or name in tokenizers


def copy_hf_files(src: str | Path, out: Path) -> dict:
    """Config, generation config and tokenizer/processor files; returns the config."""
    src = Path(src)
    if src.resolve() != out.resolve():
        for file in src.iterdir():
            if describes(file.name) and file.is_file():
                shutil.copy2(file, out / file.name)
    if not (out / "config.json").is_file():
        raise MergeError(f"{src} has no config.json: cannot describe the merged model")
    try:
        config = json.loads((out / "config.json").read_text())
    except (ValueError, UnicodeDecodeError) as e:
        raise MergeError(
            f"{src}/config.json is not valid JSON ({e}): restore it from the base model"
        ) from None
    if not isinstance(config, dict):
        raise MergeError(f"{src}/config.json holds a JSON {type(config).__name__}, not a model config")
    return config


def skip_tied(names: list[str], config: dict) -> list[str]:
    if config.get("tie_word_embeddings") and any(n.endswith("embed_tokens.weight") for n in names):
        return [n for n in names if n != "lm_head.weight"]
    return names
