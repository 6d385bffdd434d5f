"""The local backend: a job is a supervisor process in its own session on this machine."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from r1cloud.core.jobstore import ACTIVE, DamagedJob, Job, JobExists, JobRunning, JobStore, NoSuchJob, alive
from r1cloud.spec import dump_spec


def submit(
    store: JobStore,
    spec,
    secrets: dict[str, str],
    *,
    resume: bool,
    blueprint: str = "",
    unique: bool = False,
    price: float | None = None,
) -> tuple[Job, bool, int]:
    """Create the job (or, with `resume`, reuse a finished one), write its spec, launch it.

    Returns the job, whether it is new, and where its log stood before (a resumed job's log goes on).
    Raises JobExists(name, status) for a taken name without `resume` or `unique` (which takes the
    first free of NAME-2, NAME-3, …), JobRunning if it runs. `price`: dollars an hour, for a budget."""
    accel = str(spec.resources.accelerators or f"{spec.trainer.n_gpus_per_node} slots")
    job = Job(
        spec.name,
        infra=spec.resources.infra,
        accelerators=accel,
        nodes=spec.trainer.nnodes,
        blueprint=blueprint,
        price=price,
    )
    fresh = True
    try:
        store.create_unique(job) if unique and not resume else store.create(job)
        spec = spec.model_copy(update={"name": job.name})
    except JobExists:
        try:
            existing = store.get(spec.name)
        except DamagedJob:
            raise JobExists(spec.name, "its record is damaged") from None
        except NoSuchJob:  # its folder, not yet its record: another launch is creating it right now
            raise JobExists(spec.name, "being created") from None
        if not resume or existing.kind != "train":
            raise JobExists(spec.name, existing.status) from None
        if existing.status in ACTIVE:
            raise JobRunning(spec.name) from None
        fresh = False
        with store.locked(spec.name) as j:  # submitted again: a new attempt of the same job
            j.status, j.pid, j.pid_started, j.reason, j.stop_requested = "PENDING", None, None, "", False
            j.started_at = j.ended_at = None  # the new attempt's, once its supervisor starts
            j.accelerators, j.nodes, j.created_at = accel, spec.trainer.nnodes, time.time()
            j.price = price
    (job.dir / "spec.yaml").write_text(dump_spec(spec))
    log = job.dir / "train.log"
    log_start = log.stat().st_size if log.exists() else 0
    return launch(store, store.get(job.name), secrets, spec.envs), fresh, log_start


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
        job.status, job.reason = "STOPPED", f"killed after a {grace:.0f}s grace period"
        job.settle(time.time())
    return "killed"
