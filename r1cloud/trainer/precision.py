"""FSDP's mixed precision for one CPU worker, without FSDP.

A lone worker has nothing to shard, yet FSDP2 would still copy every parameter into its flat
all-gather buffers, route each clip and optimizer op through DTensor, and copy every gradient
through its reduce-scatter. Here the parameters keep their stored dtype (what the optimizer steps,
checkpoints save and a resume reads: fp32 by default), and inside a `window` (a forward pass with
its backward) each parameter's data is swapped for a copy in the compute dtype (`mp_param_dtype`),
cast again only after the weights change. Gradients arrive in the compute dtype and are added up in
the reduce dtype (`mp_reduce_dtype`) as each is accumulated, as FSDP's reduce would: the same
arithmetic as FSDP2 at world 1.
"""

from __future__ import annotations

import contextlib

import torch


class Compute:
    def __init__(self, model: torch.nn.Module, dtype: torch.dtype, reduce_dtype: torch.dtype):
        self.params = list(model.parameters())
        self.copies = [torch.empty_like(p, dtype=dtype, requires_grad=False) for p in self.params]
        self.reduce_dtype, self.fresh, self.open = reduce_dtype, False, False
        self.grads: dict[torch.Tensor, torch.Tensor] = {}
        for p in self.params:
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(self._keep)

    def _keep(self, p: torch.Tensor) -> None:
        g, p.grad = p.grad, None
        if p in self.grads:
            self.grads[p].add_(g)
        else:
            self.grads[p] = g.to(self.reduce_dtype)

    @contextlib.contextmanager
    def window(self):
        if self.open:  # nested (a forward inside a rollout's window): already in the compute dtype
            yield
            return
        with torch.no_grad():
            if not self.fresh:
                torch._foreach_copy_(self.copies, [p.detach() for p in self.params])
                self.fresh = True
            stored = [p.data for p in self.params]
            for p, c in zip(self.params, self.copies, strict=True):
                p.data = c
        self.open = True
        try:
            yield
        finally:
            self.open = False
            for p, s in zip(self.params, stored, strict=True):
                p.data = s
            for p, g in self.grads.items():  # to the parameter's own dtype, onto what it holds
                g = g.to(p.dtype)
                p.grad = g if p.grad is None else p.grad.add_(g)
            self.grads.clear()


def attach(model: torch.nn.Module, dtype: torch.dtype, reduce_dtype: torch.dtype) -> None:
    model.r1cloud_compute = Compute(model, dtype, reduce_dtype)


def window(model: torch.nn.Module):
    """Where `model` computes in its compute dtype (a no-op for a model FSDP casts, or one that
    computes in the dtype it stores)."""
    compute = getattr(model, "r1cloud_compute", None)
    return compute.window() if compute is not None else contextlib.nullcontext()


def forget(model: torch.nn.Module) -> None:
    """After the weights change (an optimizer step, a loaded checkpoint): no copy made from the old
    ones, FSDP's gathered parameters or the compute dtype's, may be used again."""
    from torch.distributed.fsdp import FSDPModule

    if (compute := getattr(model, "r1cloud_compute", None)) is not None:
        compute.fresh = False
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()
