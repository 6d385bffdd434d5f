"""The cost estimate against a real run on this machine: calibrate on one short run of a quickstart,
estimate the whole quickstart as `validate` does (costs.plan, this machine's row), run it, compare
the estimate with the job's measured duration (its supervisor's wall time, what calibration counts).

    .venv/bin/python benchmarks/estimate_vs_run.py            # the text quickstart (~12 min here)
    .venv/bin/python benchmarks/estimate_vs_run.py --vl       # the vision-language one (~9 min)

Runs in a fresh R1CLOUD_HOME, so no earlier run calibrates it; prints one JSON line at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
LM, VLM = ROOT / ".models/SmolLM2-135M-Instruct", ROOT / ".models/SmolVLM-shapes"


def train(blueprint: Path, model: Path, name: str, *extra: str) -> float:
    """Run a job to its end; its duration as the job store recorded it."""
    cmd = [str(BIN / "r1cloud"), "train", str(blueprint), f"worker.actor.model.model_path={model}"]
    subprocess.run([*cmd, "--name", name, *extra], check=True, stdout=subprocess.DEVNULL)
    job = json.loads((Path(os.environ["R1CLOUD_HOME"]) / "jobs" / name / "job.json").read_text())
    return job["ended_at"] - job["started_at"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--vl", action="store_true", help="the vision-language quickstart")
    ap.add_argument("--short", type=int, help="steps of the calibrating run (default: val_freq + 1)")
    args = ap.parse_args()
    os.environ["R1CLOUD_HOME"] = tempfile.mkdtemp(prefix="r1-estimate-")
    offline = [str(BIN / "python"), "-m", "r1cloud.offline"]
    if args.vl:
        subprocess.run([*offline, "--vlm", str(VLM), str(LM)], check=True, stdout=subprocess.DEVNULL)
    else:
        subprocess.run([*offline, str(LM)], check=True, stdout=subprocess.DEVNULL)
    blueprint, model = (
        (ROOT / "blueprints/quickstart_vl.yaml", VLM)
        if args.vl
        else (ROOT / "blueprints/quickstart.yaml", LM)
    )
    from r1cloud.costs.plan import HERE, plan
    from r1cloud.validate import load_spec

    spec = load_spec(blueprint, [f"worker.actor.model.model_path={model}"]).spec
    short = args.short or spec.trainer.val_freq + 1  # a validation inside it and one at its end
    short_s = train(blueprint, model, "calibrate", f"trainer.max_steps={short}")
    row = next(r for r in plan(spec, Path(os.environ["R1CLOUD_HOME"]), with_prices=False).rows)
    assert row.where.startswith(HERE.split()[0]), row
    measured = train(blueprint, model, "whole")
    result = {
        "blueprint": blueprint.name,
        "calibrating_run": {"steps": short, "seconds": round(short_s, 1)},
        "steps": spec.trainer.max_steps,
        "estimated_s": round(row.total_s, 1),
        "measured_s": round(measured, 1),
        "estimate_over_measured": round(row.total_s / measured, 3),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
