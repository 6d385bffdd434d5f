"""Merging a checkpoint into a Hugging Face model folder: config, generation config, tokenizer and
sharded safetensors with an index — loadable by `from_pretrained` and by vLLM.

It streams. Output shards are planned from metadata, then filled one at a time, reading only the
pieces of the tensors that shard holds: peak memory is about one output shard plus the pieces of
one tensor (EasyR1's merger loads every rank's file at once). Sources:

- r1cloud checkpoints (torch.distributed.checkpoint): tensors are read by name from the DCP files;
- EasyR1/verl per-rank files `model_world_size_W_rank_R.pt` holding DTensor shards of an FSDP
  (`fsdp`) or HSDP (`ddp`, `fsdp`) mesh, memory-mapped and re-opened per output shard so pages
  already written do not pile up. Tensor-parallel meshes are refused with a clear error.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

from .dcp_io import UnsafeCheckpoint, remove, storage
from .records import load_object, loads

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
HF_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "preprocessor_config.json",
    "processor_config.json",
)
DEFAULT_SHARD = 1024**3  # bytes per output file: the bound on merge memory
MARK = ".r1cloud-merge.json"  # in every folder a merge writes: the files it wrote, so it replaces only those
WEIGHTS = (".safetensors", ".safetensors.index.json")


class MergeError(Exception):
    pass


def _plan(sizes: list[tuple[str, int]], shard_bytes: int) -> list[list[str]]:
    shards: list[list[str]] = [[]]
    used = 0
    for name, nbytes in sizes:
        if shards[-1] and used + nbytes > shard_bytes:
            shards.append([])
            used = 0
        shards[-1].append(name)
        used += nbytes
    return [s for s in shards if s]


def _write(
    shards: list[list[str]],
    fill: Callable[[list[str]], dict[str, torch.Tensor]],
    out: Path,
    dtype: torch.dtype | None,
    progress=None,
) -> None:
    from safetensors.torch import save_file

    if dtype is not None:  # the config says what the weights are, for from_pretrained and vLLM
        config = json.loads((out / "config.json").read_text())
        config["torch_dtype"] = config["dtype"] = str(dtype).removeprefix("torch.")
        (out / "config.json").write_text(json.dumps(config, indent=2))
    total = len(shards)
    weight_map, total_size = {}, 0
    for i, names in enumerate(shards, 1):
        fname = "model.safetensors" if total == 1 else f"model-{i:05d}-of-{total:05d}.safetensors"
        tensors = fill(names)
        if dtype is not None:
            tensors = {
                k: (v.to(dtype) if v.is_floating_point() else v).contiguous() for k, v in tensors.items()
            }
        save_file(tensors, str(out / fname), metadata={"format": "pt"})
        for k, v in tensors.items():
            weight_map[k] = fname
            total_size += v.numel() * v.element_size()
        del tensors
        if progress:
            progress(i, total)
    if total > 1:
        index = {"metadata": {"total_size": total_size}, "weight_map": weight_map}
        (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    _mark(out)


def _mark(out: Path) -> None:
    names = sorted(p.name for p in out.iterdir() if p.name != MARK)
    (out / MARK).write_text(json.dumps({"written_by": "r1cloud merge", "files": names}, indent=1))


def _describes(name: str) -> bool:
    """A file that describes a model rather than holding its weights: config, generation config,
    tokenizer and processor files (a VLM's video processor, added tokens, a chat template)."""
    if name in HF_FILES:
        return True
    if name.endswith(WEIGHTS) or name in (ADAPTER_CONFIG, MARK) or name.startswith("."):
        return False
    return name.endswith((".json", ".jinja", ".tiktoken")) or name in ("vocab.txt", "spiece.model")


def copy_hf_files(src: str | Path, out: Path) -> dict:
    """Config, generation config and tokenizer/processor files; returns the config."""
    src = Path(src)
    if src.resolve() != out.resolve():
        for file in src.iterdir():
            if _describes(file.name) and file.is_file():
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


def _skip_tied(names: list[str], config: dict) -> list[str]:
    if config.get("tie_word_embeddings") and any(n.endswith("embed_tokens.weight") for n in names):
        return [n for n in names if n != "lm_head.weight"]
    return names


# ---------------------------------------------------------------------------- r1cloud (DCP)


def _dcp_metadata(dcp_dir: str):
    """The checkpoint's index (DCP's .metadata), read without running code; a damaged or crafted one
    is a MergeError."""
    try:
        return storage(dcp_dir, write=False)["storage_reader"].read_metadata()
    except UnsafeCheckpoint as e:
        raise MergeError(f"{dcp_dir}/.metadata is not read: {e} (a crafted or foreign file)") from None
    except Exception as e:  # FileNotFoundError, an unpickling error of a cut file, …
        raise MergeError(f"{dcp_dir}/.metadata cannot be read ({type(e).__name__}: {str(e)[:160]})") from None


def _dcp_load(state: dict, dcp_dir: str, meta) -> None:
    """Fill `state` from the checkpoint, each file it needs checked first: a missing or cut shard
    is a MergeError naming it (DCP's own CheckpointException is no Exception, and 60 lines long)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    from .checkpoints import filesystem

    needed: dict[str, int] = {}
    for index, info in meta.storage_data.items():
        if index.fqn in state:
            end = info.offset + info.length
            needed[info.relative_path] = max(needed.get(info.relative_path, 0), end)
    fs, root = filesystem(dcp_dir)
    for name, end in sorted(needed.items()):
        path = f"{root.rstrip('/')}/{name}"
        try:
            size = fs.size(path)
        except FileNotFoundError:
            raise MergeError(f"{dcp_dir}/{name} is missing: the checkpoint is incomplete") from None
        if size < end:
            raise MergeError(
                f"{dcp_dir}/{name} is cut short ({size} of at least {end} bytes): the checkpoint is damaged"
            )
    try:
        dcp.load(state, **storage(dcp_dir, write=False), no_dist=True)
    except (CheckpointException, Exception) as e:
        causes = getattr(e, "failures", {}) or {0: e}
        cause = next(iter(causes.values()))
        line = str(cause).strip().splitlines()[-1:] or [""]
        raise MergeError(f"{dcp_dir} cannot be read ({type(cause).__name__}: {line[0][:160]})") from None


def merge_dcp(
    dcp_dir: str,
    hf_src: str | Path,
    out: Path,
    dtype: torch.dtype | None,
    shard_bytes: int = DEFAULT_SHARD,
    progress=None,
) -> None:
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    index = _dcp_metadata(dcp_dir)
    meta = index.state_dict_metadata
    tensors = {
        k.removeprefix("model."): m
        for k, m in meta.items()
        if k.startswith("model.") and isinstance(m, TensorStorageMetadata)
    }
    if not tensors:
        raise MergeError(f"{dcp_dir}: no model weights in this checkpoint")
    if any(".lora_A." in n for n in tensors):  # a LoRA run's checkpoint: adapters only
        return _merge_lora(dcp_dir, index, tensors, Path(hf_src), out, dtype, shard_bytes, progress)
    config = copy_hf_files(hf_src, out)
    names = _skip_tied(list(tensors), config)
    width = dtype.itemsize if dtype is not None else None

    def nbytes(n: str) -> int:
        m = tensors[n]
        return m.size.numel() * (width or m.properties.dtype.itemsize)

    def fill(chunk: list[str]) -> dict[str, torch.Tensor]:
        state = {f"model.{n}": torch.empty(tensors[n].size, dtype=tensors[n].properties.dtype) for n in chunk}
        _dcp_load(state, dcp_dir, index)
        return {k.removeprefix("model."): v for k, v in state.items()}

    _write(_plan([(n, nbytes(n)) for n in names], shard_bytes), fill, out, dtype, progress)


ADAPTER_CONFIG = "adapter_config.json"  # in a LoRA checkpoint's actor/ (never in a merged model)
SAFETENSORS_BYTES = {"F64": 8, "I64": 8, "F32": 4, "I32": 4, "BF16": 2, "F16": 2, "I16": 2}
SAFETENSORS_BYTES |= dict.fromkeys(("F8_E4M3", "F8_E5M2", "I8", "U8", "BOOL"), 1)


def adapter_config(dcp_dir: str) -> dict:
    """A LoRA checkpoint's actor/adapter_config.json, checked: a MergeError naming the file and the
    field when it is missing, not JSON, or holds no usable rank and alpha."""
    from .checkpoints import filesystem

    fs, path = filesystem(dcp_dir)
    where = f"{dcp_dir}/{ADAPTER_CONFIG}"
    try:
        adapter = loads(fs.cat_file(f"{path.rstrip('/')}/{ADAPTER_CONFIG}"))
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


def _merge_lora(dcp_dir, index, tensors, hf_src: Path, out: Path, dtype, shard_bytes, progress) -> None:
    """The base model's weights with the adapters folded in (W + alpha/r · B·A), streamed shard by
    shard like any merge: the base's tensors from its safetensors, the adapters from the DCP files."""
    from safetensors import safe_open

    from .checkpoints import NotFound, base_model

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
                width = dtype.itemsize if dtype is not None else SAFETENSORS_BYTES[piece.get_dtype()]
                sizes.append((k, torch.Size(piece.get_shape()).numel() * width))
    if not where:
        raise MergeError(f"{base}: the adapter's base model has no safetensors weights")
    adapted = {n.split(".lora_A.")[0] for n in tensors if ".lora_A." in n}
    config = copy_hf_files(hf_src, out)
    keep = set(_skip_tied(list(where), config))

    def fill(chunk: list[str]) -> dict[str, torch.Tensor]:
        layers = [n.removesuffix(".weight") for n in chunk if n.removesuffix(".weight") in adapted]
        wanted = [f"{layer}.lora_{ab}.default.weight" for layer in layers for ab in "AB"]
        state = {
            f"model.{n}": torch.empty(tensors[n].size, dtype=tensors[n].properties.dtype) for n in wanted
        }
        if state:
            _dcp_load(state, dcp_dir, index)
        result = {}
        for file in dict.fromkeys(where[n] for n in chunk):  # each base file opened once per shard
            with safe_open(str(file), "pt") as sf:
                result.update({n: sf.get_tensor(n) for n in chunk if where[n] == file})
        for name, w in result.items():
            layer = name.removesuffix(".weight")
            if layer in adapted:
                a, b = (
                    state[f"model.{layer}.lora_A.default.weight"],
                    state[f"model.{layer}.lora_B.default.weight"],
                )
                result[name] = (w.float() + scale * (b.float() @ a.float())).to(w.dtype)
        return {n: result[n] for n in chunk}

    _write(_plan([x for x in sizes if x[0] in keep], shard_bytes), fill, out, dtype, progress)


def write_adapter(dcp_dir: str, out: Path) -> None:
    """A LoRA checkpoint as the folder peft writes (adapter_config.json and
    adapter_model.safetensors, keys `base_model.model.<module>.lora_A.weight`): what
    `PeftModel.from_pretrained` and `vllm serve --enable-lora` load."""
    from safetensors.torch import save_file
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    from .trainer.lora import peft_name

    index = _dcp_metadata(dcp_dir)
    meta = index.state_dict_metadata
    names = [
        k
        for k, m in meta.items()
        if k.startswith("model.") and ".lora_" in k and isinstance(m, TensorStorageMetadata)
    ]
    if not names:
        raise MergeError(
            f"{dcp_dir} holds no LoRA adapters: this run trained every weight (merge without --adapter-only)"
        )
    state = {k: torch.empty(meta[k].size, dtype=meta[k].properties.dtype) for k in names}
    _dcp_load(state, dcp_dir, index)
    tensors = {peft_name(k.removeprefix("model.")): v.contiguous() for k, v in state.items()}
    save_file(tensors, str(out / "adapter_model.safetensors"), metadata={"format": "pt"})
    (out / ADAPTER_CONFIG).write_text(json.dumps(adapter_config(dcp_dir), indent=2))
    _mark(out)


# ---------------------------------------------------------------------------- EasyR1 / verl shards

SHARD_RE = re.compile(r"model_world_size_(\d+)_rank_(\d+)\.pt$")


def _rank_files(actor_dir: Path) -> list[Path]:
    files = {int(m.group(2)): p for p in actor_dir.iterdir() if (m := SHARD_RE.search(p.name))}
    worlds = {int(SHARD_RE.search(p.name).group(1)) for p in files.values()}
    if len(worlds) != 1:
        raise MergeError(f"{actor_dir}: shards from different world sizes {sorted(worlds)}")
    world = worlds.pop()
    missing = sorted(set(range(world)) - set(files))
    if missing:
        raise MergeError(f"{actor_dir}: world size {world} but ranks {missing} are missing")
    return [files[r] for r in range(world)]


def _load_mmap(path: Path) -> dict:
    try:
        import torch.distributed.tensor  # noqa: F401 - torch's weights_only loader admits DTensors once imported

        shard = torch.load(path, map_location="cpu", mmap=True, weights_only=True)
    except Exception as e:  # truncated, not a torch file, or not written by torch.save: one line
        raise MergeError(
            f"{path} cannot be read as a torch shard ({type(e).__name__}: {str(e)[:160]})"
        ) from None
    if not isinstance(shard, dict):
        raise MergeError(f"{path} holds a {type(shard).__name__}, not a model's state dict")
    return shard


def _layout(t) -> tuple[list[str], list]:
    """Mesh dimension names and placements of a DTensor (a plain tensor: replicated)."""
    if not hasattr(t, "placements"):
        return [], []
    return list(t.device_mesh.mesh_dim_names or []), list(t.placements)


def _full(pieces: list, world: int) -> torch.Tensor:
    """Rebuild one tensor from every rank's piece, for FSDP and HSDP meshes."""
    first = pieces[0]
    dims, placements = _layout(first)
    if not placements:
        return first
    if len(dims) == 1 and dims[0] in ("fsdp", "dp", None):
        mesh_shape, shard_axis = (world,), 0
    elif dims == ["ddp", "fsdp"]:
        mesh_shape, shard_axis = tuple(first.device_mesh.mesh.shape), 1
    else:
        raise MergeError(
            f"mesh {dims} is not supported: only FSDP ('fsdp') and HSDP ('ddp', 'fsdp') checkpoints can be merged (tensor-parallel is not)"
        )
    placement = placements[shard_axis]
    locals_ = [p._local_tensor for p in pieces]
    if placement.is_replicate():
        return locals_[0]
    if not placement.is_shard():
        raise MergeError(f"placement {placement} is not supported")
    per_group = mesh_shape[shard_axis]
    group = locals_[:per_group]  # ranks 0..n-1 form the first replica's shard group
    full = torch.cat(group, dim=placement.dim)
    return full.narrow(placement.dim, 0, first.shape[placement.dim]) if full.shape != first.shape else full


def merge_easyr1(
    actor_dir: Path, out: Path, dtype: torch.dtype | None, shard_bytes: int = DEFAULT_SHARD, progress=None
) -> None:
    files = _rank_files(actor_dir)
    hf = actor_dir / "huggingface"
    config = copy_hf_files(hf, out)
    first = _load_mmap(files[0])
    names = _skip_tied([k for k, v in first.items() if isinstance(v, torch.Tensor)], config)
    sizes = []
    for n in names:
        t = first[n]
        width = dtype.itemsize if dtype is not None else t.element_size()
        sizes.append((n, t.numel() * width))
    del first

    def fill(chunk: list[str]) -> dict[str, torch.Tensor]:
        ranks = [_load_mmap(p) for p in files]  # mapped, not read: only the pieces used are paged in
        out_tensors = {n: _full([r[n] for r in ranks], len(files)).clone() for n in chunk}
        del ranks  # unmaps every file before the next shard
        return out_tensors

    _write(_plan(sizes, shard_bytes), fill, out, dtype, progress)


# ---------------------------------------------------------------------------- entry point


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
        from .checkpoints import bucket_errors

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
    torch_dtype = DTYPES[dtype] if dtype else None
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
            merge_dcp(f"{checkpoint.path}/actor", hf_src, tmp, torch_dtype, shard_bytes, progress)
        else:
            merge_easyr1(Path(checkpoint.path) / "actor", tmp, torch_dtype, shard_bytes, progress)
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
    from .checkpoints import filesystem

    fs, base = filesystem(checkpoint.path)
    base = base.rstrip("/")
    local = into / Path(base).name
    hf = "huggingface/" if checkpoint.format == "r1cloud" else "actor/huggingface/"
    for path in fs.find(base):
        rel = path[len(base) :].lstrip("/")
        if rel.startswith(hf):
            wanted = _describes(rel[len(hf) :]) or rel[len(hf) :] == ADAPTER_CONFIG
        elif checkpoint.format == "r1cloud":
            wanted = rel.startswith("actor/")
        else:
            wanted = bool(SHARD_RE.search(rel))
        if wanted:
            (local / rel).parent.mkdir(parents=True, exist_ok=True)
            fs.get(path, str(local / rel))
    return dataclasses.replace(checkpoint, path=str(local))


def _upload(folder: Path, url: str) -> None:
    from .checkpoints import filesystem

    fs, base = filesystem(url)
    base = base.rstrip("/")
    if fs.exists(f"{base}/config.json"):
        fs.rm(f"{base}/config.json")  # no longer INFERENCE READY while the weights are replaced
    files = sorted(folder.iterdir(), key=lambda f: f.name == "config.json")
    for f in files:
        fs.put(str(f), f"{base}/{f.name}")


def iter_weights(folder: Path) -> Iterator[tuple[str, torch.Tensor]]:
    from safetensors import safe_open

    for f in sorted(folder.glob("*.safetensors")):
        with safe_open(str(f), "pt") as sf:
            for k in sf.keys():  # noqa: SIM118 - safe_open is not a dict
                yield k, sf.get_tensor(k)
