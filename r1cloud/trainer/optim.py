"""The optimizer and its learning-rate schedule (`lr_factor`, EasyR1's).

AdamW with its moment estimates in bfloat16 (`optim.strategy: adamw_bf16`): half of AdamW's
state memory, the update itself computed in fp32. The moments are written back with stochastic
rounding: rounded to nearest, a second moment that moves by less than half a bf16 step per update
(with beta2 = 0.999 it moves by 0.1%, the step is 0.4-0.8%) could never shrink and would ratchet
up on every gradient spike; rounded stochastically it follows fp32 AdamW's on average.

Written here because torch's AdamW keeps its states in the parameters' dtype, and torchao's and
bitsandbytes' low-bit optimizers quantise to 8 or 4 bits with block scales and take no FSDP2
DTensor shards on CPU (EasyR1 ships its own, AnyPrecisionAdamW, for the same reason). With a
16-bit master copy (`fsdp.torch_dtype: bf16`) small updates are still lost in the weights
themselves: keep the trained weights in fp32."""

from __future__ import annotations

import math

import torch


def _local(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's shard on this worker (the same storage), or the tensor itself."""
    return t.to_local() if hasattr(t, "to_local") else t


def stochastic_bf16(x: torch.Tensor, out: torch.Tensor, generator: torch.Generator | None = None) -> None:
    """fp32 `x` into bf16 `out`, rounded up or down with probability by the distance (fp32's low
    16 bits plus uniform noise, then cut: the standard trick, exact for either sign)."""
    bits = x.contiguous().view(torch.int32)
    noise = torch.randint(0, 1 << 16, bits.shape, dtype=torch.int32, device=x.device, generator=generator)
    out.copy_(((bits + noise) & -65536).view(torch.float32))  # the low half is zero: copy_ is exact


class AdamWBF16(torch.optim.Optimizer):
    def __init__(self, params, lr: float, betas=(0.9, 0.999), weight_decay: float = 0.0, eps: float = 1e-8):
        super().__init__(params, {"lr": lr, "betas": tuple(betas), "weight_decay": weight_decay, "eps": eps})
        self.generator = torch.Generator().manual_seed(0)  # the same rounding on every run

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            (b1, b2), lr, eps = group["betas"], group["lr"], group["eps"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["step"] = torch.tensor(0.0)
                    state["exp_avg"] = torch.zeros_like(p, dtype=torch.bfloat16)
                    state["exp_avg_sq"] = torch.zeros_like(p, dtype=torch.bfloat16)
                state["step"] += 1
                t = float(state["step"])
                g = _local(p.grad).float()
                m = _local(state["exp_avg"]).float().mul_(b1).add_(g, alpha=1 - b1)
                v = _local(state["exp_avg_sq"]).float().mul_(b2).addcmul_(g, g, value=1 - b2)
                gen = self.generator if g.device.type == "cpu" else None
                stochastic_bf16(m, _local(state["exp_avg"]), gen)
                stochastic_bf16(v, _local(state["exp_avg_sq"]), gen)
                w = _local(p)
                w.mul_(1 - lr * group["weight_decay"])  # decoupled weight decay, as torch's AdamW
                denom = (v / (1 - b2**t)).sqrt_().add_(eps)
                w.add_((m / (1 - b1**t) / denom).to(w.dtype), alpha=-lr)
        return loss


def lr_factor(o, total_steps: int):
    """EasyR1's schedule (verl/utils/torch_functional.py, get_constant_ and get_cosine_schedule_
    with_warmup), by update: k / warmup for the k-th update in the warm-up (the first at 0, as
    there), then constant or cosine down to `min_lr_ratio`."""
    warmup = o.lr_warmup_steps if o.lr_warmup_steps is not None else int(o.lr_warmup_ratio * total_steps)
    floor = o.min_lr_ratio or 0.0

    def factor(step: int) -> float:
        if step < warmup:
            return step / warmup
        if o.lr_scheduler_type == "cosine":
            progress = (step - warmup) / max(total_steps - warmup, 1)
            return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))
        return 1.0

    return factor
