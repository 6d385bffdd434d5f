"""r1cloud's multi-turn episodes against TRL's tool-calling GRPOTrainer on the same work, in one run.

The task of blueprints/tools_calculator.yaml: SmolLM2-135M-Instruct multiplies a 3-digit by a
2-digit number with a `multiply` tool (tools/calculator.py, the same file in both), two worked
examples in each prompt, the reward the last turn's number (reward_functions/arithmetic.py). Both
tools see the same prompt: TRL 1.16 parses tool calls only for chat templates it knows, so the
model's tokenizer gets TRL's own Qwen2.5 template (trl.chat_template_utils.qwen2_5_chat_template)
in a copy of the model folder, and both use Hermes calls (`<tool_call>{"name": ..., "arguments":
...}</tool_call>`, r1cloud's `tool_call_format: hermes`). Calibrated so the base model scores:
with one example it never called the tool; with two and a system message that shows the call, it
calls in half its episodes and answers those right (`r1cloud try`, 16 episodes: reward 0.5), given
128 tokens (the Hermes JSON and Qwen's tool turn overran 64). Same group size, prompts per step,
budget (128 tokens for a whole episode, tool answers included: r1cloud's max_response_length,
TRL's max_completion_length), one tool round (r1cloud's max_turns 2, TRL's
max_tool_calling_iterations 1), learning rate, loss (token-mean, clip 0.2/0.28, no KL), update
micro-batches of 8 episodes (one group: r1cloud lays its prompt out once), same 2 cores. r1cloud
with one worker process holding both threads (`--workers`), without gradient checkpointing as TRL
here, and vLLM (episodes without a barrier) or transformers' generate; TRL in one process with 2
threads and transformers' generate. Runs alternate; the first
step of each is warm-up and left out of the rates.

Reported per system: wall seconds per step, rollout tokens/s, peak RSS, the mean reward and that of
the last step, tool calls per episode; and r1cloud's ratios to TRL.

Usage: python benchmarks/agents_vs_trl.py [--steps 4] [--repeats 1] [--systems r1cloud-vllm,trl] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from trainer_vs_trl import (  # noqa: E402
    ROOT,
    PeakRSS,
    launch,
    report,
    resolve_model,
    summarize,
    timed,
    trl_config,
    versions,
)

SETTINGS = {
    "prompts_per_step": 4, "group": 8, "max_new_tokens": 128, "lr": 1e-5, "seed": 1, "threads": 2,
    "workers": 1,  # r1cloud's worker processes sharing the threads (`--workers`)
}  # fmt: skip
SYSTEM = (
    "You can call a calculator. To multiply, write exactly <tool_call>\n"
    '{"name": "multiply", "arguments": {"a": X, "b": Y}}\n</tool_call> and stop; the result comes '
    "back, then answer with the number."
)


def example(a: int, b: int) -> list[dict]:
    arguments = json.dumps({"name": "multiply", "arguments": {"a": a, "b": b}})
    call = f"<tool_call>\n{arguments}\n</tool_call>"
    return [
        {"role": "user", "content": f"What is {a} times {b}?"},
        {"role": "assistant", "content": call},
        {"role": "tool", "content": str(a * b)},
        {"role": "assistant", "content": f"The answer is {a * b}."},
    ]


def prepare(work: Path) -> tuple[Path, Path]:
    """The model folder with TRL's Qwen2.5 chat template, and the data with a Hermes worked example."""
    from trl.chat_template_utils import qwen2_5_chat_template

    base, model = resolve_model("smollm2", work), work / "smollm2-qwen-template"
    shutil.copytree(base, model)
    (model / "chat_template.jinja").unlink(missing_ok=True)
    config = json.loads((model / "tokenizer_config.json").read_text())
    (model / "tokenizer_config.json").write_text(
        json.dumps({**config, "chat_template": qwen2_5_chat_template})
    )
    lead = [{"role": "system", "content": SYSTEM}, *example(12, 34), *example(251, 17)]
    data = work / "train.jsonl"
    with open(data, "w") as f:
        for line in (ROOT / "data/multiply/train.jsonl").read_text().splitlines():
            row = json.loads(line)
            f.write(json.dumps({"problem": [*lead, row["problem"][-1]], "answer": row["answer"]}) + "\n")
    return model, data


def blueprint(model: Path, data: Path, engine: str, steps: int) -> str:
    s = SETTINGS
    # one worker holds the update's activations (TRL's layout, without checkpointing as TRL runs
    # here); two workers and their two engines did not fit this 23 GB machine without it
    checkpointing = "false" if s["workers"] == 1 else "true"
    return f"""
name: bench-agents
data:
  train_files: {data}
  prompt_key: problem
  answer_key: answer
  max_prompt_length: 640
  max_response_length: {s["max_new_tokens"]}
  rollout_batch_size: {s["prompts_per_step"]}
  seed: {s["seed"]}
algorithm: {{adv_estimator: grpo, disable_kl: true}}
worker:
  actor:
    global_batch_size: {s["prompts_per_step"]}
    micro_batch_size_per_device_for_update: {s["group"]}  # TRL's micro-batch too; a group's prompt once
    dynamic_batching: false  # 8 episodes a micro-batch, not a token budget (which took all 32 at once)
    micro_batch_size_per_device_for_experience: {s["prompts_per_step"] * s["group"] // s["workers"]}
    clip_ratio_low: 0.2
    clip_ratio_high: 0.28
    model: {{model_path: {model}, trust_remote_code: false, enable_gradient_checkpointing: {checkpointing}}}
    optim: {{lr: {s["lr"]}, weight_decay: 0.0}}
    fsdp: {{torch_dtype: fp32, mp_param_dtype: fp32}}
  rollout:
    name: {engine}
    n: {s["group"]}
    seed: {s["seed"]}  # the sampling's seed (EasyR1's rollout.seed; data.seed orders the data)
    temperature: 1.0
    tensor_parallel_size: 1
    dtype: fp32
    max_num_batched_tokens: 2048
    multi_turn:
      enable: true
      tools: {ROOT}/tools/calculator.py
      tool_call_format: hermes
      max_turns: 2
      max_tool_response_length: 64
  reward:
    reward_function: {ROOT}/reward_functions/arithmetic.py:compute_score
trainer:
  max_steps: {steps}
  logger: [console]
  n_gpus_per_node: {s["workers"]}
  val_freq: -1
  val_before_train: false
  save_freq: -1
  save_hf: false
"""


def run_r1cloud(model: Path, data: Path, engine: str, steps: int, work: Path) -> dict:
    run = Path(tempfile.mkdtemp(prefix=f"r1-{engine}-", dir=work))
    _, rows, rss = launch(run, blueprint(model, data, engine, steps))
    n = SETTINGS["prompts_per_step"] * SETTINGS["group"]
    out = [
        {
            "gen_s": m["timing_s/gen"],
            "step_s": m["timing_s/step"],
            "response_tokens": m["response_length/mean"] * n,
            "tokens": m["perf/total_num_tokens"],
            "reward": m["reward/overall"],
            "tool_calls": m["agent/tool_calls"],
            "timing": {k.split("/", 1)[1]: v for k, v in m.items() if k.startswith("timing_s/")},
        }
        for m in rows
    ]
    return {
        **summarize(out),
        "tool_calls": statistics.mean(s["tool_calls"] for s in out),
        "peak_rss": rss.peak,
    }


def run_trl(model: Path, data: Path, steps: int, work: Path) -> dict:
    out = work / f"trl-{time.time_ns()}.json"
    proc = subprocess.Popen(
        [
            sys.executable,
            __file__,
            "--seed",
            str(SETTINGS["seed"]),
            "--trl-worker",
            str(model),
            str(data),
            str(steps),
            str(out),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"},
    )
    rss = PeakRSS(proc.pid)
    log, _ = proc.communicate()
    peak = rss.stop()
    if proc.returncode:
        raise RuntimeError(f"TRL failed:\n{log[-3000:]}")
    steps_out = json.loads(out.read_text())
    return {
        **summarize(steps_out),
        "tool_calls": statistics.mean(s["tool_calls"] for s in steps_out),
        "peak_rss": peak,
    }


def trl_worker(model: str, data: str, steps: int, out: str) -> None:
    import importlib.util

    import torch
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import GRPOTrainer

    s = SETTINGS
    torch.set_num_threads(s["threads"])
    rows = [json.loads(x) for x in Path(data).read_text().splitlines()]
    dataset = Dataset.from_list([{"prompt": r["problem"], "answer": r["answer"]} for r in rows])
    spec = importlib.util.spec_from_file_location("calculator", ROOT / "tools/calculator.py")
    calculator = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(calculator)
    spec = importlib.util.spec_from_file_location("arithmetic", ROOT / "reward_functions/arithmetic.py")
    arithmetic = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(arithmetic)
    record: list[dict] = []
    current: dict = {}

    def reward(completions, answer, completion_ids, **_):
        # the last assistant turn, as r1cloud scores it
        texts = [next(m["content"] for m in reversed(c) if m["role"] == "assistant") for c in completions]
        scores = [
            arithmetic.compute_score({"response": t or "", "ground_truth": a})["overall"]
            for t, a in zip(texts, answer, strict=True)
        ]
        current["response_tokens"] = sum(len(ids) for ids in completion_ids)
        current["reward"] = sum(scores) / len(scores)
        current["tool_calls"] = sum(sum(m["role"] == "tool" for m in c) for c in completions) / len(
            completions
        )
        return scores

    config = trl_config(
        Path(out).parent / "trl-agents-out",
        steps,
        s,
        bf16=False,
        gradient_checkpointing=False,
        # the step's 32 episodes generated at once, trained in 4 micro-batches of 8: one batch of 32
        # took TRL past 23 GiB (killed for memory in its second step, full-vocabulary fp32 logits)
        per_device_train_batch_size=s["prompts_per_step"] * s["group"] // 4,
        gradient_accumulation_steps=4,
        max_tool_calling_iterations=1,
        temperature=1.0,
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=reward,
        args=config,
        train_dataset=dataset,
        processing_class=AutoTokenizer.from_pretrained(model),
        tools=[calculator.multiply],
    )
    timed(trainer, "_generate", current, record)
    trainer.train()
    tok = trainer.processing_class  # prompt + response tokens per step, the tools' schemas shown
    prompt = statistics.mean(
        len(
            tok.apply_chat_template(
                r["prompt"],
                tools=[calculator.multiply],
                add_generation_prompt=True,
                tokenize=True,
                return_dict=True,
            )["input_ids"]
        )
        for r in dataset
    )
    for r in record:
        r["tokens"] = r["response_tokens"] + prompt * s["prompts_per_step"] * s["group"]
    Path(out).write_text(json.dumps(record))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=1, help="runs of each system, seeds SEED, SEED+1, …")
    parser.add_argument("--seed", type=int, default=SETTINGS["seed"], help="the first repeat's seed")
    parser.add_argument("--systems", default="r1cloud-vllm,r1cloud-hf,trl")
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument("--workers", type=int, default=1, help="r1cloud's worker processes")
    parser.add_argument("--trl-worker", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    SETTINGS["workers"], SETTINGS["seed"] = args.workers, args.seed
    if args.trl_worker:
        model, data, steps, out = args.trl_worker
        trl_worker(model, data, int(steps), out)
        return
    work = Path(tempfile.mkdtemp(prefix="bench-agents-"))
    try:
        model, data = prepare(work)
        print(f"{args.steps} steps × {args.repeats} repeats; {json.dumps(SETTINGS)}")
        print("versions " + " ".join(f"{k}={v}" for k, v in versions().items()), flush=True)
        results: dict[str, list[dict]] = {s: [] for s in args.systems.split(",")}
        for r in range(args.repeats):
            SETTINGS["seed"] = args.seed + r  # each repeat its own draw, the same in every system
            for system in results:
                t = time.perf_counter()
                if system == "trl":
                    res = run_trl(model, data, args.steps, work)
                else:
                    res = run_r1cloud(model, data, system.split("-", 1)[1], args.steps, work)
                results[system].append(res)
                print(
                    f"  {system}: {time.perf_counter() - t:.0f}s wall, {res['step_s']:.2f} s/step, "
                    f"rewards {[round(s['reward'], 3) for s in res['steps']]}, "
                    f"tool calls/episode {res['tool_calls']:.2f}",
                    flush=True,
                )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    table = report(results)
    if args.json:
        Path(args.json).write_text(
            json.dumps({"settings": SETTINGS, "versions": versions(), "results": table}, indent=2)
        )


if __name__ == "__main__":
    main()
