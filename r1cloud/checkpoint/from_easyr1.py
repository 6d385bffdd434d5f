"""EasyR1/verl checkpoints into a model folder: per-rank files `model_world_size_W_rank_R.pt`
holding DTensor shards of an FSDP (`fsdp`) or HSDP (`ddp`, `fsdp`) mesh, memory-mapped and re-opened
per output shard so pages already written do not pile up (EasyR1's merger loads every rank's file
at once). Tensor-parallel meshes are refused with a clear error.
"""

from __future__ import annotations

from pathlib import Path

import torch

from r1cloud.checkpoint.folder import DEFAULT_SHARD, MergeError, copy_hf_files, plan, skip_tied, write
from r1cloud.checkpoint.store import SHARD_RE


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


def _full(pieces: list, world: int) -> torch.Tensor:
    """Rebuild one tensor from every rank's piece, for FSDP and HSDP meshes."""
    first = pieces[0]
    if not getattr(first, "placements", None):  # a plain tensor: replicated
        return first
    dims, placements = list(first.device_mesh.mesh_dim_names or []), list(first.placements)
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
    names = skip_tied([k for k, v in first.items() if isinstance(v, torch.Tensor)], config)
    sizes = [(n, first[n].numel() * (dtype or first[n].dtype).itemsize) for n in names]
    del first

    def fill(chunk: list[str]) -> dict[str, torch.Tensor]:
        ranks = [_load_mmap(p) for p in files]  # mapped, not read: only the pieces used are paged in
        out_tensors = {n: _full([r[n] for r in ranks], len(files)).clone() for n in chunk}
        del ranks  # unmaps every file before the next shard
        return out_tensors

    write(plan(sizes, shard_bytes), fill, out, dtype, progress)
