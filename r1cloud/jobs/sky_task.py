"""A spec as a SkyPilot task: plain data (no `sky` import), so `train --dry-run` prints it fast and
the tests validate it with SkyPilot's own parser.

What the task carries:
- resources: the accelerator (alternatives as `any_of` for a dict, `ordered` for a list), spot,
  infra, disk, `image_id: docker:…`, nodes; managed jobs add `job_recovery`.
- the user's folder as `workdir` (every local file the blueprint names must lie under it; the
  resolved spec names them relative to it), the resolved spec and, from a source checkout,
  r1cloud's own source as file mounts;
- `envs`, and `secrets` as null references filled at launch (`secrets_overrides`), never values;
- `setup`: r1cloud with its training extras, vLLM, and the folder's `requirements.txt`;
- `run`: `python -m r1cloud.jobs.node RUN_DIR`, the entrypoint that starts Ray across the nodes and
  the trainer on the first.

Checkpoints go straight to `resources.bucket` (fsspec), keyed by the job name, so a recovered
managed job resumes from the last complete one.
"""

from __future__ import annotations

import glob
import os
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from r1cloud import __version__
from r1cloud.core.accelerators import accelerator_options

if TYPE_CHECKING:
    from r1cloud.spec import Spec

SPEC_ON_NODE = "~/.r1cloud/spec.yaml"
SOURCE_ON_NODE = "~/.r1cloud/src"
VLLM_GPU = "vllm==0.32.0"  # the release whose weight-sync API the trainer uses (its CPU build here)
UV = "uv==0.13.9"  # installs the node's packages (several times faster than pip on vLLM's)
RAY_TOKEN = "RAY_AUTH_TOKEN"  # multi-node: the Ray cluster's token, drawn at each launch
RECOVERIES = 3  # managed jobs: restarts after a user-code failure (preemptions are always recovered)


class TaskError(ValueError):
    """A spec that cannot become a cloud task; the message names the field and the fix."""


def workdir_for(spec_data: dict, blueprint: Path) -> Path:
    """The folder to upload: the blueprint's folder, widened to hold every local file it names."""
    from r1cloud.validate.files import job_folder  # loads the schema (pydantic): not at start-up

    root = job_folder(spec_data, blueprint)
    if (
        Path.home().is_relative_to(root)
        or root == Path("/")
        or (len(root.parts) == 2 and root.name in SYSTEM)
    ):
        raise TaskError(
            f"the blueprint's files span {root}, too wide to upload as the job's folder: keep the "
            "blueprint, prompts, reward functions and data under one project folder"
        )
    size = _size_up_to(root, WORKDIR_LIMIT)
    if size > WORKDIR_LIMIT:
        raise TaskError(
            f"the job's folder {root} holds more than {WORKDIR_LIMIT >> 30} GiB, too much to upload with "
            "every launch: put the data in a bucket or on the Hub (data.train_files: s3://… or name@split), "
            "or keep the blueprint's files in a smaller folder"
        )
    return root


SYSTEM = {
    "tmp",
    "var",
    "usr",
    "etc",
    "opt",
    "home",
    "root",
    "mnt",
    "srv",
    "media",
    "dev",
    "proc",
    "sys",
    "Users",
}
WORKDIR_LIMIT = 2 << 30  # bytes: what SkyPilot uploads with every launch


def _size_up_to(root: Path, limit: int) -> int:
    """The bytes SkyPilot would upload from `root`, counted until they pass `limit` (then a number
    above it). As SkyPilot does: a `.skyignore` there says what is left out; else, in a git work
    tree, what .gitignore ignores."""
    ignored = _skyignored(root)
    files = None
    if ignored is None:
        try:
            listed = subprocess.run(
                ["git", "-C", str(root), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                capture_output=True,
            )
        except OSError:  # no git here: every file counts
            listed = None
        if listed is not None and listed.returncode == 0:
            files = [root / p for p in listed.stdout.decode(errors="replace").split("\0") if p]
    if files is None:
        left_out = ignored or set()
        files = []
        for d, dirs, names in os.walk(root):
            dirs[:] = [x for x in dirs if os.path.join(d, x) not in left_out]
            files += [Path(d) / f for f in names if os.path.join(d, f) not in left_out]
    total = 0
    for path in files:
        try:
            total += os.lstat(path).st_size
        except OSError:
            continue
        if total > limit:
            break
    return total


def _skyignored(root: Path) -> set[str] | None:
    """The paths `root/.skyignore` leaves out, matched as SkyPilot 0.14 matches them (a pattern
    starting with / from the root, any other at any depth); None without the file."""
    try:
        lines = (root / ".skyignore").read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return None
    out: set[str] = set()
    for line in (x.strip() for x in lines):
        if line and not line.startswith("#"):
            pattern = "." + line if line.startswith("/") else "**/" + line
            out.update(os.path.normpath(p) for p in glob.glob(os.path.join(root, pattern), recursive=True))
    return out


def relative_to(value, root: Path):
    """The spec with local paths under `root` rewritten relative to it (the node runs in its copy)."""
    if isinstance(value, dict):
        return {k: relative_to(v, root) for k, v in value.items()}
    if isinstance(value, list):
        return [relative_to(v, root) for v in value]
    if isinstance(value, str) and value.startswith("/") and os.path.exists(value):
        return os.path.relpath(value, root)
    return value


def node_spec(spec: Spec, blueprint: Path) -> tuple[dict, Path]:
    """The resolved spec as the nodes read it, and the workdir it is relative to."""
    data = spec.model_dump(mode="json")
    root = workdir_for(data, blueprint)
    data = relative_to(data, root)
    if spec.resources.bucket:
        data["trainer"]["save_checkpoint_path"] = checkpoint_url(spec)
        data["trainer"]["find_last_checkpoint"] = True
    return data, root


def checkpoint_url(spec: Spec) -> str:
    return f"{spec.resources.bucket.rstrip('/')}/{spec.name}/checkpoints"


def resources(spec: Spec, managed: bool) -> dict:
    r = spec.resources
    out: dict = {"infra": r.infra}
    if r.accelerators is not None:
        options = [f"{name}:{count}" for name, count in accelerator_options(r.accelerators)]
        if len(options) == 1:
            out["accelerators"] = options[0]
        else:
            key = "any_of" if isinstance(r.accelerators, dict) else "ordered"
            out[key] = [{"accelerators": o} for o in options]
    if r.use_spot:
        out["use_spot"] = True
    if r.disk_size:
        out["disk_size"] = r.disk_size
    if r.image:
        out["image_id"] = r.image if r.image.startswith("docker:") else f"docker:{r.image}"
    if r.region:
        out["infra"] = f"{r.infra.split('/', 1)[0]}/{r.region}"
    if managed:
        out["job_recovery"] = {"max_restarts_on_errors": RECOVERIES}
    return out


def source_checkout() -> Path | None:
    """r1cloud's source folder when it runs from a checkout (then the nodes install that)."""
    root = Path(__file__).resolve().parents[2]
    return root if (root / "pyproject.toml").is_file() and (root / "r1cloud").is_dir() else None


def setup_script(source: Path | None, loggers: tuple[str, ...] = ()) -> str:
    """Install r1cloud on the node with the trainer (its `train` extra brings vLLM's CUDA build)
    and the trackers the blueprint logs to, with uv; from a checkout, at the versions its
    requirements/lock-gpu.txt pins (an image built from docker/Dockerfile already holds them)."""
    on_node = SOURCE_ON_NODE.replace("~", "$HOME")  # quoted, so the shell would not expand ~
    extras = ",".join(["train", *(x for x in ("wandb", "swanlab", "mlflow") if x in loggers)])
    package = f'"{on_node}[{extras}]"' if source else f'"r1cloud[{extras}]=={__version__}"'
    lock = f' -c "{on_node}/requirements/lock-gpu.txt" --override "{on_node}/requirements/overrides.txt"'
    lock = lock if source else ""
    uv = 'python -m uv pip install -q --python "$(command -v python)"'
    return "\n".join(
        [
            "set -euo pipefail",
            f"python -m pip install -q {UV}",
            f"{uv}{lock} {package}",
            f"if [ -f requirements.txt ]; then {uv} -r requirements.txt; fi",
        ]
    )


RUN = """set -euo pipefail
run_dir=~/r1cloud-run/{name}
mkdir -p "$run_dir"
cp {spec} "$run_dir/spec.yaml"
exec python -m r1cloud.jobs.node "$run_dir"
"""


def check_cloud(spec: Spec, managed: bool) -> None:
    if spec.resources.infra == "local":
        raise TaskError("resources.infra is local: a SkyPilot task needs a cloud infra (aws, gcp, k8s, …)")
    if not spec.resources.bucket:
        how = "resume after a preemption" if managed else "outlive its cluster, which is torn down at the end"
        raise TaskError(
            f"resources.bucket is not set: a cloud job keeps its checkpoints in a bucket to {how}; "
            "set resources.bucket: s3://BUCKET (or gs://, r2://…) or pass --bucket"
        )


def task_config(spec: Spec, root: Path, spec_file: Path, managed: bool = True) -> dict:
    """The SkyPilot task for `spec`, uploading `root` (`node_spec`'s workdir). `spec_file` is where
    the node spec was written on this machine; it is mounted on every node."""
    source = source_checkout()
    mounts = {SPEC_ON_NODE: str(spec_file)}
    if source:
        mounts[SOURCE_ON_NODE] = str(source)
    config = {
        "name": spec.name,
        "num_nodes": spec.trainer.nnodes,
        "resources": resources(spec, managed),
        "workdir": str(root),
        "file_mounts": mounts,
        "envs": {**spec.envs, "R1CLOUD_JOB": spec.name},
        "setup": setup_script(source, spec.trainer.logger),
        "run": RUN.format(name=spec.name, spec=SPEC_ON_NODE),
    }
    secrets = [*spec.secrets, *([RAY_TOKEN] if spec.trainer.nnodes > 1 else [])]
    if secrets:
        config["secrets"] = {name: None for name in secrets}
    return config


def to_yaml(config: dict) -> str:
    """The task as YAML, scripts as literal blocks (readable, and what `sky launch` reads)."""

    class Dumper(yaml.SafeDumper):
        pass

    def text(dumper, value: str):
        style = "|" if "\n" in value else None
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)

    Dumper.add_representer(str, text)
    return yaml.dump(config, Dumper=Dumper, sort_keys=False)


SERVE_PORT = 8000
MODEL_ON_REPLICA = "/r1cloud-model"
TARGET_QPS = 4.0  # autoscaling: requests per second one replica is sized for


def parse_replicas(text: str) -> tuple[int, int | None]:
    """`2` -> (2, None) fixed; `1-4` -> (1, 4) autoscaling."""
    low, sep, high = text.partition("-")
    try:
        lo, hi = int(low), int(high) if sep else None
    except ValueError:
        raise TaskError(f"--replicas {text!r}: write a count (2) or a range (1-4)") from None
    if lo < (0 if sep else 1) or (hi is not None and hi < max(lo, 1)):
        raise TaskError(f"--replicas {text!r}: a count of at least 1, or a range LOW-HIGH with HIGH ≥ 1")
    return lo, hi


def service_config(
    name: str,
    model_path: str,
    served: str,
    infra: str,
    accelerators: str,
    replicas: str,
    api_key: bool,
    max_model_len: int | None = None,
    extra: list[str] = (),
) -> dict:
    """A SkyServe service running vLLM's OpenAI server on the model (a Hub id, or a bucket URL
    mounted on each replica). Ready once /v1/models answers (/health when a key guards /v1: the
    probe would need the key written into the task). The key itself is a null secret."""
    low, high = parse_replicas(replicas)
    service: dict = {"readiness_probe": {"path": "/health" if api_key else "/v1/models"}}
    if high is None:
        service["replicas"] = low
    else:
        service["replica_policy"] = {
            "min_replicas": low,
            "max_replicas": high,
            "target_qps_per_replica": TARGET_QPS,
        }
    model_arg, mounts = model_path, {}
    if "://" in model_path:
        mounts[MODEL_ON_REPLICA] = {"source": model_path, "mode": "MOUNT_CACHED"}
        model_arg = MODEL_ON_REPLICA
    run = [
        "python -m vllm.entrypoints.openai.api_server",
        f"--model {model_arg} --served-model-name {served}",
        f"--host 0.0.0.0 --port {SERVE_PORT}",
    ]
    run += ['--api-key "$R1CLOUD_API_KEY"'] if api_key else []
    run += [f"--max-model-len {max_model_len}"] if max_model_len else []
    run += [" ".join(extra)] if extra else []
    config = {
        "name": name,
        "resources": {"infra": infra, "accelerators": accelerators, "ports": SERVE_PORT},
        "service": service,
        "setup": f"python -m pip install -q {VLLM_GPU}",
        "run": " \\\n  ".join(run) + "\n",
    }
    if mounts:
        config["file_mounts"] = mounts
    if api_key:
        config["secrets"] = {"R1CLOUD_API_KEY": None}
    return config
