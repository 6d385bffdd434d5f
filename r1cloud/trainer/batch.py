"""The step's batch: one Rollout per sample, how samples are placed on workers and cut into
micro-batches (groups kept together when their prompt is packed once), and the token-level
rewards and advantages the update trains on. Pure: no Ray, no model.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field

import torch

from . import algorithms as alg
from .data import Prompt


@dataclass
class Rollout:
    prompt: int  # index in the prompt set
    uid: str  # GRPO group id
    prompt_ids: list[int]
    response: list[int]
    logprobs: list[float]
    finished: bool
    ground_truth: str
    scores: dict[str, float] = field(default_factory=dict)
    old: list[float] | None = None
    ref: list[float] | None = None
    adv: float | list[float] = 0.0  # one value for the sequence, or one per response token
    source: Prompt | None = None  # the data row it answers
    values: list[float] | None = None  # GAE: the critic's estimates and the returns it learns
    returns: list[float] | None = None
    # the prompt's images as the model takes them: {"key": the prompt, **the processor's tensors};
    # one dict shared by a group's samples (pickled once per call)
    images: dict | None = None

    @property
    def seq(self) -> tuple:
        """What the workers pack (model.Seq)."""
        return (
            (self.prompt_ids, self.response, self.images) if self.images else (self.prompt_ids, self.response)
        )


# ---------------------------------------------------------------------------- batching plans


def balance(items: list, weights: list[float], parts: int) -> list[list]:
    """Greedy longest-first partition into `parts` groups of near-equal total weight."""
    heap = [(0.0, i) for i in range(parts)]
    groups: list[list] = [[] for _ in range(parts)]
    for idx in sorted(range(len(items)), key=lambda i: -weights[i]):
        load, g = heapq.heappop(heap)
        groups[g].append(items[idx])
        heapq.heappush(heap, (load + weights[idx], g))
    return groups


def groups(rollouts: list[Rollout], share: bool) -> list[list[Rollout]]:
    """The units a plan places: samples with the same prompt together when the workers pack that
    prompt once (`share`), each sample alone otherwise."""
    if not share:
        return [[r] for r in rollouts]
    by_prompt: dict[tuple, list[Rollout]] = {}
    for r in rollouts:
        by_prompt.setdefault((tuple(r.prompt_ids), (r.images or {}).get("key")), []).append(r)
    return list(by_prompt.values())


def cost(group: list[Rollout]) -> int:
    """Tokens a packed group takes: its prompt once (all share it, or it is alone), its responses."""
    return len(group[0].prompt_ids) + sum(len(r.response) for r in group)


def partition(rollouts: list[Rollout], parts: int, share: bool) -> list[list[Rollout]]:
    """`parts` shares of near-equal token count. Groups stay whole where they can; while there are
    fewer groups than parts, the largest is halved."""
    units = groups(rollouts, share)
    while len(units) < parts and max(len(u) for u in units) > 1:
        big = max(units, key=len)
        units.remove(big)
        units += [big[: len(big) // 2], big[len(big) // 2 :]]
    return [[r for u in part for r in u] for part in balance(units, [cost(u) for u in units], parts)]


def micro_batches(
    per_rank: list[list[Rollout]], per_micro: int, token_budget: int | None, share: bool = False
) -> list[list[list[Rollout]]]:
    """Split each rank's samples into the same number of non-empty micro-batches (FSDP's collectives
    must pair up): by sample count, or by token budget (dynamic batching)."""

    def need(rs: list[Rollout]) -> int:
        if token_budget:
            return math.ceil(sum(cost(g) for g in groups(rs, share)) / token_budget)
        return math.ceil(len(rs) / per_micro)

    k = max(1, max(need(rs) for rs in per_rank))
    k = min(k, min(len(rs) for rs in per_rank))
    return [partition(rs, k, share) for rs in per_rank]


def split_ranks(rollouts: list[Rollout], world: int, share: bool = False) -> list[list[Rollout]]:
    if len(rollouts) < world:
        raise ValueError(f"{len(rollouts)} samples cannot be spread over {world} workers")
    return partition(rollouts, world, share)


def stats(prefix: str, values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    return {
        f"{prefix}/mean": sum(values) / len(values),
        f"{prefix}/max": max(values),
        f"{prefix}/min": min(values),
    }


def reward_matrix(
    rollouts: list[Rollout], scores: torch.Tensor, kl: list[torch.Tensor] | None, coef: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token-level rewards (B, T) and the response mask: the outcome on each response's last token,
    minus coef·KL on every token when the KL goes into the reward (verl's apply_kl_penalty)."""
    lengths = [len(r.response) for r in rollouts]
    width = max(max(lengths), 1)
    mask = (torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]).float()
    token_rewards = torch.zeros(len(rollouts), width)
    for i, n in enumerate(lengths):
        if n:
            if kl is not None:
                token_rewards[i, :n] = -coef * kl[i]
            token_rewards[i, n - 1] += float(scores[i])
    return token_rewards, mask


def advantages(
    a,
    rollouts: list[Rollout],
    rewards: torch.Tensor,
    token_rewards: torch.Tensor,
    mask: torch.Tensor,
    values: torch.Tensor | None = None,
    baselines: torch.Tensor | None = None,
) -> tuple[list, list | None]:
    """`algorithm.adv_estimator` over the batch: a float per rollout (outcome estimators, from the
    sequence rewards) or, for REINFORCE++ and GAE, one value per response token (from the token
    rewards). Also GAE's returns, the critic's targets (None otherwise)."""
    uids = [r.uid for r in rollouts]
    returns = None
    if a.adv_estimator in ("grpo", "dapo"):
        return alg.grpo_advantages(rewards, uids, norm_by_std=a.norm_adv_by_std_in_grpo).tolist(), None
    if a.adv_estimator == "grpo_passk":
        return alg.grpo_passk_advantages(rewards, uids, norm_by_std=a.norm_adv_by_std_in_grpo).tolist(), None
    if a.adv_estimator == "rloo":
        return alg.rloo_advantages(rewards, uids).tolist(), None
    if a.adv_estimator == "reinforce_plus_plus":
        tok, _ = alg.reinforce_plus_plus_advantages(token_rewards, mask, a.gamma)
    elif a.adv_estimator == "reinforce_plus_plus_baseline":
        tok = alg.reinforce_plus_plus_baseline_advantages(rewards.float(), uids, mask)
    elif a.adv_estimator == "remax":  # the reward still to come, minus the greedy baseline
        tok = alg.remax_advantages(token_rewards, baselines, mask)
    elif a.adv_estimator == "gae":
        tok, ret = alg.gae_advantages(token_rewards, values, mask, a.gamma, a.lam)
        returns = [ret[i, : len(r.response)].tolist() for i, r in enumerate(rollouts)]
    else:
        raise ValueError(f"unknown adv_estimator {a.adv_estimator}")
    return [tok[i, : len(r.response)].tolist() for i, r in enumerate(rollouts)], returns


class RunError(RuntimeError):
    """A mismatch of data, reward and settings found mid-run: said in one line, no traceback."""
