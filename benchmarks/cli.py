"""CLI start-up: `r1cloud --help`, `validate`, `jobs` and `checkpoints` against `python -c pass` and
SkyPilot's `sky --help` (when installed), in one run.

Alternates the commands for N rounds (these machines are noisy) and prints medians and ratios.
`jobs` runs on an empty job store and `checkpoints` lists a folder of three small checkpoints in
r1cloud's layout, both made in a temporary folder.
Usage: python benchmarks/cli.py [--rounds 15]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def checkpoint_folder(root: Path) -> Path:
    """Three checkpoints as the trainer leaves them (state file, DCP metadata, a merged config)."""
    for step in (1, 2, 3):
        ck = root / f"global_step_{step}"
        (ck / "actor").mkdir(parents=True)
        (ck / "actor" / ".metadata").write_bytes(b"x" * 1024)
        (ck / "huggingface").mkdir()
        (ck / "huggingface" / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
        metrics = {"reward/overall": 0.1 * step, "val/reward_score": 0.2 * step}
        (ck / "trainer_state.json").write_text(json.dumps({"step": step, "metrics": metrics}))
    return root


def commands(tmp: Path) -> dict[str, list[str]]:
    sky = BIN / "sky"
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
        "r1cloud checkpoints FOLDER": [
            str(BIN / "r1cloud"),
            "checkpoints",
            str(checkpoint_folder(tmp / "checkpoints")),
        ],
        **({"sky --help": [str(sky), "--help"]} if sky.exists() else {}),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-cli-"))
    os.environ["R1CLOUD_HOME"] = str(tmp / "home")  # an empty job store
    cmds = commands(tmp)
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
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
