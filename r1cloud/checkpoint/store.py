"""Listing checkpoints wherever they are — a job, a local folder, a bucket URL (through fsspec) — in
r1cloud's layout or EasyR1/verl's. Reads metadata files only; imports no torch.

r1cloud:  <root>/global_step_N/{actor/ (DCP), trainer_state.json, huggingface/}
EasyR1:   <root>/global_step_N/actor/{model_world_size_W_rank_R.pt, …, huggingface/},
          <root>/checkpoint_tracker.json, <root>/experiment_log.jsonl (per-step metrics)

INFERENCE READY means a Hugging Face model is there: `config.json` naming `architectures` and
safetensors weights, in `huggingface/` (r1cloud) or `actor/huggingface/` (EasyR1).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from r1cloud.core.records import finite, loads, whole

STEP_RE = re.compile(r"global_step_(\d+)$")
SHARD_RE = re.compile(r"model_world_size_(\d+)_rank_(\d+)\.pt$")


@dataclass
class Checkpoint:
    step: int
    path: str  # the global_step_N folder (a path or a URL)
    format: str  # "r1cloud" or "easyr1"
    time: float | None
    train_reward: float | None
    val_reward: float | None
    size: int
    inference_ready: bool
    id: str
    lora_rank: int | None = None  # a LoRA run's checkpoint: its adapters only (actor/adapter_config.json)

    @property
    def hf_dir(self) -> str:
        return f"{self.path}/huggingface" if self.format == "r1cloud" else f"{self.path}/actor/huggingface"


class BucketError(Exception):
    """A bucket URL that cannot be used as it is: (message, hints). The CLI prints it, exit 2."""


PACKAGES = {"s3": "s3fs", "gs": "gcsfs", "gcs": "gcsfs", "az": "adlfs", "abfs": "adlfs", "abfss": "adlfs"}


def filesystem(url: str):
    """(filesystem, path without a trailing slash) for a path or URL. A fresh filesystem each time: fsspec caches them by
    their arguments, and a cached S3 client keeps the endpoint and credentials it was made with
    even after the environment that chose them has changed."""
    import fsspec

    proto = url.split("://", 1)[0] if "://" in url else "file"
    try:
        fs, path = fsspec.core.url_to_fs(url, skip_instance_cache=True)
    except ImportError:
        package = PACKAGES.get(proto, f"the fsspec package for {proto}://")
        raise BucketError(f"{url}: reading {proto}:// needs {package}", [f"pip install {package}"]) from None
    except ValueError as e:
        if "protocol" not in str(e).lower():
            raise
        raise BucketError(
            f"{url}: unknown protocol {proto}://", ["give s3://, gs://, az:// or a local path"]
        ) from None
    return fs, path.rstrip("/")


@contextlib.contextmanager
def bucket_errors(url: str) -> Iterator[None]:
    """Reading `url`: a bucket's failures (credentials, network, permissions, no such bucket) as one
    BucketError naming the URL and what to do; a local path's errors are left as they are."""
    try:
        yield
    except BucketError:
        raise
    except Exception as e:
        if "://" not in url:
            raise
        raise BucketError(*_bucket_reason(url, e)) from None


def _bucket_reason(url: str, e: Exception) -> tuple[str, list[str]]:
    name, text = type(e).__name__, (str(e).strip().splitlines() or [""])[0][:200]
    if name == "ProfileNotFound":
        return f"cannot read {url}: {text}", ["set AWS_PROFILE to a profile in ~/.aws/config, or unset it"]
    if "Credentials" in name or "credentials" in text.lower():
        return f"cannot read {url}: no credentials", [
            "set them as the cloud's tools read them (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, a profile, "
            "GOOGLE_APPLICATION_CREDENTIALS, …); `sky check` tells which clouds are set up"
        ]
    if isinstance(e, PermissionError) or "AccessDenied" in text or "Forbidden" in text:
        return f"cannot read {url}: access denied ({text})", [
            "check the credentials' permissions on this bucket"
        ]
    if isinstance(e, FileNotFoundError) or "NoSuchBucket" in text:
        return f"cannot read {url}: no such bucket or folder", [
            "check the URL: `r1cloud jobs` shows where jobs save"
        ]
    if "Connect" in name or "Endpoint" in name or isinstance(e, ConnectionError | TimeoutError):
        return f"cannot reach {url}: {text or name}", [
            "check the network and the endpoint (AWS_ENDPOINT_URL, if you set one)"
        ]
    return f"cannot read {url}: {name}: {text}", ["check the URL and the credentials"]


def _read_json(fs, path: str) -> dict | None:
    """A JSON object from `path`; None when it is missing, broken, or not an object."""
    try:
        with fs.open(path, "rb") as f:
            data = loads(f.read())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _section(row: dict, key: str) -> dict:
    value = row.get(key)
    return value if isinstance(value, dict) else {}


def _mtime(info: dict) -> float | None:
    value = info.get("mtime") or info.get("LastModified") or info.get("last_modified")
    if value is None:
        return None
    return value if isinstance(value, int | float) else value.timestamp()


def inference_ready(fs, hf_dir: str) -> bool:
    config = _read_json(fs, f"{hf_dir}/config.json")
    if not config or not config.get("architectures"):
        return False
    try:
        return any(p.endswith(".safetensors") for p in fs.ls(hf_dir, detail=False))
    except OSError:
        return False


def _easyr1_metrics(fs, root: str) -> dict[int, dict]:
    """EasyR1's FileLogger: one {"step": N, "reward": {"overall": …}, "val": {…}} line per step."""
    out: dict[int, dict] = {}
    try:
        with fs.open(f"{root}/experiment_log.jsonl", "r") as f:
            for line in f:
                with contextlib.suppress(ValueError):  # a blank line, or one cut off mid-write
                    row = loads(line)
                    if isinstance(row, dict) and whole(row.get("step")) is not None:
                        out[row["step"]] = row
    except (OSError, ValueError):
        pass
    return out


def last_state(root: str) -> dict:
    """The trainer_state.json of the checkpoint `root`'s tracker names last; {} when there is none.
    (In a bucket the tracker is written after the state, so it names a complete checkpoint.)"""
    with bucket_errors(root):
        fs, base = filesystem(root)
        step = whole((_read_json(fs, f"{base}/checkpoint_tracker.json") or {}).get("last_global_step"))
        if step is None:
            return {}
        return _read_json(fs, f"{base}/global_step_{step}/trainer_state.json") or {}


def list_checkpoints(root: str, label: str | None = None) -> list[Checkpoint]:
    """Complete checkpoints under `root`, oldest first. Half-written ones never appear: r1cloud's
    need their trainer_state.json (written last, before the atomic rename), EasyR1's their shards."""
    with bucket_errors(root):
        fs, base = filesystem(root)
        proto = root.split("://", 1)[0] + "://" if "://" in root else ""
        try:
            entries = fs.ls(base, detail=True)
        except FileNotFoundError:
            return []
        except OSError as e:  # a local folder's symlink loop, no permission (a bucket's: bucket_errors)
            raise BucketError(f"cannot read {root}: {e.strerror or e}", ["check the folder"]) from None
        label = label or root
        easyr1_rows = None
        found = []
        for entry in entries:
            m = STEP_RE.search(entry["name"].rstrip("/"))
            if not m or entry.get("type") != "directory":
                continue
            step, path = int(m.group(1)), entry["name"].rstrip("/")
            state = _read_json(fs, f"{path}/trainer_state.json")
            if state is not None:
                fmt, metrics = "r1cloud", _section(state, "metrics")
                train, val = finite(metrics.get("reward/overall")), finite(metrics.get("val/reward_score"))
                when = _mtime(fs.info(f"{path}/trainer_state.json"))
            else:
                try:
                    shards = [p for p in fs.ls(f"{path}/actor", detail=False) if SHARD_RE.search(p)]
                except FileNotFoundError:
                    shards = []
                world = {int(SHARD_RE.search(p).group(1)) for p in shards}
                if not shards or len(world) != 1 or len(shards) != world.pop():
                    continue  # not a checkpoint, or not all of its shards
                if easyr1_rows is None:
                    easyr1_rows = _easyr1_metrics(fs, base)
                row = easyr1_rows.get(step, {})
                fmt, train = "easyr1", finite(_section(row, "reward").get("overall"))
                val = finite(_section(row, "val").get("reward_score"))
                when = _mtime(fs.info(shards[0]))
            ck = Checkpoint(
                step, proto + path, fmt, when, train, val, int(fs.du(path)), False, f"{label}:step-{step}"
            )
            ck.inference_ready = inference_ready(fs, ck.hf_dir.removeprefix(proto))
            if fmt == "r1cloud" and (adapter := _read_json(fs, f"{path}/actor/adapter_config.json")):
                ck.lora_rank = whole(adapter.get("r"), 1, 2**16)
            found.append(ck)
        return sorted(found, key=lambda c: c.step)


def base_model(adapter: dict) -> Path:
    """The local folder of the base model a LoRA adapter (its adapter_config.json) was trained
    on; a Hub name: its cached copy, fetched when it is not cached. NotFound when neither works."""
    name = adapter.get("base_model_name_or_path") or ""
    if Path(name).is_dir():
        return Path(name)
    try:
        from huggingface_hub import snapshot_download

        patterns = ["*.safetensors", "*.json"]
        try:
            return Path(snapshot_download(name, allow_patterns=patterns, local_files_only=True))
        except Exception:  # not cached here
            return Path(snapshot_download(name, allow_patterns=patterns))
    except Exception as e:
        raise NotFound(
            f"error: the adapter's base model {name!r} cannot be read here ({e})",
            ["merge or serve where the base model is, or with access to the Hugging Face Hub"],
        ) from None


def job_checkpoint_root(run_dir: Path) -> str:
    """Where a job's trainer saves: trainer.save_checkpoint_path, else <run dir>/checkpoints."""
    try:
        import yaml

        spec = yaml.safe_load((run_dir / "spec.yaml").read_text())
        path = (spec.get("trainer") or {}).get("save_checkpoint_path")
    except (OSError, ValueError, yaml.YAMLError, AttributeError, RecursionError):  # no spec, or a damaged one
        path = None
    path = path if isinstance(path, str) else None
    return path or str(run_dir / "checkpoints")


def parse_ref(ref: str) -> tuple[str, int | None]:
    """`JOB:step-N` / `PATH:step-N` -> (JOB or PATH, N); a plain name or path -> (it, None)."""
    m = re.match(r"^(.*):step-(\d+)$", ref)
    return (m.group(1), int(m.group(2))) if m else (ref, None)


def locate(ref: str, step: int | None) -> tuple[str, str, int | None] | None:
    """(checkpoints root, label for IDs, step) when `ref` is a folder or URL — a checkpoints root, a
    global_step_N folder, or EasyR1's actor/ folder (what its merger takes); None otherwise."""
    try:
        exists = "://" in ref or Path(ref).exists()
    except (OSError, ValueError):  # a name too long to be a path, a NUL in it
        return None
    if not exists:
        return None
    if "://" not in ref and not Path(ref).is_dir():
        raise NotFound(f"error: {ref} is a file", ["give a job, a checkpoints folder, or a bucket URL"])
    path = ref.rstrip("/").removesuffix("/actor")
    m = STEP_RE.search(path)
    if m and step is None:
        parent = path.rsplit("/", 1)[0] if "/" in path else "."
        return parent, parent, int(m.group(1))
    return path, path, step


class NotFound(Exception):
    """No such checkpoint; args: (title, [hint lines])."""


def select(root: str, label: str, step: int | None) -> Checkpoint:
    """Step `step` of `root`, or its newest complete checkpoint."""
    found = list_checkpoints(root, label)
    if not found:
        raise NotFound(
            f"error: no complete checkpoint in {root}", ["`r1cloud checkpoints` lists what there is"]
        )
    chosen = found[-1] if step is None else next((c for c in found if c.step == step), None)
    if chosen is None:
        raise NotFound(
            f"error: no step {step} in {root}", [f"steps there: {', '.join(str(c.step) for c in found)}"]
        )
    return chosen


def human_size(n: int) -> str:
    size = float(n)
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1024:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TB"
