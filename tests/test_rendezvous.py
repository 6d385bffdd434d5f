"""Ports a process picks for others to use. The workers' torch.distributed rendezvous
(world.rendezvous): the trainer holds the store's port from the moment it hands the address out,
so no other process can take it before the workers join (a port found free and released had been
taken once by another test's workers: EADDRINUSE in CI), and real processes form a gloo world
through it as HybridWorker does. A server's port
(serve.free_port, for `r1cloud chat`'s private server and the tests' servers) comes from outside
the kernel's ephemeral range, so no outgoing connection or port-0 bind can take it meanwhile."""

import os
import socket
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
import torch.distributed as dist

from r1cloud.serving.serve import free_port
from r1cloud.trainer.world import rendezvous

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


def test_a_server_port_comes_from_outside_the_ephemeral_range():
    low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    ephemeral = []
    for _ in range(20):  # what the kernel gives a port-0 bind lies in its range; free_port's not
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            ephemeral.append(s.getsockname()[1])
    assert all(low <= p <= high for p in ephemeral)
    ports = {free_port() for _ in range(20)}
    assert len(ports) > 1 and all((20000 <= p < low) if low > 21000 else p > 0 for p in ports)
    for port in ports:  # each is free: a server can listen on it
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))
            s.listen()
