"""The GPU path, checked and measured on one GPU in one command (issue #23).

No Ray and no vLLM (the lent GPU machine has neither): the trainer's own driver runs in this process
with one HybridWorker (world 1, nccl) behind a handle shaped like a Ray actor's, and the `hf`
rollout engine. Sections (`--only`):

  checks     a GRPO run through the trainer (3 steps, saves), its resume (weights and optimizer
             state bit-identical), the weight sync into the hf engine, packed log-probs (shared
             prompts) against each sequence alone and against a plain transformers forward with
             full logits (fp32 and bf16), head.py's entropy, a LoRA run and a VLM run with images
  offload    offload_params/offload_optimizer: device memory between phases, and an update equal
             to one without; fsdp.enable_cpu_offload with gradient accumulation against none
  landed     what came after #23 (gpu_landed.py): Ulysses' code path at world 1, a multi-turn run
             with a gym environment and a video run (tiny Qwen2.5-VL), engine against trainer
  attention  packed attention four ways (gpu_attention.py), Qwen2.5-1.5B-shaped
  mfu        the actor update's forward and backward (gpu_mfu.py): tokens/s and MFU, 0.5B and 1.5B
             shapes, 8k-32k-token micro-batches, gradient checkpointing on and off, a profile
  mfu7b      the same for a Qwen2.5-7B shape on one GPU: bf16 weights, adamw_bf16, checkpointing

On the GPU machine (python3 there has torch, transformers and peft; pydantic and datasets travel as
wheels, see `scripts/gpu-wheels`):

  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
  PYTHONPATH=/tmp/site:. python3 benchmarks/gpu.py --out $OUT

(with `carry: [".whl"]`). On an H200 (2026-11-28) the sections took: checks 59 s, offload 5 s,
landed ~20 s, attention 62 s (FlexAttention's compiles are most of it), mfu 128 s, mfu7b 60 s:
about 6 minutes in all, one call; a machine's start took about 40 s more. The report is written
again after each section, so a call stopped at its limit still returns what ran; then
`python benchmarks/run_all.py --gpu FOLDER…` puts the reports into RESULTS.md.

On CPU, `--quick` runs every section on tiny shapes (gloo instead of nccl): what the tests run.
Prints a report (markdown) and writes it with the raw numbers to --out (report.md, gpu.json).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import platform
import sys
import tempfile
import time
import traceback
from pathlib import Path
from types import SimpleNamespace

import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(HERE), str(ROOT), str(ROOT / "tests"), str(ROOT / "tests" / "trainer")]

SECTIONS = ("checks", "offload", "landed", "attention", "mfu", "mfu7b")


# ---------------------------------------------------------------------------- the worker, no Ray


STORES = []  # the rendezvous stores of this process's workers, held while they run


class Local:
    """A Ray actor handle's shape over an in-process HybridWorker: `handle.method.remote(...)` runs
    the call at once and returns its value, which the driver's `gather` (patched) passes through."""

    def __init__(self, worker):
        self.worker = worker

    def __getattr__(self, name):
        if name == "node_ip":  # asks Ray otherwise
            return SimpleNamespace(remote=lambda: "127.0.0.1")
        return SimpleNamespace(remote=getattr(self.worker, name))


def worker(spec) -> object:
    """One HybridWorker for `spec` (a Spec), world 1, in this process."""
    from r1cloud.trainer import engine_host, workers
    from r1cloud.trainer.world import rendezvous

    engine_host.zero_copy_tensors = lambda: None  # Ray's serializer for what workers return: no Ray here
    store, master = rendezvous("127.0.0.1")
    STORES.append(store)
    return workers.HybridWorker(spec.model_dump(mode="json"), 0, 1, master, threads=os.cpu_count() or 1)


@contextlib.contextmanager
def trainer(run: Path):
    """The trainer's driver for the run folder `run`, its one worker in this process; closed after."""
    from r1cloud.trainer import driver

    driver.launch = lambda spec, world, rollout=0: ([Local(worker(spec))], [], None)
    driver.gather = list
    t = driver.Trainer(run)
    try:
        yield t
    finally:
        t.reward.close()
        t.trackers.close("FINISHED")
        for handle in t.workers:
            handle.worker.shutdown()
            if handle.worker.engine is not None:
                del handle.worker.engine
        t.workers.clear()
        release()


def release() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def make_run(work: Path, name: str, blueprint: str, overrides: list[str]) -> Path:
    """A run folder holding the resolved spec, as `r1cloud train` writes it."""
    from r1cloud.spec import dump_spec
    from r1cloud.validate import load_spec

    bp = work / f"{name}.yaml"
    bp.write_text(blueprint)
    run = work / name
    run.mkdir(exist_ok=True)
    (run / "spec.yaml").write_text(dump_spec(load_spec(bp, overrides).spec))
    return run


def gpu_overrides(precision: str) -> list[str]:
    """One worker and the hf engine; with "bf16", EasyR1's default precision on GPUs (fp32
    weights, bf16 compute, a bf16 reference and engine)."""
    out = ["trainer.n_gpus_per_node=1", "worker.rollout.name=hf"]
    if precision == "bf16":
        out += [
            "worker.actor.fsdp.mp_param_dtype=bf16",
            "worker.ref.fsdp.mp_param_dtype=bf16",
            "worker.ref.fsdp.torch_dtype=bf16",
            "worker.rollout.dtype=bf16",
        ]
    return out


# ---------------------------------------------------------------------------- report


class Report:
    def __init__(self):
        self.checks: list[dict] = []
        self.sections: dict[str, object] = {}

    def check(self, name: str, ok: bool, measured: str, limit: str = "") -> None:
        self.checks.append({"check": name, "ok": bool(ok), "measured": measured, "limit": limit})
        print(
            f"[{'ok' if ok else 'FAIL'}] {name}: {measured}{f' (limit {limit})' if limit else ''}", flush=True
        )

    def failed(self, section: str, error: BaseException) -> None:
        text = "".join(traceback.format_exception(error))[-3000:]
        self.checks.append({"check": f"{section}: crashed", "ok": False, "measured": text, "limit": ""})
        print(f"[FAIL] {section} crashed:\n{text}", flush=True)

    def markdown(self, env: dict) -> str:
        lines = [
            f"GPU report: {env['device']} · torch {env['torch']} · transformers {env['transformers']}",
            "",
        ]
        lines += [f"- {k}: {v}" for k, v in env.items() if k not in ("device", "torch", "transformers")]
        lines += ["", "| check | result | measured | limit |", "|---|---|---|---|"]
        for c in self.checks:
            measured = c["measured"].replace("\n", " ")[:300].replace("|", "\\|")
            lines.append(f"| {c['check']} | {'ok' if c['ok'] else 'FAIL'} | {measured} | {c['limit']} |")
        for name, body in self.sections.items():
            lines += ["", f"### {name}", "", *body]
        return "\n".join(lines)


def environment(cuda: bool, quick: bool) -> dict:
    import transformers

    env = {
        "device": torch.cuda.get_device_name()
        if cuda
        else f"CPU ({platform.processor() or platform.machine()})",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    if cuda:
        n = 2048 if quick else 8192
        a, b = (torch.randn(n, n, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        for _ in range(3):
            a @ b
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(10):
            a @ b
        torch.cuda.synchronize()
        env["bf16 matmul TFLOP/s (measured, random data)"] = round(
            2 * n**3 * 10 / (time.perf_counter() - t0) / 1e12
        )
        free, total = torch.cuda.mem_get_info()
        env["memory GiB"] = round(total / 2**30, 1)
    return env


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", default=",".join(SECTIONS), help=f"comma-separated: {', '.join(SECTIONS)}")
    p.add_argument(
        "--quick", action="store_true", help="tiny shapes: a smoke run (what the tests run on CPU)"
    )
    p.add_argument("--out", type=Path, default=None, help="folder for report.md and gpu.json")
    args = p.parse_args(argv)
    only = [s.strip() for s in args.only.split(",") if s.strip()]
    if unknown := set(only) - set(SECTIONS):
        p.error(f"--only: unknown {', '.join(sorted(unknown))}; choose from {', '.join(SECTIONS)}")
    cuda = torch.cuda.is_available()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    env = environment(cuda, args.quick)
    print(json.dumps(env), flush=True)
    report = Report()
    work = Path(tempfile.mkdtemp(prefix="r1cloud-gpu-"))
    for section in only:
        t0 = time.perf_counter()
        print(f"== {section}", flush=True)
        try:
            if section == "checks":
                import gpu_checks

                gpu_checks.run(report, work, cuda, args.quick)
            elif section == "offload":
                import gpu_checks

                gpu_checks.offload(report, work, cuda, args.quick)
            elif section == "landed":
                import gpu_landed

                gpu_landed.run(report, work, cuda, args.quick)
            elif section == "attention":
                import gpu_attention

                results = gpu_attention.run(args.quick, "cuda" if cuda else "cpu")
                report.sections["attention (forward + backward)"] = gpu_attention.table(results)
                errors = [(f"{r['shape']} {name}", c["rel_err"]) for r in results for name, c in r.items()
                          if isinstance(c, dict) and "rel_err" in c]  # fmt: skip
                m = gpu_attention.in_model("cuda" if cuda else "cpu")
                limit = 2 * m["segments_vs_fp32"] if cuda else 1e-5
                report.check(
                    f"attention: the varlen candidate inside a model ({m['dtype']}), log-probs against fp32",
                    m["varlen_vs_fp32"] <= limit,
                    f"varlen {m['varlen_vs_fp32']:.1e}, the trainer's segments {m['segments_vs_fp32']:.1e}",
                    "2 × segments' (bf16), 1e-5 (fp32)",
                )
                report.check(
                    "attention: every candidate within its dtype's rounding of the float64 reference",
                    all(e < (1e-2 if cuda else 1e-5) for _, e in errors),
                    "; ".join(f"{name} {e:.1e}" for name, e in errors),
                    "1e-2 (bf16), 1e-5 (fp32)",
                )
            elif section in ("mfu", "mfu7b"):
                import gpu_mfu

                title = "actor update: tokens/s and MFU" + (" (7B)" if section == "mfu7b" else "")
                report.sections[title] = gpu_mfu.run(report, work, cuda, args.quick, big=section == "mfu7b")
        except Exception as e:  # the other sections still run; the report says what crashed
            report.failed(section, e)
        finally:
            release()
        print(f"== {section}: {time.perf_counter() - t0:.0f} s", flush=True)
        if args.out:  # after each section: a call stopped at its limit keeps what ran
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / "report.md").write_text(report.markdown(env) + "\n")
            (args.out / "gpu.json").write_text(json.dumps({"env": env, "checks": report.checks}, indent=1))
    print("\n" + report.markdown(env))
    return 0 if all(c["ok"] for c in report.checks) else 1


if __name__ == "__main__":
    sys.exit(main())
