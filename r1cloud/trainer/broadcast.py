"""The actor's weights from train rank 0 to the rollout workers of asynchronous training, by
collective broadcast in buckets — never through Ray's object store.

The weights group is a gloo process group of its own over the controller's store (PrefixStore
"weights/"): train rank 0 is its rank 0 and rollout worker i its rank i + 1; it lives beside the
trainers' and the rollout workers' own worlds. Gloo moves host memory, so on GPUs a bucket is
copied to the host first.

A bucket crosses as three broadcasts: its header's length, the header (JSON: each tensor's name,
shape and dtype, all of one dtype), and its tensors end to end as bytes. A length of 0 ends the
stream. The receiver yields each bucket's tensors before it receives the next, so at most one
bucket is held beyond the engine's own weights.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator

import torch
import torch.distributed as dist

from r1cloud.trainer.world import WAIT, connect

BUCKET_BYTES = 256 << 20


def group(master: str, rank: int, size: int):
    """Join the weights group (`size` members: train rank 0 and the rollout workers); every member
    calls this at the same time."""
    return dist.ProcessGroupGloo(connect(master, "weights/"), rank, size, WAIT)


def _broadcast(pg, tensor: torch.Tensor) -> torch.Tensor:
    opts = dist.BroadcastOptions()
    opts.rootRank = 0
    pg.broadcast([tensor], opts).wait()
    return tensor


def send(pg, weights: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int = BUCKET_BYTES) -> int:
    """Train rank 0: every (name, tensor) of `weights`, in buckets of at most `bucket_bytes` (a
    larger tensor alone); the bytes sent."""
    bucket: list[tuple[str, torch.Tensor]] = []
    size = sent = 0
    for name, tensor in weights:
        t = tensor.detach().to("cpu").contiguous()
        if bucket and (t.dtype != bucket[0][1].dtype or size + t.nbytes > bucket_bytes):
            sent += _send_bucket(pg, bucket)
            bucket, size = [], 0
        bucket.append((name, t))
        size += t.nbytes
    if bucket:
        sent += _send_bucket(pg, bucket)
    _broadcast(pg, torch.zeros(1, dtype=torch.int64))
    return sent


def _send_bucket(pg, bucket: list[tuple[str, torch.Tensor]]) -> int:
    header = json.dumps([[n, list(t.shape), str(t.dtype).removeprefix("torch.")] for n, t in bucket])
    data = header.encode()
    _broadcast(pg, torch.tensor([len(data)], dtype=torch.int64))
    _broadcast(pg, torch.frombuffer(bytearray(data), dtype=torch.uint8))
    flat = torch.cat([t.reshape(-1).view(torch.uint8) for _, t in bucket])
    return _broadcast(pg, flat).numel()


def receive(pg) -> Iterator[tuple[str, torch.Tensor]]:
    """A rollout worker: the tensors train rank 0 sends, one bucket at a time, as they arrive."""
    while n := int(_broadcast(pg, torch.zeros(1, dtype=torch.int64))):
        header = json.loads(_broadcast(pg, torch.empty(n, dtype=torch.uint8)).numpy().tobytes())
        dtype = getattr(torch, header[0][2])
        counts = [math.prod(shape) for _, shape, _ in header]
        flat = _broadcast(pg, torch.empty(sum(counts) * dtype.itemsize, dtype=torch.uint8)).view(dtype)
        for (name, shape, _), part in zip(header, flat.split(counts), strict=True):
            yield name, part.view(shape)
