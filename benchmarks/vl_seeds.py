"""The vision-language quickstart over several seeds, through the real CLI and trainer: does it
learn every time? Each seed is one `r1cloud train blueprints/quickstart_vl.yaml` with
`data.seed` and `worker.rollout.seed` set to it (the data order and the engine's samples), on the
offline SmolVLM-style model, as `scripts/quickstart --vl` runs it.

    .venv/bin/python benchmarks/vl_seeds.py                       # seeds 1-5 (~6 minutes each, 2 cores)
    .venv/bin/python benchmarks/vl_seeds.py KEY=VALUE ... --seeds 1 2   # blueprint overrides, other seeds

Prints, for each seed, the held-out reward at every validation, the last one and the wall time
(start-up included), then the blind ceiling (the most frequent answer's share of the test rows:
the best a policy that does not look can do) and how many seeds end 0.20 or more above it (the
quickstart's promise is at least 4 of 5; the exit code is 1 below that), and the curve of the median
seed (by last reward, then mean reward over the run) with the spread of all seeds.
Jobs go to a fresh R1CLOUD_HOME (printed); one JSON line at the end holds it all.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
LM, VLM = ROOT / ".models/SmolLM2-135M-Instruct", ROOT / ".models/SmolVLM-shapes"
BLUEPRINT = ROOT / "blueprints/quickstart_vl.yaml"
MARGIN = 0.20  # above the blind ceiling


def generator():
    spec = importlib.util.spec_from_file_location("shapes_generate", ROOT / "data/shapes/generate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def val_curve(job: Path) -> list[tuple[int, float]]:
    from r1cloud.jobs import curves as plot

    return list(zip(*plot.series(plot.read_rows(str(job)), "val/reward_score"), strict=True))


def run(seed: int, overrides: list[str]) -> dict:
    name = f"vl-seed-{seed}"
    cmd = [str(BIN / "r1cloud"), "train", str(BLUEPRINT), f"worker.actor.model.model_path={VLM}"]
    cmd += [f"data.seed={seed}", f"worker.rollout.seed={seed}", *overrides, "--name", name]
    t = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - t
    curve = val_curve(Path(os.environ["R1CLOUD_HOME"]) / "jobs" / name)
    return {"seed": seed, "curve": curve, "final": curve[-1][1], "wall_s": round(wall, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4, 5])
    ap.add_argument("overrides", nargs="*", help="blueprint overrides, as `r1cloud train` takes them")
    args = ap.parse_args()
    os.environ["R1CLOUD_HOME"] = tempfile.mkdtemp(prefix="r1-vl-seeds-")
    print(f"jobs in {os.environ['R1CLOUD_HOME']}")
    offline = [str(BIN / "python"), "-m", "r1cloud.offline", "--vlm", str(VLM), str(LM)]
    subprocess.run(offline, check=True, stdout=subprocess.DEVNULL, env={**os.environ, "TQDM_DISABLE": "1"})
    from r1cloud.validate import load_spec

    spec = load_spec(BLUEPRINT, [f"worker.actor.model.model_path={VLM}", *args.overrides]).spec
    ceiling, answer = generator().blind_ceiling(spec.data.val_files)
    print(f"blind ceiling {ceiling:.3f} (always {answer!r}); a seed passes at {ceiling + MARGIN:.3f} or more")
    runs = []
    for seed in args.seeds:
        r = run(seed, args.overrides)
        runs.append(r)
        points = " ".join(f"{v:.3f}" for _, v in r["curve"])
        print(f"seed {seed}: val {points}; last {r['final']:.3f}; {r['wall_s'] / 60:.1f} min", flush=True)
    passed = sum(r["final"] >= ceiling + MARGIN for r in runs)
    finals = [r["final"] for r in runs]
    by_reward = sorted(runs, key=lambda r: (r["final"], statistics.mean(v for _, v in r["curve"])))
    median = by_reward[len(runs) // 2]
    print(f"{passed} of {len(runs)} seeds at the blind ceiling + {MARGIN:.2f} or more")
    print(f"last val: median {statistics.median(finals):.3f}, min {min(finals):.3f}, max {max(finals):.3f}")
    steps = [s for s, _ in median["curve"]]
    print(
        f"median seed ({median['seed']}) by step: " + ", ".join(f"{s}: {v:.3f}" for s, v in median["curve"])
    )
    ranges = []
    for step in steps:
        values = [dict(r["curve"])[step] for r in runs if step in dict(r["curve"])]
        ranges.append(f"{step}: {min(values):.3f}-{max(values):.3f}")
    print("all seeds by step (min-max): " + ", ".join(ranges))
    print(json.dumps({"ceiling": ceiling, "margin": MARGIN, "passed": passed, "runs": runs}))
    if passed < 0.8 * len(runs):  # the quickstart's promise: 4 of 5
        sys.exit(1)


if __name__ == "__main__":
    main()
