"""EasyR1's launch scripts taken as they are: all 20 examples of EasyR1 main (b44b311) in
tests/fixtures/easyr1/examples validate unchanged, from EasyR1's repository root as its README
runs them (REFUSED would list one r1cloud cannot run yet, with its key and line: none is)."""

import json
import time
from pathlib import Path

import pytest

from r1cloud.spec import normalise_name

EASYR1 = Path(__file__).parent / "fixtures" / "easyr1"
SCRIPTS = sorted(p.relative_to(EASYR1) for p in EASYR1.glob("examples/**/*.sh"))
REFUSED: dict[str, tuple[str, int]] = {}  # script -> (key, line): what EasyR1 sets that r1cloud cannot do yet


def test_the_fixtures_are_easyr1s_twenty_examples():
    assert len(SCRIPTS) == 20


def _set_in(script: Path, key: str) -> str | None:
    """The value the script's command line gives `key` (as written, before expansion)."""
    for line in script.read_text().splitlines():
        word = line.strip().rstrip("\\").strip()
        if word.startswith(f"{key}="):
            return word.partition("=")[2]
    return None


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.stem)
def test_easyr1_example_script_validates_unchanged(script, cli, monkeypatch):
    monkeypatch.chdir(EASYR1)
    r = cli("validate", script, "--json")
    if str(script) in REFUSED:
        key, line = REFUSED[str(script)]
        problems = [x for x in r.stderr.splitlines() if "✗" in x]
        assert r.exit_code == 2 and len(problems) == 1, r.stderr
        assert problems[0].strip().startswith(f"✗ {key}:") and problems[0].endswith(f"({script}:{line})")
        assert "Traceback" not in r.stderr
        return
    assert r.exit_code == 0, r.stderr
    spec = json.loads(r.stdout)
    text = (EASYR1 / script).read_text()
    # ${MODEL_PATH} expanded from the script's own assignment
    model = spec["worker"]["actor"]["model"]["model_path"]
    assert "$" not in model and (model in text or "MODEL_PATH" not in text)
    experiment = _set_in(EASYR1 / script, "trainer.experiment_name")
    if experiment and "$" not in experiment:
        assert spec["name"] == normalise_name(experiment)
        assert spec["trainer"]["experiment_name"] == experiment  # the trackers' run name, as written
    # every key=value the command line sets reaches the spec (spot-checked where it is a plain scalar)
    for key in ("data.train_files", "worker.rollout.tensor_parallel_size", "trainer.n_gpus_per_node"):
        written = _set_in(EASYR1 / script, key)
        if written is not None:
            value = spec
            for part in key.split("."):
                value = value[part]
            assert str(value) == written, key


def test_script_variables_exports_and_dates(cli, monkeypatch):
    monkeypatch.chdir(EASYR1)
    gui = "examples/qwen2_5_vl_3b_android_gui_grpo.sh"  # EXPERIMENT_NAME=${EXPERIMENT_NAME:-…_$(date …)}
    r = cli("validate", gui, "--json")
    assert r.exit_code == 0, r.stderr
    spec = json.loads(r.stdout)
    assert spec["name"].startswith("qwen2-5-vl-3b-android-gui-grpo-" + time.strftime("%Y%m%d"))
    assert (
        spec["trainer"]["logger"] == ["console", "wandb"] and spec["worker"]["rollout"]["limit_images"] == 1
    )
    r = cli("validate", gui, "--json", env={"EXPERIMENT_NAME": "gui-run"})  # the environment's value wins
    assert json.loads(r.stdout)["name"] == "gui-run"
    # `export PYTHONUNBUFFERED=1` becomes the job's environment; the command line wins over the script
    r = cli("validate", "examples/baselines/qwen2_5_vl_3b_clevr.sh", "trainer.n_gpus_per_node=4", "--json")
    spec = json.loads(r.stdout)
    assert spec["envs"] == {"PYTHONUNBUFFERED": "1"} and spec["trainer"]["n_gpus_per_node"] == 4
    r = cli(
        "validate", "examples/qwen2_5_vl_7b_geo3k_swanlab.sh", "--json"
    )  # [console,swanlab], quotes removed
    assert json.loads(r.stdout)["trainer"]["logger"] == ["console", "swanlab"]


@pytest.mark.parametrize(
    "body,expected,code",
    [
        ('python3 -m verl.trainer.main config=examples/config.yaml trainer.experiment_name=$(hostname)',
         "runs a command", 2),
        ("python3 -m verl.trainer.main config=examples/config.yaml worker.actor.model.model_path=${NOPE_PATH}",
         "$NOPE_PATH is not set", 2),
        ("echo hello", "has no `python3 -m verl.trainer.main", 2),
        ("pip install mathruler\npython3 -m verl.trainer.main config=examples/config.yaml",
         "`pip install mathruler` is not run", 0),
        ("python3 -m verl.trainer.main config=examples/config.yaml \\\n    data.rollout_batch_size=many",
         "data.rollout_batch_size", 2),
    ],
    ids=["command-substitution", "unset-variable", "no-trainer-line", "other-command", "bad-value-names-line"],
)  # fmt: skip
def test_a_script_r1cloud_cannot_read_is_one_line(cli, monkeypatch, tmp_path, body, expected, code):
    monkeypatch.chdir(EASYR1)
    script = tmp_path / "run.sh"
    script.write_text(f"#!/bin/bash\nset -x\n{body}\n")
    r = cli("validate", script)
    assert r.exit_code == code, r.stderr
    lines = [x for x in r.stderr.splitlines() if expected in x]
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    if code == 2 and "rollout_batch_size" in expected:
        assert lines[0].endswith("run.sh:4)")  # the continued line that sets it


def test_bash_quoting_comments_arguments_and_order_as_bash_reads_them(cli, monkeypatch, tmp_path):
    """What launch scripts write around their command: trailing comments (with $ or backquotes in
    them), a commented-out alternative, the script's arguments (none: `${1:-default}` takes the
    default, `"$@"` is no word), `\\$` escaped, assignments in order on one line, an unquoted
    variable holding several overrides, and other commands (named, never expanded)."""
    monkeypatch.chdir(EASYR1)
    monkeypatch.delenv("PROJECT_DIR", raising=False)
    script = tmp_path / "run.sh"
    script.write_text(
        "#!/bin/bash\n"
        "MODEL_PATH=${1:-Qwen/Qwen2.5-0.5B-Instruct}  # or $LOCAL_MODEL, see `ls models`\n"
        "X=1 Y=p$X\n"
        'EXTRA="trainer.max_steps=3 trainer.save_freq=-1"\n'
        "cd $PROJECT_DIR\n"
        "python3 -m verl.trainer.main config=examples/config.yaml \\\n"
        "    worker.actor.model.model_path=${MODEL_PATH} \\\n"
        "    trainer.project_name=$Y \\\n"
        "    trainer.experiment_name=run\\$HOME \\\n"
        '    trainer.logger="[\'console\']" $EXTRA "$@"  # trailing words\n'
    )
    r = cli("validate", script, "--json")
    assert r.exit_code == 0, r.stderr
    spec = json.loads(r.stdout)
    assert spec["worker"]["actor"]["model"]["model_path"] == "Qwen/Qwen2.5-0.5B-Instruct"
    assert spec["trainer"]["project_name"] == "p1" and spec["trainer"]["experiment_name"] == "run$HOME"
    assert spec["trainer"]["logger"] == ["console"] and spec["trainer"]["max_steps"] == 3
    assert "`cd $PROJECT_DIR` is not run" in r.stderr
    script.write_text("python3 -m verl.trainer.main config=examples/config.yaml trainer.project_name=$1\n")
    r = cli("validate", script)
    assert r.exit_code == 2 and "$1 is the script's argument 1, and r1cloud runs it with none" in r.stderr
