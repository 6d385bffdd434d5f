"""Checkpoint merge: r1cloud's streaming merge against (a) copying the same bytes on the same disk
(the disk's limit) and (b) a load-everything merge of the same checkpoint (what EasyR1's merger
does: every shard in memory, then write), each in its own process so peak RSS is its own.

The model is random, Qwen2.5-0.5B-shaped (494M parameters, fp32), saved as an r1cloud
(torch.distributed.checkpoint) checkpoint. Usage: python benchmarks/merge.py [--rounds 2] [--dir D]
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SHAPE = {
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "vocab_size": 151936,
}


def prepare(d: Path) -> int:
    import torch
    import torch.distributed.checkpoint as dcp
    from transformers import AutoModelForCausalLM, Qwen2Config

    config = Qwen2Config(**SHAPE, tie_word_embeddings=True, max_position_embeddings=4096)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    g = torch.Generator().manual_seed(0)
    state = {
        k: torch.randn(v.shape, generator=g) * 0.02
        for k, v in model.state_dict().items()
        if k != "lm_head.weight"
    }
    dcp.save({"model": state}, checkpoint_id=str(d / "global_step_1" / "actor"), no_dist=True)
    hf = d / "global_step_1" / "huggingface"
    hf.mkdir(parents=True)
    config.save_pretrained(hf)
    (d / "global_step_1" / "trainer_state.json").write_text('{"step": 1, "metrics": {}}')
    return sum(v.numel() for v in state.values())


def stream(d: Path, out: Path) -> None:
    import os

    from r1cloud.merge import DEFAULT_SHARD, merge_dcp

    out.mkdir()
    shard = int(os.environ.get("SHARD_BYTES", DEFAULT_SHARD))
    merge_dcp(
        str(d / "global_step_1" / "actor"), d / "global_step_1" / "huggingface", out, None, shard_bytes=shard
    )


def load_everything(d: Path, out: Path) -> None:
    import torch
    import torch.distributed.checkpoint as dcp
    from safetensors.torch import save_file
    from torch.distributed.checkpoint import FileSystemReader

    src = d / "global_step_1" / "actor"
    meta = FileSystemReader(str(src)).read_metadata().state_dict_metadata
    state = {
        k: torch.empty(m.size, dtype=m.properties.dtype) for k, m in meta.items() if k.startswith("model.")
    }
    dcp.load(state, checkpoint_id=str(src), no_dist=True)  # everything in memory at once
    out.mkdir()
    save_file({k.removeprefix("model."): v for k, v in state.items()}, str(out / "model.safetensors"))


def copy(d: Path, out: Path) -> None:
    shutil.copytree(d / "global_step_1" / "actor", out)


def rss_of(mode: str, d: Path, out: Path) -> float:
    """Peak RSS of a fresh process running `mode`: VmHWM, which exec resets (ru_maxrss does not:
    it would carry the parent's high-water mark)."""
    shutil.rmtree(out, ignore_errors=True)
    code = (
        f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); import merge as m; from pathlib import Path; "
        f"m.{mode}(Path({str(d)!r}), Path({str(out)!r})); "
        "print([l for l in open('/proc/self/status') if l.startswith('VmHWM')][0].split()[1])"
    )
    r = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    return int(r.stdout.strip().splitlines()[-1]) / 1024**2


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--dir", type=Path, default=None)
    parser.add_argument("--shard-mb", type=int, default=None, help="output shard size (default: r1cloud's)")
    args = parser.parse_args()
    import os

    from r1cloud.merge import DEFAULT_SHARD

    shard = args.shard_mb * 1024**2 if args.shard_mb else DEFAULT_SHARD
    os.environ["SHARD_BYTES"] = str(shard)
    base = Path(args.dir or tempfile.mkdtemp(prefix="r1cloud-merge-bench-"))
    base.mkdir(parents=True, exist_ok=True)
    src = base / "ckpt"
    if not (src / "global_step_1" / "trainer_state.json").exists():
        shutil.rmtree(src, ignore_errors=True)
        src.mkdir()
        code = f"import sys, json; sys.path.insert(0, {str(Path(__file__).parent)!r}); import merge as m; from pathlib import Path; print(m.prepare(Path({str(src)!r})))"
        n = int(
            subprocess.run(
                [sys.executable, "-c", code], check=True, capture_output=True, text=True
            ).stdout.split()[-1]
        )
        (base / "params.json").write_text(json.dumps({"params": n}))
    n = json.loads((base / "params.json").read_text())["params"]
    size = sum(p.stat().st_size for p in (src / "global_step_1" / "actor").iterdir())
    modes = ["copy", "stream", "load_everything"]
    times: dict[str, list[float]] = {m: [] for m in modes}
    for _ in range(args.rounds):
        for m in modes:  # alternating, so drift hits all three alike
            t = time.perf_counter()
            shutil.rmtree(base / m, ignore_errors=True)
            code = f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); import merge as b; from pathlib import Path; b.{m}(Path({str(src)!r}), Path({str(base / m)!r}))"
            subprocess.run([sys.executable, "-c", code], check=True)
            times[m].append(time.perf_counter() - t)
    rss = {m: rss_of(m, src, base / m) for m in modes}
    import torch

    print(
        f"merge benchmark: random Qwen2.5-0.5B-shaped model, {n / 1e6:.0f}M parameters, fp32, {size / 1024**3:.2f} GiB checkpoint"
    )
    print(
        f"python {platform.python_version()}, torch {torch.__version__}, {args.rounds} alternating rounds, output shards of {shard / 1024**2:.0f} MiB, dir {base}"
    )
    print(f"{'mode':18} {'median s':>9} {'GiB/s':>7} {'peak RSS GiB':>13}")
    for m in modes:
        med = statistics.median(times[m])
        print(f"{m:18} {med:9.2f} {size / 1024**3 / med:7.2f} {rss[m]:13.2f}")
    copy_t, stream_t, all_t = (statistics.median(times[m]) for m in modes)
    print(f"streaming merge throughput = {copy_t / stream_t:.2f}x a raw copy of the same bytes")
    print(
        f"streaming merge peak RSS = {rss['stream'] / rss['load_everything']:.2f}x the load-everything merge's ({rss['stream']:.2f} vs {rss['load_everything']:.2f} GiB)"
    )
    print(f"streaming merge time = {stream_t / all_t:.2f}x the load-everything merge's")
    if not args.dir:  # a folder of our own (several GiB): gone; one named with --dir is kept for reuse
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
