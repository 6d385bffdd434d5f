"""The advantage estimators `algorithm.adv_estimator` names, and what each asks of a run: the one
table validation, the driver, the workers, the cost estimate and the summary read (the trainer's
advantage functions are keyed by the same names: trainer/algorithms.ADVANTAGES)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Estimator:
    name: str
    group: bool = False  # compares the samples of one prompt's group: rollout.n must be at least 2
    per_sequence: bool = False  # one advantage per response, spread over its tokens
    critic: bool = False  # trains a value model (worker.critic) beside the actor
    greedy_baseline: bool = False  # a greedy response per prompt is its baseline (ReMax)
    preset: dict = field(default_factory=dict)  # settings it implies where the blueprint leaves them unset


# `dapo` is GRPO advantages with DAPO's settings (clip-higher, token-mean loss, dynamic sampling, no KL)
DAPO_PRESET = {
    "actor": {"clip_ratio_low": 0.2, "clip_ratio_high": 0.28, "loss_avg_mode": "token"},
    "algorithm": {"disable_kl": True, "online_filtering": True},
}
ESTIMATORS = {
    e.name: e
    for e in (
        Estimator("grpo", group=True, per_sequence=True),
        Estimator("gae", critic=True),
        Estimator("grpo_passk", group=True, per_sequence=True),
        Estimator("rloo", group=True, per_sequence=True),
        Estimator("reinforce_plus_plus"),
        Estimator("reinforce_plus_plus_baseline", group=True),
        Estimator("remax", greedy_baseline=True),
        Estimator("dapo", group=True, per_sequence=True, preset=DAPO_PRESET),
    )
}
