"""Math reward speed and agreement: r1cloud's `reward_functions/math.py` (exact check, the verdicts
that need no parser, then math-verify with its time limit on) against EasyR1's grader, mathruler,
on the same responses. Both graders' libraries are imported before either is timed.

Responses are generated from a fixed seed: answers written in many equivalent forms (fractions,
decimals, `\\dfrac`, `x = …`, units, sets, intervals) and wrong ones, all in EasyR1's format.
Prints samples/s of each, the ratio, and how often the two agree on accuracy (and where they don't,
which one the constructed truth sides with).
Usage: python benchmarks/rewards.py [--n 2000]
"""

from __future__ import annotations

import argparse
import importlib.util
import platform
import random
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def forms(rng: random.Random) -> tuple[str, str, bool]:
    """(ground truth, boxed answer, whether they are equal)."""
    a, b = rng.randint(1, 9), rng.randint(2, 12)
    kind = rng.randrange(8)
    if kind == 0:
        return (
            str(a * b),
            rng.choice([str(a * b), f"{a * b}.0", f"x = {a * b}", f"{a * b}\\text{{ cm}}"]),
            True,
        )
    if kind == 1:
        return (
            f"\\frac{{{a}}}{{{b}}}",
            rng.choice([f"\\dfrac{{{a}}}{{{b}}}", f"{a}/{b}", f"\\frac{{{2 * a}}}{{{2 * b}}}"]),
            True,
        )
    if kind == 2:
        return str(a / 4), f"\\frac{{{a}}}{{4}}", True
    if kind == 3:
        return f"\\{{{a},{b}\\}}", rng.choice([f"\\{{{b}, {a}\\}}", f"\\{{{a},{b}\\}}"]), True
    if kind == 4:
        return f"({a}, {a + b}]", rng.choice([f"({a},{a + b}]", f"\\left({a}, {a + b}\\right]"]), True
    if kind == 5:
        return f"{a}\\sqrt{{2}}", rng.choice([f"\\sqrt{{{2 * a * a}}}", f"{a}\\sqrt{{2}}"]), True
    if kind == 6:
        return str(a * b), str(a * b + rng.choice([-1, 1, 10])), False
    return f"\\frac{{{a}}}{{{b}}}", f"\\frac{{{b}}}{{{a + b}}}", False


def make(n: int) -> list[dict]:
    rng = random.Random(0)
    rows = []
    for _ in range(n):
        truth, answer, equal = forms(rng)
        rows.append(
            {
                "response": f"<think>working…</think> The answer is \\boxed{{{answer}}}",
                "ground_truth": truth,
                "equal": equal,
            }
        )
    return rows


def load_math():
    spec = importlib.util.spec_from_file_location("custom_reward_fn", ROOT / "reward_functions/math.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=2000)
    args = parser.parse_args()
    from importlib.metadata import version

    import math_verify  # noqa: F401 - imported before the clocks start, as mathruler is above
    from mathruler.grader import extract_boxed_content, grade_answer

    rows = make(args.n)
    math_reward = load_math()
    print(
        f"{args.n} responses · python {platform.python_version()} · math-verify {version('math-verify')} · mathruler {version('mathruler')}"
    )
    start = time.perf_counter()
    ours = [s["accuracy"] == 1.0 for s in math_reward.compute_score(rows)]
    t_ours = time.perf_counter() - start
    start = time.perf_counter()
    theirs = [grade_answer(extract_boxed_content(r["response"]), r["ground_truth"]) for r in rows]
    t_theirs = time.perf_counter() - start
    truth = [r["equal"] for r in rows]
    agree = sum(a == b for a, b in zip(ours, theirs, strict=True)) / len(rows)
    print(
        f"r1cloud math.py (math-verify)  {len(rows) / t_ours:9.1f} samples/s   correct {sum(a == t for a, t in zip(ours, truth, strict=True)) / len(rows):.3f}"
    )
    print(
        f"mathruler (EasyR1)             {len(rows) / t_theirs:9.1f} samples/s   correct {sum(a == t for a, t in zip(theirs, truth, strict=True)) / len(rows):.3f}"
    )
    print(f"speed ratio r1cloud/mathruler  {t_theirs / t_ours:.2f}x")
    print(f"agreement on accuracy          {agree:.3f}")
    differ = [(o, e) for o, t, e in zip(ours, theirs, truth, strict=True) if o != t]
    right = sum(o == e for o, e in differ)
    print(f"disagreements: {len(differ)}, r1cloud right in {right}, mathruler right in {len(differ) - right}")


if __name__ == "__main__":
    main()
