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

from tinyrun import ROOT, run_trainer
from trackers_readback import mlflow_history, wandb_runs

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


TRACKED = (
    "trainer.val_before_train=true",
    "trainer.val_freq=2",
    "trainer.val_generations_to_log=2",
    "trainer.project_name=r1-tests",
    "trainer.experiment_name=qwen2_5_0_5b_digits",  # the job is "tiny": trackers get EasyR1's name
    "trainer.logger=['console','file','tensorboard','wandb','swanlab','mlflow']",
)


@pytest.mark.parametrize("engine", ["hf", "vllm"])
def test_three_grpo_steps_with_two_workers(make_run, tiny_model, engine, request):
    """The hf run also logs to every tracker (wandb and SwanLab offline, MLflow on a real server
    on loopback, TensorBoard): each one's own store holds the curve metrics.jsonl holds."""
    if engine == "vllm":
        pytest.importorskip("vllm")
    # vLLM's own sampling fields reach validation's SamplingParams (a bad one would fail the run)
    extra = [
        "trainer.val_before_train=true",
        'worker.rollout.val_override_config={"repetition_penalty": 1.3, "min_p": 0.1, "presence_penalty": 0.5}',
    ]
    env = {"RAY_ADDRESS": ""}  # its own Ray, as a user's run starts it, though the tests' head runs here
    if engine == "hf":
        server = request.getfixturevalue("mlflow_server")
        extra = list(TRACKED)
        env = {"WANDB_MODE": "offline", "SWANLAB_MODE": "offline", "MLFLOW_TRACKING_URI": server.url}
    run = make_run(*extra, engine=engine, name=f"run-{engine}")
    r = run_trainer(run, env=env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert f"rollout engine {engine}" in r.stdout
    lines = metrics(run)
    if engine == "hf":  # validation before training, every 2 steps and at the end
        assert [m["step"] for m in lines] == [0, 1, 2, 3]
        assert [("val/reward_score" in m) for m in lines] == [True, False, True, True]
        check_trackers(run, lines, r.stdout, server.url)
    assert lines[0]["step"] == 0 and "val/reward_score" in lines[0]  # validation before training
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


def curve(lines: list[dict], key: str) -> list[tuple[int, float]]:
    return [(m["step"], m[key]) for m in lines if key in m]


def check_trackers(run, lines: list[dict], stdout: str, mlflow_url: str) -> None:
    from trackers_readback import swanlab_run, tensorboard_history

    want, val = curve(lines, "reward/overall"), curve(lines, "val/reward_score")
    assert len(want) == 3 and len(val) == 3
    approx = lambda pairs: [(s, pytest.approx(v, rel=1e-6)) for s, v in pairs]  # noqa: E731

    (attempts,) = wandb_runs(run).values()
    (wb,) = attempts
    assert (wb["name"], wb["project"]) == ("qwen2_5_0_5b_digits", "r1-tests")
    assert wb["config"]["trainer"]["logger"][-1] == "mlflow"  # the resolved config, logged once
    assert wb["history"]["reward/overall"] == approx(want)
    assert wb["history"]["val/reward_score"] == approx(val)
    assert wb["tables"] == 3  # val/generations at steps 0, 2 and 3

    sw = swanlab_run(run)
    assert (sw["name"], sw["project"]) == ("qwen2_5_0_5b_digits", "r1-tests")
    assert sw["history"]["reward/overall"] == approx(want)
    assert sw["texts"] == 2 * 3

    tb = tensorboard_history(run / "tensorboard")
    assert tb["reward/overall"] == approx(want) and tb["val/reward_score"] == approx(val)

    from mlflow import MlflowClient

    ids = json.loads((run / "trackers.json").read_text())
    client = MlflowClient(mlflow_url)
    mrun = client.get_run(ids["mlflow"])
    assert mrun.info.run_name == "qwen2_5_0_5b_digits" and mrun.info.status == "FINISHED"
    assert client.get_experiment(mrun.info.experiment_id).name == "r1-tests"
    assert mrun.data.params["trainer.val_generations_to_log"] == "2"
    assert mlflow_history(mlflow_url, ids["mlflow"], "reward/overall") == approx(want)
    tables = [a.path for a in client.list_artifacts(ids["mlflow"], "val_generations")]
    assert len(tables) == 3

    samples = [json.loads(x) for x in (run / "generations.jsonl").read_text().splitlines()]
    assert [s["step"] for s in samples] == [0, 0, 2, 2, 3, 3]
    assert samples[0]["prompt"] == samples[2]["prompt"]  # the same prompts every validation
    assert set(samples[0]) == {"step", "prompt", "response", "ground_truth", "score"}
    assert "[val] sample 2: " in stdout and "[logger] mlflow logs to run" in stdout


def test_a_tracker_that_cannot_start_stops_the_run_before_its_first_step(make_run, monkeypatch):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    run = make_run("trainer.logger=['console','wandb']", name="no-key")
    r = run_trainer(run, env={"WANDB_MODE": "online", "HOME": str(run)})  # no key, no ~/.netrc
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-2000:]
    assert "error: trainer.logger: wandb could not start" in r.stderr and "WANDB_MODE: offline" in r.stderr
    assert "Traceback" not in r.stderr and "[start]" not in r.stdout  # no worker was started
    assert not (run / "metrics.jsonl").exists()


def test_rank0_init_and_offload_train_exactly_as_without(tmp_path, digits_reward):
    """enable_rank0_init: rank 0 reads the weights, the other worker builds an empty model and
    receives its shard. enable_cpu_offload: FSDP2's CPUOffloadPolicy (host memory is the device
    here, but its code runs). On a model with tied embeddings (as SmolLM2), two steps give the
    same numbers as every worker reading the weights itself, without offload. The moves between
    phases (offload.*) have nowhere to go on a CPU run, and the run says so once."""
    from conftest import run_folder
    from tiny import make_tiny_model
    from tinyrun import tiny_blueprint

    tied = make_tiny_model(tmp_path / "tied", tie=True)
    got = {}
    for flag in ("true", "false"):
        run = run_folder(
            tmp_path,
            f"rank0-{flag}",
            tiny_blueprint(tied, digits_reward),
            [f"worker.actor.fsdp.enable_rank0_init={flag}", f"worker.ref.fsdp.enable_rank0_init={flag}",
             f"worker.actor.fsdp.enable_cpu_offload={flag}", f"worker.ref.fsdp.enable_cpu_offload={flag}",
             f"worker.ref.offload.offload_params={flag}",
             "worker.actor.micro_batch_size_per_device_for_update=8",  # EasyR1: offload, no accumulation
             "trainer.max_steps=2", "trainer.save_freq=-1"],
        )  # fmt: skip
        r = run_trainer(run)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        said = [line for line in r.stdout.splitlines() if "[offload]" in line]
        assert said == [] if flag == "false" else len(said) == 1 and "nothing to move on a CPU run" in said[0]
        got[flag] = metrics(run)
    for key in DETERMINISTIC:
        for a, b in zip(got["true"], got["false"], strict=True):
            assert a[key] == pytest.approx(b[key], rel=1e-6, abs=1e-7), key


def test_save_model_only_resumes_with_a_fresh_optimizer_and_ray_timeline_is_written(make_run, tmp_path):
    from torch.distributed.checkpoint import FileSystemReader

    trace = tmp_path / "timeline.json"
    warm = "worker.actor.optim.lr_warmup_steps=5"  # the lr moves each step: a resume must pick it up
    run = make_run(
        "trainer.save_model_only=true",
        "trainer.max_steps=2",
        f"trainer.ray_timeline={trace}",
        warm,
        name="lean",
    )
    r = run_trainer(run)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    saved = FileSystemReader(str(run / "checkpoints/global_step_2/actor")).read_metadata().state_dict_metadata
    assert any(k.startswith("model.") for k in saved) and not any(k.startswith("optim") for k in saved)
    events = {e.get("cat") for e in json.loads(trace.read_text())}  # a Chrome trace of the Ray tasks
    assert "task::HybridWorker.update" in events and "task::HybridWorker.generate" in events
    ckpts = f"trainer.save_checkpoint_path={run / 'checkpoints'}"
    more = make_run("trainer.max_steps=3", ckpts, warm, "trainer.val_before_train=true", name="lean-more")
    r = run_trainer(more)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "[resume] from step 2" in r.stdout and "the optimizer starts afresh" in r.stdout
    # val_before_train validates a resumed run too, at the step it resumes from (EasyR1's
    # ray_trainer.py:573-579: the checkpoint is loaded, then validation runs)
    assert [(m["step"], "val/reward_score" in m) for m in metrics(more)] == [(2, True), (3, True)]
    # the schedule resumed at its place: step 3's one update is the third, lr × 2/5 (optim.lr_factor)
    assert metrics(more)[-1]["actor/lr"] == pytest.approx(1.0e-3 * 2 / 5, rel=1e-9)


def test_a_vllm_only_sampling_field_with_the_hf_engine_is_one_line(make_run):
    run = make_run('worker.rollout.val_override_config={"presence_penalty": 0.5}', name="hf-presence")
    r = run_trainer(run)
    assert r.returncode == 1, r.stdout[-2000:] + r.stderr[-2000:]
    assert "error: worker.rollout.val_override_config: presence_penalty is vLLM's only" in r.stderr
    assert "Traceback" not in r.stderr and not (run / "metrics.jsonl").exists()


def test_a_tracker_run_lost_with_its_machine_starts_afresh(make_run, monkeypatch):
    """A managed job back on a new machine finds its tracker ids (kept with the checkpoints) but
    not MLflow's run-folder database: a new run, said in one line, not a failed recovery."""
    from r1cloud.spec import load_resolved
    from r1cloud.trainer.trackers import Trackers

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    run = make_run("trainer.logger=['mlflow']", name="lost")
    (run / "trackers.json").write_text('{"mlflow": "0123456789abcdef0123456789abcdef"}')
    said: list[str] = []
    trackers = Trackers(load_resolved(run / "spec.yaml"), run, said.append)
    trackers.start()
    trackers.record(1, {"reward/overall": 0.5})
    trackers.close()
    new = json.loads((run / "trackers.json").read_text())["mlflow"]
    assert new != "0123456789abcdef0123456789abcdef"
    assert said == [f"[logger] mlflow logs to run {new} at sqlite:///{run.resolve()}/mlflow.db"]
    assert mlflow_history(f"sqlite:///{run}/mlflow.db", new, "reward/overall") == [(1, 0.5)]


def test_killed_run_resumes_with_the_same_data_and_metrics(make_run, tmp_path):
    reference = make_run(name="reference")
    r = run_trainer(reference)
    assert r.returncode == 0, r.stderr[-3000:]
    want = metrics(reference)

    # The killed run logs to wandb (offline) and MLflow (its default store in the run folder): the
    # resumed run must continue the same tracker runs.
    run = make_run("trainer.logger=['console','wandb','mlflow']", name="killed")
    env = {"WANDB_MODE": "offline"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "r1cloud.trainer", str(run)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        env={**os.environ, **env},
    )
    mlflow_uri = f"sqlite:///{run}/mlflow.db"
    deadline, client = time.time() + 300, None
    while time.time() < deadline and proc.poll() is None:
        if client is None and (run / "trackers.json").exists():  # MLflow's first call is slow: warm it
            from mlflow import MlflowClient

            ids = json.loads((run / "trackers.json").read_text())
            client = MlflowClient(mlflow_uri)
            client.get_run(ids["mlflow"])
        if client is not None and len(client.get_metric_history(ids["mlflow"], "reward/overall")) == 2:
            break
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)  # the driver, its Ray cluster and workers: no goodbye
    proc.wait()
    assert max(m["step"] for m in metrics(run)) == 2

    r = run_trainer(run, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "[resume] from step 2" in r.stdout
    got = metrics(run)
    assert [m["step"] for m in got] == [1, 2, 3]
    for key in DETERMINISTIC:
        assert got[2][key] == pytest.approx(want[2][key], rel=1e-6, abs=1e-7), key
    assert json.loads((run / "trackers.json").read_text()) == ids
    assert f"[logger] mlflow continues run {ids['mlflow']}" in r.stdout
    assert mlflow_history(mlflow_uri, ids["mlflow"], "reward/overall") == [
        (s, pytest.approx(v, rel=1e-6)) for s, v in curve(got, "reward/overall")
    ]
    # The resumed attempt continues the same wandb run id (`wandb sync` joins the attempts). What the
    # killed attempt kept depends on how much wandb's own process, killed with it, had flushed.
    attempts = wandb_runs(run)
    assert set(attempts) <= {ids["wandb"], None} and len(attempts[ids["wandb"]]) in (1, 2)
    assert [s for s, _ in attempts[ids["wandb"]][-1]["history"]["reward/overall"]] == [3]

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
            "worker.actor.entropy_coeff=0.01",
            "worker.actor.rollout_is=sequence_truncate",
            "worker.actor.rollout_is_cap=2.0",
            "worker.actor.optim.strategy=adamw_bf16",  # bf16 moments on FSDP2 shards, saved by DCP
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
        [
            "algorithm.adv_estimator=remax",
            "algorithm.use_kl_loss=false",
            "algorithm.kl_type=adaptive",
            "algorithm.kl_target=0.001",
            "algorithm.kl_horizon=100",
        ],
    ],
    ids=[
        "dr-grpo-entropy-bonus-tis-adamw-bf16",
        "passk-gspo",
        "rloo-gspo-token",
        "reinforce++-cispo",
        "reinforce++-baseline-sapo",
        "remax-adaptive-kl",
    ],
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
    assert all(m["actor/entropy"] > 0 for m in lines)  # the true entropy, from the logits
    if "algorithm.adv_estimator=remax" in overrides:
        assert all("critic/baseline/mean" in m for m in lines)  # the greedy rollout was scored
        # the adaptive controller moves β by the batch's KL (0 at step 1: the actor is the reference)
        from r1cloud.trainer.algorithms import adaptive_kl_coef

        coefs = [m["actor/kl_coef"] for m in lines]
        assert coefs[0] == 0.01 and lines[0]["actor/kl_penalty"] == 0.0
        assert coefs[1] == pytest.approx(
            adaptive_kl_coef(0.01, 0.0, 0.001, 16, 100)
        )  # 0.01 × (1 − 0.2·16/100)
    if "worker.actor.rollout_is=sequence_truncate" in overrides:
        assert all(0 < m["actor/rollout_is_weight"] <= 2.0 for m in lines)


@pytest.mark.parametrize(
    "name",
    # The other algorithm blueprints' code paths run in test_every_estimator_and_loss_trains_two_steps
    # (math12k_drgrpo: dr-grpo-entropy-bonus-tis-adamw-bf16; math12k_gspo and math12k_rloo:
    # rloo-gspo-token; math12k_reinforcepp's KL in the reward: remax-adaptive-kl) and math12k_dapo's
    # in the dynamic-sampling test; each blueprint loads in tests/test_spec_load.py.
    ["math12k_ppo"],
)
def test_algorithm_blueprints_run_on_the_tiny_model(make_run, tiny_model, name):
    """Each algorithm blueprint's algorithm, loss, sampling and critic settings, on the tiny model
    with the digits reward (filter_key stays `overall`, the key that reward returns), for 2 steps."""
    from r1cloud.validate import load_spec

    spec = load_spec(ROOT / "blueprints" / f"{name}.yaml", check_files=False).spec
    a, actor = spec.algorithm, spec.worker.actor
    algorithm_keys = ("adv_estimator", "norm_adv_by_std_in_grpo", "disable_kl", "use_kl_loss", "kl_penalty")
    algorithm_keys += ("kl_coef", "gamma", "lam", "online_filtering", "filter_low", "filter_high")
    overrides = [f"algorithm.{k}={getattr(a, k)}" for k in algorithm_keys] + [
        f"worker.actor.{k}={getattr(actor, k)}"
        for k in ("loss_type", "loss_avg_mode", "clip_ratio_low", "clip_ratio_high")
    ]
    if a.adv_estimator == "gae":
        overrides += [
            f"worker.critic.model.model_path={tiny_model}",
            "worker.critic.global_batch_size=4",
            "worker.critic.fsdp.torch_dtype=fp32",
            "worker.critic.fsdp.mp_param_dtype=fp32",
            f"worker.critic.cliprange_value={spec.worker.critic.cliprange_value}",
        ]
    run = make_run("trainer.max_steps=2", "trainer.save_freq=-1", *overrides, name=name)
    r = run_trainer(run)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    lines = [m for m in metrics(run) if "actor/pg_loss" in m]
    assert [m["step"] for m in lines] == [1, 2] and all(math.isfinite(m["actor/pg_loss"]) for m in lines)
    if not a.use_kl_loss and not a.disable_kl:
        assert "actor/kl_penalty" in lines[0]  # REINFORCE++ and PPO: the KL went into the reward
    if a.online_filtering:
        assert all("batch/kept_groups_ratio" in m for m in lines)
    if a.adv_estimator == "gae":
        assert all(math.isfinite(m["critic/vf_loss"]) for m in lines)


def test_ppo_with_a_critic_warms_up_trains_and_resumes(make_run, tiny_model):
    """GAE: the critic (a value head on the tiny model) learns from step 1, the actor from step
    `critic_warmup` on (EasyR1 b44b311 verl/trainer/ray_trainer.py:659, `critic_warmup <=
    global_step`, global_step from 1: warm-up 2 leaves step 1 to the critic alone); a stopped run
    resumes the critic from its checkpoint."""
    overrides = (
        "algorithm.adv_estimator=gae",
        "algorithm.use_kl_loss=false",
        "algorithm.lam=0.95",
        f"worker.critic.model.model_path={tiny_model}",
        "worker.critic.global_batch_size=4",
        "worker.critic.micro_batch_size_per_device_for_update=2",
        "worker.critic.micro_batch_size_per_device_for_experience=4",
        "worker.critic.fsdp.torch_dtype=fp32",
        "worker.critic.fsdp.mp_param_dtype=fp32",
        "worker.critic.optim.lr=1e-3",
        "trainer.critic_warmup=2",
        "trainer.max_steps=3",
        "trainer.save_freq=2",
    )
    run = make_run(*overrides, name="ppo")
    r = run_trainer(run)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    lines = metrics(run)
    assert [m["step"] for m in lines] == [1, 2, 3]
    assert "actor/pg_loss" not in lines[0] and "actor/pg_loss" in lines[1]  # the warm-up step
    for m in lines:
        assert math.isfinite(m["critic/vf_loss"]) and m["critic/grad_norm"] > 0
        assert "critic/values/mean" in m and "critic/returns/mean" in m
    assert (run / "checkpoints" / "global_step_2" / "critic").is_dir()
    # Resumed from step 2 in a fresh run, step 3 repeats exactly: the critic's weights, optimizer
    # and schedule came back (a fresh value head would predict other values).
    again = make_run(
        *overrides, f"trainer.load_checkpoint_path={run}/checkpoints/global_step_2", name="again"
    )
    r = run_trainer(again)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "[resume] from step 2" in r.stdout
    (redo,) = metrics(again)
    for key in ("critic/vpred_mean", "critic/vf_loss", "critic/values/mean", "actor/pg_loss"):
        assert redo[key] == pytest.approx(lines[2][key], rel=1e-4, abs=1e-6), key


def test_dapo_dynamic_sampling_keeps_only_informative_groups(make_run, tmp_path):
    """The DAPO preset with dynamic sampling: a reward that is constant for half the prompts makes
    those groups useless; the step draws more prompts (the loader wrapping around) until it has
    a full batch of groups whose mean lies strictly between filter_low and filter_high."""
    reward = tmp_path / "half.py"
    reward.write_text(
        "def compute_score(reward_inputs):\n"
        "    out = []\n"
        "    for x in reward_inputs:\n"
        "        varied = sum(c.isdigit() for c in x['response']) / max(len(x['response']), 1)\n"
        "        constant = int(x['ground_truth']) % 2 == 0\n"
        "        out.append({'overall': 1.0 if constant else varied, 'accuracy': 1.0 if constant else varied})\n"
        "    return out\n"
    )
    run = make_run(
        "algorithm.adv_estimator=dapo",
        "algorithm.filter_key=accuracy",
        "data.mini_rollout_batch_size=2",
        f"worker.reward.reward_function={reward}:compute_score",
        "trainer.max_steps=2",
        "trainer.save_freq=-1",
        name="dapo",
    )
    spec = (run / "spec.yaml").read_text()
    assert "clip_ratio_high: 0.28" in spec and "online_filtering: true" in spec  # the preset
    r = run_trainer(run)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    lines = metrics(run)
    for m in lines:
        assert m["batch/rounds"] >= 2  # two prompts per round, four groups wanted
        assert m["critic/score/max"] < 1.0  # no constant group reached the update
        assert "actor/kl_loss" not in m  # the preset turned KL off
    dropped = [m for m in lines if m["batch/kept_groups_ratio"] < 1.0]
    assert dropped and all(m["batch/rounds"] > 2 for m in dropped)  # refilled after dropping
    assert any(m["reward/overall"] > m["critic/score/mean"] for m in dropped)  # reward/* counts all


def test_dynamic_sampling_gives_up_with_a_clear_message(make_run):
    """Nothing can pass a filter of (0.99, 1.0) with the digits reward: after max_try_make_batch
    rounds the run stops with one line naming the settings, not a traceback."""
    run = make_run(
        "algorithm.online_filtering=true",
        "algorithm.filter_low=0.99",
        "algorithm.filter_high=1.0",
        "trainer.max_try_make_batch=2",
        "trainer.max_steps=1",
        name="starved",
    )
    r = run_trainer(run)
    assert r.returncode == 1
    assert "after 2 rounds only 0 of 4 groups" in r.stderr and "trainer.max_try_make_batch" in r.stderr
    assert "Traceback" not in r.stderr


def test_easyr1_dapo_example_trains_shrunk_with_ulysses(tmp_path, tiny_model, monkeypatch):
    """EasyR1's qwen3_14b_dapo17k_dapo.sh, unchanged, shrunk by overrides to the tiny model on two
    CPU workers: its Ulysses (ulysses_size 8 → 2 here: both workers hold halves of each row), two
    rollout rounds a step (mini_rollout_batch_size), bf16 weights with adamw_bf16, DAPO's clip
    and the reward function's kwargs as the script gives them. Online filtering is turned off: a
    random model answers nothing right, so every group would be filtered."""
    from r1cloud.spec import dump_spec
    from r1cloud.validate import load_spec

    easyr1 = ROOT / "tests" / "fixtures" / "easyr1"
    monkeypatch.chdir(easyr1)
    val = tmp_path / "val.jsonl"
    val.write_text("".join((ROOT / "data/arithmetic/test.jsonl").read_text().splitlines(True)[:4]))
    shrink = [
        f"worker.actor.model.model_path={tiny_model}", f"data.train_files={ROOT}/data/arithmetic/train.jsonl",
        f"data.val_files={val}", "data.max_prompt_length=96", "data.max_response_length=16",
        "data.rollout_batch_size=4", "data.mini_rollout_batch_size=2", "worker.actor.global_batch_size=2",
        "worker.rollout.n=4", "worker.rollout.max_num_batched_tokens=1024", "worker.rollout.tensor_parallel_size=1",
        "worker.rollout.name=hf", 'worker.rollout.val_override_config={"n": 1, "temperature": 0}',
        "worker.actor.ulysses_size=2", "trainer.n_gpus_per_node=2", "trainer.max_steps=2",
        "trainer.logger=['console']", "trainer.val_before_train=false", "algorithm.online_filtering=false",
        'worker.reward.reward_function_kwargs={"max_response_length": 16, "overlong_buffer_length": 4, '
        '"overlong_penalty_factor": 1.0}',
    ]  # fmt: skip
    spec = load_spec(easyr1 / "examples/qwen3_14b_dapo17k_dapo.sh", shrink).spec
    assert spec.worker.actor.ulysses_size == 2 and spec.worker.actor.optim.strategy == "adamw_bf16"
    run = tmp_path / "dapo"
    run.mkdir()
    (run / "spec.yaml").write_text(dump_spec(spec))
    r = run_trainer(run)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    lines = [m for m in metrics(run) if "actor/pg_loss" in m]
    assert [m["step"] for m in lines] == [1, 2]
    for m in lines:
        assert m["batch/rounds"] == 2 and m["reward/accuracy_normalized"] == 0.0  # EasyR1's reward keys
        # the trainer's log-probs, from row halves on two workers, against the engine's own (bf16)
        assert m["rollout/logp_diff_max"] < 0.02
    assert [m["actor/lr"] for m in lines] == [0.0, pytest.approx(1.0e-7)]  # lr_warmup_steps=10 of 1e-6
