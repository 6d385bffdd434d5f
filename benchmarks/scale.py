"""The trainer's driver at EasyR1's 7B geo3k shapes, on this machine, by simulation.

SIMULATED, at the narrowest boundary: only the model compute is replaced. Eight Ray actors stand
in for the HybridWorkers (`StandIn`): they take the same calls with the same arguments and return
what a worker returns, of the right shapes and dtypes (responses of lengths drawn up to 2,048
tokens, their sampling log-probs, log-probs, update statistics), without a model. Everything else
is the real code: the driver's `train_step`, the batch, the packing plan, advantages, the
reward pool (a cheap reward function: its own cost is the user's, not the driver's), metrics and
the Ray transfers (`group.gather`).

Shapes (EasyR1 `examples/qwen2_5_vl_7b_geo3k_grpo.sh`): 512 prompts × 5 samples, prompts of
2,048 tokens of which 1,296 are image placeholder tokens (four 512² images' worth: Qwen2.5-VL
gives one 324 tokens), responses uniform in 1..2,048 tokens, 8 workers, tensor parallel 2 (4 rollout ranks), 4 optimizer steps per
step (global batch 128), use_kl_loss (old and ref log-probs both computed). The pixel tensors
themselves are not simulated (a prompt's image inputs are empty): the placeholder tokens are.

Per step it prints the driver's own seconds (the step's wall time less the stand-ins' own work,
the slowest rank per call), the bytes that crossed Ray in calls (arguments and results, as
pickled; numpy/tensor buffers counted at their size) and through explicit `ray.put`, the size of
the step's own tensors for comparison, and the driver's peak RSS.

With `--before FILE` (a --json written by an earlier version: benchmarks/scale_before.json is
the driver before the typed batch), the two side by side with their ratios.

Usage: python benchmarks/scale.py [--steps 3] [--prompts 512] [--json out.json] [--before FILE]
"""

from __future__ import annotations

import argparse
import json
import pickle
import resource
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

WORLD, TP, N = 8, 2, 5
PROMPT_LEN, RESPONSE_MAX = 2048, 2048
IMAGE_TOKEN = 49151  # a placeholder id in the stand-in vocabulary
VOCAB = 49152

REWARD = """
def compute_score(reward_inputs):
    return [{"overall": (len(x["response"]) % 7) / 7.0, "accuracy": float(len(x["response"]) % 2)}
            for x in reward_inputs]
REWARD_TYPE = "batch"
"""


def wire_bytes(obj) -> int:
    """Bytes `obj` takes as Ray sends it: its pickle, with out-of-band buffers at their size."""
    buffers: list = []
    inband = pickle.dumps(obj, protocol=5, buffer_callback=buffers.append)
    return len(inband) + sum(memoryview(b).nbytes for b in buffers)


class StandIn:
    """A HybridWorker without a model: same methods, same argument and result shapes."""

    def __init__(self, rank: int):
        import torch

        from r1cloud.trainer.transport import zero_copy_tensors

        zero_copy_tensors()
        self.rank = rank
        self.g = torch.Generator().manual_seed(rank)
        self.spent: list[float] = []  # own seconds per call
        self.bytes = 0  # bytes received and returned

    def _done(self, tick: float, args, result):
        self.bytes += wire_bytes(args) + wire_bytes(result)
        self.spent.append(time.perf_counter() - tick)
        return result

    def report(self) -> tuple[list[float], int]:
        out = (self.spent, self.bytes)
        self.spent, self.bytes = [], 0
        return out

    def shares_prompts(self) -> bool:
        return True

    def adapter(self):
        return None

    def sync_weights(self) -> None:
        return None

    def generate(self, prompts, sampling: dict):
        import torch

        tick = time.perf_counter()
        g = torch.Generator().manual_seed(sampling["seed"])
        k = len(prompts) * sampling["n"]
        lengths = torch.randint(1, sampling["max_tokens"] + 1, (k,), generator=g)
        width = int(lengths.max()) if k else 0
        mask = torch.arange(width)[None, :] < lengths[:, None]
        out = {
            "prompt": torch.arange(len(prompts)).repeat_interleave(sampling["n"]),
            "response": torch.randint(0, VOCAB - 1, (k, width), generator=g, dtype=torch.int32)[mask],
            "length": lengths,
            "logprobs": -torch.rand(k, width, generator=g)[mask],
            "finished": lengths < sampling["max_tokens"],
        }
        return self._done(tick, (prompts, sampling), out)

    def log_probs(self, batch, micro_batches, role: str = "actor", temperature=None):
        import torch

        tick = time.perf_counter()
        out = -torch.rand(int(batch.response_len.sum()), generator=self.g)
        return self._done(tick, (batch, micro_batches), out)

    def update(self, batch, minibatches, apply: bool = True):
        tick = time.perf_counter()
        stats = []
        for mb in minibatches:
            tokens = float(sum(int(batch.response_len[i]) for micro in mb["micro"] for i in micro))
            stats.append(
                {"pg_loss": 0.1, "kl_loss": 0.01, "entropy_loss": 1.0, "tokens": tokens, "clip_hi": 0.0,
                 "clip_lo": 0.0, "ppo_kl": 0.0, "entropy": 1.0, "is_weight": 0.0, "grad_norm": 1.0,
                 "lr": 1e-6}
            )  # fmt: skip
        return self._done(tick, (batch, minibatches), stats)


class Prompts:
    """The prompt set's stand-in: 2,048-token prompts with image placeholder tokens."""

    def __init__(self, count: int):
        import torch

        from r1cloud.data.loader import Prompt

        g = torch.Generator().manual_seed(0)
        self.prompts = []
        for i in range(count):
            text = torch.randint(0, VOCAB - 1, (PROMPT_LEN - 1296,), generator=g).tolist()
            ids = text[:100] + [IMAGE_TOKEN] * 1296 + text[100:]
            self.prompts.append(Prompt(i, ids, str(i % 10), {}, f"question {i}", len(ids)))

    def image_inputs(self, index: int) -> dict:
        return {}

    def __len__(self) -> int:
        return len(self.prompts)


def spec(reward: Path, prompts: int):
    from r1cloud.spec import Spec

    return Spec.model_validate(
        {
            "name": "scale",
            "data": {
                "train_files": "unused", "max_prompt_length": PROMPT_LEN,
                "max_response_length": RESPONSE_MAX, "rollout_batch_size": prompts,
            },
            "algorithm": {"adv_estimator": "grpo", "use_kl_loss": True, "kl_penalty": "low_var_kl",
                          "kl_coef": 0.01},
            "worker": {
                "actor": {"global_batch_size": prompts // 4, "micro_batch_size_per_device_for_update": 1,
                          "micro_batch_size_per_device_for_experience": 2,
                          "model": {"model_path": str(ROOT / ".models/SmolLM2-135M-Instruct")}},
                "rollout": {"n": N, "tensor_parallel_size": TP, "name": "vllm"},
                "reward": {"reward_function": f"{reward}:compute_score", "num_cpus": 1},
            },
            "trainer": {"n_gpus_per_node": WORLD, "max_steps": 100},
        }
    )  # fmt: skip


def driver(s, tokenizer):
    """The real Trainer, its fields set as __init__ would set them from files (there are none)."""
    from r1cloud.data.loader import Loader
    from r1cloud.rewards import pool as rewards
    from r1cloud.trainer.driver import Trainer

    t = Trainer.__new__(Trainer)
    t.spec, t.tokenizer, t.processor = s, tokenizer, None
    t.train_set = Prompts(s.data.rollout_batch_size)
    t.val_set = None
    t.reward = rewards.from_config(s.worker.reward)
    t.loader = Loader(len(t.train_set), s.data.rollout_batch_size, s.data.seed, s.data.shuffle)
    t.steps, t.world, t.kl_coef = 100, WORLD, s.algorithm.kl_coef
    t.engine, t.stopped, t.share_prompts = "vllm", False, True
    return t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--prompts", type=int, default=512)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--before", type=Path, help="an earlier run's --json, to compare")
    args = ap.parse_args()
    import ray
    import torch
    from transformers import AutoTokenizer

    from r1cloud.trainer import group
    from r1cloud.trainer.transport import zero_copy_tensors

    ray.init(num_cpus=2, include_dashboard=False, configure_logging=False, log_to_driver=False)
    zero_copy_tensors()  # as group.launch does (the stand-ins register theirs)
    tmp = Path(tempfile.mkdtemp())
    (tmp / "reward.py").write_text(REWARD)
    s = spec(tmp / "reward.py", args.prompts)
    tok = AutoTokenizer.from_pretrained(ROOT / ".models/SmolLM2-135M-Instruct")
    t = driver(s, tok)
    actor = ray.remote(num_cpus=0)(StandIn)
    t.workers = [actor.remote(r) for r in range(WORLD)]
    group.gather([w.shares_prompts.remote() for w in t.workers])
    puts = {"bytes": 0}
    put = ray.put

    def counted_put(value, *a, **k):  # explicit object-store traffic (ray.put)
        puts["bytes"] += wire_bytes(value)
        return put(value, *a, **k)

    ray.put = counted_put
    rows = []
    for step in range(1, args.steps + 2):  # the first step warms the reward pool up
        tick = time.perf_counter()
        m = t.train_step(step)
        wall = time.perf_counter() - tick
        reports = group.gather([w.report.remote() for w in t.workers])
        calls = len(reports[0][0])
        stand_in = sum(max(r[0][i] for r in reports) for i in range(calls))
        row = {
            "step": step,
            "wall_s": wall,
            "stand_in_s": stand_in,
            "driver_s": wall - stand_in,
            "ray_call_bytes": sum(r[1] for r in reports),
            "ray_put_bytes": puts["bytes"],
            "tokens": m["perf/total_num_tokens"],
            "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
            "phases": {k.split("/")[1]: round(v, 3) for k, v in m.items() if k.startswith("timing_s/")},
        }
        puts["bytes"] = 0
        if step > 1:
            rows.append(row)
        print(json.dumps(row), flush=True)
    # the step's own tensors: prompt and response ids (int64), and per response token the rollout,
    # old and ref log-probs and the advantage (fp32), and the mask
    samples = args.prompts * N
    mean_tokens = rows[-1]["tokens"] / samples
    own = samples * (PROMPT_LEN * 8 + (mean_tokens - PROMPT_LEN) * (8 + 4 * 4 + 1))
    summary = {
        "driver_s": sum(r["driver_s"] for r in rows) / len(rows),
        "wall_s": sum(r["wall_s"] for r in rows) / len(rows),
        "ray_bytes_gib": sum(r["ray_call_bytes"] + r["ray_put_bytes"] for r in rows) / len(rows) / 2**30,
        "own_tensor_gib": own / 2**30,
        "peak_rss_gib": rows[-1]["peak_rss_gib"],
        "torch": torch.__version__,
        "ray": ray.__version__,
    }
    summary["ray_bytes_ratio"] = summary["ray_bytes_gib"] / summary["own_tensor_gib"]
    print(json.dumps(summary, indent=1))
    if args.before:
        was = json.loads(args.before.read_text())["summary"]
        print(
            f"\n{args.prompts} prompts x {N} samples, {WORLD} stand-in workers, mean of steps 2-{args.steps + 1}"
        )
        print(f"{'':28} {'before':>8} {'now':>8} {'now/before':>11}  goal")
        for key, name, goal in (
            ("driver_s", "driver's own s/step", "<= 1.5"),
            ("ray_bytes_ratio", "Ray bytes / own tensors", "<= 1.5"),
            ("peak_rss_gib", "driver peak RSS GiB", "<= 4"),
            ("wall_s", "wall s/step (with stand-ins)", ""),
        ):
            print(f"{name:28} {was[key]:8.2f} {summary[key]:8.2f} {summary[key] / was[key]:10.2f}x  {goal}")
    if args.json:
        args.json.write_text(json.dumps({"steps": rows, "summary": summary}, indent=1))
    t.reward.close()
    ray.shutdown()


if __name__ == "__main__":
    main()
