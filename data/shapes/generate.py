"""Writes an image-counting data set (deterministic), EasyR1-style: rows {"images": [path],
"problem": "<image>How many …?", "answer": "3"} in train.jsonl / test.jsonl, PNGs under images/.

Each picture holds 1–`most` shapes (squares or discs) of one colour on white; the question asks
how many there are. The answer is in the picture only: a policy blind to the image can do no
better than always naming the most frequent count (1/`most` of the answers, the counts being
uniform). Usage: python data/shapes/generate.py OUT [--train N] [--test N] [--size PX] [--most K]
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

COLOURS = {"red": (220, 30, 30), "blue": (30, 60, 220), "green": (30, 160, 60)}


def picture(rng: random.Random, count: int, size: int):
    from PIL import Image, ImageDraw

    img = Image.new("RGB", (size, size), (255, 255, 255))
    draw = ImageDraw.Draw(img)
    colour = COLOURS[rng.choice(sorted(COLOURS))]
    cell = size // 3  # a 3×3 grid: shapes never overlap
    for slot in rng.sample(range(9), count):
        x, y = (slot % 3) * cell, (slot // 3) * cell
        r = cell // 2 - max(2, cell // 8)
        cx, cy = x + cell // 2, y + cell // 2
        box = (cx - r, cy - r, cx + r, cy + r)
        (draw.rectangle if rng.random() < 0.5 else draw.ellipse)(box, fill=colour)
    return img


def write(
    out: str | Path, train: int = 512, test: int = 64, size: int = 56, most: int = 4, seed: int = 1
) -> Path:
    out = Path(out)
    (out / "images").mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    for split, n in (("train", train), ("test", test)):
        with open(out / f"{split}.jsonl", "w") as f:
            for i in range(n):
                count = rng.randint(1, most)
                name = f"images/{split}-{i:05d}.png"
                picture(rng, count, size).save(out / name)
                row = {
                    "images": [name],
                    "problem": "<image>How many shapes are in the picture?",
                    "answer": str(count),
                }
                f.write(json.dumps(row) + "\n")
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--train", type=int, default=512)
    ap.add_argument("--test", type=int, default=64)
    ap.add_argument("--size", type=int, default=56)
    ap.add_argument("--most", type=int, default=4)
    a = ap.parse_args()
    print(write(a.out, a.train, a.test, a.size, a.most))
