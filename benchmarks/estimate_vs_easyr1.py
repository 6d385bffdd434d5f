"""r1cloud's step-time estimate for EasyR1's qwen2_5_vl_7b_geo3k_grpo.sh on 8×H100, on paper, against
EasyR1's published step time (assets/baselines.md, v0.3.2: Qwen2.5-VL-7B, 8×H100, bf16, micro-batches
1/2: 145 s a step, 1600 tokens/s/GPU, actor MFU 16.0%). Nothing runs on a GPU here: this prints the
estimator's figures under three sets of lengths, so the gap and its causes can be read off.

    .venv/bin/python benchmarks/estimate_vs_easyr1.py
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from r1cloud.costs import estimate as est
from r1cloud.validate import load_spec

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "tests/fixtures/easyr1/examples/qwen2_5_vl_7b_geo3k_grpo.sh"
QWEN25_VL_7B = {  # Qwen/Qwen2.5-VL-7B-Instruct's config.json, text_config's fields the count reads
    "hidden_size": 3584,
    "intermediate_size": 18944,
    "num_hidden_layers": 28,
    "num_attention_heads": 28,
    "num_key_value_heads": 4,
    "vocab_size": 152064,
}
PUBLISHED_S, TOKENS_PER_GPU_S, GPUS = 145.0, 1600.0, 8


def main() -> None:
    overrides = ["trainer.logger=['console']", "trainer.n_gpus_per_node=8", "resources.accelerators=H100:8"]
    with contextlib.chdir(
        SCRIPT.parent.parent
    ):  # EasyR1's scripts run from its folder (examples/config.yaml)
        spec = load_spec(SCRIPT, overrides, check_files=False).spec
    m = est.model_of(QWEN25_VL_7B, "Qwen2.5-VL-7B's config")
    speed = est.default_speed("H100")
    samples = spec.data.rollout_batch_size * spec.worker.rollout.n
    mean_seq = TOKENS_PER_GPU_S * GPUS * PUBLISHED_S / samples  # EasyR1's own tokens a sequence
    print(f"{m.params / 1e9:.2f}B FLOP parameters; EasyR1's sequences average {mean_seq:.0f} tokens")
    print(f"{'lengths (prompt + response, tokens)':52} {'prompt':>14} {'step':>7} {'vs 145 s':>9}")
    cases = [
        ("validate's defaults: half of 2048 + 2048", 0.5, 0.5),
        (f"EasyR1's mean: ~400 + ~{mean_seq - 400:.0f}", 400 / 2048, (mean_seq - 400) / 2048),
    ]
    for label, p, r in cases:
        for shared in (True, False):
            w = est.work_of(spec, None, r, p)
            w = est.Work(**{**w.__dict__, "share_prompt": shared})
            s = est.step_seconds(m, w, speed, GPUS)
            how = "packed once" if shared else "a copy a sample"
            print(f"{label:52} {how:>14} {s:6.0f}s {s / PUBLISHED_S:8.2f}×")


if __name__ == "__main__":
    main()
