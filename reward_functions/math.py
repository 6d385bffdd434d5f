"""Math reward (EasyR1 interface): the last \\boxed{} answer against the ground truth, plus a
format check (<think>…</think> then a boxed answer). overall = (1 - w)·accuracy + w·format."""

import re

from r1cloud.grading import answers_equal, extract_boxed

REWARD_NAME = "math"
REWARD_TYPE = "batch"

_FORMAT = re.compile(r"<think>.*</think>.*\\boxed\{.*\}.*", re.DOTALL)


def compute_score(reward_inputs: list[dict], format_weight: float = 0.1) -> list[dict[str, float]]:
    scores = []
    for item in reward_inputs:
        response = re.sub(r"\s*(<|>|/)\s*", r"\1", item["response"])  # "< think >" -> "<think>"
        fmt = 1.0 if _FORMAT.fullmatch(response) else 0.0
        acc = 1.0 if answers_equal(extract_boxed(response), str(item["ground_truth"])) else 0.0
        scores.append(
            {"overall": (1 - format_weight) * acc + format_weight * fmt, "format": fmt, "accuracy": acc}
        )
    return scores
