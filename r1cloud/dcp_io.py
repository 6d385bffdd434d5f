"""torch.distributed.checkpoint (DCP) folders, local or in a bucket: read without running their code,
and removed atomically.

DCP keeps its index (`.metadata`) as a pickle and non-tensor state (an optimizer's `param_groups`)
as `torch.save` bytes that its default planner loads with `weights_only=False`: a checkpoint from
someone else's bucket could run code in `merge`, `serve`, `checkpoints` or a resume. Here the index
is unpickled admitting only DCP's own metadata classes (and torch's sizes, dtypes and layouts), and
the other state with torch's `weights_only` loader. Tensors themselves DCP already reads with
`weights_only=True`.

Which files r1cloud trusts: none it reads from a checkpoint. Pickles are read only through this
module or `torch.load(weights_only=True)` (EasyR1's `.pt` shards, in merge.py); the pickles that
cross between r1cloud's own processes (Ray's, a reward's exception) are made by r1cloud itself.
"""

from __future__ import annotations

import io
import os
import pickle
import shutil
import tempfile
from pathlib import Path

METADATA = ".metadata"
_DCP_MODULES = ("torch.distributed.checkpoint.metadata", "torch.distributed.checkpoint.filesystem")
_OTHERS = {("torch", "Size"), ("torch.serialization", "_get_layout"), ("collections", "OrderedDict")}
_OTHERS |= {("pathlib", n) for n in ("Path", "PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath")}


class UnsafeCheckpoint(Exception):
    """A checkpoint file names something other than DCP's own metadata: it is not read."""


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        import torch

        if (module, name) in _OTHERS:
            return super().find_class(module, name)
        if module in _DCP_MODULES and not name.startswith("__"):
            found = super().find_class(module, name)
            if isinstance(found, type):  # a dataclass or enum of DCP's, never a function
                return found
        if module == "torch" and isinstance(
            getattr(torch, name, None), (torch.dtype, torch.layout, torch.memory_format)
        ):
            return getattr(torch, name)
        raise UnsafeCheckpoint(f"it names {module}.{name}, which is not part of a checkpoint's index")


def read_metadata(stream) -> object:
    """DCP's `Metadata` from an open `.metadata` file, or UnsafeCheckpoint."""
    from torch.distributed.checkpoint.metadata import Metadata

    found = _MetadataUnpickler(stream).load()
    if not isinstance(found, Metadata):
        raise UnsafeCheckpoint(f"it holds a {type(found).__name__}, not DCP's Metadata")
    return found


def _safe(reader_class):
    class Safe(reader_class):
        def read_metadata(self, *args, **kwargs):
            from torch.distributed.checkpoint.metadata import StorageMeta

            with self.fs.create_stream(self.fs.concat_path(self.path, METADATA), "rb") as f:
                metadata = read_metadata(f)
            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

    Safe.__name__ = Safe.__qualname__ = f"Safe{reader_class.__name__}"
    return Safe


def _planner():
    import torch
    from torch.distributed.checkpoint import DefaultLoadPlanner
    from torch.distributed.checkpoint._traverse import set_element

    class SafeLoadPlanner(DefaultLoadPlanner):
        def load_bytes(self, read_item, value: io.BytesIO) -> None:  # as DCP's, but weights_only
            loaded = torch.load(value, weights_only=True)
            if self.flatten_state_dict:
                set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], loaded)
            else:
                self.state_dict[read_item.dest_index.fqn] = loaded

    return SafeLoadPlanner()


def storage(path: str, write: bool) -> dict:
    """DCP's arguments for saving to or loading from a local folder or a bucket URL: each rank
    writes its own shards straight to the bucket, so a checkpoint of workers on several machines is
    whole in one place. Loading goes through the safe reader and planner above."""
    if write:
        if "://" not in path:
            return {"checkpoint_id": path}
        from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter

        # a fresh filesystem: a cached S3 client keeps the endpoint and credentials it was made with
        return {"storage_writer": FsspecWriter(path, skip_instance_cache=True)}
    if "://" not in path:
        from torch.distributed.checkpoint import FileSystemReader

        reader = _safe(FileSystemReader)(path)
    else:
        from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader

        reader = _safe(FsspecReader)(path, skip_instance_cache=True)
    return {"storage_reader": reader, "planner": _planner()}


def remove(path: Path) -> None:
    """Delete a checkpoint atomically: renamed out of sight first, so a process killed halfway
    through the deletion never leaves a half-deleted checkpoint that still looks complete."""
    trash = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.deleting-"))
    os.replace(path, trash)  # onto the empty folder just made: never another's folder of that name
    shutil.rmtree(trash, ignore_errors=True)
