"""Reading what a running job writes: new log lines as they arrive, its latest metrics and its
step count. Files only — the same for a job on this machine and, later, one synced from a bucket."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from r1cloud.core.jobstore import TERMINAL, Job, JobStore
from r1cloud.core.records import finite, load_object, loads, whole


def tail_lines(path: Path, n: int) -> list[str]:
    """The last `n` lines of a file; none when it is missing or cannot be read (a folder, say)."""
    if n <= 0 or not path.is_file():
        return []
    with path.open("rb") as f:
        end = f.seek(0, 2)
        size, data = min(end, 8192), b""
        while True:
            f.seek(end - size)
            data = f.read(size)
            if data.count(b"\n") > n or size == end:
                break
            size = min(end, size * 2)
    return data.decode(errors="replace").splitlines()[-n:]


def new_lines(path: Path, offset: int) -> tuple[list[str], int]:
    """Complete lines written after byte `offset`, and the offset after them."""
    if not path.exists():
        return [], offset
    with path.open("rb") as f:
        f.seek(offset)
        data = f.read()
    cut = data.rfind(b"\n") + 1
    return data[:cut].decode(errors="replace").splitlines(), offset + cut


def follow(
    store: JobStore, name: str, on_line: Callable[[str], None], start: int = 0, poll: float = 0.3
) -> Job:
    """Feed each new log line to `on_line` until the job ends; return the final record."""
    log = store.path(name) / store.get(name).log.name
    offset = start
    while True:
        job = store.get(name)
        lines, offset = new_lines(log, offset)
        for line in lines:
            on_line(line)
        if job.status in TERMINAL:  # read before the log: all the job wrote is in `lines`
            return job
        time.sleep(poll)


def record(line: str) -> dict | None:
    """One metrics line, or None for a line cut by a kill mid-write (or otherwise not a record)."""
    try:
        m = loads(line)
    except ValueError:
        return None
    return m if isinstance(m, dict) else None


def last_train_metrics(run_dir: Path) -> dict | None:
    """The newest training step's metrics (validation-only lines, such as step 0, are skipped)."""
    for line in reversed(tail_lines(run_dir / "metrics.jsonl", 50)):
        m = record(line)
        if m is not None and finite(m.get("reward/overall")) is not None and whole(m.get("step")) is not None:
            return m
    return None


def planned_steps(run_dir: Path) -> int | None:
    """The step count the run's trainer planned (its trainer.json), once it has started."""
    try:
        return whole(load_object(run_dir / "trainer.json").get("total_steps"))
    except (OSError, ValueError):
        return None


def exit_code(job: Job) -> int:
    if job.status == "SUCCEEDED" or job.status == "STOPPED":
        return 0
    return job.exit_code if job.exit_code not in (None, 0) else 1
