"""Writes the tool quickstart's data set (deterministic): products of a 3-digit and a 2-digit
number, too large for a small model to do in its head. Rows are {"problem", "answer"}, the problem
a conversation (TRL's conversational format): a system message naming the calculator and one
worked example before the question, which is how a 135M model learns the call format at all."""

import json
import random
from pathlib import Path

EXAMPLE = [
    {
        "role": "system",
        "content": "You can call a calculator. To multiply, write exactly <tool_call>multiply(a=X, b=Y)</tool_call> "
        "and stop; the result comes back, then answer with the number.",
    },
    {"role": "user", "content": "What is 12 times 34?"},
    {"role": "assistant", "content": "<tool_call>multiply(a=12, b=34)</tool_call>"},
    {"role": "tool", "content": "408"},
    {"role": "assistant", "content": "The answer is 408."},
]


# The control (blueprints/tools_calculator_control.yaml): the same questions, no calculator, one
# worked example of a direct answer.
DIRECT = [
    {"role": "system", "content": "Answer with the number."},
    {"role": "user", "content": "What is 12 times 34?"},
    {"role": "assistant", "content": "The answer is 408."},
]


def rows(rng: random.Random, n: int, example: list[dict]) -> list[dict]:
    out = []
    for _ in range(n):
        a, b = rng.randint(100, 999), rng.randint(11, 99)
        out.append(
            {
                "problem": [*example, {"role": "user", "content": f"What is {a} times {b}?"}],
                "answer": str(a * b),
            }
        )
    return out


if __name__ == "__main__":
    here = Path(__file__).parent
    for prefix, example in (("", EXAMPLE), ("control_", DIRECT)):
        rng = random.Random(1)  # the same questions in both
        for split, n in (("train", 1000), ("test", 64)):
            with open(here / f"{prefix}{split}.jsonl", "w") as f:
                for row in rows(rng, n, example):
                    f.write(json.dumps(row) + "\n")
