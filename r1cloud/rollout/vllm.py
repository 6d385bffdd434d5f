"""Rollouts with an in-process vLLM engine per worker (`external_launcher`: the engine joins the
workers' torch.distributed world, tensor parallel inside it).

Weights are streamed per tensor from the actor into the live engine with the `reload_weights`
worker RPC (the path that also works on vLLM's CPU build, where `model.load_weights` after init
fails on repacked weights), then the prefix cache is reset so no stale KV survives the sync. On
GPU the engine sleeps between phases (weights and KV cache released to the trainer). A LoRA
run may sync its adapters only (`load_adapter`, a LoRA-enabled engine) instead of merged weights.
"""

from __future__ import annotations

import atexit
import itertools
import json
import os
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path

import torch

from r1cloud.core.dtypes import DTYPE_NAMES, torch_dtype
from r1cloud.core.families import kv_bytes_per_token
from r1cloud.media import compat as vision_compat
from r1cloud.media.vision import is_vision_config
from r1cloud.rollout.engine import Request, Sample, Sampling, cut_at_eos, placeholder_ids, request_seed


class VLLMEngine:
    name = "vllm"

    def __init__(
        self, model_path: str, tokenizer_path: str, cfg, eos_ids: set[int], seed: int, lora_rank: int = 0,
        videos: int = 0, sequences: int = 0,
    ):  # fmt: skip
        """`lora_rank`: LoRA enabled, for adapter syncs (`load_adapter`) instead of merged weights;
        `videos`: the most videos a prompt holds (vLLM reserves room for that many); `sequences`:
        the most one generate call holds (on CPU the KV cache is sized to them; 0: unknown)."""
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(model_path, trust_remote_code=cfg.trust_remote_code)
        mm = {}
        self.forbidden: set[int] = set()
        if is_vision_config(config):
            vision_compat.prepare_vllm(config.architectures or [])
            # images as the data allow (EasyR1: limit_images > 0 caps a prompt's; an episode's
            # observations add their own, so there vLLM's own limit applies); videos as the data has
            cap = cfg.limit_images if not cfg.multi_turn.enable else 0
            mm = {"limit_mm_per_prompt": {"video": videos, **({"image": cap} if cap else {})}}
            if videos:  # normalized by the processor: vLLM's Qwen3-VL video path does not tell it
                mm["mm_device_do_normalize"] = False  # that the model would normalize on the device
            self.forbidden = placeholder_ids(config)
        from vllm import LLM

        self.cuda = torch.cuda.is_available()
        self.requests = itertools.count()  # stream()'s request ids
        max_len = cfg.max_model_len or cfg.prompt_length + cfg.response_length
        kv = {}
        if not self.cuda and not os.environ.get("VLLM_CPU_KVCACHE_SPACE"):  # the user's size wins
            per_token = kv_bytes_per_token(config.to_dict(), torch_dtype(cfg.dtype).itemsize)
            kv["kv_cache_memory_bytes"] = cpu_kv_cache_bytes(per_token, max_len, sequences)
        self.llm = LLM(
            model=model_path,
            tokenizer=tokenizer_path,
            dtype=DTYPE_NAMES[cfg.dtype],
            seed=seed,
            max_model_len=max_len,
            max_num_batched_tokens=max(cfg.max_num_batched_tokens, max_len),
            tensor_parallel_size=cfg.tensor_parallel_size,
            distributed_executor_backend="external_launcher",
            gpu_memory_utilization=cfg.gpu_memory_utilization,
            enforce_eager=cfg.enforce_eager or not self.cuda,
            # on CPU, chunked prefill cannot rewind a seeded request's generator when a chunk's
            # token is discarded ("CPU Generator does not use offset"): whole prompts only there
            # (the driver refuses enable_chunked_prefill: true on CPU)
            enable_chunked_prefill=bool(cfg.enable_chunked_prefill and self.cuda),  # false is false (EasyR1)
            enable_sleep_mode=self.cuda,
            logprobs_mode="processed_logprobs",
            trust_remote_code=cfg.trust_remote_code,
            disable_log_stats=cfg.disable_log_stats,
            **mm,
            **kv,
            **({} if self.cuda else {**_cpu_norm_kernels(), "block_size": CPU_BLOCK}),
            **({"enable_lora": True, "max_lora_rank": lora_rank, "max_loras": 1} if lora_rank else {}),
        )
        # the output layer is the embedding (SmolLM2, Qwen2.5 up to 3B): see _refresh_tied_output_layer
        self.tied = bool(getattr(config.get_text_config(), "tie_word_embeddings", False))
        self.adapter = None  # the LoRARequest every generate uses once an adapter is synced
        if lora_rank:
            self.adapter_dir = Path(tempfile.mkdtemp(prefix="r1cloud-lora-", dir=_ram_disk()))
            atexit.register(shutil.rmtree, self.adapter_dir, ignore_errors=True)
        self.eos = eos_ids
        self.sleeping = False
        self.sleep()

    def sleep(self) -> None:
        if self.cuda and not self.sleeping:
            self.llm.sleep(level=1)
            self.sleeping = True

    def wake(self, tags: list[str]) -> None:
        if self.cuda and self.sleeping:
            self.llm.wake_up(tags=tags)
            if "kv_cache" in tags:
                self.sleeping = False

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        self.wake(["weights"])
        self.llm.collective_rpc(
            "reload_weights", kwargs={"weights_iterator": iter(weights), "is_checkpoint_format": True}
        )
        if self.tied:
            self.llm.collective_rpc(_refresh_tied_output_layer)
        self.llm.reset_prefix_cache()
        if self.forbidden:  # a VLM: image embeddings from the old vision weights must not be reused
            self.llm.llm_engine.reset_encoder_cache()

    def load_adapter(self, tensors: dict[str, torch.Tensor], config: dict) -> None:
        """The policy's adapters (peft's names and config) replace the engine's: written to a RAM
        folder, loaded in place under one fixed id (a load per sync, not per scheduling step)."""
        from safetensors.torch import save_file
        from vllm.lora.request import LoRARequest

        save_file(tensors, str(self.adapter_dir / "adapter_model.safetensors"))
        (self.adapter_dir / "adapter_config.json").write_text(json.dumps(config))
        self.wake(["weights"])
        self.llm.llm_engine.add_lora(LoRARequest("policy", 1, str(self.adapter_dir), load_inplace=True))
        self.adapter = LoRARequest("policy", 1, str(self.adapter_dir))
        self.llm.reset_prefix_cache()
        if self.forbidden:
            self.llm.llm_engine.reset_encoder_cache()

    def _params(self, s: Sampling, max_tokens: int, seed: int):
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        return SamplingParams(
            n=1,
            temperature=s.temperature,
            top_p=s.top_p,
            top_k=s.top_k if s.top_k > 0 else 0,
            max_tokens=max_tokens,
            seed=seed,
            ignore_eos=s.ignore_eos,
            logprobs=0,
            detokenize=False,
            output_kind=RequestOutputKind.FINAL_ONLY,
            **s.extra,
        )

    def _sample(self, prompt: int, out, s: Sampling) -> Sample:
        o = out.outputs[0]
        logprobs = [d[t].logprob for t, d in zip(o.token_ids, o.logprobs or [], strict=False)]
        resp, lp, done = cut_at_eos(
            list(o.token_ids), logprobs, set() if s.ignore_eos else self.eos, self.forbidden
        )
        return Sample(prompt, resp, lp, done)

    def generate(self, prompts: list[Request], s: Sampling) -> list[Sample]:
        self.wake(["weights", "kv_cache"])
        params = [
            self._params(s, s.max_tokens, request_seed(s.seed, i, j))
            for i in range(len(prompts))
            for j in range(s.n)
        ]
        inputs = [_input(p) for p in prompts for _ in range(s.n)]
        outputs = self.llm.generate(inputs, params, use_tqdm=False, lora_request=self.adapter)
        samples = [self._sample(k // s.n, out, s) for k, out in enumerate(outputs)]
        self.sleep()
        return samples

    def stream(self, play) -> None:
        """Multi-turn episodes (agents.episodes.Play) with no barrier between turns: an episode's
        next turn joins the running batch as soon as its observation is in, each turn under its
        own budget and seed; the engine steps while tools run."""
        self.wake(["weights", "kv_cache"])
        engine, turns = self.llm.llm_engine, {}

        def add(batch) -> None:
            for t in batch:
                key = f"turn-{next(self.requests)}"
                params = self._params(play.s, t.max_tokens, t.seed)
                engine.add_request(key, _input(t.request), params, lora_request=self.adapter)
                turns[key] = t  # outputs carry this id (the engine's own gets a suffix)

        add(play.first())
        while turns or play.busy():
            if turns:
                for out in engine.step():
                    if out.finished:
                        play.took(turns.pop(out.request_id), self._sample(0, out, play.s))
                add(play.ready())
            else:  # every live episode waits on its tools
                add(play.ready(block=True))
        self.sleep()


# The CPU build's KV-cache block: its attention's smallest (it takes multiples of 32; vLLM's default
# there is 128). The samples of a group share their prompt's whole blocks, computed once in the
# step that schedules them together (vLLM's prefix cache), and a prompt shorter than a block
# shares nothing.
CPU_BLOCK = 32


def cpu_kv_cache_bytes(per_token: int, max_len: int, sequences: int) -> int:
    """The KV cache of an engine on CPU: room for `sequences` of `max_len` tokens at once, in
    blocks of CPU_BLOCK tokens, at most 1 GiB (vLLM fills it with zeros as it starts, so
    all of it is resident), and at least one sequence; 1 GiB when
    `sequences` is unknown (0). A larger step runs its sequences in waves; VLLM_CPU_KVCACHE_SPACE
    (GiB) sets another size."""
    one = -(-max_len // CPU_BLOCK) * CPU_BLOCK * per_token
    return max(one, min(one * sequences, 2**30)) if sequences else max(one, 2**30)


def _refresh_tied_output_layer(worker) -> None:
    """After vLLM 0.32's in-place reload, a tied output layer (skipped by the loader: its weight is
    the embedding's) still computes logits with what it prepared from the first weights: on CPU, a
    packed copy for its matrix product. Each sync then sampled from the new body through the old
    output layer. It gets the embedding's values and prepares them again (on GPU that is a no-op).
    The embedding is the `embed_tokens` under the head's own prefix: `model.embed_tokens` for a
    text model, `model.text_model.embed_tokens` for Idefics3/SmolVLM."""
    modules = dict(worker.model_runner.get_model().named_modules())
    for name, head in modules.items():
        if not (name.endswith("lm_head") and hasattr(head, "quant_method")):
            continue
        prefix = name.removesuffix("lm_head")
        near = [n for n in modules if n.startswith(prefix) and n.endswith("embed_tokens")]
        if not near:  # sampling from a stale output layer must not pass unnoticed
            raise RuntimeError(f"vLLM's model ties {name} to an embedding r1cloud cannot find")
        embedding = modules[min(near, key=len)]
        if head.weight.data_ptr() != embedding.weight.data_ptr():
            head.weight.data.copy_(embedding.weight.data)
        head.quant_method.process_weights_after_loading(head)


def _cpu_norm_kernels() -> dict:
    """vLLM 0.32 runs RMSNorm on CPU as its `native` chain of torch ops (the compiled kernels of
    its CPU build are registered for GPUs only); at decode's few rows that is per-op overhead,
    at prefill's many, far slower than its own CPU kernel. The
    build's kernels (`torch.ops._C.rms_norm`, `fused_add_rms_norm`) go first for the contiguous
    rows they take; anything else still goes to `native`. Same arithmetic in fp32 (≤ 2e-6); in
    bf16 they normalize the residual sum as rounded to bf16, as transformers' layers (the
    trainer's) do, where native normalizes the fp32 sum."""
    import vllm._C  # noqa: F401  the CPU build's kernels
    from vllm import ir

    def takes(x, weight, epsilon, variance_size=None) -> bool:  # each op's own signature, as vLLM wants
        return variance_size is None and x.is_contiguous() and (weight is None or weight.dtype == x.dtype)

    def takes_add(x, x_residual, weight, epsilon, variance_size=None) -> bool:
        return takes(x, weight, epsilon, variance_size) and x_residual.is_contiguous()

    if "r1cloud_cpu" not in ir.ops.rms_norm.impls:

        @ir.ops.rms_norm.register_impl("r1cloud_cpu", supports_args=takes)
        def _rms_norm(
            x: torch.Tensor, weight: torch.Tensor | None, epsilon: float, variance_size: int | None = None
        ) -> torch.Tensor:
            out = torch.empty_like(x)
            torch.ops._C.rms_norm(out, x, weight, epsilon)
            return out

        @ir.ops.fused_add_rms_norm.register_impl("r1cloud_cpu", supports_args=takes_add, inplace=True)
        def _fused_add_rms_norm(
            x: torch.Tensor,
            x_residual: torch.Tensor,
            weight: torch.Tensor | None,
            epsilon: float,
            variance_size: int | None = None,
        ) -> tuple[torch.Tensor, torch.Tensor]:
            torch.ops._C.fused_add_rms_norm(x, x_residual, weight, epsilon)
            return x, x_residual

    return {"ir_op_priority": {"rms_norm": ["r1cloud_cpu"], "fused_add_rms_norm": ["r1cloud_cpu"]}}


def _ram_disk() -> str | None:
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None


def _input(p: Request) -> dict:
    """With images or videos: one placeholder each in the ids, the pictures and each video's frames
    (T, H, W, 3) with their metadata beside them (vLLM expands)."""
    media = {"image": p.images} if p.images else {}
    if p.videos:
        import numpy as np

        sampled = {"do_sample_frames": False}  # as data.video_fps says, already (video.load)
        media["video"] = [
            (np.stack([np.asarray(f) for f in c.frames]), {**c.metadata, **sampled}) for c in p.videos
        ]
    if media:
        return {"prompt_token_ids": p.raw_ids, "multi_modal_data": media}
    return {"prompt_token_ids": p.ids}
