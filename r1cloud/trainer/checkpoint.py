"""Checkpoint layout, atomic publication and retention.

```
<checkpoints>/
  checkpoint_tracker.json        {"last_global_step", "last_actor_path", "best_global_step", "best_val_reward_score"}
  global_step_<N>/
    actor/                       torch.distributed.checkpoint (model + optimizer, world-size independent)
    trainer_state.json           step, data loader position, LR scheduler, metrics at that step
```

A checkpoint is written under a temporary name, renamed into place when complete, and only then
named in the tracker (written atomically too). A crash at any moment leaves either the previous
checkpoint or the new one as the last complete one — never a half-written one. Resume takes the
newest complete folder; the tracker (EasyR1's format, for tools that read it) may lag it by one.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from pathlib import Path

TRACKER = "checkpoint_tracker.json"
STATE = "trainer_state.json"
STEP_RE = re.compile(r"^global_step_(\d+)$")


def write_json_atomic(path: Path, data: dict) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=2)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def remove(path: Path) -> None:
    """Delete a checkpoint atomically: renamed out of sight first, so a process killed halfway
    through the deletion never leaves a half-deleted checkpoint that still looks complete."""
    trash = path.with_name(f".{path.name}.deleting")
    if trash.exists():
        shutil.rmtree(trash, ignore_errors=True)
    os.replace(path, trash)
    shutil.rmtree(trash, ignore_errors=True)


class Checkpoints:
    def __init__(self, root: str | Path):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    def tracker(self) -> dict:
        try:
            return json.loads((self.root / TRACKER).read_text())
        except (OSError, ValueError):
            return {}

    def complete_steps(self) -> list[int]:
        steps = []
        for p in self.root.iterdir():
            m = STEP_RE.match(p.name)
            if m and (p / STATE).is_file():
                steps.append(int(m.group(1)))
        return sorted(steps)

    def latest(self) -> tuple[int, Path] | None:
        """The checkpoint to resume from: the newest complete one. A complete checkpoint is one
        that was renamed into place; the tracker, written after the rename, may lag it by one."""
        steps = self.complete_steps()
        return (steps[-1], self.root / f"global_step_{steps[-1]}") if steps else None

    def staging(self, step: int) -> Path:
        """A fresh temporary folder for step `step` (leftovers of a crashed save are removed)."""
        for p in [*self.root.glob(f".global_step_{step}.tmp*"), *self.root.glob(".global_step_*.deleting")]:
            shutil.rmtree(p, ignore_errors=True)  # leftovers of a crashed save or deletion
        path = self.root / f".global_step_{step}.tmp"
        path.mkdir()
        return path

    def publish(self, staging: Path, step: int, state: dict, val_score: float | None) -> Path:
        write_json_atomic(staging / STATE, state)
        final = self.root / f"global_step_{step}"
        if final.exists():
            remove(final)
        os.replace(staging, final)
        t = self.tracker()
        best_step, best = t.get("best_global_step"), t.get("best_val_reward_score")
        if val_score is not None and (best is None or val_score > best):
            best_step, best = step, round(val_score, 4)
        write_json_atomic(
            self.root / TRACKER,
            {
                "last_global_step": step,
                "last_actor_path": str(final / "actor"),
                "best_global_step": best_step,
                "best_val_reward_score": best,
            },
        )
        return final

    def prune(self, limit: int) -> list[int]:
        """Keep at most `limit` complete checkpoints, never deleting the newest or the best."""
        removed = beyond_limit(self.complete_steps(), self.tracker().get("best_global_step"), limit)
        for s in removed:
            remove(self.root / f"global_step_{s}")
        return removed


def beyond_limit(steps: list[int], best: int | None, limit: int | None) -> list[int]:
    """The steps `save_limit` drops: all but the newest, the best, and the newest others up to
    `limit` in all. (A limit of 0 or less keeps everything.)"""
    if limit is None or limit <= 0:
        return []
    keep = {steps[-1]} if steps else set()
    if best in steps:
        keep.add(best)
    for s in reversed(steps):
        if len(keep) >= limit:
            break
        keep.add(s)
    return [s for s in steps if s not in keep]


class Bucket:
    """A copy of the checkpoints in a bucket (any fsspec URL: s3://, gs://, …), for jobs whose
    machine can vanish (spot, managed jobs). Each published checkpoint is uploaded with its
    `trainer_state.json` last, so a checkpoint counts as complete in the bucket only once all its
    files are there (object stores have no atomic rename); a deletion removes that file first.
    A new machine resumes by downloading the newest complete one."""

    def __init__(self, url: str):
        from ..checkpoints import filesystem

        self.url = url.rstrip("/")
        self.fs, self.root = filesystem(self.url)

    def complete_steps(self) -> list[int]:
        try:
            names = [p.rstrip("/").rsplit("/", 1)[-1] for p in self.fs.ls(self.root, detail=False)]
        except FileNotFoundError:
            return []
        steps = [int(m.group(1)) for n in names if (m := STEP_RE.match(n))]
        return sorted(s for s in steps if self.fs.exists(f"{self.root}/global_step_{s}/{STATE}"))

    def upload(self, local: Path, tracker: dict) -> None:
        dest = f"{self.root}/{local.name}"
        if self.fs.exists(dest):
            self.remove_path(dest)
        files = sorted(p for p in local.rglob("*") if p.is_file())
        files.sort(key=lambda p: p.name == STATE)  # the completeness marker last
        for p in files:
            self.fs.put_file(str(p), f"{dest}/{p.relative_to(local).as_posix()}")
        self.fs.pipe_file(f"{self.root}/{TRACKER}", json.dumps(tracker, indent=2).encode())

    def tracker(self) -> dict:
        try:
            return json.loads(self.fs.cat_file(f"{self.root}/{TRACKER}"))
        except (FileNotFoundError, ValueError):
            return {}

    def prune(self, limit: int, best: int | None) -> list[int]:
        """`save_limit` over what the bucket holds (a fresh machine has only the newest locally)."""
        removed = beyond_limit(self.complete_steps(), best, limit)
        self.remove(removed)
        return removed

    def download(self, step: int, checkpoints: Checkpoints) -> Path:
        """Fetch a complete checkpoint into the local folder (staged, then renamed into place),
        and the bucket's tracker with it, so the best step is still known."""
        staging = checkpoints.staging(step)
        src = f"{self.root}/global_step_{step}"
        for path in self.fs.find(src):
            target = staging / path[len(src) + 1 :]
            target.parent.mkdir(parents=True, exist_ok=True)
            self.fs.get_file(path, str(target))
        final = checkpoints.root / f"global_step_{step}"
        if final.exists():
            remove(final)
        os.replace(staging, final)
        tracker = self.tracker()
        if tracker:
            write_json_atomic(checkpoints.root / TRACKER, tracker)
        return final

    def remove_path(self, path: str) -> None:
        if self.fs.exists(f"{path}/{STATE}"):
            self.fs.rm_file(f"{path}/{STATE}")  # no longer complete before anything else goes
        self.fs.rm(path, recursive=True)

    def remove(self, steps: list[int]) -> None:
        for s in steps:
            self.remove_path(f"{self.root}/global_step_{s}")
