"""Arithmetic reward for the quickstart: the last number in the response against the answer.

No format is asked for or rewarded, so the reward is the accuracy and nothing else: a model can
raise it only by getting more sums right, never by copying a template."""

import re

REWARD_NAME = "arithmetic"
REWARD_TYPE = "sequential"

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def compute_score(reward_input: dict) -> dict[str, float]:
    numbers = _NUMBER.findall(reward_input["response"].replace(",", ""))
    correct = bool(numbers) and float(numbers[-1]) == float(reward_input["ground_truth"])
    return {"overall": float(correct), "accuracy": float(correct)}
