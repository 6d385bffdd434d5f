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

from r1cloud.core.estimators import ESTIMATORS


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


def grpo_passk_advantages(
    scores: torch.Tensor, index: list | torch.Tensor, eps: float = 1e-6, norm_by_std: bool = True
) -> torch.Tensor:
    """Pass@k (arXiv 2503.19595): only each group's best sample (the first, among ties) gets
    (r_max − r_2nd) [/ (std_g + eps)]; every other sample gets 0. Singletons get 0."""
    ids = group_ids(index)
    _, std, _ = group_mean_std(scores, ids)
    x = scores.to(torch.float64)
    adv = torch.zeros_like(x)
    for g in range(int(ids.max()) + 1 if ids.numel() else 0):
        members = (ids == g).nonzero().flatten()
        if len(members) < 2:
            continue
        values = x[members]
        best = int(torch.argmax(values))
        second = torch.cat([values[:best], values[best + 1 :]]).max()
        gap = values[best] - second
        adv[members[best]] = gap / (std[members[best]] + eps) if norm_by_std else gap
    return adv.to(scores.dtype)


def rloo_advantages(scores: torch.Tensor, index: list | torch.Tensor) -> torch.Tensor:
    """RLOO: A_i = s_i − mean of the other samples of its group = n/(n−1)·(s_i − mean_g).
    A singleton gets 0 (verl's loop gives it s_i; its vectorised twin, like r1cloud, 0)."""
    mean, _, count = group_mean_std(scores, group_ids(index))
    adv = (scores.to(torch.float64) - mean) * count / (count - 1).clamp(min=1)
    return torch.where(count > 1, adv, torch.zeros_like(adv)).to(scores.dtype)


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """(x − μ)·rsqrt(var + eps) with μ and the unbiased var over the valid tokens of the batch."""
    m = mask.to(values.dtype)
    n = m.sum()
    mean = (values * m).sum() / n
    var = (((values - mean) ** 2) * m).sum() / (n - 1).clamp(min=1)
    return (values - mean) * torch.rsqrt(var + eps)


def discounted_returns(token_rewards: torch.Tensor, mask: torch.Tensor, gamma: float) -> torch.Tensor:
    """G_t = r_t + γ·G_{t+1} over response tokens; past the end (mask 0) G passes through unchanged
    and the reward there is ignored. Shape (B, T)."""
    m = mask.to(token_rewards.dtype)
    out = torch.zeros_like(token_rewards)
    running = torch.zeros(token_rewards.shape[0], dtype=token_rewards.dtype)
    for t in reversed(range(token_rewards.shape[1])):
        running = torch.where(m[:, t] > 0, token_rewards[:, t] + gamma * running, running)
        out[:, t] = running
    return out


def reinforce_plus_plus_advantages(
    token_rewards: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++: discounted returns, whitened over all valid tokens of the batch (no baseline).
    Returns (advantages, returns), both (B, T)."""
    returns = discounted_returns(token_rewards, mask, gamma)
    return masked_whiten(returns, mask) * mask, returns


def reinforce_plus_plus_baseline_advantages(
    scores: torch.Tensor, index: list | torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """REINFORCE++ with a group baseline: s_i − mean_g (a singleton's baseline is 0), tiled over
    its tokens and whitened over all valid tokens of the batch. Shape (B, T)."""
    mean, _, count = group_mean_std(scores, group_ids(index))
    centred = scores.to(torch.float64) - torch.where(count > 1, mean, torch.zeros_like(mean))
    tiled = centred.to(torch.float32)[:, None] * mask
    return masked_whiten(tiled, mask) * mask


def remax_advantages(
    token_rewards: torch.Tensor, baselines: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """ReMax: the reward still to come at each token (undiscounted) minus the greedy rollout's
    reward for the same prompt. (B, T)"""
    returns = discounted_returns(token_rewards, mask, 1.0)
    return (returns - baselines.to(returns.dtype)[:, None]) * mask


def gae_advantages(
    token_rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float, lam: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE: δ_t = r_t + γV_{t+1} − V_t, A_t = δ_t + γλA_{t+1}, where "next" skips tokens outside
    the mask. Returns (whitened advantages, returns = A + V), both (B, T)."""
    m = mask.to(values.dtype)
    next_value = torch.zeros(values.shape[0], dtype=values.dtype)
    last = torch.zeros(values.shape[0], dtype=values.dtype)
    adv = torch.zeros_like(values)
    for t in reversed(range(values.shape[1])):
        delta = token_rewards[:, t] + gamma * next_value - values[:, t]
        step = delta + gamma * lam * last
        last = torch.where(m[:, t] > 0, step, last)
        next_value = torch.where(m[:, t] > 0, values[:, t], next_value)
        adv[:, t] = last
    returns = adv + values
    return masked_whiten(adv, mask) * mask, returns


def token_level(adv: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Broadcast a per-sequence value (B,) over response tokens (B, T)."""
    return adv[:, None].to(torch.float32) * mask


def token_rewards(
    scores: torch.Tensor, mask: torch.Tensor, lengths: torch.Tensor, kl: torch.Tensor | None, coef: float
) -> torch.Tensor:
    """Token-level rewards (B, T): the outcome on each response's last token, minus coef·KL on every
    token when the KL goes into the reward (verl's apply_kl_penalty)."""
    out = torch.zeros(mask.shape)
    if kl is not None:
        out = -coef * kl * mask
    rows = torch.nonzero(lengths > 0)[:, 0]
    out[rows, lengths[rows] - 1] += scores[rows].float()
    return out


@dataclass
class Outcomes:
    """What an estimator may read: the groups, the sequence and token rewards, the response mask,
    the critic's values (GAE) and the greedy baselines (ReMax)."""

    uids: list[str]
    rewards: torch.Tensor  # (B,)
    token_rewards: torch.Tensor  # (B, T)
    mask: torch.Tensor  # (B, T)
    values: torch.Tensor | None = None
    baselines: torch.Tensor | None = None


# adv_estimator -> advantages (B, T) (GAE: and the critic's returns): the names of core/estimators.py
ADVANTAGES = {
    "grpo": lambda a, x: token_level(
        grpo_advantages(x.rewards, x.uids, norm_by_std=a.norm_adv_by_std_in_grpo), x.mask
    ),
    "grpo_passk": lambda a, x: token_level(
        grpo_passk_advantages(x.rewards, x.uids, norm_by_std=a.norm_adv_by_std_in_grpo), x.mask
    ),
    "rloo": lambda a, x: token_level(rloo_advantages(x.rewards, x.uids), x.mask),
    "reinforce_plus_plus": lambda a, x: reinforce_plus_plus_advantages(x.token_rewards, x.mask, a.gamma)[0],
    "reinforce_plus_plus_baseline": lambda a, x: reinforce_plus_plus_baseline_advantages(
        x.rewards.float(), x.uids, x.mask
    ),
    # the reward still to come, minus the greedy baseline
    "remax": lambda a, x: remax_advantages(x.token_rewards, x.baselines, x.mask),
    "gae": lambda a, x: gae_advantages(x.token_rewards, x.values, x.mask, a.gamma, a.lam),
}
ADVANTAGES["dapo"] = ADVANTAGES["grpo"]  # DAPO's settings are a preset; its advantages are GRPO's


def advantages(a, x: Outcomes) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`algorithm.adv_estimator` over the batch as (B, T) fp32, zero past each response: outcome
    estimators from the sequence rewards, spread over the tokens; REINFORCE++ and GAE per token
    (from the token rewards). Also GAE's returns, the critic's targets (None otherwise)."""
    out = ADVANTAGES[a.adv_estimator](a, x)
    adv, returns = out if ESTIMATORS[a.adv_estimator].critic else (out, None)  # a critic's: and its targets
    return adv * x.mask, None if returns is None else returns * x.mask


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


def adaptive_kl_coef(coef: float, current_kl: float, target: float, n_steps: int, horizon: float) -> float:
    """The adaptive KL controller (Ziegler et al.): β·(1 + clip(KL/target − 1, ±0.2)·n_steps/horizon),
    where KL is the batch mean of per-sequence token-mean KL and n_steps the batch size."""
    error = min(max(current_kl / target - 1, -0.2), 0.2)
    return coef * (1 + error * n_steps / horizon)


def groups_to_keep(uids: list[str], values: list[float], low: float, high: float) -> set[str]:
    """DAPO's dynamic sampling as EasyR1 does it: keep the groups whose mean `filter_key` value is
    strictly between `low` and `high` (all-right and all-wrong groups carry no GRPO signal)."""
    sums: dict[str, list[float]] = {}
    for u, v in zip(uids, values, strict=True):
        sums.setdefault(u, []).append(v)
    return {u for u, vs in sums.items() if low < sum(vs) / len(vs) < high}


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (values * mask).sum() / mask.sum().clamp(min=1)


# EasyR1's loss_avg_mode names onto verl's loss_agg_mode names (verl's own pass as they are)
AGG_MODES = {"token": "token-mean", "seq": "seq-mean-token-mean"}


def aggregate(
    values: torch.Tensor, mask: torch.Tensor, mode: str, total: float | None = None, norm: float | None = None
) -> torch.Tensor:
    """Reduce a (B, T) loss to a scalar.

    - `token-mean` (EasyR1 `token`): Σ(v·m) / tokens.
    - `seq-mean-token-mean` (EasyR1 `seq`, the original GRPO): mean over sequences of mean_t(v·m).
    - `seq-mean-token-sum`: mean over sequences of Σ_t(v·m).
    - `seq-mean-token-sum-norm` (Dr.GRPO): Σ(v·m) / (sequences · `norm`), `norm` a constant length
      (the maximum response length; verl defaults to the padded width).
    `total` is the token or non-empty-sequence count over the whole mini-batch on every device (so
    micro-batches and devices add up to one global mean whatever the split); None: this tensor alone.
    """
    mode = AGG_MODES.get(mode, mode)
    if mode == "token-mean":
        return (values * mask).sum() / (mask.sum().clamp(min=1) if total is None else total)
    lengths = mask.sum(-1)
    n = (lengths > 0).sum().clamp(min=1) if total is None else total
    if mode == "seq-mean-token-mean":
        return ((values * mask).sum(-1) / lengths.clamp(min=1)).sum() / n
    if mode == "seq-mean-token-sum":
        return (values * mask).sum() / n
    if mode == "seq-mean-token-sum-norm":
        return (values * mask).sum() / n / (norm if norm is not None else mask.shape[-1])
    raise ValueError(f"unknown loss aggregation mode {mode!r}")


def count_for(mode: str, mask: torch.Tensor) -> float:
    """What `aggregate`'s `total` counts for this mask: tokens, or non-empty sequences."""
    return float(mask.sum()) if AGG_MODES.get(mode, mode) == "token-mean" else float((mask.sum(-1) > 0).sum())


def value_loss(
    vpred: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    clip: float,
    mode: str,
    total: float | None = None,
    norm: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's clipped value loss: ½·agg(max((V − R)², (clip(V, V_old ± c) − R)²)); and the clip fraction."""
    clipped = old_values + torch.clamp(vpred - old_values, -clip, clip)
    unclipped_sq, clipped_sq = (vpred - returns).square(), (clipped - returns).square()
    loss = 0.5 * aggregate(torch.maximum(unclipped_sq, clipped_sq), mask, mode, total, norm)
    return loss, masked_mean((clipped_sq > unclipped_sq).float(), mask)


@dataclass(frozen=True)
class ClipConfig:
    low: float = 0.2
    high: float = 0.3
    dual: float = 3.0


def _log32(x: float) -> float:
    """log(x) rounded as fp32 computes it, a plain number: a bound on any device's tensor."""
    return float(torch.log(torch.tensor(x)))


def ppo_loss(
    logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor, clip: ClipConfig
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Dual-clip PPO per token (EasyR1 `default`): L = max(−A·r, −A·clip(r)); for A < 0 also ≤ −A·C.

    Returns the (B, T) loss and masked-mean metrics (pg_clipfrac_higher/lower, ppo_kl).
    """
    log_ratio = logp - old_logp
    ratio = torch.exp(torch.clamp(log_ratio, -20, 20))
    clipped = torch.exp(torch.clamp(log_ratio, _log32(1 - clip.low), _log32(1 + clip.high)))
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


def log_ratio_for(kind: str, logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The per-token log importance ratio each loss uses. `gspo`: the sequence's mean log ratio on
    every token (the gradient flows through the mean); `gspo_token`: that value with each token's
    own gradient, sg(seq mean) + logp − sg(logp) (EasyR1)."""
    log_ratio = logp - old_logp
    if kind not in ("gspo", "gspo_token"):
        return log_ratio
    seq = (log_ratio * mask).sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp(min=1)
    if kind == "gspo":
        return seq.expand_as(log_ratio) * mask
    return seq.detach() + logp - logp.detach()


def policy_loss(
    kind: str,
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    adv: torch.Tensor,
    mask: torch.Tensor,
    clip: ClipConfig,
    tau_pos: float = 1.0,
    tau_neg: float = 1.05,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The (B, T) policy loss of `worker.actor.loss_type` and its metrics; `adv` is (B, T).

    - `default`, `gspo`, `gspo_token`: dual-clip PPO on the ratio `log_ratio_for` gives.
    - `cispo`: −A·logp·sg(clip(r, 1−ε_low, 1+ε_high)) — clipped weights, never clipped gradients.
    - `sapo`: −A·(4/τ)·σ(τ(r − 1)), τ = tau_pos where A ≥ 0, tau_neg where A < 0 (a soft gate).
    """
    if kind in ("default", "gspo", "gspo_token"):
        return ppo_loss(log_ratio_for(kind, logp, old_logp, mask), torch.zeros_like(logp), adv, mask, clip)
    log_ratio = logp - old_logp
    ratio = torch.exp(torch.clamp(log_ratio, -20, 20))
    if kind == "cispo":
        low, high = _log32(max(1 - clip.low, 1e-8)), _log32(1 + clip.high)
        weight = torch.exp(torch.clamp(log_ratio, low, high)).detach()
        loss = -adv * logp * weight
    elif kind == "sapo":
        tau = torch.where(adv >= 0, torch.full_like(adv, tau_pos), torch.full_like(adv, tau_neg))
        loss = -adv * torch.sigmoid(tau * (ratio - 1)) * 4 / tau
    else:
        raise ValueError(f"unknown loss_type {kind!r}")
    with torch.no_grad():
        metrics = {"ppo_kl": masked_mean(-log_ratio, mask)}
    return loss, metrics


def rollout_is_weights(
    old_logp: torch.Tensor, rollout_logp: torch.Tensor, mask: torch.Tensor, mode: str, cap: float
) -> torch.Tensor:
    """Truncated importance sampling for the rollout/trainer mismatch (TRL's modes): the weight
    exp(old − rollout) per token, or exp(Σ_t(old − rollout)) per sequence; `truncate` caps it at
    `cap`, `mask` zeroes what exceeds it. (B, T), no gradient, multiplied into the per-token loss."""
    log_w = (old_logp - rollout_logp).detach() * mask
    if mode.startswith("sequence"):
        log_w = log_w.sum(-1, keepdim=True).expand_as(mask)
    w = torch.exp(torch.clamp(log_w, max=20.0))
    if mode.endswith("truncate"):
        w = torch.clamp(w, max=cap)
    elif mode.endswith("mask"):
        w = w * (w <= cap)
    else:
        raise ValueError(f"unknown rollout importance-sampling mode {mode!r}")
    return w * mask
