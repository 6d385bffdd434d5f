"""How samples are placed on workers and cut into micro-batches: balanced by cost, a group kept
together when its prompt is packed once, the same number of micro-batches on every worker (so
FSDP's collectives pair up). Pure: positions only."""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from r1cloud.trainer.batch import Batch


@dataclass(frozen=True)
class Sizes:
    """What a plan knows of each sample: its group and its prompt and response lengths."""

    uid: list[str]
    prompt: list[int]
    response: list[int]

    @classmethod
    def of(cls, b: Batch) -> Sizes:
        return cls(b.uid, b.prompt_len.tolist(), b.response_len.tolist())


def balance(items: list, weights: list[float], parts: int) -> list[list]:
    """Greedy longest-first partition into `parts` groups of near-equal total weight."""
    heap = [(0.0, i) for i in range(parts)]
    out: list[list] = [[] for _ in range(parts)]
    for idx in sorted(range(len(items)), key=lambda i: -weights[i]):
        load, g = heapq.heappop(heap)
        out[g].append(items[idx])
        heapq.heappush(heap, (load + weights[idx], g))
    return out


def groups(s: Sizes, idx: list[int], share: bool) -> list[list[int]]:
    """The units a plan places: samples of one group together when the workers pack their prompt
    once (`share`), each sample alone otherwise."""
    if not share:
        return [[i] for i in idx]
    by_uid: dict[str, list[int]] = {}
    for i in idx:
        by_uid.setdefault(s.uid[i], []).append(i)
    return list(by_uid.values())


def cost(s: Sizes, group: list[int]) -> int:
    """Tokens a packed group takes: its prompt once (all share it, or it is alone), its responses."""
    return s.prompt[group[0]] + sum(s.response[i] for i in group)


def partition(s: Sizes, idx: list[int], parts: int, share: bool) -> list[list[int]]:
    """`parts` shares of near-equal token count. Groups stay whole where they can; while there are
    fewer groups than parts, the largest is halved."""
    units = groups(s, idx, share)
    while len(units) < parts and max(len(u) for u in units) > 1:
        big = max(units, key=len)
        units.remove(big)
        units += [big[: len(big) // 2], big[len(big) // 2 :]]
    return [[i for u in part for i in u] for part in balance(units, [cost(s, u) for u in units], parts)]


def micro_batches(
    s: Sizes, per_rank: list[list[int]], per_micro: int, token_budget: int | None, share: bool = False
) -> list[list[list[int]]]:
    """Split each rank's samples into the same number of non-empty micro-batches (FSDP's collectives
    must pair up): by sample count, or by token budget (dynamic batching)."""

    def need(idx: list[int]) -> int:
        if token_budget:
            return math.ceil(sum(cost(s, g) for g in groups(s, idx, share)) / token_budget)
        return math.ceil(len(idx) / per_micro)

    k = max(1, max(need(idx) for idx in per_rank))
    k = min(k, min(len(idx) for idx in per_rank))
    return [partition(s, idx, k, share) for idx in per_rank]


def split_ranks(s: Sizes, idx: list[int], world: int, share: bool = False) -> list[list[int]]:
    if len(idx) < world:
        raise ValueError(f"{len(idx)} samples cannot be spread over {world} workers")
    return partition(s, idx, world, share)


def rank_plan(
    s: Sizes, idx: list[int], world: int, per_micro: int, budget: int | None, share: bool, sp: int = 1
) -> list[list[list[int]]]:
    """Each rank's micro-batches of the samples `idx`: split over the data-parallel groups, the
    `sp` ranks of a Ulysses group given the same ones (they hold slices of one row)."""
    plan = micro_batches(s, split_ranks(s, idx, world // sp, share), per_micro, budget, share)
    return [micros for micros in plan for _ in range(sp)]


def localize(plan: list[list[int]]) -> tuple[list[int], list[list[int]]]:
    """A rank's micro-batches of batch rows as (the rows it needs, once each, in order; the
    micro-batches as positions in those rows): what it is sent."""
    rows = list(dict.fromkeys(i for micro in plan for i in micro))
    at = {i: k for k, i in enumerate(rows)}
    return rows, [[at[i] for i in micro] for micro in plan]
