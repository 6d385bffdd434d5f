"""r1cloud's algorithm functions against verl 0.9.1's own `core_algos` (installed for tests
without its GPU extras), on random inputs and edge cases: agreement to float32 round-off.

Where r1cloud deliberately differs it says so: singleton groups get advantage 0 (verl's GRPO
gives r/(1+ε), its RLOO loop r), and r1cloud follows EasyR1's `gspo`/`gspo_token` (dual-clip on
the sequence ratio) where verl's `gspo` is the token form without dual clip."""

import numpy as np
import pytest
import torch

from r1cloud.trainer import algorithms as alg

ca = pytest.importorskip("verl.trainer.ppo.core_algos")

B, T = 12, 9


def batch(seed: int, groups: int = 3, ragged: bool = True):
    g = torch.Generator().manual_seed(seed)
    scores = torch.rand(B, generator=g)
    uids = [f"u{i % groups}" for i in range(B)]
    lengths = torch.randint(1, T + 1, (B,), generator=g) if ragged else torch.full((B,), T)
    mask = (torch.arange(T)[None, :] < lengths[:, None]).float()
    token_rewards = torch.zeros(B, T)
    token_rewards[torch.arange(B), lengths - 1] = scores  # the outcome on the last token
    return scores, uids, mask, token_rewards


def cfg(**kw):
    from omegaconf import OmegaConf

    return OmegaConf.create({"norm_adv_by_std_in_grpo": True, "gamma": 1.0, "lam": 1.0, **kw})


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("norm", [True, False])
def test_grpo_and_dr_grpo(seed, norm):
    scores, uids, mask, tr = batch(seed)
    want, _ = ca.compute_grpo_outcome_advantage(
        tr, mask, np.array(uids, dtype=object), norm_adv_by_std_in_grpo=norm
    )
    got = alg.token_level(alg.grpo_advantages(scores, uids, norm_by_std=norm), mask)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_grpo_singleton_groups_differ_on_purpose():
    scores, _, mask, tr = batch(0)
    uids = [f"solo{i}" for i in range(B)]
    want, _ = ca.compute_grpo_outcome_advantage(tr, mask, np.array(uids, dtype=object))
    assert torch.allclose(want[:, 0], scores / (1 + 1e-6))  # verl: r/(1+ε)
    assert torch.equal(alg.grpo_advantages(scores, uids), torch.zeros(B))  # r1cloud: no peer, no signal


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("norm", [True, False])
def test_grpo_passk(seed, norm):
    scores, uids, mask, tr = batch(seed)
    want, _ = ca.compute_grpo_passk_outcome_advantage(
        tr, mask, np.array(uids, dtype=object), config=cfg(norm_adv_by_std_in_grpo=norm)
    )
    got = alg.token_level(alg.grpo_passk_advantages(scores, uids, norm_by_std=norm), mask)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("seed", range(5))
def test_rloo(seed):
    scores, uids, mask, tr = batch(seed)
    want, _ = ca.compute_rloo_outcome_advantage(tr, mask, np.array(uids, dtype=object), config=cfg())
    got = alg.token_level(alg.rloo_advantages(scores, uids), mask)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("gamma", [1.0, 0.9])
def test_reinforce_plus_plus(seed, gamma):
    _, _, mask, tr = batch(seed)
    tr = tr + torch.rand(B, T, generator=torch.Generator().manual_seed(seed)) * mask * 0.1  # dense rewards
    want, want_returns = ca.compute_reinforce_plus_plus_outcome_advantage(tr, mask, config=cfg(gamma=gamma))
    got, returns = alg.reinforce_plus_plus_advantages(tr, mask, gamma)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(returns * mask, want_returns * mask, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("seed", range(5))
def test_reinforce_plus_plus_baseline(seed):
    scores, uids, mask, tr = batch(seed)
    want, _ = ca.compute_reinforce_plus_plus_baseline_outcome_advantage(
        tr, mask, np.array(uids, dtype=object), config=cfg()
    )
    got = alg.reinforce_plus_plus_baseline_advantages(scores, uids, mask)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("seed", range(5))
def test_remax(seed):
    scores, _, mask, tr = batch(seed)
    baselines = torch.rand(B, generator=torch.Generator().manual_seed(100 + seed))
    want, _ = ca.compute_remax_outcome_advantage(tr, baselines, mask, config=cfg())
    got = alg.remax_advantages(tr, baselines, mask)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("gamma,lam", [(1.0, 1.0), (0.99, 0.95)])
def test_gae(seed, gamma, lam):
    _, _, mask, tr = batch(seed)
    values = torch.randn(B, T, generator=torch.Generator().manual_seed(200 + seed))
    want, want_returns = ca.compute_gae_advantage_return(tr, values, mask, gamma, lam)
    got, returns = alg.gae_advantages(tr, values, mask, gamma, lam)
    torch.testing.assert_close(got, want * mask, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(returns * mask, want_returns * mask, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kind", ["kl", "abs", "mse", "low_var_kl"])
def test_kl_estimators(kind):
    g = torch.Generator().manual_seed(1)
    lp, ref = -torch.rand(B, T, generator=g) * 3, -torch.rand(B, T, generator=g) * 3
    lp[0, 0], ref[0, 0] = -40.0, -0.1  # past the clamps
    torch.testing.assert_close(
        alg.kl_estimate(lp, ref, kind), ca.kl_penalty(lp, ref, kind), rtol=1e-6, atol=1e-6
    )


@pytest.mark.parametrize(
    "mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]
)
@pytest.mark.parametrize("seed", range(3))
def test_aggregation_modes(mode, seed):
    _, _, mask, _ = batch(seed)
    mask[3] = 0  # an empty response
    values = torch.randn(B, T, generator=torch.Generator().manual_seed(seed))
    want = ca.agg_loss(values, mask, mode)
    torch.testing.assert_close(alg.aggregate(values, mask, mode, norm=T), want, rtol=1e-5, atol=1e-6)
    if mode in ("token-mean", "seq-mean-token-mean"):  # EasyR1's names for the same
        easy = {"token-mean": "token", "seq-mean-token-mean": "seq"}[mode]
        torch.testing.assert_close(alg.aggregate(values, mask, easy), want)


def actor_config(**kw):
    from verl.workers.config import ActorConfig

    base = {"clip_ratio_low": 0.2, "clip_ratio_high": 0.28}
    return ActorConfig(
        strategy="fsdp", rollout_n=4, ppo_mini_batch_size=4, ppo_micro_batch_size_per_gpu=2, **{**base, **kw}
    )


def policy_inputs(seed: int, scale: float = 0.3):
    g = torch.Generator().manual_seed(seed)
    _, _, mask, _ = batch(seed)
    old = -torch.rand(B, T, generator=g) * 2
    logp = (old + torch.randn(B, T, generator=g) * scale).requires_grad_()
    adv = torch.randn(B, generator=g)[:, None] * mask
    return logp, old, adv, mask


def grads(loss, logp):
    (g,) = torch.autograd.grad(loss, logp)
    return g


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
def test_default_loss_is_verls_vanilla_with_dual_clip(seed, mode):
    logp, old, adv, mask = policy_inputs(seed, scale=1.0)  # large moves: both clips and the dual clip act
    want, _ = ca.get_policy_loss_fn("vanilla")(old, logp, adv, mask, mode, actor_config(clip_ratio_c=3.0))
    mat, _ = alg.policy_loss("default", logp, old, adv, mask, alg.ClipConfig(0.2, 0.28, 3.0))
    got = alg.aggregate(mat, mask, mode)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(grads(got, logp), grads(want, logp), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("seed", range(4))
def test_cispo(seed):
    logp, old, adv, mask = policy_inputs(seed, scale=1.0)
    want, _ = ca.get_policy_loss_fn("cispo")(old, logp, adv, mask, "token-mean", actor_config())
    mat, _ = alg.policy_loss("cispo", logp, old, adv, mask, alg.ClipConfig(0.2, 0.28))
    got = alg.aggregate(mat, mask, "token-mean")
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(grads(got, logp), grads(want, logp), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("seed", range(4))
def test_sapo(seed):
    logp, old, adv, mask = policy_inputs(seed)
    config = actor_config(tau_pos=1.0, tau_neg=1.05)
    want, _ = ca.get_policy_loss_fn("sapo")(old, logp, adv, mask, "seq-mean-token-mean", config)
    mat, _ = alg.policy_loss("sapo", logp, old, adv, mask, alg.ClipConfig(0.2, 0.28), 1.0, 1.05)
    got = alg.aggregate(mat, mask, "seq-mean-token-mean")
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(grads(got, logp), grads(want, logp), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("seed", range(4))
def test_gspo_token_matches_verls_gspo_inside_the_clip_range(seed):
    """verl's `gspo` is EasyR1's `gspo_token` without dual clip: equal when no dual clip acts."""
    logp, old, adv, mask = policy_inputs(seed, scale=0.01)
    config = actor_config(clip_ratio_low=3e-4, clip_ratio_high=4e-4)
    want, _ = ca.get_policy_loss_fn("gspo")(old, logp, adv, mask, "seq-mean-token-mean", config)
    mat, _ = alg.policy_loss("gspo_token", logp, old, adv, mask, alg.ClipConfig(3e-4, 4e-4, 3.0))
    got = alg.aggregate(mat, mask, "seq-mean-token-mean")
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(grads(got, logp), grads(want, logp), rtol=1e-4, atol=1e-6)
    # `gspo`: the same value; the gradient flows through the sequence mean instead.
    seq_mat, _ = alg.policy_loss("gspo", logp, old, adv, mask, alg.ClipConfig(3e-4, 4e-4, 3.0))
    torch.testing.assert_close(
        alg.aggregate(seq_mat, mask, "seq-mean-token-mean"), want, rtol=1e-5, atol=1e-6
    )


def test_rloo_singletons_differ_on_purpose():
    scores, _, mask, tr = batch(1)
    uids = [f"solo{i}" for i in range(B)]
    want, _ = ca.compute_rloo_outcome_advantage(tr, mask, np.array(uids, dtype=object), config=cfg())
    assert torch.allclose(want.sum(-1) / mask.sum(-1), scores)  # verl's loop: A = r
    assert torch.equal(
        alg.rloo_advantages(scores, uids), torch.zeros(B)
    )  # r1cloud: 0, as verl's vectorised form


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
@pytest.mark.parametrize("seed", range(3))
def test_clipped_value_loss(mode, seed):
    _, _, mask, _ = batch(seed)
    mask[4] = 0  # an empty response
    g = torch.Generator().manual_seed(300 + seed)
    vpred, old, returns = (torch.randn(B, T, generator=g) for _ in range(3))
    want, want_clipfrac = ca.compute_value_loss(vpred, returns, old, mask, 0.5, mode)
    got, clipfrac = alg.value_loss(vpred, old, returns, mask, 0.5, mode)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(clipfrac, want_clipfrac, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kl", [0.0, 0.05, 0.1, 0.13, 5.0])
def test_adaptive_kl_controller(kl):
    ctl = ca.AdaptiveKLController(init_kl_coef=0.01, target_kl=0.1, horizon=1000)
    coef = 0.01
    for n in (16, 256, 7):
        ctl.update(kl, n)
        coef = alg.adaptive_kl_coef(coef, kl, 0.1, n, 1000)
        assert coef == pytest.approx(ctl.value, rel=1e-12)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_entropy_from_logits_chunked(temperature):
    import verl.utils.torch_functional as F

    from r1cloud.trainer.model import entropy_from_logits

    logits = torch.randn(37, 151, generator=torch.Generator().manual_seed(5)) * 4
    logits[0] = 0.0  # uniform: log V
    want = F.entropy_from_logits_with_chunking(logits / temperature, chunk_size=8)
    got = entropy_from_logits(logits, temperature, chunk=5)  # chunk boundaries differ from verl's
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    if temperature == 1.0:
        assert got[0].item() == pytest.approx(np.log(151), rel=1e-6)


def test_kl_in_the_reward_per_token_as_verl_applies_it():
    """With the KL in the reward, token rewards are score-on-the-last-token minus β·KL on every
    token (verl's apply_kl_penalty), so REINFORCE++ with γ < 1 discounts each token's penalty."""
    from types import SimpleNamespace

    scores, uids, mask, tr = batch(7)
    g = torch.Generator().manual_seed(8)
    old, ref = -torch.rand(B, T, generator=g), -torch.rand(B, T, generator=g)
    lengths = mask.sum(-1).long()
    kl = alg.kl_estimate(old, ref, "kl") * mask
    got_tr = alg.token_rewards(scores, mask, lengths, kl, 0.05)
    want_tr = tr - 0.05 * ca.kl_penalty(old, ref, "kl") * mask
    torch.testing.assert_close(got_tr, want_tr, rtol=1e-6, atol=1e-6)
    a = SimpleNamespace(adv_estimator="reinforce_plus_plus", gamma=0.9)
    got, _ = alg.advantages(a, alg.Outcomes(uids, scores, got_tr, mask))
    want, _ = ca.compute_reinforce_plus_plus_outcome_advantage(want_tr, mask, config=cfg(gamma=0.9))
    torch.testing.assert_close(got, want * mask, rtol=1e-5, atol=1e-5)
