"""Algorithm functions against the reference formulas, written here independently as scalar
loops (shared/reference/rl-algorithms-and-vllm.md §2, EasyR1 §5), on random inputs and edges."""

import math
import statistics

import pytest
import torch

from r1cloud.trainer import algorithms as alg
from r1cloud.trainer.algorithms import (
    ClipConfig,
    aggregate,
    count_for,
    grpo_advantages,
    kl_estimate,
    ppo_loss,
    token_level,
)

torch.manual_seed(0)


def ref_grpo(scores, uids, eps=1e-6, norm=True):
    out = []
    for s, u in zip(scores, uids, strict=True):
        group = [x for x, v in zip(scores, uids, strict=True) if v == u]
        if len(group) == 1:
            out.append(0.0)
            continue
        mean = sum(group) / len(group)
        out.append((s - mean) / (statistics.stdev(group) + eps) if norm else s - mean)
    return out


@pytest.mark.parametrize("norm", [True, False])
def test_grpo_matches_reference_on_random_groups(norm):
    for _ in range(20):
        n_groups, size = torch.randint(1, 6, ()).item(), torch.randint(2, 7, ()).item()
        uids = [f"p{g}" for g in range(n_groups) for _ in range(size)]
        perm = torch.randperm(len(uids)).tolist()
        uids = [uids[i] for i in perm]
        scores = torch.randn(len(uids)) * 3
        got = grpo_advantages(scores, uids, norm_by_std=norm)
        want = torch.tensor(ref_grpo(scores.tolist(), uids, norm=norm))
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_grpo_known_values_and_edges():
    torch.testing.assert_close(
        grpo_advantages(torch.tensor([1.0, 0.0, 1.0]), ["a", "a", "a"]),
        torch.tensor([0.5774, -1.1547, 0.5774]),
        atol=1e-4,
        rtol=0,
    )
    assert grpo_advantages(torch.tensor([1.0, 1.0, 1.0]), [0, 0, 0]).abs().max() == 0  # all equal: no signal
    assert grpo_advantages(torch.tensor([5.0, 1.0, 2.0]), [0, 1, 1])[0] == 0  # singleton group (r1cloud)
    assert grpo_advantages(torch.tensor([3.0, 1.0]), torch.tensor([7, 7])).tolist() == pytest.approx(
        [0.7071, -0.7071], abs=1e-4
    )


def test_token_level_broadcast_respects_the_mask():
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]], dtype=torch.float32)
    assert token_level(torch.tensor([2.0, -1.0]), mask).tolist() == [[2, 2, 0], [-1, 0, 0]]


def ref_kl(lp, ref, kind):
    d = lp - ref
    if kind == "kl":
        return d
    if kind == "abs":
        return abs(d)
    if kind == "mse":
        return 0.5 * d * d
    x = max(-20.0, min(20.0, ref - lp))
    return max(-10.0, min(10.0, math.exp(x) - x - 1))


@pytest.mark.parametrize("kind", ["kl", "abs", "mse", "low_var_kl"])
def test_kl_estimators(kind):
    lp, ref = torch.randn(4, 9) * 2, torch.randn(4, 9) * 2
    lp[0, 0], ref[0, 0] = -40.0, 0.0  # exercises the k3 clamps
    got = kl_estimate(lp, ref, kind)
    want = torch.tensor(
        [
            [ref_kl(a, b, kind) for a, b in zip(r1, r2, strict=True)]
            for r1, r2 in zip(lp.tolist(), ref.tolist(), strict=True)
        ]
    )
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def ref_ppo_token(lp, olp, a, low, high, dual):
    lr = lp - olp
    r = math.exp(max(-20, min(20, lr)))
    rc = math.exp(max(math.log(1 - low), min(math.log(1 + high), lr)))
    l1, l2 = -a * r, -a * rc
    lc = max(l1, l2)
    return min(lc, -a * dual) if a < 0 else lc


def test_dual_clip_ppo_matches_reference():
    clip = ClipConfig(low=0.2, high=0.28, dual=3.0)
    B, T = 6, 11
    old = torch.randn(B, T)
    lp = old + torch.randn(B, T) * 0.8  # ratios well outside the clip range too
    adv = token_level(torch.randn(B) * 2, torch.ones(B, T))
    mask = (torch.rand(B, T) > 0.2).float()
    loss, metrics = ppo_loss(lp, old, adv, mask, clip)
    want = torch.tensor(
        [
            [
                ref_ppo_token(lp[b, t].item(), old[b, t].item(), adv[b, t].item(), 0.2, 0.28, 3.0)
                for t in range(T)
            ]
            for b in range(B)
        ]
    )
    torch.testing.assert_close(loss, want, atol=1e-5, rtol=1e-5)
    # metrics, from their definitions
    lr = lp - old
    ratio = lr.exp()
    l1, l2 = -adv * ratio, -adv * ratio.clamp(0.8, 1.28)
    m = mask.bool()
    assert metrics["pg_clipfrac_higher"].item() == pytest.approx((l1 < l2)[m].float().mean().item(), abs=1e-6)
    lower = (torch.maximum(l1, l2) > -adv * 3.0) & (adv < 0)
    assert metrics["pg_clipfrac_lower"].item() == pytest.approx(lower[m].float().mean().item(), abs=1e-6)
    assert metrics["ppo_kl"].item() == pytest.approx((-lr)[m].mean().item(), abs=1e-5)


def test_ppo_loss_gradient_is_the_policy_gradient_on_policy():
    # At ratio 1 with no clipping, d/dlogp of −A·r is −A.
    lp = torch.zeros(2, 3, requires_grad=True)
    adv = torch.tensor([[1.0] * 3, [-2.0] * 3])
    loss, _ = ppo_loss(lp, torch.zeros(2, 3), adv, torch.ones(2, 3), ClipConfig())
    loss.sum().backward()
    torch.testing.assert_close(lp.grad, -adv)


@pytest.mark.parametrize("mode", ["token", "seq"])
def test_aggregate_definitions_and_split_invariance(mode):
    values = torch.randn(8, 7)
    mask = (torch.rand(8, 7) > 0.3).float()
    mask[3] = 0  # an empty response
    whole = aggregate(values, mask, mode)
    if mode == "token":
        want = (values * mask).sum() / mask.sum()
    else:
        rows = [(values[b] * mask[b]).sum() / mask[b].sum() for b in range(8) if mask[b].sum() > 0]
        want = sum(rows) / len(rows)
    torch.testing.assert_close(whole, want)
    # Micro-batches of any size, each normalised by the global count, add up to the same number.
    total = count_for(mode, mask)
    for size in (1, 3, 8):
        parts = sum(
            aggregate(values[i : i + size], mask[i : i + size], mode, total) for i in range(0, 8, size)
        )
        torch.testing.assert_close(parts, whole)


@pytest.mark.parametrize("mode", ["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"])
def test_rollout_importance_sampling_weights_follow_trls_formula(mode):
    """exp(old − rollout) per token, or of the sequence sum; truncated at the cap or masked above
    it; nothing on padding (written out here from TRL's description, reference §2.5)."""
    g = torch.Generator().manual_seed(3)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1]], dtype=torch.float32)
    old = -torch.rand(4, 4, generator=g)
    rollout = old + torch.randn(4, 4, generator=g) * 0.8
    cap = 1.5
    got = alg.rollout_is_weights(old, rollout, mask, mode, cap)
    for b in range(4):
        n = int(mask[b].sum())
        for t in range(4):
            if t >= n:
                assert got[b, t] == 0
                continue
            diff = old[b, :n] - rollout[b, :n]
            w = math.exp(float(diff.sum() if mode.startswith("sequence") else diff[t]))
            want = min(w, cap) if mode.endswith("truncate") else (w if w <= cap else 0.0)
            assert got[b, t].item() == pytest.approx(want, rel=1e-5)
    assert not got.requires_grad


def test_engine_gap_over_micro_batches_becomes_the_steps_logp_diff():
    """On-policy, the update's log-probs against the engine's: |diff| summed over response tokens
    across micro-batches (padding left out however large), its max, and per token in the metrics."""
    from r1cloud.trainer.metrics import actor_metrics, engine_gap

    mask = torch.tensor([[1, 1, 0], [1, 0, 0]], dtype=torch.float32)
    logp = torch.tensor([[-1.0, -2.0, -9.0], [-0.5, 0.0, 0.0]])
    rollout = torch.tensor([[-1.1, -1.7, 5.0], [-0.5, 3.0, 3.0]])
    stats: dict = {}
    engine_gap(stats, logp, rollout, mask)
    engine_gap(stats, logp[:1], rollout[:1] - 0.2, mask[:1])  # a second micro-batch
    assert stats["engine_diff"] == pytest.approx(0.1 + 0.3 + 0.0 + 0.3 + 0.1)
    assert stats["engine_diff_max"] == pytest.approx(0.3)
    zeros = dict.fromkeys(("pg_loss", "entropy_loss", "entropy", "clip_hi", "clip_lo", "ppo_kl", "lr"), 0.0)
    rank = zeros | {"grad_norm": 1.0, "tokens": 5.0} | stats
    m = actor_metrics([[rank], [{**rank, "engine_diff_max": 0.5}]], 1, tis=False, kl_loss=False)
    assert m["rollout/logp_diff_mean"] == pytest.approx(2 * 0.8 / 10)
    assert m["rollout/logp_diff_max"] == pytest.approx(0.5)
    off_policy = {k: v for k, v in rank.items() if not k.startswith("engine_")}  # old log-probs given
    assert not any(k.startswith("rollout/") for k in actor_metrics([[off_policy]], 1, False, False))


def test_dynamic_sampling_keeps_groups_strictly_inside_the_bounds():
    uids = ["a", "a", "b", "b", "c", "d", "d", "e", "e"]
    values = [1.0, 1.0, 0.0, 0.0, 0.5, 0.01, 0.01, 0.2, 0.9]
    # a: all right, b: all wrong, c: a singleton in range, d: exactly at the low bound, e: mixed
    assert alg.groups_to_keep(uids, values, 0.01, 0.99) == {"c", "e"}
    assert alg.groups_to_keep([], [], 0.01, 0.99) == set()


def test_every_estimator_has_one_advantage_function_and_dapo_is_grpo():
    """core/estimators.py names the estimators the schema accepts; the trainer has a function for
    each and no other, and DAPO's preset changes settings, not advantages."""
    from types import SimpleNamespace

    from r1cloud.core.estimators import ESTIMATORS
    from r1cloud.spec.models import AlgorithmConfig

    assert set(alg.ADVANTAGES) == set(ESTIMATORS)
    assert set(AlgorithmConfig.model_fields["adv_estimator"].annotation.__args__) == set(ESTIMATORS)
    g = torch.Generator().manual_seed(3)
    mask = (torch.rand(6, 5, generator=g) > 0.3).float()
    x = alg.Outcomes(list("aabbcc"), torch.rand(6, generator=g), torch.rand(6, 5, generator=g), mask)
    a = SimpleNamespace(adv_estimator="dapo", norm_adv_by_std_in_grpo=True)
    dapo, _ = alg.advantages(a, x)
    grpo, _ = alg.advantages(SimpleNamespace(**{**vars(a), "adv_estimator": "grpo"}), x)
    assert torch.equal(dapo, grpo) and bool((dapo * (1 - mask) == 0).all())
