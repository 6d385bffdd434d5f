"""The workers' torch.distributed rendezvous (group.rendezvous): the trainer holds the store's port
from the moment it hands the address out, so no other process can take it before the workers join
(a port found free and released had been taken once by another test's workers: EADDRINUSE in CI),
and real processes form a gloo world through it as HybridWorker does."""

import os
import socket
import subprocess
import sys
from datetime import timedelta

import pytest
import torch.distributed as dist

from r1cloud.trainer.group import rendezvous

# one worker's join, as HybridWorker.__init__ does it, then a sum across the world
JOIN = """
import sys
from datetime import timedelta
import torch, torch.distributed as dist
host, port, rank = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
store = dist.TCPStore(host, port, is_master=False, timeout=timedelta(seconds=60))
dist.init_process_group("gloo", store=store, rank=rank, world_size=2)
x = torch.tensor([rank + 1.0])
dist.all_reduce(x)
print(int(x.item()))
dist.destroy_process_group()
"""


def test_the_store_holds_its_port_while_the_workers_start():
    store, address = rendezvous("127.0.0.1")
    host, port = address.rsplit(":", 1)
    assert host == "127.0.0.1" and int(port) == store.port > 0
    with socket.socket() as other, pytest.raises(OSError):  # another job cannot take it
        other.bind(("127.0.0.1", int(port)))
    client = dist.TCPStore(host, int(port), is_master=False, timeout=timedelta(seconds=10))
    client.set("seen", "yes")
    assert store.get("seen") == b"yes"


def test_two_processes_join_a_gloo_world_through_it():
    store, address = rendezvous("127.0.0.1")
    host, port = address.rsplit(":", 1)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MASTER_")}
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", JOIN, host, port, str(rank)], env=env, stdout=subprocess.PIPE, text=True
        )
        for rank in range(2)
    ]
    outs = [w.communicate(timeout=120)[0].strip() for w in workers]
    assert [w.returncode for w in workers] == [0, 0]
    assert outs == ["3", "3"]  # 1 + 2 on both ranks
