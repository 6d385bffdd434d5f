"""Short-answer reward (EasyR1 interface): the first of the answer `options` (a kwarg, e.g. the
colour names) that the response names, as a whole word, case-insensitively, against the ground
truth. Naming several options scores the first: hedging earns nothing. overall = accuracy."""

import re

REWARD_NAME = "keyword"
REWARD_TYPE = "batch"


def first_option(text: str, options: list[str]) -> str | None:
    hits = [(m.start(), o) for o in options for m in re.finditer(rf"\b{re.escape(o)}\b", text, re.IGNORECASE)]
    return min(hits)[1].lower() if hits else None


def compute_score(reward_inputs: list[dict], options: list[str] | None = None) -> list[dict[str, float]]:
    out = []
    for x in reward_inputs:
        truth = str(x["ground_truth"]).strip().lower()
        choices = options or [truth]
        acc = 1.0 if first_option(x["response"], choices) == truth else 0.0
        out.append({"overall": acc, "accuracy": acc})
    return out
