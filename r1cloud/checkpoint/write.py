"""Checkpoint layout, atomic publication and retention.

```
<checkpoints>/
  checkpoint_tracker.json        {"last_global_step", "last_actor_path", "best_global_step", "best_val_reward_score"}
  global_step_<N>/
    actor/                       torch.distributed.checkpoint (model + optimizer, world-size independent)
    trainer_state.json           step, data loader position, LR scheduler, metrics at that step
```

A checkpoint is complete once its `trainer_state.json` is there, written last. In a local folder
it is written under a temporary name, renamed into place when complete, and only then named in the
tracker (written atomically too). A crash at any moment leaves either the previous checkpoint or
the new one as the last complete one — never a half-written one. Resume takes the newest complete
folder; the tracker (EasyR1's format, for tools that read it) may lag it by one. In a bucket
(`Bucket`) every worker writes its shards in place and the state file still comes last.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from pathlib import Path

from r1cloud.checkpoint.dcp import remove
from r1cloud.checkpoint.folder import ADAPTER_CONFIG
from r1cloud.checkpoint.store import STEP_RE, filesystem
from r1cloud.core.dtypes import DTYPE_NAMES, torch_dtype
from r1cloud.core.records import finite, loads, whole

TRACKER = "checkpoint_tracker.json"
STATE = "trainer_state.json"


class DamagedCheckpoint(Exception):
    """A checkpoint to resume from that is incomplete, damaged or not r1cloud's."""


def write_json_atomic(path: Path, data: dict) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=2)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def next_tracker(tracker: dict, step: int, final: str | Path, val_score: float | None) -> dict:
    """EasyR1's tracker after publishing `step`: the last step, and the best by validation reward."""
    best_step, best = tracker.get("best_global_step"), tracker.get("best_val_reward_score")
    if val_score is not None and (best is None or val_score > best):
        best_step, best = step, round(val_score, 4)
    return {
        "last_global_step": step,
        "last_actor_path": f"{final}/actor",
        "best_global_step": best_step,
        "best_val_reward_score": best,
    }


class Bucket:
    """Checkpoints in a bucket (any fsspec URL: s3://, gs://, …), for jobs whose machines can
    vanish (spot, managed jobs) or that span several machines: every worker writes its own shards
    there directly, so no machine holds a checkpoint alone. Object stores have no atomic rename,
    so a checkpoint is written in place and counts as complete only once its `trainer_state.json`
    is there, written last; a deletion removes that file first."""

    def __init__(self, url: str):
        self.url = url.rstrip("/")
        self.fs, self.root = filesystem(self.url)

    def complete_steps(self) -> list[int]:
        try:
            names = [p.rstrip("/").rsplit("/", 1)[-1] for p in self.fs.ls(self.root, detail=False)]
        except FileNotFoundError:
            return []
        steps = [int(m.group(1)) for n in names if (m := STEP_RE.match(n))]
        return sorted(s for s in steps if self.fs.exists(f"{self.root}/global_step_{s}/{STATE}"))

    def latest(self) -> tuple[int, str] | None:
        """The checkpoint to resume from: the newest complete one (the tracker, written after it
        is complete, may lag it by one)."""
        steps = self.complete_steps()
        return (steps[-1], f"{self.url}/global_step_{steps[-1]}") if steps else None

    def tracker(self) -> dict:
        try:
            return json.loads(self.fs.cat_file(f"{self.root}/{TRACKER}"))
        except (FileNotFoundError, ValueError):
            return {}

    def begin(self, step: int) -> str:
        """Where step `step` is written: its final place, emptied of an earlier save of that step."""
        path = f"{self.root}/global_step_{step}"
        if self.fs.exists(path):
            self.remove_path(path)
        return f"{self.url}/global_step_{step}"

    def put(self, local: Path, url: str) -> None:
        """A local file to `url`, or a folder's files into it (the merged model and its config, and a
        LoRA run's adapter config, written locally)."""
        base = _key(url)
        if local.is_file():  # rglob finds nothing under a file
            return self.fs.put_file(str(local), base)
        for p in sorted(p for p in local.rglob("*") if p.is_file()):
            self.fs.put_file(str(p), f"{base}/{p.relative_to(local).as_posix()}")

    def publish(self, where: str, step: int, state: dict, val_score: float | None) -> str:
        self.fs.pipe_file(f"{_key(where)}/{STATE}", json.dumps(state, indent=2).encode())
        tracker = next_tracker(self.tracker(), step, where, val_score)
        self.fs.pipe_file(f"{self.root}/{TRACKER}", json.dumps(tracker, indent=2).encode())
        return where

    def prune(self, limit: int | None) -> list[int]:
        """Keep at most `limit` complete checkpoints (a limit of 0 or less keeps them all): the
        newest, the best, and the newest others up to `limit` in all."""
        steps = self.complete_steps()
        if limit is None or limit <= 0 or not steps:
            return []
        best = self.tracker().get("best_global_step")
        keep = {steps[-1], *([best] if best in steps else [])}
        for s in reversed(steps):
            if len(keep) >= limit:
                break
            keep.add(s)
        removed = [s for s in steps if s not in keep]
        for s in removed:
            self.remove_path(f"{self.root}/global_step_{s}")
        return removed

    def remove_path(self, path: str) -> None:
        if self.fs.exists(f"{path}/{STATE}"):
            self.fs.rm_file(f"{path}/{STATE}")  # no longer complete before anything else goes
        self.fs.rm(path, recursive=True)


class Checkpoints(Bucket):
    """Checkpoints in a local folder, found and pruned as in a bucket (through fsspec's local
    filesystem), but each written under a temporary name and renamed into place when complete."""

    def __init__(self, root: str | Path):
        from fsspec.implementations.local import LocalFileSystem

        self.folder = Path(root)
        self.folder.mkdir(parents=True, exist_ok=True)
        # the folder itself, not read as a URL: fsspec would expand a leading `~` and split at `::`
        self.url, self.fs, self.root = str(self.folder), LocalFileSystem(), str(self.folder.resolve())

    def begin(self, step: int) -> str:
        """A fresh temporary folder for step `step` (leftovers of a crashed save are removed)."""
        for pattern in (f".global_step_{step}.tmp*", ".global_step_*.deleting-*"):  # a crashed save's
            for p in self.folder.glob(pattern):  # or deletion's leftovers
                shutil.rmtree(p, ignore_errors=True)
        path = self.folder / f".global_step_{step}.tmp"
        path.mkdir()
        return str(path)

    def publish(self, staging: str, step: int, state: dict, val_score: float | None) -> str:
        write_json_atomic(Path(staging) / STATE, state)
        final = self.folder / f"global_step_{step}"
        if final.exists():
            remove(final)
        os.replace(staging, final)
        tracker = next_tracker(self.tracker(), step, final, val_score)
        write_json_atomic(self.folder / TRACKER, tracker)
        return str(final)

    def remove_path(self, path: str) -> None:
        remove(Path(path))


def _key(url: str) -> str:
    """A bucket URL's path as its fsspec filesystem names it (bucket/prefix…)."""
    return url.split("://", 1)[-1]


def read_state(checkpoint: str) -> dict:
    """A checkpoint's trainer_state.json, from a local folder or a bucket, checked: one that is
    damaged or not r1cloud's is a DamagedCheckpoint naming it (a resume would otherwise fail deep inside)."""
    fs, path = filesystem(checkpoint)
    where = f"{checkpoint.rstrip('/')}/{STATE}"
    fix = "resume from another checkpoint (trainer.load_checkpoint_path), or remove this one"
    try:
        state = loads(fs.cat_file(f"{path}/{STATE}"))
    except FileNotFoundError:
        raise DamagedCheckpoint(f"{where} is missing: not a complete checkpoint; {fix}") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise DamagedCheckpoint(f"{where} is damaged ({str(e)[:80]}); {fix}") from None
    loader = state.get("loader") if isinstance(state, dict) else None
    if (
        not isinstance(loader, dict)
        or whole(state.get("step")) is None
        or whole(loader.get("epoch")) is None
        or whole(loader.get("position")) is None
        or not isinstance(state.get("scheduler"), dict | None)
        or not isinstance(state.get("critic_scheduler"), dict | None)
        or ("kl_coef" in state and finite(state["kl_coef"]) is None)
    ):
        raise DamagedCheckpoint(
            f"{where} is not a trainer state r1cloud wrote (step, data position, schedules); {fix}"
        )
    return state


def write_hf_files(
    checkpoints, where: str, model_cfg, saver, scratch: Path, merged: bool, adapter: dict | None = None
) -> None:
    """Config, generation config and tokenizer (a VLM's processor) beside every checkpoint, and a
    LoRA run's `actor/adapter_config.json` (naming the base model the adapter needs); merged
    safetensors too for the last one (trainer.save_hf), so it is INFERENCE READY with no merge step.
    Written locally, then put in the bucket when the checkpoints live in one (`Bucket`)."""
    from transformers import AutoConfig, GenerationConfig

    from r1cloud.checkpoint.from_dcp import merge_dcp

    path = model_cfg.model_path
    bucket = "://" in where
    local = (
        tempfile.TemporaryDirectory(prefix=".hf-", dir=scratch) if bucket else contextlib.nullcontext(where)
    )
    with local as folder:
        hf = Path(folder) / "huggingface"
        hf.mkdir()
        config = AutoConfig.from_pretrained(path, trust_remote_code=model_cfg.trust_remote_code)
        config.save_pretrained(hf)
        with contextlib.suppress(OSError):
            GenerationConfig.from_pretrained(path).save_pretrained(hf)
        saver.save_pretrained(hf)
        # a LoRA run's adapter config goes beside the adapter's shards: in huggingface/ it would
        # make the merged model load as an adapter
        if adapter:
            file = Path(folder) / ADAPTER_CONFIG
            file.write_text(json.dumps(adapter, indent=2))
            if bucket:
                checkpoints.put(file, f"{where}/actor/{ADAPTER_CONFIG}")
            else:
                os.replace(file, Path(where) / "actor" / ADAPTER_CONFIG)
        if merged:
            dtype = str(getattr(config, "dtype", "") or "").removeprefix("torch.")
            merge_dcp(f"{where}/actor", hf, hf, torch_dtype(dtype) if dtype in DTYPE_NAMES else None)
        if bucket:
            checkpoints.put(hf, f"{where}/huggingface")
