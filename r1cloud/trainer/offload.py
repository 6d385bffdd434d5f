"""Keeping the device's memory free, with EasyR1's two kinds of offload.

- `fsdp.enable_cpu_offload`: FSDP2's CPUOffloadPolicy: shards, gradients and the optimizer step in
  host memory, each layer's shard copied to the device for its all-gather (smallest, slowest).
- `offload.offload_params` / `offload.offload_optimizer`: the shards (and AdamW's moments) on the
  device while a phase uses them, in host memory between phases, as EasyR1 does.

On a CPU run the device is host memory: the policy still runs its code (tests compare its numbers
with a run without it) and the moves between phases have nowhere to go."""

from __future__ import annotations

import contextlib

import torch

from r1cloud.trainer import precision


def policy(fsdp_cfg, cuda: bool) -> dict:
    """fully_shard's keyword for a role's `fsdp.enable_cpu_offload` (pinned host memory on CUDA)."""
    from torch.distributed.fsdp import CPUOffloadPolicy

    return {"offload_policy": CPUOffloadPolicy(pin_memory=cuda)} if fsdp_cfg.enable_cpu_offload else {}


def note(spec, cuda: bool) -> str | None:
    """The run's one line on offload when a blueprint asks for it, or None."""
    w, a = spec.worker, spec.algorithm
    roles = {"actor": w.actor}  # and the models this run has (LoRA's reference is the actor)
    if not a.disable_kl and not w.actor.model.lora.rank:
        roles["ref"] = w.ref
    if a.estimator.critic:
        roles["critic"] = w.critic
    between = [
        f"worker.{name}.offload.{key}"
        for name, role in roles.items()
        for key in ("offload_params", "offload_optimizer")
        if getattr(role.offload, key)
    ]
    fsdp = [
        f"worker.{name}.fsdp.enable_cpu_offload"
        for name, role in roles.items()
        if role.fsdp.enable_cpu_offload
    ]
    if cuda:
        said = [", ".join(fsdp + between)] if fsdp or between else []
    else:
        said = ["FSDP's CPU offload runs, but on a CPU run host memory is the device"] if fsdp else []
        said += [f"{', '.join(between)}: nothing to move on a CPU run"] if between else []
    return "[offload] " + "; ".join(said) if said else None


class Offload:
    """What one role (a model and its optimizer) keeps off the device between phases."""

    def __init__(self, model, optim, cfg, fsdp_cfg, device: str):
        on_gpu = device != "cpu" and not fsdp_cfg.enable_cpu_offload  # the policy already keeps it home
        self.model, self.optim, self.device = model, optim, device
        self.params = on_gpu and cfg.offload_params
        self.optimizer = on_gpu and cfg.offload_optimizer and optim is not None

    def away(self) -> None:
        """Move what the config says off the device (after start-up and after each phase)."""
        if self.params:
            precision.forget(self.model)  # no gathered copy may be left behind on the device
            self.model.to("cpu")
        if self.optimizer:
            move_optimizer(self.optim, "cpu")
        if self.params or self.optimizer:
            torch.cuda.empty_cache()

    @contextlib.contextmanager
    def resident(self, optimizer: bool = False):
        """The model (and with `optimizer`, its optimizer's state) on the device for the block."""
        if self.params:
            self.model.to(self.device)
        if optimizer and self.optimizer:
            move_optimizer(self.optim, self.device)
        try:
            yield
        finally:
            self.away()


def move_optimizer(optim, device: str) -> None:
    """Each tensor of the optimizer's state to `device`; step counters (0-d) stay where they are."""
    for state in optim.state.values():
        for key, value in state.items():
            if isinstance(value, torch.Tensor) and value.dim() > 0:
                state[key] = value.to(device)
