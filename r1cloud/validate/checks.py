"""Checks EasyR1 makes only at run time (on a rented GPU), made here before anything runs.

Each check names the keys involved, their values, and what to set. Pure: a Spec in, Problems out.
"""

from __future__ import annotations

import difflib
import importlib.util
import netrc
import os
from collections.abc import Callable

from r1cloud.core.records import cut, finite
from r1cloud.spec.keys import REFUSED, classify, leaves
from r1cloud.spec.load import CLI, Origins, get_path, origin_of
from r1cloud.spec.models import EXTRA_SAMPLING, SAMPLING_KEYS, Spec
from r1cloud.spec.problems import Problem


def check_spec(spec: Spec, origins: Origins) -> list[Problem]:
    out: list[Problem] = []

    def problem(path: str, message: str, *related: str, warning: bool = False) -> None:
        out.append(Problem(path, message, _origin(origins, path), tuple(related), warning))

    problem.origin = lambda path: _origin(origins, path)  # where a key's value came from

    for check in CHECKS:
        check(spec, problem)
    return out


def _origin(origins: Origins, path: str) -> str:
    """Where the key was set (an entry of a free-form section, such as val_override_config: where
    the section was)."""
    key = tuple(path.split("."))
    if key in origins:
        return origins[key]
    free = [i for i in range(1, len(key)) if key[i - 1].endswith(("_config", "_kwargs"))]
    return (origin_of(origins, key[: free[0]]) if free else None) or "default"


def _nearest_divisor(n: int, target: int, window: int = 4096) -> int:
    """The divisor of n nearest to target (the larger on a tie), looked for within `window` of it:
    bounded work whatever the numbers (1 and n always divide, so there is always an answer)."""
    best = 1 if abs(1 - target) <= abs(n - target) else n
    near = range(max(1, target - window), min(n, target + window) + 1)
    return min([best, *(d for d in near if n % d == 0)], key=lambda d: (abs(d - target), -d))


Report = Callable[..., None]


def check_required(spec: Spec, problem: Report) -> None:
    if not spec.worker.actor.model.model_path:
        problem(
            "worker.actor.model.model_path",
            "is not set: give a Hugging Face model id or a local model folder",
        )
    if not spec.data.train_files and not spec.trainer.val_only:
        problem(
            "data.train_files",
            "is not set: give name@split (a Hub dataset) or a local json/jsonl/parquet/csv file or folder",
        )
    probs, files = spec.data.train_files_probs, spec.data.train_files
    if probs is not None:
        n = len(files) if isinstance(files, list) else 1
        if n != len(probs):
            problem(
                "data.train_files_probs",
                f"has {len(probs)} weight(s) for {n} data set(s) in data.train_files: give one per data set",
                "data.train_files",
            )
        elif any(not p > 0 for p in probs):
            problem("data.train_files_probs", "weights must be positive (they are normalised to sum to 1)")
    validating = spec.trainer.val_before_train or spec.trainer.val_freq > 0 or spec.trainer.val_only
    if not spec.data.val_files and validating:
        problem(
            "data.val_files",
            "is not set but validation is on: set data.val_files, or turn validation off with "
            "trainer.val_before_train=false trainer.val_freq=-1",
            "trainer.val_before_train",
            "trainer.val_freq",
        )
    if not spec.worker.reward.reward_function and not spec.worker.rollout.multi_turn.environment:
        problem(
            "worker.reward.reward_function",
            "is not set: give file.py:function (EasyR1's reward interface) or an http(s) URL",
        )


def check_batches(spec: Spec, problem: Report) -> None:
    d, n, world = spec.data, spec.worker.rollout.n, spec.world_size
    for name in spec.roles:
        key, role = f"worker.{name}", getattr(spec.worker, name)
        gbs = role.global_batch_size
        if d.rollout_batch_size % gbs and problem.origin("data.rollout_batch_size") == CLI != problem.origin(
            f"{key}.global_batch_size"
        ):  # the batch given on the command line is what to fix
            problem(
                "data.rollout_batch_size",
                f"{d.rollout_batch_size} is not a multiple of {key}.global_batch_size ({gbs}): each step's prompts "
                f"are split into equal optimizer steps; set data.rollout_batch_size="
                f"{max(gbs, round(d.rollout_batch_size / gbs) * gbs)}",
                f"{key}.global_batch_size",
            )
        elif d.rollout_batch_size % gbs:
            fix = _nearest_divisor(d.rollout_batch_size, gbs)
            problem(
                f"{key}.global_batch_size",
                f"{gbs} does not divide data.rollout_batch_size ({d.rollout_batch_size}): each step's prompts are split "
                f"into equal optimizer steps; set {key}.global_batch_size={fix}",
                "data.rollout_batch_size",
            )
        if (d.rollout_batch_size * n) % role.micro_batch_size_per_device_for_experience:
            problem(
                f"{key}.micro_batch_size_per_device_for_experience",
                f"{role.micro_batch_size_per_device_for_experience} does not divide data.rollout_batch_size × "
                f"worker.rollout.n ({d.rollout_batch_size} × {n} = {d.rollout_batch_size * n}); set it to "
                f"{_nearest_divisor(d.rollout_batch_size * n, role.micro_batch_size_per_device_for_experience)}",
                "data.rollout_batch_size",
                "worker.rollout.n",
            )
        if world % role.ulysses_size:
            problem(
                f"{key}.ulysses_size",
                f"{role.ulysses_size} does not divide the {world} devices (trainer.nnodes × trainer.n_gpus_per_node)",
                "trainer.n_gpus_per_node",
            )
            continue
        dp = world // role.ulysses_size
        samples = gbs * n
        per_device = samples // dp
        devices_set_here = (
            problem.origin("trainer.n_gpus_per_node") == CLI or problem.origin("trainer.nnodes") == CLI
        )
        if per_device == 0 and devices_set_here and problem.origin(f"{key}.global_batch_size") != CLI:
            problem(  # the device count given on the command line is what to fix
                "trainer.n_gpus_per_node",
                f"{world} devices (trainer.nnodes × trainer.n_gpus_per_node) is more than the {samples} samples of "
                f"an optimizer step ({gbs} prompts × {n} samples, {key}.global_batch_size): use at most {samples} "
                "devices, or raise the batch",
                f"{key}.global_batch_size",
            )
        elif per_device == 0:
            problem(
                f"{key}.global_batch_size",
                f"{gbs} prompts × {n} samples = {samples} samples per optimizer step, fewer than the {dp} data-parallel "
                f"devices; raise it to at least {-(-dp // n)} or use fewer devices",
                "trainer.n_gpus_per_node",
                "worker.rollout.n",
            )
        elif per_device % role.micro_batch_size_per_device_for_update:
            problem(
                f"{key}.micro_batch_size_per_device_for_update",
                f"{role.micro_batch_size_per_device_for_update} does not divide the {per_device} samples each device gets "
                f"per optimizer step ({gbs} × {n} / {dp} devices); set it to "
                f"{_nearest_divisor(per_device, role.micro_batch_size_per_device_for_update)}",
                f"{key}.global_batch_size",
                "worker.rollout.n",
            )
        elif role.fsdp.enable_cpu_offload and per_device > role.micro_batch_size_per_device_for_update:
            problem(
                f"{key}.fsdp.enable_cpu_offload",
                f"cannot be combined with gradient accumulation ({per_device} samples per device in "
                f"micro-batches of {role.micro_batch_size_per_device_for_update}); set "
                f"{key}.micro_batch_size_per_device_for_update={per_device} or turn offload off",
                f"{key}.micro_batch_size_per_device_for_update",
            )
        if role.fsdp.fsdp_size > 0 and world % role.fsdp.fsdp_size:
            problem(
                f"{key}.fsdp.fsdp_size",
                f"{role.fsdp.fsdp_size} does not divide the {world} devices",
                "trainer.n_gpus_per_node",
            )


def check_algorithm(spec: Spec, problem: Report) -> None:
    a, w = spec.algorithm, spec.worker
    if a.estimator.group and w.rollout.n < 2:
        problem(
            "worker.rollout.n",
            f"is {w.rollout.n}, but {a.adv_estimator} compares samples within a group: set worker.rollout.n "
            "to 2 or more (EasyR1's examples use 5)",
            "algorithm.adv_estimator",
        )
    if a.estimator.critic and not w.critic.model.model_path:
        problem(
            "worker.critic.model.model_path",
            "is not set, but adv_estimator gae trains a critic: give its model (often the actor's)",
            "algorithm.adv_estimator",
        )
    if a.kl_penalty == "full" and not a.disable_kl:
        problem(
            "algorithm.kl_penalty",
            "'full' needs the whole vocabulary distribution, but the trainer keeps per-token log-probs only; "
            "use low_var_kl (k3), kl (k1) or mse (k2)",
        )
    if a.online_filtering and not a.filter_low < a.filter_high:
        problem(
            "algorithm.filter_low",
            f"{a.filter_low} must be below algorithm.filter_high ({a.filter_high}): no group could pass",
            "algorithm.filter_high",
        )
    if a.disable_kl and a.use_kl_loss:
        problem(
            "algorithm.use_kl_loss",
            "has no effect: algorithm.disable_kl is true (no reference model)",
            "algorithm.disable_kl",
            warning=True,
        )
    if a.kl_type == "adaptive" and a.use_kl_loss and not a.disable_kl:  # EasyR1's ray_trainer.py:635
        problem(
            "algorithm.kl_type",
            "'adaptive' has no effect with use_kl_loss: true: the controller adapts the KL penalty in the "
            "reward, and the loss uses kl_coef as it is (as in EasyR1); set use_kl_loss: false to adapt it",
            "algorithm.use_kl_loss",
            warning=True,
        )


def check_rollout(spec: Spec, problem: Report) -> None:
    r, t, d = spec.worker.rollout, spec.trainer, spec.data
    # the devices that hold engines: the rollout pool's when asynchronous
    pool, devices = (
        ("worker.rollout", r.n_gpus_per_node)
        if spec.async_training.enable
        else ("trainer", t.n_gpus_per_node)
    )
    if devices and devices % r.tensor_parallel_size:
        problem(
            "worker.rollout.tensor_parallel_size",
            f"{r.tensor_parallel_size} does not divide {pool}.n_gpus_per_node ({devices}); set it to "
            f"{_nearest_divisor(devices, r.tensor_parallel_size)}",
            f"{pool}.n_gpus_per_node",
        )
    need = d.max_prompt_length + d.max_response_length
    if r.max_num_batched_tokens < need:
        problem(
            "worker.rollout.max_num_batched_tokens",
            f"{r.max_num_batched_tokens} is less than data.max_prompt_length + data.max_response_length "
            f"({d.max_prompt_length} + {d.max_response_length} = {need}); set worker.rollout.max_num_batched_tokens={need}",
            "data.max_prompt_length",
            "data.max_response_length",
        )
    if r.max_model_len is not None and r.max_model_len < need:
        problem(
            "worker.rollout.max_model_len",
            f"{r.max_model_len} is less than prompt + response length ({need}); set it to {need} or leave it unset",
            "data.max_prompt_length",
            "data.max_response_length",
        )
    known = (*SAMPLING_KEYS, *EXTRA_SAMPLING)
    rules = _sampling_rules(d.max_response_length)
    for key, value in r.val_override_config.items():
        at = f"worker.rollout.val_override_config.{key}"
        if key not in known:
            close = difflib.get_close_matches(key, known, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else f"; use {', '.join(known)}"
            problem(at, f"is not a sampling setting{hint}")
        elif not rules[key][0](value):
            problem(at, f"{cut(repr(value), 60)} is not valid: must be {rules[key][1]}")


def _sampling_rules(max_response_length: int) -> dict:
    """Each sampling setting's test and what it must be (as vLLM's SamplingParams takes it)."""

    def number(lo=None, hi=None, above=None):
        return lambda v: (
            finite(v) is not None
            and (lo is None or v >= lo) and (hi is None or v <= hi) and (above is None or v > above)
        )  # fmt: skip

    def whole(lo, hi):
        return lambda v: isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi

    rules = {
        "n": (whole(1, 10_000), "a whole number from 1 to 10,000"),
        "temperature": (number(lo=0), "a number ≥ 0 (0 is greedy)"),
        "top_p": (number(hi=1, above=0), "a number above 0 and at most 1"),
        "top_k": (whole(-1, 2**31 - 1), "a whole number: -1 (all tokens) or more"),
        "seed": (whole(0, 2**32 - 1), "a whole number from 0 to 2^32 - 1"),
        "ignore_eos": (lambda v: isinstance(v, bool), "true or false"),
        "max_tokens": (whole(1, 10**7), "a whole number from 1 to 10,000,000"),
        "repetition_penalty": (number(above=0), "a number above 0 (1 is none)"),
        "min_tokens": (whole(0, max_response_length), f"a whole number from 0 to data.max_response_length ({max_response_length})"),
    }  # fmt: skip
    extra = {
        key: (number(lo, hi), f"a number from {lo:g} to {hi:g}" if hi is not None else f"a number ≥ {lo:g}")
        for key, (lo, hi) in EXTRA_SAMPLING.items()
    }
    return extra | rules


def check_secrets_and_envs(spec: Spec, problem: Report) -> None:
    for name in spec.secrets:
        if name in spec.envs:
            problem(
                f"envs.{name}",
                "is also a secret: its value would be stored in plain text; keep it under secrets only",
                "secrets",
            )


# An online tracker: the key it needs, and the setting that runs it without one.
TRACKER_KEYS = {
    "wandb": ("WANDB_API_KEY", "WANDB_MODE", ("offline", "disabled", "dryrun")),
    "swanlab": ("SWANLAB_API_KEY", "SWANLAB_MODE", ("offline", "local", "disabled")),
}


def check_nodes(spec: Spec, problem: Report) -> None:
    """Several nodes on local infra need a Ray cluster to spread over (group.py), never one node
    running them all: RAY_ADDRESS names it, as `ray start` prints."""
    t = spec.trainer
    if t.nnodes > 1 and spec.resources.infra == "local" and not os.environ.get("RAY_ADDRESS"):
        problem(
            "trainer.nnodes",
            f"{t.nnodes} nodes on local infra need a Ray cluster: run `ray start --head` here and `ray start "
            "--address=HEAD:6379` on the others, set RAY_ADDRESS=HEAD:6379 (save_checkpoint_path on storage "
            "every node sees), or use a cloud infra (--infra), or trainer.nnodes=1",
        )


def check_async(spec: Spec, problem: Report) -> None:
    """Asynchronous training: a rollout pool to run on, a bound the pushes can keep, and nothing that
    needs strictly on-policy data or the training devices' engines; its keys unset while it is off."""
    a, r, d = spec.async_training, spec.worker.rollout, spec.data
    if not a.enable:
        for key in (
            "max_staleness",
            "staleness_threshold",
            "trigger_parameter_sync_step",
            "use_rollout_log_probs",
        ):
            if getattr(a, key) != type(a).model_fields[key].default:  # a resolved spec writes them all
                problem(
                    f"async_training.{key}",
                    "is set while async_training.enable is false: set enable: true, or remove it",
                )
        for key in ("n_gpus_per_node", "nnodes"):
            if getattr(r, key) != type(r).model_fields[key].default:
                problem(
                    f"worker.rollout.{key}",
                    "rollout devices of their own are for async_training.enable: true; remove it",
                )
        return
    if r.n_gpus_per_node == 0:
        problem(
            "worker.rollout.n_gpus_per_node",
            "asynchronous training needs rollout devices: set it to 1 or more (they only generate; trainer.n_gpus_per_node train)",
        )
    if a.bound < a.trigger_parameter_sync_step - 1:
        problem(
            "async_training.max_staleness",
            f"a bound of {a.bound} cannot be kept with a push every {a.trigger_parameter_sync_step} updates: the trainer would wait for samples that wait for the push; set it to at least {a.trigger_parameter_sync_step - 1}, or push more often",
            "async_training.trigger_parameter_sync_step",
        )
    if spec.algorithm.estimator.greedy_baseline:
        problem(
            "algorithm.adv_estimator",
            "remax's greedy baselines are not supported with async_training yet: use grpo or rloo, or turn async_training off",
        )
    if spec.algorithm.online_filtering or d.mini_rollout_batch_size:
        which = (
            "algorithm.online_filtering"
            if spec.algorithm.online_filtering
            else "data.mini_rollout_batch_size"
        )
        problem(
            which,
            "is not supported with async_training yet (a step's batch is drawn in one round): remove it, or turn async_training off",
        )
    if spec.resources.infra != "local":
        problem(
            "async_training.enable",
            "runs on local infra only so far (a SkyPilot job does not place the rollout pool yet): use --infra local, or turn it off",
        )
    elif spec.trainer.nnodes > 1 or r.nnodes > 1:
        problem(
            "worker.rollout.nnodes" if r.nnodes > 1 else "trainer.nnodes",
            "asynchronous training runs on one node so far (the rollout pool is not yet placed across "
            "nodes): set trainer.nnodes and worker.rollout.nnodes to 1",
        )
    if spec.trainer.critic_warmup:
        problem(
            "trainer.critic_warmup",
            "is not supported with async_training yet (the actor's version stands still while the critic "
            "warms up): set it to 0, or turn async_training off",
        )


def check_trackers(spec: Spec, problem: Report) -> None:
    local = spec.resources.infra == "local"

    def given(name: str) -> str | None:  # a cloud node sees only the spec's envs and secrets
        if name in spec.secrets:
            return "(secret)"
        return spec.envs.get(name) or (os.environ.get(name) if local else None)

    for name in spec.trainer.logger:
        if name in ("console", "file"):
            continue
        if local and importlib.util.find_spec(name) is None:
            others = ",".join(f"'{x}'" for x in spec.trainer.logger if x != name) or "'console'"
            problem(
                "trainer.logger",
                f"names {name}, which is not installed here: pip install {name}, or run without it: "
                f"trainer.logger=[{others}]",
            )
        if name in TRACKER_KEYS:
            key, mode, offline = TRACKER_KEYS[name]
            if not given(key) and (given(mode) or "").lower() not in offline and not _logged_in(name, local):
                problem(
                    "trainer.logger",
                    f"{name} has no {key}: add {key} to secrets (its value from your environment or "
                    f"--secret), or set envs.{mode}=offline; as it is, the job stops before its first step",
                    warning=True,
                )
        if name == "mlflow" and not given("MLFLOW_TRACKING_URI"):
            where = "the run folder" if local else "the run folder on the head node, lost with the cluster"
            problem(
                "trainer.logger",
                f"mlflow has no MLFLOW_TRACKING_URI: it logs to mlflow.db in {where}; set envs.MLFLOW_TRACKING_URI "
                "to your tracking server",
                warning=True,
            )


def _logged_in(name: str, local: bool) -> bool:
    """`wandb login` keeps the key in ~/.netrc, which a local job reads."""
    if name != "wandb" or not local:
        return False
    try:
        return netrc.netrc().authenticators("api.wandb.ai") is not None
    except (OSError, netrc.NetrcParseError):
        return False


def check_keys(spec: Spec, problem: Report) -> None:
    """Keys the trainer does not support (spec/keys.py): one line each when set (not the default)."""
    default, current = Spec(name="defaults").model_dump(), spec.model_dump()
    for key in leaves():
        kind, text = classify(".".join(key)) or (None, "")
        if kind == REFUSED and get_path(current, key) != get_path(default, key):
            problem(".".join(key), text)


def check_images(spec: Spec, problem: Report) -> None:
    d = spec.data
    if d.min_pixels and d.max_pixels and d.min_pixels > d.max_pixels:
        problem(
            "data.min_pixels",
            f"({d.min_pixels}) is larger than data.max_pixels ({d.max_pixels}): images are scaled into "
            "[min_pixels, max_pixels]; lower min_pixels or raise max_pixels",
            "data.max_pixels",
        )


def check_multi_turn(spec: Spec, problem: Report) -> None:
    mt, at = spec.worker.rollout.multi_turn, "worker.rollout.multi_turn"
    if mt.enable and not mt.tools and not mt.environment:
        problem(
            f"{at}.tools",
            "multi-turn episodes need tools or an environment: give tools: file.py (or file.py:add,mul), "
            "or environment: file.py:Class",
        )
    if mt.enable and mt.tool_names and not mt.tools:
        problem(f"{at}.tool_names", "picks functions of tools, which is not set: give tools: file.py:a,b")
    if mt.environment and ":" not in mt.environment:
        problem(f"{at}.environment", f"{mt.environment} names no class: give file.py:Class")
    if not mt.enable:
        quiet = {"enable"} | ({"tool_names"} if mt.tools else set())  # tool_names comes with file.py:a,b
        for key in mt.model_dump(exclude_defaults=True, exclude=quiet):
            problem(
                f"{at}.{key}", f"has no effect while {at}.enable is false: set enable: true, or remove it"
            )


def check_freezing(spec: Spec, problem: Report) -> None:
    m = spec.worker.actor.model
    if m.freeze_language_model and m.freeze_vision_tower:
        problem(
            "worker.actor.model.freeze_language_model",
            "and freeze_vision_tower together leave at most the connector to train; keep one of them",
            "worker.actor.model.freeze_vision_tower",
        )
    if spec.worker.critic.model.freeze_language_model:
        problem(
            "worker.critic.model.freeze_language_model",
            "is not supported for the critic (its value head reads the language model); remove it",
        )
    if m.freeze_language_model and m.lora.rank:
        problem(
            "worker.actor.model.freeze_language_model",
            "is not supported with LoRA (which freezes the whole base already); choose the adapted "
            "modules with lora.target_modules instead, or remove it",
        )


def check_lora(spec: Spec, problem: Report) -> None:
    lora = spec.worker.actor.model.lora
    if lora.rank > 512 and lora.merge is not True and not lora.load_in_4bit:  # vLLM 0.32's largest
        problem(
            "worker.actor.model.lora.rank",
            f"{lora.rank} is above the largest adapter rank vLLM serves (512); lower it, or set "
            "worker.actor.model.lora.merge=true to sync merged weights instead of adapters",
        )
    # lora.merge chooses how the actor's adapters reach vLLM: where nothing is synced it cannot act
    if lora.merge is not None and not lora.rank:
        problem("worker.actor.model.lora.merge", "has no effect without LoRA (lora.rank > 0); remove it")
    elif lora.merge is False and spec.worker.rollout.name == "hf":
        problem(
            "worker.actor.model.lora.merge",
            "false syncs adapters into vLLM, and the rollout engine is hf (it takes merged weights); "
            "use worker.rollout.name=vllm or remove it",
        )
    if lora.load_in_4bit and not lora.rank:
        problem(
            "worker.actor.model.lora.load_in_4bit",
            "QLoRA trains adapters on a 4-bit base: set worker.actor.model.lora.rank (e.g. 16), or remove it",
        )
    elif lora.load_in_4bit and lora.merge is False:
        problem(
            "worker.actor.model.lora.merge",
            "false (adapters-only sync) is not supported with a 4-bit base yet: vLLM would hold the "
            "full-precision base, not the trainer's 4-bit one; remove it (4-bit syncs merged weights)",
        )
    if (
        lora.load_in_4bit
        and spec.resources.infra == "local"
        and importlib.util.find_spec("bitsandbytes") is None
    ):
        problem(
            "worker.actor.model.lora.load_in_4bit",
            "needs bitsandbytes, which is not installed here: pip install 'r1cloud[train]'",
        )
    if spec.worker.critic.model.lora.load_in_4bit:
        problem(
            "worker.critic.model.lora.load_in_4bit",
            "a 4-bit critic is not supported yet; train the critic with LoRA alone (lora.rank), or remove it",
        )
    if spec.worker.critic.model.lora.merge is not None:
        problem(
            "worker.critic.model.lora.merge",
            "has no effect: the critic is never synced into a rollout engine; remove it",
        )


CHECKS = [
    check_required,
    check_nodes,
    check_async,
    check_lora,
    check_freezing,
    check_batches,
    check_algorithm,
    check_rollout,
    check_secrets_and_envs,
    check_trackers,
    check_multi_turn,
    check_keys,
    check_images,
]
