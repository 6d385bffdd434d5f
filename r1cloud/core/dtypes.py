"""Every dtype name a blueprint may give, and torch's name for it: the one table the trainer, the
rollout engines, merge and evaluation read."""

from __future__ import annotations

DTYPE_NAMES = {
    "bf16": "bfloat16", "fp16": "float16", "fp32": "float32",
    "bfloat16": "bfloat16", "float16": "float16", "float32": "float32",
}  # fmt: skip
DTYPES = tuple(DTYPE_NAMES)


def torch_dtype(name: str | None):
    """torch's dtype for a blueprint's name (or torch's own, `torch.` prefix or not); None for none."""
    if not name:
        return None
    import torch

    return getattr(torch, DTYPE_NAMES[name.removeprefix("torch.")])
