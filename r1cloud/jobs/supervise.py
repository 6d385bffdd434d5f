"""The process that owns one local job: `python -m r1cloud.jobs.supervise JOB_DIR`.

It runs in its own session (so closing the terminal does not end the job), starts the trainer (or,
for a serve job, the server command in job.json) as its child with the output appended to the
job's log, forwards a stop request (SIGTERM) to that child alone — so the trainer can save a
checkpoint before its Ray workers go — and records how the job ended in job.json.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from r1cloud.core import budget
from r1cloud.core.jobstore import JobStore
from r1cloud.jobs.follow import tail_lines

PREFIX = re.compile(r"^(\(\w+ pid=\d+\)\s*)?((ERROR|WARNING|INFO) [\d-]+ [\d:]+ \[[^\]]*\]\s*)?")
# vLLM's summaries of an error, which only point to its cause above them
POINTERS = ("root cause above", "stack trace above", "Worker failed with error", "Failed to apply")


def last_error(log: Path) -> str:
    """The most telling line at the end of the log: an `error:` line of r1cloud's, else the root
    cause — the last exception that does not only point to another one above it (vLLM's "Engine
    core initialization failed. See root cause above"), its worker's prefix and arrays cut."""
    try:
        with log.open("rb") as f:
            f.seek(max(0, f.seek(0, 2) - 400_000))
            lines = [ln.strip() for ln in f.read().decode(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    # Ray colours its workers' lines; vLLM prefixes its workers' with their pid, level and file
    lines = [PREFIX.sub("", re.sub(r"\x1b\[[0-9;]*m", "", ln)) for ln in lines]
    said = [ln for ln in lines if ln.startswith("error:")]  # the trainer's own words come first
    raised = [ln for ln in lines if ": " in ln and ln.split(":")[0].endswith(("Error", "Exception"))]
    causes = [ln for ln in raised if not any(p in ln for p in POINTERS)]
    chosen = (said or causes or raised or lines or [""])[-1]
    return re.sub(r"\[array\(.*", "[array(…)…", chosen)[:300]


def main(job_dir: str) -> int:
    path = Path(job_dir)
    store = JobStore(path.parent.parent)
    name = path.name
    with store.locked(name) as job:
        job.status, job.reason, job.stop_requested = "RUNNING", "", False
        job.started_at, job.ended_at, job.exit_code = time.time(), None, None
        job.own()
        job.attempts += 1
        command = job.command or [sys.executable, "-m", "r1cloud.trainer", str(path)]
        what, log_path = ("the trainer" if job.kind == "train" else "the server"), path / job.log.name
        priced = {budget.PRICE: job.price, budget.SPENT: job.spent, budget.STARTED: job.started_at}
        env = {**os.environ, **({k: str(v) for k, v in priced.items()} if job.price else {})}
    with log_path.open("ab") as log:
        child = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env
        )
        signal.signal(signal.SIGTERM, lambda *_: child.send_signal(signal.SIGTERM))
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        code = child.wait()
    with store.locked(name) as job:
        job.exit_code = code
        job.settle(time.time())
        if job.stop_requested:
            job.status, job.reason = "STOPPED", "stopped by r1cloud stop"
        elif code == budget.EXIT and job.kind == "train" and (said := budget_line(log_path)):
            job.status, job.reason = budget.STATUS, said
        elif code == 0:
            job.status, job.reason = "SUCCEEDED", ""
        else:
            job.status, job.reason = "FAILED", last_error(log_path) or f"{what} exited with code {code}"
        if job.kind == "train" and job.status in ("SUCCEEDED", "STOPPED", budget.STATUS):
            calibrate(store, path, job, log_path)  # before the status is seen
    return 0


def budget_line(log: Path) -> str:
    """The trainer's own words when its budget stopped it, else nothing."""
    said = [ln for ln in tail_lines(log, 50) if ln.startswith("[budget] ")]
    return said[-1].removeprefix("[budget] ") if said else ""


def calibrate(store: JobStore, path: Path, job, log_path: Path) -> None:
    """The run's speed, for later estimates (costs/plan.py); never the job's outcome."""
    try:
        from r1cloud.costs.plan import calibrate as measure

        measure(store.root.parent, path, job.name, job.ended_at - job.started_at)
    except Exception as e:  # noqa: BLE001
        with log_path.open("a") as log:
            log.write(f"[cost] this run's speed was not recorded for estimates: {type(e).__name__}: {e}\n")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
