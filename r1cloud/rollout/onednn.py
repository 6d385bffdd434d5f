"""fp32 matmuls through oneDNN on CPU.

torch sends a CPU fp32 matmul to MKL, which on AMD processors runs its AVX2 kernels, where
oneDNN (which torch also carries, and uses for bf16) runs AVX-512 on the same shapes, to fp32
accuracy (docs/trainer.md, "CPU specifics", has the figures). In an fp32 update the linear layers
are most of the time, so the workers route them here when they compute in fp32 on CPU (`use_in`),
and head.py's forward and input-gradient matmuls always come here. A weight gradient
(gradientᵀ · input) reaches oneDNN's op as two transposed views that it copies first; for the
linear layers that copy is small and oneDNN still wins, for the LM head's 49k-wide gradient it is
not (head.py uses torch's matmul there).

The op is `torch.ops.mkldnn._linear_pointwise`, the one torch's own compiler emits for CPU
linear layers. It is private, so `available()` checks it once against torch's matmul and
everything falls back to torch's matmul when it is missing or disagrees.
"""

from __future__ import annotations

import functools
import types

import torch


@functools.cache
def available() -> bool:
    try:
        op = torch.ops.mkldnn._linear_pointwise
        a, b = torch.arange(35.0).view(5, 7).sin(), torch.arange(21.0).view(3, 7).cos()  # no RNG use
        return bool(torch.allclose(op(a, b, None, "none", [], ""), a @ b.T, rtol=1e-5, atol=1e-5))
    except (AttributeError, RuntimeError):
        return False


def mm_nt(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b.T for 2-D tensors; through oneDNN for fp32 on CPU. Either may be a transposed view."""
    # (oneDNN has no product over an empty inner dimension: a Ulysses slice without response tokens)
    if a.dtype == torch.float32 and b.dtype == torch.float32 and not a.is_cuda and a.shape[1] and available():
        return torch.ops.mkldnn._linear_pointwise(a, b, None, "none", [], "")
    return a @ b.T


class _Linear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias):
        ctx.save_for_backward(x, weight)
        ctx.bias = bias is not None
        y = mm_nt(x.reshape(-1, x.shape[-1]), weight)
        if bias is not None:
            y += bias
        return y.view(*x.shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        g = grad.reshape(-1, grad.shape[-1])
        gx = mm_nt(g, weight.t()).view(x.shape) if ctx.needs_input_grad[0] else None
        gw = mm_nt(g.t(), x.reshape(-1, x.shape[-1]).t()) if ctx.needs_input_grad[1] else None
        gb = g.sum(0) if ctx.bias and ctx.needs_input_grad[2] else None
        return gx, gw, gb


def _forward(self, x: torch.Tensor) -> torch.Tensor:
    return _Linear.apply(x, self.weight, self.bias)


def use_in(model: torch.nn.Module) -> bool:
    """Every `nn.Linear` of `model` computes through oneDNN (its weights are read at each call, so
    FSDP's gathered ones are used). Returns whether it did (the op is available)."""
    if not available():
        return False
    for module in model.modules():
        if type(module) is torch.nn.Linear:
            module.forward = types.MethodType(_forward, module)
    return True
