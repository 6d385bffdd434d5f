"""Constants shared by the spec and CLI tests (a module of its own: tests/trainer has its own conftest)."""

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REWARD = ROOT / "reward_functions" / "math.py"

# A complete, valid blueprint: each check test breaks one thing in it.
MINIMAL = f"""
data:
  train_files: hiyouga/math12k@train
  val_files: hiyouga/math12k@test
  rollout_batch_size: 16
algorithm:
  adv_estimator: grpo
worker:
  actor:
    global_batch_size: 8
    micro_batch_size_per_device_for_update: 2
    micro_batch_size_per_device_for_experience: 4
    model:
      model_path: Qwen/Qwen2.5-0.5B-Instruct
  rollout:
    n: 4
    tensor_parallel_size: 1
  reward:
    reward_function: {REWARD}:compute_score
trainer:
  n_gpus_per_node: 2
  logger: [console]
"""
