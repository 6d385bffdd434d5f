"""The SkyPilot backend without a cloud: generated tasks checked by SkyPilot's own parser and
validator; the SDK boundary (launch, jobs.launch, queue_v2, tail_logs, cancel) exercised with the
request functions of the real `sky` module replaced — the only fake, since no cloud account
exists here — raising SkyPilot's real exception types; and the real SDK path with no API server
and no credentials."""

import json
import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import yaml

from spec_helpers import ROOT

sky = pytest.importorskip("sky")

R1CLOUD = str(Path(sys.executable).parent / "r1cloud")
# an asynchronous blueprint runs on local infra only so far: validate refuses it as a cloud job
# (tests/test_spec_checks.py, async-cloud)
BLUEPRINTS = [
    bp
    for bp in sorted((ROOT / "blueprints").glob("*.yaml"))
    if not (yaml.safe_load(bp.read_text()).get("async_training") or {}).get("enable")
]
CATALOG = """AcceleratorName,Clouds
A100,"['AWS', 'Azure', 'GCP', 'Lambda']"
A100-80GB,"['AWS', 'Azure', 'GCP', 'Lambda', 'RunPod']"
H100,"['AWS', 'Azure', 'GCP', 'Lambda', 'RunPod', 'nebius']"
H200,"['AWS', 'GCP', 'nebius']"
"""
VALIDATE = """
import sys, yaml, sky
from sky.utils import annotations
annotations.is_on_api_server = False  # else validate() prints request payload lines
for path in sys.argv[1:]:
    task = sky.Task.from_yaml(path)
    task.validate()
    print("ok", path, flush=True)
"""


@pytest.fixture
def sky_home(tmp_path_factory):
    """A HOME with SkyPilot's accelerator catalog seeded (validate() reads it; nothing is fetched)."""
    home = tmp_path_factory.mktemp("home")
    catalog = home / ".sky" / "catalogs" / "v8" / "common"
    catalog.mkdir(parents=True)
    (catalog / "accelerators.csv").write_text(CATALOG)
    return home


def validate_with_sky(paths: list[Path], home: Path) -> subprocess.CompletedProcess:
    """SkyPilot's own parser and validator on task files, in a process whose HOME holds the
    seeded catalog (SkyPilot fixes its paths at import)."""
    r = subprocess.run(
        [sys.executable, "-c", VALIDATE, *map(str, paths)],
        capture_output=True,
        text=True,
        env={**os.environ, "HOME": str(home), "SKYPILOT_DISABLE_LOCAL_API_SERVER": "1"},
        timeout=300,
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    return r


def dry_run(blueprint: Path, *args: str, home: Path, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [R1CLOUD, "train", str(blueprint), "--dry-run", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**os.environ, "R1CLOUD_HOME": str(home / ".r1cloud"), "HF_TOKEN": "hf_dry_run_secret_value"},
        timeout=120,
    )


def test_every_library_blueprint_becomes_a_task_skypilot_validates(tmp_path, sky_home):
    tasks = []
    for bp in BLUEPRINTS:
        r = dry_run(bp, "--infra", "aws", "--bucket", "s3://r1-ckpts", "--spot", home=sky_home, cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        path = tmp_path / f"{bp.stem}.task.yaml"
        path.write_text(r.stdout)
        tasks.append(path)
        config = yaml.safe_load(r.stdout)
        spec = yaml.safe_load((ROOT / "blueprints" / bp.name).read_text())
        assert config["name"] == bp.stem.replace("_", "-")
        assert config["resources"]["use_spot"] is True and config["resources"]["infra"] == "aws"
        assert config["resources"]["job_recovery"] == {"max_restarts_on_errors": 3}
        assert config["num_nodes"] == (spec.get("trainer") or {}).get("nnodes", 1)
        assert config["envs"]["R1CLOUD_JOB"] == config["name"]
        node_spec = Path(config["file_mounts"]["~/.r1cloud/spec.yaml"])
        assert yaml.safe_load(node_spec.read_text())["trainer"]["save_checkpoint_path"] == (
            f"s3://r1-ckpts/{config['name']}/checkpoints"
        )
        assert "python -m r1cloud.jobs.node" in config["run"]
        assert "hf_dry_run_secret_value" not in r.stdout + node_spec.read_text()
        if "secrets" in (spec or {}):
            assert config["secrets"] == {name: None for name in spec["secrets"]}
    r = validate_with_sky(tasks, sky_home)
    assert r.stdout.count("ok ") == len(BLUEPRINTS)


def test_alternatives_nodes_image_and_paths_in_the_task(tmp_path, sky_home):
    """A dict of accelerators is `any_of`, a list `ordered`; nodes, the docker image, secrets as
    null references; the blueprint's own files are named relative to the uploaded folder."""
    from r1cloud.jobs.remote import prepare
    from r1cloud.jobs.sky_task import to_yaml
    from r1cloud.validate import load_spec

    project = tmp_path / "project"
    (project / "rewards").mkdir(parents=True)
    (project / "rewards" / "r.py").write_text("def compute_score(reward_inputs):\n    return []\n")
    (project / "prompt.jinja").write_text("{{ content }}")
    bp = project / "jobs" / "bp.yaml"
    bp.parent.mkdir()
    bp.write_text(
        textwrap.dedent(
            """
            name: multi-node
            resources: {infra: gcp, accelerators: {H100: 8, A100-80GB: 8}, image: verlai/verl:latest,
                        bucket: "gs://ckpts/team"}
            secrets: [HF_TOKEN, WANDB_API_KEY]
            envs: {HF_HUB_ENABLE_HF_TRANSFER: 1}
            data: {train_files: hiyouga/math12k@train, val_files: hiyouga/math12k@test,
                   format_prompt: ../prompt.jinja, rollout_batch_size: 16}
            worker:
              actor: {global_batch_size: 8, micro_batch_size_per_device_for_update: 2,
                      micro_batch_size_per_device_for_experience: 2,
                      model: {model_path: Qwen/Qwen2.5-0.5B-Instruct}}
              rollout: {n: 4, tensor_parallel_size: 2}
              reward: {reward_function: ../rewards/r.py:compute_score}
            trainer: {nnodes: 2, n_gpus_per_node: 8}
            """
        )
    )
    spec = load_spec(bp, check_files=True).spec
    folder = tmp_path / "job"
    folder.mkdir()
    config, local = prepare(spec, bp, folder, managed=True)
    assert config["num_nodes"] == 2
    assert config["resources"]["any_of"] == [{"accelerators": "H100:8"}, {"accelerators": "A100-80GB:8"}]
    assert config["resources"]["image_id"] == "docker:verlai/verl:latest"
    # and the Ray cluster's token, drawn at each launch (two nodes)
    assert config["secrets"] == {"HF_TOKEN": None, "WANDB_API_KEY": None, "RAY_AUTH_TOKEN": None}
    assert "[train,wandb]" in config["setup"]  # the default logger is EasyR1's: console and wandb
    assert '-c "$HOME/.r1cloud/src/requirements/lock-gpu.txt"' in config["setup"]  # the lock
    assert subprocess.run(["bash", "-n"], input=config["setup"], text=True).returncode == 0
    assert config["envs"]["HF_HUB_ENABLE_HF_TRANSFER"] == "1"
    assert config["workdir"] == str(project)
    node = yaml.safe_load((folder / "node-spec.yaml").read_text())
    assert node["data"]["format_prompt"] == "prompt.jinja"
    assert node["worker"]["reward"]["reward_function"] == "rewards/r.py"
    assert local.trainer.save_checkpoint_path == "gs://ckpts/team/multi-node/checkpoints"
    task = sky.Task.from_yaml_config(
        dict(config), secrets_overrides=[("HF_TOKEN", "x"), ("WANDB_API_KEY", "y"), ("RAY_AUTH_TOKEN", "z")]
    )
    assert task.num_nodes == 2 and len(task.resources) == 2
    (tmp_path / "task.yaml").write_text(to_yaml(config))
    validate_with_sky([tmp_path / "task.yaml"], sky_home)


@pytest.fixture
def fake_sdk(monkeypatch, tmp_path):
    """The request functions of the real `sky` module, replaced: each records its call and
    answers as the API server would. Task parsing and exception types stay SkyPilot's own."""
    monkeypatch.setenv("R1CLOUD_HOME", str(tmp_path / "r1home"))
    calls: list[tuple] = []
    state = {
        "queue": [],
        "launch_error": None,
        "logs": ["step 1/2 | reward 0.1", "step 2/2 | reward 0.3"],
        "cluster_job": sky.exceptions.ClusterDoesNotExist("Cluster 'job' does not exist."),
        "services": [],
        "cost_report": [],
    }

    def request(name, result):
        def fn(*args, **kwargs):
            calls.append((name, args, kwargs))
            if name in ("jobs.launch", "launch") and state["launch_error"]:
                return ("raise", state["launch_error"])
            return ("ok", result(*args, **kwargs) if callable(result) else result)

        return fn

    def get(req):
        kind, value = req
        if kind == "raise":
            raise value
        if isinstance(value, Exception):
            raise value
        return value

    def queue(refresh, job_ids=None, **kw):
        if not state["queue"]:
            return sky.exceptions.ClusterNotUpError("No in-progress managed jobs.")
        return (state["queue"], len(state["queue"]), {}, len(state["queue"]))

    def tail(*args, **kwargs):
        calls.append(("tail_logs", args, kwargs))
        for line in state["logs"]:
            print(line)
        return 0

    ids = iter(range(7, 100))  # each managed launch a new job id, as SkyPilot gives
    monkeypatch.setattr(sky.jobs, "launch", request("jobs.launch", lambda *a, **k: ([next(ids)], None)))
    monkeypatch.setattr(sky, "cost_report", request("cost_report", lambda *a, **k: state["cost_report"]))
    monkeypatch.setattr(sky, "launch", request("launch", (1, None)))
    monkeypatch.setattr(sky.jobs, "queue_v2", request("jobs.queue_v2", queue))
    monkeypatch.setattr(sky.jobs, "cancel", request("jobs.cancel", None))
    monkeypatch.setattr(sky, "down", request("down", sky.exceptions.ClusterDoesNotExist("gone")))
    monkeypatch.setattr(sky.jobs, "tail_logs", tail)
    monkeypatch.setattr(sky, "job_status", request("job_status", lambda *a, **k: state["cluster_job"]))
    monkeypatch.setattr(sky.serve, "status", request("serve.status", lambda *a, **k: state["services"]))
    monkeypatch.setattr(sky, "get", get)
    monkeypatch.setattr(sky, "stream_and_get", get)
    return calls, state


def cloud_blueprint(blueprint, extra: str = "") -> Path:
    """MINIMAL as a cloud job, its reward function beside it (the folder that gets uploaded)."""
    from spec_helpers import MINIMAL, REWARD

    text = MINIMAL.replace(str(REWARD), "reward.py").replace("trainer:", "secrets: [HF_TOKEN]\ntrainer:")
    return blueprint(
        text + "resources: {infra: aws, accelerators: H100:2, bucket: s3://ckpts}\n" + extra,
        files={"reward.py": REWARD.read_text()},
    )


def test_cloud_job_lifecycle_through_the_sdk(blueprint, cli, fake_sdk, tmp_path, monkeypatch):
    calls, state = fake_sdk
    from r1cloud.costs import prices

    h100 = prices.Offer("AWS", "H100", 2, "p5.fake", "us-east-1", 10.0, 4.0)  # a fake catalog row
    monkeypatch.setattr(prices, "offers", lambda wanted, clouds=None: ([h100], ""))
    bp = cloud_blueprint(blueprint)
    r = cli("train", bp, "--secret", "HF_TOKEN=hf_top_secret", "--detach", "--max-cost", "50")
    assert r.exit_code == 0, r.stderr
    assert "managed job 7" in r.stdout
    name, args, kwargs = next(c for c in calls if c[0] == "jobs.launch")
    task = args[0]
    assert kwargs["name"] == "job" and task.num_nodes == 1
    # the budget reaches the trainer on the node: the price, and the launch time to count from
    assert task.envs["R1CLOUD_PRICE"] == "10" and abs(float(task.envs["R1CLOUD_STARTED"]) - time.time()) < 60
    assert task.secrets["HF_TOKEN"].get_secret_value() == "hf_top_secret"  # passed as an override
    job_dir = tmp_path / "r1home" / "jobs" / "job"
    written = "".join(p.read_text() for p in job_dir.iterdir() if p.is_file())
    assert "hf_top_secret" not in written  # the value is in no file
    record = json.loads((job_dir / "job.json").read_text())
    assert record["cloud"] == {"managed": True, "job_id": 7, "cluster": ""}
    assert "save_checkpoint_path: s3://ckpts/job/checkpoints" in (job_dir / "spec.yaml").read_text()

    # no managed jobs in the queue yet: an empty state, not an error
    r = cli("jobs")
    assert r.exit_code == 0 and "PENDING" in r.stdout, r.stdout + r.stderr
    state["queue"] = [{"job_id": 7, "status": sky.jobs.ManagedJobStatus.RECOVERING, "recovery_count": 1}]
    r = cli("jobs")
    assert "RUNNING" in r.stdout and "COST" in r.stdout  # seconds at $10 an hour: under a cent
    assert re.search(r"RUNNING .* \$0\.00\d\d\b", r.stdout), r.stdout
    assert json.loads((job_dir / "job.json").read_text())["attempts"] == 2  # one recovery
    assert record["price"] == 10.0
    r = cli("status", "job")
    assert "spent, at $10.00/hour" in r.stdout and "at most $50.00" in r.stdout, r.stdout

    r = cli("logs", "job")
    assert r.exit_code == 0 and "step 2/2" in r.stdout
    assert next(c for c in calls if c[0] == "tail_logs")[2] == {"job_id": 7, "follow": False}

    r = cli("stop", "job")
    assert r.exit_code == 0 and "STOPPED" in r.stdout
    assert next(c for c in calls if c[0] == "jobs.cancel")[2] == {"job_ids": [7]}

    state["queue"] = [{"job_id": 7, "status": sky.jobs.ManagedJobStatus.CANCELLED}]
    r = cli("status", "job")
    assert "STOPPED" in r.stdout and "s3://ckpts" in r.stdout


def test_unmanaged_cluster_launch_autostops_and_goes_down(blueprint, cli, fake_sdk, monkeypatch):
    """--no-managed: a cluster that stops when idle and goes down; its job's state comes from
    sky.job_status while the cluster lives, and a cluster that is gone ends the job (ENDED), its
    time counted to when the cluster went down (SkyPilot's cost report), not to when r1cloud looked."""
    calls, state = fake_sdk
    from r1cloud.costs import prices

    h100 = prices.Offer("AWS", "H100", 2, "p5.fake", "us-east-1", 36.0, 14.0)
    monkeypatch.setattr(prices, "offers", lambda wanted, clouds=None: ([h100], ""))
    r = cli("train", cloud_blueprint(blueprint), "--secret", "HF_TOKEN=x", "--no-managed", "--detach")
    assert r.exit_code == 0, r.stderr
    _, _, kwargs = next(c for c in calls if c[0] == "launch")
    assert (
        kwargs["cluster_name"] == "job" and kwargs["down"] is True and kwargs["idle_minutes_to_autostop"] > 0
    )
    state["cluster_job"] = {1: sky.JobStatus.SETTING_UP}
    assert "PENDING" in cli("jobs").stdout
    assert next(c for c in calls if c[0] == "job_status")[1] == ("job", [1])
    state["cluster_job"] = {1: sky.JobStatus.RUNNING}
    assert "RUNNING" in cli("status", "job").stdout
    state["cluster_job"] = sky.exceptions.ClusterDoesNotExist("Cluster 'job' does not exist.")
    record_file = Path(os.environ["R1CLOUD_HOME"]) / "jobs/job/job.json"
    record = json.loads(record_file.read_text())
    started = record["started_at"] = record["started_at"] - 3600  # as if launched an hour ago
    record_file.write_text(json.dumps(record))
    state["cost_report"] = [  # an earlier cluster of the same name, and this launch's: up 10 minutes
        {"name": "job", "usage_intervals": [(started - 9000, started - 3600)]},
        {"name": "other", "usage_intervals": [(started, None)]},
        {"name": "job", "usage_intervals": [(int(started) + 1, int(started) + 601)]},
    ]
    r = cli("status", "job")
    assert "ENDED" in r.stdout and "cluster is gone" in r.stdout, r.stdout
    record = json.loads(record_file.read_text())
    assert record["ended_at"] == int(started) + 601 and record["spent"] == pytest.approx(6.0, abs=0.02)
    r = cli("stop", "job")  # already ended: said, not an error
    assert r.exit_code == 0 and "Traceback" not in r.stderr, r.stderr


def test_a_cluster_jobs_failure_is_read_from_its_cluster(blueprint, cli, fake_sdk):
    _, state = fake_sdk
    cli("train", cloud_blueprint(blueprint), "--secret", "HF_TOKEN=x", "--no-managed", "--detach")
    state["cluster_job"] = {1: sky.JobStatus.FAILED_SETUP}
    r = cli("status", "job")
    assert "FAILED" in r.stdout and "FAILED_SETUP" in r.stdout, r.stdout


@pytest.mark.parametrize(
    "error,says",
    [
        (
            lambda: sky.exceptions.NoCloudAccessError("Cloud access is not set up. Run: sky check"),
            "sky check",
        ),
        (lambda: sky.exceptions.ResourcesUnavailableError("Failed to acquire resources"), "sky show-gpus"),
    ],
    ids=["no-credentials", "no-capacity"],
)
def test_launch_failures_are_one_message_and_leave_nothing(blueprint, cli, fake_sdk, tmp_path, error, says):
    _, state = fake_sdk
    state["launch_error"] = error()
    r = cli("train", cloud_blueprint(blueprint), "--secret", "HF_TOKEN=x", "--detach")
    assert r.exit_code == 2 and says in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "r1home" / "jobs" / "job").exists()  # nothing half-created


def test_managed_job_without_a_bucket_is_refused_before_anything_runs(blueprint, cli, fake_sdk):
    calls, _ = fake_sdk
    text = cloud_blueprint(blueprint).read_text().replace(", bucket: s3://ckpts", "")
    r = cli("train", blueprint(text, name="nobucket.yaml"), "--secret", "HF_TOKEN=x", "--detach")
    assert r.exit_code == 2 and "resources.bucket" in r.stderr and "--bucket" in r.stderr
    assert not calls


def test_the_real_sdk_with_no_api_server_gives_the_clear_message(blueprint, tmp_path, sky_home):
    bp = cloud_blueprint(blueprint)
    r = subprocess.run(
        [R1CLOUD, "train", str(bp), "--secret", "HF_TOKEN=x", "--detach"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={
            **os.environ,
            "HOME": str(sky_home),
            "R1CLOUD_HOME": str(tmp_path / "r1home"),
            "SKYPILOT_DISABLE_LOCAL_API_SERVER": "1",
        },
        timeout=120,
    )
    assert r.returncode == 2, r.stdout + r.stderr
    assert "no API server" in r.stderr and "sky check" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "r1home" / "jobs" / "job").exists()


@pytest.mark.slow
def test_the_real_sdk_through_a_local_api_server_with_no_cloud(blueprint, tmp_path, sky_home):
    """SkyPilot's own local API server, started by its CLI in this environment (click and uvicorn
    as the lock pins them, past SkyPilot's click<8.2: requirements/overrides.txt), takes the
    launch; with no cloud credentials the job ends as one message, and nothing is kept."""
    env = {**os.environ, "HOME": str(sky_home), "SKYPILOT_DISABLE_USAGE_COLLECTION": "1"}
    env.pop("SKYPILOT_DISABLE_LOCAL_API_SERVER", None)
    sky_cli = str(Path(sys.executable).parent / "sky")
    r = subprocess.run([sky_cli, "api", "start"], capture_output=True, text=True, env=env, timeout=180)
    try:
        assert r.returncode == 0 and "API server started" in r.stdout + r.stderr, r.stdout + r.stderr
        r = subprocess.run(
            [R1CLOUD, "train", str(cloud_blueprint(blueprint)), "--secret", "HF_TOKEN=x", "--detach"],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            env={**env, "R1CLOUD_HOME": str(tmp_path / "r1home")},
            timeout=300,
        )
    finally:
        subprocess.run([sky_cli, "api", "stop"], capture_output=True, env=env, timeout=120)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "no cloud is set up for SkyPilot" in r.stderr and "sky check" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "r1home" / "jobs" / "job").exists()


def test_skyserve_service_for_a_model(cli, fake_sdk, monkeypatch, tmp_path, sky_home):
    """serve --infra: a SkyServe service with an autoscaling range, a readiness probe, the key as
    a secret reference (its value only in secrets_overrides); stop takes the service down."""
    calls, _ = fake_sdk
    ups = []

    def up(task, service_name):
        ups.append((task, service_name))
        return ("ok", (service_name, "3.4.5.6:30001"))

    monkeypatch.setattr(sky.serve, "up", up)
    monkeypatch.setattr(
        sky.serve, "down", lambda name, **kw: calls.append(("serve.down", name)) or ("ok", None)
    )
    r = cli(
        "serve",
        "-c",
        "Qwen/Qwen2.5-0.5B-Instruct",
        "--infra",
        "aws",
        "--replicas",
        "1-3",
        "--api-key",
        "sk-123",
    )
    assert r.exit_code == 0, r.stderr
    assert "http://3.4.5.6:30001/v1" in r.stdout
    ((task, service),) = ups
    assert service == "serve-qwen-qwen2.5-0.5b-instruct"
    assert task.service.min_replicas == 1 and task.service.max_replicas == 3
    assert task.service.readiness_path == "/health"  # /v1 wants the key; the probe would need it
    assert task.secrets["R1CLOUD_API_KEY"].get_secret_value() == "sk-123"
    assert "--api-key" in task.run and "sk-123" not in task.run
    job = json.loads((tmp_path / "r1home" / "jobs" / service / "job.json").read_text())
    assert (
        job["kind"] == "serve" and job["url"] == "http://3.4.5.6:30001/v1" and "sk-123" not in json.dumps(job)
    )
    _, state = fake_sdk
    state["services"] = [{"name": service, "status": sky.serve.ServiceStatus.REPLICA_INIT}]
    assert "PENDING" in cli("jobs").stdout
    state["services"] = [{"name": service, "status": sky.serve.ServiceStatus.READY}]
    assert "RUNNING" in cli("jobs").stdout
    state["services"] = [{"name": service, "status": sky.serve.ServiceStatus.NO_REPLICA}]
    assert "no replica is ready" in cli("status", service).stdout
    r = cli("stop", service)
    assert r.exit_code == 0 and ("serve.down", service) in calls


def test_skyserve_refuses_a_model_that_lives_on_this_machine(cli, fake_sdk, tmp_path):
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "model.safetensors").write_bytes(b"")
    r = cli("serve", "-c", str(model), "--infra", "aws")
    assert r.exit_code == 2 and "cannot read" in r.stderr and "--push-to-hub" in r.stderr


def test_skyserve_task_from_a_bucket_validates(tmp_path, sky_home):
    from r1cloud.jobs.sky_task import service_config, to_yaml

    config = service_config(
        "serve-job",
        "s3://ckpts/job/checkpoints/global_step_9/huggingface",
        "job-step-9",
        "aws",
        "L4:1",
        "2",
        False,
        extra=["--enable-auto-tool-choice", "--tool-call-parser", "hermes"],
    )
    assert "--enable-auto-tool-choice --tool-call-parser hermes" in config["run"]
    assert config["file_mounts"] == {
        "/r1cloud-model": {
            "source": "s3://ckpts/job/checkpoints/global_step_9/huggingface",
            "mode": "MOUNT_CACHED",
        }
    }
    assert config["service"] == {"readiness_probe": {"path": "/v1/models"}, "replicas": 2}
    (tmp_path / "svc.yaml").write_text(to_yaml(config))
    validate_with_sky([tmp_path / "svc.yaml"], sky_home)


def test_a_cloud_jobs_checkpoints_are_read_from_its_bucket(blueprint, cli, fake_sdk, monkeypatch, s3):
    """`checkpoints JOB` and `serve -c JOB --infra` on a cloud job go to its bucket (moto's S3
    server here): the listing, and a service whose replicas mount the merged model from there."""
    fs = s3.fs()
    step = "ckpts/job/checkpoints/global_step_3"
    fs.pipe_file(
        f"{step}/trainer_state.json", json.dumps({"step": 3, "metrics": {"reward/overall": 0.5}}).encode()
    )
    fs.pipe_file(
        f"{step}/huggingface/config.json", json.dumps({"architectures": ["Qwen2ForCausalLM"]}).encode()
    )
    fs.pipe_file(f"{step}/huggingface/model.safetensors", b"\0" * 16)
    r = cli("train", cloud_blueprint(blueprint), "--secret", "HF_TOKEN=x", "--detach")
    assert r.exit_code == 0, r.stderr
    r = cli("checkpoints", "job")
    assert r.exit_code == 0, r.stderr
    assert "job:step-3" in r.stdout and "0.500" in r.stdout and "yes" in r.stdout  # from the bucket
    ups = []
    monkeypatch.setattr(
        sky.serve,
        "up",
        lambda task, service_name: ups.append(task) or ("ok", (service_name, "1.2.3.4:80")),
    )
    r = cli("serve", "-c", "job", "--infra", "aws")
    assert r.exit_code == 0, r.stderr
    (task,) = ups
    assert "/r1cloud-model" in task.run and "--served-model-name job-step-3" in task.run
    (mount,) = task.storage_mounts.values()
    assert mount.source == "s3://ckpts/job/checkpoints/global_step_3/huggingface"


def test_a_cloud_budget_stop_ends_as_budget_reached_and_resumes_with_its_spend(
    blueprint, cli, fake_sdk, monkeypatch, s3
):
    """SkyPilot calls a budget-stopped job SUCCEEDED (its node exits 0, so a managed job is not
    restarted); r1cloud reads the stop from the last checkpoint in the bucket (moto's S3 server
    here) and shows BUDGET_REACHED. `train --resume JOB` launches the same job again (same name,
    same bucket folder) with the first launch's spend carried into the budget; a launch that
    fails puts the record back as it was. The fake: SkyPilot's request functions (fake_sdk)."""
    calls, state = fake_sdk
    from r1cloud.costs import prices

    h100 = prices.Offer("AWS", "H100", 2, "p5.fake", "us-east-1", 36.0, 14.0)
    monkeypatch.setattr(prices, "offers", lambda wanted, clouds=None: ([h100], ""))
    bp = cloud_blueprint(blueprint)
    r = cli("train", bp, "--secret", "HF_TOKEN=x", "--detach", "--max-cost", "5")
    assert r.exit_code == 0, r.stderr
    home = Path(os.environ["R1CLOUD_HOME"]) / "jobs" / "job"
    record = json.loads((home / "job.json").read_text())
    started = record["started_at"] = record["started_at"] - 600  # as if launched 10 minutes ago
    (home / "job.json").write_text(json.dumps(record))
    # what the trainer leaves in the bucket when its budget stops it after step 1
    why = "[budget] budget reached: $4.80 spent of $5.00 (resources.max_cost, at $36.00/hour); the next step would bring it to $5.20; stopped after step 1"
    state_file = {"step": 1, "loader": {}, "metrics": {}, "stopped": why, "launched": round(started)}
    s3.fs().pipe_file(
        "ckpts/job/checkpoints/global_step_1/trainer_state.json", json.dumps(state_file).encode()
    )
    tracker = {"last_global_step": 1, "last_actor_path": "s3://ckpts/job/checkpoints/global_step_1/actor"}
    s3.fs().pipe_file("ckpts/job/checkpoints/checkpoint_tracker.json", json.dumps(tracker).encode())
    ended = started + 480  # SkyPilot's end time: 8 minutes at $36 an hour is $4.80
    state["queue"] = [{"job_id": 7, "status": sky.jobs.ManagedJobStatus.SUCCEEDED, "end_at": ended}]
    r = cli("jobs")
    assert re.search(r"BUDGET_REACHED .* \$4\.80\b", r.stdout), r.stdout
    record = json.loads((home / "job.json").read_text())
    assert record["status"] == "BUDGET_REACHED" and record["exit_code"] == 75
    assert record["reason"].startswith("budget reached: $4.80 spent of $5.00")
    assert record["spent"] == pytest.approx(4.80) and record["ended_at"] == ended
    r = cli("logs", "-f", "job")  # following it ends as `train` does on a budget stop
    assert r.exit_code == 75 and "job BUDGET_REACHED: budget reached" in r.stdout, r.stdout
    assert "r1cloud train --resume job --max-cost DOLLARS" in r.stdout

    r = cli("train", "--resume", "job", "--secret", "HF_TOKEN=x", "--detach", "--max-cost", "4")
    assert r.exit_code == 2 and "job has already spent $4.80 of its $4.00" in r.stderr, r.stderr
    state["launch_error"] = sky.exceptions.ResourcesUnavailableError("no H100 anywhere")
    r = cli("train", "--resume", "job", "--secret", "HF_TOKEN=x", "--detach", "--max-cost", "20")
    assert r.exit_code == 2 and "Traceback" not in r.stderr, r.stderr
    assert json.loads((home / "job.json").read_text()) == record  # as it was before the failed launch
    assert "max_cost: 5" in (home / "spec.yaml").read_text()

    state["launch_error"] = None
    launches = sum(c[0] == "jobs.launch" for c in calls)
    r = cli("train", "--resume", "job", "--secret", "HF_TOKEN=x", "--detach", "--max-cost", "20")
    assert r.exit_code == 0 and "resumed job · managed job 8" in r.stdout, r.stderr
    name, args, kwargs = [c for c in calls if c[0] == "jobs.launch"][launches]
    task = args[0]
    assert kwargs["name"] == "job" and float(task.envs["R1CLOUD_SPENT"]) == pytest.approx(4.80)
    assert float(task.envs["R1CLOUD_STARTED"]) > ended
    node = yaml.safe_load((home / "node-spec.yaml").read_text())
    assert node["trainer"]["save_checkpoint_path"] == "s3://ckpts/job/checkpoints"  # where step 1 is
    assert node["trainer"]["find_last_checkpoint"] is True and node["resources"]["max_cost"] == 20
    assert not (home.parent / "job-2").exists()
    state["queue"] = [
        {"job_id": 7, "status": sky.jobs.ManagedJobStatus.SUCCEEDED, "end_at": ended},
        {"job_id": 8, "status": sky.jobs.ManagedJobStatus.RUNNING},
    ]
    r = cli("status", "job")
    assert "RUNNING" in r.stdout and re.search(r"cost +\$4\.8\d spent", r.stdout), r.stdout
    r = cli("train", "--resume", "job", "--secret", "HF_TOKEN=x", "--detach", "--max-cost", "20")
    assert r.exit_code == 2 and "job is already running" in r.stderr, r.stderr
    for rename in (("--name", "job-b"), ("name=job-b",)):  # the flag, or an override
        r = cli("train", "--resume", "job", *rename, "--secret", "HF_TOKEN=x", "--detach")
        assert r.exit_code == 2 and "a resumed job keeps its name" in r.stderr, r.stderr
    # this launch ends (a lowered max_steps, val_only) without a checkpoint of its own: the
    # bucket's last one is the first launch's budget stop, which is not this launch's end
    state["queue"][1] = {"job_id": 8, "status": sky.jobs.ManagedJobStatus.SUCCEEDED, "end_at": time.time()}
    r = cli("status", "job")
    assert "SUCCEEDED" in r.stdout and "BUDGET_REACHED" not in r.stdout, r.stdout


def test_a_resumed_jobs_launch_in_flight_is_not_refreshed_or_stopped_as_its_old_launch(
    blueprint, cli, fake_sdk
):
    """Between `reopen` and SkyPilot's answer, a resumed job's record still names its old launch
    (job id 7): `jobs` must not read that launch's end into the new one, nor `stop` cancel it."""
    calls, state = fake_sdk
    from r1cloud.core.jobstore import JobStore
    from r1cloud.jobs import remote

    assert cli("train", cloud_blueprint(blueprint), "--secret", "HF_TOKEN=x", "--detach").exit_code == 0
    state["queue"] = [{"job_id": 7, "status": sky.jobs.ManagedJobStatus.RUNNING}]
    assert "RUNNING" in cli("jobs").stdout
    store = JobStore()
    seen = store.get("job")  # as a slow `r1cloud jobs` read it, running
    state["queue"] = [{"job_id": 7, "status": sky.jobs.ManagedJobStatus.SUCCEEDED, "end_at": time.time()}]
    assert "SUCCEEDED" in cli("jobs").stdout
    remote.reopen(store, "job", 10.0, "H100:2")  # the relaunch has begun; SkyPilot has not answered
    r = cli("jobs")
    assert "PENDING" in r.stdout and store.get("job").status == "PENDING", r.stdout
    remote.refresh(store, [seen])  # the slow `jobs` writes what it learnt of the old launch: not over the new
    assert store.get("job").status == "PENDING" and store.get("job").ended_at is None
    r = cli("stop", "job")
    assert r.exit_code == 2 and "job is being launched" in r.stderr, r.stderr
    assert not any(c[0] == "jobs.cancel" for c in calls)


def test_a_cloud_job_whose_launch_was_cut_off_stays_a_cloud_job(blueprint, cli, fake_sdk):
    """A cloud job whose launch SkyPilot has not answered has no launch record yet (`cloud` is
    empty). It is still a cloud job: while its launcher lives it stays PENDING (however long the
    launch takes); cut off (Ctrl-C) or its launcher gone, it ends FAILED saying the launch may
    still go on; `train --resume` launches it in the cloud again, never as a local job."""
    import subprocess

    from r1cloud.core.jobstore import JobStore

    calls, state = fake_sdk
    state["launch_error"] = KeyboardInterrupt()
    r = cli("train", cloud_blueprint(blueprint), "--secret", "HF_TOKEN=x", "--detach")
    assert r.exit_code != 0
    store = JobStore()
    job = store.get("job")
    assert job.status == "FAILED" and job.cloud == {} and "sky jobs cancel -n job" in job.reason
    r = cli("logs", "job")
    assert r.exit_code == 2 and "SkyPilot has not answered its launch" in r.stderr, r.stderr

    # a launch in flight, 10 minutes in, by a launcher that is alive (this process), then gone
    with store.locked("job") as j:
        j.status, j.reason, j.created_at = "PENDING", "", time.time() - 600
        j.pid, j.pid_started = os.getpid(), None
    assert store.get("job").status == "PENDING"
    r = cli("stop", "job")
    assert (
        r.exit_code == 2
        and "job is being launched" in r.stderr
        and not any(c[0] == "jobs.cancel" for c in calls)
    )
    gone = subprocess.Popen(["true"])
    gone.wait()
    with store.locked("job") as j:
        j.pid = gone.pid
    job = store.get("job")
    assert job.status == "FAILED" and "launch was cut off before SkyPilot answered" in job.reason

    state["launch_error"] = None
    r = cli("train", "--resume", "job", "--secret", "HF_TOKEN=x", "--detach")
    assert r.exit_code == 0 and "resumed job · managed job 7" in r.stdout, r.stdout + r.stderr
    job = store.get("job")
    assert job.status == "PENDING" and job.cloud["job_id"] == 7 and job.pid is None and job.started_at
