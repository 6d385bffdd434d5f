"""LoRA against full fine-tuning in r1cloud's trainer, on the same work, in one run.

SmolLM2-135M-Instruct on data/arithmetic (trainer_vs_trl.py's text task: same prompts, group size,
lengths, loss and reward), vLLM rollouts, 2 workers on the same 2 cores. Variants, alternating:
full fine-tuning at its usual learning rate (1e-5 here), and LoRA rank 8 and 64 (alpha = 2·rank)
at LoRA's usual rate (ten times that, as EasyR1's LoRA script against its config), each with the
adapters synced into vLLM merged into the weights (`lora.merge: true`) and as adapters alone
(`false`: a LoRA-enabled engine), and QLoRA (`r8-qlora`: the base in 4-bit NF4 through
bitsandbytes, merged sync).

Reported per variant: seconds per step and per phase (the weight sync and generation are where
the two LoRA syncs differ), peak RSS of the largest worker process and of the whole tree, and the
mean reward of the first and the last quarter of the steps. The first step is warm-up and is left
out of the times.

Usage: python benchmarks/lora.py [--steps 16] [--variants full,r8-merged,r8-adapter,r64-merged,r64-adapter,r8-qlora]
       [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

FULL_LR, LORA_LR = 1e-5, 1e-4


def variant_overrides(name: str) -> list[str]:
    if name == "full":
        return [f"worker.actor.optim.lr={FULL_LR}"]
    rank, sync = name.removeprefix("r").split("-")
    how = (  # QLoRA: a 4-bit base, always synced merged (dequantised)
        "worker.actor.model.lora.load_in_4bit=true"
        if sync == "qlora"
        else f"worker.actor.model.lora.merge={'true' if sync == 'merged' else 'false'}"
    )
    return [
        f"worker.actor.model.lora.rank={rank}",
        f"worker.actor.model.lora.alpha={2 * int(rank)}",
        how,
        f"worker.actor.optim.lr={LORA_LR}",
    ]


def run(name: str, model: Path, steps: int, work: Path) -> dict:
    from trainer_vs_trl import blueprint, launch

    folder = Path(tempfile.mkdtemp(prefix=f"lora-{name}-", dir=work))
    out, rows, rss = launch(folder, blueprint(model, "vllm", steps), variant_overrides(name))
    timed = rows[1:] or rows
    quarter = max(1, len(rows) // 4)
    line = next((x for x in out.splitlines() if "LoRA rank" in x), "")
    return {
        "step_s": statistics.mean(m["timing_s/step"] for m in timed),
        "phases": {
            k.split("/", 1)[1]: statistics.mean(m.get(k, 0.0) for m in timed)
            for k in timed[0]
            if k.startswith("timing_s/") and k != "timing_s/step"
        },
        "worker_rss": rss.worker,
        "tree_rss": rss.peak,
        "reward_first": statistics.mean(m["reward/overall"] for m in rows[:quarter]),
        "reward_last": statistics.mean(m["reward/overall"] for m in rows[-quarter:]),
        "trained": line.split("] ", 1)[-1],
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--variants", default="full,r8-merged,r8-adapter,r64-merged,r64-adapter,r8-qlora")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    from trainer_vs_trl import resolve_model

    work = Path(tempfile.mkdtemp(prefix="bench-lora-"))
    results = {}
    try:
        model = resolve_model("smollm2", work)
        print(
            f"SmolLM2-135M-Instruct, {args.steps} steps, full lr {FULL_LR:g}, LoRA lr {LORA_LR:g}", flush=True
        )
        for name in args.variants.split(","):
            t = time.perf_counter()
            results[name] = run(name, model, args.steps, work)
            print(f"  {name}: {time.perf_counter() - t:.0f}s wall", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(
        f"{'variant':12} {'s/step':>7} {'sync s':>7} {'gen s':>6} {'update s':>8} {'worker RSS GiB':>15}"
        f" {'tree RSS GiB':>13} {'reward first→last':>18}"
    )
    for name, r in results.items():
        p = r["phases"]
        print(
            f"{name:12} {r['step_s']:7.2f} {p.get('sync', 0):7.3f} {p.get('gen', 0):6.2f} {p.get('update_actor', 0):8.2f}"
            f" {r['worker_rss'] / 2**30:15.2f} {r['tree_rss'] / 2**30:13.2f}"
            f" {r['reward_first']:8.3f} → {r['reward_last']:.3f}"
        )
    for name, r in results.items():
        if r["trained"]:
            print(f"{name}: {r['trained']}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
