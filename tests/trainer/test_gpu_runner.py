"""benchmarks/gpu.py, the runner for a lent GPU machine, on CPU with tiny shapes (`--quick`): every
section runs and every check passes here, so a GPU's minutes go to measuring, not to mending it.
Ray cannot be imported, as on that machine (an import of it cost a GPU call once)."""

import json
import os
import subprocess
import sys

from tinyrun import ROOT

NO_RAY = f"""import runpy, sys
sys.modules["ray"] = None  # the GPU machine has no Ray
sys.argv[0] = {str(ROOT / "benchmarks" / "gpu.py")!r}
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def test_the_gpu_runner_passes_every_check_on_cpu(tmp_path):
    r = subprocess.run(
        [sys.executable, "-c", NO_RAY, "--quick", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-3000:]
    report = json.loads((tmp_path / "gpu.json").read_text())
    checks = {c["check"].split(":")[0].split(" (")[0]: c for c in report["checks"]}
    assert all(c["ok"] for c in report["checks"]), report["checks"]
    for name in (
        "GRPO through the trainer",
        "weight sync",
        "sampling log-probs",
        "resume",
        "fp32 packed log-probs",
        "LoRA",
        "VLM",
        "offload",
        "Ulysses' code path at world 1",
        "multi-turn",
        "video",
        "attention",
        "actor update measured at every shape",
    ):
        assert any(k.startswith(name) for k in checks), (name, list(checks))
    text = (tmp_path / "report.md").read_text()
    assert "| segments | flex | varlen | varlen-unshared |" in text and "| model | checkpointing |" in text
