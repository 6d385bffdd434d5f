"""R1-V reward (EasyR1 interface): <think>…</think><answer>…</answer>, the answer graded against
the ground truth (math-verify equivalence, as math.py). overall = (1 - w)·accuracy + w·format."""

import re

from r1cloud.rewards.grading import math_equal

REWARD_NAME = "r1v"
REWARD_TYPE = "sequential"

_FORMAT = re.compile(r"<think>.*?</think>\s*<answer>.*?</answer>", re.DOTALL)
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def compute_score(reward_input: dict, format_weight: float = 0.5) -> dict[str, float]:
    response = reward_input["response"]
    fmt = 1.0 if _FORMAT.fullmatch(response.strip()) else 0.0
    m = _ANSWER.search(response)
    answer = m.group(1) if m else response
    acc = 1.0 if math_equal(answer.strip(), str(reward_input["ground_truth"]).strip()) else 0.0
    return {"overall": (1 - format_weight) * acc + format_weight * fmt, "format": fmt, "accuracy": acc}
