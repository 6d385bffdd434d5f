"""What a validated blueprint will do, in a few lines: the facts `r1cloud validate` prints."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator

from r1cloud.agents.tools import check
from r1cloud.core.accelerators import accelerator_options
from r1cloud.spec.load import display_path
from r1cloud.spec.models import Spec
from r1cloud.trainer.lora import plan
from r1cloud.validate.data_check import count_rows


def step_count(spec: Spec) -> tuple[int | None, str]:
    """EasyR1's step count: max_steps, else batches per epoch × epochs (drop_last)."""
    t, d = spec.trainer, spec.data
    if t.max_steps:
        return t.max_steps, "trainer.max_steps"
    rows = count_rows(d.train_files)
    if rows is None:
        return (
            None,
            f"{t.total_epochs} epochs × (dataset rows ÷ {d.rollout_batch_size}), known when the data loads",
        )
    steps = batches_per_epoch(rows, d) * t.total_epochs
    return steps, f"{t.total_epochs} epochs × ({rows} rows ÷ {d.rollout_batch_size})"


def batches_per_epoch(rows: int, d) -> int:
    """EasyR1's steps in one epoch of `rows` prompts (drop_last; DAPO's mini-batches drawn whole)."""
    mini = d.mini_rollout_batch_size or d.rollout_batch_size
    return rows // mini * mini // d.rollout_batch_size


def resources_line(spec: Spec) -> str:
    r, t = spec.resources, spec.trainer
    if r.accelerators is not None:
        accel = " or ".join(f"{n}:{c}" for n, c in accelerator_options(r.accelerators))
    elif r.infra == "local":
        slots = t.n_gpus_per_node + spec.rollout_size  # the rollout pool runs beside the trainers
        accel = f"{slots} local worker slot{'s' if slots > 1 else ''}"
    else:
        accel = f"{t.n_gpus_per_node} GPUs (type chosen by the backend)"
    nodes = f" × {t.nnodes} nodes" if t.nnodes > 1 else ""
    cap = f"at most ${r.max_cost:,.2f}" if r.max_cost is not None else ""
    extra = [x for x in ("spot" * r.use_spot, f"image {r.image}" * bool(r.image), r.region or "", cap) if x]
    return f"{r.infra}: {accel}{nodes}" + (f" ({', '.join(extra)})" if extra else "")


def sharding_line(spec: Spec) -> str | None:
    """The actor's hybrid sharding and Ulysses groups, when either is on."""
    a, world = spec.worker.actor, spec.world_size
    parts = []
    if 0 < a.fsdp.fsdp_size < world:
        parts.append(
            f"hybrid FSDP, shards in groups of {a.fsdp.fsdp_size} × {world // a.fsdp.fsdp_size} replicas"
        )
    if a.ulysses_size > 1:
        groups = world // a.ulysses_size
        parts.append(
            f"Ulysses, each row split over {a.ulysses_size} devices ({groups} data-parallel group{'s' * (groups > 1)})"
        )
    return "; ".join(parts) or None


def _short(path: str | list[str] | None) -> str:
    """Absolute paths under the working directory are shown relative to it."""
    if isinstance(path, list):
        return " + ".join(_short(p) for p in path)
    if not path or not path.startswith("/"):
        return path or ""
    return display_path(path)


def extras(spec: Spec) -> Iterator[tuple[str, str]]:
    """Rows for what is on beyond the plain algorithm: the DAPO preset, dynamic sampling, a critic."""
    a, w = spec.algorithm, spec.worker
    if a.estimator.preset:  # dapo
        yield (
            "preset",
            "dapo = GRPO advantages + clip-higher 0.2/0.28 + token-mean loss + dynamic sampling + KL off "
            "(values the blueprint sets win); the soft overlong penalty comes from the reward function "
            "(reward_functions/dapo.py's overlong_* kwargs)",
        )
    if a.online_filtering:
        yield (
            "sampling",
            f"dynamic: keep groups with {a.filter_low:g} < mean {a.filter_key} < {a.filter_high:g}, "
            f"up to {spec.trainer.max_try_make_batch} rounds per step",
        )
    if a.estimator.critic:
        frozen = max(spec.trainer.critic_warmup - 1, 0)  # the actor updates from step critic_warmup on
        warm = f", actor frozen for {frozen} step(s)" if frozen else ""
        yield (
            "critic",
            f"{_short(w.critic.model.model_path)} with a value head, γ {a.gamma:g} λ {a.lam:g}{warm}",
        )
    lora = w.actor.model.lora
    if w.actor.model.freeze_language_model:
        yield "trains", "the vision tower and connector; the language model is frozen"
    if lora.rank:
        where = lora.target_modules + (f" except {lora.exclude_modules}" if lora.exclude_modules else "")
        tower = ", vision tower frozen" if w.actor.model.freeze_vision_tower else ""
        tower += ", base in 4-bit NF4 (QLoRA)" if lora.load_in_4bit else ""
        counted = plan(w.actor.model)  # from the model's config, where it is on this machine
        share = (
            counted.replace("LoRA rank", "rank", 1) if counted else "the trainable share is printed at start"
        )
        yield (
            "trains",
            f"LoRA adapters, rank {lora.rank}, alpha {lora.alpha}, on {where}{tower}; the base is frozen "
            f"(and is the KL reference: no second copy); {share}",
        )
    mt = w.rollout.multi_turn
    if mt.enable:
        info = check(mt.environment, mt.tools, mt.tool_names)  # validate read them already: remembered
        yield from _episodes(mt, info, bool(w.reward.reward_function))
        for tool in info["tools"]:
            f = tool["function"]
            params = ", ".join(f"{k}: {v.get('type', '?')}" for k, v in f["parameters"]["properties"].items())
            yield "tool", f"{f['name']}({params}): {f.get('description', '')}"
    if w.actor.rollout_is:
        yield "correction", f"{w.actor.rollout_is} importance sampling, cap {w.actor.rollout_is_cap:g}"


def _episodes(mt, info: dict, function: bool) -> Iterator[tuple[str, str]]:
    """The episodes' rows, and the rule for their reward: the environment's (get_reward(), or the
    sum of a gym step's rewards) plus the reward function's on the last turn, each one present."""
    cls = (mt.environment or "").rpartition(":")[2]
    gym = info["shape"] == "gym"
    turns = "each turn's text is the action of step()" if gym else f"tool calls as {mt.tool_call_format}"
    yield (
        "episodes",
        f"up to {mt.max_turns} turns, {turns}, each call ≤ {mt.tool_timeout:g} s and "
        f"{mt.max_tool_response_length} characters (the response bound covers the whole episode)",
    )
    if info["shape"]:
        shape = (
            "gym-shaped: reset(**row), step(action)" if gym else "TRL-shaped: reset(**row), methods as tools"
        )
        yield "environment", f"{cls}, one per episode, {shape}"
    own = f"the sum of {cls}.step() rewards" if gym else f"{cls}.get_reward()"
    parts = [own] if info.get("reward") else []
    parts += ["the reward function on the last turn"] if function else []
    yield "reward is", " + ".join(parts)


def _rollout(spec: Spec) -> str:
    """The engine that will run and its tensor parallelism: the hf engine runs unsharded (TP 1)
    whatever tensor_parallel_size says; `auto` is vLLM in the cloud, and here when installed."""
    r = spec.worker.rollout
    engine = r.name
    if engine == "auto":
        local = spec.resources.infra == "local"
        engine = "vllm" if not local or importlib.util.find_spec("vllm") else "hf"
        engine = f"auto → {engine}" + ("" if engine == "vllm" else " (no vLLM here)")
    sampling = f"temperature {r.temperature:g}, top_p {r.top_p:g}"
    if engine.endswith("vllm"):
        return f"{engine}, {sampling}, TP {r.tensor_parallel_size}"
    unused = f" (tensor_parallel_size {r.tensor_parallel_size} is vLLM's)" * (r.tensor_parallel_size > 1)
    return f"{engine}, {sampling}, TP 1{unused}"


def async_line(spec: Spec) -> str:
    """Asynchronous training's split: which devices generate, which train, the bound."""
    a = spec.async_training
    push = (
        "every update"
        if a.trigger_parameter_sync_step == 1
        else f"every {a.trigger_parameter_sync_step} updates"
    )
    old = "the engine's" if a.use_rollout_log_probs else "the trainer's"
    return (
        f"{spec.rollout_size} device(s) generate, {spec.world_size} train; samples at most {a.bound} "
        f"update(s) old, weights pushed {push}; the PPO ratio against {old} log-probs"
    )


def summarize(spec: Spec) -> list[tuple[str, str]]:
    d, a, w = spec.data, spec.algorithm, spec.worker
    steps, how = step_count(spec)
    where = "as a loss" if a.use_kl_loss else "in the reward"
    kl = "off" if a.disable_kl else f"{a.kl_penalty} × {a.kl_coef:g} {where}"
    loss = w.actor.loss_type if w.actor.loss_type != "default" else "dual-clip PPO"
    reward = _short(w.reward.reward_function) or "—"
    if w.reward.reward_function_name and not reward.startswith(("http://", "https://")):
        reward = f"{reward}:{w.reward.reward_function_name}"
    rows = [
        ("job", spec.name),
        ("model", _short(w.actor.model.model_path) or "—"),
        ("data", f"{_short(d.train_files) or '—'} (val: {_short(d.val_files) or 'none'})"),
        ("prompt", _short(d.format_prompt) or "the raw prompt column, no format prompt"),
        ("reward", reward),
        (
            "algorithm",
            f"{a.adv_estimator}, {loss} loss (clip {w.actor.clip_ratio_low:g}/{w.actor.clip_ratio_high:g}), KL {kl}",
        ),
        *extras(spec),
        (
            "per step",
            f"{d.rollout_batch_size} prompts × {w.rollout.n} samples = {d.rollout_batch_size * w.rollout.n} responses, "
            f"{d.rollout_batch_size // w.actor.global_batch_size * w.actor.ppo_epochs} optimizer step(s)",
        ),
        ("lengths", f"prompt ≤ {d.max_prompt_length}, response ≤ {d.max_response_length} tokens"),
        ("steps", f"{steps} ({how})" if steps is not None else how),
        ("rollout", _rollout(spec)),
        *([("async", async_line(spec))] if spec.async_training.enable else []),
        *([("sharding", line)] if (line := sharding_line(spec)) else []),
        ("resources", resources_line(spec)),
    ]
    if spec.secrets:
        rows.append(("secrets", ", ".join(spec.secrets)))
    return rows
