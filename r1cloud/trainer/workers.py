"""The hybrid worker: one per device (a CPU slot, or a GPU). It holds its FSDP2 shard of the actor,
the reference model when KL is on, and a rollout engine; torch.distributed spans all workers
(gloo on CPU, nccl on GPU). The driver calls every worker with the same method at the same time,
and gives every worker the same number of micro-batches, so FSDP's collectives always pair up.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from r1cloud.checkpoint.dcp import storage
from r1cloud.core.dtypes import torch_dtype
from r1cloud.core.families import unsupported
from r1cloud.media import vision
from r1cloud.rollout import onednn
from r1cloud.trainer import lora, offload, precision, ulysses
from r1cloud.trainer.actor_update import ActorUpdate
from r1cloud.trainer.critic import Critic
from r1cloud.trainer.engine_host import EngineHost
from r1cloud.trainer.model import (
    apply_fsdp,
    blank_sequence,
    language_model,
    load_weights,
    receive_from_rank0,
    shard_units,
    uses_segments,
    vision_tower,
)
from r1cloud.trainer.optim import AdamWBF16, lr_factor
from r1cloud.trainer.weight_sync import WeightSync
from r1cloud.trainer.world import join_world

VALUE_HEADS = ("score", "classifier")  # a critic's new head: trained in full when it has LoRA


class HybridWorker(ActorUpdate, Critic, WeightSync, EngineHost):
    """One device's worker: its lifecycle (models, optimizers, schedules, checkpoints) here; the
    actor's log-probs and update (actor_update.py), the critic's (critic.py), the weight sync into
    the engine (weight_sync.py) and the rollout engine itself (engine_host.py) as its bases."""

    def __init__(self, spec: dict, rank: int, world: int, master: str, threads: int = 1):
        self._begin(spec, rank, world, master, threads)
        w, a = self.spec.worker, self.spec.algorithm
        # FSDP's CPU offload keeps gradients in host memory: clipping's all-reduce needs gloo for them
        offloaded = any(r.fsdp.enable_cpu_offload for r in (w.actor, w.ref, w.critic))
        backend = ("cuda:nccl,cpu:gloo" if offloaded else "nccl") if self.cuda else "gloo"
        join_world(master, rank, world, backend)
        # Ulysses groups (the reference model's is the actor's, as in EasyR1)
        sizes = {role: getattr(w, role).ulysses_size for role in self.spec.roles}
        made = {n: ulysses.groups(world, n, rank) for n in dict.fromkeys(sizes.values())}
        self.sp = {role: made[n] for role, n in sizes.items()}
        # the actor's mesh holds the reference model too (EasyR1's fsdp_workers.py:118-127)
        mesh = self._mesh(w.actor.fsdp.fsdp_size)
        self.actor = self._build(w.actor.model, w.actor.fsdp, mesh, train=True)
        # the reference model: a second copy of the base, or with LoRA the actor with its adapters off
        self.lora = lora.has_adapters(self.actor)
        self._adapter = lora.describe(self.actor, w.actor.model.model_path) if self.lora else None
        no_ref = a.disable_kl or self.lora
        self.ref = None if no_ref else self._build(w.actor.model, w.ref.fsdp, mesh, train=False)
        self.optim = self._optimizer(self.actor, w.actor.optim)
        # GAE's critic: the same kind of backbone with a one-label token-classification head
        self.critic = None
        if a.estimator.critic:
            mesh = self._mesh(w.critic.fsdp.fsdp_size)
            self.critic = self._build(w.critic.model, w.critic.fsdp, mesh, train=True, value_head=True)
            self.critic_optim = self._optimizer(self.critic, w.critic.optim)
        # what each role keeps off the device between phases (LoRA's reference is the actor)
        self.offloads = {
            "actor": offload.Offload(self.actor, self.optim, w.actor.offload, w.actor.fsdp, self.device),
            "ref": offload.Offload(self.ref, None, w.ref.offload, w.ref.fsdp, self.device),
            "critic": offload.Offload(self.critic, getattr(self, "critic_optim", None), w.critic.offload,
                                      w.critic.fsdp, self.device),
        }  # fmt: skip
        for role in self.offloads.values():
            if role.model is not None:
                role.away()
        # a group's samples hold one copy of their prompt (model.pack); the driver keeps them together
        self.share_prompts = all(uses_segments(m) for m in (self.actor, self.critic) if m is not None)
        self.schedulers: dict = {}  # set by the driver once the step count is known (set_schedule)
        self._temperature = self.spec.worker.rollout.temperature

    def node_ip(self) -> str:
        import ray

        return ray.util.get_node_ip_address()

    # ------------------------------------------------------------------ setup
    def _mesh(self, fsdp_size: int):
        """All devices in one FSDP group, or with 0 < fsdp_size < world hybrid sharding: FSDP2 over a
        2-D mesh, shards inside groups of fsdp_size devices and replicas across the groups."""
        from torch.distributed.device_mesh import init_device_mesh

        kind = "cuda" if self.cuda else "cpu"
        groups = self.world // fsdp_size if 0 < fsdp_size < self.world else 1
        if groups == 1:
            return init_device_mesh(kind, (self.world,))
        return init_device_mesh(kind, (groups, fsdp_size), mesh_dim_names=("ddp", "fsdp"))

    def _build(self, m, fsdp_cfg, mesh, train: bool, value_head: bool = False):
        from torch.distributed.fsdp import MixedPrecisionPolicy
        from transformers import AutoConfig, AutoModelForTokenClassification

        config = AutoConfig.from_pretrained(m.model_path, trust_remote_code=m.trust_remote_code)
        if reason := unsupported(config.to_dict()):  # a Hub model validate could not read
            raise ValueError(f"worker.actor.model.model_path: {reason}")
        load, extra = vision.auto_class(config), {}
        four_bit = train and m.lora.rank and m.lora.load_in_4bit  # QLoRA: quantised as it loads
        # enable_rank0_init: rank 0 reads the weights, the others build an empty model (meta device)
        # and receive their shards from it after sharding: one copy in host memory, not one per worker
        # (a 4-bit base cannot be built empty; each worker quantises its own)
        from_rank0 = fsdp_cfg.enable_rank0_init and self.world > 1 and not four_bit
        if value_head:  # one label, no dropout on the value (as verl)
            config.num_labels, config.classifier_dropout = 1, 0.0
            load, extra = AutoModelForTokenClassification, {"config": config}
            torch.manual_seed(self.spec.data.seed)  # a new value head starts the same on every worker
        dtype = torch.float32 if train else torch.bfloat16  # EasyR1's default: fp32 actor, bf16 ref
        kwargs = dict(
            dtype=torch_dtype(fsdp_cfg.torch_dtype) if fsdp_cfg.torch_dtype else dtype,
            trust_remote_code=m.trust_remote_code,
            **extra,
            **m.override_config,
        )
        if four_bit:
            kwargs.update(
                quantization_config=lora.nf4(torch_dtype(fsdp_cfg.mp_param_dtype)),
                device_map={"": self.device},
            )
        empty = from_rank0 and self.rank != 0
        model = load_weights(load, m.model_path, config, kwargs, empty)
        if getattr(model.config, "attn_logit_softcapping", None):  # sdpa has no soft cap
            model.set_attn_implementation("sdpa")
        if not four_bit and not empty:  # a quantised model is placed as it loads, and cannot be moved
            model = model.to(self.device)
        tower = vision_tower(model)
        if tower is not None:  # in every micro-batch without pictures (text rows among image rows)
            model.r1cloud_blank = blank_sequence(m, self.spec.data)
        if train and m.freeze_vision_tower and tower is not None:
            tower.requires_grad_(False)
        if train and m.freeze_language_model:  # a VLM (the driver refuses it for a text model)
            for part in language_model(model):
                part.requires_grad_(False)
        if train and m.lora.rank:  # adapters (a frozen tower gets none), everything else frozen
            heads = [n for n, _ in model.named_children() if n in VALUE_HEADS] if value_head else []
            lora.adapt(model, m, tower, heads, seed=self.spec.data.seed)  # a new head trains in full
        if not self.cuda and torch_dtype(fsdp_cfg.mp_param_dtype) == torch.float32:
            onednn.use_in(model)  # fp32 linear layers at twice MKL's speed on AMD CPUs
        if train and m.enable_gradient_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.config.use_cache = False
        # as EasyR1: weights stored in torch_dtype, computed in mp_param_dtype, reduced in mp_reduce_dtype
        mp = MixedPrecisionPolicy(
            param_dtype=torch_dtype(fsdp_cfg.mp_param_dtype),
            reduce_dtype=torch_dtype(fsdp_cfg.mp_reduce_dtype),
        )
        # On CPU, host memory is plentiful and a gloo all-gather is slow: parameters gathered for the
        # forward pass stay gathered for the backward pass instead of being gathered twice.
        reshard = fsdp_cfg.enable_full_shard and self.cuda
        # each decoder layer and vision block its own group (the model's _no_split_modules), then the
        # vision tower's remaining weights, then the rest
        shard = dict(
            mesh=mesh, mp_policy=mp, reshard_after_forward=reshard, **offload.policy(fsdp_cfg, self.cuda)
        )
        # rank 0's weights to send, named as the model now is (adapters in, heads added)
        full = model.state_dict() if from_rank0 and not empty else {}
        if four_bit:  # whole on every worker; FSDP shards the adapters and the rest
            shard["ignored_params"] = lora.four_bit_params(model)
        units = shard_units(model) + ([tower] if tower is not None else []) + [model]  # the root last
        mixed = mp.param_dtype != kwargs["dtype"]
        # One worker on CPU: FSDP would have nothing to shard, and its copies into and out of its
        # flat buffers would be all it did; precision.py casts instead (not a 4-bit base's data)
        if self.world == 1 and not self.cuda and not (mixed and four_bit):
            if mixed:
                precision.attach(model, mp.param_dtype, mp.reduce_dtype, units)
        else:
            apply_fsdp(units, shard)
        if from_rank0:
            receive_from_rank0(model, full, empty, self.device)
            del full
        if not train:
            model.eval().requires_grad_(False)
        return model

    @staticmethod
    def _optimizer(model, o):
        params = [p for p in model.parameters() if p.requires_grad]
        if o.strategy == "adamw_bf16":  # moment estimates in bf16: half the optimizer's memory
            return AdamWBF16(params, lr=o.lr, betas=o.betas, weight_decay=o.weight_decay)
        # fused: one kernel over all tensors, several times faster than the per-tensor loop on CPU
        return torch.optim.AdamW(params, lr=o.lr, betas=o.betas, weight_decay=o.weight_decay, fused=True)

    def set_schedule(self, total_steps: int) -> None:
        for role in self.spec.roles:
            factor = lr_factor(getattr(self.spec.worker, role).optim, total_steps)
            self.schedulers[role] = torch.optim.lr_scheduler.LambdaLR(self._role(role)[1], factor)

    def adapter(self) -> dict | None:
        """LoRA: the adapter's config and what it trains (lora.describe); None for full training."""
        return self._adapter

    def offload_note(self) -> str | None:
        return offload.note(self.spec, self.cuda)

    def shares_prompts(self) -> bool:
        return self.share_prompts

    # ------------------------------------------------------------------ checkpoints
    def _role(self, role: str):
        return (self.actor, self.optim) if role == "actor" else (self.critic, self.critic_optim)

    def _state(self, role: str, optimizer: bool) -> dict:
        """What a checkpoint holds of `role`: its trained weights, and its optimizer's state."""
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        model, optim = self._role(role)
        state = {"model": lora.trained_state(model)}
        # not with trainer.save_model_only: a smaller checkpoint, resumed with a fresh optimizer
        if optimizer:
            state["optim"] = get_optimizer_state_dict(model, optim)
        return state

    def save(self, path: str, role: str = "actor", model_only: bool = False) -> None:
        import torch.distributed.checkpoint as dcp

        with self.offloads[role].resident(optimizer=not model_only):
            dcp.save(self._state(role, not model_only), **storage(path, write=True))
            dist.barrier()

    def load(
        self, path: str, scheduler_state: dict | None, role: str = "actor", optimizer: bool = True
    ) -> None:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict

        model, optim = self._role(role)
        with self.offloads[role].resident(optimizer=optimizer):
            precision.forget(model)  # no copy of the old weights (full_weights') may outlive them
            state = self._state(role, optimizer)
            dcp.load(state, **storage(path, write=False))
            set_model_state_dict(model, state["model"], options=lora.state_options(model))
            if optimizer:
                set_optimizer_state_dict(model, optim, state["optim"])
            if scheduler_state is not None and role in self.schedulers:
                self.schedulers[role].load_state_dict(scheduler_state)
                # the groups' lr lives in the optimizer's state; a fresh optimizer takes the schedule's
                for group, lr in zip(optim.param_groups, self.schedulers[role].get_last_lr(), strict=True):
                    group["lr"] = lr

    def scheduler_state(self, role: str = "actor") -> dict | None:
        return self.schedulers[role].state_dict() if role in self.schedulers else None
