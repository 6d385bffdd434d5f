"""`fsdp.enable_rank0_init` on and off, on the same work, in one run: peak resident memory of each
trainer worker process (2 workers, SmolLM2-135M-Instruct in fp32, the actor and the KL reference
model both loaded).

With it on, rank 0 reads the weights and the other worker builds an empty model and receives its
shard; with it off, every worker reads the whole model first. Two measurements: the workers' model
loading alone (two gloo processes constructing the trainer's HybridWorker: the actor, the reference
and the optimizer, no Ray, no rollout engine), and a whole run of one GRPO step through the trainer
with the hf rollout engine, whose unsharded copy of the weights every worker holds either way (on a
GPU that copy lives in device memory).

Usage: python benchmarks/rank0_init.py [--model .models/SmolLM2-135M-Instruct] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

GiB = 1024**3


def _build(rank: int, spec: dict, master: str, peaks) -> None:
    import resource

    from r1cloud.trainer.workers import HybridWorker

    HybridWorker(spec, rank, 2, master, threads=1)
    peaks[rank] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


def measure_load(model: Path, flag: bool, work: Path) -> list[float]:
    """Each worker's peak RSS once its models are built and sharded (no rollout engine)."""
    import torch.multiprocessing as mp
    from trainer_vs_trl import blueprint

    from r1cloud.validate import load_spec

    bp = Path(tempfile.mkdtemp(dir=work)) / "bp.yaml"
    bp.write_text(blueprint(model, "hf", 1))
    spec = load_spec(bp, overrides(flag)).spec.model_dump(mode="json")
    from r1cloud.trainer.world import rendezvous

    store, master = rendezvous("127.0.0.1")  # held here while the two workers start
    peaks = mp.get_context("spawn").Manager().dict()
    mp.start_processes(_build, args=(spec, master, peaks), nprocs=2, start_method="spawn")
    return [peaks[r] / GiB for r in range(2)]


def overrides(flag: bool) -> list[str]:
    return [
        f"worker.actor.fsdp.enable_rank0_init={str(flag).lower()}",
        f"worker.ref.fsdp.enable_rank0_init={str(flag).lower()}",
        "algorithm.disable_kl=false",
        "algorithm.use_kl_loss=true",
        "worker.ref.fsdp.torch_dtype=fp32",
    ]


def measure(model: Path, flag: bool, work: Path) -> dict:
    from trainer_vs_trl import blueprint, launch

    folder = Path(tempfile.mkdtemp(prefix=f"rank0-{flag}-", dir=work))
    _, rows, rss = launch(folder, blueprint(model, "hf", 1), overrides(flag))
    return {
        "rank0_init": flag,
        "load_peaks_gib": measure_load(model, flag, work),  # by rank
        "run_peaks_gib": sorted(p / GiB for p in rss.workers.values()),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=str(HERE.parent / ".models/SmolLM2-135M-Instruct"))
    p.add_argument("--json", default=None)
    a = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="rank0-bench-"))
    try:
        results = [measure(Path(a.model), flag, work) for flag in (False, True, False, True)]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"model {a.model}, 2 workers, actor + reference in fp32")
    for r in results:
        load = ", ".join(f"{x:.2f}" for x in r["load_peaks_gib"])
        run = ", ".join(f"{x:.2f}" for x in r["run_peaks_gib"])
        print(
            f"enable_rank0_init={r['rank0_init']!s:5}  loading (rank 0, 1): {load} GiB · one step: {run} GiB"
        )
    on = [r for r in results if r["rank0_init"]]
    off = [r for r in results if not r["rank0_init"]]
    on1, off1 = (sum(r["load_peaks_gib"][1] for r in rs) / len(rs) for rs in (on, off))
    print(f"rank 1's peak while loading, on / off: {on1:.2f} / {off1:.2f} GiB = {on1 / off1:.2f}x")
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
