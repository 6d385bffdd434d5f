"""The cloud job's node entrypoint run for real as two hosts: two network namespaces on one
bridge, each running `python -m r1cloud.jobs.node RUN_DIR` with the environment SkyPilot gives a
node (SKYPILOT_NODE_RANK, SKYPILOT_NODE_IPS, SKYPILOT_NUM_NODES, SKYPILOT_NUM_GPUS_PER_NODE), and
the job's bucket on a moto S3 server on the same network. They form a 2-node Ray cluster and
train with one worker on each, each worker writing its own checkpoint shards to the bucket;
killing the worker node after a checkpoint fails the job fast with a clear error, and a relaunch
resumes from the bucket's last checkpoint and finishes. Needs root and iproute2 (skipped otherwise)."""

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from s3_server import S3Server
from tinyrun import ROOT

IPS = ("10.77.0.1", "10.77.0.2")
BRIDGE = "10.77.0.254"
URL = "s3://ckpts/twohosts/checkpoints"


def sh(*args: str) -> None:
    subprocess.run(args, check=True, capture_output=True, text=True)


@pytest.fixture
def hosts():
    """Two network namespaces on one bridge, the bridge's own address (BRIDGE) reachable from
    both: two hosts and a storage service on one network, as far as Ray, gloo and S3 can tell."""
    if os.geteuid() != 0 or not shutil.which("ip"):
        pytest.skip("needs root and iproute2 for network namespaces")
    tag = f"{os.getpid() % 10000}"
    names, bridge = (f"r1a{tag}", f"r1b{tag}"), f"r1br{tag}"
    try:
        sh("ip", "link", "add", bridge, "type", "bridge")
        sh("ip", "addr", "add", f"{BRIDGE}/24", "dev", bridge)
        sh("ip", "link", "set", bridge, "up")
        for n, ip in zip(names, IPS, strict=True):
            sh("ip", "netns", "add", n)
            sh("ip", "link", "add", f"v{n}", "type", "veth", "peer", "name", f"b{n}")
            sh("ip", "link", "set", f"b{n}", "master", bridge)
            sh("ip", "link", "set", f"b{n}", "up")
            sh("ip", "link", "set", f"v{n}", "netns", n)
            sh("ip", "netns", "exec", n, "ip", "addr", "add", f"{ip}/24", "dev", f"v{n}")
            sh("ip", "netns", "exec", n, "ip", "link", "set", f"v{n}", "up")
            sh("ip", "netns", "exec", n, "ip", "link", "set", "lo", "up")
    except subprocess.CalledProcessError as e:
        remove_hosts(names, bridge)
        pytest.skip(f"network namespaces are not available here: {e.stderr.strip()}")
    yield names
    remove_hosts(names, bridge)


def remove_hosts(names: tuple[str, str], bridge: str) -> None:
    for n in names:
        kill_host(n)
        subprocess.run(["ip", "netns", "del", n], capture_output=True)
    subprocess.run(["ip", "link", "del", bridge], capture_output=True)


@pytest.fixture
def bucket():
    """The job's bucket: moto's S3 server on the bridge, where both hosts reach it."""
    server = S3Server(host=BRIDGE)
    try:
        server.fs().mkdir("ckpts")
        yield server
    finally:
        server.close()


def kill_host(ns: str) -> None:
    """Everything running on that host, at once (a node lost, not shut down)."""
    pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()
    for pid in pids:
        subprocess.run(["kill", "-9", pid], capture_output=True)


def start_node(ns: str, rank: int, run: Path, tmp: Path, label: str, s3: S3Server) -> subprocess.Popen:
    env = {
        **os.environ,
        **s3.env,
        "SKYPILOT_NODE_RANK": str(rank),
        "SKYPILOT_NODE_IPS": "\n".join(IPS),
        "SKYPILOT_NUM_NODES": "2",
        "SKYPILOT_NUM_GPUS_PER_NODE": "0",
        "RAY_TMPDIR": str(tmp / f"ray{rank}"),  # each host has its own /tmp
        "GLOO_SOCKET_IFNAME": f"v{ns}",
        "RAY_AUTH_TOKEN": "0123456789abcdef" * 4,  # the per-launch secret r1cloud passes
        "PYTHONUNBUFFERED": "1",
        "PYTHONPATH": str(ROOT),
        "R1CLOUD_JOIN_TIMEOUT": "240",  # a host that never joins fails in 4 minutes, both logs shown
    }
    (tmp / f"ray{rank}").mkdir(exist_ok=True)
    log = open(tmp / f"{label}{rank}.log", "wb")  # noqa: SIM115 - handed to the child
    return subprocess.Popen(
        ["ip", "netns", "exec", ns, sys.executable, "-m", "r1cloud.jobs.node", str(run)],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def steps_done(run: Path) -> list[int]:
    path = run / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(x)["step"] for x in path.read_text().splitlines() if x.strip()]


def test_two_hosts_train_fail_fast_when_one_dies_and_resume(hosts, bucket, make_run, tmp_path, monkeypatch):
    head_ns, worker_ns = hosts
    monkeypatch.setenv("RAY_ADDRESS", f"{IPS[0]}:6379")  # the cluster the nodes form (validate asks)
    short = Path(f"/tmp/r1mn{os.getpid()}")  # Ray's socket paths must stay short
    short.mkdir(exist_ok=True)
    run = make_run(
        "trainer.nnodes=2",
        "trainer.n_gpus_per_node=1",
        "trainer.max_steps=4",
        "trainer.save_freq=1",
        f"trainer.save_checkpoint_path={URL}",
        name="twohosts",
    )
    try:

        def launch(label: str) -> subprocess.Popen:
            start_node(worker_ns, 1, run, short, label, bucket)
            return start_node(head_ns, 0, run, short, label, bucket)

        def log(label: str, rank: int = 0) -> str:
            return (short / f"{label}{rank}.log").read_text()

        def both(label: str) -> str:  # what each host printed, for a failure's message
            return f"head:\n{log(label)[-3000:]}\nworker host:\n{log(label, 1)[-3000:]}"

        # the worker host dies after a checkpoint: the head fails fast and says why
        head = launch("killed")
        deadline = time.time() + 600
        while max(steps_done(run), default=0) < 2 and time.time() < deadline:
            assert head.poll() is None, both("killed")
            time.sleep(0.5)
        assert "all 2 nodes joined" in log("killed"), both("killed")  # (once: 600 s in a loaded full run)
        assert f"workers on {IPS[0]} ×1, {IPS[1]} ×1" in log("killed")  # one worker per host
        kill_host(worker_ns)
        killed = time.time()
        code = head.wait(timeout=300)
        assert code != 0 and "a trainer worker died" in log("killed"), log("killed")[-4000:]
        assert time.time() - killed < 120  # fast, not a collective's 30-minute timeout
        assert "Traceback" not in log("killed")

        # relaunched: resumes from the last complete checkpoint in the bucket and finishes
        saved = max(steps_done(run))
        head = launch("again")
        assert head.wait(timeout=600) == 0, log("again")[-4000:]
        assert f"[resume] from step {saved} ({URL}/global_step_{saved})" in log("again"), log("again")[-3000:]
        assert steps_done(run)[-1] == 4
        # each host's worker wrote its own shard into the bucket; no host keeps a checkpoint
        fs = bucket.fs()
        shards = fs.ls("ckpts/twohosts/checkpoints/global_step_4/actor", detail=False)
        assert sum(p.endswith(".distcp") for p in shards) == 2, shards
        assert not list(run.rglob("*.distcp")) and not list(short.rglob("*.distcp"))
        # the last one merged at save time from both hosts' shards, read from the bucket
        assert fs.exists("ckpts/twohosts/checkpoints/global_step_4/huggingface/model.safetensors")
        # the worker host stays attached until the head's cluster is gone, then leaves
        deadline = time.time() + 180
        while "left the cluster" not in log("again", 1) and time.time() < deadline:
            time.sleep(1)
        assert "left the cluster" in log("again", 1)
    finally:
        shutil.rmtree(short, ignore_errors=True)
