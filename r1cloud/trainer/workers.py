"""The hybrid worker: one per device (a CPU slot, or a GPU). It holds its FSDP2 shard of the actor,
the reference model when KL is on, and a rollout engine; torch.distributed spans all workers
(gloo on CPU, nccl on GPU). The driver calls every worker with the same method at the same time,
and gives every worker the same number of micro-batches, so FSDP's collectives always pair up.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Iterator
from datetime import timedelta

import torch
import torch.distributed as dist

from r1cloud.agents import episodes
from r1cloud.checkpoint.dcp import storage
from r1cloud.core.dtypes import torch_dtype
from r1cloud.core.families import unsupported
from r1cloud.data import no_sklearn
from r1cloud.media import vision
from r1cloud.rollout import Request, Sampling, eos_ids, onednn, vllm_max_rank
from r1cloud.spec import Spec
from r1cloud.trainer import algorithms as alg
from r1cloud.trainer import lora, offload, precision, ulysses
from r1cloud.trainer.batch import Batch, forward_rows, zero_copy_tensors
from r1cloud.trainer.metrics import engine_gap
from r1cloud.trainer.model import (
    apply_fsdp,
    blank_sequence,
    language_model,
    load_weights,
    packed_log_probs,
    packed_values,
    pad,
    receive_from_rank0,
    resharded,
    shard_units,
    uses_segments,
    vision_tower,
)
from r1cloud.trainer.optim import AdamWBF16, lr_factor

VALUE_HEADS = ("score", "classifier")  # a critic's new head: trained in full when it has LoRA


# what `update` sums over its micro-batches (besides is_weight; on-policy, engine_gap's)
UPDATE_STATS = ("pg_loss", "kl_loss", "entropy_loss", "tokens", "clip_hi", "clip_lo", "ppo_kl", "entropy")


class HybridWorker:
    def __init__(self, spec: dict, rank: int, world: int, master: str, threads: int = 1):
        no_sklearn.install()  # before the first model loads in this Ray worker
        self.spec = Spec.model_validate(spec)
        self.rank, self.world = rank, world
        zero_copy_tensors()  # what it returns to the driver
        self.cuda = torch.cuda.is_available()
        self.device = f"cuda:{torch.cuda.current_device()}" if self.cuda else "cpu"
        if not self.cuda:  # (vLLM runs in this process: its CPU build binds no threads here)
            torch.set_num_threads(threads)
        # vLLM's in-process launcher reads these; no MASTER_ADDR/PORT: the world meets through the
        # controller's store (group.rendezvous), and nothing here may try to listen on its port
        os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank if not self.cuda else 0))
        host, port = master.rsplit(":", 1)
        wait = timedelta(minutes=30)
        store = dist.TCPStore(host, int(port), is_master=False, timeout=wait)
        w, a = self.spec.worker, self.spec.algorithm
        # FSDP's CPU offload keeps gradients in host memory: clipping's all-reduce needs gloo for them
        offloaded = any(r.fsdp.enable_cpu_offload for r in (w.actor, w.ref, w.critic))
        backend = ("cuda:nccl,cpu:gloo" if offloaded else "nccl") if self.cuda else "gloo"
        dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=wait)
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
        self.engine = None
        self.agent = None  # multi-turn episodes: agents.episodes.Agent (start_engine)
        self.adapter_sync = False  # LoRA into vLLM: the adapters only (start_engine decides)
        self._temperature = self.spec.worker.rollout.temperature

    def node_ip(self) -> str:
        import ray

        return ray.util.get_node_ip_address()

    # ------------------------------------------------------------------ setup
    def _model_dtype(self, fsdp_cfg, train: bool) -> torch.dtype:
        if fsdp_cfg.torch_dtype:
            return torch_dtype(fsdp_cfg.torch_dtype)
        return torch.float32 if train else torch.bfloat16  # EasyR1's default: fp32 actor, bf16 ref

    def _mesh(self, fsdp_size: int):
        """All devices in one FSDP group, or with 0 < fsdp_size < world hybrid sharding: FSDP2 over a
        2-D mesh, shards inside groups of fsdp_size devices and replicas across the groups."""
        from torch.distributed.device_mesh import init_device_mesh

        kind, groups = (
            "cuda" if self.cuda else "cpu",
            self.world // fsdp_size if 0 < fsdp_size < self.world else 1,
        )
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
        kwargs = dict(
            dtype=self._model_dtype(fsdp_cfg, train),
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
        roles = [("actor", self.optim, self.spec.worker.actor.optim)]
        if self.critic is not None:
            roles.append(("critic", self.critic_optim, self.spec.worker.critic.optim))
        for role, optim, o in roles:
            self.schedulers[role] = torch.optim.lr_scheduler.LambdaLR(optim, lr_factor(o, total_steps))

    def adapter(self) -> dict | None:
        """LoRA: the adapter's config and what it trains (lora.describe); None for full training."""
        return self._adapter

    def offload_note(self) -> str | None:
        return offload.note(self.spec, self.cuda)

    def shares_prompts(self) -> bool:
        return self.share_prompts

    def start_engine(self, engine: str, videos: int = 0, sequences: int = 0) -> str:
        """The rollout engine; `videos`: the most videos a prompt holds (vLLM makes room for them);
        `sequences`: the most one rollout call gives it (vLLM's KV cache is sized to them on CPU)."""
        from transformers import AutoTokenizer

        m, r = self.spec.worker.actor.model, self.spec.worker.rollout
        tok = AutoTokenizer.from_pretrained(m.tokenizer_path)
        eos = eos_ids(m.model_path, tok)
        if r.multi_turn.enable:  # observations in the prompts' own template (override included)
            from r1cloud.agents.episodes import Agent
            from r1cloud.data.loader import load_tokenizer

            self.agent = Agent.of(self.spec, *load_tokenizer(m, self.spec.data))
        if engine == "vllm":
            from r1cloud.rollout.vllm import VLLMEngine

            self.adapter_sync = self.lora and lora.sync_adapters(m.lora, self.cuda)
            rank = vllm_max_rank(m.lora.rank) if self.adapter_sync else 0
            self.engine = VLLMEngine(
                m.model_path, m.tokenizer_path, r, eos, seed=r.seed, lora_rank=rank, videos=videos,
                sequences=sequences,
            )  # fmt: skip
        else:
            from r1cloud.rollout.hf import HFEngine

            pad_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
            self.engine = HFEngine(m.model_path, eos, pad_id, torch_dtype(r.dtype), self.device)
        return self.engine.name

    # ------------------------------------------------------------------ rollout
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

    def sync_weights(self) -> None:
        with self.offloads["actor"].resident():
            if self.adapter_sync:  # the engine holds the base: only the adapters move
                self.engine.load_adapter(lora.adapter_tensors(self.actor), self.adapter()["config"])
                return
            weights = self.full_weights()
            self.engine.load_weights(lora.merged(weights, self.actor) if self.lora else weights)

    def generate(self, prompts: list[Request], sampling: dict) -> dict[str, torch.Tensor]:
        """n samples per prompt: their prompt's position in `prompts`, response ids and sampling
        log-probs (end to end, batch.packed's layout), lengths, and whether each ended on EOS."""
        if self.agent is None:
            samples = self.engine.generate(prompts, Sampling(**sampling))
        else:
            samples = episodes.run(self.engine, prompts, Sampling(**sampling), self.agent)
        out = {
            "prompt": torch.tensor([s.prompt for s in samples], dtype=torch.long),
            "response": torch.tensor([t for s in samples for t in s.response], dtype=torch.int32),
            "length": torch.tensor([len(s.response) for s in samples], dtype=torch.long),
            "logprobs": torch.tensor([x for s in samples for x in s.logprobs], dtype=torch.float32),
            "finished": torch.tensor([s.finished for s in samples], dtype=torch.bool),
        }
        if self.agent is not None:  # which tokens are the model's, and each episode's counts
            out["mask"] = torch.tensor([m for s in samples for m in s.mask], dtype=torch.bool)
            out["episode"] = torch.tensor([[s.stats[k] for k in episodes.STATS] for s in samples])
            if self.agent.env_reward:
                out["env_reward"] = torch.tensor([s.reward for s in samples], dtype=torch.float64)
            if any(s.images for s in samples):  # pictures in observations: their tensors, per episode
                out["tool_images"] = [vision.merge(s.images or []) for s in samples]
            if self.agent.shape:  # each episode's own prompt (its environment's reset added to it)
                ids = [s.prompt_ids or prompts[s.prompt].ids for s in samples]
                out["prompt_ids"] = torch.tensor([t for x in ids for t in x], dtype=torch.int32)
                out["prompt_len"] = torch.tensor([len(x) for x in ids], dtype=torch.long)
        return out

    # ------------------------------------------------------------------ log-probs
    @torch.no_grad()
    def log_probs(
        self,
        batch: Batch,
        micro_batches: list[list[int]],
        role: str = "actor",
        temperature: float | None = None,
    ) -> torch.Tensor:
        """The response tokens' log-probs under the actor (or the reference), fp32, the shard's rows
        end to end, computed micro-batch by micro-batch (rows of the shard)."""
        base = role == "ref" and self.lora  # LoRA's reference: the actor's base weights
        model = self.actor if role == "actor" or base else self.ref
        model.eval()
        t = self._temperature if temperature is None else temperature
        resident = self.offloads["actor" if model is self.actor else "ref"].resident()
        with (
            resident,
            lora.disabled(model) if base else contextlib.nullcontext(),
            precision.window(model),
            resharded(model, self.cuda),
        ):
            return forward_rows(
                batch,
                micro_batches,
                lambda seqs: packed_log_probs(model, seqs, t, self.device, sp=self.sp["actor"]),
            )

    # ------------------------------------------------------------------ update
    def update(self, batch: Batch, minibatches: list[dict], apply: bool = True) -> list[dict]:
        with self.offloads["actor"].resident(optimizer=True):
            return self._update(batch, minibatches, apply)

    def _update(self, batch: Batch, minibatches: list[dict], apply: bool) -> list[dict]:
        """One optimizer step per mini-batch of the shard `batch`. Each mini-batch: {"micro":
        [rows of the shard, per micro-batch], "total": global token (or sequence) count of the
        whole mini-batch on all workers}. With `apply=False` the gradients of the first
        mini-batch are left in place (tests compare them)."""
        actor_cfg, a = self.spec.worker.actor, self.spec.algorithm
        clip = alg.ClipConfig(actor_cfg.clip_ratio_low, actor_cfg.clip_ratio_high, actor_cfg.clip_ratio_dual)
        mode = actor_cfg.loss_avg_mode
        norm = self.spec.data.max_response_length  # seq-mean-token-sum-norm's constant length
        self.actor.train()
        results = []
        for mb in minibatches:
            total = mb["total"]
            stats = dict.fromkeys((*UPDATE_STATS, "is_weight"), 0.0)
            with precision.window(self.actor):  # one worker computing in bf16 without FSDP
                for i, rows in enumerate(mb["micro"]):
                    self._sync_gradients(self.actor, last=i == len(mb["micro"]) - 1)
                    micro = batch.select(rows)
                    seqs, micro = micro.seqs(), micro.to(self.device)
                    logps, entropies = packed_log_probs(
                        self.actor,
                        seqs,
                        self._temperature,
                        self.device,
                        entropy=True,
                        entropy_grad=actor_cfg.entropy_coeff > 0,
                        sp=self.sp["actor"],
                    )
                    logp, mask = pad(logps, width=micro.response_ids.shape[1])[0], micro.mask
                    entropy = pad(entropies, width=mask.shape[1])[0]
                    old = logp.detach() if micro.old_logp is None else micro.old_logp
                    if micro.old_logp is None and micro.rollout_logp is not None:  # on-policy
                        engine_gap(stats, old, micro.rollout_logp, mask)
                    adv = micro.advantages * mask
                    loss_mat, m = alg.policy_loss(
                        actor_cfg.loss_type,
                        logp,
                        old,
                        adv,
                        mask,
                        clip,
                        actor_cfg.tau_positive,
                        actor_cfg.tau_negative,
                    )
                    if actor_cfg.rollout_is:  # the rollout engine's log-probs differ from the trainer's
                        weights = alg.rollout_is_weights(
                            old, micro.rollout_logp, mask, actor_cfg.rollout_is, actor_cfg.rollout_is_cap
                        )
                        loss_mat = loss_mat * weights
                        stats["is_weight"] += float((weights * mask).sum())
                    pg = alg.aggregate(loss_mat, mask, mode, total, norm)
                    ent = alg.aggregate(entropy, mask, mode, total, norm)
                    loss = pg - actor_cfg.entropy_coeff * ent if actor_cfg.entropy_coeff else pg
                    if a.use_kl_loss and not a.disable_kl:
                        kl = alg.aggregate(
                            alg.kl_estimate(logp, micro.ref_logp, a.kl_penalty), mask, mode, total, norm
                        )
                        loss = loss + a.kl_coef * kl
                        stats["kl_loss"] += kl.item()
                    # FSDP averages gradients over workers; each worker's loss is its share of the global mean.
                    (loss * self.world).backward()
                    n = mask.sum().item()
                    stats["pg_loss"] += pg.item()
                    stats["entropy_loss"] += alg.aggregate(-logp.detach(), mask, mode, total, norm).item()
                    stats["entropy"] += ent.item()
                    stats["tokens"] += n
                    stats["clip_hi"] += float(m.get("pg_clipfrac_higher", 0.0)) * n
                    stats["clip_lo"] += float(m.get("pg_clipfrac_lower", 0.0)) * n
                    stats["ppo_kl"] += m["ppo_kl"].item() * n
            if not apply:
                return results
            stats["grad_norm"] = _step(self.actor, self.optim, actor_cfg.max_grad_norm)
            results.append(stats)
        return self._after_update("actor", self.optim, results)

    def _sync_gradients(self, model, last: bool) -> None:
        """On CPU, gradients are reduced across workers once per mini-batch, after its last
        micro-batch, instead of after every one, and the parameters stay gathered until then: a
        gloo reduce-scatter or all-gather of the whole model costs far more there than holding
        unsharded tensors in host memory. On GPUs, where memory is the scarce part, every
        micro-batch reduces and reshards (FSDP's default)."""
        if not self.cuda and hasattr(model, "set_requires_gradient_sync"):  # FSDP's (not one plain worker)
            model.set_requires_gradient_sync(last)
            model.set_reshard_after_backward(last)

    def _after_update(self, role: str, optim, results: list[dict]) -> list[dict]:
        lr = optim.param_groups[0]["lr"]
        if role in self.schedulers:
            self.schedulers[role].step()
        for r in results:
            r["lr"] = lr
        return results

    # ------------------------------------------------------------------ critic (GAE)
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
                    self._sync_gradients(self.critic, last=i == len(mb["micro"]) - 1)
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
            stats["grad_norm"] = _step(self.critic, self.critic_optim, c.max_grad_norm)
            results.append(stats)
        return self._after_update("critic", self.critic_optim, results)

    def full_grads(self) -> dict[str, torch.Tensor]:
        """Full gradients (a collective), for tests against a single process."""
        out = {}
        for name, p in self.actor.named_parameters():
            if (g := p.grad) is not None:  # frozen weights (LoRA's base, a frozen tower) have none
                out[name] = (g.full_tensor() if hasattr(g, "full_tensor") else g).detach().clone()
        self.optim.zero_grad(set_to_none=True)
        return out

    # ------------------------------------------------------------------ checkpoints
    def _role(self, role: str):
        return (self.actor, self.optim) if role == "actor" else (self.critic, self.critic_optim)

    def save(self, path: str, role: str = "actor", model_only: bool = False) -> None:
        with self.offloads[role].resident(optimizer=not model_only):
            self._save(path, role, model_only)

    def _save(self, path: str, role: str, model_only: bool) -> None:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        model, optim = self._role(role)
        state = {"model": lora.trained_state(model)}
        if not model_only:  # trainer.save_model_only: a smaller checkpoint, resumed with a fresh optimizer
            state["optim"] = get_optimizer_state_dict(model, optim)
        dcp.save(state, **storage(path, write=True))
        dist.barrier()

    def load(
        self, path: str, scheduler_state: dict | None, role: str = "actor", optimizer: bool = True
    ) -> None:
        with self.offloads[role].resident(optimizer=optimizer):
            self._load(path, scheduler_state, role, optimizer)

    def _load(self, path: str, scheduler_state: dict | None, role: str, optimizer: bool) -> None:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import (
            get_optimizer_state_dict,
            set_model_state_dict,
            set_optimizer_state_dict,
        )

        model, optim = self._role(role)
        precision.forget(model)  # no copy of the old weights (full_weights') may outlive them
        state = {"model": lora.trained_state(model)}
        if optimizer:
            state["optim"] = get_optimizer_state_dict(model, optim)
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

    def shutdown(self) -> None:
        if self.agent is not None:
            self.agent.sandbox.close()
        if dist.is_initialized():
            dist.destroy_process_group()


def _step(model, optim, max_norm: float) -> float:
    """Clip, step (skipped when the gradient is not finite), zero; returns the gradient norm."""
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    grad_norm = float(grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm)
    if math.isfinite(grad_norm):
        optim.step()
        precision.forget(model)
    optim.zero_grad(set_to_none=True)
    return grad_norm
