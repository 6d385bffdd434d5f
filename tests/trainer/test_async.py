"""Asynchronous training's weight path: a rollout-only worker on a device of its own (a CPU slot
here), the actor's weights sent to it from train rank 0 by gloo broadcast in buckets
(trainer/broadcast.py), never through Ray's object store."""

import multiprocessing as mp
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

WEIGHTS = {
    "a": torch.randn(3, 4),
    "b": torch.randn(5),
    "c": torch.randn(2, 2).bfloat16(),
    "d": torch.tensor(3.0),
    "e": torch.randn(100),
}


def _member(rank: int, master: str, out) -> None:
    pg = broadcast.group(master, rank, 3)
    if rank == 0:
        out.put(("sent", broadcast.send(pg, WEIGHTS.items(), bucket_bytes=64)))
    else:
        out.put((rank, [(k, v.dtype, v.clone()) for k, v in broadcast.receive(pg)]))


def test_the_weights_cross_in_buckets_whole_and_in_order():
    """Tensors of two dtypes, a scalar and one larger than a bucket reach both receivers as sent."""
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    members = [ctx.Process(target=_member, args=(r, f"127.0.0.1:{store.port}", out)) for r in range(3)]
    for m in members:
        m.start()
    got = dict(out.get(timeout=60) for _ in members)
    for m in members:
        m.join(timeout=60)
    assert got["sent"] == sum(t.nbytes for t in WEIGHTS.values())
    for rank in (1, 2):
        assert [k for k, _, _ in got[rank]] == list(WEIGHTS)
        for k, dtype, tensor in got[rank]:
            assert dtype == WEIGHTS[k].dtype and torch.equal(tensor, WEIGHTS[k]), k


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
            seqs = [(prompts[s["prompt"]].ids, s["response"]) for s in samples]
            recomputed = steps.log_probs(trainer, [[seqs], [seqs]], temperature=0.8)[0][0]
            worst = max(
                max(abs(a - b) for a, b in zip(s["logprobs"], lp, strict=True))
                for s, lp in zip(samples, recomputed, strict=True)
            )
            return worst, seqs, recomputed

        push(0)
        before, seqs, lp_before = gap()
        assert before <= 1e-4, before
        samples = [
            {"seq": s, "old": None, "ref": [-5.0] * len(s[1]), "adv": (1.0 if i % 2 else -1.0)}
            for i, s in enumerate(seqs)
        ]
        steps.update(trainer, [[{"total": 8.0, "micro": [samples]}], [{"total": 8.0, "micro": [samples]}]])
        changed = steps.log_probs(trainer, [[seqs], [seqs]], temperature=0.8)[0][0]
        moved = max(
            max(abs(a - b) for a, b in zip(x, y, strict=True))
            for x, y in zip(lp_before, changed, strict=True)
        )
        assert moved > 1e-3, moved
        push(1)
        after, _, _ = gap()
        assert after <= 1e-4, after
        assert gather([rollouts[0].__ray_call__.remote(lambda r: r.version)]) == [1]
    finally:
        gather([w.shutdown.remote() for w in [*workers, *rollouts]])
