"""The Ray worker group: one HybridWorker per device (and for asynchronous training one
RolloutWorker per rollout device), placed on the cluster and met at the controller's store
(world.py); calls that fail fast when a worker dies (RunError: a mismatch said in one line); the
CPU workers' allocator settings.
"""

from __future__ import annotations

import os
import re

import torch

from r1cloud.trainer.transport import zero_copy_tensors
from r1cloud.trainer.world import rendezvous


def launch(spec, world: int, rollout: int = 0) -> tuple[list, list, object]:
    """Start Ray (or join the job's cluster), one HybridWorker per device and `rollout` RolloutWorkers,
    placed as the spec says; the workers, the rollout workers and their rendezvous store (kept for as
    long as they run)."""
    import ray
    from ray.util.placement_group import placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    from r1cloud.trainer.rollout_worker import WEIGHTS, RolloutWorker
    from r1cloud.trainer.workers import HybridWorker

    cuda = torch.cuda.is_available()
    env = {
        "TOKENIZERS_PARALLELISM": "false",
        "VLLM_LOGGING_LEVEL": os.environ.get("VLLM_LOGGING_LEVEL", "ERROR"),
        "RAY_DEDUP_LOGS": "0",
    }
    cluster = os.environ.get("RAY_ADDRESS")  # a multi-node job's cluster (jobs/node.py), or the user's
    if cluster:  # its workers do not inherit this process's environment: pass the job's on
        env = {**job_environment(spec), **env}
    if not ray.is_initialized():
        ray.init(
            address=cluster or "local",  # not a `ray start` cluster that happens to run here
            num_cpus=None if cuda or cluster else max(world + rollout + 1, os.cpu_count() or 1),
            runtime_env={"env_vars": env},
            include_dashboard=False,
            log_to_driver=True,
            configure_logging=False,
        )
    zero_copy_tensors()
    per_node, nnodes = spec.trainer.n_gpus_per_node, spec.trainer.nnodes
    spread = nnodes > 1 and bool(cluster)
    size = per_node if spread else 1  # a multi-node cluster (jobs/node.py): a bundle per node, its devices
    bundle = {"GPU": size, "CPU": size} if cuda else {"CPU": size}
    pg = placement_group(
        [bundle] * ((world + rollout) // size), strategy="STRICT_SPREAD" if spread else "PACK"
    )
    try:
        ray.get(pg.ready(), timeout=float(os.environ.get("R1CLOUD_PLACEMENT_TIMEOUT", "600")))
    except ray.exceptions.GetTimeoutError:
        raise RunError(
            f"Ray cannot place {world} workers ({nnodes} node(s) × {per_node}); the cluster has "
            f"{ray.cluster_resources()}: lower trainer.n_gpus_per_node or nnodes, or add machines"
        ) from None
    # this controller runs on a node of the cluster (this machine, or a `ray start` head: RAY_ADDRESS
    # HEAD:6379); through Ray Client (ray://) its address would be the client's, out of the workers' reach
    store, master = rendezvous(ray.util.get_node_ip_address())
    cpus = os.cpu_count() or 1
    config = spec.model_dump(mode="json")

    slot = {"num_cpus": 1, "num_gpus": 1 if cuda else 0}

    def start(actor, rank: int, count: int, first: int):  # first: its pool's first device
        # on CPU each pool gets the cores as if alone: a pool that waits (on tools, on the other
        # pool's samples) leaves them to the other one
        threads = max(1, cpus // count)
        return actor.options(
            scheduling_strategy=PlacementGroupSchedulingStrategy(
                pg, placement_group_bundle_index=(first + rank) // size
            ),
            runtime_env={"env_vars": {**env, **cpu_allocator()}} if not cuda else None,
        ).remote(config, rank, count, master, threads)

    trainer = ray.remote(**slot)(HybridWorker)
    rollouts = ray.remote(**slot, concurrency_groups={WEIGHTS: 1})(RolloutWorker)  # pushes beside generate
    workers = [start(trainer, r, world, 0) for r in range(world)]
    return workers, [start(rollouts, r, rollout, world) for r in range(rollout)], store


# What workers need from the trainer's environment to reach the model, data and checkpoints.
REACH = ("AWS_", "AZURE_", "GOOGLE_", "GCS_", "HF_", "HUGGING_FACE_", "MODELSCOPE_", "USE_MODELSCOPE_HUB",
         "R1CLOUD_", "VLLM_", "TRANSFORMERS_")  # fmt: skip


def job_environment(spec) -> dict[str, str]:
    """What a worker on a cluster this process did not start must be given: the job's `envs` and
    `secrets` (a local job sets them in this process) and the hubs' and storages' settings."""
    names = {*spec.envs, *spec.secrets}
    return {k: v for k, v in os.environ.items() if k in names or k.startswith(REACH)}


# What a worker's collective raises when its peer process or node is gone.
PEER_LOST = ("Connection reset by peer", "Connection closed by peer", "Broken pipe", "Socket Timeout")


def start_failure(e: Exception) -> str | None:
    """The worker's own error when `e` says a worker failed while starting (loading its model, say)."""
    from ray.exceptions import ActorDiedError

    if not isinstance(e, ActorDiedError) or "creation task" not in str(e):
        return None
    lines = [re.sub(r"\x1b\[[0-9;]*m", "", ln).strip() for ln in str(e).splitlines() if ln.strip()]
    return lines[-1][:400]  # Ray's text ends with the worker's traceback: its last line is the cause


def failed_pool(e: Exception, rollouts: list) -> str:
    """The pool whose worker failed: the one `e` names when it is a dead rollout worker's, else a
    rollout worker found dead (a train worker's collective with it may have failed first)."""
    import ray
    from ray.exceptions import RayActorError

    if not rollouts:
        return "trainer"
    ids = {w._actor_id.hex() for w in rollouts}  # (Ray's handles show no public id)
    if isinstance(e, RayActorError) and e.actor_id in ids:
        return "rollout"
    probes = [w.__ray_ready__.remote() for w in rollouts]  # a dead actor answers at once
    ready, _ = ray.wait(probes, num_returns=len(probes), timeout=5)
    for ref in ready:
        try:
            ray.get(ref)
        except RayActorError:
            return "rollout"
    return "trainer"


def worker_lost(e: Exception) -> str | None:
    """A one-line reason when `e` means a worker (or its node) is gone, else None."""
    from ray.exceptions import RayTaskError

    text = str(e)
    if isinstance(e, RayTaskError) and not any(p in text for p in PEER_LOST):
        return None
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    hit = next((ln for ln in lines if any(p in ln for p in PEER_LOST)), None)
    return (hit or (lines[0] if lines else type(e).__name__))[:300]


def gather(refs: list) -> list:
    """ray.get, failing as soon as any worker fails: the others may be blocked in a collective
    with the dead one, and a plain ray.get in order would wait on them first (a hang, not an error)."""
    import ray

    pending = list(refs)
    while pending:
        ready, pending = ray.wait(pending, num_returns=1)
        ray.get(ready)  # raises at once when that worker died or raised
    return ray.get(refs)


def cpu_allocator() -> dict[str, str]:
    """Environment for CPU workers: glibc's malloc serving tensors up to 32 MiB (its maximum) from
    the heap, and keeping up to 1 GiB of freed heap, where by default FSDP's per-layer buffers are
    fresh mmaps the kernel zeroes page by page; and transparent huge pages (glibc 2.35 and later):
    a fresh 2 MiB page is one fault instead of 512 (docs/trainer.md, "CPU specifics")."""
    tunables = [t for t in os.environ.get("GLIBC_TUNABLES", "").split(":") if t]  # the user's kept
    if not any(t.startswith("glibc.malloc.hugetlb=") for t in tunables):
        tunables.append("glibc.malloc.hugetlb=1")
    return {
        "MALLOC_MMAP_THRESHOLD_": str(32 << 20),
        "MALLOC_TRIM_THRESHOLD_": str(1 << 30),
        "GLIBC_TUNABLES": ":".join(tunables),
    }


class RunError(RuntimeError):
    """A mismatch of data, reward and settings found mid-run: said in one line, no traceback."""
