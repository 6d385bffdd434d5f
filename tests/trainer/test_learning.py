"""Learning is checked: GRPO on a real pretrained model (SmolLM2-135M-Instruct, offline) raises
the reward on the quickstart's arithmetic task within a short run, and its accuracy on the held-out
questions (the reward is the accuracy alone: no format to learn instead)."""

import json

import pytest

from tinyrun import ROOT, run_of, run_trainer

pytestmark = pytest.mark.slow


def test_grpo_raises_reward_on_a_real_model(smollm2, tmp_path):
    steps = 10
    run = run_of(
        ROOT / "blueprints/quickstart.yaml",
        [
            f"worker.actor.model.model_path={smollm2}",
            f"trainer.max_steps={steps}",
            "trainer.val_freq=-1",  # before the first step and after the last
            "trainer.save_freq=-1",
        ],
        tmp_path / "run",
    )
    r = run_trainer(run, timeout=1800)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    curve = [m["reward/overall"] for m in lines if "reward/overall" in m]
    val = [m["val/accuracy_reward"] for m in lines if "val/accuracy_reward" in m]
    print("reward curve:", [round(x, 3) for x in curve], "held-out accuracy:", val)
    assert len(curve) == steps and len(val) == 2
    first, last = sum(curve[:3]) / 3, sum(curve[-3:]) / 3
    assert last > first + 0.1, f"reward did not rise: first 3 steps {first:.3f}, last 3 {last:.3f}"
    assert val[1] > val[0] + 0.15, f"held-out accuracy did not rise: {val[0]:.3f} -> {val[1]:.3f}"
