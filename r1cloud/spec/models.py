"""The blueprint schema: EasyR1's config tree (same keys, types, defaults) plus r1cloud's own keys.

Every model forbids unknown keys, so a typo is an error, not a silently ignored setting. Fields
EasyR1 computes itself ("auto keys", `init=False` in its dataclasses) are accepted on input so that a
dumped EasyR1 config loads, and are then overwritten from their sources in `Spec._derive`, which
is idempotent: a resolved spec validates back to itself.
"""

from __future__ import annotations

import math
import re
from typing import Annotated, Any, Literal, get_args

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

from .problems import shown

ADV_ESTIMATORS = (
    "grpo",
    "gae",
    "grpo_passk",
    "rloo",
    "reinforce_plus_plus",
    "reinforce_plus_plus_baseline",
    "remax",
    "dapo",
)
GROUP_ESTIMATORS = ("grpo", "grpo_passk", "rloo", "dapo", "reinforce_plus_plus_baseline")
KL_PENALTIES = ("kl", "abs", "mse", "low_var_kl", "full")
LOSS_TYPES = ("default", "gspo", "gspo_token", "cispo", "sapo")
ROLLOUT_IS_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")
# `adv_estimator: dapo` is GRPO advantages with DAPO's settings, where the blueprint leaves them unset.
DAPO_PRESET = {
    "actor": {"clip_ratio_low": 0.2, "clip_ratio_high": 0.28, "loss_avg_mode": "token"},
    "algorithm": {"disable_kl": True, "online_filtering": True},
}
LOGGERS = ("console", "file", "mlflow", "swanlab", "tensorboard", "wandb")
# every dtype name a blueprint may give, and torch's name for it: the one table (trainer, vLLM, merge)
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


# SamplingParams fields EasyR1 lets `val_override_config` (and the ReMax baseline) override.
SAMPLING_KEYS = ("n", "temperature", "top_p", "top_k", "seed", "ignore_eos", "max_tokens")
# vLLM SamplingParams fields beyond those, passed through to validation's sampling (rollout.EXTRA
# says which the hf engine has too); the numbers each may take.
EXTRA_SAMPLING = {
    "min_p": (0.0, 1.0),
    "repetition_penalty": (0.0, None),
    "presence_penalty": (-2.0, 2.0),
    "frequency_penalty": (-2.0, 2.0),
    "min_tokens": (0, None),
}
KNOWN_INFRA = (
    "local", "aws", "gcp", "azure", "k8s", "kubernetes", "lambda", "runpod", "nebius", "oci", "ibm",
    "cudo", "fluidstack", "paperspace", "vast", "do", "scp", "vsphere", "hyperbolic", "ssh", "seeweb",
    "primeintellect", "*",
)  # fmt: skip

Dtype = Literal[DTYPES]  # type: ignore[valid-type]


def minus_one_or_positive(meaning: str) -> AfterValidator:
    """EasyR1's convention for counts where -1 is special and 0 would divide by zero later."""

    def check(v: int) -> int:
        if v == 0 or v < -1:
            raise ValueError(f"{v} is not valid: must be -1 ({meaning}) or a positive number")
        return v

    return AfterValidator(check)


Off = int  # EasyR1's meaning: 0 or less is off (val_freq, save_freq) or no limit (save_limit)


def _plain_values(section: dict) -> dict:
    """A free-form section holds plain values: finite numbers, at most 10,000 values, 20 levels deep
    (a YAML alias repeated, or one that refers to itself, would be millions of them, or endless)."""
    count = 0

    def walk(value, depth: int) -> None:
        nonlocal count
        count += 1
        if count > 10_000 or depth > 20:
            raise ValueError(
                "is too large or too deep (10,000 values and 20 levels at most): a YAML alias repeated, "
                "or one that refers to itself?"
            )
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"holds {value}: give a finite number")
        for item in value.values() if isinstance(value, dict) else value if isinstance(value, list) else ():
            walk(item, depth + 1)

    walk(section, 0)
    return section


FreeForm = Annotated[dict[str, Any], AfterValidator(_plain_values)]


class Model(BaseModel):
    # inf and nan are no setting's value (and would make --json print invalid JSON)
    model_config = ConfigDict(extra="forbid", validate_default=False, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_a_number(cls, v, info):
        """YAML's true/false is not a number (pydantic would read true as 1)."""
        if isinstance(v, bool) and info.field_name in cls.model_fields:
            kinds = set(get_args(cls.model_fields[info.field_name].annotation)) or {
                cls.model_fields[info.field_name].annotation
            }
            if kinds - {type(None)} and kinds - {type(None)} <= {int, float}:
                raise ValueError(f"{str(v).lower()} is not a number")
        return v


# --------------------------------------------------------------------------- data
class DataConfig(Model):
    train_files: str | list[str] = ""  # a list: several data sets, mixed (r1cloud)
    val_files: str | list[str] = ""
    train_files_probs: list[float] | None = None  # r1cloud: sampling weights of the train_files list
    prompt_key: str = "prompt"
    answer_key: str = "answer"
    image_key: str = "images"
    video_key: str = "videos"
    image_dir: str | None = None
    video_fps: float = Field(2.0, gt=0)
    max_prompt_length: int = Field(512, ge=1)
    max_response_length: int = Field(512, ge=1)
    rollout_batch_size: int = Field(512, ge=1)
    mini_rollout_batch_size: int | None = Field(None, ge=1)
    val_batch_size: Annotated[int, minus_one_or_positive("the whole validation set in one batch")] = -1
    format_prompt: str | None = None
    override_chat_template: str | None = None
    shuffle: bool = True
    seed: int = 1
    min_pixels: int | None = Field(262144, ge=1)
    max_pixels: int | None = Field(4194304, ge=1)
    filter_overlong_prompts: bool = True
    filter_overlong_prompts_workers: int = Field(16, ge=1)


# --------------------------------------------------------------------------- algorithm
class AlgorithmConfig(Model):
    gamma: float = Field(1.0, ge=0, le=1)
    lam: float = Field(1.0, ge=0, le=1)
    adv_estimator: Literal[ADV_ESTIMATORS] = "grpo"  # type: ignore[valid-type]
    norm_adv_by_std_in_grpo: bool = True  # verl's key; false is Dr.GRPO's advantage
    disable_kl: bool = False
    use_kl_loss: bool = False
    kl_penalty: Literal[KL_PENALTIES] = "kl"  # type: ignore[valid-type]
    kl_coef: float = Field(1e-3, ge=0)
    kl_type: Literal["fixed", "adaptive"] = "fixed"
    kl_horizon: float = Field(10000.0, gt=0)
    kl_target: float = Field(0.1, gt=0)
    online_filtering: bool = False
    filter_key: str = "overall"
    filter_low: float = 0.01
    filter_high: float = 0.99


# --------------------------------------------------------------------------- worker
class LoraConfig(Model):
    rank: int = Field(0, ge=0)
    alpha: int = Field(64, ge=1)
    target_modules: str = "all-linear"
    exclude_modules: str | None = None
    # verl's `lora.merge`: true syncs merged weights into vLLM, false the adapters only (a
    # LoRA-enabled engine); null: adapters on GPUs, merged weights on CPU (README: LoRA)
    merge: bool | None = None
    # QLoRA (TRL's and OpenRLHF's `load_in_4bit`): the frozen base loaded in 4-bit NF4 through
    # bitsandbytes; the adapters train in full precision
    load_in_4bit: bool = False

    @field_validator("target_modules", "exclude_modules")
    @classmethod
    def _strip(cls, v: str | None) -> str | None:
        return v.strip() if isinstance(v, str) else v


class ModelConfig(Model):
    model_path: str | None = None
    tokenizer_path: str | None = None
    override_config: FreeForm = Field(default_factory=dict)
    enable_gradient_checkpointing: bool = True
    trust_remote_code: bool = True
    freeze_vision_tower: bool = False
    # r1cloud (LLaVA's stage 1, Qwen-VL fine-tuning's freeze_llm): a VLM's language model frozen,
    # only the vision tower and connector train
    freeze_language_model: bool = False
    lora: LoraConfig = Field(default_factory=LoraConfig)


class OptimConfig(Model):
    lr: float = Field(1e-6, ge=0)
    betas: tuple[float, float] = (0.9, 0.999)
    weight_decay: float = Field(1e-2, ge=0)
    strategy: Literal["adamw", "adamw_bf16"] = "adamw"
    lr_warmup_ratio: float = Field(0.0, ge=0, le=1)
    lr_warmup_steps: int | None = Field(None, ge=0)
    min_lr_ratio: float | None = Field(None, ge=0, le=1)
    lr_scheduler_type: Literal["constant", "cosine"] = "constant"
    training_steps: int = -1  # auto: set by the trainer from the step count

    @field_validator("betas")
    @classmethod
    def _betas(cls, v: tuple[float, float]) -> tuple[float, float]:
        if not all(0 <= b < 1 for b in v):
            raise ValueError("each beta must be in [0, 1)")
        return v


class FSDPConfig(Model):
    enable_full_shard: bool = True
    enable_cpu_offload: bool = False
    enable_rank0_init: bool = True
    use_orig_params: bool = False
    torch_dtype: Dtype | None = None
    fsdp_size: Annotated[int, minus_one_or_positive("shard across all devices")] = -1
    mp_param_dtype: Dtype = "bf16"
    mp_reduce_dtype: Dtype = "fp32"
    mp_buffer_dtype: Dtype = "fp32"


class OffloadConfig(Model):
    offload_params: bool = False
    offload_optimizer: bool = False


class TrainedRole(Model):
    """What the actor and the critic share (EasyR1 repeats it in ActorConfig and CriticConfig)."""

    strategy: Literal["fsdp"] = "fsdp"
    global_batch_size: int = Field(256, ge=1)
    micro_batch_size_per_device_for_update: int = Field(4, ge=1)
    micro_batch_size_per_device_for_experience: int = Field(16, ge=1)
    max_grad_norm: float = Field(1.0, gt=0)
    # EasyR1's token|seq, or verl's loss_agg_mode names (seq-mean-token-sum-norm is Dr.GRPO's)
    loss_avg_mode: Literal[
        "token", "seq", "token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"
    ] = "token"
    ppo_epochs: int = Field(1, ge=1)
    dynamic_batching: bool = True
    ulysses_size: int = Field(1, ge=1)
    model: ModelConfig = Field(default_factory=ModelConfig)
    optim: OptimConfig = Field(default_factory=OptimConfig)
    fsdp: FSDPConfig = Field(default_factory=FSDPConfig)
    offload: OffloadConfig = Field(default_factory=OffloadConfig)
    global_batch_size_per_device: int = -1  # auto


class ActorConfig(TrainedRole):
    clip_ratio_low: float = Field(0.2, ge=0)
    clip_ratio_high: float = Field(0.3, ge=0)
    clip_ratio_dual: float = Field(3.0, ge=1)
    loss_type: Literal[LOSS_TYPES] = "default"  # type: ignore[valid-type]
    padding_free: bool = True
    use_torch_compile: bool = True
    tau_positive: float = Field(1.0, gt=0)
    tau_negative: float = Field(1.05, gt=0)
    # r1cloud: an entropy bonus (verl's entropy_coeff), and truncated importance sampling against
    # the rollout engine's own log-probs (TRL's modes; off by default)
    entropy_coeff: float = Field(0.0, ge=0)
    rollout_is: Literal[ROLLOUT_IS_MODES] | None = None  # type: ignore[valid-type]
    rollout_is_cap: float = Field(3.0, gt=0)
    # auto keys (copied from `algorithm`)
    disable_kl: bool = False
    use_kl_loss: bool = False
    kl_penalty: Literal[KL_PENALTIES] = "kl"  # type: ignore[valid-type]
    kl_coef: float = 0.0


class CriticConfig(TrainedRole):
    cliprange_value: float = Field(0.5, ge=0)
    padding_free: bool = False


class RefConfig(Model):
    strategy: Literal["fsdp"] = "fsdp"
    fsdp: FSDPConfig = Field(default_factory=FSDPConfig)
    offload: OffloadConfig = Field(default_factory=OffloadConfig)
    # auto keys (copied from the actor)
    micro_batch_size_per_device_for_experience: int = -1
    padding_free: bool = False
    dynamic_batching: bool = False
    ulysses_size: int = 1
    use_torch_compile: bool = True


class MultiTurnConfig(Model):
    """r1cloud's own: multi-turn episodes with tools (agents/)."""

    enable: bool = False
    tools: str | None = None  # file.py (its public functions) or file.py:add,mul
    tool_names: list[str] | None = None  # auto: the part after ':' (None: every public function)
    environment: str | None = None  # file.py:Class, TRL-shaped or gym-shaped (agents/tools.py)
    max_turns: int = Field(4, ge=1)  # the model's turns per episode
    max_tool_response_length: int = Field(1024, ge=1)  # characters of one tool's output
    tool_timeout: float = Field(10.0, gt=0)  # seconds per call
    tool_call_format: Literal["hermes", "python"] = "hermes"


class RolloutConfig(Model):
    # r1cloud adds `hf` (transformers generate) and `auto` (vllm when importable, else hf).
    name: Literal["vllm", "hf", "auto"] = "vllm"
    n: int = Field(1, ge=1)
    temperature: float = Field(1.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(-1, ge=-1)
    seed: int = 1
    limit_images: int = Field(0, ge=0)
    dtype: Dtype = "bf16"
    gpu_memory_utilization: float = Field(0.6, gt=0, le=1)
    ignore_eos: bool = False
    enforce_eager: bool = False
    enable_chunked_prefill: bool = False
    tensor_parallel_size: int = Field(2, ge=1)
    max_model_len: int | None = Field(None, ge=1)
    max_num_batched_tokens: int = Field(8192, ge=1)
    disable_log_stats: bool = True
    disable_tqdm: bool = False
    val_override_config: FreeForm = Field(default_factory=dict)
    multi_turn: MultiTurnConfig = Field(default_factory=MultiTurnConfig)
    # auto keys (copied from `data` / the actor model)
    prompt_length: int = -1
    response_length: int = -1
    trust_remote_code: bool = False


class RewardConfig(Model):
    reward_function: str | None = None
    reward_function_kwargs: FreeForm = Field(default_factory=dict)
    skip_special_tokens: bool = True
    num_cpus: int = Field(1, ge=0)
    reward_function_name: str | None = None  # auto: the part after ':' (default `main`)
    # EasyR1 v0.3.2 chose batch/sequential here; now the module's REWARD_TYPE does. Kept so old
    # configs still say what they meant; it wins over the module when set.
    reward_type: Literal["batch", "sequential"] | None = None
    timeout: float = Field(30.0, gt=0)  # r1cloud: seconds per sample before a call is given up


class WorkerConfig(Model):
    hybrid_engine: bool = True  # only true is supported (spec/keys.py)
    actor: ActorConfig = Field(default_factory=ActorConfig)
    critic: CriticConfig = Field(default_factory=CriticConfig)
    ref: RefConfig = Field(default_factory=RefConfig)
    reward: RewardConfig = Field(default_factory=RewardConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)


# --------------------------------------------------------------------------- trainer
class TrainerConfig(Model):
    total_epochs: int = Field(15, ge=1)
    max_steps: int | None = Field(None, ge=1)
    project_name: str = "easy_r1"
    experiment_name: str | None = None  # the trackers' run name; unset: the job's name (EasyR1: "demo")
    logger: tuple[Literal[LOGGERS], ...] = ("console", "wandb")  # type: ignore[valid-type]
    nnodes: int = Field(1, ge=1)
    n_gpus_per_node: int = Field(8, ge=1)
    max_try_make_batch: int = 20
    critic_warmup: int = Field(0, ge=0)
    val_freq: Off = -1
    val_before_train: bool = True
    val_only: bool = False
    val_generations_to_log: int = 0  # 0 or less: none
    save_freq: Off = -1
    save_limit: Off = -1
    save_model_only: bool = False
    save_checkpoint_path: str | None = None  # None: the job's run directory decides (r1cloud)
    load_checkpoint_path: str | None = None
    ray_timeline: str | None = None
    find_last_checkpoint: bool = True
    # r1cloud: write merged Hugging Face weights into the last checkpoint, so it is INFERENCE READY
    save_hf: bool = True

    @field_validator("logger", mode="before")
    @classmethod
    def _logger(cls, v: Any) -> Any:
        return (v,) if isinstance(v, str) else v


# --------------------------------------------------------------------------- r1cloud's own keys
ACCEL_RE = re.compile(r"^([A-Za-z][A-Za-z0-9_.-]*)(?::(\d+))?$")


def parse_accelerator(text: str) -> tuple[str, int]:
    """`H100:8` -> ("H100", 8); `H100` -> ("H100", 1)."""
    m = ACCEL_RE.match(text.strip())
    if not m or (m.group(2) is not None and not 1 <= int(m.group(2)) <= 4096):
        raise ValueError(f"{text[:40]!r} is not an accelerator; write NAME:COUNT (1 to 4096), e.g. H100:8")
    return m.group(1), int(m.group(2) or 1)


class Resources(Model):
    infra: str = "local"
    # One `H100:8`, a list tried in order, or a dict of alternatives {H100: 8, A100-80GB: 8}.
    accelerators: str | list[str] | dict[str, int] | None = None
    num_nodes: int = Field(1, ge=1)
    use_spot: bool = False
    disk_size: int | None = Field(None, ge=1)
    image: str | None = None
    region: str | None = None
    # Cloud jobs: checkpoints go to <bucket>/<job name>/checkpoints (s3://, gs://, r2://, …)
    bucket: str | None = None
    # Dollars for the whole job at its catalog price: the trainer saves and stops before passing it
    max_cost: float | None = Field(None, gt=0, allow_inf_nan=False)

    @field_validator("infra")
    @classmethod
    def _infra(cls, v: str) -> str:
        cloud = v.strip().split("/", 1)[0].lower()
        if cloud not in KNOWN_INFRA:
            raise ValueError(
                f"unknown infra {cloud!r}; use local or a SkyPilot infra ({', '.join(KNOWN_INFRA[1:8])}, …)"
            )
        return v.strip()

    @field_validator("bucket")
    @classmethod
    def _bucket(cls, v: str | None) -> str | None:
        if v is not None and (not _is_url(v) or not v.split("://", 1)[1].strip("/")):
            raise ValueError(
                f"{v[:80]!r} is not a bucket URL: write s3://BUCKET[/PREFIX] (or gs://, r2://, az://)"
            )
        return v

    @field_validator("disk_size", mode="before")
    @classmethod
    def _disk(cls, v: Any) -> Any:
        if isinstance(v, str) and re.fullmatch(r"\s*\d+\s*(GB|gb)?\s*", v):
            return int(re.sub(r"\D", "", v))
        return v

    @field_validator("accelerators")
    @classmethod
    def _accels(cls, v: Any) -> Any:
        if v is None:
            return v
        options = accelerator_options(v)
        counts = {c for _, c in options}
        if len(counts) > 1:
            raise ValueError(
                f"alternatives must use the same count (got {sorted(counts)}): the trainer needs one "
                "device count per node"
            )
        return v


def accelerator_options(value: str | list[str] | dict[str, int]) -> list[tuple[str, int]]:
    if isinstance(value, str):
        return [parse_accelerator(value)]
    if isinstance(value, list):
        if not value:
            raise ValueError("the list of accelerators is empty")
        return [parse_accelerator(a) for a in value]
    out = []
    for name, count in value.items():
        parsed, _ = parse_accelerator(name)
        if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= 4096:
            raise ValueError(
                f"{name}: {str(count)[:20]} is not a count of devices (a whole number from 1 to 4096)"
            )
        out.append((parsed, count))
    if not out:
        raise ValueError("the dict of accelerators is empty")
    return out


ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
NAME_RE = re.compile(r"^[a-z0-9]([a-z0-9-]{1,61})[a-z0-9]$")


def normalise_name(text: str) -> str:
    """A file stem such as `Math12k_GRPO.v2` -> `math12k-grpo-v2` (3–63 chars of a-z0-9-)."""
    name = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:63].strip("-")
    return name if len(name) >= 3 else (name + "-job")[:63].strip("-")


# --------------------------------------------------------------------------- the whole spec
class Spec(Model):
    name: str
    resources: Resources = Field(default_factory=Resources)
    envs: dict[str, str] = Field(default_factory=dict)
    secrets: list[str] = Field(default_factory=list)
    data: DataConfig = Field(default_factory=DataConfig)
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)
    worker: WorkerConfig = Field(default_factory=WorkerConfig)
    trainer: TrainerConfig = Field(default_factory=TrainerConfig)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not NAME_RE.match(v):
            raise ValueError(
                f"{v!r} is not a job name: use 3–63 characters of a-z, 0-9 and '-', e.g. {normalise_name(v)!r}"
            )
        return v

    @field_validator("envs", mode="before")
    @classmethod
    def _envs(cls, v: Any) -> Any:
        if not isinstance(v, dict):
            return v
        out = {}
        for k, val in v.items():
            if not isinstance(k, str) or not ENV_NAME_RE.match(k):
                raise ValueError(f"{k!r} is not an environment variable name")
            if isinstance(val, dict | list) or val is None:
                raise ValueError(f"{k}: environment values are plain strings, numbers or booleans")
            out[k] = str(val).lower() if isinstance(val, bool) else str(val)
        return out

    @field_validator("secrets", mode="before")
    @classmethod
    def _secrets(cls, v: Any) -> Any:
        # SkyPilot writes secrets as {NAME: null}; a value here would be stored in plain text.
        if isinstance(v, dict):
            written = [k for k, val in v.items() if val is not None]
            if written:
                raise ValueError(
                    f"secret values must not be written in a blueprint ({', '.join(map(shown, written))}): "
                    "list the names only and pass values with --secret NAME or the environment"
                )
            v = list(v)
        if isinstance(v, str):
            v = [v]
        if isinstance(v, list):
            bad = [s for s in v if not isinstance(s, str) or not ENV_NAME_RE.match(s)]
            if bad:
                raise ValueError(f"{bad[0]!r} is not an environment variable name")
            return list(dict.fromkeys(v))
        return v

    @model_validator(mode="after")
    def _derive(self) -> Spec:
        """EasyR1's post_init copies, so the trainer reads one consistent tree."""
        d, a, w = self.data, self.algorithm, self.worker
        if a.adv_estimator == "dapo":
            for target, values in ((w.actor, DAPO_PRESET["actor"]), (a, DAPO_PRESET["algorithm"])):
                for key, value in values.items():
                    if key not in target.model_fields_set:
                        setattr(target, key, value)
        w.rollout.prompt_length = d.max_prompt_length
        w.rollout.response_length = d.max_response_length
        w.rollout.trust_remote_code = w.actor.model.trust_remote_code
        w.actor.disable_kl = a.disable_kl
        w.actor.use_kl_loss = a.use_kl_loss
        w.actor.kl_penalty = a.kl_penalty
        w.actor.kl_coef = a.kl_coef
        w.ref.micro_batch_size_per_device_for_experience = w.actor.micro_batch_size_per_device_for_experience
        w.ref.padding_free = w.actor.padding_free
        w.ref.dynamic_batching = w.actor.dynamic_batching
        w.ref.ulysses_size = w.actor.ulysses_size
        w.ref.use_torch_compile = w.actor.use_torch_compile
        for model in (w.actor.model, w.critic.model):
            if model.tokenizer_path is None:
                model.tokenizer_path = model.model_path
        world = self.trainer.nnodes * self.trainer.n_gpus_per_node
        for role in (w.actor, w.critic):
            per_device = role.global_batch_size * w.rollout.n // max(world // role.ulysses_size, 1)
            role.global_batch_size_per_device = per_device
        if w.reward.reward_function and not _is_url(w.reward.reward_function):
            path, sep, fn = w.reward.reward_function.rpartition(":")
            if sep and fn and "/" not in fn and "\\" not in fn:
                w.reward.reward_function, w.reward.reward_function_name = path, fn
            elif w.reward.reward_function_name is None:
                w.reward.reward_function_name = "main"
        mt = w.rollout.multi_turn
        if mt.tools and not mt.tools.endswith(".py") and ":" in mt.tools:
            mt.tools, names = mt.tools.rsplit(":", 1)
            mt.tool_names = [n.strip() for n in names.split(",") if n.strip()]
        return self

    @property
    def world_size(self) -> int:
        return self.trainer.nnodes * self.trainer.n_gpus_per_node


def _is_url(text: str) -> bool:
    return bool(re.match(r"^[a-z][a-z0-9+.-]*://", text))
