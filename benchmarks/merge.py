"""Checkpoint merge: r1cloud's streaming merge against (a) copying the same bytes on the same disk
(the disk's limit) and (b) a load-everything merge of the same checkpoint (what EasyR1's merger
does: every shard in memory, then write), each in its own process so peak RSS is its own.

The model is random, Qwen2.5-0.5B-shaped (494M parameters, fp32), saved as an r1cloud
(torch.distributed.checkpoint) checkpoint. Each mode is timed inside its process, after its
imports (torch, torch.distributed.checkpoint), up to its output synced to disk (os.sync before each, so no mode pays for another's
dirty pages); `wall` adds the process start and imports. `stream` writes the weights as saved
(fp32), `stream_bf16` converts them (`merge --dtype bf16`); `dcp_reader` is the same streaming
merge through DCP's own reader and safetensors' save_file, as r1cloud merged until 2026-11.
Usage: python benchmarks/merge.py [--rounds 5] [--dir D]
"""

from __future__ import annotations

import argparse
import json
import os
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


PHASES: dict[str, float] = {}  # seconds in r1cloud's reading of the records and its writing


def _timed(module, name: str) -> None:
    fn = getattr(module, name)

    def timed(*a, **k):
        t = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            PHASES[name] = PHASES.get(name, 0.0) + time.perf_counter() - t

    setattr(module, name, timed)


def stream(d: Path, out: Path, dtype=None) -> None:
    from r1cloud.checkpoint import folder, from_dcp

    _timed(from_dcp, "read_chunks")
    _timed(folder, "save_safetensors")
    out.mkdir()
    shard = int(os.environ["SHARD_BYTES"])
    from_dcp.merge_dcp(
        str(d / "global_step_1" / "actor"), d / "global_step_1" / "huggingface", out, dtype, shard_bytes=shard
    )


def dcp_reader(d: Path, out: Path) -> None:
    """The same streaming merge through DCP's own reader and safetensors' save_file, as r1cloud's
    merge did until 2026-11: per output shard, each tensor read from the file into a buffer,
    torch.load'ed from it, copied into the target, then the shard written by save_file."""
    import torch
    import torch.distributed.checkpoint as dcp
    from safetensors.torch import save_file

    from r1cloud.checkpoint.dcp import storage
    from r1cloud.checkpoint.folder import plan

    src = str(d / "global_step_1" / "actor")
    meta = storage(src, write=False)["storage_reader"].read_metadata().state_dict_metadata
    sizes = [
        (k, m.size.numel() * m.properties.dtype.itemsize) for k, m in meta.items() if k.startswith("model.")
    ]
    out.mkdir()
    for i, shard in enumerate(plan(sizes, int(os.environ["SHARD_BYTES"]))):
        state = {k: torch.empty(meta[k].size, dtype=meta[k].properties.dtype) for k in shard}
        dcp.load(state, **storage(src, write=False), no_dist=True)
        save_file(
            {k.removeprefix("model."): v for k, v in state.items()}, str(out / f"model-{i}.safetensors")
        )


def stream_bf16(d: Path, out: Path) -> None:
    import torch

    stream(d, out, torch.bfloat16)


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


def measure(mode: str, d: Path, out: Path) -> tuple[float, float, float, dict]:
    """(seconds of the work itself, wall seconds of the process, peak RSS GiB, seconds by phase) of
    a fresh process running `mode`. Peak RSS is VmHWM, which exec resets (ru_maxrss would carry
    the parent's)."""
    shutil.rmtree(out, ignore_errors=True)
    os.sync()
    code = (
        f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); import os, time; import merge as m; "
        "from pathlib import Path; import torch, torch.distributed.checkpoint; import r1cloud.checkpoint.merge; "  # imports: not the work
        f"t = time.perf_counter(); m.{mode}(Path({str(d)!r}), Path({str(out)!r})); "
        f"[os.fsync(fd := os.open(p, os.O_RDONLY)) or os.close(fd) for p in Path({str(out)!r}).rglob('*') if p.is_file()]; "
        "print(time.perf_counter() - t, [l for l in open('/proc/self/status') if l.startswith('VmHWM')][0].split()[1], "
        "m.json.dumps(m.PHASES))"
    )
    t = time.perf_counter()
    r = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    wall = time.perf_counter() - t
    work, rss, phases = r.stdout.strip().splitlines()[-1].split(" ", 2)
    return float(work), wall, int(rss) / 1024**2, json.loads(phases)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=None)
    parser.add_argument("--shard-mb", type=int, default=None, help="output shard size (default: r1cloud's)")
    args = parser.parse_args()
    from r1cloud.checkpoint.folder import DEFAULT_SHARD

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
    modes = ["copy", "stream", "stream_bf16", "dcp_reader", "load_everything"]
    runs: dict[str, list[tuple]] = {m: [] for m in modes}
    for _ in range(args.rounds):
        for m in modes:  # alternating, so drift hits every mode alike
            runs[m].append(measure(m, src, base / m))
    import torch

    print(
        f"merge benchmark: random Qwen2.5-0.5B-shaped model, {n / 1e6:.0f}M parameters, fp32, {size / 1024**3:.2f} GiB checkpoint"
    )
    print(
        f"python {platform.python_version()}, torch {torch.__version__}, {args.rounds} alternating rounds, output shards of {shard / 1024**2:.0f} MiB, each timed to its output synced to disk"
    )
    print(f"{'mode':16} {'median s':>9} {'GiB/s':>7} {'wall s':>7} {'peak RSS GiB':>13}")
    med = {m: [statistics.median(r[i] for r in runs[m]) for i in range(3)] for m in modes}
    for m in modes:
        work, wall, rss = med[m]
        print(f"{m:16} {work:9.2f} {size / 1024**3 / work:7.2f} {wall:7.2f} {rss:13.2f}")
    largest = max(f.stat().st_size for f in (base / "stream").glob("*.safetensors")) / 1024**3
    print(
        f"streaming merge throughput = {med['copy'][0] / med['stream'][0]:.2f}x a raw copy of the same bytes"
    )
    print(
        f"streaming merge peak RSS = {med['stream'][2]:.2f} GiB = {med['stream'][2] / largest:.2f}x its largest output shard ({largest:.2f} GiB)"
    )
    phases = {k: statistics.median(r[3].get(k, 0.0) for r in runs["stream"]) for k in runs["stream"][0][3]}
    read, written = phases.get("read_chunks", 0.0), phases.get("save_safetensors", 0.0)
    print(
        f"where stream's {med['stream'][0]:.2f} s go: {read:.2f} s reading the records' layouts (bytes mapped, "
        f"not read), {written:.2f} s writing (kernel copy file to file; each shard's fsync runs beside the "
        f"next shard's writing), {med['stream'][0] - read - written:.2f} s the rest (waiting for the last "
        "shard's fsync, index, config, planning). Before (fsync after each shard, nothing beside it): 0.63-0.75x"
    )
    print(
        f"through DCP's reader and save_file (the merge before): {med['copy'][0] / med['dcp_reader'][0]:.2f}x a raw "
        "copy: every byte read into a buffer, torch.load'ed from it, copied into the target tensor, then written"
    )
    print(
        f"converting to bf16 (reads fp32, writes half the bytes): {med['copy'][0] / med['stream_bf16'][0]:.2f}x a "
        f"raw copy's throughput, peak RSS {med['stream_bf16'][2]:.2f} GiB"
    )
    print(
        f"streaming merge time = {med['stream'][0] / med['load_everything'][0]:.2f}x the load-everything merge's"
    )
    if not args.dir:  # a folder of our own (several GiB): gone; one named with --dir is kept for reuse
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
