"""The RL math: advantage estimators, KL estimators, policy losses and loss aggregation.

Pure functions on tensors — no Ray, no model, no I/O — so each is checked against the reference
formulas (shared/reference/rl-algorithms-and-vllm.md §2, EasyR1 §5). Shapes: `B` sequences,
`T` response tokens, `mask` is 1 on response tokens up to and including EOS.

Deliberate difference from verl/EasyR1: a group of one sample (no peer to compare with) gets
advantage 0 in GRPO; verl gives it r/(1+ε) and EasyR1 refuses n=1 outright.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# --------------------------------------------------------------------------- advantages


def group_ids(index: list | torch.Tensor) -> torch.Tensor:
    """Any hashable group labels (prompt uids) -> dense int64 ids 0..G-1, in first-seen order."""
    if isinstance(index, torch.Tensor):
        _, inverse = torch.unique(index, return_inverse=True)
        return inverse
    seen: dict = {}
    return torch.tensor([seen.setdefault(u, len(seen)) for u in index], dtype=torch.long)


def group_mean_std(
    scores: torch.Tensor, ids: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-sample group mean, unbiased (Bessel) group std and group size."""
    g = int(ids.max()) + 1 if ids.numel() else 0
    x = scores.to(torch.float64)
    count = torch.zeros(g, dtype=torch.float64).index_add_(0, ids, torch.ones_like(x))
    total = torch.zeros(g, dtype=torch.float64).index_add_(0, ids, x)
    mean = total / count
    sq = torch.zeros(g, dtype=torch.float64).index_add_(0, ids, (x - mean[ids]) ** 2)
    std = torch.sqrt(sq / (count - 1).clamp(min=1))
    return mean[ids], std[ids], count[ids]


def grpo_advantages(
    scores: torch.Tensor, index: list | torch.Tensor, eps: float = 1e-6, norm_by_std: bool = True
) -> torch.Tensor:
    """A_i = (s_i − mean_g) / (std_g + eps); Dr.GRPO (norm_by_std=False): s_i − mean_g. Shape (B,)."""
    mean, std, count = group_mean_std(scores, group_ids(index))
    adv = scores.to(torch.float64) - mean
    if norm_by_std:
        adv = adv / (std + eps)
    return torch.where(count > 1, adv, torch.zeros_like(adv)).to(scores.dtype)


def token_level(adv: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Broadcast a per-sequence value (B,) over response tokens (B, T)."""
    return adv[:, None].to(torch.float32) * mask


# --------------------------------------------------------------------------- KL


def kl_estimate(logp: torch.Tensor, ref_logp: torch.Tensor, kind: str) -> torch.Tensor:
    """Per-token KL(π‖π_ref) estimates: k1 `kl`, `abs`, k2 `mse`, k3 `low_var_kl` (clamped as verl)."""
    logp, ref_logp = logp.float(), ref_logp.float()
    diff = logp - ref_logp
    if kind == "kl":
        return diff
    if kind == "abs":
        return diff.abs()
    if kind == "mse":
        return 0.5 * diff.square()
    if kind == "low_var_kl":
        x = torch.clamp(ref_logp - logp, -20, 20)
        return torch.clamp(torch.exp(x) - x - 1, -10, 10)
    raise ValueError(f"unknown KL estimator {kind!r}")


# --------------------------------------------------------------------------- aggregation


def masked_sum(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (values * mask).sum()


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (values * mask).sum() / mask.sum().clamp(min=1)


def aggregate(
    values: torch.Tensor, mask: torch.Tensor, mode: str, total: float | None = None
) -> torch.Tensor:
    """Reduce a (B, T) loss to a scalar.

    `token`: Σ(v·m) / total tokens; `seq`: Σ_b mean_t(v·m) / total sequences. `total` is the count
    over the whole mini-batch on every device (so that micro-batches and devices add up to one
    global mean, whatever the split); None means this tensor alone.
    """
    if mode == "token":
        return masked_sum(values, mask) / (mask.sum().clamp(min=1) if total is None else total)
    if mode == "seq":
        lengths = mask.sum(-1)
        per_seq = (values * mask).sum(-1) / lengths.clamp(min=1)
        n = (lengths > 0).sum().clamp(min=1) if total is None else total
        return per_seq.sum() / n
    raise ValueError(f"unknown loss_avg_mode {mode!r}")


def count_for(mode: str, mask: torch.Tensor) -> float:
    """What `aggregate`'s `total` counts for this mask: tokens, or non-empty sequences."""
    return float(mask.sum()) if mode == "token" else float((mask.sum(-1) > 0).sum())


# --------------------------------------------------------------------------- policy loss


@dataclass(frozen=True)
class ClipConfig:
    low: float = 0.2
    high: float = 0.3
    dual: float = 3.0


def ppo_loss(
    logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor, clip: ClipConfig
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Dual-clip PPO per token (EasyR1 `default`): L = max(−A·r, −A·clip(r)); for A < 0 also ≤ −A·C.

    Returns the (B, T) loss and masked-mean metrics (pg_clipfrac_higher/lower, ppo_kl).
    """
    log_ratio = logp - old_logp
    ratio = torch.exp(torch.clamp(log_ratio, -20, 20))
    clipped = torch.exp(
        torch.clamp(log_ratio, torch.log(torch.tensor(1 - clip.low)), torch.log(torch.tensor(1 + clip.high)))
    )
    l1, l2 = -adv * ratio, -adv * clipped
    lc = torch.maximum(l1, l2)
    l3 = -adv * clip.dual
    loss = torch.where(adv < 0, torch.minimum(lc, l3), lc)
    with torch.no_grad():
        metrics = {
            "pg_clipfrac_higher": masked_mean((l1 < l2).float(), mask),
            "pg_clipfrac_lower": masked_mean(((lc > l3) & (adv < 0)).float(), mask),
            "ppo_kl": masked_mean(-log_ratio, mask),
        }
    return loss, metrics
