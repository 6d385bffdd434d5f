"""FSDP's mixed precision for one CPU worker, without FSDP (which would have nothing to shard,
yet copy every parameter and gradient through its buffers and every op through DTensor).

The parameters keep their stored dtype (fp32 by default); inside a `window` (a forward pass with
its backward) each one's data is swapped for a copy in the compute dtype (`mp_param_dtype`), cast
again only after the weights change (`forget`). As FSDP does, the modules it would wrap get their
floating inputs in the compute dtype, and gradients are added up in `mp_reduce_dtype` as each
arrives: FSDP2's arithmetic at world 1 (tests/trainer/test_vision.py compares the two).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch.distributed.fsdp import FSDPModule
from torch.utils._pytree import tree_map


class MixedPrecision:
    def __init__(self, model: torch.nn.Module, dtype: torch.dtype, reduce_dtype: torch.dtype, units):
        self.dtype = dtype
        self.reduce_dtype = reduce_dtype
        self.params = list(model.parameters())
        self.copies = [torch.empty_like(p, dtype=dtype) for p in self.params]
        self.fresh = False  # True once the copies hold the current weights
        self.open = False  # inside a window: the parameters hold the copies
        self.grads: dict[torch.Tensor, torch.Tensor] = {}
        for p in self.params:
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(self._accumulate)
        for module in units:
            module.register_forward_pre_hook(self._cast_inputs, with_kwargs=True, prepend=True)

    def _accumulate(self, p: torch.Tensor) -> None:
        if not self.open:  # a backward pass outside a window: fp32 gradients, left as they are
            return
        g, p.grad = p.grad, None
        if p in self.grads:
            self.grads[p].add_(g)
        else:
            self.grads[p] = g.to(self.reduce_dtype)

    def _cast_inputs(self, module, args, kwargs):
        """FSDP's cast_forward_inputs (e.g. a Qwen-VL vision block's rotary embedding)."""
        if not self.open:
            return None

        def cast(x):
            return x.to(self.dtype) if isinstance(x, torch.Tensor) and x.is_floating_point() else x

        return tree_map(cast, args), tree_map(cast, kwargs)

    def current(self) -> list[torch.Tensor]:
        """The copies, cast anew if the weights changed since."""
        if not self.fresh:
            if self.open:  # the parameters hold the copies themselves
                raise RuntimeError("precision: weights changed inside a window")
            with torch.no_grad():
                torch._foreach_copy_(self.copies, [p.detach() for p in self.params])
            self.fresh = True
        return self.copies

    @contextlib.contextmanager
    def window(self):
        if self.open:
            raise RuntimeError("precision.window: already open")
        stored = [p.data for p in self.params]
        for p, c in zip(self.params, self.current(), strict=True):
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


def attach(model: torch.nn.Module, dtype: torch.dtype, reduce_dtype: torch.dtype, units) -> None:
    """`units`: the modules FSDP would wrap (their inputs are cast)."""
    model.r1cloud_compute = MixedPrecision(model, dtype, reduce_dtype, units)


def window(model: torch.nn.Module):
    """Where `model` computes in its compute dtype (a no-op for a model FSDP casts, or one that
    computes in the dtype it stores)."""
    compute = getattr(model, "r1cloud_compute", None)
    return compute.window() if compute is not None else contextlib.nullcontext()


def named_weights(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """The parameters by name, in the compute dtype (the copies: nothing swapped)."""
    compute = getattr(model, "r1cloud_compute", None)
    named = model.named_parameters()
    if compute is None:
        yield from named
    else:
        yield from zip((n for n, _ in named), compute.current(), strict=True)


def forget(model: torch.nn.Module) -> None:
    """After the weights change (an optimizer step, a loaded checkpoint): no copy of the old weights
    may be used again, neither the compute dtype's here nor FSDP's gathered parameters (kept after
    full_weights on CPU; a no-op after a backward pass, which reshards)."""
    if (compute := getattr(model, "r1cloud_compute", None)) is not None:
        compute.fresh = False
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()
