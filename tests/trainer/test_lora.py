"""LoRA (worker.actor.model.lora): the adapted model equals the base at step 0, the reference is
the base with the adapters off (no second copy), FSDP2 gradients of the adapters over 2 workers
equal one process, vLLM's log-probs after a merged sync equal the trainer's, and a checkpoint holds
the adapters only and merges into a full model equal to the trained one."""

import importlib.util
import json

import pytest
import steps
import torch
from openai import OpenAI
from test_numerics import SEQS, single_process_grads
from torch.distributed.checkpoint import FileSystemReader
from transformers import AutoModelForCausalLM

from r1cloud.rollout.engine import Request
from r1cloud.serving.serve import free_port
from r1cloud.spec import load_resolved
from r1cloud.trainer import algorithms as alg
from r1cloud.trainer import lora
from r1cloud.trainer.driver import Trainer
from r1cloud.trainer.model import packed_log_probs, pad
from tiny import generated
from tinyrun import r1, tiny_blueprint

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


def base_model(path, four_bit: bool = False):
    """The base a LoRA run starts from: as it is, or quantised to 4-bit NF4 as QLoRA loads it."""
    if not four_bit:
        return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    model = AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.float32, quantization_config=lora.nf4(torch.float32), device_map={"": "cpu"}
    )
    assert lora.four_bit_params(model)
    return model


@pytest.mark.parametrize("four_bit", [False, True], ids=["lora", "qlora"])
def test_lora_starts_at_the_base_its_reference_is_the_base_and_only_adapters_learn(
    make_run, tiny_model, tmp_path, four_bit
):
    """QLoRA: the same, on a base each worker quantised to 4-bit NF4 as it loaded it (FSDP leaves
    the 4-bit weights whole on every worker and shards the adapters)."""
    run = make_run(*LORA, "worker.actor.optim.lr=0.05", f"worker.actor.model.lora.load_in_4bit={four_bit}")
    trainer = Trainer(run)
    try:
        trainer.start_workers()
        assert "LoRA rank 4" in trainer.adapter["line"]
        if four_bit:
            assert trainer.adapter["line"].endswith("base in 4-bit NF4")
        else:  # validate counts the same from the config alone (a meta-device model)
            assert lora.plan(trainer.spec.worker.actor.model) == trainer.adapter["line"]
        assert trainer.adapter["config"]["base_model_name_or_path"] == str(tiny_model)
        base = base_model(tiny_model, four_bit).eval()
        with torch.no_grad():
            want = [lp.tolist() for lp in packed_log_probs(base, SEQS, 1.0, "cpu")]
        per_rank = [[SEQS], [SEQS]]
        assert worst(steps.log_probs(trainer, per_rank)[0][0], want) <= 1e-5  # B = 0
        # no second model for the reference: the actor with its adapters off
        assert trainer.call("__ray_call__", lambda w: w.ref is None) == [True, True]
        plan = [[{"total": 8.0, "micro": [samples_for(SEQS)]}]] * 2
        steps.update(trainer, plan)
        after = steps.log_probs(trainer, per_rank)[0][0]
        assert worst(after, want) > 1e-3  # the adapters moved the policy
        ref = steps.log_probs(trainer, per_rank, role="ref")[0][0]
        assert worst(ref, want) <= 1e-5  # ... and the reference is still the base
        trainable = trainer.call(
            "__ray_call__", lambda w: [n for n, p in w.actor.named_parameters() if p.requires_grad]
        )[0]
        assert trainable and all(".lora_" in n for n in trainable)
        assert trainer.call("__ray_call__", lambda w: len(w.optim.param_groups[0]["params"]))[0] == len(
            trainable
        )
        # a checkpoint holds the adapters alone (no 4-bit quantisation state), and loads back
        trainer.call("save", str(tmp_path / "ckpt"))
        saved = FileSystemReader(tmp_path / "ckpt").read_metadata().state_dict_metadata
        assert {k.removeprefix("model.") for k in saved if k.startswith("model.")} == set(trainable)
        steps.update(trainer, plan)
        trainer.call("load", str(tmp_path / "ckpt"), None)
        assert worst(steps.log_probs(trainer, per_rank)[0][0], after) <= 1e-6
        if four_bit:  # the 4-bit weights are no worse than the full ones by much, and not the same
            full = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()
            with torch.no_grad():
                plain = [lp.tolist() for lp in packed_log_probs(full, SEQS, 1.0, "cpu")]
            assert 1e-4 < worst(plain, want) < 0.5
    finally:
        trainer.shutdown()


@pytest.mark.parametrize("four_bit", [False, True], ids=["lora", "qlora"])
def test_lora_gradients_across_two_workers_equal_one_process(make_run, tiny_model, four_bit):
    run = make_run(*LORA, f"worker.actor.model.lora.load_in_4bit={four_bit}")
    spec = load_resolved(run / "spec.yaml")
    seqs = [(p, answer) for p, r in SEQS for answer in (r, [t + 40 for t in reversed(r)])]
    samples = samples_for(seqs)
    a = spec.worker.actor
    clip = alg.ClipConfig(a.clip_ratio_low, a.clip_ratio_high, a.clip_ratio_dual)

    def adapt(model):
        torch.manual_seed(spec.data.seed)  # as the workers do: the same A matrices
        lora.add(model, a.model.lora)

    kl = (spec.algorithm.kl_coef, spec.algorithm.kl_penalty)
    load = lambda: base_model(tiny_model, four_bit)  # noqa: E731
    want = single_process_grads(load, samples, clip, "token", *kl, adapt=adapt)
    assert want and all(".lora_" in n for n in want)  # B = 0: only B has a gradient at the start
    mask = pad([torch.ones(len(s["seq"][1])) for s in samples])[1]

    trainer = Trainer(run, spec)
    try:
        trainer.start_workers()
        total = alg.count_for("token", mask)
        plan = [[{"total": total, "micro": [samples[:4]]}], [{"total": total, "micro": [samples[4:]]}]]
        steps.update(trainer, plan, apply=False)
        got = trainer.call("full_grads")[0]
        assert {n for n, g in got.items() if g is not None} == set(want)
        scale = max(w.abs().max().item() for w in want.values())
        assert scale > 1e-4
        assert max((got[n] - want[n]).abs().max().item() for n in want) <= 1e-5
    finally:
        trainer.shutdown()


@pytest.mark.parametrize("merge", ["true", "false", "4bit"])
def test_vllm_log_probs_after_a_lora_sync_equal_the_trainer(make_run, merge):
    """Merged weights, or the adapters alone into a LoRA-enabled engine; QLoRA's 4-bit base goes
    dequantised with the adapters folded in."""
    pytest.importorskip("vllm")
    how = (
        ["worker.actor.model.lora.load_in_4bit=true"]
        if merge == "4bit"
        else [f"worker.actor.model.lora.merge={merge}"]
    )
    run = make_run(*LORA, "worker.actor.optim.lr=0.05", *how, engine="vllm")
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
        samples = generated(trainer.call("generate", prompts, sampling)[0])
        seqs = [(prompts[s["prompt"]].ids, s["response"]) for s in samples]
        steps.update(trainer, [[{"total": 8.0, "micro": [samples_for(seqs)]}]] * 2)
        trainer.call("sync_weights")  # the adapters, folded into the weights or on their own
        assert trainer.call("__ray_call__", lambda w: w.adapter_sync) == [merge == "false"] * 2
        samples = generated(trainer.call("generate", prompts, sampling)[0])
        seqs = [(prompts[s["prompt"]].ids, s["response"]) for s in samples]
        mine = steps.log_probs(trainer, [[seqs], [seqs]], temperature=0.8)[0][0]
        assert worst([s["logprobs"] for s in samples], mine) <= 1e-4
    finally:
        trainer.shutdown()


@pytest.mark.slow
def test_lora_run_through_the_cli_lists_merges_both_ways_and_resumes_on_one_worker(
    make_run, tmp_path, tiny_model, digits_reward
):
    """2 LoRA steps on 2 workers: the checkpoints hold the adapters only and say so; the last one is
    INFERENCE READY (merged with the base); step 1 merges into a full model and, with
    --adapter-only, into a peft folder; both equal the trained policy, which a 1-worker trainer
    loads back from the adapter checkpoint."""
    import torch.distributed.checkpoint as dcp
    from peft import PeftModel

    home = {"R1CLOUD_HOME": str(tmp_path / "home")}
    bp = tmp_path / "lora.yaml"
    bp.write_text(tiny_blueprint(tiny_model, digits_reward))
    args = [*LORA, "worker.actor.optim.lr=0.05", "trainer.max_steps=2", "trainer.save_freq=1"]
    done = r1("train", bp, *args, "--name", "lora-job", env=home)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "LoRA rank 4:" in (tmp_path / "home" / "jobs" / "lora-job" / "train.log").read_text()
    listed = r1("checkpoints", "lora-job", env=home)
    assert listed.stdout.count("LoRA r=4") == 2, listed.stdout
    step = tmp_path / "home" / "jobs" / "lora-job" / "checkpoints" / "global_step_1"
    names = set(dcp.FileSystemReader(str(step / "actor")).read_metadata().state_dict_metadata)
    weights = {n for n in names if n.startswith("model.")}
    assert weights and all(".lora_" in n for n in weights)  # the frozen base is not saved again
    assert json.loads((step / "actor" / "adapter_config.json").read_text())["base_model_name_or_path"] == str(
        tiny_model
    )

    assert (
        r1("merge", "lora-job:step-1", "--out", tmp_path / "full", "--dtype", "fp32", env=home).returncode
        == 0
    )
    made = r1("merge", "lora-job:step-1", "--adapter-only", env=home)
    assert made.returncode == 0, made.stderr
    assert sorted(p.name for p in (step / "adapter").iterdir()) == [
        ".r1cloud-merge.json",  # merge's mark: the files it wrote
        "adapter_config.json",
        "adapter_model.safetensors",
    ]
    from safetensors import safe_open

    with safe_open(str(step / "adapter" / "adapter_model.safetensors"), "pt") as f:
        keys = list(f.keys())  # noqa: SIM118 - safe_open is not a dict
    assert keys and all(
        k.startswith("base_model.model.") and k.endswith((".lora_A.weight", ".lora_B.weight")) for k in keys
    )
    full = AutoModelForCausalLM.from_pretrained(tmp_path / "full", dtype=torch.float32).eval()
    base = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    adapted = PeftModel.from_pretrained(base, step / "adapter").eval()
    with torch.no_grad():
        merged_lp = [lp.tolist() for lp in packed_log_probs(full, SEQS, 1.0, "cpu")]
        ids = torch.tensor([SEQS[0][0] + SEQS[0][1]])
        torch.testing.assert_close(adapted(ids).logits, full(ids).logits, rtol=0, atol=1e-5)
    ready = r1("checkpoints", "lora-job", env=home).stdout
    assert "lora-job:step-2" in ready and "yes" in ready  # the last one: merged with its base at save

    # served with the adapter on its base (vLLM --enable-lora), asked through the openai client
    if importlib.util.find_spec("vllm"):
        port = free_port()
        served = r1(
            "serve", "-c", "lora-job:step-1", "--adapter", "--port", port, "--max-model-len", "128",
            "--detach", "--name", "lora-serve", "--", "--enforce-eager", "--dtype", "float32", env={**home, "VLLM_CPU_KVCACHE_SPACE": "1"},
        )  # fmt: skip
        assert served.returncode == 0, served.stdout + served.stderr
        try:
            client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0)
            assert {m.id for m in client.models.list()} >= {"lora-job-step-1", "lora-job-step-1-base"}
            prompt = SEQS[0][0]

            def first_logprob(name):
                r = client.completions.create(
                    model=name, prompt=prompt, max_tokens=1, temperature=0, logprobs=1,
                    extra_body={"return_tokens_as_token_ids": True},
                )  # fmt: skip
                lp = r.choices[0].logprobs
                return int(lp.tokens[0].removeprefix("token_id:")), lp.token_logprobs[0]

            token, got = first_logprob("lora-job-step-1")
            with torch.no_grad():
                want = torch.log_softmax(full(torch.tensor([prompt])).logits[0, -1].float(), -1)[token].item()
            assert abs(got - want) <= 1e-3, (got, want)  # the served adapter is the trained policy
            base_token, base_got = first_logprob("lora-job-step-1-base")
            with torch.no_grad():
                base_want = torch.log_softmax(plain_logits(tiny_model, prompt), -1)[base_token].item()
            assert abs(base_got - base_want) <= 1e-3, (base_got, base_want)  # and the base, the base
        finally:
            assert r1("stop", "lora-serve", env=home).returncode == 0

    run = make_run(*LORA, "trainer.n_gpus_per_node=1")  # the same adapters on one worker
    trainer = Trainer(run)
    try:
        trainer.start_workers()
        trainer.call("load", str(step / "actor"), None)
        mine = steps.log_probs(trainer, [[SEQS]])[0][0]
    finally:
        trainer.shutdown()
    assert worst(mine, merged_lp) <= 1e-5
    with torch.no_grad():
        plain = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()
        base_lp = [lp.tolist() for lp in packed_log_probs(plain, SEQS, 1.0, "cpu")]
    assert worst(mine, base_lp) > 1e-3  # the adapters did change the policy


def plain_logits(model_path, prompt: list[int]) -> torch.Tensor:
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    return model(torch.tensor([prompt])).logits[0, -1].float()


def test_gae_critic_takes_its_own_adapter_and_trains_its_new_head_in_full(make_run, tiny_model):
    run = make_run(
        *LORA,
        "algorithm.adv_estimator=gae",
        "worker.critic.model.lora.rank=4",
        f"worker.critic.model.model_path={tiny_model}",
        "worker.critic.global_batch_size=4",
    )
    trainer = Trainer(run)
    try:
        trainer.start_workers()
        trainable, in_optim = trainer.call(
            "__ray_call__",
            lambda w: (
                [n for n, p in w.critic.named_parameters() if p.requires_grad],
                sum(len(g["params"]) for g in w.critic_optim.param_groups),
            ),
        )[0]
    finally:
        trainer.shutdown()
    head = [n for n in trainable if n.startswith("score.")]
    assert head == ["score.weight", "score.bias"]  # the value head: new, trained in full, no adapter
    assert all(".lora_" in n for n in trainable if n not in head) and len(trainable) > len(head)
    assert in_optim == len(trainable)
