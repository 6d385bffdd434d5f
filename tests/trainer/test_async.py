"""Asynchronous training: the weight path (a rollout-only worker on a device of its own, a CPU slot
here, and the actor's weights sent to it from train rank 0 by gloo broadcast in buckets, never
through Ray's object store), and whole runs: equal to the synchronous run at bound 0, the bound
kept against a slow trainer, resumed without training a sample twice, a rollout worker killed."""

import contextlib
import json
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import steps
import torch
import torch.distributed as dist

from r1cloud.rollout.engine import Request
from r1cloud.spec import load_resolved
from r1cloud.trainer import broadcast
from r1cloud.trainer.group import gather, launch
from tiny import generated


def weights() -> dict[str, torch.Tensor]:
    """Tensors of two dtypes, a scalar and one larger than a 64-byte bucket (the same in every process)."""
    g = torch.Generator().manual_seed(0)
    return {
        "a": torch.randn(3, 4, generator=g),
        "b": torch.randn(5, generator=g),
        "c": torch.randn(2, 2, generator=g).bfloat16(),
        "d": torch.tensor(3.0),
        "e": torch.randn(100, generator=g),
    }


def _member(rank: int, master: str, out: str) -> None:
    pg = broadcast.group(master, rank, 3)
    if rank == 0:
        got = broadcast.send(pg, weights().items(), bucket_bytes=64)
    else:
        got = [[k, str(v.dtype), v.float().tolist()] for k, v in broadcast.receive(pg)]
    Path(out).write_text(json.dumps(got))


def test_the_weights_cross_in_buckets_whole_and_in_order(tmp_path):
    """Every tensor reaches both receivers as it was sent, in order, each bucket of one dtype."""
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    ctx = mp.get_context("spawn")  # not fork: this process runs threads (Ray's, xdist's)
    members = [
        ctx.Process(target=_member, args=(r, f"127.0.0.1:{store.port}", str(tmp_path / f"{r}.json")))
        for r in range(3)
    ]
    for m in members:
        m.start()
    for m in members:
        m.join(timeout=120)
        assert m.exitcode == 0
    sent = weights()
    assert json.loads((tmp_path / "0.json").read_text()) == sum(t.nbytes for t in sent.values())
    for rank in (1, 2):
        got = json.loads((tmp_path / f"{rank}.json").read_text())
        assert [k for k, _, _ in got] == list(sent)
        for k, dtype, values in got:
            assert dtype == str(sent[k].dtype) and torch.equal(
                torch.tensor(values).to(sent[k].dtype), sent[k]
            ), k


def test_a_rollout_worker_samples_from_the_weights_train_rank_0_sends(tmp_path, digits_reward):
    """Two FSDP train workers and one rollout-only vLLM worker: its sampling log-probs equal the
    trainer's before an update and again after a large update and a push (and not in between)."""
    pytest.importorskip("vllm")
    from conftest import run_folder
    from tiny import make_tiny_model
    from tinyrun import tiny_blueprint

    model = make_tiny_model(tmp_path / "model")
    run = run_folder(
        tmp_path, "run", tiny_blueprint(model, digits_reward, engine="vllm"), ["worker.actor.optim.lr=0.05"]
    )
    spec = load_resolved(run / "spec.yaml")
    workers, rollouts, _store = launch(spec, 2, rollout=1)
    trainer = SimpleNamespace(workers=workers)
    try:
        gather([w.set_schedule.remote(10) for w in workers])
        gather([r.start_engine.remote("vllm", 0, 8) for r in rollouts])
        gather([workers[0].join_weights.remote(2), rollouts[0].join_weights.remote(2)])

        def push(version: int) -> None:
            gather([w.push_weights.remote() for w in workers] + [rollouts[0].receive_weights.remote(version)])

        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(model)
        prompts = [Request(tok.encode(f"What is {a} + {b}? The answer is")) for a, b in ((3, 4), (10, 2))]
        sampling = {"n": 2, "temperature": 0.8, "top_p": 1.0, "top_k": -1, "max_tokens": 12, "seed": 3}
        sampling["ignore_eos"] = False

        def gap() -> tuple[float, list, list]:
            samples = generated(gather([rollouts[0].generate.remote(prompts, sampling)])[0])
            return steps.engine_gap(trainer, samples, prompts, 0.8)

        push(0)
        before, seqs, lp_before = gap()
        assert before <= 1e-4, before
        steps.large_update(trainer, seqs)
        changed = steps.log_probs(trainer, [[seqs], [seqs]], temperature=0.8)[0][0]
        assert steps.largest_gap(lp_before, changed) > 1e-3
        push(1)
        after, _, _ = gap()
        assert after <= 1e-4, after
        assert gather([rollouts[0].__ray_call__.remote(lambda r: r.version)]) == [1]
    finally:
        gather([w.shutdown.remote() for w in [*workers, *rollouts]])


def test_asynchronous_with_bound_0_trains_the_synchronous_runs_samples(make_run):
    """Two train workers and two rollout workers, bound 0 and a push after every update, against the
    synchronous run on two hybrid workers: the same rewards and losses step for step (seeded)."""
    from tinyrun import run_trainer

    def curve(run) -> list[dict]:
        done = run_trainer(run)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        keys = ("reward/overall", "actor/pg_loss", "actor/kl_loss", "response_length/mean")
        return [{k: line[k] for k in keys} for line in lines(run)]

    sync = curve(make_run(name="sync"))
    overrides = (
        "async_training.enable=true",
        "async_training.max_staleness=0",
        "worker.rollout.n_gpus_per_node=2",
    )
    asynchronous = make_run(*overrides, name="async")
    got = curve(asynchronous)
    assert len(got) == len(sync) == 3
    for a, b in zip(got, sync, strict=True):
        for k in a:
            assert abs(a[k] - b[k]) <= 1e-5, (k, a, b)
    assert [m["async/staleness_max"] for m in lines(asynchronous)] == [0.0, 0.0, 0.0]


# The digits reward, slowly (the driver scores: a deliberately slow trainer, which the rollout
# workers run ahead of), writing down each sample's ground truth as it is scored.
SCORED = """
import os
import time

REWARD_TYPE = "batch"


def compute_score(reward_inputs):
    time.sleep(float(os.environ.get("R1_SLOW", "0")))
    with open(os.environ["R1_SCORED"], "a") as f:
        f.writelines(f"{x['ground_truth']}\\n" for x in reward_inputs)
    out = []
    for x in reward_inputs:
        digits = sum(c.isdigit() for c in x["response"]) / max(len(x["response"]), 1)
        out.append({"overall": digits})
    return out
"""
BOUND_2 = (  # a push every 2 updates, samples up to 2 updates old
    "async_training.enable=true",
    "worker.rollout.n_gpus_per_node=1",
    "async_training.max_staleness=2",
    "async_training.trigger_parameter_sync_step=2",
    "trainer.max_steps=4",
)


@pytest.fixture
def scored_run(tmp_path, tiny_model):
    from conftest import run_folder
    from tinyrun import tiny_blueprint

    reward = tmp_path / "scored.py"
    reward.write_text(SCORED)
    return lambda *overrides, name: run_folder(tmp_path, name, tiny_blueprint(tiny_model, reward), overrides)


def scored(path: Path) -> list[list[str]]:
    """The ground truths scored, step by step (16 samples a step; sorted: the reward's processes
    share a step's samples)."""
    lines = path.read_text().split()
    return [sorted(lines[i : i + 16]) for i in range(0, len(lines), 16)]


def lines(run: Path) -> list[dict]:
    path = run / "metrics.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def start(run: Path, tmp_path: Path, **env: str) -> subprocess.Popen:
    """The node entrypoint on `run` in a session of its own, its output in tmp_path/RUN.out and .err."""
    out, err = (open(tmp_path / f"{run.name}.{x}", "w") for x in ("out", "err"))  # noqa: SIM115 - to the child
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **env}
    cmd = [sys.executable, "-m", "r1cloud.trainer", str(run)]
    return subprocess.Popen(cmd, env=env, stdout=out, stderr=err, start_new_session=True)


def test_no_sample_trains_older_than_the_bound_and_a_resumed_run_trains_none_twice(scored_run, tmp_path):
    """Against a slow trainer the rollout worker runs ahead as far as the bound lets it: the versions
    the rollout worker reports say no trained sample lagged more than 2 updates, and some lagged 2.
    Killed after step 2's checkpoint and resumed, the run trains the same prompts step for step as
    one that was not, the batch that was in flight generated again."""
    from tinyrun import run_trainer

    slow = {"R1_SLOW": "1"}
    whole = scored_run(*BOUND_2, name="whole")
    done = run_trainer(whole, env={**slow, "R1_SCORED": str(tmp_path / "whole.txt")})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    got = lines(whole)
    assert [m["async/staleness_max"] for m in got] == [0.0, 1.0, 2.0, 1.0]
    assert all(m["async/staleness_2"] + m["async/staleness_1"] + m["async/staleness_0"] == 1 for m in got)
    # the rollout worker ahead of the slow trainer: it waits, the trainer does not
    assert all(m["async/trainer_idle"] < 0.5 < m["async/rollout_idle"] for m in got[1:]), got

    killed = scored_run(*BOUND_2, "trainer.save_freq=1", name="killed")
    proc = start(killed, tmp_path, **slow, R1_SCORED=str(tmp_path / "killed.txt"))
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None and len(lines(killed)) < 2:
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)  # the driver, its Ray cluster and workers: no goodbye
    proc.wait()
    assert [m["step"] for m in lines(killed)] == [1, 2]
    again = run_trainer(killed, env={**slow, "R1_SCORED": str(tmp_path / "again.txt")})
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "[resume] from step 2" in again.stdout
    assert "1 batch(es) in flight then are generated again" in again.stdout
    want = scored(tmp_path / "whole.txt")
    assert scored(tmp_path / "killed.txt")[:2] == want[:2]
    assert scored(tmp_path / "again.txt") == want[2:]
    assert [m["async/staleness_max"] for m in lines(killed)] == [0.0, 1.0, 0.0, 1.0]  # regenerated: fresh


def rollout_workers() -> list[int]:
    """The rollout workers' processes among this test process's descendants (the session's Ray head
    is one: tests/trainer/conftest.py; each xdist process has its own)."""
    import psutil

    ours = []
    for p in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if p.cmdline()[:1] and p.cmdline()[0].startswith("ray::RolloutWorker"):
                ours.append(p.pid)
    return ours


def test_a_rollout_worker_killed_mid_run_ends_the_job_in_one_line_naming_its_pool(scored_run, tmp_path):
    run = scored_run(*BOUND_2, "trainer.max_steps=50", name="kill")
    proc = start(run, tmp_path, R1_SLOW="0.5", R1_SCORED=str(tmp_path / "kill.txt"))
    try:
        deadline, ours = time.time() + 300, []
        while time.time() < deadline and proc.poll() is None and not ours:
            if lines(run):  # a step done: the next one is under way
                ours = rollout_workers()
            time.sleep(0.05)
        assert len(ours) == 1 and proc.poll() is None, (ours, proc.poll())
        os.kill(ours[0], signal.SIGKILL)
        killed = time.time()
        proc.wait(timeout=180)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    out, err = ((tmp_path / f"kill.{x}").read_text() for x in ("out", "err"))
    assert proc.returncode == 1, out[-3000:] + err[-3000:]
    assert time.time() - killed < 120  # fast, not a collective's time-out
    said = [x for x in err.splitlines() if x.startswith("error:")]
    assert len(said) == 1 and "a rollout worker died" in said[0], err[-3000:]
    assert "Traceback" not in err
