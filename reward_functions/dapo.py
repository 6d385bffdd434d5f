"""DAPO reward (EasyR1 interface): the last `Answer:` line in the final 300 characters, ±1
accuracy, and the soft overlong penalty: 0 up to max - buffer tokens, then linear down to -1 at
max. overall = accuracy + penalty_factor · overlong. The three kwargs have no defaults, as in
EasyR1: `r1cloud validate` asks for them."""

from r1cloud.rewards.grading import answers_equal, last_answer_line

REWARD_NAME = "dapo"
REWARD_TYPE = "batch"


def soft_overlong_penalty(length: int, max_response_length: int, overlong_buffer_length: int) -> float:
    start = max_response_length - overlong_buffer_length
    if length <= start:
        return 0.0
    if length <= max_response_length:
        return (start - length) / overlong_buffer_length
    return -1.0


def compute_score(
    reward_inputs: list[dict],
    max_response_length: int,
    overlong_buffer_length: int,
    overlong_penalty_factor: float,
) -> list[dict[str, float]]:
    scores = []
    for item in reward_inputs:
        answer = last_answer_line(item["response"][-300:])
        acc = 1.0 if answers_equal(answer, str(item["ground_truth"])) else -1.0
        overlong = soft_overlong_penalty(item["response_length"], max_response_length, overlong_buffer_length)
        scores.append(
            {
                "overall": acc + overlong * overlong_penalty_factor,
                "accuracy": acc,
                "overlong": overlong,
                "accuracy_normalized": (acc + 1) / 2,
            }
        )
    return scores
