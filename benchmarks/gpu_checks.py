"""The correctness checks of benchmarks/gpu.py: the trainer's step, resume, weight sync, packed
log-probs, LoRA, images and offload, each with a measured figure and its limit."""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from gpu import gpu_overrides, make_run, release, trainer, worker


def _models(work: Path) -> tuple[Path, Path]:
    from tiny import make_tiny_model
    from tinyrun import DIGITS_REWARD

    model = work / "tiny"
    if not model.exists():
        make_tiny_model(model)
        (work / "digits.py").write_text(DIGITS_REWARD)
    return model, work / "digits.py"


def _blueprint(work: Path) -> str:
    from tinyrun import tiny_blueprint

    return tiny_blueprint(*_models(work))


def _whole(x: torch.Tensor) -> torch.Tensor:
    return (x.full_tensor() if hasattr(x, "full_tensor") else x).detach().cpu().clone()


def snapshot(w) -> tuple[dict, dict]:
    """The actor's fp32 weights and AdamW's state, whole (world 1), on the host."""
    weights = {n: _whole(p) for n, p in w.actor.named_parameters()}
    names = {id(p): n for n, p in w.actor.named_parameters()}
    state = {}
    for p, s in w.optim.state.items():
        for k, v in s.items():
            if isinstance(v, torch.Tensor):
                state[f"{names[id(p)]}.{k}"] = _whole(v)
    return weights, state


def max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys(), sorted(set(a) ^ set(b))[:5]
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in a)


def metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def finite(rows: list[dict], keys=("actor/pg_loss", "actor/grad_norm", "reward/overall")) -> bool:
    return all(math.isfinite(r[k]) for r in rows for k in keys if k in r) and all(
        r.get("actor/grad_norm", 1) > 0 for r in rows
    )


# ---------------------------------------------------------------------------- checks


def run(report, work: Path, cuda: bool, quick: bool) -> None:
    precision = "bf16" if cuda else "fp32"  # the run as EasyR1 runs on GPUs; exact numbers here
    over = gpu_overrides(precision) + ["trainer.save_freq=1", "trainer.val_freq=-1"]
    bp = _blueprint(work)
    run_dir = make_run(work, "grpo", bp, [*over, "trainer.max_steps=3"])
    with trainer(run_dir) as t:
        t.fit()
        w = t.workers[0].worker
        before = snapshot(w)
        synced = engine_vs_actor(w)
        agree = engine_vs_trainer(t, w)
    rows = metrics(run_dir)
    report.check(
        "GRPO through the trainer: 3 steps, finite losses, non-zero gradients, a checkpoint each step",
        len(rows) == 3 and finite(rows) and sorted((run_dir / "checkpoints").glob("global_step_*")) != [],
        f"rewards {[round(r['reward/overall'], 3) for r in rows]}, grad norms "
        f"{[round(r['actor/grad_norm'], 3) for r in rows]}, {rows[-1]['timing_s/step']:.2f} s/step",
    )
    report.check(
        "weight sync: the hf engine holds the actor's weights", synced == 0.0, f"max |Δ| {synced:g}", "0"
    )
    limit = 1e-1 if cuda else 1e-4  # bf16 compute on CUDA: trainer and engine round differently
    report.check(
        "sampling log-probs (hf engine) against the trainer's, after the sync",
        agree < limit,
        f"max |Δ| {agree:.2e} over the last batch",
        f"{limit:g}",
    )

    # resume: the next run's workers load the step-3 checkpoint and continue at step 4
    make_run(work, "grpo", bp, [*over, "trainer.max_steps=4"])
    with trainer(run_dir) as t:
        t.engine = t.start_workers()
        step = t.resume()
        w = t.workers[0].worker
        after = snapshot(w)
        t.call("sync_weights")
        m4 = t.train_step(4)
        report.check(
            "resume: weights and AdamW state bit-identical to the saved run, and step 4 trains",
            step == 3
            and max_diff(before[0], after[0]) == 0
            and max_diff(before[1], after[1]) == 0
            and finite([m4]),
            f"resumed at {step}; max |Δ| weights {max_diff(before[0], after[0]):g}, optimizer "
            f"{max_diff(before[1], after[1]):g}; step 4 grad norm {m4['actor/grad_norm']:.3f}",
            "0",
        )
    release()
    from r1cloud.spec import load_resolved

    for precision in ("fp32", "bf16"):  # bf16 compute runs on CPU too: the same code path
        w = worker(load_resolved(make_run(work, precision, bp, gpu_overrides(precision)) / "spec.yaml"))
        try:
            packed_checks(report, w, precision, work)
        finally:
            w.shutdown()
        release()
    lora_run(report, work, cuda)
    vlm_run(report, work, cuda)


def engine_vs_actor(w) -> float:
    """Largest difference between the engine's weights and the actor's, cast to the engine's dtype."""
    params = w.engine.model.state_dict()
    worst = 0.0
    for name, tensor in w.full_weights():
        mine = params[name]
        worst = max(worst, float((mine.double() - tensor.to(mine.dtype).double()).abs().max()))
    return worst


def engine_vs_trainer(t, w) -> float:
    """Sample 8 answers with the engine; the trainer's log-probs of the same tokens against the
    engine's (same weights, temperature 1)."""
    from r1cloud.rollout.engine import Request

    prompts = [Request(p.prompt_ids) for p in t.train_set.prompts[:2]]
    from tiny import batch_of, generated, per_sequence

    samples = generated(w.generate(prompts, {"n": 4, "temperature": 1.0, "max_tokens": 12, "seed": 7}))
    samples = [s for s in samples if s["response"]]
    seqs = [(prompts[s["prompt"]].ids, s["response"]) for s in samples]
    b, rows = batch_of(seqs)
    mine = per_sequence(w.log_probs(b, [rows], temperature=1.0), [len(s[1]) for s in seqs])
    return max(
        abs(a - b)
        for s, lp in zip(samples, mine, strict=True)
        for a, b in zip(s["logprobs"], lp, strict=True)
    )


def _sequences(vocab: int, groups: int = 3, answers: int = 4) -> list[tuple[list[int], list[int]]]:
    g = torch.Generator().manual_seed(0)
    seqs = []
    for _ in range(groups):
        prompt = torch.randint(
            0, vocab, (int(torch.randint(7, 21, (1,), generator=g)),), generator=g
        ).tolist()
        for _ in range(answers):
            n = int(torch.randint(3, 13, (1,), generator=g))
            seqs.append((prompt, torch.randint(0, vocab, (n,), generator=g).tolist()))
    return seqs


def packed_checks(report, w, precision: str, work: Path) -> None:
    """Packed log-probs (groups sharing a prompt) against each sequence alone, and both against a
    plain transformers forward pass with full logits (sdpa, one sequence at a time); head.py's
    entropy against the full logits' entropy; at temperatures 1 and 0.7."""
    from transformers import AutoModelForCausalLM

    from r1cloud.trainer.model import packed_log_probs

    model_dir = Path(w.spec.worker.actor.model.model_path)
    vocab = w.actor.config.vocab_size
    seqs = _sequences(vocab)
    plain = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="sdpa", dtype=torch.float32)
    plain.load_state_dict(snapshot(w)[0])
    plain = plain.to(w.device).eval()
    for temperature in (1.0, 0.7):
        with torch.no_grad():
            packed, ent = packed_log_probs(w.actor, seqs, temperature, w.device, entropy=True)
            alone = [packed_log_probs(w.actor, [s], temperature, w.device)[0] for s in seqs]
            ref_lp, ref_ent = [], []
            for prompt, resp in seqs:
                ids = torch.tensor([prompt + resp], device=w.device)
                logits = plain(input_ids=ids).logits[0, len(prompt) - 1 : -1].double() / temperature
                lp = logits.log_softmax(-1)
                ref_lp.append(lp.gather(-1, ids[0, len(prompt) :, None])[:, 0])
                ref_ent.append(-(lp.exp() * lp).sum(-1))

        def gap(a, b):
            return max(float((x.double() - y.double()).abs().max()) for x, y in zip(a, b, strict=True))

        d_alone, d_ref, d_ent = gap(packed, alone), gap(packed, ref_lp), gap(ent, ref_ent)
        if precision == "fp32":
            report.check(
                f"fp32 packed log-probs (shared prompts) vs each alone, T={temperature}", d_alone <= 1e-5,
                f"max |Δ| {d_alone:.1e}", "1e-5",
            )  # fmt: skip
            report.check(
                f"fp32 log-probs and entropy (head.py) vs transformers' full logits, T={temperature}",
                d_ref <= 1e-5 and d_ent <= 1e-5, f"log-prob {d_ref:.1e}, entropy {d_ent:.1e}", "1e-5",
            )  # fmt: skip
        else:  # bf16 compute: two bf16 computations of one value differ by up to twice bf16's own
            # error against fp32; packing must add nothing beyond that
            report.check(
                f"bf16 packed vs each alone, within bf16's own error vs fp32, T={temperature}",
                d_alone <= 2 * d_ref, f"packed vs alone {d_alone:.1e}; bf16 vs fp32 {d_ref:.1e} "
                f"(entropy {d_ent:.1e})", "2 × (bf16 vs fp32)",
            )  # fmt: skip
    del plain
    release()


def lora_run(report, work: Path, cuda: bool) -> None:
    over = gpu_overrides("bf16" if cuda else "fp32") + ["worker.actor.model.lora.rank=8", "worker.actor.model.lora.alpha=16",
                                  "trainer.max_steps=2", "trainer.val_freq=-1"]  # fmt: skip
    run_dir = make_run(work, "lora", _blueprint(work), over)
    with trainer(run_dir) as t:
        t.fit()
        w = t.workers[0].worker
        agree = engine_vs_trainer(t, w)
    rows = metrics(run_dir)
    limit = 1e-1 if cuda else 1e-4
    report.check(
        "LoRA (rank 8): 2 steps train, and the engine samples with the merged adapters",
        len(rows) == 2 and finite(rows) and agree < limit,
        f"grad norms {[round(r['actor/grad_norm'], 4) for r in rows]}; engine vs trainer max |Δ| {agree:.2e}",
        f"{limit:g}",
    )


def vlm_run(report, work: Path, cuda: bool) -> None:
    import importlib.util

    from tiny import make_tiny_vlm
    from tinyrun import ROOT, tiny_vl_blueprint

    spec = importlib.util.spec_from_file_location("shapes_generate", ROOT / "data" / "shapes" / "generate.py")
    shapes = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(shapes)
    data = shapes.write(work / "shapes", train=16, test=4)
    model = make_tiny_vlm(work / "tinyvl")
    bp = tiny_vl_blueprint(model, data, _models(work)[1])
    run_dir = make_run(work, "vlm", bp, [*gpu_overrides("bf16" if cuda else "fp32"), "trainer.val_freq=-1"])
    with trainer(run_dir) as t:
        t.fit()
    rows = metrics(run_dir)
    report.check(
        "VLM (tiny Qwen2-VL) with images: 2 GRPO steps through the trainer",
        len(rows) == 2 and finite(rows),
        f"grad norms {[round(r['actor/grad_norm'], 4) for r in rows]}, prompt length "
        f"{rows[0]['prompt_length/mean']:.0f} tokens",
    )


# ---------------------------------------------------------------------------- offload


def _batch(vocab: int, micro: int) -> list[dict]:
    """One mini-batch of `micro` micro-batches of 4 sequences, advantages ±1."""
    seqs = _sequences(vocab, groups=micro, answers=4)
    samples = [
        {"seq": s, "old": None, "ref": None, "adv": 1.0 if i % 2 else -1.0} for i, s in enumerate(seqs)
    ]
    total = sum(len(s[1]) for s in seqs)
    return [{"micro": [samples[i : i + 4] for i in range(0, len(samples), 4)], "total": total}]


def offload(report, work: Path, cuda: bool, quick: bool) -> None:
    """The same update with and without each kind of offload; device memory between phases."""
    from r1cloud.spec import load_resolved
    from tiny import make_tiny_model, shard

    model = work / "offload-model"
    if not model.exists():  # big enough on a GPU for the moves to show in its memory
        make_tiny_model(
            model, layers=2 if quick or not cuda else 8, hidden=128 if quick or not cuda else 1024
        )
    _, reward = _models(work)
    from tinyrun import tiny_blueprint

    bp = tiny_blueprint(model, reward)
    # validate refuses the policy with accumulation in the spec (as EasyR1 does); the micro-batches
    # are given to the update directly here, two of them: that is the check
    base = [*gpu_overrides("fp32"), "algorithm.disable_kl=true", "algorithm.use_kl_loss=false",
            "worker.actor.micro_batch_size_per_device_for_update=16"]  # fmt: skip
    variants = {
        "none": [],
        "none again": [],  # the floor: what repeating the same update changes (CUDA's kernels)
        "between phases": [
            "worker.actor.offload.offload_params=true",
            "worker.actor.offload.offload_optimizer=true",
        ],
        "fsdp cpu offload": ["worker.actor.fsdp.enable_cpu_offload=true"],
    }
    results = {}
    for name, extra in variants.items():
        spec = load_resolved(
            make_run(work, "offload-" + name.replace(" ", "-"), bp, base + extra) / "spec.yaml"
        )
        lr, w = spec.worker.actor.optim.lr, worker(spec)
        try:
            resident = torch.cuda.memory_allocated() if cuda else 0
            batch = _batch(w.actor.config.vocab_size, micro=2)  # two micro-batches: accumulation
            with w.offloads["actor"].resident(optimizer=True):
                during = torch.cuda.memory_allocated() if cuda else 0
            stats = w.update(*shard(batch))
            away = torch.cuda.memory_allocated() if cuda else 0
            results[name] = {"weights": snapshot(w)[0], "stats": stats[0], "at_rest": away, "during": during,
                             "start": resident}  # fmt: skip
        finally:
            w.shutdown()
            del w
            release()
    none = results["none"]
    floor = max_diff(none["weights"], results["none again"]["weights"])
    gib = 2**30
    for name in ("between phases", "fsdp cpu offload"):
        r = results[name]
        diff = max_diff(none["weights"], r["weights"])
        # the policy's step runs on the host's AdamW. On a GPU, AdamW's first step is lr·g/(|g| + ε):
        # where |g| is near ε, a last-bit change of the gradient (CUDA's kernels do not repeat
        # their sums bit for bit) moves a weight by up to lr; the weights may then differ by a
        # tenth of lr, the gradient norms by 1e-6 of theirs
        limit = max(floor, 0.0 if name == "between phases" else 1e-6, 0.1 * lr if cuda else 0.0)
        norms = abs(r["stats"]["grad_norm"] - none["stats"]["grad_norm"]) <= 1e-6 * none["stats"]["grad_norm"]
        memory = (
            f"; device memory at rest {r['at_rest'] / gib:.3f} GiB vs {none['at_rest'] / gib:.3f} without"
            f" (resident for the update: {r['during'] / gib:.3f})"
            if cuda
            else ""
        )
        report.check(
            f"offload ({name}): two accumulated micro-batches update as without it",
            diff <= limit and norms and (not cuda or r["at_rest"] < none["at_rest"]),
            f"max |Δ| weights {diff:.1e}, grad norm {r['stats']['grad_norm']:.6f} vs {none['stats']['grad_norm']:.6f}"
            f" (the same update twice without offload: max |Δ| {floor:.1e})" + memory,
            f"{limit:g}; grad norms 1e-6 relative" + ("; less memory at rest" if cuda else ""),
        )
