"""Whole training runs through the node entrypoint: 3 GRPO steps with 2 FSDP2 workers for each
rollout engine; a run killed with SIGKILL after step 2 that resumes identically; a resume on a
different number of workers."""

import json
import math
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from safetensors.torch import load_file

from tinyrun import run_trainer

DETERMINISTIC = (
    "reward/overall",
    "reward/digits",
    "response_length/mean",
    "prompt_length/mean",
    "actor/pg_loss",
    "actor/kl_loss",
    "actor/entropy_loss",
    "actor/grad_norm",
)


def metrics(run):
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def checkpoint_weights(path):
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    out = path.parent / "full.pt"
    dcp_to_torch_save(path, out)
    return torch.load(out, weights_only=False)["model"]


@pytest.mark.parametrize("engine", ["hf", "vllm"])
def test_three_grpo_steps_with_two_workers(make_run, tiny_model, engine):
    if engine == "vllm":
        pytest.importorskip("vllm")
    extra = (
        ["trainer.val_before_train=true", "trainer.val_freq=2", "trainer.logger=['console','tensorboard']"]
        if engine == "hf"
        else []
    )
    run = make_run(*extra, engine=engine, name=f"run-{engine}")
    r = run_trainer(run)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert f"rollout engine {engine}" in r.stdout
    lines = metrics(run)
    if engine == "hf":  # validation before training, every 2 steps and at the end; tensorboard
        assert [m["step"] for m in lines] == [0, 1, 2, 3]
        assert [("val/reward_score" in m) for m in lines] == [True, False, True, True]
        assert list((run / "tensorboard").glob("events.out.tfevents.*"))
        lines = lines[1:]
    assert [m["step"] for m in lines] == [1, 2, 3]
    for m in lines:
        for key in (
            "reward/overall",
            "actor/pg_loss",
            "actor/grad_norm",
            "response_length/mean",
            "perf/throughput",
            "timing_s/gen",
            "timing_s/update_actor",
        ):
            assert key in m, key
    assert any(m["actor/grad_norm"] > 0 for m in lines)
    tracker = json.loads((run / "checkpoints/checkpoint_tracker.json").read_text())
    assert tracker["last_global_step"] == 3
    trained = checkpoint_weights(run / "checkpoints/global_step_3/actor")
    initial = load_file(tiny_model / "model.safetensors")
    moved = [n for n in initial if not torch.equal(initial[n], trained[n])]
    assert len(moved) == len(initial), f"unchanged: {set(initial) - set(moved)}"
    assert "step 3/3" in r.stdout


def test_killed_run_resumes_with_the_same_data_and_metrics(make_run, tmp_path):
    reference = make_run(name="reference")
    r = run_trainer(reference)
    assert r.returncode == 0, r.stderr[-3000:]
    want = metrics(reference)

    run = make_run(name="killed")
    proc = subprocess.Popen(
        [sys.executable, "-m", "r1cloud.trainer", str(run)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        if (run / "metrics.jsonl").exists() and any(m["step"] == 2 for m in metrics(run)):
            break
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)  # the driver, its Ray cluster and workers: no goodbye
    proc.wait()
    assert max(m["step"] for m in metrics(run)) == 2

    r = run_trainer(run)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "[resume] from step 2" in r.stdout
    got = metrics(run)
    assert [m["step"] for m in got] == [1, 2, 3]
    for key in DETERMINISTIC:
        assert got[2][key] == pytest.approx(want[2][key], rel=1e-6, abs=1e-7), key

    # Resume the finished run on one worker instead of two, for one more step.
    one = make_run(
        "trainer.n_gpus_per_node=1",
        "trainer.max_steps=4",
        f"trainer.save_checkpoint_path={run / 'checkpoints'}",
        name="one-worker",
    )
    r = run_trainer(one)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "[resume] from step 3" in r.stdout and "saved with 2 workers, now 1" in r.stdout
    assert [m["step"] for m in metrics(one)] == [4]


@pytest.mark.parametrize(
    "overrides",
    [
        [
            "algorithm.adv_estimator=grpo",
            "algorithm.norm_adv_by_std_in_grpo=false",
            "worker.actor.loss_avg_mode=seq-mean-token-sum-norm",
        ],
        [
            "algorithm.adv_estimator=grpo_passk",
            "worker.actor.loss_type=gspo",
            "worker.actor.loss_avg_mode=seq",
        ],
        [
            "algorithm.adv_estimator=rloo",
            "worker.actor.loss_type=gspo_token",
            "worker.actor.loss_avg_mode=seq-mean-token-mean",
        ],
        [
            "algorithm.adv_estimator=reinforce_plus_plus",
            "algorithm.gamma=0.9",
            "worker.actor.loss_type=cispo",
        ],
        [
            "algorithm.adv_estimator=reinforce_plus_plus_baseline",
            "worker.actor.loss_type=sapo",
            "worker.actor.loss_avg_mode=seq-mean-token-sum",
        ],
    ],
    ids=["dr-grpo", "passk-gspo", "rloo-gspo-token", "reinforce++-cispo", "reinforce++-baseline-sapo"],
)
def test_every_estimator_and_loss_trains_two_steps(make_run, tiny_model, overrides):
    run = make_run("trainer.max_steps=2", "trainer.save_freq=-1", *overrides, name="family")
    r = run_trainer(run)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    lines = [m for m in metrics(run) if "actor/pg_loss" in m]
    assert [m["step"] for m in lines] == [1, 2]
    for m in lines:
        assert math.isfinite(m["actor/pg_loss"]) and math.isfinite(m["actor/grad_norm"])
        assert "critic/advantages/mean" in m
    assert any(m["actor/grad_norm"] > 0 for m in lines)  # the loss reached the weights


@pytest.mark.parametrize("name", ["math12k_drgrpo", "math12k_gspo", "math12k_reinforcepp", "math12k_rloo"])
def test_algorithm_blueprints_run_on_the_tiny_model(make_run, name):
    """Each algorithm blueprint's algorithm and loss settings, on the tiny model, for 2 steps."""
    from r1cloud.spec import load_spec
    from tinyrun import ROOT

    spec = load_spec(ROOT / "blueprints" / f"{name}.yaml", check_files=False).spec
    a, actor = spec.algorithm, spec.worker.actor
    overrides = [
        f"algorithm.{k}={getattr(a, k)}"
        for k in (
            "adv_estimator",
            "norm_adv_by_std_in_grpo",
            "disable_kl",
            "use_kl_loss",
            "kl_penalty",
            "kl_coef",
        )
    ] + [
        f"worker.actor.{k}={getattr(actor, k)}"
        for k in ("loss_type", "loss_avg_mode", "clip_ratio_low", "clip_ratio_high")
    ]
    run = make_run("trainer.max_steps=2", "trainer.save_freq=-1", *overrides, name=name)
    r = run_trainer(run)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    lines = [m for m in metrics(run) if "actor/pg_loss" in m]
    assert [m["step"] for m in lines] == [1, 2] and all(math.isfinite(m["actor/pg_loss"]) for m in lines)
    if not a.use_kl_loss and not a.disable_kl:
        assert "actor/kl_penalty" in lines[0]  # REINFORCE++: the KL went into the reward
