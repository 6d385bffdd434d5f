"""An r1cloud checkpoint (torch.distributed.checkpoint) into a model folder: the whole model's
weights; a LoRA run's adapters folded into its base model; or the adapters alone as peft writes
them. Streamed: each output shard's tensors are read from the DCP files when it is written — a
local checkpoint's as views of the mapped files (dcp.read_chunks), copied file to file when no
conversion is asked; a bucket's (the trainer's save_hf) through DCP's own reader.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import torch
from safetensors import safe_open

from r1cloud.checkpoint.dcp import UnsafeCheckpoint, read_chunks, storage
from r1cloud.checkpoint.folder import (
    ADAPTER_CONFIG,
    DEFAULT_SHARD,
    ST_DTYPES,
    FileBytes,
    MergeError,
    copy_hf_files,
    mark,
    peft_name,
    plan,
    save_safetensors,
    skip_tied,
    write,
)
from r1cloud.checkpoint.store import NotFound, base_model, filesystem
from r1cloud.core.records import loads

ST_TORCH = {st: getattr(torch, name) for name, st in ST_DTYPES.items()}  # safetensors' dtype names → torch


def _dcp_metadata(dcp_dir: str) -> tuple[object, dict]:
    """The checkpoint's index (DCP's .metadata), read without running code, and the model's tensors
    it lists by name (`model.` cut off); a damaged or crafted index is a MergeError."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    try:
        index = storage(dcp_dir, write=False)["storage_reader"].read_metadata()
    except UnsafeCheckpoint as e:
        raise MergeError(f"{dcp_dir}/.metadata is not read: {e} (a crafted or foreign file)") from None
    except Exception as e:  # FileNotFoundError, an unpickling error of a cut file, …
        raise MergeError(f"{dcp_dir}/.metadata cannot be read ({type(e).__name__}: {str(e)[:160]})") from None
    return index, {
        k.removeprefix("model."): m
        for k, m in index.state_dict_metadata.items()
        if k.startswith("model.") and isinstance(m, TensorStorageMetadata)
    }


def _check_files(dcp_dir: str, meta, names: set[str]) -> None:
    """Each file the named tensors need is there and long enough: a missing or cut shard is a
    MergeError naming it."""
    needed: dict[str, int] = {}
    for index, info in meta.storage_data.items():
        if index.fqn in names:
            end = info.offset + info.length
            needed[info.relative_path] = max(needed.get(info.relative_path, 0), end)
    fs, root = filesystem(dcp_dir)
    for name, end in sorted(needed.items()):
        path = f"{root}/{name}"
        try:
            size = fs.size(path)
        except FileNotFoundError:
            raise MergeError(f"{dcp_dir}/{name} is missing: the checkpoint is incomplete") from None
        if size < end:
            raise MergeError(
                f"{dcp_dir}/{name} is cut short ({size} of at least {end} bytes): the checkpoint is damaged"
            )


def _dcp_load(dcp_dir: str, index, tensors: dict, names: list[str]) -> dict[str, torch.Tensor]:
    """The named tensors (of `tensors`, `_dcp_metadata`'s) through DCP's own reader (a bucket's, or
    LoRA adapters), each file they need checked first (DCP's own CheckpointException is no
    Exception, and 60 lines long)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    state = {f"model.{n}": torch.empty(tensors[n].size, dtype=tensors[n].properties.dtype) for n in names}
    _check_files(dcp_dir, index, set(state))
    try:
        dcp.load(state, **storage(dcp_dir, write=False), no_dist=True)
    except (CheckpointException, Exception) as e:
        causes = getattr(e, "failures", {}) or {0: e}
        cause = next(iter(causes.values()))
        line = str(cause).strip().splitlines()[-1:] or [""]
        raise MergeError(f"{dcp_dir} cannot be read ({type(cause).__name__}: {line[0][:160]})") from None
    return {k.removeprefix("model."): v for k, v in state.items()}


def merge_dcp(
    dcp_dir: str,
    hf_src: str | Path,
    out: Path,
    dtype: torch.dtype | None,
    shard_bytes: int = DEFAULT_SHARD,
    progress=None,
) -> None:
    index, tensors = _dcp_metadata(dcp_dir)
    if not tensors:
        raise MergeError(f"{dcp_dir}: no model weights in this checkpoint")
    if any(".lora_A." in n for n in tensors):  # a LoRA run's checkpoint: adapters only
        return merge_lora(dcp_dir, index, tensors, Path(hf_src), out, dtype, shard_bytes, progress)
    config = copy_hf_files(hf_src, out)
    names = skip_tied(list(tensors), config)
    sizes = [(n, tensors[n].size.numel() * (dtype or tensors[n].properties.dtype).itemsize) for n in names]

    def fill(chunk: list[str]) -> dict[str, torch.Tensor | FileBytes]:
        wanted = {f"model.{n}" for n in chunk}
        if "://" in dcp_dir:  # a bucket's (the trainer's save_hf): through DCP's reader
            return _dcp_load(dcp_dir, index, tensors, chunk)
        _check_files(dcp_dir, index, wanted)
        try:
            pieces = read_chunks(dcp_dir, index, wanted)
        except pickle.UnpicklingError:  # torch's weights-only unpickler: it names a function
            raise MergeError(
                f"{dcp_dir} holds a record that is not a plain tensor (refused by torch's weights-only "
                "loader): the checkpoint is damaged or crafted"
            ) from None
        except (UnsafeCheckpoint, RuntimeError, ValueError) as e:
            raise MergeError(f"{dcp_dir} cannot be read ({str(e)[:160]})") from None
        # popped: each unmapped once used
        return {n: _whole(pieces.pop(f"model.{n}"), tensors[n], dtype) for n in chunk}

    write(plan(sizes, shard_bytes), fill, out, dtype, progress)


def _whole(chunks: list, meta, dtype: torch.dtype | None) -> torch.Tensor | FileBytes:
    """A tensor from its saved pieces: as the files' bytes when they are its data in order (one
    piece, or FSDP's row blocks) and no conversion is asked, else assembled in `dtype`."""
    size, saved = tuple(meta.size), meta.properties.dtype
    rows = sorted(chunks, key=lambda c: c.offsets)
    at = 0
    for c in rows:  # row blocks: each whole but for dim 0, each starting where the last ended
        shape = tuple(c.tensor.shape)
        if c.start is None or shape[1:] != size[1:] or any(c.offsets[1:]) or (size and c.offsets[0] != at):
            break
        at += shape[0] if size else 1
    else:
        if at == (size[0] if size else 1) and (dtype in (None, saved) or not saved.is_floating_point):
            return FileBytes(
                saved, size, [(c.file, c.start, c.tensor.numel() * saved.itemsize) for c in rows]
            )
    full = torch.empty(size, dtype=dtype if dtype is not None and saved.is_floating_point else saved)
    for c in chunks:
        full[tuple(slice(o, o + n) for o, n in zip(c.offsets, c.tensor.shape, strict=True))] = c.tensor
    return full


def adapter_config(dcp_dir: str) -> dict:
    """A LoRA checkpoint's actor/adapter_config.json, checked: a MergeError naming the file and the
    field when it is missing, not JSON, or holds no usable rank and alpha."""
    fs, path = filesystem(dcp_dir)
    where = f"{dcp_dir}/{ADAPTER_CONFIG}"
    try:
        adapter = loads(fs.cat_file(f"{path}/{ADAPTER_CONFIG}"))
    except FileNotFoundError:
        raise MergeError(f"{dcp_dir} holds LoRA adapters but no {ADAPTER_CONFIG}") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise MergeError(f"{where} is not valid JSON ({str(e)[:120]})") from None
    if not isinstance(adapter, dict):
        raise MergeError(f"{where} holds a JSON {type(adapter).__name__}, not an adapter config")
    for key in ("r", "lora_alpha"):
        value = adapter.get(key)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 2**31:
            raise MergeError(f"{where}: {key} is {value!r}, not a positive number: the file is damaged")
    return adapter


def merge_lora(dcp_dir, index, tensors, hf_src: Path, out: Path, dtype, shard_bytes, progress) -> None:
    """The base model's weights with the adapters folded in (W + alpha/r · B·A), streamed shard by
    shard like any merge: the base's tensors from its safetensors, the adapters from the DCP files."""
    adapter = adapter_config(dcp_dir)
    try:
        base = base_model(adapter)
    except NotFound as e:
        raise MergeError(f"{e.args[0].removeprefix('error: ')}; {e.args[1][0]}") from None
    scale = adapter["lora_alpha"] / (adapter["r"] ** 0.5 if adapter.get("use_rslora") else adapter["r"])
    where: dict[str, Path] = {}
    sizes: list[tuple[str, int]] = []
    for f in sorted(base.glob("*.safetensors")):
        with safe_open(str(f), "pt") as sf:
            for k in sf.keys():  # noqa: SIM118 - safe_open is not a dict
                where[k] = f
                piece = sf.get_slice(k)  # shape and dtype from the header, no tensor read
                width = (dtype or ST_TORCH[piece.get_dtype()]).itemsize
                sizes.append((k, torch.Size(piece.get_shape()).numel() * width))
    if not where:
        raise MergeError(f"{base}: the adapter's base model has no safetensors weights")
    adapted = {n.split(".lora_A.")[0] for n in tensors if ".lora_A." in n}
    config = copy_hf_files(hf_src, out)
    keep = set(skip_tied(list(where), config))

    def fill(chunk: list[str]) -> dict[str, torch.Tensor]:
        layers = [n.removesuffix(".weight") for n in chunk if n.removesuffix(".weight") in adapted]
        wanted = [f"{layer}.lora_{ab}.default.weight" for layer in layers for ab in "AB"]
        state = _dcp_load(dcp_dir, index, tensors, wanted) if wanted else {}
        result = {}
        for file in dict.fromkeys(where[n] for n in chunk):  # each base file opened once per shard
            with safe_open(str(file), "pt") as sf:
                result.update({n: sf.get_tensor(n) for n in chunk if where[n] == file})
        for name, w in result.items():
            layer = name.removesuffix(".weight")
            if layer in adapted:
                a = state[f"{layer}.lora_A.default.weight"]
                b = state[f"{layer}.lora_B.default.weight"]
                result[name] = (w.float() + scale * (b.float() @ a.float())).to(w.dtype)
        return {n: result[n] for n in chunk}

    write(plan([x for x in sizes if x[0] in keep], shard_bytes), fill, out, dtype, progress)


def write_adapter(dcp_dir: str, out: Path) -> None:
    """A LoRA checkpoint as the folder peft writes (adapter_config.json and
    adapter_model.safetensors, keys `base_model.model.<module>.lora_A.weight`): what
    `PeftModel.from_pretrained` and `vllm serve --enable-lora` load."""
    index, tensors = _dcp_metadata(dcp_dir)
    names = [n for n in tensors if ".lora_" in n]
    if not names:
        raise MergeError(
            f"{dcp_dir} holds no LoRA adapters: this run trained every weight (merge without --adapter-only)"
        )
    state = _dcp_load(dcp_dir, index, tensors, names)
    adapters = {peft_name(n): v.contiguous() for n, v in state.items()}
    save_safetensors(adapters, out / "adapter_model.safetensors")
    (out / ADAPTER_CONFIG).write_text(json.dumps(adapter_config(dcp_dir), indent=2))
    mark(out)
