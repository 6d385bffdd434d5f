"""`r1cloud eval` against a plain vLLM offline `generate` of the same prompts, in one run.

The work: the quickstart's 64 held-out questions (its format prompt and chat template), n samples
each at temperature 1, responses of at most --max-tokens, SmolLM2-135M-Instruct in fp32 on the CPU
build of vLLM. The peer is what a user would write by hand: one `LLM`, the prompts rendered the same
way, one `generate` call with `SamplingParams(n=…)`. r1cloud's eval runs the whole command (model
resolution, its child process, batches of the blueprint's val_batch_size, per-sample seeds, the
reward pool, samples.jsonl). Reported: generated tokens per second of each generation phase, of
each whole command (start to exit, model load included), and their ratios; eval's own split of
its loop between generating and scoring.

Usage: python benchmarks/eval_speed.py [--model .models/SmolLM2-135M-Instruct] [--n 8] [--max-tokens 32]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
BLUEPRINT = ROOT / "blueprints" / "quickstart.yaml"


def plain(model: str, n: int, max_tokens: int) -> None:
    """The peer, in its own process: prints {"tokens": …, "generate_s": …} as JSON."""
    import jinja2
    from transformers import AutoTokenizer
    from vllm import LLM, SamplingParams

    rows = [json.loads(x) for x in (ROOT / "data/arithmetic/test.jsonl").read_text().splitlines()]
    template = jinja2.Template((ROOT / "format_prompts/arithmetic.jinja").read_text().strip())
    tok = AutoTokenizer.from_pretrained(model)
    texts = [
        tok.apply_chat_template(
            [{"role": "user", "content": template.render(content=r["problem"])}],
            add_generation_prompt=True,
            tokenize=False,
        )
        for r in rows
    ]
    prompts = [{"prompt_token_ids": tok(t, add_special_tokens=False)["input_ids"]} for t in texts]
    llm = LLM(model=model, dtype="float32", max_model_len=160, enforce_eager=True, seed=1)
    tick = time.perf_counter()
    outs = llm.generate(prompts, SamplingParams(n=n, temperature=1.0, max_tokens=max_tokens), use_tqdm=False)
    seconds = time.perf_counter() - tick
    print(
        json.dumps(
            {"tokens": sum(len(o.token_ids) for out in outs for o in out.outputs), "generate_s": seconds}
        )
    )


def timed(cmd: list[str]) -> tuple[float, str]:
    tick = time.perf_counter()
    r = subprocess.run(
        cmd, capture_output=True, text=True, env={"VLLM_CPU_KVCACHE_SPACE": "1", **__import__("os").environ}
    )
    if r.returncode:
        raise SystemExit(f"{' '.join(cmd[:4])} failed:\n{r.stderr[-3000:]}")
    return time.perf_counter() - tick, r.stdout


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=str(ROOT / ".models/SmolLM2-135M-Instruct"))
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--plain", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.plain:
        plain(a.model, a.n, a.max_tokens)
        return
    peer_wall, out = timed([sys.executable, __file__, "--plain", "--model", a.model, "--n", str(a.n),
                            "--max-tokens", str(a.max_tokens)])  # fmt: skip
    peer = json.loads(
        next(x for x in out.splitlines() if x.startswith('{"tokens"'))
    )  # vLLM logs to stdout too
    with tempfile.TemporaryDirectory() as tmp:
        r1cloud = str(Path(sys.executable).parent / "r1cloud")
        eval_wall, out = timed([r1cloud, "eval", a.model, "--blueprint", str(BLUEPRINT), "--engine", "vllm",
                                "--n", str(a.n), "--temperature", "1", "--max-tokens", str(a.max_tokens),
                                "--json", "--out", f"{tmp}/eval"])  # fmt: skip
        target = json.loads(out)["targets"][0]
        tokens = sum(json.loads(x)["length"] for x in Path(target["samples"]).read_text().splitlines())
    timing = target["timing"]
    gen_peer, gen_eval = peer["tokens"] / peer["generate_s"], tokens / timing["generate_s"]
    loop_eval = tokens / (timing["generate_s"] + timing["score_s"])
    whole_peer, whole_eval = peer["tokens"] / peer_wall, tokens / eval_wall
    print(
        f"model {a.model} · 64 prompts × {a.n} samples · temperature 1 · ≤ {a.max_tokens} tokens · vLLM CPU, fp32"
    )
    print(f"plain vLLM generate   {peer['tokens']:6d} tokens  generate {peer['generate_s']:6.1f} s "
          f"({gen_peer:6.0f} tok/s)  whole {peer_wall:6.1f} s ({whole_peer:5.0f} tok/s)")  # fmt: skip
    print(f"r1cloud eval          {tokens:6d} tokens  generate {timing['generate_s']:6.1f} s "
          f"({gen_eval:6.0f} tok/s)  whole {eval_wall:6.1f} s ({whole_eval:5.0f} tok/s)")  # fmt: skip
    print(f"eval's loop: generate {timing['generate_s']:.1f} s, score and write {timing['score_s']:.1f} s "
          f"({loop_eval:.0f} tok/s)")  # fmt: skip
    print(f"ratio eval/plain: generation {gen_eval / gen_peer:.2f}×, generation + scoring "
          f"{loop_eval / gen_peer:.2f}×, whole command {whole_eval / whole_peer:.2f}×")  # fmt: skip


if __name__ == "__main__":
    main()
