"""Ulysses sequence parallelism (DeepSpeed-Ulysses; EasyR1's `worker.*.ulysses_size`).

Groups of `ulysses_size` consecutive ranks get the same micro-batches (placement.rank_plan); each
runs one slice of the packed row. Around attention, which needs the whole sequence, an all-to-all
trades the slice's heads for all tokens' share of them and a second trades back. Each worker's
log-probs (or values) at its slice's response positions are summed across the group with an
identity backward pass, so every worker's loss (the same on each) sends the gradient into its own
slice only, and the group's gradients add up to one worker's on the whole row. A vision-language
model embeds the whole row on every worker and runs only its language model on the slice
(`sliced_language_model`), so the tower's gradients add up like the others' (docs/trainer.md).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class Group:
    group: object  # the process group
    size: int
    rank: int  # this worker's place in it: its slice of the row


def groups(world: int, size: int, rank: int) -> Group | None:
    """This worker's group of `size` consecutive ranks (a collective: every worker calls it with
    the same sizes, in the same order), or None without sequence parallelism."""
    if size <= 1:
        return None
    mine = None
    for start in range(0, world, size):
        g = dist.new_group(list(range(start, start + size)))
        if start <= rank < start + size:
            mine = Group(g, size, rank - start)
    return mine


def _all_to_all(x: torch.Tensor, group, scatter: int, gather: int) -> torch.Tensor:
    """Chunk j of dim `scatter` to rank j; the chunks received, in rank order, along `gather`."""
    k = dist.get_world_size(group)
    send = torch.stack([t.contiguous() for t in x.chunk(k, dim=scatter)])
    got = torch.empty_like(send)
    dist.all_to_all_single(got, send, group=group)
    return torch.cat(got.unbind(0), dim=gather)


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group, scatter: int, gather: int):
        ctx.meta = (group, scatter, gather)
        return _all_to_all(x, group, scatter, gather)

    @staticmethod
    def backward(ctx, grad):
        group, scatter, gather = ctx.meta
        return _all_to_all(grad, group, gather, scatter), None, None, None


class _SumAcross(torch.autograd.Function):
    """Forward: the sum over the group; backward: the identity (each worker's part is its own)."""

    @staticmethod
    def forward(ctx, x, group):
        x = x.clone()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def attention(inner, module, query, key, value, attention_mask, sp: Group, **kwargs):
    """`inner` (the packed attention: (1, H, N, D) in, (1, N, H, D) out) over the whole sequence,
    from and to this worker's slice of it: query (1, H, N/size, D) -> (1, N/size, H, D)."""
    heads, kv_heads = query.shape[1], key.shape[1]
    if heads % sp.size:  # validate says so from a local config
        raise ValueError(f"ulysses_size {sp.size} does not divide the model's {heads} attention heads")
    if kv_heads % sp.size:  # repeat_kv's order: query head h reads key head h // (heads // kv_heads)
        key, value = (x.repeat_interleave(heads // kv_heads, dim=1) for x in (key, value))
    q, k, v = (_AllToAll.apply(x, sp.group, 1, 2) for x in (query, key, value))
    out, weights = inner(module, q, k, v, attention_mask, **kwargs)
    return _AllToAll.apply(out, sp.group, 1, 2), weights


def gathered(local: torch.Tensor, mine: torch.Tensor, sp: Group) -> torch.Tensor:
    """The whole row's values (one per position of `mine`) from each worker's at its own
    positions (`mine` True), summed across the group."""
    whole = local.new_zeros(mine.shape[0]).index_put((mine.nonzero()[:, 0],), local)
    return _SumAcross.apply(whole, sp.group)


@contextmanager
def sliced_language_model(model, sp: Group):
    """While a VLM runs on a whole row: its language model gets this worker's slice of the embedded
    row and of its positions (and, for Qwen3-VL's deepstack, of the picture features its first
    layers add at the picture tokens)."""

    def cut(module, args, kwargs):
        embeds = kwargs["inputs_embeds"]
        n = embeds.shape[1] // sp.size
        lo, hi = sp.rank * n, (sp.rank + 1) * n
        kwargs.update(inputs_embeds=embeds[:, lo:hi], position_ids=kwargs["position_ids"][..., lo:hi])
        if (mask := kwargs.get("visual_pos_masks")) is not None:
            at = mask[0].nonzero()[:, 0]
            mine = (at >= lo) & (at < hi)
            kwargs["visual_pos_masks"] = mask[:, lo:hi]
            kwargs["deepstack_visual_embeds"] = [e[mine] for e in kwargs["deepstack_visual_embeds"]]
        return args, kwargs

    handle = model.get_decoder().register_forward_pre_hook(cut, with_kwargs=True)
    try:
        yield
    finally:
        handle.remove()
