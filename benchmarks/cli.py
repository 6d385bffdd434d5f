"""CLI start-up: `r1cloud --help`, `validate` and `jobs` against `python -c pass`, in one run.

Alternates the commands for N rounds (these machines are noisy) and prints medians and ratios.
Usage: python benchmarks/cli.py [--rounds 15]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def commands() -> dict[str, list[str]]:
    return {
        "python -c pass": [sys.executable, "-c", "pass"],
        "r1cloud --help": [str(BIN / "r1cloud"), "--help"],
        "r1cloud validate quickstart": [
            str(BIN / "r1cloud"),
            "validate",
            str(ROOT / "blueprints/quickstart.yaml"),
        ],
        "r1cloud validate math12k_grpo": [
            str(BIN / "r1cloud"),
            "validate",
            str(ROOT / "blueprints/math12k_grpo.yaml"),
        ],
        "r1cloud jobs": [str(BIN / "r1cloud"), "jobs"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    cmds = commands()
    times: dict[str, list[float]] = {k: [] for k in cmds}
    for _ in range(args.rounds):
        for name, cmd in cmds.items():
            t = time.perf_counter()
            subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
            times[name].append(time.perf_counter() - t)
    print(
        f"CLI start-up, {args.rounds} alternating rounds; Python {platform.python_version()}, {platform.machine()}"
    )
    base = statistics.median(times["python -c pass"])
    print(f"{'command':32} {'median ms':>10} {'vs python -c pass':>18}")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"{name:32} {med * 1000:10.1f} {med / base:17.2f}x")


if __name__ == "__main__":
    main()
