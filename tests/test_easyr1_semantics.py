"""EasyR1's keys with EasyR1's meaning, each against its code (hiyouga/EasyR1 at b44b311; the
formulas are restated here from the lines cited, as EasyR1 is not installed in the test
environment). The trainer-level cases run in tests/trainer (critic_warmup: test_runs.py
test_ppo_with_a_critic_warms_up_trains_and_resumes; chunked prefill: test_data_and_rewards.py)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest


def easyr1_constant(k: int, warmup: int) -> float:
    # verl/utils/torch_functional.py:198-202 (get_constant_schedule_with_warmup's lr_lambda)
    if k < warmup:
        return min(1.0, float(k) / float(max(1, warmup)))
    return 1.0


def easyr1_cosine(k: int, warmup: int, total: int, min_lr_ratio: float) -> float:
    # verl/utils/torch_functional.py:240-253 (get_cosine_schedule_with_warmup, num_cycles 0.5,
    # init_lr_ratio None -> 0)
    coef, intercept = (1 - min_lr_ratio) * 0.5, (1 + min_lr_ratio) * 0.5
    if k < warmup:
        return 0.0 + (1.0 - 0.0) * (float(k) / float(max(1, warmup)))
    progress = float(k - warmup) / float(max(1, total - warmup))
    return max(min_lr_ratio, math.cos(math.pi * 0.5 * 2.0 * progress) * coef + intercept)


@pytest.mark.parametrize(
    "kind,steps,ratio,total,floor",
    [("constant", 3, 0.0, 10, 0.0), ("constant", None, 0.25, 12, 0.0), ("cosine", 2, 0.0, 10, 0.1),
     ("cosine", None, 0.3, 10, 0.0), ("constant", 0, 0.0, 5, 0.0)],
)  # fmt: skip
def test_the_learning_rate_follows_easyr1s_schedule_update_by_update(kind, steps, ratio, total, floor):
    """The k-th actor update's factor on the learning rate: EasyR1 steps its LambdaLR once per
    update_actor (verl/workers/fsdp_workers.py:582-584), warm-up from lr_warmup_steps or
    int(lr_warmup_ratio × training_steps) (:345-348)."""
    from r1cloud.trainer.optim import lr_factor

    o = SimpleNamespace(
        lr_warmup_steps=steps, lr_warmup_ratio=ratio, lr_scheduler_type=kind, min_lr_ratio=floor
    )
    factor = lr_factor(o, total)
    warmup = steps if steps is not None else int(ratio * total)
    for k in range(total):
        want = easyr1_cosine(k, warmup, total, floor) if kind == "cosine" else easyr1_constant(k, warmup)
        assert factor(k) == pytest.approx(want, abs=1e-12), (k, factor(k), want)
    if warmup:
        assert factor(0) == 0.0  # EasyR1's first update moves nothing


@pytest.mark.parametrize("warmup,frozen", [(0, None), (1, None), (3, "actor frozen for 2 step(s)")])
def test_the_summary_says_how_long_the_actor_waits_for_the_critic(tmp_path, warmup, frozen):
    """verl/trainer/ray_trainer.py:586 and :659: global_step counts from 1 and the actor updates
    when critic_warmup <= global_step, so critic_warmup N freezes it for N - 1 steps."""
    from r1cloud.validate import load_spec
    from r1cloud.validate.summary import extras
    from spec_helpers import MINIMAL

    (tmp_path / "bp.yaml").write_text(MINIMAL)
    overrides = ["algorithm.adv_estimator=gae", "worker.critic.model.model_path=Qwen/Qwen2.5-0.5B-Instruct", "worker.critic.global_batch_size=8",
                 f"trainer.critic_warmup={warmup}"]  # fmt: skip
    critic = dict(extras(load_spec(tmp_path / "bp.yaml", overrides).spec))["critic"]
    assert ("actor frozen" in critic) == bool(frozen) and (frozen is None or frozen in critic)


@pytest.mark.parametrize(
    "overrides,want",
    [
        (["worker.rollout.name=hf"], "hf, temperature 1, top_p 1, TP 1 (tensor_parallel_size 2 is vLLM's)"),
        (
            ["worker.rollout.name=hf", "worker.rollout.tensor_parallel_size=1"],
            "hf, temperature 1, top_p 1, TP 1",
        ),
        (["worker.rollout.name=vllm"], "vllm, temperature 1, top_p 1, TP 2"),
        (["resources.infra=aws"], "vllm, temperature 1, top_p 1, TP 2"),  # a cloud job: vLLM
    ],
)
def test_the_summary_says_which_engine_runs_with_which_tensor_parallelism(tmp_path, overrides, want):
    """The hf engine runs unsharded (the trainer's driver uses TP 1 for it): the summary must not
    promise EasyR1's default tensor_parallel_size 2 (verl/workers/rollout/config.py) there."""
    from r1cloud.validate import load_spec
    from r1cloud.validate.summary import summarize
    from spec_helpers import MINIMAL

    (tmp_path / "bp.yaml").write_text(MINIMAL.replace("    tensor_parallel_size: 1\n", ""))
    assert dict(summarize(load_spec(tmp_path / "bp.yaml", overrides).spec))["rollout"] == want
