"""The worker's weight sync: the actor's full tensors, one FSDP group at a time, into its rollout
engine (or only the LoRA adapters, where the engine holds the base), or for asynchronous training
from train rank 0 to the rollout workers (trainer/broadcast.py). Methods of HybridWorker."""

from __future__ import annotations

from collections.abc import Iterator

import torch

from r1cloud.core.dtypes import torch_dtype
from r1cloud.trainer import broadcast, lora, precision


class WeightSync:
    def full_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The actor's full tensors, one FSDP group (a layer, then the rest) at a time; a
        collective: every worker iterates together.

        Each group comes in one all-gather, in the compute dtype (`mp_param_dtype`) when the engine
        holds that dtype or the compute dtype is fp32: what the engine stores is then exactly the
        fp32 weights cast to its dtype, and the gather moves half the bytes in bf16. Otherwise (an
        engine wider than the compute dtype) each tensor is gathered in full precision."""
        from torch.distributed.fsdp import FSDPModule

        fsdp = self.spec.worker.actor.fsdp
        compute, engine = torch_dtype(fsdp.mp_param_dtype), torch_dtype(self.spec.worker.rollout.dtype)
        if compute not in (torch.float32, engine) and not self.spec.worker.actor.model.lora.load_in_4bit:
            for name, tensor in self.actor.state_dict().items():
                full = tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor
                yield name, full.detach()
            return
        groups = {n: m for n, m in self.actor.named_modules() if isinstance(m, FSDPModule)}
        if not groups:  # one worker without FSDP: the parameters themselves, in the compute dtype
            with torch.no_grad():
                for name, p in precision.named_weights(self.actor):
                    yield name, lora.dense(p)
            return
        names: dict[str, list[str]] = {prefix: [] for prefix in groups}  # each group's parameters
        for name, _ in self.actor.named_parameters():
            owner = name.rpartition(".")[0]
            while owner not in groups:  # the nearest enclosing FSDP module (the root is "")
                owner = owner.rpartition(".")[0]
            names[owner].append(name)
        with torch.no_grad():
            for prefix, module in groups.items():
                if not names[prefix]:
                    continue
                module.unshard()
                try:
                    for name in names[prefix]:  # a 4-bit base weight dequantised (QLoRA)
                        yield name, lora.dense(self.actor.get_parameter(name))
                finally:
                    if self.cuda:  # on CPU they stay: the next forward pass needs these same values
                        module.reshard()

    def join_weights(self, size: int) -> None:
        """Train rank 0: join the weights group of `size` members as its rank 0 (the others: no-op)."""
        self.weights_group = broadcast.group(self.master, 0, size) if self.rank == 0 else None

    def push_weights(self) -> None:
        """The actor's weights to the rollout workers, merged with LoRA's adapters: every rank
        gathers (a collective), rank 0 sends."""
        with self.offloads["actor"].resident():
            weights = self.full_weights()
            weights = lora.merged(weights, self.actor) if self.lora else weights
            if self.rank == 0:
                broadcast.send(self.weights_group, weights)
            else:
                for _ in weights:
                    pass

    def sync_weights(self) -> None:
        with self.offloads["actor"].resident():
            if self.adapter_sync:  # the engine holds the base: only the adapters move
                self.engine.load_adapter(lora.adapter_tensors(self.actor), self.adapter()["config"])
                return
            weights = self.full_weights()
            self.engine.load_weights(lora.merged(weights, self.actor) if self.lora else weights)
