"""The actor's side of the worker: log-probs under the actor or the reference model, and the policy
update (one optimizer step per mini-batch, the loss aggregated over the global mini-batch).
Methods of HybridWorker; the helpers below serve the critic's update too."""

from __future__ import annotations

import contextlib
import math
from functools import partial

import torch

from r1cloud.trainer import algorithms as alg
from r1cloud.trainer import lora, precision
from r1cloud.trainer.batch import Batch, forward_rows
from r1cloud.trainer.metrics import engine_gap
from r1cloud.trainer.model import packed_log_probs, pad, resharded

# what `update` sums over its micro-batches (besides is_weight; on-policy, engine_gap's)
UPDATE_STATS = ("pg_loss", "kl_loss", "entropy_loss", "tokens", "clip_hi", "clip_lo", "ppo_kl", "entropy")


class ActorUpdate:
    @torch.no_grad()
    def log_probs(
        self,
        batch: Batch,
        micro_batches: list[list[int]],
        role: str = "actor",
        temperature: float | None = None,
    ) -> torch.Tensor:
        """The response tokens' log-probs under the actor (or the reference), fp32, the shard's rows
        end to end, computed micro-batch by micro-batch (rows of the shard)."""
        base = role == "ref" and self.lora  # LoRA's reference: the actor's base weights
        model = self.actor if role == "actor" or base else self.ref
        t = self._temperature if temperature is None else temperature

        def forward(seqs):
            return packed_log_probs(model, seqs, t, self.device, sp=self.sp["actor"])

        with lora.disabled(model) if base else contextlib.nullcontext():
            return forward_only(
                self, "actor" if model is self.actor else "ref", batch, micro_batches, forward
            )

    def update(self, batch: Batch, minibatches: list[dict], apply: bool = True) -> list[dict]:
        """The policy update on the shard `batch` (`optimizer_steps`)."""
        actor_cfg, a = self.spec.worker.actor, self.spec.algorithm
        clip = alg.ClipConfig(actor_cfg.clip_ratio_low, actor_cfg.clip_ratio_high, actor_cfg.clip_ratio_dual)
        taus = (actor_cfg.tau_positive, actor_cfg.tau_negative)
        mode = actor_cfg.loss_avg_mode
        norm = self.spec.data.max_response_length  # seq-mean-token-sum-norm's constant length
        t, sp, entropy_grad = self._temperature, self.sp["actor"], actor_cfg.entropy_coeff > 0

        def micro_loss(seqs, micro: Batch, total: float, stats: dict) -> torch.Tensor:
            logps, entropies = packed_log_probs(
                self.actor, seqs, t, self.device, entropy=True, entropy_grad=entropy_grad, sp=sp
            )
            logp, mask = pad(logps, width=micro.response_ids.shape[1])[0], micro.mask
            agg = partial(alg.aggregate, mask=mask, mode=mode, total=total, norm=norm)
            entropy = pad(entropies, width=mask.shape[1])[0]
            old = logp.detach() if micro.old_logp is None else micro.old_logp
            if micro.old_logp is None and micro.rollout_logp is not None:  # on-policy
                engine_gap(stats, old, micro.rollout_logp, mask)
            adv = micro.advantages * mask
            loss_mat, m = alg.policy_loss(actor_cfg.loss_type, logp, old, adv, mask, clip, *taus)
            if actor_cfg.rollout_is:  # the rollout engine's log-probs differ from the trainer's
                weights = alg.rollout_is_weights(
                    old, micro.rollout_logp, mask, actor_cfg.rollout_is, actor_cfg.rollout_is_cap
                )
                loss_mat = loss_mat * weights
                stats["is_weight"] += float((weights * mask).sum())
            pg, ent = agg(loss_mat), agg(entropy)
            loss = pg - actor_cfg.entropy_coeff * ent if actor_cfg.entropy_coeff else pg
            if a.use_kl_loss and not a.disable_kl:
                kl = agg(alg.kl_estimate(logp, micro.ref_logp, a.kl_penalty))
                loss = loss + a.kl_coef * kl
                stats["kl_loss"] += kl.item()
            n = mask.sum().item()
            stats["pg_loss"] += pg.item()
            stats["entropy_loss"] += agg(-logp.detach()).item()
            stats["entropy"] += ent.item()
            stats["tokens"] += n
            stats["clip_hi"] += float(m.get("pg_clipfrac_higher", 0.0)) * n
            stats["clip_lo"] += float(m.get("pg_clipfrac_lower", 0.0)) * n
            stats["ppo_kl"] += m["ppo_kl"].item() * n
            return loss

        keys = (*UPDATE_STATS, "is_weight")
        return optimizer_steps(self, "actor", batch, minibatches, keys, micro_loss, apply)

    def full_grads(self) -> dict[str, torch.Tensor]:
        """Full gradients (a collective), for tests against a single process."""
        out = {}
        for name, p in self.actor.named_parameters():
            if (g := p.grad) is not None:  # frozen weights (LoRA's base, a frozen tower) have none
                out[name] = (g.full_tensor() if hasattr(g, "full_tensor") else g).detach().clone()
        self.optim.zero_grad(set_to_none=True)
        return out


def forward_only(worker, role: str, batch: Batch, micro_batches: list[list[int]], forward) -> torch.Tensor:
    """`forward(seqs)` over the micro-batches (forward_rows) with `role`'s model (actor, ref or
    critic) on the device, in eval mode and its compute dtype, its root resharded after."""
    model = worker.offloads[role].model
    model.eval()
    with worker.offloads[role].resident(), precision.window(model), resharded(model, worker.cuda):
        return forward_rows(batch, micro_batches, forward)


def optimizer_steps(
    worker, role: str, batch: Batch, minibatches: list[dict], keys: tuple, micro_loss, apply: bool = True
) -> list[dict]:
    """One optimizer step of `role` (actor or critic) per mini-batch of the shard `batch`. Each
    mini-batch: {"micro": [rows of the shard, per micro-batch], "total": global token (or sequence)
    count of the whole mini-batch on all workers}. `micro_loss(seqs, micro, total, stats)`: a
    micro-batch's loss, its statistics added to the mini-batch's `stats` (`keys` from 0). With
    `apply=False` the gradients of the first mini-batch are left in place (tests compare them)."""
    model, optim = worker._role(role)
    with worker.offloads[role].resident(optimizer=True):
        model.train()
        results = []
        for mb in minibatches:
            stats = dict.fromkeys(keys, 0.0)
            with precision.window(model):  # one worker computing in bf16 without FSDP
                for i, rows in enumerate(mb["micro"]):
                    sync_gradients(model, worker.cuda, last=i == len(mb["micro"]) - 1)
                    micro = batch.select(rows)
                    seqs, micro = micro.seqs(), micro.to(worker.device)
                    # FSDP averages gradients over workers; each worker's loss is its share of the global mean
                    (micro_loss(seqs, micro, mb["total"], stats) * worker.world).backward()
            if not apply:
                return results
            stats["grad_norm"] = step(model, optim, getattr(worker.spec.worker, role).max_grad_norm)
            results.append(stats)
        lr = optim.param_groups[0]["lr"]  # the learning rate each step used, then the schedule's step
        if (scheduler := worker.schedulers.get(role)) is not None:
            scheduler.step()
        for r in results:
            r["lr"] = lr
        return results


def sync_gradients(model, cuda: bool, last: bool) -> None:
    """On CPU, gradients are reduced across workers once per mini-batch, after its last
    micro-batch, instead of after every one, and the parameters stay gathered until then: a
    gloo reduce-scatter or all-gather of the whole model costs far more there than holding
    unsharded tensors in host memory. On GPUs, where memory is the scarce part, every
    micro-batch reduces and reshards (FSDP's default)."""
    if not cuda and hasattr(model, "set_requires_gradient_sync"):  # FSDP's (not one plain worker)
        model.set_requires_gradient_sync(last)
        model.set_reshard_after_backward(last)


def step(model, optim, max_norm: float) -> float:
    """Clip, step (skipped when the gradient is not finite), zero; returns the gradient norm."""
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    grad_norm = float(grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm)
    if math.isfinite(grad_norm):
        optim.step()
        precision.forget(model)
    optim.zero_grad(set_to_none=True)
    return grad_norm
