"""Rollout engines: the interface (engine.py), vLLM in-process per worker (vllm.py), transformers
generate (hf.py), the validation sampling a blueprint asks for (sampling.py), and oneDNN fp32
matmuls on CPU (onednn.py)."""
