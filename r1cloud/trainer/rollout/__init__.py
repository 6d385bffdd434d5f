"""Rollout engines behind one interface: `generate` n samples per prompt, `load_weights` from the
actor. `vllm` (in-process engine per worker) and `hf` (transformers generate) return the same
layout: responses cut after the first EOS, with their sampling log-probs."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

import torch


@dataclass(frozen=True)
class Sampling:
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_tokens: int = 512
    seed: int = 1
    ignore_eos: bool = False


@dataclass
class Sample:
    prompt: int  # position of its prompt in the generate() call
    response: list[int]  # up to and including the first EOS
    logprobs: list[float]  # sampling log-probs of those tokens
    finished: bool  # ended on EOS (not cut at max_tokens)


class RolloutEngine(Protocol):
    name: str

    def generate(self, prompts: list[list[int]], sampling: Sampling) -> list[Sample]: ...

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None: ...


def cut_at_eos(
    tokens: list[int], logprobs: list[float], eos: set[int]
) -> tuple[list[int], list[float], bool]:
    for i, t in enumerate(tokens):
        if t in eos:
            return tokens[: i + 1], logprobs[: i + 1], True
    return tokens, logprobs, False


def request_seed(base: int, prompt: int, sample: int) -> int:
    """Per-sample seeds: the same step draws the same tokens whatever the batch split."""
    return (base * 1_000_003 + prompt * 1_009 + sample) % (2**31 - 1)


def pick_engine(name: str) -> str:
    if name != "auto":
        return name
    try:
        import vllm  # noqa: F401
    except ImportError:
        return "hf"
    return "vllm"
