"""AdamW with its moment estimates in bfloat16 (`optim.strategy: adamw_bf16`): half of AdamW's
state memory, the update itself computed in fp32.

Written here because torch's AdamW keeps its states in the parameters' dtype (fp32 for an fp32
master copy), and the maintained alternatives are something else: torchao's and bitsandbytes'
low-bit optimizers quantise to 8 or 4 bits with block scales, and neither takes FSDP2's DTensor
shards on CPU. EasyR1 ships its own for the same reason (AnyPrecisionAdamW)."""

from __future__ import annotations

import torch


class AdamWBF16(torch.optim.Optimizer):
    def __init__(self, params, lr: float, betas=(0.9, 0.999), weight_decay: float = 0.0, eps: float = 1e-8):
        super().__init__(params, {"lr": lr, "betas": tuple(betas), "weight_decay": weight_decay, "eps": eps})

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
                g = p.grad.float()
                m = state["exp_avg"].float().mul_(b1).add_(g, alpha=1 - b1)
                v = state["exp_avg_sq"].float().mul_(b2).addcmul_(g, g, value=1 - b2)
                state["exp_avg"].copy_(m)
                state["exp_avg_sq"].copy_(v)
                p.mul_(1 - lr * group["weight_decay"])  # decoupled weight decay, as torch's AdamW
                denom = (v / (1 - b2**t)).sqrt_().add_(eps)
                p.add_((m / (1 - b1**t) / denom).to(p.dtype), alpha=-lr)
        return loss
