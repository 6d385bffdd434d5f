"""Attention over a packed micro-batch, segment by segment, registered with transformers'
AttentionInterface as "r1cloud_packed".

A packed row holds many sequences; the sdpa path would score every token against every other
(an N×N mask, mostly masked out). Here the row is cut into segments: a whole sequence, or, when a
group's prompt is packed once, that prompt and each of its answers. A segment's queries see its
own earlier tokens and, for an answer, the whole shared prompt. All segments go through one
batched attention, padded to the longest (sdpa on GPU, grouped matmuls on CPU), so the work is
Σ queries × keys per segment instead of N².
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

NAME = "r1cloud_packed"


@dataclass
class Segments:
    q: torch.Tensor  # (S, Q) each segment's query tokens (index in the row; padding 0)
    kv: torch.Tensor  # (S, K) the tokens it attends to: its prompt's (an answer), then its own
    allowed: torch.Tensor  # (S, 1, Q, K) bool
    order: torch.Tensor  # (N,) where each row token sits among the segments' real queries
    positions: torch.Tensor  # (N,) position ids (for sliding windows)
    valid: torch.Tensor  # (S, Q) bool: real queries
    take: torch.Tensor  # (N,) where each row token's output sits among the (S × Q) flattened queries

    @classmethod
    def build(cls, segments: list[tuple[list[int], list[int]]], positions: list[int], device) -> Segments:
        """`segments`: (query tokens, keys before them) per segment; its keys are those, then
        its queries, causally."""
        segments = _pieces([(q, pre) for q, pre in segments if q])
        S = len(segments)
        Q = max(len(q) for q, _ in segments)
        K = max(len(q) + len(pre) for q, pre in segments)
        q_idx = torch.zeros(S, Q, dtype=torch.long)
        kv_idx = torch.zeros(S, K, dtype=torch.long)
        q_len, prefix = torch.zeros(S, 1, 1, dtype=torch.long), torch.zeros(S, 1, 1, dtype=torch.long)
        for s, (q, pre) in enumerate(segments):
            q_idx[s, : len(q)] = torch.tensor(q)
            kv_idx[s, : len(pre) + len(q)] = torch.tensor(pre + q)
            q_len[s], prefix[s] = len(q), len(pre)
        i = torch.arange(Q)[None, :, None]
        j = torch.arange(K)[None, None, :]
        pad_row = i >= q_len
        allowed = (j < prefix) | ((j - prefix <= i) & ~pad_row)
        allowed |= pad_row & (j == 0)  # a padding query sees one key: no NaN rows in the backward pass
        valid = ~pad_row[:, :, 0]
        real = q_idx[valid]  # every row token is a query of exactly one segment
        order = torch.empty_like(real)
        order[real] = torch.arange(len(real))
        take = torch.arange(S * Q).view(S, Q)[valid][order]
        tensors = (q_idx, kv_idx, allowed[:, None], order, torch.tensor(positions), valid, take)
        return cls(*(x.to(device) for x in tensors))


def _pieces(segments: list[tuple[list[int], list[int]]]) -> list[tuple[list[int], list[int]]]:
    """Segments cut into pieces of at most the median segment's queries (32 at least), each piece
    seeing the keys before it: every segment is padded to the longest, and one long prompt among
    short answers would pad them all to its length (docs/trainer.md)."""
    size = max(sorted(len(q) for q, _ in segments)[len(segments) // 2], 32)
    return [(q[a : a + size], pre + q[:a]) for q, pre in segments for a in range(0, len(q), size)]


def packed_attention(
    module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask,
    scaling: float | None = None,
    dropout: float = 0.0,
    sliding_window: int | None = None,
    r1cloud_segments: Segments | None = None,
    r1cloud_sp=None,
    **kwargs,
):
    """query (1, H, N, D), key/value (1, Hkv, N, D) -> (1, N, H, D), as transformers expects;
    with `r1cloud_sp` (a Ulysses group) N is this worker's slice of the row (ulysses.py)."""
    if r1cloud_sp is not None:
        from r1cloud.trainer.ulysses import attention

        return attention(
            packed_attention, module, query, key, value, attention_mask, r1cloud_sp,
            scaling=scaling, dropout=dropout, sliding_window=sliding_window, r1cloud_segments=r1cloud_segments,
        )  # fmt: skip
    seg = r1cloud_segments
    if seg is None:
        raise RuntimeError("r1cloud_packed attention needs the segments of a packed row (model.pack)")
    q, k, v = (_gather(x, idx) for x, idx in ((query, seg.q), (key, seg.kv), (value, seg.kv)))
    mask = seg.allowed
    if sliding_window:
        qpos, kpos = seg.positions[seg.q], seg.positions[seg.kv]
        mask = mask & ((qpos[:, :, None] - kpos[:, None, :]) < sliding_window)[:, None]
    dropout = dropout if module.training else 0.0
    if q.is_cuda:
        out = torch.nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=dropout, scale=scaling, enable_gqa=q.shape[1] != k.shape[1]
        )
    else:
        out = _grouped_attention(q, k, v, mask, scaling, dropout)
    S, H, Q, D = out.shape  # -> (1, N, H, D)
    return out.transpose(1, 2).reshape(S * Q, H, D).index_select(0, seg.take)[None], None


def _gather(x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """(1, H, N, D) at the row tokens `idx` (S, Q) -> (S, H, Q, D). Whole tokens are picked
    (index_select: its backward adds rows, faster on CPU than advanced indexing's)."""
    _, H, _, D = x.shape
    S, Q = idx.shape
    return x[0].transpose(0, 1).index_select(0, idx.flatten()).view(S, Q, H, D).transpose(1, 2)


def _grouped_attention(q, k, v, mask, scaling, dropout):
    """Softmax attention by plain matmuls, the query heads that share a key head stacked into one
    matmul (no repeated keys); fp32 softmax. On CPU, for these short segments, faster than sdpa's."""
    S, H, Q, D = q.shape
    Hk, K = k.shape[1], k.shape[2]
    G = H // Hk  # query heads per key head, in transformers' repeat_kv order
    scores = (q.reshape(S, Hk, G * Q, D) @ k.transpose(-1, -2)).view(S, Hk, G, Q, K)
    scores = scores * (D**-0.5 if scaling is None else scaling)
    weights = scores.masked_fill(~mask[:, :, None], float("-inf")).softmax(-1, dtype=torch.float32)
    weights = torch.nn.functional.dropout(weights, dropout) if dropout else weights
    return (weights.to(v.dtype).view(S, Hk, G * Q, K) @ v).view(S, H, Q, D)


def register() -> str:
    from transformers import AttentionInterface

    AttentionInterface.register(NAME, packed_attention)
    return NAME
