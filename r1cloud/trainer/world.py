"""torch.distributed worlds met through the controller's store: the store the controller holds
(rendezvous), and a worker joining a world through it (join_world). The trainers' world, the
rollout workers' and the weights group between them (broadcast.py) all meet there."""

from __future__ import annotations

import os
from datetime import timedelta

import torch
import torch.distributed as dist

WAIT = timedelta(minutes=30)


def rendezvous(host: str):
    """The workers' torch.distributed store, held by this process on a port the system gives it
    while it listens, and its address (`host`:port) for HybridWorker. A port found free, released
    and bound again by rank 0 later could be taken in between (another job's workers starting)."""
    store = dist.TCPStore(host, 0, is_master=True, wait_for_workers=False)
    return store, f"{host}:{store.port}"


def join_world(master: str, rank: int, world: int, backend: str, prefix: str = "") -> None:
    """Join a torch.distributed world through the controller's store (`master`, from rendezvous;
    `prefix` keeps one world's keys apart from another's). vLLM's in-process launcher reads RANK,
    WORLD_SIZE and LOCAL_RANK; no MASTER_ADDR/PORT: nothing here may listen on the store's port."""
    local = rank if not torch.cuda.is_available() else 0
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(local))
    dist.init_process_group(backend, store=connect(master, prefix), rank=rank, world_size=world, timeout=WAIT)


def connect(master: str, prefix: str = ""):
    """The controller's store at `master` (host:port), its keys under `prefix`."""
    host, port = master.rsplit(":", 1)
    store = dist.TCPStore(host, int(port), is_master=False, timeout=WAIT)
    return dist.PrefixStore(prefix, store) if prefix else store
