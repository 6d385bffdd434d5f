"""Writes a picture-question data set (deterministic), EasyR1-style: rows {"images": [path],
"problem": "<image>…?", "answer": …} in train.jsonl / test.jsonl, PNGs under images/.

Each picture holds 1–`most` shapes (squares or discs) of one colour (red, green or blue) on
white. `--question count` asks how many shapes there are, `--question colour` what colour they
are, `--question colour_choice` the same as a multiple choice (A. red, B. green, C. blue; the
answer is the letter). The answer is in the picture only: a policy blind to the image can do no
better than always naming the most frequent answer (`--ceiling FILE` prints that share).
Usage: python data/shapes/generate.py OUT [--question count|colour|colour_choice] [--train N]
[--test N] [--size PX] [--most K]

The pictures depend on the seed, sizes and counts only, not on the question, so one folder can
hold several questions about the same pictures: a question other than `count` writes
QUESTION_train.jsonl / QUESTION_test.jsonl. This folder ships the output of
`generate.py data/shapes --train 1024 --test 64 --size 96` with `--question count`
(train.jsonl, test.jsonl) and `--question colour_choice` (blueprints/quickstart_vl.yaml's data);
the tests make their own, smaller sets.
"""

from __future__ import annotations

import argparse
import json
import random
from collections import Counter
from pathlib import Path

COLOURS = {"red": (220, 30, 30), "blue": (30, 60, 220), "green": (30, 160, 60)}
CHOICES = ("red", "green", "blue")  # A, B, C in colour_choice's question

QUESTIONS = {
    "count": "<image>How many shapes are in the picture?",
    "colour": "<image>What colour are the shapes?",
    "colour_choice": "<image>What colour are the shapes?\n"
    + "\n".join(f"{'ABC'[i]}. {c}" for i, c in enumerate(CHOICES)),
}


def answer_of(question: str, count: int, colour: str) -> str:
    if question == "count":
        return str(count)
    return colour if question == "colour" else "ABC"[CHOICES.index(colour)]


def picture(rng: random.Random, count: int, size: int, name: str):
    from PIL import Image, ImageDraw

    img = Image.new("RGB", (size, size), (255, 255, 255))
    draw = ImageDraw.Draw(img)
    colour = COLOURS[name]
    cell = size // 3  # a 3×3 grid: shapes never overlap
    for slot in rng.sample(range(9), count):
        x, y = (slot % 3) * cell, (slot // 3) * cell
        r = cell // 2 - max(2, cell // 8)
        cx, cy = x + cell // 2, y + cell // 2
        box = (cx - r, cy - r, cx + r, cy + r)
        (draw.rectangle if rng.random() < 0.5 else draw.ellipse)(box, fill=colour)
    return img


def write(
    out: str | Path,
    train: int = 512,
    test: int = 64,
    size: int = 56,
    most: int = 4,
    seed: int = 1,
    question: str = "count",
) -> Path:
    out = Path(out)
    (out / "images").mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    prefix = "" if question == "count" else f"{question}_"
    for split, n in (("train", train), ("test", test)):
        with open(out / f"{prefix}{split}.jsonl", "w") as f:
            for i in range(n):
                count, colour = rng.randint(1, most), rng.choice(sorted(COLOURS))
                name = f"images/{split}-{i:05d}.png"
                picture(rng, count, size, colour).save(out / name)
                row = {
                    "images": [name],
                    "problem": QUESTIONS[question],
                    "answer": answer_of(question, count, colour),
                }
                f.write(json.dumps(row) + "\n")
    return out


def blind_ceiling(rows_file: str | Path) -> tuple[float, str]:
    """The best score a policy blind to the pictures can get on these rows: always the most
    frequent answer. Returns that share and the answer."""
    answers = Counter(str(json.loads(line)["answer"]) for line in Path(rows_file).read_text().splitlines())
    answer, n = answers.most_common(1)[0]
    return n / sum(answers.values()), answer


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", nargs="?")
    ap.add_argument("--train", type=int, default=512)
    ap.add_argument("--test", type=int, default=64)
    ap.add_argument("--size", type=int, default=56)
    ap.add_argument("--most", type=int, default=4)
    ap.add_argument("--question", choices=sorted(QUESTIONS), default="count")
    ap.add_argument("--ceiling", metavar="FILE", help="print the blind ceiling of FILE's rows and stop")
    a = ap.parse_args()
    if a.ceiling:
        share, answer = blind_ceiling(a.ceiling)
        print(f"{share:.3f} (always {answer!r})")
    elif a.out:
        print(write(a.out, a.train, a.test, a.size, a.most, question=a.question))
    else:
        ap.error("give OUT, or --ceiling FILE")
