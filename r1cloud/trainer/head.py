"""The LM head's log-probs and entropies without the full-vocabulary logits kept for backward.

The plain way (`lm_head`, then log-softmax and entropy over the logits) keeps several
(tokens × vocabulary) fp32 tensors alive for the backward pass, which dwarf the model's
activations (and on CPU each is a fresh allocation the kernel zeroes page by page).
`head_log_probs` keeps the logits once, in the compute dtype (widened to fp32 a chunk of rows at a
time, as `lm_head` then `.float()`), keeps one number per token (the entropy), and in the backward
pass writes the gradient over the logits chunk by chunk from its closed form:

    z = h·Wᵀ / T,  p = softmax(z),  log p_y = z_y − lse(z),  H = −Σ p·log p
    ∂log p_y/∂z = onehot(y) − p,    ∂H/∂z = −p ⊙ (log p + H)
"""

from __future__ import annotations

import torch

from r1cloud.rollout.onednn import mm_nt

# One chunk's fp32 logits: on CPU small enough to reuse the same memory each time; on a GPU, where
# the softmax kernels run one row per thread block, enough rows to fill it (benchmarks/RESULTS.md `gpu`)
CHUNK_BYTES = {"cpu": 8 << 20}
GPU_CHUNK_BYTES = 512 << 20


def _rows(vocab: int, device: torch.device) -> int:
    return max(16, CHUNK_BYTES.get(device.type, GPU_CHUNK_BYTES) // (4 * vocab))


def scaled(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """logits / T in fp32 (T = 0, greedy, and T = 1 leave them as they are)."""
    z = logits.float()
    return z / temperature if temperature not in (0, 1.0) else z


def _z(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """logits / T, left in their dtype where T changes nothing (the fused kernels below widen)."""
    return logits if temperature in (0, 1.0) else logits.float() / temperature


def _log_softmax(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """log softmax(logits / T) in fp32: torch's fused kernel, one pass over each row (in cache)."""
    return torch.log_softmax(_z(logits, temperature), -1, dtype=torch.float32)


class _HeadLogProbs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, targets, temperature: float, entropy_grad: bool):
        n = hidden.shape[0]
        logits = mm_nt(hidden, weight)
        logp, entropy = hidden.new_empty(n, dtype=torch.float32), hidden.new_empty(n, dtype=torch.float32)
        step = _rows(weight.shape[0], hidden.device)
        for s in range(0, n, step):
            rows = slice(s, s + step)
            lp = _log_softmax(logits[rows], temperature)
            logp[rows] = lp.gather(-1, targets[rows, None])[:, 0]
            entropy[rows] = -torch.linalg.vecdot(lp.exp(), lp)  # −Σ p·log p
        ctx.save_for_backward(hidden, weight, logits, targets, entropy)
        ctx.temperature, ctx.entropy_grad = temperature, entropy_grad
        if not entropy_grad:
            ctx.mark_non_differentiable(entropy)
        return logp, entropy

    @staticmethod
    def backward(ctx, g_logp, g_entropy):
        hidden, weight, logits, targets, entropy = ctx.saved_tensors
        n, t = hidden.shape[0], ctx.temperature
        # each chunk's gradient overwrites its logits once read: no second (tokens × vocabulary)
        # tensor, whose fresh pages the kernel would fault in one by one (a second backward, as
        # retain_graph would run, is refused by autograd: a saved tensor was modified)
        grad_z = logits  # in the compute dtype, as autograd's would be
        step = _rows(weight.shape[0], hidden.device)
        for s in range(0, n, step):
            rows = slice(s, s + step)
            g = g_logp[rows, None]
            if ctx.entropy_grad:  # z − Σ p·z = log p + H
                lp = _log_softmax(logits[rows], t)
                g = g + g_entropy[rows, None] * (lp + entropy[rows, None])
                p = lp.exp_()
            else:
                p = torch.softmax(_z(logits[rows], t), -1, dtype=torch.float32)
            gz = p.mul_(-g)  # −p·g
            gz.scatter_add_(-1, targets[rows, None], g_logp[rows, None])
            if t not in (0, 1.0):
                gz /= t
            grad_z[rows] = gz
        grad_hidden = mm_nt(grad_z, weight.t()) if ctx.needs_input_grad[0] else None
        # torch's matmul reads the transposed gradient in place, where oneDNN's op would copy all of it first
        grad_weight = grad_z.t() @ hidden if ctx.needs_input_grad[1] else None
        return grad_hidden, grad_weight, None, None, None


def head_log_probs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    temperature: float = 1.0,
    entropy_grad: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(log softmax(h·Wᵀ/T)[target], entropy of softmax(h·Wᵀ/T)) per row of `hidden`, in fp32.
    The entropy carries a gradient only with `entropy_grad`."""
    return _HeadLogProbs.apply(hidden, weight, targets, temperature, entropy_grad)
