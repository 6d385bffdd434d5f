"""Property-based, one test per family of bad input a user can type, download or damage (#32's
campaign): whatever the damage, every command ends in exit 0 or 2 with short lines — never an
internal error, a traceback or a hang — and `jobs` still lists every other job, the damaged one
marked DAMAGED.

Families: damaged job records, metrics, specs, checkpoint state and adapter configs (deep nesting,
numbers too long, too large or not finite, wrong JSON types, a folder or a symlink loop where a
file belongs); numbers on the command line and in blueprints; names and URLs no file or host can
have; symlink loops among a blueprint's files."""

import json
import os
import time
from dataclasses import asdict

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from r1cloud.cli import app
from r1cloud.core.jobstore import Job
from spec_helpers import ROOT

SETTINGS = settings(
    max_examples=int(os.environ.get("HYPOTHESIS_EXAMPLES", 60)),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
DEEP_JSON = "[" * 50_000 + "]" * 50_000
LONG = "9" * 5000  # past Python's 4,300-digit limit on reading an int

damage = st.sampled_from(
    [
        DEEP_JSON, '{"a": ' + DEEP_JSON + "}", LONG, '{"step": ' + LONG + "}", "1e400", "NaN", "-Infinity",
        '{"step": 1e400, "reward/overall": NaN}', '{"step": 1000000000000000000000000000000, "reward/overall": 1}',
        '{"step": 1, "reward/overall": ' + "9" * 400 + "}", '{"step": -5}', '{"step": true}', "[1, 2]", '"text"',
        "null", "5", "{broken", "\x00\x01\xff", "", '{"r": 0}', '{"r": "2", "lora_alpha": []}', '{"total_steps": 1e400}',
        '{"metrics": {"reward/overall": 1e400, "val/reward_score": "x"}}', "a: " + "[" * 3000 + "]" * 3000,
        "DIR", "LOOP",
    ]
)  # fmt: skip
record_fields = st.sampled_from(
    ["created_at", "started_at", "ended_at", "pid", "pid_started", "nodes", "attempts", "exit_code"]
)
bad_numbers = st.sampled_from([1e300, float("nan"), float("inf"), -1.0, 10**30, -(10**30), 2**63])
files = st.sampled_from(
    [
        "job.json", "metrics.jsonl", "spec.yaml", "trainer.json", "train.log",
        "checkpoints/global_step_1/trainer_state.json", "checkpoints/global_step_1/actor/adapter_config.json",
        "checkpoints/checkpoint_tracker.json", "checkpoints",
    ]
)  # fmt: skip
commands = st.sampled_from(["status", "logs", "checkpoints", "plot", "stop", "merge", "eval"])


def _good(name: str) -> dict:
    now = time.time()
    return asdict(Job(name, status="SUCCEEDED", created_at=now, started_at=now, ended_at=now + 5))


def _write(path, content: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if content == "DIR":
        path.mkdir(exist_ok=True)
    elif content == "LOOP":
        path.symlink_to(path)
    else:
        path.write_bytes(content.encode("utf-8", "surrogateescape"))


def _run(*argv) -> tuple[int, str]:
    """The CLI in-process as `r1cloud` runs it (main's handler: a BucketError is one line, exit 2)."""
    from r1cloud.checkpoint.store import BucketError

    tick = time.monotonic()
    r = CliRunner().invoke(app, [str(a) for a in argv])
    said = r.stdout + r.stderr
    code = r.exit_code
    if isinstance(r.exception, BucketError):
        code, said = 2, said + f"error: {r.exception.args[0]}"
    elif r.exception is not None and not isinstance(r.exception, SystemExit):
        code, said = 1, said + f"internal error: {type(r.exception).__name__}: {r.exception}"
    assert time.monotonic() - tick < 30, argv
    return code, said


def _fine(code: int, said: str, argv, verbatim: bool = False) -> None:
    """Exit 0 or 2, no internal error, and (unless it prints a log verbatim) short lines."""
    assert code in (0, 2), (argv, code, said[-800:])
    assert "internal error" not in said and "Traceback" not in said, (argv, said[-800:])
    assert verbatim or all(len(line) < 500 for line in said.splitlines()), (argv, said[-800:])


@pytest.fixture
def home(tmp_path_factory, monkeypatch):
    def make():
        root = tmp_path_factory.mktemp("home")
        monkeypatch.setenv("R1CLOUD_HOME", str(root))
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
        monkeypatch.chdir(root)
        good = root / "jobs" / "good"
        _write(good / "job.json", json.dumps(_good("good")))
        _write(good / "metrics.jsonl", '{"step": 1, "reward/overall": 0.5}\n')
        # what eval and validate are pointed at: a row, a reward that scores it, the quickstart
        (root / "d.jsonl").write_text('{"prompt": "1+1", "answer": "2"}\n')
        (root / "r.py").write_text(
            "def score(reward_inputs):\n    return [{'overall': 1.0} for _ in reward_inputs]\n"
        )
        (root / "q.yaml").write_text(
            (ROOT / "blueprints" / "quickstart.yaml").read_text().replace("../", f"{ROOT}/")
        )
        return root

    return make


@SETTINGS
@given(where=files, content=damage, command=commands)
def test_any_damaged_file_of_a_job_is_one_line_and_the_others_are_listed(home, where, content, command):
    root = home()
    job = root / "jobs" / "hurt"
    _write(job / "job.json", json.dumps(_good("hurt")))
    if where != "job.json" or content not in ("DIR", "LOOP"):
        (job / where).unlink(missing_ok=True) if (job / where).is_file() else None
        _write(job / where, content)
    argv = {
        "merge": ["merge", "hurt", "--out", root / "out"],
        "eval": ["eval", "hurt", "--reward", "nope.py"],
    }
    argv = argv.get(command, [command, "hurt"])
    _fine(*_run(*argv), argv, verbatim=where == "train.log")  # a log is shown as it is
    code, said = _run("jobs")
    _fine(code, said, ["jobs"])
    rows = {line.split()[0]: line for line in said.splitlines()[1:] if line.strip()}
    assert "SUCCEEDED" in rows.get("good", ""), said
    assert "hurt" in rows, said  # listed: as it is, or as DAMAGED


@SETTINGS
@given(field=record_fields, value=bad_numbers)
def test_a_record_with_a_number_out_of_range_is_damaged_not_a_crash(home, field, value):
    root = home()
    record = {**_good("hurt"), field: value}
    _write(root / "jobs" / "hurt" / "job.json", json.dumps(record))
    for argv in (["jobs"], ["status", "hurt"], ["stop", "hurt"], ["logs", "hurt"]):
        _fine(*_run(*argv), argv)
    code, said = _run("jobs")
    assert "DAMAGED" in said and f"{field} of the wrong type or out of range" in said, said


numbers = st.sampled_from(
    [str(10**30), str(-(10**30)), "0", "-1", "inf", "-inf", "nan", "1e308", "x", "", LONG, "2.5"]
)
options = st.sampled_from(
    [
        ["chat", "http://127.0.0.1:9/v1", "hi", "--max-tokens"],
        ["chat", "http://127.0.0.1:9/v1", "hi", "--temperature"],
        ["eval", "some/model", "--data", "d.jsonl", "--reward", "r.py:score", "--n"],
        ["eval", "some/model", "--data", "d.jsonl", "--reward", "r.py:score", "--temperature"],
        ["eval", "some/model", "--data", "d.jsonl", "--reward", "r.py:score", "--max-tokens"],
        ["eval", "some/model", "--data", "d.jsonl", "--reward", "r.py:score", "--limit"],
        ["serve", "-c", "nothing", "--port"],
        ["serve", "-c", "nothing", "--max-model-len"],
        ["serve", "-c", "nothing", "--ready-timeout"],
        ["plot", "good", "--width"],
        ["plot", "good", "--height"],
        ["plot", "good", "--smooth"],
        ["logs", "good", "--tail"],
        ["stop", "nothing", "--grace"],
        ["train", "Q", "--dry-run", "--accels"],
        ["train", "Q", "--dry-run", "--nodes"],
        ["try", "Q", "--n"],
    ]
)


@SETTINGS
@given(option=options, value=numbers)
def test_any_number_for_any_option_is_refused_or_used_never_a_crash(home, option, value):
    root = home()
    q = root / "q.yaml"
    argv = [str(q) if a == "Q" else a for a in option] + [value]
    if option[0] == "try" and value in ("1", "2.5"):
        return  # a real pre-flight on the quickstart's model: not this test's business
    code, said = _run(*argv)
    _fine(code, said, argv)


blueprint_numbers = st.sampled_from(
    [str(10**400), str(-(10**400)), str(2**63), ".inf", "-.inf", ".nan", "1e400", LONG]
)
keys = st.sampled_from(
    [
        "data.seed", "worker.rollout.seed", "worker.rollout.n", "trainer.max_steps", "trainer.save_freq",
        "data.rollout_batch_size", "data.max_prompt_length", "worker.actor.optim.lr", "algorithm.kl_coef",
        "worker.rollout.val_override_config.seed", "worker.rollout.val_override_config.temperature",
        "resources.accelerators.H100", "resources.num_nodes", "trainer.n_gpus_per_node", "worker.reward.timeout",
        "worker.reward.reward_function_kwargs.weight", "worker.rollout.max_model_len",
    ]
)  # fmt: skip


@SETTINGS
@given(key=keys, value=blueprint_numbers, in_file=st.booleans())
def test_any_huge_or_non_finite_number_in_a_blueprint_is_one_line_naming_its_key(home, key, value, in_file):
    root = home()
    q = root / "q.yaml"
    bp, extra = q, [f"{key}={value}"]
    if in_file:  # written as YAML in the blueprint, over the quickstart as its base (config=)
        parts = key.split(".")
        lines = [f"{'  ' * i}{p}:" for i, p in enumerate(parts[:-1])]
        bp, extra = root / "bp.yaml", [f"config={q}"]
        bp.write_text("\n".join([*lines, f"{'  ' * (len(parts) - 1)}{parts[-1]}: {value}"]) + "\n")
    code, said = _run("validate", bp, *extra)
    _fine(code, said, [key, value[:20]])
    if value in (LONG, str(10**400), str(-(10**400))):
        assert code == 2 and key.rsplit(".", 1)[0] in said, said


names = st.one_of(
    st.sampled_from(
        ["a" * 300, "a b", "http://local host:1/v1", "http://[::1", "s3://", "../..", "-x", "~nobody9/m"]
    ),
    st.text(min_size=1, max_size=40).filter(lambda s: "\x00" not in s),
)
name_commands = st.sampled_from(
    [["status"], ["logs"], ["checkpoints"], ["plot"], ["merge"], ["serve", "-c"], ["chat"], ["stop"],
     ["eval", "--reward", "r.py:score", "--data", "d.jsonl"]]
)  # fmt: skip


@SETTINGS
@given(command=name_commands, name=names)
def test_any_name_or_url_is_one_line(home, command, name):
    home()
    argv = (
        [command[0], *command[1:2], name, *command[2:]]
        if command[0] == "serve"
        else [command[0], name, *command[1:]]
    )
    if command[0] == "chat":
        argv.append("hi")
    if command[0] == "serve":
        argv += ["--port", "9", "--ready-timeout", "1"]  # never waits on a server that starts
    code, said = _run(*argv)
    _fine(code, said, argv)


@pytest.mark.parametrize("key", ["data.format_prompt", "worker.reward.reward_function", "data.train_files",
                                 "worker.actor.model.model_path", "data.image_dir"])  # fmt: skip
def test_a_symlink_loop_where_a_file_belongs_is_one_line(home, key):
    root = home()
    (root / "loop").symlink_to(root / "loop")
    q = root / "q.yaml"
    code, said = _run("validate", q, f"{key}={root / 'loop'}")
    _fine(code, said, [key])
    assert code == 2 and key in said, said
    code, said = _run("validate", root / "loop")
    assert code == 2 and "loop" in said, said
