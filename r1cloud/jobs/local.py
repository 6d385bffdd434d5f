"""The local backend: a job is a supervisor process in its own session on this machine."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from .store import Job, JobStore, alive


def launch(store: JobStore, job: Job, secrets: dict[str, str], envs: dict[str, str]) -> Job:
    """Start the job detached; secrets reach the trainer's environment only, never a file."""
    env = {**os.environ, **envs, **secrets, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "r1cloud.jobs.supervise", str(job.dir)],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=open(job.dir / "supervisor.log", "ab"),  # noqa: SIM115 - handed to the child
        start_new_session=True,
        close_fds=True,
    )
    with store.locked(job.name) as j:
        if j.pid is None or j.status == "PENDING":
            j.pid = proc.pid
    return store.get(job.name)


def stop(store: JobStore, name: str, grace: float) -> str:
    """Ask the trainer to save and exit; after `grace` seconds end the whole process group."""
    with store.locked(name) as job:
        job.stop_requested = True
        pid = job.pid
    job = store.get(name)
    if pid is None or not alive(job):
        return "not running"
    os.kill(pid, signal.SIGTERM)
    deadline = time.time() + grace
    while time.time() < deadline:
        if not alive(store.get(name)):
            return "stopped"
        time.sleep(0.5)
    os.killpg(pid, signal.SIGKILL)  # the supervisor's session: trainer, Ray, workers
    with store.locked(name) as job:
        job.status, job.reason, job.ended_at = (
            "STOPPED",
            f"killed after a {grace:.0f}s grace period",
            time.time(),
        )
    return "killed"
