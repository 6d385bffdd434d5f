"""What `r1cloud eval` reports, as pure functions over scored samples.

A sample is a dict with `prompt` (its prompt's index), `scores` (the reward's keys), `length`
(response tokens), `finished` (ended on EOS) and optionally `data_source` and, for a multi-turn
run's episode, `episode` (its turns, tool_calls and tool_errors). A sample is correct
when its `accuracy` score — or, for a reward without one, its `overall` score — is above 0.5
(EasyR1's rewards give accuracy 0/1, its DAPO reward -1/1).

Every figure is a mean over prompts of a per-prompt value, with its standard error over prompts:
the k samples of one prompt are not independent draws of the data set, its prompts are.
pass@k is the unbiased estimator of Chen et al. (2021): with n samples of which c are correct,
1 - C(n-c, k) / C(n, k), the chance that k samples drawn from the n without replacement hold a
correct one.
"""

from __future__ import annotations

import math
from collections import defaultdict


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k for n samples with c correct (k ≤ n)."""
    if not 0 < k <= n or not 0 <= c <= n:
        raise ValueError(f"pass@{k} needs 0 < k ≤ n and 0 ≤ c ≤ n (n={n}, c={c})")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod((n - c - i) / (n - i) for i in range(k))


def mean_se(values: list[float]) -> tuple[float, float]:
    """The mean and its standard error (0 for fewer than two values)."""
    n = len(values)
    if n == 0:
        return math.nan, math.nan
    mean = sum(values) / n
    if n < 2:
        return mean, 0.0
    var = sum((v - mean) ** 2 for v in values) / (n - 1)
    return mean, math.sqrt(var / n)


def correct(scores: dict) -> bool:
    return float(scores.get("accuracy", scores.get("overall", 0.0))) > 0.5


def ks_for(n: int) -> list[int]:
    """The k of pass@k to report for n samples per prompt: 1, 2, 4, … and n."""
    ks, k = [], 1
    while k < n:
        ks.append(k)
        k *= 2
    return [*ks, n]


def summarize(samples: list[dict]) -> dict:
    """{"all": figures, "by_source": {source: figures}} — by source only when there are several."""
    out = {"all": _figures(samples)}
    groups: dict[str, list[dict]] = defaultdict(list)
    for s in samples:
        if s.get("data_source") is not None:
            groups[str(s["data_source"])].append(s)
    if len(groups) > 1:
        out["by_source"] = {name: _figures(group) for name, group in sorted(groups.items())}
    return out


def _figures(samples: list[dict]) -> dict:
    """Each figure as [mean, standard error]; counts as plain numbers."""
    by_prompt: dict[int, list[dict]] = defaultdict(list)
    for s in samples:
        by_prompt[s["prompt"]].append(s)
    groups = list(by_prompt.values())
    if not groups:
        return {"prompts": 0, "samples": 0}
    n = max(len(g) for g in groups)  # a prompt cut short by an interruption holds fewer: left out
    groups = [g for g in groups if len(g) == n]
    keys = sorted({k for g in groups for s in g for k in s["scores"]})

    def per_prompt(value) -> tuple[float, float]:
        """A sample's `value` averaged over each prompt's samples, then over prompts."""
        return mean_se([sum(float(value(s)) for s in g) / len(g) for g in groups])

    figures: dict = {"prompts": len(groups), "samples": sum(len(g) for g in groups), "n": n}
    figures["accuracy"] = per_prompt(lambda s: correct(s["scores"]))
    for k in ks_for(n):
        figures[f"pass@{k}"] = mean_se(
            [pass_at_k(n, sum(correct(s["scores"]) for s in g), k) for g in groups]
        )
    if n > 1:
        figures[f"mean@{n}"] = figures["accuracy"]
    for key in keys:
        figures[f"reward/{key}"] = per_prompt(lambda s, key=key: s["scores"].get(key, 0.0))
    if all("episode" in s for g in groups for s in g):  # multi-turn: per episode, then per prompt
        for key in ("turns", "tool_calls"):
            figures[key] = per_prompt(lambda s, key=key: s["episode"][key])
        figures["tool_error_rate"] = mean_se([_ratio(g, "tool_errors", "tool_calls") for g in groups])
    figures["response_length"] = per_prompt(lambda s: s["length"])
    figures["truncated"] = per_prompt(lambda s: not s["finished"])
    return figures


def _ratio(group: list[dict], part: str, whole: str) -> float:
    """Σ part / Σ whole over a prompt's episodes (0 when none called a tool)."""
    calls = sum(s["episode"][whole] for s in group)
    return sum(s["episode"][part] for s in group) / calls if calls else 0.0
