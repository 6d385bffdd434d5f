"""`plot`, `status`'s trend line and the next steps printed when a job ends, on job folders as the
trainer leaves them (metrics.jsonl, job.json, spec.yaml) — no training needed to read a curve."""

import json
import math
import time

import pytest

from r1cloud.core.jobstore import Job, JobStore
from r1cloud.core.records import flatten
from r1cloud.jobs import curves as p


def make_job(home, name, rewards, vals=None, status="SUCCEEDED", cut_last=False, model="org/base-model"):
    store = JobStore(home)
    job = store.create(Job(name, status=status, started_at=time.time() - 60, ended_at=time.time()))
    lines = []
    for step, r in enumerate(rewards, 1):
        m = {"step": step, "reward/overall": r, "actor/pg_loss": -r}
        if vals and step in vals:
            m["val/reward_score"] = vals[step]
        lines.append(json.dumps(m))
    text = "\n".join(lines) + "\n"
    if cut_last:
        text += '{"step": 99, "reward/ov'  # a kill in the middle of a write
    (job.dir / "metrics.jsonl").write_text(text)
    (job.dir / "spec.yaml").write_text(
        f"name: {name}\nworker:\n  actor:\n    model:\n      model_path: {model}\n"
    )
    return job


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("R1CLOUD_HOME", str(tmp_path))
    return tmp_path


def test_plot_draws_runs_overlaid_in_the_terminal(cli, home):
    make_job(home, "run-a", [0.1, 0.3, 0.5, 0.7], vals={2: 0.4, 4: 0.8})
    make_job(home, "run-b", [0.2, 0.2, 0.3, 0.3], cut_last=True)
    r = cli("plot", "run-a", "run-b", "--width", "80", "--height", "10")
    assert r.exit_code == 0, r.stderr
    assert "reward/overall" in r.stdout and "val/reward_score" in r.stdout
    assert "run-a" in r.stdout and "run-b" in r.stdout
    assert "\x1b[" not in r.stdout  # no colour codes when the output is not a terminal
    assert "(no val/reward_score in run-a, run-b)" not in r.stdout  # run-a has it


def test_plot_writes_a_png_and_reads_a_folder(cli, home, tmp_path):
    job = make_job(home, "run-a", [0.1, 0.3, 0.5, 0.7])
    r = cli(
        "plot",
        str(job.dir),
        "-m",
        "reward/overall,actor/pg_loss",
        "--smooth",
        "0.6",
        "-o",
        tmp_path / "c.png",
    )
    assert r.exit_code == 0, r.stderr
    assert (tmp_path / "c.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize(
    "args,expected",
    [
        (["plot", "nope"], "no job named 'nope'"),
        (["plot", "run-a", "-m", "reward/overal"], "did you mean reward/overall"),
        (["plot", "run-a", "-o", "c.txt"], "write to a .png file"),
        (["plot", "run-a", "--smooth", "1.5"], "--smooth"),
    ],
)
def test_plot_bad_input_is_one_clear_line(cli, home, args, expected):
    make_job(home, "run-a", [0.1, 0.3])
    r = cli(*args)
    assert r.exit_code == 2 and expected in r.stderr + r.stdout, r.stderr


def test_status_shows_the_trend_and_a_finished_job_says_what_next(cli, home):
    make_job(home, "run-a", [0.1, 0.2, 0.4, 0.8], vals={1: 0.25, 4: 0.75})
    r = cli("status", "run-a")
    assert "trend      reward 0.100 ▁▂▄█ 0.800 · val 0.250 → 0.750" in r.stdout
    r = cli("logs", "-f", "run-a")
    assert r.exit_code == 0
    assert "r1cloud chat run-a --compare org/base-model" in r.stdout
    assert "r1cloud checkpoints run-a" in r.stdout and "r1cloud serve -c run-a" in r.stdout
    make_job(home, "run-b", [0.1], status="FAILED")
    r = cli("logs", "-f", "run-b")
    assert r.exit_code != 0 and "r1cloud logs run-b" in r.stderr


def test_next_steps_name_a_local_base_model_as_it_can_be_typed_here(cli, home, tmp_path, monkeypatch):
    make_job(home, "run-c", [0.1], model=str(tmp_path / "models" / "base"))
    monkeypatch.chdir(tmp_path)
    r = cli("logs", "-f", "run-c")
    assert "r1cloud chat run-c --compare models/base" in r.stdout
    assert "r1cloud eval models/base run-c" in r.stdout
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")  # not under the working directory: the whole path
    r = cli("logs", "-f", "run-c")
    assert f"r1cloud chat run-c --compare {tmp_path / 'models' / 'base'}" in r.stdout


def test_smoothing_is_tensorboards_debiased_moving_average():
    values = [1.0, 0.0, 1.0, 1.0]
    w = 0.6
    want, last = [], 0.0
    for i, v in enumerate(values):
        last = w * last + (1 - w) * v
        want.append(last / (1 - w ** (i + 1)))  # the closed form of the debias term
    assert p.smooth(values, w) == pytest.approx(want)
    assert p.smooth(values, 0) == values


def test_series_keeps_a_restarted_steps_last_value_and_skips_nan():
    rows = [{"step": 1, "k": 1.0}, {"step": 2, "k": 2.0}, {"step": 2, "k": 5.0}, {"step": 3, "k": math.nan}]
    assert p.series(rows, "k") == ([1, 2], [1.0, 5.0])
    assert p.sparkline([0, 1, 2, 3, 4, 5, 6, 7]) == "▁▂▃▄▅▆▇█"
    assert p.sparkline([2, 2]) == "▁▁"
    assert flatten({"step": 1, "reward": {"overall": 0.5}}) == {"step": 1, "reward/overall": 0.5}


def test_a_plot_draws_the_same_after_another_in_the_same_process():
    """plotext keeps state between figures: a one-panel plot once broke the next two-panel one."""
    from r1cloud.jobs import curves as p

    two = {
        "reward/overall": {"run-a": ([1, 2, 3], [0.1, 0.4, 0.7]), "run-b": ([1, 2, 3], [0.2, 0.2, 0.3])},
        "val/reward_score": {"run-a": ([2, 3], [0.4, 0.8])},
    }
    alone = p.terminal(two, 80, 10, False)
    p.terminal({"reward/overall": {"x": ([1, 2], [0.5, 0.6])}}, 60, 8, False)
    assert p.terminal(two, 80, 10, False) == alone and "val/reward_score" in alone


def test_step_axis_ticks_are_whole_round_steps():
    assert p.step_ticks(0, 30) == [0, 10, 20, 30]
    assert p.step_ticks(1, 40) == [10, 20, 30, 40]
    assert p.step_ticks(0, 2) == [0, 1, 2] and p.step_ticks(3, 3) == [3]
    assert p.step_ticks(5, 1000) == [200, 400, 600, 800, 1000]


def test_status_log_tail_reads_rays_coloured_lines_as_text(cli, home):
    job = make_job(home, "run-d", [0.1])
    (job.dir / job.log.name).write_text(
        "\x1b[36m(HybridWorker pid=7)\x1b[0m warming up\nstep 1/1 | reward 0.100\n"
    )
    r = cli("status", "run-d")
    assert "  (HybridWorker pid=7) warming up" in r.stdout and "[36m" not in r.stdout, r.stdout
