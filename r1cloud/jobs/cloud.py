"""The SkyPilot backend: the one module that imports `sky` (SkyPilot's request-based SDK, 0.14).

Training runs as a managed job by default (`sky.jobs.launch`: spot preemptions and failures are
recovered on a new cluster, and the trainer resumes from the bucket), or with `managed=False` on
a plain cluster that stops itself when idle and is torn down at the end (`sky.launch`). SkyPilot's
errors become `CloudError`s that say what to do; an empty queue or a cluster that is already gone
is an empty state, not an error.
"""

from __future__ import annotations

import copy
import functools
import math
import re
import time
from dataclasses import dataclass, field

AUTOSTOP_MINUTES = 10


@dataclass
class CloudError(Exception):
    title: str
    hints: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        return self.title


def _sky():
    try:
        import sky
    except ImportError:
        raise CloudError(
            "SkyPilot is not installed, and cloud jobs run through it",
            ["pip install 'r1cloud[cloud]'  (then `sky check` to enable your clouds)"],
        ) from None
    return sky


def _plain(text: str) -> str:
    return re.sub(r"\x1b\[[0-9;]*m", "", text).strip()


def translate(e: Exception) -> CloudError | None:
    """SkyPilot's failures as one line and what to do; None for anything else."""
    from sky import exceptions as sx

    text = _plain(str(e))
    if isinstance(e, sx.NoCloudAccessError):
        return CloudError(
            "no cloud is set up for SkyPilot (no credentials found)",
            ["run `sky check` to see which clouds are enabled and how to add credentials"],
        )
    if isinstance(e, sx.ApiServerConnectionError):
        return CloudError(f"cannot reach the SkyPilot API server: {text}", ["check it with `sky api info`"])
    if isinstance(e, RuntimeError) and "API server" in text:
        return CloudError(
            f"SkyPilot has no API server to talk to: {text.splitlines()[0]}",
            ["log in to one with `sky api login -e URL`, or let SkyPilot start a local one "
             "(unset SKYPILOT_DISABLE_LOCAL_API_SERVER); then `sky check`"],
        )  # fmt: skip
    if isinstance(e, sx.ResourcesUnavailableError):
        return CloudError(
            f"no matching machines are available: {text.splitlines()[0] if text else 'all options failed'}",
            ["offer alternatives (resources.accelerators: {H100: 8, A100-80GB: 8}), another infra or "
             "region, or drop --spot; `sky show-gpus` lists what each cloud has"],
        )  # fmt: skip
    if isinstance(e, sx.InvalidSkyPilotConfigError):
        return CloudError(f"SkyPilot refused the task: {text}", ["r1cloud train --dry-run prints it"])
    return None


def _sdk(fn):
    """`fn(sky, …)` as `fn(…)`: SkyPilot's failures come out as CloudError."""

    @functools.wraps(fn)
    def call(*args, **kwargs):
        sky = _sky()
        try:
            return fn(sky, *args, **kwargs)
        except CloudError:
            raise
        except Exception as e:
            known = translate(e)
            if known is None:
                raise
            raise known from None

    return call


@_sdk
def make_task(sky, config: dict, secrets: dict[str, str]):
    """The task, with secret values passed as overrides, never written into the config."""
    return sky.Task.from_yaml_config(copy.deepcopy(config), secrets_overrides=list(secrets.items()) or None)


@_sdk
def launch(sky, config: dict, secrets: dict[str, str], managed: bool) -> dict:
    """Start the job; returns what later calls need to find it again."""
    task = make_task(config, secrets)
    name = config["name"]
    if managed:
        job_ids, _ = sky.stream_and_get(sky.jobs.launch(task, name=name))
        return {"managed": True, "job_id": job_ids[0] if job_ids else None, "cluster": ""}
    job_id, _ = sky.stream_and_get(
        sky.launch(task, cluster_name=name, idle_minutes_to_autostop=AUTOSTOP_MINUTES, down=True)
    )
    return {"managed": False, "job_id": job_id, "cluster": name}


# Managed-job statuses (sky.jobs.ManagedJobStatus) onto the job store's.
STATUS = dict.fromkeys(("PENDING", "DEPRECATED_SUBMITTED", "STARTING"), "PENDING")
STATUS |= dict.fromkeys(("RUNNING", "RECOVERING", "WINDING_DOWN", "CANCELLING"), "RUNNING")
STATUS |= {"SUCCEEDED": "SUCCEEDED", "CANCELLED": "STOPPED"}
STATUS |= dict.fromkeys(
    ("FAILED", "FAILED_SETUP", "FAILED_PRECHECKS", "FAILED_NO_RESOURCE", "FAILED_CONTROLLER"), "FAILED"
)


def _name(status) -> str:
    """A SkyPilot status enum's name (or the plain string a server may send instead)."""
    return str(getattr(status, "value", status))


@_sdk
def managed_jobs(sky, job_ids: list[int]) -> dict[int, dict]:
    """{job id: {"status", "recoveries", "reason", "ended"}} for these managed jobs (at least one)."""
    try:
        records = sky.get(sky.jobs.queue_v2(refresh=False, job_ids=job_ids))[0]
    except sky.exceptions.ClusterNotUpError:  # "No in-progress managed jobs": nothing to show
        return {}
    out = {}
    for rec in records:
        status = _name(rec.get("status"))
        out[rec.get("job_id")] = {
            "status": STATUS.get(status, "RUNNING"),
            "recoveries": rec.get("recovery_count") or 0,
            "reason": rec.get("failure_reason") or "",
            "ended": rec.get("end_at"),  # epoch seconds once it has ended
        }
    return out


# A plain cluster's job statuses (sky.skylet.job_lib.JobStatus) onto the job store's.
CLUSTER_STATUS = dict.fromkeys(("INIT", "PENDING", "SETTING_UP"), "PENDING")
CLUSTER_STATUS |= {"RUNNING": "RUNNING", "SUCCEEDED": "SUCCEEDED", "CANCELLED": "STOPPED"}
CLUSTER_GONE = (
    "its cluster is gone (taken down after the job ended, before r1cloud saw how it ended); "
    "its checkpoints are in the bucket"
)


@_sdk
def cluster_job(sky, record: dict, since: float | None = None) -> dict:
    """{"status", "reason", "ended"} of a job on a plain cluster (`--no-managed`). The cluster goes
    down after its job, so a cluster that is gone means the job has ended (ENDED: outcome unknown);
    "ended" is then when it went down (a cluster bills until then), from SkyPilot's cost report of
    the cluster launched at `since` or later, or None where the report does not say."""
    try:
        states = sky.get(sky.job_status(record["cluster"], [record["job_id"]]))
    except (sky.exceptions.ClusterDoesNotExist, sky.exceptions.ClusterNotUpError):
        return {
            "status": "ENDED",
            "reason": CLUSTER_GONE,
            "ended": _down_at(sky, record["cluster"], since),
        }
    status = _name(states.get(record["job_id"]))
    return {
        "status": CLUSTER_STATUS.get(status, "FAILED"),
        "reason": "" if status in CLUSTER_STATUS else status,
    }


def _down_at(sky, cluster: str, since: float | None) -> float | None:
    """When the cluster `cluster` launched at `since` or later went down: the end of its last
    usage interval in SkyPilot's cost report (which keeps downed clusters); None if not there."""
    if not since:
        return None
    days = max(1, math.ceil((time.time() - since) / 86400) + 1)
    try:
        rows = sky.get(sky.cost_report(days=days))
    except Exception:  # noqa: BLE001 — a refinement: without the report, the job is settled when seen ended
        return None
    spans = [
        span
        for row in rows
        if row.get("name") == cluster
        for span in row.get("usage_intervals") or []
        if span[0] is not None and span[0] >= since - 1  # this launch's cluster, not an earlier one's
    ]
    if not spans or any(end is None for _, end in spans):
        return None
    return float(max(end for _, end in spans))


# SkyServe service statuses (sky.serve.ServiceStatus) onto the job store's.
SERVICE_STATUS = dict.fromkeys(("CONTROLLER_INIT", "REPLICA_INIT"), "PENDING")
SERVICE_STATUS |= dict.fromkeys(("READY", "NO_REPLICA"), "RUNNING") | {"SHUTTING_DOWN": "STOPPED"}


@_sdk
def services(sky, names: list[str]) -> dict[str, dict]:
    """{service: {"status", "reason"}}; a service SkyServe no longer knows is STOPPED."""
    try:
        records = sky.get(sky.serve.status(names))
    except sky.exceptions.ClusterNotUpError:  # no serve controller: no services at all
        records = []
    out = {n: {"status": "STOPPED", "reason": "the service is gone (sky serve down)"} for n in names}
    for rec in records:
        status = _name(rec.get("status"))
        reason = "no replica is ready" if status == "NO_REPLICA" else ""
        if status not in SERVICE_STATUS:
            reason = f"SkyServe says {status}"
        out[rec["name"]] = {"status": SERVICE_STATUS.get(status, "FAILED"), "reason": reason}
    return out


@_sdk
def tail_logs(sky, record: dict, follow: bool) -> int | None:
    """Stream the job's output to stdout; the exit code when it ended, None otherwise."""
    try:
        if "service" in record:  # a SkyServe service: its first replica's server output
            return sky.serve.tail_logs(record["service"], target="replica", replica_id=1, follow=follow)
        if record["managed"]:
            return sky.jobs.tail_logs(job_id=record["job_id"], follow=follow)
        return sky.tail_logs(record["cluster"], record["job_id"], follow)
    except (sky.exceptions.ClusterNotUpError, sky.exceptions.ClusterDoesNotExist) as e:
        print(f"(no logs: {_plain(str(e))})")
        return None


@_sdk
def cancel(sky, record: dict) -> str:
    """Stop the job: take a SkyServe service down, cancel the managed job, or take its cluster down."""
    try:
        if "service" in record:
            sky.get(sky.serve.down(record["service"]))
        elif record["managed"]:
            sky.get(sky.jobs.cancel(job_ids=[record["job_id"]]))
        else:
            sky.get(sky.down(record["cluster"]))
    except (sky.exceptions.ClusterNotUpError, sky.exceptions.ClusterDoesNotExist):
        return "already gone"
    if "service" in record:
        return "service down"
    return "cancelled" if record["managed"] else "cluster down"


@_sdk
def serve_up(sky, config: dict, secrets: dict[str, str], service: str) -> str:
    """A SkyServe service; returns its endpoint."""
    _, endpoint = sky.stream_and_get(sky.serve.up(make_task(config, secrets), service_name=service))
    return endpoint
