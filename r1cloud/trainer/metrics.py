"""What a step's numbers become: EasyR1's metric names from the workers' update statistics and the
step's rollouts, the progress line, and metrics.jsonl kept consistent across restarts. Pure but
for the one file it rewrites."""

from __future__ import annotations

import json
import os
from collections import defaultdict
from pathlib import Path

import torch

from .batch import Rollout, stats


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
        if kl_loss:
            out["actor/kl_loss"].append(sum(x["kl_loss"] for x in ranks))
    metrics = {k: sum(v) / len(v) for k, v in out.items()}
    metrics["actor/lr"] = results[0][0]["lr"] if results[0] else 0.0
    return metrics


def critic_metrics(results: list[list[dict]], steps: int, rollouts: list[Rollout]) -> dict[str, float]:
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
    values = [v for r in rollouts for v in r.values]
    returns = [x for r in rollouts for x in r.returns]
    metrics.update(stats("critic/values", values))
    metrics.update(stats("critic/returns", returns))
    if len(returns) > 1:
        ret, val = torch.tensor(returns), torch.tensor(values)
        metrics["critic/vf_explained_var"] = float(1 - (ret - val).var() / (ret.var() + 1e-5))
    return metrics


def rollout_metrics(
    seen: list[Rollout], rollouts: list[Rollout], errors: int, max_prompt_length: int
) -> dict[str, float]:
    """reward/* over everything generated this step (as EasyR1, filtered groups included);
    lengths, scores and advantages over what is trained on."""
    keys = sorted({k for r in seen for k in r.scores})
    m = {f"reward/{k}": sum(r.scores.get(k, 0.0) for r in seen) / len(seen) for k in keys}
    m["reward/errors"] = errors
    lengths = [float(len(r.response)) for r in rollouts]
    m.update(stats("response_length", lengths))
    m["response_length/clip_ratio"] = sum(1 for r in rollouts if not r.finished) / len(rollouts)
    m.update(stats("prompt_length", [float(len(r.prompt_ids)) for r in rollouts]))
    m["prompt_length/clip_ratio"] = sum(1 for r in rollouts if len(r.prompt_ids) >= max_prompt_length) / len(
        rollouts
    )
    m.update(stats("critic/score", [r.scores["overall"] for r in rollouts]))
    m.update(
        stats(
            "critic/advantages",
            [x for r in rollouts for x in (r.adv if isinstance(r.adv, list) else [r.adv])],
        )
    )
    return m


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
