"""What landed after #23, on the GPU path (issue #39): Ulysses sequence parallelism's code path at
world 1 (a group of one: its all-to-alls, sliced row and gathered log-probs, against none), a
multi-turn run (a gym environment's observations between the model's turns, masked out of the
loss) and a video run (a tiny Qwen2.5-VL on generated clips), both through the trainer with the hf
engine, each with the engine's sampling log-probs against the trainer's on the trained tokens."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from gpu import gpu_overrides, make_run, release, trainer, worker
from gpu_checks import _batch, _blueprint, _models, finite, metrics


def run(report, work: Path, cuda: bool, quick: bool) -> None:
    ulysses_check(report, work, cuda)
    multi_turn(report, work, cuda)
    video_run(report, work, cuda)


def _gradients(w, mb, sp) -> tuple[list, dict]:
    """The worker's log-probs of the mini-batch's sequences and its update's gradients, with the
    actor's Ulysses group set to `sp`."""
    from tiny import batch_of, per_sequence, shard

    seqs = [s["seq"] for micro in mb[0]["micro"] for s in micro]
    b, rows = batch_of(seqs)
    w.sp["actor"] = sp
    lp = per_sequence(w.log_probs(b, [rows], temperature=1.0), [len(s[1]) for s in seqs])
    w.update(*shard(mb), apply=False)
    w.sp["actor"] = None
    return lp, {k: v.cpu() for k, v in w.full_grads().items()}


def _worst(a: dict, b: dict) -> float:
    """The worst relative difference of two sets of gradients, tensor by tensor."""
    return max(
        float((a[k].double() - b[k].double()).norm() / a[k].double().norm().clamp_min(1e-30)) for k in a
    )


def ulysses_check(report, work: Path, cuda: bool) -> None:
    """The worker's log-probs and update gradients with its actor's Ulysses group set to a group
    of one, against the same worker without one; in bf16, within twice bf16's own error (its
    gradients against an fp32 worker's on the same batch)."""
    import torch.distributed as dist

    from r1cloud.spec import load_resolved
    from r1cloud.trainer import ulysses

    got = {}
    for precision in ("fp32", "bf16") if cuda else ("fp32",):
        over = [*gpu_overrides(precision), "algorithm.disable_kl=true", "algorithm.use_kl_loss=false"]
        w = worker(
            load_resolved(make_run(work, f"ulysses-{precision}", _blueprint(work), over) / "spec.yaml")
        )
        try:
            mb = _batch(w.actor.config.vocab_size, micro=2)
            one = ulysses.Group(dist.new_group([0]), 1, 0)  # in this worker's process group
            got[precision] = _gradients(w, mb, None), _gradients(w, mb, one)
        finally:
            w.shutdown()
            del w
            release()
    own = _worst(got["fp32"][0][1], got["bf16"][0][1]) if cuda else 0.0  # bf16's own error
    for precision, (plain, sliced) in got.items():
        d_lp = max(
            abs(a - b) for x, y in zip(plain[0], sliced[0], strict=True) for a, b in zip(x, y, strict=True)
        )
        rel = _worst(plain[1], sliced[1])
        # fp32: the same numbers but for the order of a few sums; bf16: within bf16's own error
        limit = (1e-5, 1e-4) if precision == "fp32" else (5e-2, 2 * own)
        report.check(
            f"Ulysses' code path at world 1 ({precision}): log-probs and gradients as without it",
            plain[1].keys() == sliced[1].keys() and d_lp <= limit[0] and rel <= limit[1],
            f"log-prob max |Δ| {d_lp:.1e}; gradients, worst relative difference {rel:.1e} over "
            f"{len(plain[1])} tensors" + (f" (bf16 against fp32: {own:.1e})" if precision == "bf16" else ""),
            f"{limit[0]:g}, " + (f"{limit[1]:g}" if precision == "fp32" else "2 × bf16's own"),
        )


def multi_turn(report, work: Path, cuda: bool) -> None:
    """2 steps with envs/guess_number.py (a gym-shaped environment answering each turn), 3 turns,
    two updates a step so the trainer recomputes the old log-probs: they must equal the engine's on
    the model's tokens (the loss mask), the observations' tokens left out."""
    import shutil

    from transformers import GenerationConfig

    from tinyrun import ROOT

    # the tiny random model seldom samples its EOS, so its turns would run to the response budget:
    # a copy whose generation config ends a turn at a third of its vocabulary (Qwen2.5's lists two)
    model = work / "tiny-turns"
    if not model.exists():
        shutil.copytree(_models(work)[0], model)
        gen = GenerationConfig.from_pretrained(model)
        vocab = json.loads((model / "config.json").read_text())["vocab_size"]
        eos = gen.eos_token_id if isinstance(gen.eos_token_id, list) else [gen.eos_token_id]
        gen.eos_token_id = sorted({*eos, *range(3, vocab, 3)} - {None})
        gen.save_pretrained(model)
    data = work / "guess.jsonl"
    data.write_text("".join(json.dumps({"problem": "Guess the number.", "answer": "", "secret": s}) + "\n"
                            for s in (3, 7, 12, 50)))  # fmt: skip
    over = [
        *gpu_overrides("bf16" if cuda else "fp32"), f"worker.actor.model.model_path={model}",
        "worker.rollout.multi_turn.enable=true",
        f"worker.rollout.multi_turn.environment={ROOT}/envs/guess_number.py:GuessNumber",
        "worker.rollout.multi_turn.max_turns=3", f"data.train_files={data}", f"data.val_files={data}",
        "data.format_prompt=null", "data.max_prompt_length=160", "data.max_response_length=48",
        "worker.actor.global_batch_size=2", "trainer.max_steps=2", "trainer.val_freq=-1",
    ]  # fmt: skip
    run_dir = make_run(work, "multiturn", _blueprint(work), over)
    with trainer(run_dir) as t:
        t.fit()
    rows = metrics(run_dir)
    diff = max(r.get("rollout/logp_diff_max", float("inf")) for r in rows)
    limit = 1e-1 if cuda else 1e-4  # bf16 on CUDA, as the other engine-against-trainer checks
    report.check(
        "multi-turn (gym environment, 3 turns): 2 steps train; the engine's log-probs on the model's "
        "tokens equal the trainer's",
        len(rows) == 2 and finite(rows) and min(r["agent/turns"] for r in rows) > 1 and diff <= limit,
        f"turns per episode {[round(r['agent/turns'], 2) for r in rows]}, environment reward "
        f"{[round(r['reward/environment'], 3) for r in rows]}, max |Δ| log-prob {diff:.2e}",
        f"{limit:g}; more than 1 turn",
    )


def video_run(report, work: Path, cuda: bool) -> None:
    """One step on generated clips (files and a frame list) with a tiny Qwen2.5-VL, two updates so
    the old log-probs over the same frames are recomputed and compared with the engine's."""
    from tiny import make_tiny_vlm, write_clips
    from tinyrun import tiny_vl_blueprint

    clips = write_clips(work / "clips")
    model = make_tiny_vlm(work / "tiny-qwen2_5_vl", "qwen2_5_vl")
    bp = yaml.safe_load(tiny_vl_blueprint(model, clips, _models(work)[1], steps=1))
    bp["data"].update(video_fps=2.0, max_pixels=4704, max_prompt_length=160)
    bp["worker"]["actor"]["global_batch_size"] = 2  # two updates a step: old log-probs recomputed
    run_dir = make_run(work, "video", yaml.safe_dump(bp), [*gpu_overrides("bf16" if cuda else "fp32"),
                                                           "trainer.val_freq=-1"])  # fmt: skip
    with trainer(run_dir) as t:
        t.fit()
    rows = metrics(run_dir)
    diff = max(r.get("rollout/logp_diff_max", float("inf")) for r in rows)
    limit = 1e-1 if cuda else 1e-4
    report.check(
        "video (tiny Qwen2.5-VL, clips and a frame list) through the hf engine and the trainer: "
        "a step trains, the engine's log-probs equal the trainer's over the same frames",
        len(rows) == 1 and finite(rows) and diff <= limit,
        f"grad norm {rows[0]['actor/grad_norm']:.4f}, prompt length {rows[0]['prompt_length/mean']:.0f} "
        f"tokens, max |Δ| log-prob {diff:.2e}",
        f"{limit:g}",
    )
