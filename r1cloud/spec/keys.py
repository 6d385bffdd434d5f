"""What becomes of every key a blueprint accepts. No key is accepted and silently ignored:

- HONOURED: the trainer or the job does what it says (the text says where);
- INERT: accepted on purpose with no effect, because there is nothing for it to do (the text says why);
- REFUSED: not supported; a value other than the default is a problem (exit 2) saying what to do.

Patterns are dotted key paths; `*` stands for one or more parts (fnmatch), and the first match
wins. tests/test_keys.py walks the schema and fails on a key no pattern covers, and sets each
REFUSED key to check its line."""

from __future__ import annotations

import json
import types
from fnmatch import fnmatchcase
from typing import Annotated, Literal, Union, get_args, get_origin

from r1cloud.spec.load import all_keys, field_at, get_path
from r1cloud.spec.models import Spec

HONOURED, INERT, REFUSED = "honoured", "inert", "refused"

KEYS: dict[str, tuple[str, str]] = {
    # r1cloud's own keys
    "name": (HONOURED, "the job's name (core/jobstore.py)"),
    "resources.infra": (HONOURED, "local, or the SkyPilot infra (jobs/sky_task.py)"),
    "resources.max_cost": (
        HONOURED,
        "the trainer saves and stops before the next step would pass it (core/budget.py); validate refuses "
        "a cap with no price or below one step",
    ),
    "resources.*": (HONOURED, "the SkyPilot task (jobs/sky_task.py); a local job uses accelerators only"),
    "envs": (HONOURED, "the job's environment (jobs/local.py, jobs/sky_task.py)"),
    "secrets": (HONOURED, "the job's environment, never a file (jobs/local.py, jobs/sky_task.py)"),
    # data
    "data.filter_overlong_prompts_workers": (
        INERT,
        "prompts are measured once, in the driver, with the fast tokenizer: there are no workers to size",
    ),
    "data.video_fps": (
        HONOURED,
        "video.load: a video file sampled at this rate, as qwen_vl_utils' fetch_video",
    ),
    "data.*": (HONOURED, "the prompt sets (data/loader.py, media/vision.py)"),
    # algorithm
    "algorithm.*": (HONOURED, "advantages, KL and filtering (trainer/algorithms.py, trainer/driver.py)"),
    # workers
    "worker.hybrid_engine": (
        REFUSED,
        "r1cloud always colocates the actor and its rollout engine on each device (EasyR1 requires it "
        "too); set it to true",
    ),
    "worker.*.optim.strategy": (
        HONOURED,
        "adamw, or adamw_bf16: moment estimates in bf16 (trainer/optim.py)",
    ),
    "worker.*.strategy": (HONOURED, "FSDP2, the only strategy (trainer/workers.py)"),
    "worker.*.optim.training_steps": (INERT, "set by the trainer from the data and max_steps, as in EasyR1"),
    "worker.*.global_batch_size_per_device": (INERT, "derived from global_batch_size, as in EasyR1"),
    "worker.*.fsdp.enable_rank0_init": (
        HONOURED,
        "rank 0 reads the weights, the others build empty and receive their shards (trainer/model.py); "
        "a QLoRA base is read by each worker",
    ),
    "worker.*.fsdp.use_orig_params": (INERT, "FSDP1's option: FSDP2 always keeps the original parameters"),
    "worker.*.fsdp.mp_buffer_dtype": (INERT, "FSDP2 keeps buffers (rotary tables) in the model's dtype"),
    "worker.*.fsdp.enable_cpu_offload": (
        HONOURED,
        "FSDP2's CPUOffloadPolicy: shards, gradients and the optimizer step in host memory (trainer/offload.py)",
    ),
    "worker.ref.fsdp.fsdp_size": (
        REFUSED,
        "the reference model lives on the actor's device mesh, as in EasyR1 (fsdp_workers.py:118-127): "
        "set worker.actor.fsdp.fsdp_size instead, and -1 here",
    ),
    "worker.*.fsdp.fsdp_size": (
        HONOURED,
        "hybrid sharding: FSDP2 over a 2-D mesh, shards inside groups of fsdp_size devices and replicas "
        "across them; -1 or the device count: one group (trainer/workers.py)",
    ),
    "worker.*.fsdp.*": (HONOURED, "FSDP2's sharding and mixed precision (trainer/workers.py)"),
    "worker.ref.offload.offload_optimizer": (
        INERT,
        "the reference model has no optimizer: nothing to offload",
    ),
    "worker.*.offload.*": (
        HONOURED,
        "shards and optimizer state moved to host memory between phases, as EasyR1 does (trainer/offload.py)",
    ),
    "worker.ref.ulysses_size": (INERT, "copied from worker.actor, as in EasyR1"),
    "worker.*.ulysses_size": (
        HONOURED,
        "Ulysses sequence parallelism: groups of ulysses_size workers hold slices of one packed row, "
        "all-to-all around attention (trainer/ulysses.py); a VLM embeds the whole row, its language model runs the slice",
    ),
    "worker.*.padding_free": (INERT, "r1cloud always packs sequences without padding (trainer/batch.py)"),
    "worker.*.use_torch_compile": (
        INERT,
        "log-probs and entropy are computed in chunks without compiling (trainer/head.py), so there is "
        "nothing to compile",
    ),
    "worker.actor.disable_kl": (INERT, "copied from algorithm.disable_kl, as in EasyR1: set it there"),
    "worker.actor.use_kl_loss": (INERT, "copied from algorithm.use_kl_loss, as in EasyR1: set it there"),
    "worker.actor.kl_penalty": (INERT, "copied from algorithm.kl_penalty, as in EasyR1: set it there"),
    "worker.actor.kl_coef": (INERT, "copied from algorithm.kl_coef, as in EasyR1: set it there"),
    "worker.ref.micro_batch_size_per_device_for_experience": (
        INERT,
        "copied from worker.actor, as in EasyR1",
    ),
    "worker.ref.dynamic_batching": (INERT, "copied from worker.actor, as in EasyR1"),
    "worker.rollout.prompt_length": (INERT, "copied from data.max_prompt_length, as in EasyR1"),
    "worker.rollout.response_length": (INERT, "copied from data.max_response_length, as in EasyR1"),
    "worker.rollout.trust_remote_code": (INERT, "copied from worker.actor.model, as in EasyR1"),
    "worker.rollout.disable_tqdm": (INERT, "the rollout engines draw no progress bars"),
    "worker.rollout.disable_log_stats": (HONOURED, "vLLM's stats logging (rollout/)"),
    "worker.rollout.multi_turn.*": (HONOURED, "multi-turn episodes with tools and environments (agents/)"),
    "worker.rollout.n_gpus_per_node": (
        HONOURED,
        "asynchronous training's rollout-only workers per node (trainer/rollout_worker.py); verl's "
        "rollout.n_gpus_per_node (fully_async_ppo_trainer.yaml)",
    ),
    "worker.rollout.nnodes": (HONOURED, "asynchronous training's rollout nodes; verl's rollout.nnodes"),
    "worker.*": (
        HONOURED,
        "the workers (trainer/workers.py, trainer/model.py, rollout/, rewards/pool.py)",
    ),
    # trainer
    "trainer.save_model_only": (
        HONOURED,
        "checkpoints without the optimizer state; a resume from one starts the optimizer afresh",
    ),
    "trainer.ray_timeline": (HONOURED, "ray.timeline's Chrome trace, written when the run ends"),
    "trainer.*": (HONOURED, "the loop, checkpoints and trackers (trainer/driver.py, trainer/trackers.py)"),
    # asynchronous training (verl/experimental/fully_async_policy/config/fully_async_ppo_trainer.yaml)
    "async_training.partial_rollout": (
        REFUSED,
        "not supported yet: at a weight push the rollout workers finish the sequences in flight with the "
        "old weights; set it to false",
    ),
    "async_training.staleness_threshold": (
        HONOURED,
        "verl's fraction (fully_async_ppo_trainer.yaml:12) read in whole steps: max_staleness = ceil((1 + it) × "
        "trigger_parameter_sync_step) − 1 (AsyncTraining.bound in spec/models.py)",
    ),
    "async_training.trigger_parameter_sync_step": (
        HONOURED,
        "updates between weight pushes (verl's, fully_async_ppo_trainer.yaml:16); the default is 1 here, 4 in verl",
    ),
    "async_training.max_staleness": (
        HONOURED,
        "r1cloud's (TRL's and AReaL's meaning): most updates a sample's policy may lag; not in verl",
    ),
    "async_training.*": (HONOURED, "rollout and training overlapped (trainer/stream.py); verl's names"),
}


def classify(path: str) -> tuple[str, str] | None:
    """(kind, text) of the first pattern matching the dotted `path`."""
    for pattern, entry in KEYS.items():
        if fnmatchcase(path, pattern):
            return entry
    return None


def leaves() -> list[tuple[str, ...]]:
    """Every leaf key of the schema: the keys load.all_keys walks, less the sections."""
    keys = all_keys()
    sections = {k[:-1] for k in keys}
    return [k for k in keys if k not in sections]


# --------------------------------------------------------------------------- the key reference
def _type(annotation) -> str:
    """A field's type as a reader says it: `str or null`, `one of grpo, gae, …`."""
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Literal:
        return "one of " + ", ".join(map(str, args))
    if origin in (Union, types.UnionType):
        return " or ".join(_type(a) for a in args)
    if origin is Annotated:
        return _type(args[0])
    if annotation is type(None):
        return "null"
    return annotation.__name__ if origin is None else str(annotation).replace("typing.", "")


def reference() -> str:
    """docs/reference/keys.md: every key with its type, default, meaning (the schema's field
    descriptions) and what r1cloud does with it (KEYS). `scripts/reference` writes it and
    tests/test_docs.py checks it is current."""
    default = Spec(name="defaults").model_dump(mode="json")
    out = [
        "# Key reference",
        "",
        "Every key a blueprint accepts: its type, its default, what it means (EasyR1's meaning where the key "
        "is EasyR1's) and what r1cloud does with it — **honoured** (and where), **inert** (accepted on "
        "purpose with nothing to do, and why) or **refused** (a value other than the default is an error "
        "saying what to do instead). Generated from the schema (`r1cloud/spec/models.py`) and its table "
        "(`r1cloud/spec/keys.py`) by `scripts/reference`; do not edit by hand.",
    ]
    leaf_set = set(leaves())
    for key in all_keys():
        path, f, leaf = ".".join(key), field_at(key), key in leaf_set
        if len(key) == 1 or (len(key) == 2 and not leaf):  # a section, or a top-level key: a heading
            out += ["", f"{'#' * (len(key) + 1)} `{path}`", ""] + ([] if leaf else [f.description or "", ""])
            out += ["| key | type | default | meaning | r1cloud |", "|---|---|---|---|---|"]
        if not leaf:
            continue
        kind, text = classify(path) or (HONOURED, "")
        value = json.dumps(get_path(default, key), ensure_ascii=False)
        shown = "required" if key == ("name",) else f"`{value}`"
        cells = [f"`{path}`", _type(f.annotation), shown, f.description or "", f"**{kind}**: {text}"]
        out.append("| " + " | ".join(c.replace("|", "\\|").replace("\n", " ") for c in cells) + " |")
    return "\n".join(out) + "\n"
