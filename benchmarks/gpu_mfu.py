"""The actor update's speed on one GPU (issue #23): tokens/s and model FLOPs utilisation of its
forward and backward pass, through the trainer's own worker (FSDP2 world 1, fp32 weights and bf16
compute as EasyR1's default, packed rows with each group's prompt once, head.py's log-probs).

A micro-batch is one group: a 512-token prompt and 8 answers, sized to 8k, 16k or 32k tokens.
Model FLOPs count what the model must compute, not what checkpointing recomputes: 6 per parameter
per token for the decoder's matrices (2 forward, 4 backward), the output layer for answer tokens
only (the trainer computes logits there alone), and 12·layers·heads·head_dim per attending
query-key pair. MFU is against the GPU's dense bf16 peak (989 TFLOP/s for the H100 and H200).

EasyR1's anchor: an actor MFU of 16-26% (Qwen2.5-VL-7B, 8×H100); the goal is 40%.
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from pathlib import Path

import gpu_attention
import torch
from gpu import make_run, release, worker

SHAPES = {  # Qwen2.5's configs (hidden, layers, heads, kv heads, intermediate, vocabulary)
    "0.5B": (896, 24, 14, 2, 4864, 151936),
    "1.5B": (1536, 28, 12, 2, 8960, 151936),
    "7B": (3584, 28, 28, 4, 18944, 152064),  # its output layer is its own (not tied)
    "tiny": (64, 2, 2, 1, 128, 1000),
}
# 7B on one 80 GiB GPU: bf16 weights and AdamW's moments in bf16 (15 + 15 + 30 GiB), checkpointing
BIG = ["worker.actor.fsdp.torch_dtype=bf16", "worker.actor.optim.strategy=adamw_bf16"]
PEAK = {"H100": 989e12, "H200": 989e12, "A100": 312e12}
PROMPT, ANSWERS = 512, 8


def make_model(where: Path, shape: str) -> Path:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from tiny import make_tokenizer

    hidden, layers, heads, kv, inter, vocab = SHAPES[shape]
    if (where / "config.json").exists():
        return where
    make_tokenizer(where)
    config = Qwen2Config(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv, max_position_embeddings=65536,
        tie_word_embeddings=shape != "7B", rope_theta=1e6, torch_dtype="bfloat16",
    )  # fmt: skip
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with torch.device(device):
        torch.manual_seed(0)
        model = Qwen2ForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(str(where))
    del model
    release()
    return where


def flops(shape: str, prompt: int, answer: int, answers: int) -> float:
    hidden, layers, heads, kv, inter, vocab = SHAPES[shape]
    hd = hidden // heads
    per_layer = hidden * (hidden + 2 * kv * hd) + hidden * hidden + 3 * hidden * inter
    tokens = prompt + answers * answer
    pairs = prompt * (prompt + 1) // 2 + answers * (answer * prompt + answer * (answer + 1) // 2)
    return (
        6 * tokens * layers * per_layer
        + 6 * answers * answer * vocab * hidden
        + 12 * layers * heads * hd * pairs
    )


def batch(vocab: int, answer: int, prompt: int) -> list[dict]:
    g = torch.Generator().manual_seed(0)
    p = torch.randint(0, vocab, (prompt,), generator=g).tolist()
    micro = [
        {"seq": (p, torch.randint(0, vocab, (answer,), generator=g).tolist()), "old": None, "ref": None,
         "adv": 1.0 if i % 2 else -1.0}
        for i in range(ANSWERS)
    ]  # fmt: skip
    return [{"micro": [micro], "total": ANSWERS * answer}]


def _sync(cuda: bool) -> None:
    if cuda:
        torch.cuda.synchronize()


def measure(w, shape: str, tokens: int, cuda: bool, prompt: int, iters: int) -> dict:
    from tiny import shard

    answer = (tokens - prompt) // ANSWERS
    mb = batch(w.actor.config.vocab_size, answer, prompt)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    times = []
    try:
        for i in range(iters + 1):  # one warm-up
            _sync(cuda)
            t0 = time.perf_counter()
            w.update(*shard(mb), apply=False)  # forward and backward only: the gradients stay
            _sync(cuda)
            w.optim.zero_grad(set_to_none=True)
            if i:
                times.append(time.perf_counter() - t0)
        _sync(cuda)
        t0 = time.perf_counter()
        w.update(*shard(mb))  # with clipping and the optimizer's step
        _sync(cuda)
        whole = time.perf_counter() - t0
    except torch.OutOfMemoryError:
        w.optim.zero_grad(set_to_none=True)
        release()
        return {"tokens": tokens, "error": "out of memory"}
    seconds = sorted(times)[len(times) // 2]
    work = flops(shape, prompt, answer, ANSWERS)
    out = {
        "tokens": prompt + ANSWERS * answer,
        "fwd_bwd_s": seconds,
        "tokens_per_s": (prompt + ANSWERS * answer) / seconds,
        "tflops": work / seconds / 1e12,
        "update_s": whole,
    }
    if cuda:
        name = torch.cuda.get_device_name()
        peak = next((v for k, v in PEAK.items() if k in name), None)
        out["mfu"] = work / seconds / peak if peak else None
        out["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
    return out


def profile(w, tokens: int, prompt: int) -> list[str]:
    """Where one forward and backward pass spends its GPU time: the top kernels by self time."""
    from torch.profiler import ProfilerActivity, profile

    from tiny import shard

    mb = batch(w.actor.config.vocab_size, (tokens - prompt) // ANSWERS, prompt)
    w.update(*shard(mb), apply=False)
    w.optim.zero_grad(set_to_none=True)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        w.update(*shard(mb), apply=False)
        torch.cuda.synchronize()
    w.optim.zero_grad(set_to_none=True)
    table = prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=15, max_name_column_width=60)
    return ["```", *table.splitlines(), "```"]


def plan(cuda: bool, quick: bool, big: bool) -> list[tuple[str, bool, list[str], list[int], str]]:
    """(shape, gradient checkpointing, overrides, token budgets, attention) per worker to build:
    attention is the trainer's own (`segments`) or the flash varlen candidate (gpu_attention.py)."""
    if quick or not cuda:  # the same paths on a tiny model
        if big:
            return [("tiny", True, BIG, [64], "segments")]
        return [("tiny", c, [], [64], "segments") for c in (False, True)] + [
            ("tiny", False, [], [64], "varlen")
        ]
    if big:
        return [("7B", True, BIG, [8192, 16384, 32768], "segments")]
    budgets = [8192, 16384, 32768]
    runs = [(shape, c, [], budgets, "segments") for shape in ("0.5B", "1.5B") for c in (False, True)]
    return runs + [("1.5B", c, [], budgets, "varlen") for c in (False, True)]  # the candidate, whole


def run(report, work: Path, cuda: bool, quick: bool, big: bool = False) -> list[str]:
    from gpu_checks import _models

    from tinyrun import tiny_blueprint

    _, reward = _models(work)
    prompt = 16 if quick or not cuda else PROMPT
    lines = ["| model | checkpointing | tokens | fwd+bwd s | tokens/s | TFLOP/s | MFU | update s | peak GiB |",
             "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    profiled: list[str] = []
    results = []
    for shape, ckpt, extra, budgets, attention in plan(cuda, quick, big):
        model = make_model(work / f"mfu-{shape}", shape)
        over = [
            "trainer.n_gpus_per_node=1", "algorithm.disable_kl=true", "algorithm.use_kl_loss=false",
            f"worker.actor.model.enable_gradient_checkpointing={str(bool(ckpt)).lower()}",
            f"worker.actor.fsdp.mp_param_dtype={'bf16' if cuda else 'fp32'}", *extra,
        ]  # fmt: skip
        run_dir = make_run(
            work, f"mfu-{shape}-{ckpt}-{len(extra)}-{attention}", tiny_blueprint(model, reward), over
        )
        from r1cloud.spec import load_resolved

        w = worker(load_resolved(run_dir / "spec.yaml"))
        swap = (
            gpu_attention.attention_as(gpu_attention.varlen_in_model)
            if attention == "varlen"
            else nullcontext()
        )
        try:
            with swap:
                for tokens in budgets:
                    r = measure(w, shape, tokens, cuda, prompt, iters=1 if quick else 3)
                    label = shape + (" (bf16 weights, adamw_bf16)" if extra else "")
                    r.update(model=label + (", varlen attention" if attention == "varlen" else ""))
                    r.update(checkpointing=bool(ckpt))
                    results.append(r)
                    print(r, flush=True)
                if cuda and shape == "1.5B" and not ckpt:  # each attention's profile
                    profiled += [f"{shape}, 16k tokens, checkpointing off, {attention} attention:"]
                    profiled += profile(w, 16384, prompt)
        finally:
            w.shutdown()
            del w
            release()
    for r in results:
        if "error" in r:
            lines.append(
                f"| {r['model']} | {'on' if r['checkpointing'] else 'off'} | {r['tokens']} | {r['error']} | | | | | |"
            )
            continue
        mfu = f"{r['mfu']:.1%}" if r.get("mfu") else "—"
        lines.append(
            f"| {r['model']} | {'on' if r['checkpointing'] else 'off'} | {r['tokens']} | {r['fwd_bwd_s']:.3f} | "
            f"{r['tokens_per_s']:,.0f} | {r['tflops']:.1f} | {mfu} | {r['update_s']:.3f} | "
            f"{r.get('peak_gib', 0):.1f} |"
        )
    done = [r for r in results if "error" not in r]
    oom = [r for r in results if r.get("error") == "out of memory"]  # a measured limit, in the table
    report.check(
        f"actor update{' of a 7B' if big else ''} measured at every shape (forward + backward, then with the "
        "optimizer step)",
        done and len(done) + len(oom) == len(results) and all(r["tokens_per_s"] > 0 for r in done),
        f"{len(done)} of {len(results)} shapes ran, {len(oom)} out of memory; best MFU "
        + (
            f"{max(r['mfu'] for r in done if r.get('mfu')):.1%}" if any(r.get("mfu") for r in done) else "n/a"
        ),
    )
    return lines + (["", "Profiles, top kernels:", *profiled] if profiled else [])
