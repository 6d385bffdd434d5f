"""Cloud jobs in the job store: submit a spec through SkyPilot, keep its record, refresh its state.

A cloud job's folder holds its record, the resolved spec (with `trainer.save_checkpoint_path` set
to the bucket, so `checkpoints`, `merge` and `serve --checkpoint JOB` read the bucket) and the
spec its nodes run. A launch that fails leaves no folder behind.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from secrets import token_hex
from typing import TYPE_CHECKING

import yaml

from r1cloud.checkpoint.store import BucketError, job_checkpoint_root, last_state
from r1cloud.core import budget
from r1cloud.core.jobstore import ACTIVE, Job, JobExists, JobRunning, JobStore, launch_lost
from r1cloud.jobs import cloud
from r1cloud.jobs.sky_task import RAY_TOKEN, check_cloud, checkpoint_url, node_spec, task_config
from r1cloud.spec import dump_spec

if TYPE_CHECKING:
    from r1cloud.spec import Spec

NODE_SPEC = "node-spec.yaml"


def prepare(
    spec: Spec,
    blueprint: Path,
    folder: Path,
    managed: bool,
    price: float | None = None,
    started=None,
    spent: float = 0.0,
) -> tuple[dict, Spec]:
    """Write the node spec into `folder`; return the SkyPilot task config and the spec as this
    machine keeps it (checkpoints in the bucket). A budget (resources.max_cost) reaches the
    trainer as its `price`, the launch time `started` (without it, the trainer's) and what the
    job's earlier launches `spent` (core/budget.py)."""
    check_cloud(spec, managed)
    data, root = node_spec(spec, blueprint)
    (folder / NODE_SPEC).write_text(yaml.safe_dump(data, sort_keys=False))
    config = task_config(spec, root, folder / NODE_SPEC, managed=managed)
    if spec.resources.max_cost is not None and price:
        config["envs"][budget.PRICE] = f"{price:.6g}"
        config["envs"].update({budget.STARTED: f"{started:.0f}"} if started else {})
        config["envs"].update({budget.SPENT: f"{spent:.6g}"} if spent else {})
    local = spec.model_copy(deep=True)
    if spec.resources.bucket:
        local.trainer.save_checkpoint_path = checkpoint_url(spec)
    return config, local


def submit(
    store: JobStore,
    spec: Spec,
    secrets: dict[str, str],
    blueprint: Path,
    managed: bool,
    unique: bool = False,
    price: float | None = None,
    resume: bool = False,
) -> Job:
    """Claim the job name (with `unique`, the first free of NAME, NAME-2, …), launch, record what
    SkyPilot returned. Raises JobExists, CloudError or TaskError; on any failure the job's folder
    is removed. With `resume`, launch the ended cloud job NAME again: the same name, so the same
    bucket folder its trainer goes on from, and its spend so far carried into the budget; on a
    failure its record is put back as it was."""
    accelerators = str(spec.resources.accelerators or "")
    if resume:
        before = reopen(store, spec.name, price, accelerators)
        job = store.get(spec.name)
    else:
        job = Job(
            spec.name,
            infra=spec.resources.infra,
            accelerators=accelerators,
            nodes=spec.trainer.nnodes,
            blueprint=str(Path(blueprint).resolve()),  # a resume launches from its folder, from anywhere
            price=price,
        )
        job.own()  # the launcher's, until SkyPilot answers (Job.launching)
        store.create_unique(job) if unique else store.create(job)
    spec = spec.model_copy(update={"name": job.name})
    try:
        started = time.time()  # the budget and `jobs` count from here, provisioning included
        config, local = prepare(spec, blueprint, job.dir, managed, price, started, job.spent)
        if not resume:  # a resumed job's spec stays as it was until its launch is in
            (job.dir / "spec.yaml").write_text(dump_spec(local))
        if RAY_TOKEN in config.get("secrets", {}):
            secrets = {**secrets, RAY_TOKEN: token_hex(32)}
        record = cloud.launch(config, secrets, managed)
    except KeyboardInterrupt:  # SkyPilot's request goes on without us: keep the record, say so
        with store.locked(spec.name) as j:
            j.status, j.reason, j.pid = "FAILED", launch_lost(spec.name), None
        raise
    except BaseException:  # refused before anything started: leave nothing behind
        if not resume:
            store.remove(spec.name)
            raise
        with store.locked(spec.name) as j:
            j.__dict__.update(before)
        raise
    if resume:
        (job.dir / "spec.yaml").write_text(dump_spec(local))
    with store.locked(spec.name) as j:
        j.cloud, j.started_at, j.pid, j.pid_started = record, started, None, None
    return store.get(spec.name)


def reopen(store: JobStore, name: str, price: float | None, accelerators: str) -> dict:
    """Make the ended cloud job `name` a pending new launch; return its record as it was."""
    with store.locked(name) as j:
        if j.status in ACTIVE:
            raise JobRunning(name)
        if not j.remote or j.kind != "train":
            raise JobExists(name, "it ran on this machine, and its checkpoints are here: resume it here")
        before = dict(j.__dict__)
        j.status, j.reason, j.stop_requested, j.exit_code = "PENDING", "", False, None
        j.started_at = j.ended_at = None
        j.cloud = {}  # the new launch's, once SkyPilot answers (a failed launch gets the old one back)
        j.own()
        j.price, j.accelerators = price, accelerators
    return before


def budget_stop(job: Job) -> str:
    """The reason a cloud job SkyPilot calls SUCCEEDED stopped early on its budget, or "": its last
    checkpoint says so (the trainer's [budget] line, kept in its trainer_state.json) and was saved
    by this launch (its `launched`, the budget's start: a resume that saved nothing leaves the last
    launch's checkpoint). A bucket that cannot be read from here leaves the job as SkyPilot says."""
    try:
        state = last_state(job_checkpoint_root(job.dir))
    except BucketError:
        return ""
    last, launched = state.get("stopped"), state.get("launched")
    if not isinstance(last, str) or not last.startswith("[budget] "):
        return ""
    if isinstance(launched, int | float) and job.started_at and abs(launched - job.started_at) > 1:
        return ""  # an earlier launch's stop
    return last.removeprefix("[budget] ")


def refresh(store: JobStore, jobs: list[Job]) -> list[Job]:
    """Bring the cloud jobs among `jobs` up to date from SkyPilot: managed jobs from their queue
    (one call), services from SkyServe (one call), plain-cluster jobs from their cluster."""
    active = [j for j in jobs if j.cloud and j.status in ACTIVE]  # a launch in flight has no `cloud` yet
    managed = {j.cloud["job_id"]: j.name for j in active if j.cloud.get("managed")}
    served = [j.cloud["service"] for j in active if "service" in j.cloud]
    queue = cloud.managed_jobs(list(managed)) if managed else {}
    states = {managed[i]: s for i, s in queue.items() if i in managed}
    states.update(cloud.services(served) if served else {})
    for j in active:
        if j.cloud.get("cluster") and not j.cloud.get("managed"):
            states[j.name] = cloud.cluster_job(j.cloud, j.started_at)
    out = []
    for j in jobs:
        state = states.get(j.name)
        if state and (state["status"], state["reason"]) != (j.status, j.reason):
            if state["status"] == "SUCCEEDED" and j.kind == "train" and (why := budget_stop(j)):
                state = {**state, "status": budget.STATUS, "reason": why}
            with store.locked(j.name) as rec:
                if rec.launching or rec.started_at != j.started_at:  # relaunched since it was read
                    out.append(rec)
                    continue
                rec.status = state["status"]
                rec.attempts = 1 + state.get("recoveries", 0)
                rec.reason = state["reason"]
                rec.exit_code = budget.EXIT if rec.status == budget.STATUS else rec.exit_code
                if rec.status not in ACTIVE and rec.ended_at is None:  # this launch's time, at its price
                    rec.settle(min(time.time(), state.get("ended") or math.inf))
            j = store.get(j.name)
        out.append(j)
    return out
