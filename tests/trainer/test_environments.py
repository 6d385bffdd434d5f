"""Environments through the trainer as a user starts it (`python -m r1cloud.trainer`, Ray, two FSDP
workers, the hf engine, the tiny random model): a TRL-shaped file and a gym-shaped file from
envs/, each run for real, and a row whose reset fails ends the run in one line naming the row.

The tiny model never calls a tool (and rarely ends a turn), so what is checked is what does not
depend on its answers: the environment's reward reaches the step's reward (added to the reward
function's, or alone), the reset text reaches each episode's prompt. How a gym episode goes on
turn after turn is checked with a real model in test_agent_episodes.py."""

from __future__ import annotations

import json

import pytest

from tinyrun import ROOT, r1, run_trainer

pytestmark = pytest.mark.slow


def rows(path, items: list[dict]) -> str:
    path.write_text("".join(json.dumps({"problem": "Go.", "answer": "", **x}) + "\n" for x in items))
    return str(path)


def metrics(run) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


def test_a_trl_environment_rewards_episodes_beside_the_reward_function(make_run, tmp_path, tiny_model):
    data = rows(tmp_path / "count.jsonl", [{"target": 0}, {"target": 2}] * 2)
    run = make_run(
        "worker.rollout.multi_turn.enable=true",
        f"worker.rollout.multi_turn.environment={ROOT}/envs/counter.py:Counter",
        "worker.rollout.multi_turn.max_turns=2",
        f"data.train_files={data}",
        f"data.val_files={data}",
        "data.format_prompt=null",
        "data.max_prompt_length=160",
        "trainer.max_steps=1",
        "trainer.val_before_train=true",
        "trainer.val_generations_to_log=2",
        "trainer.logger=[console,file]",
    )
    r = run_trainer(run)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    (val, step) = metrics(run)[:2]
    # reaching 0 needs no call: half the rows score 1 from get_reward(), whatever the model says
    assert step["reward/environment"] == pytest.approx(0.5)
    assert step["reward/overall"] == pytest.approx(step["reward/environment"] + step["reward/digits"])
    assert val["val/environment_reward"] == pytest.approx(0.5)
    shown = [json.loads(x) for x in (run / "generations.jsonl").read_text().splitlines()]
    assert all("bring the counter from 0 to" in g["prompt"] for g in shown)  # reset's text, in place
    # `eval` plays the same episodes as the trainer's validation: the base model, greedy, the same figures
    r = r1("eval", tiny_model, "--blueprint", run / "spec.yaml", "--engine", "hf", "--out", tmp_path / "e")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    (summary,) = json.loads((tmp_path / "e" / "summary.json").read_text())["targets"]
    assert summary["all"]["reward/environment"][0] == pytest.approx(val["val/environment_reward"])
    assert summary["all"]["reward/overall"][0] == pytest.approx(val["val/overall_reward"])
    assert summary["all"]["turns"][0] >= 1 and "tool_error_rate" in summary["all"]


def test_a_gym_environment_alone_gives_the_reward_and_a_failing_reset_names_its_row(make_run, tmp_path):
    train = rows(tmp_path / "guess.jsonl", [{"secret": 7}, {"secret": 3}] * 2)
    bad = rows(tmp_path / "bad.jsonl", [{"secret": 7}, {"secret": 3}, {"number": 1}, {"secret": 5}])
    run = make_run(
        "worker.rollout.multi_turn.enable=true",
        f"worker.rollout.multi_turn.environment={ROOT}/envs/guess_number.py:GuessNumber",
        "worker.rollout.multi_turn.max_turns=3",
        "worker.reward.reward_function=null",
        "data.format_prompt=null",
        "data.max_prompt_length=64",
        "data.max_response_length=48",
        "trainer.max_steps=2",
        f"data.train_files={train}",
        f"data.val_files={bad}",  # validated after step 2: its row 2 has no secret
        "trainer.val_freq=2",
    )
    r = run_trainer(run)
    (step,) = metrics(run)  # step 1 ran, and its metrics were kept
    assert "reward/digits" not in step and step["reward/overall"] == step["reward/environment"]
    assert step["agent/turns"] >= 1 and step["reward/errors"] == 0
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-3000:]
    (said,) = [
        x for x in r.stderr.splitlines() if x.startswith("error:")
    ]  # one line (the row's secret: None)
    assert said.startswith("error: worker.rollout.multi_turn.environment: reset failed on ")
    assert said.endswith(
        "bad.jsonl: row 2: TypeError: int() argument must be a string, a bytes-like object or a real number, "
        "not 'NoneType'"
    )
    assert "Traceback" not in r.stderr
