"""Every EasyR1 example script (tests/fixtures/easyr1/examples: EasyR1 b44b311's 20) validated as
it is, then trained shrunk by overrides only, and a markdown table of what happened.

Shrinking replaces what cannot be here — the model (a tiny random one of the script's family:
Qwen2/Qwen2.5-VL/Qwen3-VL or a Qwen2 text model), the Hub data (the arithmetic rows, or the
shapes pictures for a VL script), 8 GPUs (2 CPU workers; `ulysses_size` and tensor parallel sized
to them), the lengths and batch sizes — and turns online filtering off (a random model answers
nothing right, so every group would be filtered). Everything else runs as the script sets it:
algorithm, loss, LoRA, dtypes, optimizer, loggers (wandb and swanlab offline), reward function and
its kwargs, format prompt. CI runs the validation of all 20 and one shrunk run
(tests/test_easyr1_scripts.py, tests/trainer/test_runs.py); this runs all 20 (about 10 minutes
on 2 cores).

    python scripts/easyr1_examples.py [--steps 1] [--only NAME ...] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EASYR1 = ROOT / "tests" / "fixtures" / "easyr1"


def family(script: Path) -> str | None:
    """The tiny model to train: the VLM family the script's MODEL_PATH names, else None (text)."""
    text = script.read_text()
    for name, arch in (("Qwen3-VL", "qwen3_vl"), ("Qwen2.5-VL", "qwen2_5_vl"), ("Qwen2-VL", "qwen2_vl")):
        if name in text:
            return arch
    return None


def shrink(script: Path, spec, model: Path, data: dict, steps: int) -> list[str]:
    """The overrides that fit `script` (its resolved `spec`) on this machine."""
    vl = "image_dir" in data
    over = [
        f"worker.actor.model.model_path={model}", f"data.train_files={data['train']}", f"data.val_files={data['val']}",
        "data.prompt_key=problem", "data.answer_key=answer", "data.max_prompt_length=192",
        "data.max_response_length=16", "data.rollout_batch_size=4", "data.val_batch_size=4",
        "worker.actor.global_batch_size=2", "worker.rollout.n=2", "worker.rollout.tensor_parallel_size=1",
        "worker.rollout.name=hf", "worker.rollout.max_num_batched_tokens=1024",
        'worker.rollout.val_override_config={"n": 1, "temperature": 0}', "trainer.n_gpus_per_node=2",
        "trainer.nnodes=1", f"trainer.max_steps={steps}", "trainer.val_before_train=false",
    ]  # fmt: skip
    if vl:
        over += [f"data.image_dir={data['image_dir']}", "data.image_key=images", "data.min_pixels=784",
                 "data.max_pixels=3136"]  # fmt: skip
    if spec.data.mini_rollout_batch_size:
        over.append("data.mini_rollout_batch_size=2")
    if spec.worker.actor.ulysses_size > 1:
        over.append("worker.actor.ulysses_size=2")
    if spec.algorithm.online_filtering:
        over.append("algorithm.online_filtering=false")
    kwargs = spec.worker.reward.reward_function_kwargs or {}
    if "max_response_length" in kwargs:  # DAPO's overlong penalty, sized to the shrunk responses
        over.append(
            f"worker.reward.reward_function_kwargs={json.dumps({**kwargs, 'max_response_length': 16, 'overlong_buffer_length': 4})}"
        )
    return over


def prepare(work: Path) -> dict:
    """The tiny models and the local data, made once."""
    sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "data" / "shapes")]  # tiny.py, generate.py
    import generate

    from tiny import make_tiny_model, make_tiny_vlm

    rows = (ROOT / "data/arithmetic/train.jsonl").read_text().splitlines(True)
    (work / "text").mkdir(parents=True, exist_ok=True)
    (work / "text/train.jsonl").write_text("".join(rows[:64]))
    (work / "text/val.jsonl").write_text("".join(rows[64:68]))
    shapes = work / "shapes"
    generate.write(shapes, train=16, test=4)
    models = {None: make_tiny_model(work / "models/text")}
    for arch in ("qwen2_vl", "qwen2_5_vl", "qwen3_vl"):
        models[arch] = make_tiny_vlm(work / f"models/{arch}", arch=arch)
    return {
        "models": models,
        "text": {"train": work / "text/train.jsonl", "val": work / "text/val.jsonl"},
        "vl": {"train": shapes / "train.jsonl", "val": shapes / "test.jsonl", "image_dir": shapes},
    }


def one(script: Path, made: dict, work: Path, steps: int) -> dict:
    from r1cloud.spec import SpecError, dump_spec
    from r1cloud.validate import load_spec

    row = {"script": str(script.relative_to(EASYR1 / "examples"))}
    try:
        spec = load_spec(script).spec
        row["validates"] = "✓"
    except SpecError as e:
        row["validates"] = "✗ " + e.problems[0].render()
        return row
    arch = family(script)
    over = shrink(script, spec, made["models"][arch], made["vl" if arch else "text"], steps)
    run = work / "runs" / script.stem
    run.mkdir(parents=True, exist_ok=True)
    (run / "spec.yaml").write_text(dump_spec(load_spec(script, over).spec))
    env = {**os.environ, "WANDB_MODE": "offline", "SWANLAB_MODE": "offline", "TQDM_DISABLE": "1"}
    start = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "r1cloud.trainer", str(run)], capture_output=True, text=True,
                       env=env, timeout=900)  # fmt: skip
    row["seconds"] = round(time.monotonic() - start)
    done = (
        [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
        if (run / "metrics.jsonl").exists()
        else []
    )
    trained = [m for m in done if "actor/pg_loss" in m]
    if r.returncode == 0 and len(trained) == steps:
        row["runs shrunk"] = f"✓ {steps} step(s), {row['seconds']} s"
    else:
        last = (r.stderr.strip().splitlines() or ["(no output)"])[-1]
        row["runs shrunk"] = f"✗ exit {r.returncode}: {last[:160]}"
    row["model"] = arch or "qwen2 (text)"
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1)
    parser.add_argument("--only", nargs="*", default=None, help="script stems to run")
    parser.add_argument("--keep", type=Path, default=None, help="keep the models and runs in this folder")
    args = parser.parse_args()
    scripts = sorted((EASYR1 / "examples").glob("**/*.sh"))
    if args.only:
        scripts = [s for s in scripts if s.stem in args.only]
    os.chdir(EASYR1)  # as EasyR1's README runs them: from the repository root
    with tempfile.TemporaryDirectory(prefix="easyr1-examples-") as tmp:
        work = args.keep or Path(tmp)
        made = prepare(work)
        rows = []
        for script in scripts:
            rows.append(one(script, made, work, args.steps))
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    print("| script | model (tiny) | validates | runs shrunk |\n|---|---|---|---|")
    for r in rows:
        print(f"| `{r['script']}` | {r.get('model', '')} | {r['validates']} | {r.get('runs shrunk', '—')} |")
    return 0 if all(r["validates"] == "✓" and r.get("runs shrunk", "").startswith("✓") for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
