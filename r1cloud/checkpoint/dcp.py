"""torch.distributed.checkpoint (DCP) folders, local or in a bucket: read without running their code,
and removed atomically.

DCP keeps its index (`.metadata`) as a pickle and non-tensor state (an optimizer's `param_groups`)
as `torch.save` bytes that its default planner loads with `weights_only=False`: a checkpoint from
someone else's bucket could run code in `merge`, `serve`, `checkpoints` or a resume. Here the index
is unpickled admitting only DCP's own metadata classes (and torch's sizes, dtypes and layouts), and
the other state with torch's `weights_only` loader. Tensors themselves DCP already reads with
`weights_only=True`.

Which files r1cloud trusts: none it reads from a checkpoint. Pickles are read only through this
module or `torch.load(weights_only=True)` (EasyR1's `.pt` shards, in from_easyr1.py); the pickles
that cross between r1cloud's own processes (Ray's, a reward's exception) are made by r1cloud itself.

`read_chunks` reads a local checkpoint's tensors without copying them: each DCP record is a
`torch.save` archive; its layout is read with torch's own zip reader and weights-only unpickler,
and its storage becomes a view of the file mapped into memory (what `torch.load(mmap=True)` does
for a whole file, which a DCP file — many archives end to end — is not). merge copies such bytes
file to file, or converts them, without reading them twice.
"""

from __future__ import annotations

import io
import mmap
import os
import pickle
import shutil
import sys
import tempfile
import warnings
from dataclasses import dataclass
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


@dataclass
class Chunk:
    """One saved piece of a tensor: a read-only view of its bytes in the checkpoint file (mapped,
    not read), where it sits in the whole tensor, and — when those bytes are the piece's plain
    row-major data — their place in the file."""

    tensor: object  # torch.Tensor
    offsets: tuple[int, ...]
    file: str
    start: int | None  # first byte in `file`, or None: a strided or offset view of its storage


def read_chunks(dcp_dir: str, meta, names: set[str]) -> dict[str, list[Chunk]]:
    """Every saved piece of the named tensors (DCP names, `model.…`) of a local checkpoint whose
    files `meta` (its `.metadata`) indexes and the caller has checked are whole. A record that is
    not a tensor saved by torch.save raises UnsafeCheckpoint."""
    out: dict[str, list[Chunk]] = {}
    for index, info in meta.storage_data.items():
        if index.fqn not in names:
            continue
        path = os.path.join(dcp_dir, info.relative_path)
        base = info.offset - info.offset % mmap.ALLOCATIONGRANULARITY  # each record mapped alone:
        with open(path, "rb") as f:  # unmapped once its tensor is used, so pages do not pile up
            buf = mmap.mmap(
                f.fileno(), info.offset + info.length - base, access=mmap.ACCESS_READ, offset=base
            )
        tensor, start = _record(buf, info.offset - base, info.length, f"{path}@{info.offset}")
        out.setdefault(index.fqn, []).append(
            Chunk(tensor, tuple(index.offset or ()), path, None if start is None else base + start)
        )
    return out


def _record(buf, offset: int, length: int, where: str):
    """The tensor torch.save wrote at buf[offset : offset + length], its storage a view of `buf`,
    and the offset of its data in `buf` when the tensor is that data, plainly laid out."""
    import torch
    from torch._weights_only_unpickler import Unpickler

    reader = torch._C.PyTorchFileReader(_Window(buf, offset, length))
    if reader.has_record("byteorder") and bytes(reader.get_record("byteorder")).decode() != sys.byteorder:
        raise UnsafeCheckpoint(f"{where} was saved with the other byte order")
    starts = []

    def persistent_load(pid):
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage" and isinstance(pid[4], int)):
            raise UnsafeCheckpoint(f"{where} names a storage as {str(pid)[:60]}")
        kind, key, numel = pid[1], pid[2], pid[4]
        dtype = torch.uint8 if kind is torch.UntypedStorage else kind.dtype
        at, n = offset + reader.get_record_offset(f"data/{key}"), numel * dtype.itemsize
        if at + n > offset + length or starts:
            raise UnsafeCheckpoint(f"{where} is not one tensor's record")
        starts.append(at)
        with warnings.catch_warnings():  # read-only: "The given buffer is not writable"
            warnings.simplefilter("ignore", UserWarning)
            raw = (
                torch.frombuffer(buf, dtype=torch.uint8, count=n, offset=at)
                if n
                else torch.empty(0, dtype=torch.uint8)
            )
        return torch.storage.TypedStorage(wrap_storage=raw.untyped_storage(), dtype=dtype, _internal=True)

    unpickler = Unpickler(io.BytesIO(reader.get_record("data.pkl")), encoding="utf-8")
    unpickler.persistent_load = persistent_load
    tensor = unpickler.load()
    if not isinstance(tensor, torch.Tensor) or not starts:
        raise UnsafeCheckpoint(f"{where} holds a {type(tensor).__name__}, not a tensor")
    plain = (
        tensor.is_contiguous()
        and tensor.storage_offset() == 0
        and tensor.untyped_storage().nbytes() == tensor.numel() * tensor.element_size()
    )
    return tensor, starts[0] if plain else None


class _Window(io.RawIOBase):
    """buf[start : start + length] as a read-only file, for torch's zip reader: nothing copied but
    the headers it reads."""

    def __init__(self, buf, start: int, length: int):
        self.buf, self.start, self.end, self.pos = buf, start, start + length, start

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        n = max(0, min(len(b), self.end - self.pos))
        b[:n] = self.buf[self.pos : self.pos + n]
        self.pos += n
        return n

    def seek(self, offset: int, whence: int = 0) -> int:
        self.pos = {0: self.start, 1: self.pos, 2: self.end}[whence] + offset
        return self.pos - self.start

    def tell(self) -> int:
        return self.pos - self.start
