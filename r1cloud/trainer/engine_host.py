"""What a worker that holds a rollout engine does: start the engine (vLLM or transformers, with the
agent's episodes when the run has tools) and generate; and what both kinds of worker process do
first and last. A base of HybridWorker (the colocated worker) and of RolloutWorker (asynchronous
training's rollout-only worker); the class that mixes it in sets `lora`."""

from __future__ import annotations

import torch
import torch.distributed as dist

from r1cloud.agents import episodes
from r1cloud.core.dtypes import torch_dtype
from r1cloud.data import no_sklearn
from r1cloud.data.loader import load_tokenizer
from r1cloud.media import vision
from r1cloud.rollout.engine import Request, Sampling, eos_ids, vllm_max_rank
from r1cloud.spec import Spec
from r1cloud.trainer import lora
from r1cloud.trainer.transport import zero_copy_tensors


class EngineHost:
    engine = None
    agent = None  # multi-turn episodes: agents.episodes.Agent (start_engine)
    adapter_sync = False  # LoRA into vLLM: the adapters only (start_engine decides)

    def _begin(self, spec: dict, rank: int, world: int, master: str, threads: int) -> None:
        """What a worker process does first: its spec, rank and device, `threads` CPU threads."""
        no_sklearn.install()  # before the first model loads in this Ray worker
        self.spec = Spec.model_validate(spec)
        self.rank, self.world, self.master = rank, world, master  # master: the controller's store
        zero_copy_tensors()  # what it returns to the driver
        self.cuda = torch.cuda.is_available()
        self.device = f"cuda:{torch.cuda.current_device()}" if self.cuda else "cpu"
        if not self.cuda:  # (vLLM runs in this process: its CPU build binds no threads here)
            torch.set_num_threads(threads)

    def shutdown(self) -> None:
        if self.agent is not None:
            self.agent.sandbox.close()
        if dist.is_initialized():
            dist.destroy_process_group()

    def start_engine(self, engine: str, videos: int = 0, sequences: int = 0) -> str:
        """The rollout engine; `videos`: the most videos a prompt holds (vLLM makes room for them);
        `sequences`: the most one rollout call gives it (vLLM's KV cache is sized to them on CPU)."""
        m, r = self.spec.worker.actor.model, self.spec.worker.rollout
        tok, processor = load_tokenizer(m, self.spec.data)
        eos = eos_ids(m.model_path, tok)
        if r.multi_turn.enable:  # observations in the prompts' own template (override included)
            workers = self.spec.worker.reward.num_cpus
            self.agent = episodes.Agent.of(r.multi_turn, self.spec.data, tok, processor, workers)
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

            self.engine = HFEngine(m.model_path, eos, tok.pad_token_id, torch_dtype(r.dtype), self.device)
        return self.engine.name

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
