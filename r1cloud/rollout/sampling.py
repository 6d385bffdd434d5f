"""What a step's rollout (or validation) samples with, from the spec alone: shared by the trainer's
driver and `r1cloud eval`, so both draw the same samples from the same seeds. No torch here: the
CLI reads it."""

from __future__ import annotations

RANK_SEED = 1009  # each data-parallel rank's seed: the step's times this, plus the rank


def sampling(spec, step: int, validation: bool = False, round: int = 0) -> dict:
    """The rollout's sampling at `step` (`round`: a dynamic-sampling step's later rounds); for
    validation, `val_override_config` on top of it, and one sample per prompt unless it says n."""
    r, d = spec.worker.rollout, spec.data
    out = {
        "n": r.n,
        "temperature": r.temperature,
        "top_p": r.top_p,
        "top_k": r.top_k,
        "max_tokens": d.max_response_length,
        "seed": (r.seed * 7919 + step) * 2 + round * 2 * 104_729,
        "ignore_eos": r.ignore_eos,
    }
    if validation:
        out.update({k: v for k, v in r.val_override_config.items() if k in out})
        out["extra"] = {k: v for k, v in r.val_override_config.items() if k not in out}
        out["n"] = int(r.val_override_config.get("n", 1))
        out["seed"] += 1
    return out


def for_rank(sampling: dict, rank: int) -> dict:
    """The sampling of data-parallel rank `rank`: its own seed."""
    return {**sampling, "seed": sampling["seed"] * RANK_SEED + rank}


def engine_sequences(spec, world: int, engine: str, val_set=None) -> int:
    """The most sequences one rollout call gives a worker's engine: a step's (or round's) prompts
    × n, or a validation batch × its n (on CPU vLLM's KV cache is sized to them)."""
    d = spec.data
    ranks = world // (spec.worker.rollout.tensor_parallel_size if engine == "vllm" else 1)
    most = -(-(d.mini_rollout_batch_size or d.rollout_batch_size) // ranks) * spec.worker.rollout.n
    if val_set:
        size = d.val_batch_size if d.val_batch_size > 0 else len(val_set)
        most = max(most, -(-size // ranks) * sampling(spec, 0, validation=True)["n"])
    return most
