"""Numbers the trainer must get exactly right: packed vs padded log-probs, a group's shared prompt
vs one copy per sample, FSDP2 gradients across 2 workers vs one process, micro-batch split
invariance, vLLM's sampling log-probs vs the trainer's before and after a weight sync."""

import os

import pytest
import steps
import torch
from transformers import AutoModelForCausalLM

from r1cloud.core.dtypes import torch_dtype
from r1cloud.rollout.engine import Request
from r1cloud.spec import load_resolved
from r1cloud.trainer import algorithms as alg
from r1cloud.trainer import attention
from r1cloud.trainer.driver import Trainer
from r1cloud.trainer.group import cpu_allocator
from r1cloud.trainer.model import (
    load_weights,
    pack,
    packed_log_probs,
    packed_values,
    pad,
    token_log_probs,
    uses_segments,
)
from tiny import generated

SEQS = [
    ([5, 6, 7, 8, 9], [10, 11, 12]),
    ([13, 14], [15, 16, 17, 18, 19, 20]),
    ([21, 22, 23], [24]),
    ([30, 31, 32, 33], [34, 35]),
]


def padded_log_probs(model, seqs, temperature):
    """The ordinary way: right-padded batch with an attention mask."""
    width = max(len(p) + len(r) for p, r in seqs)
    ids = torch.zeros(len(seqs), width, dtype=torch.long)
    mask = torch.zeros(len(seqs), width, dtype=torch.long)
    for i, (p, r) in enumerate(seqs):
        ids[i, : len(p) + len(r)] = torch.tensor(p + r)
        mask[i, : len(p) + len(r)] = 1
    logits = model(input_ids=ids, attention_mask=mask).logits
    return [
        token_log_probs(logits[i, len(p) - 1 : len(p) + len(r) - 1], torch.tensor(r), temperature)
        for i, (p, r) in enumerate(seqs)
    ]


def test_packed_log_probs_equal_padded(tiny_model):
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()
    with torch.no_grad():
        packed = packed_log_probs(model, SEQS, 0.7)
        padded = padded_log_probs(model, SEQS, 0.7)
    for a, b in zip(packed, padded, strict=True):
        assert (a - b).abs().max().item() <= 1e-5


def test_packed_entropy_and_values_equal_one_sequence_at_a_time(tiny_model):
    """The true entropy of softmax(z/T) at each response position, and a value head's estimates
    at the same positions, packed = each sequence alone."""
    from transformers import AutoConfig, AutoModelForTokenClassification

    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()
    config = AutoConfig.from_pretrained(tiny_model)
    config.num_labels, config.classifier_dropout = 1, 0.0
    critic = AutoModelForTokenClassification.from_pretrained(tiny_model, config=config).eval()
    with torch.no_grad():
        _, entropies = packed_log_probs(model, SEQS, 0.7, entropy=True)
        values = packed_values(critic, SEQS)
        for (p, r), ent, val in zip(SEQS, entropies, values, strict=True):
            ids = torch.tensor([p + r])
            where = slice(len(p) - 1, len(p) + len(r) - 1)
            dist = torch.distributions.Categorical(logits=model(input_ids=ids).logits[0, where] / 0.7)
            torch.testing.assert_close(ent, dist.entropy(), rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(val, critic(input_ids=ids).logits[0, where, 0], rtol=1e-5, atol=1e-5)


def groups_of_answers(seed: int = 0) -> list[tuple[list[int], list[int]]]:
    """GRPO-like micro-batch: three prompts with four answers each (one empty), shuffled."""
    g = torch.Generator().manual_seed(seed)
    seqs = []
    for length in (5, 9, 3):
        prompt = torch.randint(5, 100, (length,), generator=g).tolist()
        for n in (4, 1, 6, 0):
            seqs.append((prompt, torch.randint(5, 100, (n,), generator=g).tolist()))
    order = torch.randperm(len(seqs), generator=g).tolist()
    return [seqs[i] for i in order]


def long_prompt_group() -> list[tuple[list[int], list[int]]]:
    """A 90-token prompt with short answers (an agent's worked examples): attention.py cuts it
    into pieces of the median segment's size."""
    g = torch.Generator().manual_seed(1)
    prompt = torch.randint(5, 100, (90,), generator=g).tolist()
    return [(prompt, torch.randint(5, 100, (n,), generator=g).tolist()) for n in (7, 3, 12)]


def test_shared_prompt_pack_holds_each_prompt_once():
    seqs = groups_of_answers()
    shared, separate = pack(seqs, share_prompts=True), pack(seqs)
    assert shared.input_ids.shape[1] == 5 + 9 + 3 + 3 * 11  # each prompt once, then every answer
    assert separate.input_ids.shape[1] == 4 * (5 + 9 + 3) + 3 * 11
    assert separate.segments is None
    assert shared.segments.q.shape[0] == 3 + 9  # each prompt, then each non-empty answer
    pieces = pack(seqs + long_prompt_group(), share_prompts=True).segments
    assert pieces.q.shape == (3 + 9 + 3 + 3, 32)  # the 90-token prompt in pieces of 32, 32, 26
    assert shared.targets.tolist() == separate.targets.tolist() and shared.lengths == separate.lengths


def test_segment_attention_with_shared_prompts_equals_sdpa_with_a_copy_each(tiny_model):
    """attention.py with each group's prompt packed once gives every sample the log-probs,
    entropies, values and summed gradients that transformers' sdpa with a prompt copy per sample
    gives."""
    from transformers import AutoConfig, AutoModelForTokenClassification

    seqs = groups_of_answers() + [([3, 4, 5], [6, 7])] + long_prompt_group()  # and a prompt alone
    got = {}
    for impl in ("sdpa", attention.register()):
        model = AutoModelForCausalLM.from_pretrained(
            tiny_model, dtype=torch.float32, attn_implementation=impl
        )
        logps, ents = packed_log_probs(model, seqs, 0.7, entropy=True)
        sum(lp.sum() * (i + 1) for i, lp in enumerate(logps)).backward()  # a different weight per sample
        grads = {n: p.grad.clone() for n, p in model.named_parameters()}
        config = AutoConfig.from_pretrained(tiny_model)
        config.num_labels, config.classifier_dropout = 1, 0.0
        torch.manual_seed(0)  # the same new value head both times
        critic = AutoModelForTokenClassification.from_pretrained(
            tiny_model, config=config, attn_implementation=impl
        ).eval()
        with torch.no_grad():
            values = packed_values(critic, seqs)
        got[impl] = [lp.detach() for lp in logps] + ents + values, grads
    (want, want_grads), (have, have_grads) = got.values()
    for a, b in zip(want, have, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
    scale = max(g.abs().max().item() for g in want_grads.values())
    assert scale > 1e-3
    worst = max((want_grads[n] - have_grads[n]).abs().max().item() for n in want_grads)
    assert worst <= 1e-5 * scale


@pytest.mark.parametrize("empty", [False, True])
def test_an_attention_named_in_override_config_is_the_one_loaded(tiny_model, empty):
    """`worker.actor.model.override_config.attn_implementation` wins over r1cloud's packed-segment
    attention, on rank 0 and on the empty ranks; without segments each sample is packed with its
    own copy of the prompt, and the log-probs are the same."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(tiny_model)
    logps = []
    for asked, got in [({}, attention.NAME), ({"attn_implementation": "eager"}, "eager")]:
        kwargs = {"dtype": torch.float32, **asked}
        model = load_weights(AutoModelForCausalLM, tiny_model, config, kwargs, empty)
        assert model.config._attn_implementation == got and uses_segments(model) == (not asked)
        if not empty:
            logps.append(torch.cat(packed_log_probs(model, groups_of_answers(), 1.0)))
    if logps:
        torch.testing.assert_close(*logps, rtol=0, atol=1e-5)


def test_segment_attention_keeps_a_sliding_window(tiny_model):
    """A model with a sliding window (Qwen2's use_sliding_window): segments apply it too."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(tiny_model)
    config.use_sliding_window, config.sliding_window, config.max_window_layers = True, 3, 0
    config.layer_types = ["sliding_attention"] * config.num_hidden_layers
    seqs = groups_of_answers() + long_prompt_group()
    out = {}
    for impl in ("sdpa", attention.register()):
        model = AutoModelForCausalLM.from_pretrained(
            tiny_model, config=config, dtype=torch.float32, attn_implementation=impl
        ).eval()
        with torch.no_grad():
            out[impl] = packed_log_probs(model, seqs, 1.0)
    for a, b in zip(out["sdpa"], out[attention.NAME], strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
    plain = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()
    with torch.no_grad():
        unwindowed = packed_log_probs(plain, seqs, 1.0)
    assert (
        max((a - b).abs().max().item() for a, b in zip(out["sdpa"], unwindowed, strict=True) if len(a)) > 1e-3
    )


def single_process_grads(
    model_path, samples, clip, mode, kl_coef, kl_kind, adapt=None, micro=None, total=None
):
    """The loss's gradients in one process; `model_path` may be a function that loads the model;
    `adapt(model)` first changes the model (LoRA). With `micro`: the samples in micro-batches of
    that many, each term a share of `total` (alg.aggregate), their gradients added up in fp32."""
    if callable(model_path):
        model = model_path()
    else:
        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    if adapt is not None:
        adapt(model)
    grads: dict = {}
    for at in range(0, len(samples), micro or len(samples)):
        part = samples[at : at + (micro or len(samples))]
        logps = packed_log_probs(model, [s["seq"] for s in part], 1.0)
        logp, mask = pad(logps)
        if "mask" in part[0]:  # a multi-turn episode's: observation tokens out of every term, by hand
            mask = mask * pad([torch.tensor(s["mask"], dtype=torch.float32) for s in part])[0]
        old = pad([s["old"] for s in part])[0]
        ref = pad([s["ref"] for s in part])[0]
        adv = alg.token_level(torch.tensor([s["adv"] for s in part]), mask)
        loss_mat, _ = alg.ppo_loss(logp, old, adv, mask, clip)
        loss = alg.aggregate(loss_mat, mask, mode, total) + kl_coef * alg.aggregate(
            alg.kl_estimate(logp, ref, kl_kind), mask, mode, total
        )
        loss.backward()
        for n, p in model.named_parameters():
            if p.grad is not None:
                grads[n] = grads[n] + p.grad.float() if n in grads else p.grad.detach().float().clone()
                p.grad = None
    return grads


@pytest.mark.parametrize("mode", ["token", "seq"])
def test_fsdp_gradients_across_two_workers_equal_one_process(make_run, tiny_model, mode):
    run = make_run(f"worker.actor.loss_avg_mode={mode}")
    spec = load_resolved(run / "spec.yaml")
    g = torch.Generator().manual_seed(0)
    samples = []
    # 8 samples, ragged lengths: two answers per prompt, so a micro-batch of 2 packs its prompt once
    seqs = [(p, answer) for p, r in SEQS for answer in (r, [t + 40 for t in reversed(r)])]
    for i, (p, r) in enumerate(seqs):
        old = (torch.randn(len(r), generator=g) * 0.3 - 4).tolist()
        ref = (torch.randn(len(r), generator=g) * 0.3 - 4).tolist()
        samples.append(
            {"seq": (p, r), "old": old, "ref": ref, "adv": float(torch.randn((), generator=g)) + (i % 3 - 1)}
        )
    a = spec.worker.actor
    clip = alg.ClipConfig(a.clip_ratio_low, a.clip_ratio_high, a.clip_ratio_dual)
    want = single_process_grads(
        tiny_model, samples, clip, mode, spec.algorithm.kl_coef, spec.algorithm.kl_penalty
    )
    mask = pad([torch.ones(len(s["seq"][1])) for s in samples])[1]
    total = alg.count_for(mode, mask)

    trainer = Trainer(run, spec)
    try:
        trainer.start_workers()
        assert trainer.share_prompts
        # the CPU workers run with the malloc settings of group.cpu_allocator
        envs = trainer.call("__ray_call__", lambda worker: dict(os.environ))
        assert all(env.items() >= cpu_allocator().items() for env in envs)
        # Two different splits: 2 micro-batches of 2 per worker (a prompt and its two answers in
        # each), and 4 micro-batches of 1.
        for per_micro in (2, 1):
            ranks = [samples[:4], samples[4:]]
            plan = [
                [{"total": total, "micro": [ranks[r][i : i + per_micro] for i in range(0, 4, per_micro)]}]
                for r in range(2)
            ]
            steps.update(trainer, plan, apply=False)
            got = trainer.call("full_grads")[0]
            worst = max((got[n] - want[n]).abs().max().item() for n in want)
            scale = max(w.abs().max().item() for w in want.values())
            assert scale > 1e-4  # a real gradient
            assert worst <= 1e-5, f"micro-batch of {per_micro}: max |Δgrad| {worst}"
        # Multi-turn episodes: a loss mask with observation spans (0) inside the responses. The
        # gradients equal the reference computed with the mask by hand, and differ from unmasked.
        masked = [{**x, "mask": [float(k % 3 != 1) for k in range(len(x["seq"][1]))]} for x in samples]
        want_masked = single_process_grads(
            tiny_model, masked, clip, mode, spec.algorithm.kl_coef, spec.algorithm.kl_penalty
        )
        total = alg.count_for(mode, pad([torch.tensor(x["mask"]) for x in masked])[0])
        ranks = [masked[:4], masked[4:]]
        plan = [[{"total": total, "micro": [ranks[r][i : i + 2] for i in range(0, 4, 2)]}] for r in range(2)]
        steps.update(trainer, plan, apply=False)
        got = trainer.call("full_grads")[0]
        assert max((got[n] - want_masked[n]).abs().max().item() for n in want) <= 1e-5
        assert max((want_masked[n] - want[n]).abs().max().item() for n in want) > 1e-4
    finally:
        trainer.shutdown()


def test_ulysses_on_two_workers_gives_one_process_log_probs_and_gradients(make_run, tiny_model):
    """worker.actor.ulysses_size=2: the two workers hold halves of each packed row (the tiny
    model's one key head repeated to its two query heads, one per worker) and exchange heads for
    tokens around attention. Log-probs and gradients equal one process's over whole rows, on
    shared-prompt rows of several sequences, with the row padded to split evenly."""
    run = make_run("worker.actor.ulysses_size=2", name="ulysses")
    spec = load_resolved(run / "spec.yaml")
    seqs, samples = random_samples(2)
    clip = clip_of(spec)
    want = single_process_grads(
        tiny_model, samples, clip, "token", spec.algorithm.kl_coef, spec.algorithm.kl_penalty
    )
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    with torch.no_grad():
        want_logp = [
            x.tolist()
            for x in packed_log_probs(model, seqs[:3], 1.0) + packed_log_probs(model, seqs[3:], 1.0)
        ]
    total = alg.count_for("token", pad([torch.ones(len(s["seq"][1])) for s in samples])[1])
    trainer = Trainer(run, spec)
    try:
        trainer.start_workers()
        got_logp = steps.log_probs(trainer, [[seqs[:3], seqs[3:]]] * 2)  # a group: the same rows each
        assert got_logp[0] == got_logp[1]
        flat = [x for micro in got_logp[0] for x in micro]
        assert (
            max(abs(x - y) for a_, b in zip(flat, want_logp, strict=True) for x, y in zip(a_, b, strict=True))
            <= 1e-5
        )
        plan = [[{"total": total, "micro": [samples[:3], samples[3:]]}]] * 2
        steps.update(trainer, plan, apply=False)
        got = trainer.call("full_grads")[0]
        assert max(w.abs().max().item() for w in want.values()) > 1e-4  # a real gradient
        assert max((got[n] - want[n]).abs().max().item() for n in want) <= 1e-5
        # one sequence whose prompt fills the first worker's half: no response token there
        long = {**samples[0], "seq": (list(range(5, 45)), samples[0]["seq"][1])}
        want = single_process_grads(
            tiny_model, [long], clip, "token", spec.algorithm.kl_coef, spec.algorithm.kl_penalty
        )
        plan = [[{"total": float(len(long["seq"][1])), "micro": [[long]]}]] * 2
        steps.update(trainer, plan, apply=False)
        got = trainer.call("full_grads")[0]
        assert max((got[n] - want[n]).abs().max().item() for n in want) <= 1e-5
    finally:
        trainer.shutdown()


def random_samples(seed: int) -> tuple[list, list[dict]]:
    """SEQS with a second answer each, and per sample random old/ref log-probs and an advantage."""
    g = torch.Generator().manual_seed(seed)
    seqs = [(p, answer) for p, r in SEQS for answer in (r, [t + 40 for t in reversed(r)])]
    samples = [
        {"seq": (p, r), "old": (torch.randn(len(r), generator=g) * 0.3 - 4).tolist(),
         "ref": (torch.randn(len(r), generator=g) * 0.3 - 4).tolist(), "adv": float(torch.randn((), generator=g))}
        for p, r in seqs
    ]  # fmt: skip
    return seqs, samples


def clip_of(spec) -> alg.ClipConfig:
    a = spec.worker.actor
    return alg.ClipConfig(a.clip_ratio_low, a.clip_ratio_high, a.clip_ratio_dual)


def test_hybrid_sharding_on_four_workers_gives_one_process_gradients_and_a_whole_checkpoint(
    make_run, tiny_model, tmp_path
):
    """worker.actor.fsdp.fsdp_size=2 on 4 workers: FSDP2 over a 2×2 mesh (shards inside pairs,
    replicas across them, as EasyR1's fsdp_workers.py:121-127), the reference model on the same
    mesh. Gradients equal one process's; after an optimizer step every worker holds the same
    weights, and the checkpoint (DCP over the 2-D mesh) holds them whole."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    run = make_run("trainer.n_gpus_per_node=4", "worker.actor.fsdp.fsdp_size=2", name="hsdp")
    spec = load_resolved(run / "spec.yaml")
    _, samples = random_samples(1)
    clip = clip_of(spec)
    want = single_process_grads(
        tiny_model, samples, clip, "token", spec.algorithm.kl_coef, spec.algorithm.kl_penalty
    )
    total = alg.count_for("token", pad([torch.ones(len(s["seq"][1])) for s in samples])[1])
    plan = [[{"total": total, "micro": [samples[2 * r : 2 * r + 2]]}] for r in range(4)]
    trainer = Trainer(run, spec)
    try:
        trainer.start_workers()

        def meshes(worker):
            actor, ref = next(worker.actor.parameters()), next(worker.ref.parameters())
            return [
                (tuple(p.device_mesh.shape), p.device_mesh.mesh_dim_names, str(p.placements))
                for p in (actor, ref)
            ]

        layout = ((2, 2), ("ddp", "fsdp"), "(Replicate(), Shard(dim=0))")
        assert trainer.call("__ray_call__", meshes) == [[layout, layout]] * 4
        steps.update(trainer, plan, apply=False)
        got = trainer.call("full_grads")[0]
        assert max(w.abs().max().item() for w in want.values()) > 1e-4  # a real gradient
        assert max((got[n] - want[n]).abs().max().item() for n in want) <= 1e-5
        steps.update(trainer, plan)  # now with the optimizer step
        weights = trainer.call("__ray_call__", lambda w: {n: t.clone() for n, t in w.full_weights()})
        assert all(torch.equal(weights[0][n], other[n]) for other in weights[1:] for n in weights[0])
        trainer.call("save", str(tmp_path / "ckpt"), role="actor")
    finally:
        trainer.shutdown()
    dcp_to_torch_save(tmp_path / "ckpt", tmp_path / "full.pt")
    saved = torch.load(tmp_path / "full.pt", weights_only=False)["model"]
    initial = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).state_dict()
    assert set(weights[0]) <= set(saved)
    for n, t in weights[0].items():
        assert torch.equal(saved[n], t) and not torch.equal(t, initial[n]), n


@pytest.mark.parametrize("compute", ["fp32", "bf16"])
def test_one_worker_trains_unwrapped_with_one_process_gradients_and_a_whole_checkpoint(
    make_run, tiny_model, tmp_path, compute
):
    """One CPU worker holds its models unwrapped: FSDP would have nothing to shard and only copy.
    Computing in the dtype it stores (fp32), gradients (two micro-batches) equal one process's.
    Computing in bf16 (precision.py), they equal one process's bf16 gradients added up in fp32,
    nearer them than fp32 compute's are. The engine gets the trained fp32 weights in its dtype;
    the checkpoint holds them whole and loads back over a later step, and the engine gets those."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    dtypes = [f"worker.actor.fsdp.mp_param_dtype={compute}", f"worker.rollout.dtype={compute}"]
    run = make_run("trainer.n_gpus_per_node=1", *dtypes, name="one")
    spec = load_resolved(run / "spec.yaml")
    _, samples = random_samples(2)
    total = alg.count_for("token", pad([torch.ones(len(s["seq"][1])) for s in samples])[1])
    grads = {
        name: single_process_grads(
            lambda dtype=dtype: AutoModelForCausalLM.from_pretrained(
                tiny_model, dtype=dtype, attn_implementation=attention.register()
            ),  # the workers' attention (in bf16 its rounding differs from sdpa's)
            samples,
            clip_of(spec),
            "token",
            spec.algorithm.kl_coef,
            spec.algorithm.kl_penalty,
            micro=4,
            total=total,
        )  # fmt: skip
        for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16))
    }
    want = grads[compute]
    plan = [[{"total": total, "micro": [samples[:4], samples[4:]]}]]

    def weights(worker) -> dict:  # the actor's weights, as stored
        return {n: t.clone() for n, t in worker.actor.state_dict().items()}

    def engine_holds(worker) -> bool:  # the actor's weights in the engine's dtype, after a sync
        worker.sync_weights()
        engine = worker.engine.model.state_dict()
        return all(
            torch.equal(engine[n], t.to(engine[n].dtype)) for n, t in worker.actor.state_dict().items()
        )

    trainer = Trainer(run, spec)
    try:
        trainer.start_workers()
        kinds = trainer.call(
            "__ray_call__", lambda w: {type(p) for m in (w.actor, w.ref) for p in m.parameters()}
        )
        assert kinds == [{torch.nn.Parameter}]  # no DTensor: no FSDP
        steps.update(trainer, plan, apply=False)
        got = trainer.call("full_grads")[0]
        assert max(w.abs().max().item() for w in want.values()) > 1e-4  # a real gradient
        worst = max((got[n] - want[n]).abs().max().item() for n in want)
        if compute == "fp32":
            assert worst <= 1e-5
        else:  # the same rounding as one bf16 process, not fp32's
            assert {t.dtype for t in got.values()} == {torch.float32}
            assert worst <= 0.1 * max((grads["fp32"][n] - want[n]).abs().max().item() for n in want), worst
        steps.update(trainer, plan)
        trained = trainer.call("__ray_call__", weights)[0]
        assert {t.dtype for t in trained.values()} == {torch.float32}
        assert trainer.call("__ray_call__", engine_holds) == [True]
        trainer.call("save", str(tmp_path / "ckpt"), role="actor")
        steps.update(trainer, plan)
        assert not torch.equal(
            trainer.call("__ray_call__", weights)[0]["lm_head.weight"], trained["lm_head.weight"]
        )
        assert trainer.call("__ray_call__", engine_holds) == [True]  # (bf16: a cast of these weights)
        trainer.call("load", str(tmp_path / "ckpt"), None)
        back = trainer.call("__ray_call__", weights)[0]
        assert trainer.call("__ray_call__", engine_holds) == [True]  # the loaded weights, cast anew
    finally:
        trainer.shutdown()
    assert all(torch.equal(back[n], t) for n, t in trained.items())
    dcp_to_torch_save(tmp_path / "ckpt", tmp_path / "full.pt")
    saved = torch.load(tmp_path / "full.pt", weights_only=False)["model"]
    initial = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).state_dict()
    for n, t in trained.items():
        assert torch.equal(saved[n], t) and not torch.equal(t, initial[n]), n


@pytest.mark.parametrize("tie", [False, True], ids=["untied", "tied"])
def test_vllm_sampling_log_probs_equal_trainer_before_and_after_sync(tmp_path, digits_reward, tie):
    pytest.importorskip("vllm")
    from conftest import run_folder
    from tiny import make_tiny_model
    from tinyrun import tiny_blueprint

    # tied: the output layer is the embedding (as SmolLM2's, Qwen2.5-0.5B's)
    model = make_tiny_model(tmp_path / "model", tie=tie)
    # a token budget of one prompt + response: the requests cannot all be scheduled in one step
    # (on CPU, a chunked prompt of a seeded request crashed vLLM; whole prompts are scheduled there)
    run = run_folder(
        tmp_path,
        "run",
        tiny_blueprint(model, digits_reward, engine="vllm"),
        ["worker.actor.optim.lr=0.05", "worker.rollout.max_num_batched_tokens=76"],
    )
    trainer = Trainer(run)
    try:
        assert trainer.start_workers() == "vllm"
        # the KV cache holds what one rollout call gives a worker, not a fixed GiB: 4 prompts × 4
        # samples or 16 validation prompts × 1, over 2 workers
        concurrency = trainer.call("__ray_call__", lambda w: w.engine.llm.llm_engine.vllm_config.cache_config)
        assert [c.kv_cache_max_concurrency for c in concurrency] == [8, 8]
        trainer.call("sync_weights")
        prompts = [Request(p.prompt_ids) for p in trainer.train_set.prompts[:4]]
        sampling = {
            "n": 2,
            "temperature": 0.8,
            "top_p": 1.0,
            "top_k": -1,
            "max_tokens": 12,
            "seed": 3,
            "ignore_eos": False,
        }

        def compare():
            samples = generated(trainer.call("generate", prompts[:2], sampling)[0])
            return steps.engine_gap(trainer, samples, prompts, 0.8)

        before, seqs, lp_before = compare()
        assert before <= 1e-4, before
        # A large update, then sync: the engine must follow the new weights.
        steps.large_update(trainer, seqs)
        changed = steps.log_probs(trainer, [[seqs], [seqs]], temperature=0.8)[0][0]
        assert steps.largest_gap(lp_before, changed) > 1e-3
        trainer.call("sync_weights")
        after, _, _ = compare()
        assert after <= 1e-4, after
    finally:
        trainer.shutdown()


def test_cpu_kv_cache_holds_the_sequences_in_whole_blocks_up_to_a_gib():
    from r1cloud.rollout.vllm import cpu_kv_cache_bytes

    assert cpu_kv_cache_bytes(1000, 76, 8) == 8 * 96 * 1000  # a 76-token sequence in 3 blocks of 32
    assert cpu_kv_cache_bytes(1000, 176, 32) == 32 * 192 * 1000
    assert cpu_kv_cache_bytes(1000, 76, 0) == 2**30  # unknown: a GiB, as before
    assert cpu_kv_cache_bytes(10**5, 4096, 512) == 2**30  # more runs in waves
    assert cpu_kv_cache_bytes(10**5, 32768, 4) == 32768 * 10**5  # one sequence, whatever it takes


@pytest.mark.parametrize("engine_dtype", ["bf16", "fp32"])
def test_weight_sync_gives_the_engine_the_fp32_weights_in_its_dtype(make_run, engine_dtype):
    """bf16 compute: a bf16 engine gets the compute-dtype all-gather, an fp32 engine the
    full-precision one; either way, after an update, exactly the trainer's fp32 weights cast."""

    def _engine_and_actor_weights(worker) -> tuple[dict, dict]:
        """On a worker (Ray's __ray_call__; local, so it is pickled by value): its rollout
        engine's weights, and the actor's full fp32 weights (a collective)."""
        actor = {n: t.full_tensor() for n, t in worker.actor.state_dict().items()}
        return {n: t.clone() for n, t in worker.engine.model.state_dict().items()}, actor

    run = make_run(
        "worker.actor.optim.lr=0.05",
        "worker.actor.fsdp.mp_param_dtype=bf16",
        f"worker.rollout.dtype={engine_dtype}",
    )
    trainer = Trainer(run)
    try:
        trainer.start_workers()
        prompts = [p.prompt_ids for p in trainer.train_set.prompts[:2]]
        samples = [
            {"seq": (p, [7, 8, 9]), "old": None, "ref": [-5.0] * 3, "adv": 1.0 if i else -1.0}
            for i, p in enumerate(prompts)
        ]
        before = trainer.call("__ray_call__", _engine_and_actor_weights)[0][1]
        steps.update(trainer, [[{"total": 6.0, "micro": [samples]}]] * 2)
        trainer.call("sync_weights")
        for engine, actor in trainer.call("__ray_call__", _engine_and_actor_weights):
            assert max((actor[n] - before[n]).abs().max().item() for n in actor) > 1e-3  # it moved
            for name, tensor in actor.items():
                assert engine[name].dtype == torch_dtype(engine_dtype)
                assert torch.equal(engine[name], tensor.to(engine[name].dtype)), name
    finally:
        trainer.shutdown()


def test_adamw_bf16_follows_adamw_with_half_the_state_memory():
    """optim.strategy adamw_bf16: the same updates as torch's AdamW up to bf16's rounding of the
    moment estimates, in half the optimizer-state bytes. With beta2 = 0.999 and a gradient scale
    that drops halfway, the second moment comes down with it (rounded to nearest it could not:
    it would sit 34% high here)."""
    from r1cloud.trainer.optim import AdamWBF16

    torch.manual_seed(0)
    start = torch.randn(64, 32)
    a, b = torch.nn.Parameter(start.clone()), torch.nn.Parameter(start.clone())
    ref = torch.optim.AdamW([a], lr=1e-3, betas=(0.9, 0.999), weight_decay=0.1)
    ours = AdamWBF16([b], lr=1e-3, betas=(0.9, 0.999), weight_decay=0.1)
    for i in range(600):
        g = torch.randn(64, 32) * (1.0 if i < 300 else 0.1)
        a.grad, b.grad = g.clone(), g.clone()
        ref.step()
        ours.step()
    second = ours.state[b]["exp_avg_sq"].float().mean() / ref.state[a]["exp_avg_sq"].mean()
    assert abs(second - 1) < 0.05, second
    moved = (a - start).abs().mean()
    assert (a - b).abs().max() < 0.05 * moved  # within 5% of how far the weights moved
    assert not torch.equal(a, b)  # not the same arithmetic: the moments are rounded to bf16

    def size(opt):
        return sum(t.numel() * t.element_size() for s in opt.state.values() for t in s.values() if t.dim())

    assert {t.dtype for t in ours.state[b].values() if t.dim()} == {torch.bfloat16}
    assert size(ours) * 2 == size(ref)


RESHARDED = """
import os, sys, torch, torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from transformers import AutoModelForCausalLM
from r1cloud.trainer.model import apply_fsdp, packed_log_probs, shard_units
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[2])
dist.init_process_group("gloo", rank=0, world_size=1)
seqs = [([5, 6, 7, 8], [9, 10, 11]), ([5, 6, 7, 8], [12, 13])]
grads = []
for sharded in (False, True):
    model = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float32)
    if sharded:
        apply_fsdp([*shard_units(model), model], dict(mesh=init_device_mesh("cpu", (1,)), reshard_after_forward=True))
    sum(x.sum() for x in packed_log_probs(model, seqs, 1.0)).backward()
    grads.append({n: (p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad) for n, p in model.named_parameters()})
print(max(float((grads[0][n] - grads[1][n]).abs().max()) for n in grads[0]))
"""


def test_fsdp_resharding_after_forward_as_on_gpus_gives_one_process_gradients(tiny_model):
    """On GPUs the workers shard with reshard_after_forward=True (CPU workers keep parameters
    gathered). apply_fsdp, so configured on one gloo process: head.py's log-probs and their
    gradients equal the unsharded model's — a resharded root would hand head.py a DTensor."""
    import subprocess
    import sys

    from r1cloud.serving.serve import free_port

    r = subprocess.run(
        [sys.executable, "-c", RESHARDED, str(tiny_model), str(free_port())],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    assert float(r.stdout.split()[-1]) <= 1e-6, r.stdout
