"""LoRA (worker.actor.model.lora): the adapted model equals the base at step 0, the reference is
the base with the adapters off (no second copy), FSDP2 gradients of the adapters over 2 workers
equal one process, vLLM's log-probs after a merged sync equal the trainer's, and a checkpoint holds
the adapters only and merges into a full model equal to the trained one."""

import json

import pytest
import torch
from test_numerics import SEQS, single_process_grads
from transformers import AutoModelForCausalLM

from r1cloud.spec import load_resolved
from r1cloud.trainer import algorithms as alg
from r1cloud.trainer import lora
from r1cloud.trainer.driver import Trainer
from r1cloud.trainer.model import packed_log_probs, pad
from r1cloud.trainer.rollout import Request

LORA = ("worker.actor.model.lora.rank=4", "worker.actor.model.lora.alpha=8")


def samples_for(seqs, seed: int = 0) -> list[dict]:
    g = torch.Generator().manual_seed(seed)
    return [
        {
            "seq": s,
            "old": (torch.randn(len(s[1]), generator=g) * 0.3 - 4).tolist(),
            "ref": (torch.randn(len(s[1]), generator=g) * 0.3 - 4).tolist(),
            "adv": float(torch.randn((), generator=g)) + (i % 3 - 1),
        }
        for i, s in enumerate(seqs)
    ]


def worst(a, b) -> float:
    return max(max(abs(x - y) for x, y in zip(p, q, strict=True)) for p, q in zip(a, b, strict=True))


def test_lora_starts_at_the_base_its_reference_is_the_base_and_only_adapters_learn(make_run, tiny_model):
    run = make_run(*LORA, "worker.actor.optim.lr=0.05")
    trainer = Trainer(run)
    try:
        trainer.start_workers()
        assert "LoRA rank 4" in trainer.adapter["line"]
        assert trainer.adapter["config"]["base_model_name_or_path"] == str(tiny_model)
        base = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()
        with torch.no_grad():
            want = [lp.tolist() for lp in packed_log_probs(base, SEQS, 1.0, "cpu")]
        per_rank = [[SEQS], [SEQS]]
        assert worst(trainer.call("log_probs", per_rank=per_rank)[0][0], want) <= 1e-5  # B = 0
        # no second model for the reference: the actor with its adapters off
        assert trainer.call("__ray_call__", lambda w: w.ref is None) == [True, True]
        plan = [[{"total": 8.0, "micro": [samples_for(SEQS)]}]] * 2
        trainer.call("update", per_rank=plan)
        after = trainer.call("log_probs", per_rank=per_rank)[0][0]
        assert worst(after, want) > 1e-3  # the adapters moved the policy
        ref = trainer.call("log_probs", role="ref", per_rank=per_rank)[0][0]
        assert worst(ref, want) <= 1e-5  # ... and the reference is still the base
        trainable = trainer.call(
            "__ray_call__", lambda w: [n for n, p in w.actor.named_parameters() if p.requires_grad]
        )[0]
        assert trainable and all(".lora_" in n for n in trainable)
        assert trainer.call("__ray_call__", lambda w: len(w.optim.param_groups[0]["params"]))[0] == len(
            trainable
        )
    finally:
        trainer.shutdown()


def test_lora_gradients_across_two_workers_equal_one_process(make_run, tiny_model):
    run = make_run(*LORA)
    spec = load_resolved(run / "spec.yaml")
    seqs = [(p, answer) for p, r in SEQS for answer in (r, [t + 40 for t in reversed(r)])]
    samples = samples_for(seqs)
    a = spec.worker.actor
    clip = alg.ClipConfig(a.clip_ratio_low, a.clip_ratio_high, a.clip_ratio_dual)

    def adapt(model):
        torch.manual_seed(spec.data.seed)  # as the workers do: the same A matrices
        lora.add(model, a.model.lora)

    kl = (spec.algorithm.kl_coef, spec.algorithm.kl_penalty)
    want = single_process_grads(tiny_model, samples, clip, "token", *kl, adapt=adapt)
    assert want and all(".lora_" in n for n in want)  # B = 0: only B has a gradient at the start
    mask = pad([torch.ones(len(s["seq"][1])) for s in samples])[1]

    trainer = Trainer(run, spec)
    try:
        trainer.start_workers()
        total = alg.count_for("token", mask)
        plan = [[{"total": total, "micro": [samples[:4]]}], [{"total": total, "micro": [samples[4:]]}]]
        trainer.call("update", apply=False, per_rank=plan)
        got = trainer.call("full_grads")[0]
        assert {n for n, g in got.items() if g is not None} == set(want)
        scale = max(w.abs().max().item() for w in want.values())
        assert scale > 1e-4
        assert max((got[n] - want[n]).abs().max().item() for n in want) <= 1e-5
    finally:
        trainer.shutdown()


def test_vllm_log_probs_after_a_lora_sync_equal_the_trainer(make_run):
    pytest.importorskip("vllm")
    run = make_run(*LORA, "worker.actor.optim.lr=0.05", engine="vllm")
    trainer = Trainer(run)
    try:
        assert trainer.start_workers() == "vllm"
        prompts = [Request(p.prompt_ids) for p in trainer.train_set.prompts[:2]]
        sampling = {
            "n": 2,
            "temperature": 0.8,
            "top_p": 1.0,
            "top_k": -1,
            "max_tokens": 10,
            "seed": 3,
            "ignore_eos": False,
        }
        trainer.call("sync_weights")
        samples = trainer.call("generate", prompts, sampling)[0]
        seqs = [(prompts[s["prompt"]].ids, s["response"]) for s in samples]
        trainer.call("update", per_rank=[[{"total": 8.0, "micro": [samples_for(seqs)]}]] * 2)
        trainer.call("sync_weights")  # the adapters folded into the engine's weights
        samples = trainer.call("generate", prompts, sampling)[0]
        seqs = [(prompts[s["prompt"]].ids, s["response"]) for s in samples]
        mine = trainer.call("log_probs", temperature=0.8, per_rank=[[seqs], [seqs]])[0][0]
        assert worst([s["logprobs"] for s in samples], mine) <= 1e-4
    finally:
        trainer.shutdown()


def test_lora_checkpoint_holds_adapters_and_merges_to_the_trained_model(make_run, tmp_path, tiny_model):
    import torch.distributed.checkpoint as dcp

    from r1cloud.checkpoints import select
    from r1cloud.merge import merge

    run = make_run(*LORA, "worker.actor.optim.lr=0.05", "trainer.max_steps=1", "trainer.save_freq=1")
    trainer = Trainer(run)
    try:
        trainer.fit()
    finally:
        trainer.shutdown()
    step = run / "checkpoints" / "global_step_1"
    names = set(dcp.FileSystemReader(str(step / "actor")).read_metadata().state_dict_metadata)
    weights = {n for n in names if n.startswith("model.")}
    assert weights and all(".lora_" in n for n in weights)
    adapter = json.loads((step / "actor" / "adapter_config.json").read_text())
    assert adapter["r"] == 4 and adapter["base_model_name_or_path"] == str(tiny_model)
    out = merge(select(str(run / "checkpoints"), "run", 1), tmp_path / "merged", dtype="fp32")
    merged = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    trainer = Trainer(run)
    try:
        trainer.start_workers()
        trainer.call("load", str(step / "actor"), None)
        mine = trainer.call("log_probs", per_rank=[[SEQS], [SEQS]])[0][0]
    finally:
        trainer.shutdown()
    with torch.no_grad():
        theirs = [lp.tolist() for lp in packed_log_probs(merged, SEQS, 1.0, "cpu")]
    assert worst(mine, theirs) <= 1e-5
