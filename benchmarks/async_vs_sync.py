"""Asynchronous training against the synchronous run on the same work and the same 2 cores, one run
each, in one process after the other (the section `## async` of RESULTS.md).

Tasks:
- agents: the calculator task of agents_vs_trl.py (SmolLM2-135M-Instruct, 4 prompts × 8 episodes a
  step, one tool round, vLLM) with its `multiply` taking real time, 0.5-2 s a call (a seeded draw;
  a sleep, as a code sandbox's or a search's wait), one tool process. Synchronous: one worker with
  both threads generates, waits for the tools, trains. Asynchronous: a rollout worker and a train
  worker (one thread each), samples at most one update old, weights pushed after every update.
- longtail: the quickstart's task with 256 response tokens at temperature 1.2, where a few answers
  ramble to the limit and the step waits for them.
- quickstart: blueprints/quickstart.yaml against blueprints/quickstart_async.yaml: the held-out
  accuracy every 5 steps, and the wall time of each.

Reported per run: seconds per step (the first left out: warm-up), steps per hour, the reward's mean and
its standard error over the steps, and for the asynchronous run the staleness and each pool's idle
share; then the ratio of steps per hour, asynchronous to synchronous.

Usage: python benchmarks/async_vs_sync.py [--tasks agents,longtail,quickstart] [--steps 24] [--longtail-steps 12] [--json out.json]
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

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from agents_vs_trl import blueprint as agents_blueprint  # noqa: E402
from agents_vs_trl import prepare  # noqa: E402
from trainer_vs_trl import ROOT, launch, resolve_model, versions  # noqa: E402

SLOW_TOOL = '''"""tools/calculator.py's multiply, taking 0.5-2 s a call (a seeded draw per tool process)."""
import random
import time

_draw = random.Random(0)


def multiply(a: int, b: int) -> int:
    """Multiply two whole numbers.

    Args:
        a: The first number.
        b: The second number.
    """
    time.sleep(_draw.uniform(0.5, 2.0))
    return a * b
'''
ASYNC = {"enable": True, "max_staleness": 1, "trigger_parameter_sync_step": 1}


def agents(work: Path, steps: int, asynchronous: bool) -> dict:
    model, data = prepare(work) if not (work / "train.jsonl").exists() else (
        work / "smollm2-qwen-template", work / "train.jsonl"
    )  # fmt: skip
    tools = work / "slow_calculator.py"
    tools.write_text(SLOW_TOOL)
    bp = yaml.safe_load(agents_blueprint(model, data, "vllm", steps))
    bp["worker"]["rollout"]["multi_turn"]["tools"] = str(tools)
    bp["worker"]["reward"]["num_cpus"] = 1  # one tool process: its calls one after another
    if asynchronous:
        bp["worker"]["rollout"]["n_gpus_per_node"] = 1
        bp["async_training"] = ASYNC
    return timed_run(work, "agents", bp)


def quickstart_text(name: str) -> dict:
    text = (ROOT / "blueprints" / name).read_text().replace("../", f"{ROOT}/")
    bp = yaml.safe_load(text)
    bp["worker"]["actor"]["model"]["model_path"] = str(resolve_model("smollm2", ROOT))
    bp["trainer"]["logger"] = ["console"]
    return bp


def longtail(work: Path, steps: int, asynchronous: bool) -> dict:
    bp = quickstart_text("quickstart_async.yaml" if asynchronous else "quickstart.yaml")
    bp["data"]["max_response_length"] = 256
    bp["worker"]["rollout"]["temperature"] = 1.2
    bp["trainer"].update(max_steps=steps, val_freq=-1, val_before_train=False, save_freq=-1, save_hf=False)
    return timed_run(work, "longtail", bp)


def quickstart(work: Path, steps: int, asynchronous: bool) -> dict:
    bp = quickstart_text("quickstart_async.yaml" if asynchronous else "quickstart.yaml")
    bp["trainer"].update(save_freq=-1, save_hf=False)  # the held-out curve is what is compared
    return timed_run(work, "quickstart", bp)


def timed_run(work: Path, task: str, bp: dict) -> dict:
    run = Path(tempfile.mkdtemp(prefix=f"{task}-", dir=work))
    tick = time.perf_counter()
    out, rows, rss = launch(run, yaml.safe_dump(bp, sort_keys=False))
    wall = time.perf_counter() - tick
    train = [m for m in rows if "timing_s/step" in m]
    timed = train[1:] or train
    rewards = [m["reward/overall"] for m in train]
    res = {
        "wall_s": wall,
        "step_s": statistics.mean(m["timing_s/step"] for m in timed),
        "reward_mean": statistics.mean(rewards),
        "reward_se": statistics.stdev(rewards) / len(rewards) ** 0.5 if len(rewards) > 1 else 0.0,
        "rewards": rewards,
        "val": [(m["step"], m["val/reward_score"]) for m in rows if "val/reward_score" in m],
        "response_length": [m["response_length/mean"] for m in train],
        "response_max": [m["response_length/max"] for m in train],
        "peak_rss_gib": rss.peak / 2**30,
    }
    res["steps_per_hour"] = 3600 / res["step_s"]
    if any("async/staleness_mean" in m for m in timed):
        for key in ("staleness_mean", "staleness_max", "trainer_idle", "rollout_idle"):
            values = [m[f"async/{key}"] for m in timed if f"async/{key}" in m]
            res[key] = statistics.mean(values)
    return res


TASKS = {"agents": agents, "longtail": longtail, "quickstart": quickstart}


def line(name: str, r: dict) -> str:
    extra = ""
    if "staleness_mean" in r:
        extra = (
            f", staleness mean {r['staleness_mean']:.2f} max {r['staleness_max']:.0f}, idle: trainer "
            f"{r['trainer_idle']:.2f} rollout {r['rollout_idle']:.2f}"
        )
    val = f", held-out {' '.join(f'{v:.3f}' for _, v in r['val'])}" if r["val"] else ""
    return (
        f"  {name}: {r['wall_s']:.0f} s wall, {r['step_s']:.2f} s/step, {r['steps_per_hour']:.0f} steps/h, "
        f"reward {r['reward_mean']:.3f} ± {r['reward_se']:.3f}, response length mean "
        f"{statistics.mean(r['response_length']):.1f} max {max(r['response_max']):.0f}{val}{extra}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tasks", default="agents,longtail,quickstart")
    parser.add_argument("--steps", type=int, default=24, help="steps of the agents task")
    parser.add_argument("--longtail-steps", type=int, default=12, help="steps of the longtail task")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    print("versions " + " ".join(f"{k}={v}" for k, v in versions().items()), flush=True)
    work = Path(tempfile.mkdtemp(prefix="bench-async-"))
    results = {}
    try:
        for task in args.tasks.split(","):
            results[task] = {}
            for mode in ("sync", "async"):
                steps = args.longtail_steps if task == "longtail" else args.steps  # quickstart: its 30
                results[task][mode] = r = TASKS[task](work, steps, mode == "async")
                print(line(f"{task} {mode}", r), flush=True)
            s, a = results[task]["sync"], results[task]["async"]
            ratio = a["steps_per_hour"] / s["steps_per_hour"]
            gap = a["reward_mean"] - s["reward_mean"]
            se = (a["reward_se"] ** 2 + s["reward_se"] ** 2) ** 0.5
            print(
                f"{task}: async/sync steps per hour {ratio:.2f}×, wall {a['wall_s'] / s['wall_s']:.2f}×, "
                f"reward {gap:+.3f} ± {se:.3f}",
                flush=True,
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"versions": versions(), "results": results}, indent=2))


if __name__ == "__main__":
    main()
