"""Math reward (EasyR1 interface): the last \\boxed{} answer graded against the ground truth with
Hugging Face's math-verify (LaTeX and sympy equivalence, behind a fast exact check), plus a format
check. overall = (1 - w)·accuracy + w·format.

The format is EasyR1's (<think>…</think> then a boxed answer); with `require_think=False` a boxed
answer alone passes, for models not prompted to think aloud (the quickstart)."""

import re

from r1cloud.rewards.grading import extract_boxed, math_equal

REWARD_NAME = "math"
REWARD_TYPE = "batch"

_THINK_FORMAT = re.compile(r"<think>.*</think>.*\\boxed\{.*\}.*", re.DOTALL)
_BOXED_FORMAT = re.compile(r".*\\boxed\{.*\}.*", re.DOTALL)


def compute_score(
    reward_inputs: list[dict], format_weight: float = 0.1, require_think: bool = True
) -> list[dict[str, float]]:
    pattern = _THINK_FORMAT if require_think else _BOXED_FORMAT
    scores = []
    for item in reward_inputs:
        response = re.sub(r"\s*(<|>|/)\s*", r"\1", item["response"])  # "< think >" -> "<think>"
        fmt = 1.0 if pattern.fullmatch(response) else 0.0
        acc = 1.0 if math_equal(extract_boxed(response), str(item["ground_truth"])) else 0.0
        scores.append(
            {"overall": (1 - format_weight) * acc + format_weight * fmt, "format": fmt, "accuracy": acc}
        )
    return scores
