"""What r1cloud knows of a model from its config.json: the families it trains and serves, what it
cannot train yet, its context and the KV cache one token takes."""

from __future__ import annotations

from pathlib import Path

from r1cloud.core.records import load_object


def model_config(path: str | None) -> dict | None:
    """A local model folder's config.json, or None (a Hub id, or not readable: check_model says why)."""
    try:
        return load_object(Path(path) / "config.json") if path else None
    except (OSError, ValueError):
        return None


VISION_FAMILIES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "idefics3")  # tested: testing.make_tiny_vlm
VIDEO_FAMILIES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl")  # tested with videos: tests/trainer/test_video.py


def unsupported(config: dict) -> str | None:
    """Why r1cloud cannot train a model of this config yet, or None: layers that carry a state
    along the sequence (linear attention, SSM: packed sequences would leak into each other), or a
    vision-language family whose image tensors and positions are not packed and tested yet."""
    kind = config.get("model_type")
    text = text_config(config)
    layers = {x for x in text.get("layer_types") or [] if isinstance(x, str)}
    if stateful := layers - {"full_attention", "sliding_attention", "chunked_attention"}:
        return (
            f"{kind} is not supported yet: its {', '.join(sorted(stateful))} layers carry a state along the "
            "sequence, which would flow from one packed sequence into the next (transformers' torch path "
            "takes no sequence boundaries)"
        )
    if "vision_config" in config and kind not in VISION_FAMILIES:
        return (
            f"{kind} is not supported yet: r1cloud packs and tests the pictures of "
            f"{', '.join(VISION_FAMILIES)} (Qwen2/2.5/3-VL, Idefics3/SmolVLM) only"
        )
    return None


def text_config(config: dict) -> dict:
    """A VLM's text model's config (its `text_config`), else the config itself."""
    return config["text_config"] if isinstance(config.get("text_config"), dict) else config


def model_context(config: dict) -> int | None:
    """A model's context in tokens: its max_position_embeddings (a VLM's text model's), or None."""
    text = text_config(config)
    context = text.get("max_position_embeddings", config.get("max_position_embeddings"))
    return context if isinstance(context, int) and not isinstance(context, bool) and context > 0 else None


def kv_bytes_per_token(config: dict, dtype_bytes: int) -> int:
    """The KV cache one token takes in vLLM: keys and values of every layer (config.json's dict)."""
    text = text_config(config)
    heads = text.get("num_attention_heads") or 1
    head_dim = text.get("head_dim") or (text.get("hidden_size", 0) // heads)
    kv_heads = text.get("num_key_value_heads") or heads
    return 2 * text.get("num_hidden_layers", 0) * kv_heads * head_dim * dtype_bytes
