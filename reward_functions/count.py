"""CLEVR counting reward (R1-V): the integer in <answer>…</answer> against the count in the
ground truth (which may itself be written `<answer> 3 </answer>`), plus the R1-V format check.
overall = (1 - w)·accuracy + w·format."""

import re

from r1cloud.rewards.grading import first_int

REWARD_NAME = "count"
REWARD_TYPE = "sequential"

_FORMAT = re.compile(r"<think>.*?</think>\s*<answer>.*?</answer>", re.DOTALL)
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def _count(text: str) -> int | None:
    m = _ANSWER.search(text)
    return first_int(m.group(1) if m else text)


def compute_score(reward_input: dict, format_weight: float = 0.5) -> dict[str, float]:
    response = reward_input["response"]
    fmt = 1.0 if _FORMAT.fullmatch(response.strip()) else 0.0
    given, truth = _count(response), _count(str(reward_input["ground_truth"]))
    acc = 1.0 if given is not None and given == truth else 0.0
    return {"overall": (1 - format_weight) * acc + format_weight * fmt, "format": fmt, "accuracy": acc}
