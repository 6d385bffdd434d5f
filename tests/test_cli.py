"""The CLI as a user runs it: real subprocesses, start-up imports, help, exit codes."""

import json
import os
import subprocess
import sys
from pathlib import Path

from spec_helpers import ROOT

HEAVY = ("torch", "ray", "transformers", "vllm", "sky", "datasets", "pydantic")
QUICKSTART = ROOT / "blueprints" / "quickstart.yaml"
R1CLOUD = str(Path(sys.executable).parent / "r1cloud")  # the installed console script


def run(*args, env=None, cwd=None):
    return subprocess.run(
        [sys.executable, *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        cwd=cwd,
        timeout=120,
    )


def imported_by(argv: list[str]) -> list[str]:
    code = (
        "import sys\n"
        f"sys.argv = {['r1cloud', *argv]!r}\n"
        "from r1cloud.cli import main\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        f"print('HEAVY=' + ','.join(m for m in {HEAVY!r} if m in sys.modules), file=sys.stderr)\n"
    )
    r = run("-c", code)
    line = [x for x in r.stderr.splitlines() if x.startswith("HEAVY=")][-1]
    return [m for m in line.removeprefix("HEAVY=").split(",") if m]


def test_help_and_validate_import_no_heavy_library(tmp_path, monkeypatch):
    monkeypatch.setenv("R1CLOUD_HOME", str(tmp_path))
    assert imported_by(["--help"]) == []  # the schema (pydantic) loads when a command reads a spec
    # typer itself loads pydantic to convert a command's arguments (typer/_adapters.py)
    assert imported_by(["validate", str(QUICKSTART)]) == ["pydantic"]
    assert imported_by(["jobs"]) == ["pydantic"]
    assert imported_by(["train", str(QUICKSTART), "--dry-run"]) == ["pydantic"]


def test_a_model_process_does_not_import_scikit_learn_yet_may():
    """transformers would import scikit-learn's metrics (with scipy.stats and pandas, ~3.4 s of CPU)
    in every trainer, worker and chat process; those processes hide it from that one module only
    (data/no_sklearn.py): a tokenizer and a model class load without it, a reward function may still
    import it. `import r1cloud` alone installs nothing."""
    code = (
        "import sys, r1cloud\n"
        "assert not any(type(f).__module__.startswith('r1cloud') for f in sys.meta_path)\n"
        "from r1cloud.data import no_sklearn\n"
        "no_sklearn.install(); no_sklearn.install()\n"
        "assert sum(type(f).__module__.startswith('r1cloud') for f in sys.meta_path) == 1\n"
        "from transformers import AutoModelForCausalLM, AutoTokenizer\n"
        "from transformers.generation import candidate_generator\n"
        "print('before', 'sklearn' in sys.modules, candidate_generator.is_sklearn_available())\n"
        "import sklearn.metrics\n"
        "print('after', sklearn.metrics.roc_curve([0, 1], [0.1, 0.9])[0].tolist())\n"
    )
    r = run("-c", code)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "before False False" in r.stdout and "after [0.0, 0.0, 1.0]" in r.stdout, r.stdout


def test_console_script_help_teaches():
    r = subprocess.run([R1CLOUD, "--help"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0
    assert "validate" in r.stdout and "blueprint" in r.stdout.lower()
    r = subprocess.run([R1CLOUD, "validate", "--help"], capture_output=True, text=True, timeout=60)
    assert "worker.rollout.n=8" in r.stdout and "--secret" in r.stdout and "--json" in r.stdout


def test_bad_blueprint_in_a_real_process_exits_2_without_traceback(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("worker:\n  rollout:\n    n: 0\n")
    r = subprocess.run([R1CLOUD, "validate", str(bad)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert "worker.rollout.n: 0 is not valid" in r.stderr
    assert "Traceback" not in r.stderr and r.stdout == ""


def test_usage_errors_exit_2():
    r = subprocess.run([R1CLOUD, "validate"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "Traceback" not in r.stderr


def test_json_output_is_the_resolved_spec():
    r = subprocess.run(
        [R1CLOUD, "validate", str(QUICKSTART), "--json"], capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0, r.stderr
    spec = json.loads(r.stdout)
    assert spec["name"] == "quickstart" and Path(spec["data"]["train_files"]).is_file()


def test_summary_names_what_will_run():
    r = subprocess.run([R1CLOUD, "validate", str(QUICKSTART)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    for text in (
        "HuggingFaceTB/SmolLM2-135M-Instruct",
        "8 prompts × 8 samples = 64 responses",
        "30 (trainer.max_steps)",
        "local",
        "is valid",
    ):
        assert text in r.stdout, text


def test_module_entry_point_and_version():
    r = run("-m", "r1cloud", "--version")
    assert r.returncode == 0 and r.stdout.startswith("r1cloud ")
