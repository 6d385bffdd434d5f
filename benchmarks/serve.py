"""Serving throughput: `r1cloud serve` (vLLM engine, and the transformers fallback) answering
concurrent requests, against a plain transformers `generate` loop over the same prompts, in one run.

Every engine produces exactly --tokens new tokens per prompt (EOS ignored), greedy, so the work is
equal; start-up is excluded. Prints generated tokens/s and each as a ratio to the generate loop.
Usage: python benchmarks/serve.py [--model .models/SmolLM2-135M-Instruct] [--prompts 16] [--tokens 64]
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
R1CLOUD = str(Path(sys.executable).parent / "r1cloud")


def prompts(n: int) -> list[str]:
    return [f"Explain step by step what {i} times {i + 3} is, then check the result." for i in range(n)]


def generate_loop(model_dir: str, texts: list[str], tokens: int) -> float:
    """Tokens/s of `model.generate` one prompt at a time: what a script without a server does."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).eval()
    chats = [
        tok.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True, tokenize=False)
        for t in texts
    ]
    model.generate(**tok(chats[0], return_tensors="pt"), max_new_tokens=4)  # warm-up
    start, produced = time.perf_counter(), 0
    with torch.no_grad():
        for c in chats:
            ids = tok(c, return_tensors="pt", add_special_tokens=False)
            out = model.generate(**ids, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False)
            produced += out.shape[1] - ids["input_ids"].shape[1]
    return produced / (time.perf_counter() - start)


def served(model_dir: str, engine: str, texts: list[str], tokens: int, home: str) -> float:
    """Tokens/s of r1cloud serve answering all prompts at once through the openai client."""
    from openai import OpenAI

    from r1cloud.serving.serve import free_port

    port = free_port()
    env = {**os.environ, "R1CLOUD_HOME": home, "VLLM_CPU_KVCACHE_SPACE": "2"}
    name = f"bench-{engine}"
    extra = ["--", "--dtype", "bfloat16"] if engine == "vllm" else []
    r = subprocess.run(
        [
            R1CLOUD,
            "serve",
            "-c",
            model_dir,
            "--port",
            str(port),
            "--engine",
            engine,
            "--name",
            name,
            "-d",
            *extra,
        ],
        capture_output=True,
        text=True,
        env=env,
    )
    if r.returncode != 0:
        raise SystemExit(f"r1cloud serve failed:\n{r.stdout}\n{r.stderr}")
    try:
        client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=3600)
        model = client.models.list().data[0].id

        def one(text: str) -> int:
            reply = client.chat.completions.create(
                model=model,
                messages=[{"role": "user", "content": text}],
                max_tokens=tokens,
                temperature=0,
                extra_body={"ignore_eos": True, "min_tokens": tokens} if engine == "vllm" else {},
            )
            return reply.usage.completion_tokens

        one(texts[0])  # warm-up
        start = time.perf_counter()
        with ThreadPoolExecutor(len(texts)) as pool:
            produced = sum(pool.map(one, texts))
        return produced / (time.perf_counter() - start)
    finally:
        subprocess.run([R1CLOUD, "stop", name], capture_output=True, env=env)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default=str(ROOT / ".models/SmolLM2-135M-Instruct"))
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--engines", default="vllm,transformers")
    args = parser.parse_args()
    if not Path(args.model, "config.json").exists():
        raise SystemExit(
            f"{args.model} is not a model folder: run `python -m r1cloud.offline {args.model}` first"
        )
    import torch
    import transformers

    texts = prompts(args.prompts)
    print(f"model {args.model} · {args.prompts} prompts × {args.tokens} new tokens · greedy, bf16")
    print(
        f"python {platform.python_version()} · torch {torch.__version__} · transformers {transformers.__version__}"
    )
    print(f"machine {platform.machine()} · {os.cpu_count()} cores")
    base = generate_loop(args.model, texts, args.tokens)
    print(f"{'generate loop (batch 1)':44} {base:8.1f} tok/s   1.00x")
    with tempfile.TemporaryDirectory() as home:
        for engine in args.engines.split(","):
            rate = served(args.model, engine, texts, args.tokens, home)
            label = f"r1cloud serve ({engine}, {args.prompts} concurrent)"
            print(f"{label:44} {rate:8.1f} tok/s   {rate / base:.2f}x")


if __name__ == "__main__":
    main()
