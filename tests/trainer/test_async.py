"""Asynchronous training's weight path: a rollout-only worker on a device of its own (a CPU slot
here), the actor's weights sent to it from train rank 0 by gloo broadcast in buckets
(trainer/broadcast.py), never through Ray's object store."""

import json
import multiprocessing as mp
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
    import json

    from tinyrun import run_trainer

    def curve(run) -> list[dict]:
        done = run_trainer(run)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
        keys = ("reward/overall", "actor/pg_loss", "actor/kl_loss", "response_length/mean")
        return [{k: line[k] for k in keys} for line in lines]

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
    staleness = [
        json.loads(x)["async/staleness"] for x in (asynchronous / "metrics.jsonl").read_text().splitlines()
    ]
    assert staleness == [0.0, 0.0, 0.0]
