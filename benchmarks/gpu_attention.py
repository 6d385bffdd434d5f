"""Packed attention for the actor's update, four ways, on the same packed rows (issue #23).

A packed row holds groups: each group's prompt once, then its G answers, which all attend to that
prompt (model.pack with share_prompts). The candidates, forward + backward on the same q, k, v:

- `segments`: what the trainer runs today (attention.py): each segment gathered and padded to the
  longest, one sdpa call with a boolean mask. A boolean mask rules out sdpa's flash kernel.
- `flex`: FlexAttention over the row as it is, with a block mask that lets an answer see its own
  earlier tokens and its group's prompt (no gathering, no padding; compiled by torch.compile).
- `varlen`: torch's flash varlen kernel, each segment's keys gathered (the prompt's keys copied
  once per answer), causal aligned to the bottom right, no padding, no mask.
- `varlen-unshared`: each sequence whole (prompt + answer, the prompt repeated G times in the row):
  what transformers' own packed path (position ids restarting per sequence, flash varlen) does.
  More tokens in the row, so more work for every other layer too; reported for its attention only.

Each is checked against a float32 reference computed segment by segment (the unshared one against
the same reference on its answers and first prompt copy). Shapes are Qwen2.5-1.5B's attention
(12 query heads, 2 key heads, head size 128); rows are `groups` groups of `prompt` + G × `response`.
"""

from __future__ import annotations

import contextlib
import inspect
import time
import warnings
from pathlib import Path

import torch

from r1cloud.trainer.attention import Segments, packed_attention


def row(groups: int, prompt: int, response: int, g: int):
    """The trainer's segments for such a row: (query token indices, prompt indices before them)."""
    segments, at = [], 0
    for _ in range(groups):
        shared = list(range(at, at + prompt))
        segments.append((shared, []))
        at += prompt
        for _ in range(g):
            segments.append((list(range(at, at + response)), shared))
            at += response
    return segments, at


def reference(q, k, v, segments, scale) -> torch.Tensor:
    """(N, H, D) in float64, one segment at a time: queries see the keys before them and their own
    earlier tokens."""
    out = torch.empty(q.shape[0], q.shape[1], q.shape[2], dtype=torch.float64, device=q.device)
    rep = q.shape[1] // k.shape[1]
    for qi, pre in segments:
        kv = torch.tensor(pre + qi, device=q.device)
        qs = q[torch.tensor(qi, device=q.device)].double().transpose(0, 1)  # (H, Q, D)
        ks = k[kv].double().repeat_interleave(rep, 1).transpose(0, 1)
        vs = v[kv].double().repeat_interleave(rep, 1).transpose(0, 1)
        allowed = torch.ones(len(qi), len(kv), dtype=torch.bool, device=q.device).tril(len(pre))
        scores = (qs @ ks.transpose(-1, -2)) * scale
        w = scores.masked_fill(~allowed, float("-inf")).softmax(-1)
        out[torch.tensor(qi, device=q.device)] = (w @ vs).transpose(0, 1)
    return out


class _Training(torch.nn.Module):
    training = True


def run_segments(q, k, v, seg: Segments, scale):
    """attention.py as the model calls it: (1, H, N, D) in, (1, N, H, D) out."""
    out, _ = packed_attention(
        _Training(), q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
        None, scaling=scale, r1cloud_segments=seg,
    )  # fmt: skip
    return out[0]


def flex_mask(segments, n: int, device):
    """FlexAttention's block mask for the row: causal, within a segment or into its group's prompt."""
    from torch.nn.attention.flex_attention import create_block_mask

    owner = torch.empty(n, dtype=torch.int32)
    prompt_of = torch.full((n,), -1, dtype=torch.int32)  # a query's prompt segment (-1: none)
    is_prompt = torch.zeros(n, dtype=torch.bool)
    first = {}
    for s, (qi, pre) in enumerate(segments):
        owner[qi] = s
        if pre:
            prompt_of[qi] = first[pre[0]]
        else:
            first[qi[0]] = s
            is_prompt[qi] = True
    owner, prompt_of, is_prompt = owner.to(device), prompt_of.to(device), is_prompt.to(device)

    def mask_mod(b, h, qi, ki):
        mine = owner[qi] == owner[ki]
        shared = (prompt_of[qi] == owner[ki]) & is_prompt[ki]
        return (ki <= qi) & (mine | shared)

    # compiled on a GPU: uncompiled, it would evaluate the mask at all N² pairs at once
    compiled = {"_compile": True} if torch.device(device).type == "cuda" else {}
    return create_block_mask(mask_mod, None, None, n, n, device=device, **compiled)


_FLEX = {}


def run_flex(q, k, v, mask, scale):
    from torch.nn.attention.flex_attention import flex_attention

    if q.is_cuda and "fn" not in _FLEX:
        _FLEX["fn"] = torch.compile(flex_attention, dynamic=False)
    fn = _FLEX.get("fn", flex_attention)
    with warnings.catch_warnings():  # on CPU: uncompiled, which it says each time
        warnings.simplefilter("ignore", UserWarning)
        out = fn(
            q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
            block_mask=mask, scale=scale, enable_gqa=q.shape[1] != k.shape[1],
        )  # fmt: skip
    return out[0].transpose(0, 1)


def varlen_inputs(segments, device):
    """Each segment's keys (its prompt's, then its own), and the cumulative lengths."""
    kv = torch.tensor([i for qi, pre in segments for i in pre + qi], device=device)
    q_lens = [len(qi) for qi, _ in segments]
    k_lens = [len(qi) + len(pre) for qi, pre in segments]

    def cu(lens):
        return torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device=device)

    return kv, cu(q_lens), cu(k_lens), max(q_lens), max(k_lens)


def run_varlen(q, k, v, inputs, scale):
    kv, cu_q, cu_k, max_q, max_k = inputs
    return varlen_kernel(q, k[kv], v[kv], cu_q, cu_k, max_q, max_k, scale)


def varlen_kernel(q, keys, values, cu_q, cu_k, max_q: int, max_k: int, scale):
    """torch.nn.attention.varlen.varlen_attn on CUDA, causal from the bottom right (a query sees
    the keys before its segment and its own earlier tokens); elsewhere the same function segment by
    segment, which checks the indexing around it on CPU. varlen_attn's keywords differ between
    torch releases; flash takes fewer key heads than query heads as they are, and a release that
    says otherwise gets them repeated."""
    if not q.is_cuda:
        return _varlen_reference(q, keys, values, cu_q, cu_k, scale)
    from torch.nn.attention.varlen import varlen_attn

    params = inspect.signature(varlen_attn).parameters
    kw = {"scale": scale} if "scale" in params else {}
    kw.update({"window_size": (-1, 0)} if "window_size" in params else {"is_causal": True})
    if "enable_gqa" in params and q.shape[1] != keys.shape[1]:
        kw["enable_gqa"] = True
    try:
        return varlen_attn(q, keys, values, cu_q, cu_k, max_q, max_k, **kw)
    except RuntimeError:
        if q.shape[1] == keys.shape[1]:
            raise
        rep = q.shape[1] // keys.shape[1]
        keys, values = keys.repeat_interleave(rep, 1), values.repeat_interleave(rep, 1)
        return varlen_attn(q, keys, values, cu_q, cu_k, max_q, max_k, **kw)


def _varlen_reference(q, keys, values, cu_q, cu_k, scale):
    rep = q.shape[1] // keys.shape[1]
    out = []
    for s in range(len(cu_q) - 1):
        qs = q[cu_q[s] : cu_q[s + 1]].transpose(0, 1)
        ks = keys[cu_k[s] : cu_k[s + 1]].repeat_interleave(rep, 1).transpose(0, 1)
        vs = values[cu_k[s] : cu_k[s + 1]].repeat_interleave(rep, 1).transpose(0, 1)
        n_q, n_k = qs.shape[1], ks.shape[1]
        allowed = torch.ones(n_q, n_k, dtype=torch.bool, device=q.device).tril(n_k - n_q)
        w = ((qs @ ks.transpose(-1, -2)) * scale).masked_fill(~allowed, float("-inf")).softmax(-1)
        out.append((w @ vs).transpose(0, 1))
    return torch.cat(out)


def varlen_in_model(module, query, key, value, attention_mask, scaling=None, dropout=0.0, sliding_window=None,
                    r1cloud_segments=None, **kwargs):  # fmt: skip
    """attention.py's interface (the trainer's Segments) through varlen_kernel: what the trainer
    would run on CUDA if this candidate wins. (1, H, N, D) in, (1, N, H, D) out."""
    if sliding_window or dropout:
        raise NotImplementedError("the varlen candidate has no sliding window or dropout")
    seg = r1cloud_segments
    rows = torch.arange(seg.q.shape[0], device=seg.q.device)
    q_len = seg.valid.sum(1)
    k_len = seg.allowed[rows, 0, q_len - 1].sum(-1)  # the keys a segment's last query sees: all of them
    kv = seg.kv[torch.arange(seg.kv.shape[1], device=seg.kv.device)[None] < k_len[:, None]]
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5

    def cu(lengths):
        return torch.nn.functional.pad(lengths.cumsum(0), (1, 0)).to(torch.int32)

    out = varlen_kernel(
        query[0][:, seg.q[seg.valid]].transpose(0, 1), key[0][:, kv].transpose(0, 1),
        value[0][:, kv].transpose(0, 1), cu(q_len), cu(k_len), int(q_len.max()), int(k_len.max()), scale,
    )  # fmt: skip
    return out[seg.order][None], None


@contextlib.contextmanager
def attention_as(fn):
    """The trainer's packed attention name served by `fn` for the block (models built before it
    included: transformers looks the function up at each forward pass)."""
    from transformers import AttentionInterface

    from r1cloud.trainer.attention import NAME

    AttentionInterface.register(NAME, fn)
    try:
        yield
    finally:
        AttentionInterface.register(NAME, packed_attention)


def in_model(device: str) -> dict:
    """The varlen candidate inside a model: packed log-probs (shared prompts) through it against the
    trainer's segment attention, on a tiny Qwen2. On CPU both in fp32; on CUDA (flash has no fp32)
    both in bf16, each against the segment attention in fp32."""
    import tempfile

    from transformers import AutoModelForCausalLM

    from r1cloud.trainer.attention import register
    from r1cloud.trainer.model import packed_log_probs
    from tiny import make_tiny_model

    folder = make_tiny_model(Path(tempfile.mkdtemp()) / "tiny", layers=2)
    g = torch.Generator().manual_seed(1)
    seqs = []
    for _ in range(3):
        prompt = torch.randint(0, 300, (int(torch.randint(5, 20, (1,), generator=g)),), generator=g).tolist()
        seqs += [(prompt, torch.randint(0, 300, (int(torch.randint(2, 15, (1,), generator=g)),), generator=g).tolist())
                 for _ in range(4)]  # fmt: skip

    def log_probs(dtype, varlen: bool):
        model = AutoModelForCausalLM.from_pretrained(folder, attn_implementation=register(), dtype=dtype)
        model = model.to(device).eval()
        with torch.no_grad(), attention_as(varlen_in_model) if varlen else contextlib.nullcontext():
            return packed_log_probs(model, seqs, 1.0, device)

    def gap(a, b):
        return max(float((x.double() - y.double()).abs().max()) for x, y in zip(a, b, strict=True))

    reference = log_probs(torch.float32, varlen=False)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    return {
        "dtype": str(dtype)[6:],
        "varlen_vs_fp32": gap(log_probs(dtype, varlen=True), reference),
        "segments_vs_fp32": gap(log_probs(dtype, varlen=False), reference),
    }


def _time(fn, q, k, v, iters: int, backward: bool = True) -> tuple[float, torch.Tensor]:
    """Median seconds of forward + backward, and the output of the last forward."""
    times = []
    for i in range(iters + 2):  # two warm-ups (compilation, autotuning)
        for x in (q, k, v):
            x.grad = None
        if q.is_cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = fn(q, k, v)
        if backward:
            out.backward(_GRAD[0][: out.shape[0]])
        if q.is_cuda:
            torch.cuda.synchronize()
        if i >= 2:
            times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2], out.detach()


_GRAD: list[torch.Tensor] = []


def pairs(segments) -> int:
    """Query-key pairs that attend (causal, with the shared prompt)."""
    return sum(len(qi) * len(pre) + len(qi) * (len(qi) + 1) // 2 for qi, pre in segments)


def measure(groups, prompt, response, g, dtype, device, heads=12, kv_heads=2, dim=128, iters=5) -> dict:
    """One shape: each candidate's error against the reference, its time and achieved TFLOP/s."""
    torch.manual_seed(0)
    segments, n = row(groups, prompt, response, g)
    scale = dim**-0.5
    q, k, v = (torch.randn(n, h, dim, device=device, dtype=dtype) for h in (heads, kv_heads, kv_heads))
    ref = reference(q, k, v, segments, scale)
    # forward 4·H·D per pair (two matmuls); backward 2.5× that, as flash-attention counts it
    flops = 3.5 * 4 * heads * dim * pairs(segments)
    # each candidate's preparation per packed row (what a micro-batch would pay), then its kernel
    prepare = {
        "segments": lambda: (lambda q, k, v, s=Segments.build(segments, list(range(n)), device): run_segments(
            q, k, v, s, scale)),
        "flex": lambda: (lambda q, k, v, m=flex_mask(segments, n, device): run_flex(q, k, v, m, scale)),
    }  # fmt: skip
    if q.is_cuda:
        prepare["varlen"] = lambda: (
            lambda q, k, v, i=varlen_inputs(segments, device): run_varlen(q, k, v, i, scale)
        )
    result = {"shape": f"{groups}×({prompt} + {g}×{response})", "tokens": n, "dtype": str(dtype)[6:]}
    for name, make in prepare.items():
        # FlexAttention has no backward pass on CPU: its mask is checked forward only there
        backward = q.is_cuda or name != "flex"
        leaves = [x.detach().clone().requires_grad_(backward) for x in (q, k, v)]
        _GRAD[:] = [torch.randn_like(leaves[0])]
        try:
            t0 = time.perf_counter()
            fn = make()
            if q.is_cuda:
                torch.cuda.synchronize()
            prep = time.perf_counter() - t0
            seconds, out = _time(fn, *leaves, iters, backward)
        except torch.OutOfMemoryError:
            result[name] = {"error": "out of memory"}
            torch.cuda.empty_cache()
            continue
        except Exception as e:  # a candidate this torch cannot run: said, not fatal
            result[name] = {"error": f"{type(e).__name__}: {str(e)[:160]}"}
            continue
        err = float((out.double() - ref).norm() / ref.norm())
        result[name] = {
            "ms": seconds * 1e3,
            "tflops": flops / seconds / 1e12,
            "rel_err": err,
            "prep_ms": prep * 1e3,
        }
    if q.is_cuda:
        result["varlen-unshared"] = _unshared(
            groups, prompt, response, g, dtype, device, heads, kv_heads, dim, iters
        )
    return result


def _unshared(groups, prompt, response, g, dtype, device, heads, kv_heads, dim, iters) -> dict:
    """Each sequence whole, its prompt repeated: the time, and the error on the first sequence."""
    length = prompt + response
    whole = [(list(range(s, s + length)), []) for s in range(0, groups * g * length, length)]
    m = len(whole) * length
    qq, kk, vv = (torch.randn(m, h, dim, device=device, dtype=dtype) for h in (heads, kv_heads, kv_heads))
    leaves = [x.requires_grad_(True) for x in (qq, kk, vv)]
    _GRAD[:] = [torch.randn_like(qq)]
    inputs, scale = varlen_inputs(whole, device), dim**-0.5
    try:
        seconds, out = _time(lambda q, k, v: run_varlen(q, k, v, inputs, scale), *leaves, iters)
    except Exception as e:  # as above
        return {"error": f"{type(e).__name__}: {str(e)[:160]}"}
    ref = reference(qq.detach(), kk.detach(), vv.detach(), whole[:1], scale)[:length]
    return {
        "ms": seconds * 1e3,
        "tflops": 3.5 * 4 * heads * dim * pairs(whole) / seconds / 1e12,
        "rel_err": float((out[:length].double() - ref).norm() / ref.norm()),
        "tokens": m,
    }


SHAPES = [(2, 512, 2048, 8), (1, 512, 4096, 8), (1, 512, 8192, 8)]
QUICK = [(2, 24, 40, 3)]


def run(quick: bool, device: str) -> list[dict]:
    dtypes = [torch.float32] if device == "cpu" else [torch.bfloat16]
    shapes = QUICK if quick else SHAPES
    small = dict(heads=4, kv_heads=2, dim=16, iters=1) if quick else {}
    return [measure(*shape, dtype, device, **small) for shape in shapes for dtype in dtypes]


def table(results: list[dict]) -> list[str]:
    names = ["segments", "flex", "varlen", "varlen-unshared"]
    lines = ["| row | tokens | " + " | ".join(names) + " |", "|---|---|" + "---|" * len(names)]
    for r in results:
        cells = []
        for name in names:
            c = r.get(name)
            if c is None:
                cells.append("—")
            elif "error" in c:
                cells.append(c["error"][:40])
            else:
                prep = f" (+{c['prep_ms']:.1f} ms to prepare)" if "prep_ms" in c else ""
                cells.append(f"{c['ms']:.2f} ms{prep}, {c['tflops']:.0f} TF/s, err {c['rel_err']:.1e}")
        lines.append(f"| {r['shape']} {r['dtype']} | {r['tokens']} | " + " | ".join(cells) + " |")
    return lines


if __name__ == "__main__":
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # tiny.py
    print("\n".join(table(run("--quick" in sys.argv, "cuda" if torch.cuda.is_available() else "cpu"))))
