"""How long a run will take, before it starts: the FLOPs of one step from the blueprint, divided by
devices × the device's achieved FLOP/s. Pure functions; the model's size comes from its
config.json (read here, never its weights), the achieved FLOP/s from the user's own finished runs
(`calibration`) or, uncalibrated, from the device's peak × EasyR1's published MFU.

One step, in the order the trainer runs it (trainer/driver.py, train_step):
- generation: 2·N FLOPs a token, the prompt once per sample group (vLLM's prefix cache) and each
  response token, plus causal attention (2·layers·width·length² a sequence);
- old log-probs (recomputed when the update is not on-policy or a KL penalty sits in the reward)
  and the reference's: a forward each, 2·N a trained token;
- the update: 6·N a trained token per PPO epoch, 8·N with gradient checkpointing (the forward
  runs twice); a critic adds its values' forward and its own update.
Trained tokens count a group's prompt once where the trainer packs it once (GRPO-style groups).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from r1cloud.core.records import load_object

# Dense bf16 peak FLOP/s per device (NVIDIA's datasheets; verl's flops_counter.py uses the same
# H100/A100/L40 figures). Only for uncalibrated estimates: a calibrated one uses measured FLOP/s.
PEAK = {
    **dict.fromkeys(("H100", "H100-MEGA", "H200", "H800"), 989e12),
    "B200": 2250e12,
    **dict.fromkeys(("A100", "A100-80GB", "A800"), 312e12),
    "L40S": 362e12,
    "L40": 181e12,
    "L4": 121e12,
    "A10G": 70e12,
}
# EasyR1's assets/baselines.md (v0.3.2): Qwen2.5-VL-7B GRPO on Geometry3k, 8×H100, bf16, micro-batches
# 1/2: actor MFU 16.0%, 145 s a step. Its other rows run 8–27% (23.2% at micro-batches 4/8).
DEFAULT_MFU = 0.16
RESPONSE_FRACTION = 0.5  # mean response length ÷ max_response_length, until a run says otherwise
PROMPT_FRACTION = 0.5  # mean prompt length ÷ max_prompt_length


@dataclass(frozen=True)
class Model:
    """What the FLOPs need of a model: the parameters a token passes through (a MoE's active
    experts only; the output layer's matmul counted, the embedding lookup not), layers, width."""

    params: float
    layers: int = 0
    width: int = 0
    source: str = ""


@dataclass(frozen=True)
class Work:
    """One step's work, in tokens."""

    prompts: int
    n: int
    prompt_tokens: float  # mean, images' tokens included
    response_tokens: float  # mean
    share_prompt: bool  # a group's prompt packed once in the trainer
    epochs: int
    old: bool  # old log-probs recomputed
    ref: bool
    checkpointing: bool
    critic: Model | None
    critic_epochs: int = 1
    critic_checkpointing: bool = False


def model_of(config: dict, source: str = "config.json") -> Model:
    """Parameters, layers and width from a transformers config (a VLM's text_config)."""
    c = config.get("text_config") or config.get("llm_config") or config
    h, layers = c["hidden_size"], c["num_hidden_layers"]
    heads = c.get("num_attention_heads", 1)
    kv = c.get("num_key_value_heads") or heads
    hd = c.get("head_dim") or h // heads
    attention = h * heads * hd * 2 + h * kv * hd * 2
    dense = 3 * h * c["intermediate_size"]
    routed = c.get("num_experts") or c.get("n_routed_experts") or c.get("num_local_experts")
    mlp = dense
    if routed and c.get("num_experts_per_tok"):  # a MoE: the experts a token is routed to, and shared ones
        expert = 3 * h * (c.get("moe_intermediate_size") or c["intermediate_size"])
        mlp = expert * (c["num_experts_per_tok"] + (c.get("n_shared_experts") or 0))
        mlp += 3 * h * (c.get("shared_expert_intermediate_size") or 0)
    dense_layers = c.get("first_k_dense_replace") or len(c.get("mlp_only_layers") or [])
    params = dense_layers * (attention + dense) + (layers - dense_layers) * (attention + mlp)
    params += c.get("vocab_size", 0) * h
    return Model(float(params), layers, h, source)


def model_size(path: str) -> Model | None:
    """The model's size from its config.json: a local folder, else the Hugging Face cache (no
    download), else the size in its name (Qwen2.5-7B-Instruct: 7e9); None when none says."""
    config = Path(path) / "config.json"
    if not config.is_file() and re.fullmatch(r"[\w.-]+/[\w.-]+", path):
        config = _hub_cached(path) or config
    if config.is_file():
        try:
            return model_of(load_object(config), str(config))
        except (KeyError, TypeError, ValueError, AttributeError, ArithmeticError):
            pass  # a config this count does not know: the name may still tell
    name = Path(path).name
    active = re.search(r"-A(\d+(?:\.\d+)?)B(?![a-z])", name, re.IGNORECASE)  # Qwen3-30B-A3B: 3B a token
    m = active or re.search(r"(?<![\d.])(\d+(?:\.\d+)?)\s*([BM])(?![a-z])", name, re.IGNORECASE)
    if m:
        scale = 1e9 if active or m.group(2).upper() == "B" else 1e6
        return Model(float(m.group(1)) * scale, source=f"the name {name!r}")
    return None


def _hub_cached(repo: str) -> Path | None:
    """config.json of a Hub model in the Hugging Face cache, as huggingface_hub lays it out
    (models--ORG--NAME/refs/main names the snapshot), read without importing it (validate stays fast)."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    hub = os.environ.get("HF_HUB_CACHE") or Path(os.environ.get("HF_HOME") or cache / "huggingface") / "hub"
    folder = Path(hub) / f"models--{repo.replace('/', '--')}"
    try:
        found = folder / "snapshots" / (folder / "refs" / "main").read_text().strip() / "config.json"
    except OSError:
        return None
    return found if found.is_file() else None


def work_of(spec, critic: Model | None, response_fraction: float, prompt_fraction: float) -> Work:
    """One step of this blueprint: the batch, the mean lengths (a prompt's length counts its
    pictures' tokens, as max_prompt_length does), which passes run."""
    d, a, actor = spec.data, spec.algorithm, spec.worker.actor
    n_mini = max(1, d.rollout_batch_size // actor.global_batch_size)
    on_policy = actor.ppo_epochs == 1 and n_mini == 1
    kl_in_reward = not a.disable_kl and not a.use_kl_loss
    return Work(
        prompts=d.rollout_batch_size,
        n=spec.worker.rollout.n,
        prompt_tokens=d.max_prompt_length * prompt_fraction,
        response_tokens=d.max_response_length * response_fraction,
        share_prompt=spec.worker.rollout.n > 1,
        epochs=actor.ppo_epochs,
        old=not on_policy or kl_in_reward,
        ref=not a.disable_kl,
        checkpointing=actor.model.enable_gradient_checkpointing,
        critic=critic if a.estimator.critic else None,
        critic_epochs=spec.worker.critic.ppo_epochs,
        critic_checkpointing=spec.worker.critic.model.enable_gradient_checkpointing,
    )


def _attention(m: Model, length: float) -> float:
    """Causal attention's forward FLOPs for one sequence of this length (QKᵀ and AV)."""
    return 2.0 * m.layers * m.width * length * length


def step_flops(m: Model, w: Work) -> tuple[float, float]:
    """(generation, training) FLOPs of one step."""
    samples = w.prompts * w.n
    full = w.prompt_tokens + w.response_tokens
    gen = 2 * m.params * (w.prompts * w.prompt_tokens + samples * w.response_tokens)
    gen += samples * _attention(m, full)
    trained = w.prompts * w.prompt_tokens * (1 if w.share_prompt else w.n) + samples * w.response_tokens
    forward = 2 * m.params * trained + samples * _attention(m, full)  # one forward over the batch

    passes = (w.old + w.ref) + w.epochs * (3 + w.checkpointing)  # a backward is two forwards
    train = forward * passes
    if w.critic is not None:
        c_forward = forward * w.critic.params / m.params
        train += c_forward * (1 + w.critic_epochs * (3 + w.critic_checkpointing))
    return gen, train


@dataclass(frozen=True)
class Speed:
    """Achieved FLOP/s per device in each phase, and where the figures come from."""

    gen: float
    train: float
    source: str
    response_fraction: float = RESPONSE_FRACTION
    prompt_fraction: float = PROMPT_FRACTION
    overhead_s: float = 0.0  # a run's wall time outside its steps and validations (start-up, saves)
    validation_s: float = 0.0  # one validation


def device_kind(name: str) -> str:
    """SkyPilot's name for a device torch names (NVIDIA H100 80GB HBM3 -> H100), else the name."""
    upper = name.upper().replace(" ", "-")
    if "A100" in upper and "80GB" in upper:
        return "A100-80GB"
    for kind in sorted(PEAK, key=len, reverse=True):
        if re.search(rf"(^|[^A-Z0-9]){re.escape(kind)}($|[^A-Z0-9])", upper):
            return kind
    return name


def default_speed(device: str) -> Speed | None:
    peak = PEAK.get(device.upper())
    if peak is None:
        return None
    mfu = DEFAULT_MFU * peak
    return Speed(
        mfu,
        mfu,
        f"{DEFAULT_MFU:.0%} MFU in generation and training (EasyR1's published 7B actor MFU on H100)",
    )


def phase_seconds(m: Model, w: Work, speed: Speed, devices: int, rollout: int = 0) -> tuple[float, float]:
    """(generation, training) seconds of one step: on all `devices`, or asynchronously generation on
    `rollout` devices of its own and training on `devices`."""
    gen, train = step_flops(m, w)
    return gen / ((rollout or devices) * speed.gen), train / (devices * speed.train)


def step_seconds(m: Model, w: Work, speed: Speed, devices: int, rollout: int = 0) -> float:
    """One after the other; asynchronously, overlapped: the slower of the two."""
    gen, train = phase_seconds(m, w, speed, devices, rollout)
    return max(gen, train) if rollout else gen + train


def hours(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 600:
        return f"{seconds / 60:.1f} min"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
