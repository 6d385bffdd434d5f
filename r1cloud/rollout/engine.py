"""Rollout engines behind one interface: `generate` n samples per prompt, `load_weights` from the
actor. `vllm` (in-process engine per worker) and `hf` (transformers generate) return the same
layout: responses cut after the first EOS, with their sampling log-probs."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field, fields


@dataclass(frozen=True)
class Sampling:
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_tokens: int = 512
    seed: int = 1
    ignore_eos: bool = False
    extra: dict = field(default_factory=dict)  # other vLLM SamplingParams fields (validation only)


# The extra fields the hf engine has, under transformers generate's names.
HF_EXTRA = {"min_p": "min_p", "repetition_penalty": "repetition_penalty", "min_tokens": "min_new_tokens"}


def hf_lacks(keys) -> list[str]:
    """The sampling fields among `keys` that the hf engine cannot apply."""
    own = {f.name for f in fields(Sampling)}
    return sorted(k for k in keys if k not in own and k not in HF_EXTRA)


def refuse_unknown_sampling(engine: str, val_override: dict) -> None:
    """A ValueError of one line when validation asks the hf engine for a vLLM-only field."""
    if engine == "hf" and (lacks := hf_lacks(val_override)):
        raise ValueError(
            f"worker.rollout.val_override_config: {', '.join(lacks)} is vLLM's only; the hf engine "
            "(transformers generate) has no equivalent: install vLLM, or remove it"
        )


@dataclass
class Request:
    """One prompt for an engine. With images or videos, vLLM takes `raw_ids` (one placeholder per
    image or video, which it expands) and the PIL `images` and `videos`' frames; the hf engine
    takes `ids` (expanded) and the processor's `image_inputs`."""

    ids: list[int]
    raw_ids: list[int] | None = None
    images: list = field(default_factory=list)
    image_inputs: dict = field(default_factory=dict)
    reset: dict | None = None  # an environment's episode: {"row", "around": (head, tail), "where"}
    videos: list = field(default_factory=list)  # video.Clip: vLLM takes the frames and their metadata


@dataclass
class Sample:
    prompt: int  # position of its prompt in the generate() call
    response: list[int]  # up to and including the first EOS
    logprobs: list[float]  # sampling log-probs of those tokens
    finished: bool  # ended on EOS (not cut at max_tokens)
    mask: list[int] | None = None  # a multi-turn episode's: 1 on the model's tokens, 0 on observations
    stats: dict | None = None  # a multi-turn episode's counts (agents/episodes.py STATS)
    prompt_ids: list[int] | None = None  # an episode's own prompt (its environment's reset added to it)
    reward: float | None = None  # an episode's environment reward
    images: list[dict] | None = None  # an episode's observations' pictures: processor tensors, in order


def cut_at_eos(
    tokens: list[int], logprobs: list[float], eos: set[int], forbidden: set[int] = frozenset()
) -> tuple[list[int], list[float], bool]:
    """The response up to and including its first EOS. A `forbidden` token (an image placeholder,
    which would have no image behind it in training) ends it just before, as unfinished. Cutting
    instead of biasing the sampler keeps the engine's log-probs those of the model."""
    for i, t in enumerate(tokens):
        if t in eos:
            return tokens[: i + 1], logprobs[: i + 1], True
        if t in forbidden:
            return tokens[:i], logprobs[:i], False
    return tokens, logprobs, False


def placeholder_ids(config) -> set[int]:
    """A model's picture and video placeholder tokens: one sampled into a response would have
    nothing behind it in training, so it ends the response (`cut_at_eos`'s `forbidden`)."""
    return {t for t in (getattr(config, f"{k}_token_id", None) for k in ("image", "video")) if t is not None}


def request_seed(base: int, prompt: int, sample: int) -> int:
    """Per-sample seeds: the same step draws the same tokens whatever the batch split."""
    return (base * 1_000_003 + prompt * 1_009 + sample) % (2**31 - 1)


def eos_ids(model_path: str, tokenizer) -> set[int]:
    """The tokens that end a response: the tokenizer's EOS and the generation config's."""
    from transformers import GenerationConfig

    eos = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    with contextlib.suppress(OSError):
        gen = GenerationConfig.from_pretrained(model_path).eos_token_id
        eos |= set(gen if isinstance(gen, list) else [gen]) - {None}
    return eos


def pick_engine(name: str) -> str:
    if name != "auto":
        return name
    try:
        import vllm  # noqa: F401
    except ImportError:
        return "hf"
    return "vllm"


VLLM_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # vLLM 0.32's choices of max_lora_rank


def vllm_max_rank(rank: int) -> int:
    """The smallest `max_lora_rank` vLLM takes that holds `rank` (validate refuses ranks above
    vLLM's largest for adapter syncs)."""
    return next(r for r in VLLM_RANKS if r >= rank)
