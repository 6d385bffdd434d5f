"""The job lifecycle as a user runs it, through real `r1cloud` processes and the tiny model:
train → jobs → status → stop → resume → logs; kill -9 detected as FAILED; two jobs at once;
secrets never written anywhere; bad input ends in one clear line and exit code 2."""

import json
import os
import signal
import subprocess
import time

import pytest

from r1cloud.core.budget import usd
from r1cloud.costs.prices import catalog_dir
from tinyrun import R1CLOUD, r1, tiny_blueprint

SECRET = "hf_s3cr3t_ZX81_value"


@pytest.fixture
def home(tmp_path, monkeypatch):
    h = tmp_path / "home"
    monkeypatch.setenv("R1CLOUD_HOME", str(h))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    return h


@pytest.fixture
def blueprint(tmp_path, tiny_model, digits_reward):
    path = tmp_path / "tiny.yaml"
    path.write_text(tiny_blueprint(tiny_model, digits_reward) + "secrets: [HF_TOKEN]\n")
    return path


def job_record(home, name):
    return json.loads((home / "jobs" / name / "job.json").read_text())


def wait_for(predicate, timeout=240, what="condition"):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}")


def steps_done(home, name):
    path = home / "jobs" / name / "metrics.jsonl"
    return [json.loads(x)["step"] for x in path.read_text().splitlines()] if path.exists() else []


def test_train_stop_resume_logs_status(home, blueprint):
    r = r1(
        "train",
        blueprint,
        "--name",
        "life",
        "--detach",
        "--secret",
        f"HF_TOKEN={SECRET}",
        "trainer.max_steps=16",
        "trainer.save_freq=-1",  # no periodic saves: the only checkpoint before the end is the stop's
    )
    assert r.returncode == 0, r.stderr
    assert "started life" in r.stdout and "r1cloud logs -f life" in r.stdout
    wait_for(lambda: len(steps_done(home, "life")) >= 2, what="two steps")

    r = r1("jobs")
    assert r.returncode == 0 and "life" in r.stdout and "RUNNING" in r.stdout
    r = r1("status")  # no argument: the table
    assert "RUNNING" in r.stdout

    r = r1("stop", "life")
    assert r.returncode == 0, r.stderr
    assert "life STOPPED (stopped)" in r.stdout  # graceful, not killed after the grace period
    assert "[stop] stopped after step" in (home / "jobs/life/train.log").read_text()
    record = job_record(home, "life")
    assert record["status"] == "STOPPED"
    stopped_at = max(steps_done(home, "life"))
    assert stopped_at < 16
    saved = sorted(p.name for p in (home / "jobs/life/checkpoints").glob("global_step_*"))
    assert saved == [f"global_step_{stopped_at}"]
    r = r1("status", "life")
    assert "STOPPED" in r.stdout and "checkpoints" in r.stdout and str(stopped_at) in r.stdout

    r = r1("train", "--resume", "life", "--secret", f"HF_TOKEN={SECRET}")  # follows to the end
    assert r.returncode == 0, r.stdout + r.stderr
    assert "resumed life" in r.stdout and "life SUCCEEDED" in r.stdout
    assert "step 16/16" in r.stdout
    assert f"[resume] from step {stopped_at}" in (home / "jobs/life/train.log").read_text()
    assert steps_done(home, "life") == list(range(1, 17))
    # each finished segment (the stop's, then the rest) calibrates later estimates on this machine
    runs = [json.loads(x) for x in (home / "throughput.jsonl").read_text().splitlines()]
    assert [x["job"] for x in runs] == ["life", "life"], runs
    assert all(x["device"] == "cpu" and x["devices"] == 2 and x["gen_flops"] > 0 for x in runs), runs
    r = r1("validate", blueprint, "trainer.max_steps=16", "--secret", f"HF_TOKEN={SECRET}")
    assert "calibrated by job life" in r.stdout and "this machine, 2 worker slots" in r.stdout, r.stdout

    r = r1("checkpoints")  # the latest job: the stop's checkpoint and the final, merged one
    assert r.returncode == 0, r.stderr
    assert f"life:step-{stopped_at}" in r.stdout and "life:step-16" in r.stdout and "yes" in r.stdout

    r = r1("logs", "-n", "5")  # the latest job by default
    assert r.returncode == 0 and "step 16/16" in r.stdout
    r = r1("logs", "-f", "life")  # already finished: prints and exits with its code
    assert r.returncode == 0

    # The secret reached the trainer's environment and nothing else.
    for p in home.rglob("*"):
        if p.is_file():
            assert SECRET.encode() not in p.read_bytes(), p
    r = r1("validate", home / "jobs/life/spec.yaml", "--json", env={"HF_TOKEN": "x"})
    assert "HF_TOKEN" in r.stdout and SECRET not in r.stdout


def test_envs_and_secrets_reach_the_trainer_and_a_budget_stops_it(home, tmp_path, tiny_model, monkeypatch):
    """The price is the one fake here, at its narrowest boundary: SkyPilot's own catalog code reads a
    catalog row we wrote where SkyPilot reads catalogs (there is no cloud account to rent from)."""
    monkeypatch.setenv("SKY_RUNTIME_DIR", str(tmp_path / "sky"))
    catalog = catalog_dir() / "aws"
    catalog.mkdir(parents=True)
    (catalog / "vms.csv").write_text(
        "InstanceType,AcceleratorName,AcceleratorCount,vCPUs,MemoryGiB,GpuInfo,Price,SpotPrice,Region,"
        "AvailabilityZone\np5.fake,H100,2,52,512,\"{'Gpus': [{'Name': 'H100', 'Manufacturer': 'NVIDIA', "
        "'Count': 2, 'MemoryInfo': {'SizeInMiB': 81920}}], 'TotalGpuMemoryInMiB': 163840}\",100.0,40.0,"
        "us-east-1,use1-az1\n"
    )
    reward = tmp_path / "env_reward.py"
    reward.write_text(
        "import os\n"
        "def compute_score(xs):\n"
        "    ok = os.environ.get('MY_FLAG') == 'on' and os.environ.get('HF_TOKEN') == 'hf_abc'\n"
        "    return [{'overall': float(ok)} for _ in xs]\n"
    )
    bp = tmp_path / "env.yaml"
    bp.write_text(tiny_blueprint(tiny_model, reward) + "secrets: [HF_TOKEN]\n")
    # $100 an hour on "H100:2": one step's estimate fits $0.01, but start-up and a step on this CPU do not
    args = ("--env", "MY_FLAG=on", "--gpu", "H100", "--max-cost", "0.01", "trainer.max_steps=2")
    r = r1("train", bp, "--name", "envs", "--secret", "HF_TOKEN=hf_abc", *args)
    assert r.returncode == 75, r.stdout + r.stderr  # budget.EXIT: stopped by its budget, resumable
    assert "envs BUDGET_REACHED: budget reached: $" in r.stdout and "spent of $0.0100" in r.stdout
    assert "r1cloud train --resume envs --max-cost DOLLARS" in r.stdout
    first = json.loads((home / "jobs/envs/metrics.jsonl").read_text().splitlines()[0])
    assert first["reward/overall"] == 1.0  # the environment and the secret reached the reward
    assert steps_done(home, "envs") == [1]
    assert [p.name for p in (home / "jobs/envs/checkpoints").glob("global_step_*")] == ["global_step_1"]
    state = json.loads((home / "jobs/envs/checkpoints/global_step_1/trainer_state.json").read_text())
    assert state["stopped"].startswith("[budget] budget reached: $")  # how a cloud job's stop is told
    record = job_record(home, "envs")
    assert state["launched"] == pytest.approx(record["started_at"])  # which launch saved it
    assert record["status"] == "BUDGET_REACHED" and record["price"] == 100.0 and record["spent"] > 0.01
    assert "[budget] budget reached" in (home / "jobs/envs/train.log").read_text()
    r = r1("jobs")
    assert "COST" in r.stdout and "BUDGET_REACHED" in r.stdout and usd(record["spent"]) in r.stdout

    r = r1("train", "--resume", "envs", "--secret", "HF_TOKEN=hf_abc")  # the same cap: nothing to spend
    assert r.returncode == 2 and "has already spent $" in r.stderr and "--max-cost DOLLARS" in r.stderr
    r = r1("train", "--resume", "envs", "--secret", "HF_TOKEN=hf_abc", "--max-cost", "1000")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "envs SUCCEEDED" in r.stdout and steps_done(home, "envs") == [1, 2]
    assert "[resume] from step 1" in (home / "jobs/envs/train.log").read_text()
    after = job_record(home, "envs")
    assert after["spent"] > record["spent"]  # each attempt adds its time at the price
    r = r1("status", "envs")
    assert f"cost       {usd(after['spent'])} spent, at $100.00/hour" in r.stdout, r.stdout


def test_kill_9_is_detected_as_failed(home, blueprint):
    r = r1(
        "train",
        blueprint,
        "--name",
        "doomed",
        "--detach",
        "--secret",
        f"HF_TOKEN={SECRET}",
        "trainer.max_steps=200",
    )
    assert r.returncode == 0, r.stderr
    wait_for(
        lambda: job_record(home, "doomed")["status"] == "RUNNING" and job_record(home, "doomed")["pid"],
        what="RUNNING",
    )
    os.killpg(job_record(home, "doomed")["pid"], signal.SIGKILL)
    wait_for(lambda: "FAILED" in r1("jobs").stdout, timeout=30, what="FAILED in the table")
    r = r1("status", "doomed")
    assert "FAILED" in r.stdout and "ended without a word" in r.stdout
    r = r1("train", blueprint, "--name", "doomed", "--secret", "HF_TOKEN=x")
    assert r.returncode == 2 and "already exists (FAILED)" in r.stderr and "--resume doomed" in r.stderr


def test_an_easyr1_config_launched_twice_makes_two_named_jobs_both_in_wandb(
    home, tmp_path, tiny_model, digits_reward
):
    """EasyR1's config shape: no `name:`, trainer.project_name/experiment_name, logger file+wandb
    (offline here). Two launches at once without --name: two jobs named after the experiment (the
    second with a free suffix, and saying so), isolated, each a wandb run of its own."""
    from trackers_readback import wandb_runs

    config = tiny_blueprint(tiny_model, digits_reward).replace("name: tiny\n", "", 1)
    config = config.replace(
        "logger: [console]",
        "project_name: easy_r1\n  experiment_name: qwen2_5_7b_math_grpo\n  logger: ['file', 'wandb']",
    )
    bp = tmp_path / "config.yaml"
    bp.write_text(config + "envs: {WANDB_MODE: offline}\n")
    procs = [
        subprocess.Popen(
            [R1CLOUD, "train", str(bp), "--accels", "1", "trainer.max_steps=2"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    listings = []
    while any(p.poll() is None for p in procs):
        listings.append(r1("jobs"))  # reading the store while both jobs write to it
        time.sleep(0.5)
    errs = [p.stderr.read() for p in procs]
    outs = [p.stdout.read() for p in procs]
    assert [p.returncode for p in procs] == [0, 0], errs
    assert all(x.returncode == 0 for x in listings)
    names = ("qwen2-5-7b-math-grpo", "qwen2-5-7b-math-grpo-2")
    assert "a job named qwen2-5-7b-math-grpo exists; this one is qwen2-5-7b-math-grpo-2" in "".join(errs)
    ids = set()
    for n in names:
        assert job_record(home, n)["status"] == "SUCCEEDED"
        assert steps_done(home, n) == [1, 2]
        assert json.loads((home / "jobs" / n / "trainer.json").read_text())["workers"] == 1
        ((run_id, (run,)),) = wandb_runs(home / "jobs" / n).items()
        # named trainer.experiment_name, as EasyR1's logger.py names every run of the config
        assert (run["name"], run["project"]) == ("qwen2_5_7b_math_grpo", "easy_r1")
        assert [s for s, _ in run["history"]["reward/overall"]] == [1, 2]
        ids.add(run_id)
    assert len(ids) == 2  # two wandb runs
    assert all(f"r1cloud chat {n} --compare" in "".join(outs) for n in names)  # what to do next
    r = r1("train", bp, "--name", names[0], "--accels", "1")  # --name still refuses a taken name
    assert r.returncode == 2 and "already exists" in r.stderr


def test_same_name_at_once_only_one_wins(home, blueprint):
    procs = [
        subprocess.Popen(
            [R1CLOUD, "train", str(blueprint), "--name", "same", "--detach", "--secret", "HF_TOKEN=x"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    codes = sorted(p.wait(timeout=120) for p in procs)
    assert codes == [0, 2]
    r1("stop", "same", "--grace", "60")


@pytest.mark.parametrize(
    "args,expected",
    [
        (["logs", "nope"], "no job named 'nope'"),
        (["status", "nope"], "no job named 'nope'"),
        (["stop", "nope"], "no job named 'nope'"),
        (["train", "missing.yaml"], "missing.yaml does not exist"),
        (["train", "{bp}", "worker.rollout.n=one"], "worker.rollout.n: 'one' is not valid"),
        (["train", "{bp}"], "secrets.HF_TOKEN: is not set"),
        (["train", "{bp}", "--secret", "HF_TOKEN"], "HF_TOKEN is not set in the environment"),
        (["train", "{bp}", "--infra", "aws", "--secret", "HF_TOKEN=x"], "resources.bucket is not set"),
        (["train", "{bp}", "--env", "NOEQUALS", "--secret", "HF_TOKEN=x"], "write KEY=VALUE"),
    ],
)
def test_bad_input_is_one_clear_message_and_exit_2(home, blueprint, args, expected):
    r = r1(*[a.format(bp=blueprint) for a in args])
    assert r.returncode == 2, r.stdout + r.stderr
    assert expected in r.stderr
    assert "Traceback" not in r.stderr


def test_no_jobs_yet_and_dry_run(home, blueprint):
    r = r1("jobs")
    assert r.returncode == 0 and "no jobs yet" in r.stdout
    r = r1("logs")
    assert r.returncode == 2 and "no jobs yet" in r.stderr
    r = r1(
        "train",
        blueprint,
        "--dry-run",
        "--accels",
        "4",
        "--secret",
        "HF_TOKEN=x",
        "data.rollout_batch_size=8",
        "worker.actor.global_batch_size=8",
    )
    assert r.returncode == 0, r.stderr
    assert "4 local worker slots" in r.stdout and "would run" in r.stdout and "HF_TOKEN (secret)" in r.stdout
    assert not (home / "jobs").exists() or not any((home / "jobs").iterdir())


@pytest.mark.parametrize(
    "overrides,expected",
    [
        (
            ["data.max_prompt_length=8"],
            "the train data has 0 prompts, fewer than one batch of 4: 2000 were dropped as longer than "
            "data.max_prompt_length (8), the longest",
        ),
        (  # counted before launch: no job is made
            ["data.rollout_batch_size=4000", "worker.actor.global_batch_size=4000"],
            "data.train_files: holds 2000 rows, fewer than one rollout batch (data.rollout_batch_size 4000)",
        ),
    ],
)
def test_data_that_cannot_fill_a_batch_fails_before_the_first_step_in_one_line(
    home, blueprint, overrides, expected
):
    r = r1("train", blueprint, "--name", "short", "--secret", "HF_TOKEN=x", *overrides)
    assert r.returncode == 2, r.stdout + r.stderr
    if expected.startswith("data.train_files"):
        assert expected in r.stderr and not (home / "jobs/short").exists(), r.stderr
        return
    record = job_record(home, "short")
    assert record["status"] == "FAILED" and expected in record["reason"], record["reason"]
    log = (home / "jobs/short/train.log").read_text()
    assert "Traceback" not in log and "[start]" not in log


def test_a_worker_that_cannot_load_its_model_is_a_start_up_error(home, tmp_path, tiny_model, digits_reward):
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(tiny_model, broken)
    (broken / "model.safetensors").unlink()  # the folder passes validate; the weights are gone
    bp = tmp_path / "broken.yaml"
    bp.write_text(tiny_blueprint(broken, digits_reward))
    r = r1("train", bp, "--name", "broken")
    assert r.returncode == 2, r.stdout + r.stderr
    reason = job_record(home, "broken")["reason"]
    assert reason.startswith("error: a trainer worker could not start: OSError:"), reason
    assert "model.safetensors" in reason and "resumes from its last checkpoint" not in reason
    assert "\x1b[" not in reason
