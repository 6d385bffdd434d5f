"""Writes a picture-question data set (deterministic), EasyR1-style: rows {"images": [path],
"problem": "<image>…?", "answer": …} in train.jsonl / test.jsonl, PNGs under images/.

Each picture holds 1–`most` shapes (squares or discs) of one colour (red, green or blue) on
white. `--question count` asks how many shapes there are, `--question colour` what colour they
are. The answer is in the picture only: a policy blind to the image can do no better than always
naming the most frequent answer (about 1/`most` for counts, 1/3 for colours, the answers being
uniform). Usage: python data/shapes/generate.py OUT [--question count|colour] [--train N]
[--test N] [--size PX] [--most K]

This folder ships the output of `generate.py data/shapes --train 1024 --test 64 --size 96`
(blueprints/quickstart_vl.yaml's data); the tests make their own, smaller sets.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

COLOURS = {"red": (220, 30, 30), "blue": (30, 60, 220), "green": (30, 160, 60)}


QUESTIONS = {
    "count": "<image>How many shapes are in the picture?",
    "colour": "<image>What colour are the shapes?",
}


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
    for split, n in (("train", train), ("test", test)):
        with open(out / f"{split}.jsonl", "w") as f:
            for i in range(n):
                count, colour = rng.randint(1, most), rng.choice(sorted(COLOURS))
                name = f"images/{split}-{i:05d}.png"
                picture(rng, count, size, colour).save(out / name)
                answer = str(count) if question == "count" else colour
                row = {"images": [name], "problem": QUESTIONS[question], "answer": answer}
                f.write(json.dumps(row) + "\n")
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--train", type=int, default=512)
    ap.add_argument("--test", type=int, default=64)
    ap.add_argument("--size", type=int, default=56)
    ap.add_argument("--most", type=int, default=4)
    ap.add_argument("--question", choices=sorted(QUESTIONS), default="count")
    a = ap.parse_args()
    print(write(a.out, a.train, a.test, a.size, a.most, question=a.question))
