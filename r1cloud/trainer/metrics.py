"""What a step's numbers become: EasyR1's metric names from the workers' update statistics and the
step's rollouts, the progress line, and metrics.jsonl kept consistent across restarts. Pure but
for the one file it rewrites."""

from __future__ import annotations

import json
import os
import time
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path

import torch

from r1cloud.trainer.batch import Batch


def actor_metrics(results: list[list[dict]], steps: int, tis: bool, kl_loss: bool) -> dict[str, float]:
    """actor/* from each rank's per-optimizer-step statistics, averaged over the steps."""
    out: dict[str, list[float]] = defaultdict(list)
    for i in range(steps):
        ranks = [res[i] for res in results]
        tokens = sum(x["tokens"] for x in ranks) or 1
        out["actor/pg_loss"].append(sum(x["pg_loss"] for x in ranks))
        out["actor/entropy_loss"].append(sum(x["entropy_loss"] for x in ranks))
        out["actor/entropy"].append(sum(x["entropy"] for x in ranks))
        if tis:
            out["actor/rollout_is_weight"].append(sum(x["is_weight"] for x in ranks) / tokens)
        out["actor/pg_clipfrac_higher"].append(sum(x["clip_hi"] for x in ranks) / tokens)
        out["actor/pg_clipfrac_lower"].append(sum(x["clip_lo"] for x in ranks) / tokens)
        out["actor/ppo_kl"].append(sum(x["ppo_kl"] for x in ranks) / tokens)
        out["actor/grad_norm"].append(ranks[0]["grad_norm"])
        if "engine_diff" in ranks[0]:  # on-policy (one optimizer step): measured in the update
            out["rollout/logp_diff_mean"].append(sum(x["engine_diff"] for x in ranks) / tokens)
            out["rollout/logp_diff_max"].append(max(x["engine_diff_max"] for x in ranks))
        if kl_loss:
            out["actor/kl_loss"].append(sum(x["kl_loss"] for x in ranks))
    metrics = {k: sum(v) / len(v) for k, v in out.items()}
    metrics["actor/lr"] = results[0][0]["lr"] if results[0] else 0.0
    return metrics


def engine_gap(stats: dict, logp: torch.Tensor, rollout_logp: torch.Tensor, mask: torch.Tensor) -> None:
    """Adds to an update's `stats` how far the engine's log-probs are from the trainer's on the
    response tokens (summed, and the largest): on-policy, the update's own first pass is the
    old log-probs, so this costs no forward."""
    gap = torch.where(mask > 0, (logp - rollout_logp).abs(), 0.0)  # padding left out, whatever it holds
    stats["engine_diff"] = stats.get("engine_diff", 0.0) + float(gap.sum())
    most = float(gap.max()) if gap.numel() else 0.0
    stats["engine_diff_max"] = max(stats.get("engine_diff_max", 0.0), most)


def critic_metrics(results: list[list[dict]], steps: int, batch: Batch) -> dict[str, float]:
    """critic/* from the critic's update statistics and the step's values and returns."""
    out: dict[str, list[float]] = defaultdict(list)
    for i in range(steps):
        ranks = [res[i] for res in results]
        tokens = sum(x["tokens"] for x in ranks) or 1
        out["critic/vf_loss"].append(sum(x["vf_loss"] for x in ranks))
        out["critic/vf_clipfrac"].append(sum(x["vf_clipfrac"] for x in ranks) / tokens)
        out["critic/vpred_mean"].append(sum(x["vpred"] for x in ranks) / tokens)
        out["critic/grad_norm"].append(ranks[0]["grad_norm"])
    metrics = {k: sum(v) / len(v) for k, v in out.items()}
    metrics["critic/lr"] = results[0][0]["lr"] if results[0] else 0.0
    on = batch.response_mask.bool()
    values, returns = batch.values[on], batch.returns[on]
    metrics |= stats("critic/values", values) | stats("critic/returns", returns)
    if len(returns) > 1:
        metrics["critic/vf_explained_var"] = float(1 - (returns - values).var() / (returns.var() + 1e-5))
    return metrics


def rollout_metrics(
    seen: Batch, batch: Batch, errors: int, max_prompt_length: int, per_sequence: bool
) -> dict[str, float]:
    """reward/* over everything generated this step (as EasyR1, filtered groups included);
    lengths, scores and advantages over what is trained on."""
    m = {f"reward/{k}": float(v.mean()) for k, v in sorted(seen.scores.items())}
    m["reward/errors"] = errors
    m.update(stats("response_length", batch.response_len.double()))
    m["response_length/clip_ratio"] = float((~batch.finished).double().mean())
    m.update(stats("prompt_length", batch.prompt_len.double()))
    m["prompt_length/clip_ratio"] = float((batch.prompt_len >= max_prompt_length).double().mean())
    m.update(stats("critic/score", batch.scores["overall"]))
    if batch.old_logp is not None and batch.rollout_logp is not None:  # the engine against the trainer
        gap: dict[str, float] = {}
        engine_gap(gap, batch.old_logp, batch.rollout_logp, batch.mask)
        m["rollout/logp_diff_max"] = gap["engine_diff_max"]
        m["rollout/logp_diff_mean"] = gap["engine_diff"] / max(float(batch.mask.sum()), 1.0)
    for key, v in sorted(seen.episode.items()):  # multi-turn: per episode, over all generated
        m[f"agent/{key}"] = float(v.double().nanmean())  # env_reward: NaN where get_reward() raised
    if batch.advantages is not None:
        on = batch.response_mask.bool()
        # one value per sample from the outcome estimators (spread over its tokens), else per token
        adv = batch.advantages[:, 0][on[:, 0]] if per_sequence else batch.advantages[on]
        m.update(stats("critic/advantages", adv))
    return m


def perf_metrics(batch: Batch, step_seconds: float, world: int) -> dict[str, float]:
    tokens = int(batch.prompt_len.sum() + batch.response_len.sum())
    return {
        "perf/total_num_tokens": tokens,
        "perf/time_per_step": step_seconds,
        "perf/throughput": tokens / (step_seconds * world),
    }


class Timer:
    """Phase timing: `with timer("gen"): ...` adds the block's seconds to `timing_s/gen`."""

    def __init__(self):
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, name: str):
        tick = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - tick

    def metrics(self) -> dict[str, float]:
        return {f"timing_s/{k}": v for k, v in self.seconds.items()}


def stats(prefix: str, values) -> dict[str, float]:
    """mean, max and min of a list or a tensor (nothing for none)."""
    values = torch.as_tensor(values, dtype=torch.float64)
    if not len(values):
        return {}
    return {
        f"{prefix}/mean": float(values.mean()),
        f"{prefix}/max": float(values.max()),
        f"{prefix}/min": float(values.min()),
    }


def forget_after(path: Path, step: int) -> None:
    """A restart redoes the steps after its checkpoint: drop their old lines, keep the rest."""
    if not path.exists():
        return
    lines = [
        ln for ln in path.read_text().splitlines() if ln.strip() and json.loads(ln).get("step", 0) <= step
    ]
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(ln + "\n" for ln in lines))
    os.replace(tmp, path)


def progress_line(step: int, steps: int, m: dict) -> str:
    parts = [f"step {step}/{steps}", f"reward {m.get('reward/overall', float('nan')):.3f}"]
    if "val/reward_score" in m:
        parts.append(f"val {m['val/reward_score']:.3f}")
    parts += [
        f"len {m.get('response_length/mean', 0):.1f}",
        f"{m.get('timing_s/step', 0):.1f}s",
        f"{m.get('perf/throughput', 0):.0f} tok/s/dev",
    ]
    return " | ".join(parts)
