"""Model-side tensor work: padding-free packing and log-probs of response tokens.

Packing puts a micro-batch's sequences end to end in one row with position ids restarting at 0
per sequence and `attention_mask=None, use_cache=False`: transformers then builds a block-diagonal
causal mask (sdpa/eager on CPU, varlen flash-attention on GPU). With a cache or a 2-D mask it
silently lets sequences attend across boundaries (reference §4), hence both are forced here.
Only the positions that predict response tokens go through the LM head (`logits_to_keep`).

A model loaded with attention.py's implementation (the workers load theirs so where the model
allows) attends segment by segment instead of through an N×N mask, and its prompts are shared:
sequences with the same prompt (a GRPO group) hold one copy of it, each response following it
with positions continuing from its end and attending to that prompt and to itself only. A causal
model computes a prompt's states without looking past it, so every log-prob is the one a copy
per sequence gives, and the backward pass sums the group's gradients through the one copy: a
group of n answers to a P-token prompt costs P + Σ len(answer) tokens instead of
n·P + Σ len(answer).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import torch

from .attention import NAME, Segments
from .head import head_log_probs, scaled

# model types whose logits are exactly the last hidden states times the output weight (no
# soft-capping, scaling or bias after it): their log-probs skip the full logits (head.py)
PLAIN_HEADS = {
    "llama", "mistral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "qwen2_vl", "qwen2_5_vl", "phi3",
}  # fmt: skip


@dataclass
class Packed:
    input_ids: torch.Tensor  # (1, N)
    position_ids: torch.Tensor  # (1, N)
    keep: torch.Tensor  # (Σ resp,) positions whose logits predict a response token, in input order
    targets: torch.Tensor  # (Σ resp,) those response tokens
    lengths: list[int]  # response length per sequence
    segments: Segments | None  # with share_prompts: what each token attends to


def pack(
    seqs: list[tuple[list[int], list[int]]], device: str | torch.device = "cpu", share_prompts: bool = False
) -> Packed:
    families: dict[tuple, list[int]] = {}  # one laid-out prompt → the sequences that follow it
    for i, (prompt, _) in enumerate(seqs):
        families.setdefault(tuple(prompt) if share_prompts else (i,), []).append(i)
    ids: list[int] = []
    pos: list[int] = []
    segments: list[tuple[list[int], list[int]]] = []  # (query tokens, the prompt's tokens before them)
    keep: list[list[int]] = [[] for _ in seqs]
    for members in families.values():
        prompt = seqs[members[0]][0]
        start = len(ids)
        shared = list(range(start, start + len(prompt)))
        ids += prompt
        pos += range(len(prompt))
        if len(members) > 1:
            segments.append((shared, []))
        for i in members:
            response = seqs[i][1]
            own = list(range(len(ids), len(ids) + len(response)))
            keep[i] = [shared[-1], *own[:-1]][: len(response)]  # the token before each response token
            ids += response
            pos += range(len(prompt), len(prompt) + len(response))
            segments.append((own, shared) if len(members) > 1 else (shared + own, []))

    def t(x):
        return torch.tensor(x, dtype=torch.long, device=device)

    return Packed(
        t(ids)[None],
        t(pos)[None],
        t([x for k in keep for x in k]),
        t([x for _, r in seqs for x in r]),
        [len(r) for _, r in seqs],
        Segments.build(segments, pos, device) if share_prompts else None,
    )


def uses_segments(model) -> bool:
    """Whether the model attends through attention.py (then its prompts can be shared)."""
    return getattr(model.config, "_attn_implementation", None) == NAME


def _forward(model, p: Packed, **kwargs):
    extra = {"r1cloud_segments": p.segments} if p.segments is not None else {}
    return model(
        input_ids=p.input_ids,
        position_ids=p.position_ids,
        attention_mask=None,
        use_cache=False,
        **extra,
        **kwargs,
    )


def plain_head(model) -> torch.nn.Module | None:
    """The output layer when its logits can go through head.py, else None."""
    head = model.get_output_embeddings()
    plain = model.config.model_type in PLAIN_HEADS and getattr(head, "bias", None) is None
    return head if plain and isinstance(head, torch.nn.Linear) else None


@contextmanager
def _hidden_states_out(head: torch.nn.Module):
    """The model returns its last hidden states (at `logits_to_keep`) where it would return logits.
    Its forward still runs whole, so FSDP's hooks on the root module gather and reduce as usual."""
    head.forward = lambda hidden: hidden  # shadows the class's forward for this call only
    try:
        yield
    finally:
        del head.forward


def token_log_probs(logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """log softmax(logits / T)[target], in fp32, without materialising the full log-softmax."""
    logits = scaled(logits, temperature)
    return logits.gather(-1, targets[:, None])[:, 0] - torch.logsumexp(logits, dim=-1)


def entropy_from_logits(logits: torch.Tensor, temperature: float = 1.0, chunk: int = 1024) -> torch.Tensor:
    """Entropy of softmax(logits / T) per row: logsumexp(z) − Σ softmax(z)·z, in fp32 chunks of
    rows so only one chunk's full-vocabulary softmax exists at a time."""
    out = []
    for part in torch.split(logits, chunk):
        z = scaled(part, temperature)
        out.append(torch.logsumexp(z, dim=-1) - (torch.softmax(z, dim=-1) * z).sum(-1))
    return torch.cat(out) if out else logits.new_zeros(0, dtype=torch.float32)


def packed_log_probs(
    model,
    seqs: list[tuple[list[int], list[int]]],
    temperature: float,
    device="cpu",
    entropy: bool = False,
    entropy_grad: bool = False,
):
    """Per-sequence log-probs of the response tokens under `model` (grad flows if enabled); with
    `entropy`, also the per-token entropy of the sampling distribution: (log-probs, entropies).
    The entropy carries a gradient only with `entropy_grad` (an entropy bonus): otherwise its
    full-vocabulary softmax would be kept for the backward pass for nothing. A model attending
    through attention.py gets each prompt once."""
    p = pack(seqs, device, uses_segments(model))
    head = plain_head(model)
    if head is not None:
        with _hidden_states_out(head):
            hidden = _forward(model, p, logits_to_keep=p.keep).logits[0]
        # read after the forward pass: under FSDP the head's weight is then the gathered one
        logp, ent = head_log_probs(hidden, head.weight, p.targets, temperature, entropy_grad)
        logp, ent = list(torch.split(logp, p.lengths)), list(torch.split(ent, p.lengths))
        return (logp, ent) if entropy else logp
    out = _forward(model, p, logits_to_keep=p.keep)
    logp = list(torch.split(token_log_probs(out.logits[0], p.targets, temperature), p.lengths))
    if not entropy:
        return logp
    with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
        ent = entropy_from_logits(out.logits[0], temperature)
    return logp, list(torch.split(ent, p.lengths))


def packed_values(critic, seqs: list[tuple[list[int], list[int]]], device="cpu") -> list[torch.Tensor]:
    """A value head's (token classification, one label) estimate at each position that predicts a
    response token, per sequence: the same positions the actor's log-probs come from."""
    p = pack(seqs, device, uses_segments(critic))
    out = _forward(critic, p)
    return list(torch.split(out.logits[0, p.keep, 0].float(), p.lengths))


def pad(
    rows: list[torch.Tensor | list[float]], width: int | None = None, value: float = 0.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Ragged rows -> (B, T) values and mask."""
    rows = [r if isinstance(r, torch.Tensor) else torch.tensor(r, dtype=torch.float32) for r in rows]
    width = width or max((len(r) for r in rows), default=0)
    values = torch.full((len(rows), width), value, dtype=rows[0].dtype if rows else torch.float32)
    mask = torch.zeros(len(rows), width)
    out = []
    for i, r in enumerate(rows):
        mask[i, : len(r)] = 1
        out.append(torch.nn.functional.pad(r, (0, width - len(r)), value=value))
    values = torch.stack(out) if out else values
    return values, mask
