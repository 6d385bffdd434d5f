"""GAE's critic on the worker: values at the response tokens, and its update (a value loss, one
optimizer step per mini-batch, as the actor's). Methods of HybridWorker."""

from __future__ import annotations

import torch

from r1cloud.trainer import algorithms as alg
from r1cloud.trainer import precision
from r1cloud.trainer.actor_update import after_update, step, sync_gradients
from r1cloud.trainer.batch import Batch, forward_rows
from r1cloud.trainer.model import packed_values, pad, resharded


class Critic:
    @torch.no_grad()
    def values(self, batch: Batch, micro_batches: list[list[int]]) -> torch.Tensor:
        """The critic's values at the response tokens, as `log_probs`."""
        self.critic.eval()
        with (
            self.offloads["critic"].resident(),
            precision.window(self.critic),
            resharded(self.critic, self.cuda),
        ):
            return forward_rows(
                batch,
                micro_batches,
                lambda seqs: packed_values(self.critic, seqs, self.device, self.sp["critic"]),
            )

    def update_critic(self, batch: Batch, minibatches: list[dict]) -> list[dict]:
        with self.offloads["critic"].resident(optimizer=True):
            return self._update_critic(batch, minibatches)

    def _update_critic(self, batch: Batch, minibatches: list[dict]) -> list[dict]:
        """One optimizer step per mini-batch, as `update`, on the shard's values and returns."""
        c = self.spec.worker.critic
        self.critic.train()
        results = []
        for mb in minibatches:
            stats = {"vf_loss": 0.0, "vf_clipfrac": 0.0, "vpred": 0.0, "tokens": 0.0}
            with precision.window(self.critic):
                for i, rows in enumerate(mb["micro"]):
                    sync_gradients(self.critic, self.cuda, last=i == len(mb["micro"]) - 1)
                    micro = batch.select(rows)
                    seqs, micro = micro.seqs(), micro.to(self.device)
                    mask = micro.mask
                    vpred = pad(
                        packed_values(self.critic, seqs, self.device, self.sp["critic"]),
                        width=mask.shape[1],
                    )[0]
                    loss, clipfrac = alg.value_loss(
                        vpred, micro.values, micro.returns, mask, c.cliprange_value, c.loss_avg_mode, mb["total"],
                        self.spec.data.max_response_length,
                    )  # fmt: skip
                    (loss * self.world).backward()
                    n = float(mask.sum())
                    stats["vf_loss"] += loss.item()
                    stats["vf_clipfrac"] += float(clipfrac) * n
                    stats["vpred"] += float((vpred.detach() * mask).sum())
                    stats["tokens"] += n
            stats["grad_norm"] = step(self.critic, self.critic_optim, c.max_grad_norm)
            results.append(stats)
        return after_update(self.schedulers.get("critic"), self.critic_optim, results)
