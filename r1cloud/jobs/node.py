"""The node entrypoint of a cloud job: every node of the cluster runs
`python -m r1cloud.jobs.node RUN_DIR` with the environment SkyPilot gives it.

One node: the trainer, as the local backend runs it. Several: each node starts a Ray node of
r1cloud's own cluster on ports that do not collide with SkyPilot's Ray (6380/8266/52365) — the
head on rank 0, at the first of `SKYPILOT_NODE_IPS`. The head waits until all
`SKYPILOT_NUM_NODES` nodes joined, then runs the trainer against that cluster; the other nodes
stay attached until the head's cluster goes away. Ray runs in the foreground (`--block`) as a
child of this process, so ending it stops exactly what it started — never `ray stop`, which would
take SkyPilot's own Ray down with it.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import yaml

from r1cloud.core import budget

RAY_PORT = int(os.environ.get("R1CLOUD_RAY_PORT", "6379"))
DASHBOARD_AGENT_PORT = int(os.environ.get("R1CLOUD_RAY_AGENT_PORT", "52366"))
JOIN_TIMEOUT = float(os.environ.get("R1CLOUD_JOIN_TIMEOUT", "600"))


def say(text: str) -> None:
    print(f"[node] {text}", flush=True)


def cluster_env() -> tuple[int, int, list[str], int]:
    rank = int(os.environ.get("SKYPILOT_NODE_RANK", "0"))
    ips = [ip.strip() for ip in os.environ.get("SKYPILOT_NODE_IPS", "").splitlines() if ip.strip()]
    nodes = int(os.environ.get("SKYPILOT_NUM_NODES", str(len(ips) or 1)))
    gpus = int(os.environ.get("SKYPILOT_NUM_GPUS_PER_NODE", "0"))
    return rank, nodes, ips, gpus


def ray_command(rank: int, head: str, ip: str, gpus: int, slots: int) -> list[str]:
    cmd = [sys.executable, "-m", "ray.scripts.scripts", "start", "--block", "--disable-usage-stats"]
    cmd += [f"--node-ip-address={ip}", f"--dashboard-agent-listen-port={DASHBOARD_AGENT_PORT}"]
    if rank == 0:
        cmd += ["--head", f"--port={RAY_PORT}", "--include-dashboard=false"]
    else:
        cmd += [f"--address={head}:{RAY_PORT}"]
    # GPUs where there are any; on CPU nodes, one slot per trainer worker plus one for the driver.
    cmd += [f"--num-gpus={gpus}"] if gpus else [f"--num-cpus={slots + (1 if rank == 0 else 0)}"]
    return cmd


def slots_in_spec(run_dir: str) -> int:
    """Worker slots per node on CPU nodes: the spec's trainer.n_gpus_per_node."""
    spec = yaml.safe_load((Path(run_dir) / "spec.yaml").read_text())
    return int(spec["trainer"]["n_gpus_per_node"])


def wait_for_head(head: str) -> bool:
    """Workers start after the head: wait until its Ray port accepts connections."""
    deadline = time.monotonic() + JOIN_TIMEOUT
    while time.monotonic() < deadline:
        try:
            socket.create_connection((head, RAY_PORT), timeout=2).close()
            time.sleep(3)  # the port opens a moment before the head is ready for members
            return True
        except OSError:
            time.sleep(1)
    return False


def alive_nodes(address: str) -> int | None:
    """How many nodes the cluster at `address` has, or None while it does not answer."""
    probe = (
        "import ray,sys; ray.init(address=sys.argv[1], logging_level='ERROR', log_to_driver=False);"
        "print(sum(1 for n in ray.nodes() if n['Alive']))"
    )
    r = subprocess.run([sys.executable, "-c", probe, address], capture_output=True, text=True, timeout=120)
    try:
        return int(r.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        return None


def main(run_dir: str) -> int:
    rank, nodes, ips, gpus = cluster_env()
    trainer = [sys.executable, "-m", "r1cloud.trainer", run_dir]
    if nodes == 1:
        return finished(subprocess.call(trainer))
    if len(ips) != nodes:
        say(f"SKYPILOT_NODE_IPS lists {len(ips)} addresses for {nodes} nodes")
        return 2
    head, address = ips[0], f"{ips[0]}:{RAY_PORT}"
    # The cluster's token (a per-launch secret r1cloud passes to every node); without one, Ray
    # must be told plainly, or a node that finds a stale ~/.ray/auth_token turns auth on alone.
    os.environ["RAY_AUTH_MODE"] = "token" if os.environ.get("RAY_AUTH_TOKEN") else "disabled"
    slots = gpus or slots_in_spec(run_dir)
    if rank > 0 and not wait_for_head(head):
        say(f"the head node {head}:{RAY_PORT} did not come up within {JOIN_TIMEOUT:.0f}s")
        return 1
    ray = subprocess.Popen(ray_command(rank, head, ips[rank], gpus, slots))
    try:
        if rank == 0:
            return run_head(ray, address, nodes, trainer)
        return stay_attached(ray, address)
    finally:
        if ray.poll() is None:
            ray.terminate()
            try:
                ray.wait(timeout=30)
            except subprocess.TimeoutExpired:
                ray.kill()


def run_head(ray: subprocess.Popen, address: str, nodes: int, trainer: list[str]) -> int:
    deadline = time.monotonic() + JOIN_TIMEOUT
    joined = 0
    while joined < nodes:
        if ray.poll() is not None:
            say(f"Ray's head node exited ({ray.returncode}) before the cluster formed")
            return 1
        if time.monotonic() > deadline:
            say(f"only {joined} of {nodes} nodes joined within {JOIN_TIMEOUT:.0f}s; giving up")
            return 1
        joined = alive_nodes(address) or 0
        if joined < nodes:
            time.sleep(2)
    say(f"all {nodes} nodes joined the Ray cluster at {address}; starting the trainer")
    return finished(subprocess.call(trainer, env={**os.environ, "RAY_ADDRESS": address}))


def finished(code: int) -> int:
    """The trainer's exit code for SkyPilot; a budget stop ends the job as done, not as an error
    a managed job would restart and pay for again."""
    if code == budget.EXIT:
        say("the job's budget stopped the trainer (its [budget] line above); ending without a restart")
        return 0
    return code


def stay_attached(ray: subprocess.Popen, address: str) -> int:
    """A worker node: Ray runs until the head's cluster is gone (the trainer finished or failed)."""
    say(f"joining the Ray cluster at {address}")
    code = ray.wait()
    say(f"left the cluster (ray exited {code})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
