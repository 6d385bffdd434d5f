"""GAE's critic on the worker: values at the response tokens, and its update (a value loss, one
optimizer step per mini-batch, as the actor's). Methods of HybridWorker."""

from __future__ import annotations

import torch

from r1cloud.trainer import algorithms as alg
from r1cloud.trainer.actor_update import forward_only, optimizer_steps
from r1cloud.trainer.batch import Batch
from r1cloud.trainer.model import packed_values, pad


class Critic:
    @torch.no_grad()
    def values(self, batch: Batch, micro_batches: list[list[int]]) -> torch.Tensor:
        """The critic's values at the response tokens, as `log_probs`."""

        def forward(seqs):
            return packed_values(self.critic, seqs, self.device, self.sp["critic"])

        return forward_only(self, "critic", batch, micro_batches, forward)

    def update_critic(self, batch: Batch, minibatches: list[dict]) -> list[dict]:
        """The value update on the shard `batch` (`optimizer_steps`, as the actor's)."""
        c, sp = self.spec.worker.critic, self.sp["critic"]

        def micro_loss(seqs, micro: Batch, total: float, stats: dict) -> torch.Tensor:
            mask = micro.mask
            vpred = pad(packed_values(self.critic, seqs, self.device, sp), width=mask.shape[1])[0]
            loss, clipfrac = alg.value_loss(
                vpred, micro.values, micro.returns, mask, c.cliprange_value, c.loss_avg_mode, total,
                self.spec.data.max_response_length,
            )  # fmt: skip
            n = float(mask.sum())
            stats["vf_loss"] += loss.item()
            stats["vf_clipfrac"] += float(clipfrac) * n
            stats["vpred"] += float((vpred.detach() * mask).sum())
            stats["tokens"] += n
            return loss

        keys = ("vf_loss", "vf_clipfrac", "vpred", "tokens")
        return optimizer_steps(self, "critic", batch, minibatches, keys, micro_loss)
