"""Helpers for the trainer tests: a tiny blueprint and the node entrypoint as a subprocess."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
R1CLOUD = str(Path(sys.executable).parent / "r1cloud")

# A reward a random tiny model can earn: the share of digits in its response (varied, so GRPO
# advantages and gradients are non-zero from the first step).
DIGITS_REWARD = """
REWARD_TYPE = "batch"

def compute_score(reward_inputs):
    out = []
    for x in reward_inputs:
        text = x["response"]
        digits = sum(c.isdigit() for c in text) / max(len(text), 1)
        out.append({"overall": digits, "digits": digits})
    return out
"""


def tiny_blueprint(model: Path, reward: Path, **kw) -> str:
    return textwrap.dedent(
        f"""
        name: tiny
        data:
          train_files: {ROOT}/data/arithmetic/train.jsonl
          val_files: {ROOT}/data/arithmetic/test.jsonl
          prompt_key: problem
          answer_key: answer
          format_prompt: {ROOT}/format_prompts/arithmetic.jinja
          max_prompt_length: 64
          max_response_length: 12
          rollout_batch_size: 4
          val_batch_size: 16
        algorithm:
          adv_estimator: grpo
          use_kl_loss: true
          kl_penalty: low_var_kl
          kl_coef: 0.01
        worker:
          actor:
            global_batch_size: 4
            micro_batch_size_per_device_for_update: 2
            micro_batch_size_per_device_for_experience: 4
            model:
              model_path: {model}
              trust_remote_code: false
            optim:
              lr: 1.0e-3
            fsdp:
              torch_dtype: fp32
              mp_param_dtype: fp32
          ref:
            fsdp:
              torch_dtype: fp32
              mp_param_dtype: fp32
          rollout:
            name: {kw.get("engine", "hf")}
            n: 4
            tensor_parallel_size: 1
            dtype: fp32
            max_num_batched_tokens: 1024
            val_override_config: {{temperature: 0, n: 1}}
          reward:
            reward_function: {reward}:compute_score
        trainer:
          max_steps: 3
          logger: [console]
          n_gpus_per_node: 2
          val_before_train: false
          val_freq: -1
          save_freq: 1
        """
    )


def run_of(blueprint: Path, overrides: list[str], run: Path) -> Path:
    """`run`, a run folder holding `blueprint` resolved with `overrides` (its files found beside it)."""
    from r1cloud.spec import dump_spec
    from r1cloud.validate import load_spec

    run.mkdir()
    (run / "spec.yaml").write_text(dump_spec(load_spec(blueprint, overrides).spec))
    return run


def run_trainer(run: Path, timeout: int = 600, env: dict | None = None) -> subprocess.CompletedProcess:
    """The node entrypoint as a backend starts it: `python -m r1cloud.trainer RUN_DIR`, with the
    job's `env` (a backend sets the spec's envs and secrets)."""
    return subprocess.run(
        [sys.executable, "-m", "r1cloud.trainer", str(run)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
    )


def r1(
    *args, timeout: int = 900, env: dict | None = None, input: str | None = None
) -> subprocess.CompletedProcess:
    """The `r1cloud` command as a user runs it; `env` is added to this process's environment."""
    return subprocess.run(
        [R1CLOUD, *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
        input=input,
    )


def tiny_vl_blueprint(model: Path, shapes: Path, reward: Path, engine: str = "hf", steps: int = 2) -> str:
    """An EasyR1-format VL config: the tiny blueprint on the shapes data (relative image paths under
    image_dir) with the tiny Qwen2-VL, 2 workers; pixels kept small so an image is a few tokens."""
    import yaml

    bp = yaml.safe_load(tiny_blueprint(model, reward, engine=engine))
    bp["name"] = "tinyvl"
    bp["data"] = {
        "train_files": f"{shapes}/train.jsonl", "val_files": f"{shapes}/test.jsonl",
        "prompt_key": "problem", "answer_key": "answer", "image_key": "images", "image_dir": str(shapes),
        "min_pixels": 784, "max_pixels": 3136, "max_prompt_length": 96, "max_response_length": 8,
        "rollout_batch_size": 4, "val_batch_size": 4,
    }  # fmt: skip
    bp["worker"]["rollout"].update(n=2, limit_images=2)
    bp["trainer"]["max_steps"] = steps
    return yaml.safe_dump(bp, sort_keys=False)
