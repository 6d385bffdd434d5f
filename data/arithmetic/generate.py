"""Writes the quickstart's arithmetic data set (deterministic): two-number sums and differences
with their answers, as EasyR1-style rows {"problem", "answer"}."""

import json
import random
from pathlib import Path


def rows(rng: random.Random, n: int) -> list[dict]:
    out = []
    for _ in range(n):
        a, b = rng.randint(1, 20), rng.randint(1, 20)
        if rng.random() < 0.5:
            out.append({"problem": f"What is {a} + {b}?", "answer": str(a + b)})
        else:
            a, b = max(a, b), min(a, b)
            out.append({"problem": f"What is {a} - {b}?", "answer": str(a - b)})
    return out


if __name__ == "__main__":
    here = Path(__file__).parent
    rng = random.Random(1)
    for split, n in (("train", 2000), ("test", 64)):
        with open(here / f"{split}.jsonl", "w") as f:
            for row in rows(rng, n):
                f.write(json.dumps(row) + "\n")
