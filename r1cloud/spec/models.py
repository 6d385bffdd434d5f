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

from r1cloud.core.accelerators import accelerator_options
from r1cloud.core.dtypes import DTYPES
from r1cloud.core.estimators import ESTIMATORS, Estimator
from r1cloud.spec.problems import shown

KL_PENALTIES = ("kl", "abs", "mse", "low_var_kl", "full")
LOSS_TYPES = ("default", "gspo", "gspo_token", "cispo", "sapo")
ROLLOUT_IS_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")
LOGGERS = ("console", "file", "mlflow", "swanlab", "tensorboard", "wandb")
# SamplingParams fields EasyR1 lets `val_override_config` (and the ReMax baseline) override.
SAMPLING_KEYS = ("n", "temperature", "top_p", "top_k", "seed", "ignore_eos", "max_tokens")
# vLLM SamplingParams fields beyond those, passed through to validation's sampling
# (rollout/engine.HF_EXTRA says which the hf engine has too); the numbers each may take.
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
Stripped = Annotated[str, AfterValidator(str.strip)]


class Model(BaseModel):
    # inf and nan are no setting's value (and would make --json print invalid JSON)
    # use_attribute_docstrings: the string under each field is its description, the meaning the key
    # reference (docs/reference/keys.md) shows
    model_config = ConfigDict(
        extra="forbid", validate_default=False, allow_inf_nan=False, use_attribute_docstrings=True
    )

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_a_number(cls, v, info):
        """YAML's true/false is not a number (pydantic would read true as 1)."""
        if isinstance(v, bool) and info.field_name in cls.model_fields:
            annotation = cls.model_fields[info.field_name].annotation
            kinds = (set(get_args(annotation)) or {annotation}) - {type(None)}
            if kinds and kinds <= {int, float}:
                raise ValueError(f"{str(v).lower()} is not a number")
        return v


# --------------------------------------------------------------------------- data
class DataConfig(Model):
    train_files: str | list[str] = ""
    """Training prompts: Hub `name@split`, a file or a folder; a list: several sets, mixed (r1cloud)."""
    val_files: str | list[str] = ""
    """Validation prompts, in the same forms as train_files."""
    train_files_probs: list[float] | None = None
    """r1cloud: sampling weights of the train_files list (normalised); null: one set after another."""
    prompt_key: str = "prompt"
    """The data column that holds each prompt's text."""
    answer_key: str = "answer"
    """The data column that holds the ground truth given to the reward function."""
    image_key: str = "images"
    """The data column that holds a row's images (the prompt marks where each goes with `<image>`)."""
    video_key: str = "videos"
    """The data column that holds a row's videos (the prompt marks where each goes with `<video>`)."""
    image_dir: str | None = None
    """Folder that relative image and video paths in the data are joined to; null: used as written."""
    video_fps: float = Field(2.0, gt=0)
    """Frames per second sampled from each video."""
    max_prompt_length: int = Field(512, ge=1)
    """Longest prompt in tokens, images' included; a longer one is dropped or cut on the right."""
    max_response_length: int = Field(512, ge=1)
    """Most tokens generated for one response."""
    rollout_batch_size: int = Field(512, ge=1)
    """Prompts per training step (verl's data.train_batch_size)."""
    mini_rollout_batch_size: int | None = Field(None, ge=1)
    """Prompts per generation round (verl's data.gen_batch_size); rounds repeat until a step has
    rollout_batch_size prompts. Null: rollout_batch_size."""
    val_batch_size: Annotated[int, minus_one_or_positive("the whole validation set in one batch")] = -1
    """Prompts per validation batch; -1: the whole validation set in one batch."""
    format_prompt: str | None = None
    """Jinja template file each prompt is rendered through (the prompt is its `content`); null: none."""
    override_chat_template: str | None = None
    """File whose Jinja chat template replaces the tokenizer's and processor's; null: the model's own."""
    shuffle: bool = True
    """Shuffle the training prompts (with seed); false: in file order."""
    seed: int = 1
    """Random seed of the training prompts' shuffle."""
    min_pixels: int | None = Field(262144, ge=1)
    """Images and video frames under this many pixels (width × height) are scaled up; null: no floor."""
    max_pixels: int | None = Field(4194304, ge=1)
    """Images and video frames over this many pixels (width × height) are scaled down; null: no cap."""
    filter_overlong_prompts: bool = True
    """Drop prompts over max_prompt_length tokens before training; false: cut them on the right."""
    filter_overlong_prompts_workers: int = Field(16, ge=1)
    """Processes that measure the training prompts for filter_overlong_prompts."""


# --------------------------------------------------------------------------- algorithm
class AlgorithmConfig(Model):
    gamma: float = Field(1.0, ge=0, le=1)
    """Discount factor of the GAE advantage estimator."""
    lam: float = Field(1.0, ge=0, le=1)
    """Lambda of the GAE advantage estimator."""
    adv_estimator: Literal[tuple(ESTIMATORS)] = "grpo"  # type: ignore[valid-type]
    """How advantages are computed; dapo (r1cloud): GRPO's, with DAPO's settings where left unset."""
    norm_adv_by_std_in_grpo: bool = True
    """verl's key: divide GRPO's group-relative advantage by the group's std; false is Dr.GRPO's."""
    disable_kl: bool = False
    """No reference model and no KL term at all."""
    use_kl_loss: bool = False
    """KL to the reference as a term of the actor's loss; false: a penalty subtracted from the reward."""
    kl_penalty: Literal[KL_PENALTIES] = "kl"  # type: ignore[valid-type]
    """How KL is estimated from log-probs: kl (k1), abs, mse (k2), low_var_kl (k3) or full."""
    kl_coef: float = Field(1e-3, ge=0)
    """KL coefficient (the adaptive controller's starting value)."""
    kl_type: Literal["fixed", "adaptive"] = "fixed"
    """Controller of the in-reward KL coefficient: fixed, or adaptive (toward kl_target)."""
    kl_horizon: float = Field(10000.0, gt=0)
    """Horizon of the adaptive KL controller, in samples."""
    kl_target: float = Field(0.1, gt=0)
    """Target KL of the adaptive KL controller."""
    online_filtering: bool = False
    """DAPO's dynamic sampling: drop groups whose mean filter_key score is out of bounds, and refill."""
    filter_key: str = "overall"
    """The reward function's score that online filtering reads."""
    filter_low: float = 0.01
    """Online filtering drops a prompt's group whose mean score is this or lower."""
    filter_high: float = 0.99
    """Online filtering drops a prompt's group whose mean score is this or higher."""

    @property
    def estimator(self) -> Estimator:
        """What adv_estimator asks of the run (core/estimators.py)."""
        return ESTIMATORS[self.adv_estimator]


# --------------------------------------------------------------------------- worker
class LoraConfig(Model):
    rank: int = Field(0, ge=0)
    """LoRA's rank; 0: no LoRA (the whole model trains)."""
    alpha: int = Field(64, ge=1)
    """LoRA's scaling factor (the adapters' update is scaled by alpha / rank)."""
    target_modules: Stripped = "all-linear"
    """Modules that get adapters: all-linear, or module names separated by commas (q_proj,v_proj)."""
    exclude_modules: Stripped | None = None
    """Regular expression of modules that get none (.*visual.* keeps a VLM's vision tower out)."""
    merge: bool | None = None
    """verl's `lora.merge`: true syncs merged weights into vLLM, false the adapters only (a
    LoRA-enabled engine); null: adapters on GPUs, merged weights on CPU (docs/trainer.md, LoRA)."""
    load_in_4bit: bool = False
    """QLoRA (TRL's and OpenRLHF's `load_in_4bit`): the frozen base loaded in 4-bit NF4 through
    bitsandbytes; the adapters train in full precision."""


class ModelConfig(Model):
    model_path: str | None = None
    """The model to start from: a Hugging Face Hub id or a local folder."""
    tokenizer_path: str | None = None
    """Where the tokenizer and processor come from; null: model_path."""
    override_config: FreeForm = Field(default_factory=dict)
    """Values that replace those of the model's config.json (keyword arguments to AutoConfig)."""
    enable_gradient_checkpointing: bool = True
    """Recompute activations in the backward pass instead of keeping them, to save GPU memory."""
    trust_remote_code: bool = True
    """Run code shipped with the model and tokenizer (transformers' trust_remote_code)."""
    freeze_vision_tower: bool = False
    """A VLM's vision tower frozen: it does not train."""
    freeze_language_model: bool = False
    """r1cloud (LLaVA's stage 1, Qwen-VL fine-tuning's freeze_llm): a VLM's language model frozen,
    only the vision tower and connector train."""
    lora: LoraConfig = Field(default_factory=LoraConfig)
    """LoRA adapters instead of training every weight."""


class OptimConfig(Model):
    lr: float = Field(1e-6, ge=0)
    """Learning rate (the peak, after warmup)."""
    betas: tuple[float, float] = (0.9, 0.999)
    """AdamW's beta1 and beta2."""
    weight_decay: float = Field(1e-2, ge=0)
    """AdamW's decoupled weight decay."""
    strategy: Literal["adamw", "adamw_bf16"] = "adamw"
    """The optimizer: adamw, or adamw_bf16 (AdamW that keeps its state in bf16)."""
    lr_warmup_ratio: float = Field(0.0, ge=0, le=1)
    """Fraction of the training steps over which the learning rate rises linearly from 0."""
    lr_warmup_steps: int | None = Field(None, ge=0)
    """Warmup in steps; set, it wins over lr_warmup_ratio."""
    min_lr_ratio: float | None = Field(None, ge=0, le=1)
    """Where cosine decay ends, as a fraction of lr; null: 0."""
    lr_scheduler_type: Literal["constant", "cosine"] = "constant"
    """The learning rate after warmup: constant, or cosine decay to min_lr_ratio by the last step."""
    training_steps: int = -1
    """Auto: the run's step count, set by the trainer (the cosine schedule's length)."""

    @field_validator("betas")
    @classmethod
    def _betas(cls, v: tuple[float, float]) -> tuple[float, float]:
        if not all(0 <= b < 1 for b in v):
            raise ValueError("each beta must be in [0, 1)")
        return v


class FSDPConfig(Model):
    enable_full_shard: bool = True
    """Shard parameters, gradients and optimizer state (FULL_SHARD); false: SHARD_GRAD_OP (ZeRO-2)."""
    enable_cpu_offload: bool = False
    """FSDP's own CPU offload: parameters and gradients kept in CPU memory, the optimizer step there."""
    enable_rank0_init: bool = True
    """Only rank 0 reads the weights (into CPU memory); the others build empty and receive shards."""
    use_orig_params: bool = False
    """FSDP's use_orig_params (EasyR1 turns it on when the vision tower is frozen)."""
    torch_dtype: Dtype | None = None
    """Dtype the weights are loaded and kept in; null: fp32, or bf16 for the reference model."""
    fsdp_size: Annotated[int, minus_one_or_positive("shard across all devices")] = -1
    """Devices in one sharding group, replicated across groups (hybrid sharding); -1: all devices."""
    mp_param_dtype: Dtype = "bf16"
    """Mixed precision: the dtype parameters are cast to for forward and backward."""
    mp_reduce_dtype: Dtype = "fp32"
    """Mixed precision: the dtype gradients are reduced across devices in."""
    mp_buffer_dtype: Dtype = "fp32"
    """Mixed precision: the dtype of buffers (such as rotary tables)."""


class OffloadConfig(Model):
    offload_params: bool = False
    """Move the parameters to CPU memory while the model is not in use (less GPU memory, more CPU)."""
    offload_optimizer: bool = False
    """Move the optimizer state to CPU memory between updates (less GPU memory, more CPU)."""


class TrainedRole(Model):
    """What the actor and the critic share (EasyR1 repeats it in ActorConfig and CriticConfig)."""

    strategy: Literal["fsdp"] = "fsdp"
    """The training backend: FSDP."""
    global_batch_size: int = Field(256, ge=1)
    """Prompts per mini-batch (an optimizer step), × rollout.n responses: verl's ppo_mini_batch_size."""
    micro_batch_size_per_device_for_update: int = Field(4, ge=1)
    """Samples per device per forward-backward pass in updates (verl's ppo_micro_batch_size_per_gpu)."""
    micro_batch_size_per_device_for_experience: int = Field(16, ge=1)
    """Samples per device per log-prob or value pass (verl's log_prob_micro_batch_size_per_gpu)."""
    max_grad_norm: float = Field(1.0, gt=0)
    """Gradients are clipped to this global norm before each optimizer step."""
    loss_avg_mode: Literal[
        "token", "seq", "token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"
    ] = "token"
    """How the loss averages: token (over the mini-batch's tokens), seq (per response, then over
    responses), or verl's loss_agg_mode names (seq-mean-token-sum-norm is Dr.GRPO's)."""
    ppo_epochs: int = Field(1, ge=1)
    """Passes over each step's rollout batch."""
    dynamic_batching: bool = True
    """Micro-batches packed by tokens (micro-batch size × the longest row) instead of by count."""
    ulysses_size: int = Field(1, ge=1)
    """Ulysses sequence parallelism: devices that share one sequence; 1: off."""
    model: ModelConfig = Field(default_factory=ModelConfig)
    """The model: its weights, tokenizer and LoRA."""
    optim: OptimConfig = Field(default_factory=OptimConfig)
    """The optimizer and its learning-rate schedule."""
    fsdp: FSDPConfig = Field(default_factory=FSDPConfig)
    """FSDP's sharding and mixed precision."""
    offload: OffloadConfig = Field(default_factory=OffloadConfig)
    """Parameters and optimizer state moved to CPU memory between phases."""
    global_batch_size_per_device: int = -1
    """Auto: global_batch_size × rollout.n × ulysses_size / devices, a mini-batch's rows per device."""


class ActorConfig(TrainedRole):
    clip_ratio_low: float = Field(0.2, ge=0)
    """PPO's lower clip: the probability ratio is clipped at 1 − clip_ratio_low."""
    clip_ratio_high: float = Field(0.3, ge=0)
    """PPO's upper clip: the ratio is clipped at 1 + clip_ratio_high (DAPO's clip-higher)."""
    clip_ratio_dual: float = Field(3.0, ge=1)
    """Dual-clip PPO's constant C: with a negative advantage, the ratio counts at most C."""
    loss_type: Literal[LOSS_TYPES] = "default"  # type: ignore[valid-type]
    """Policy loss: default (PPO's clip), gspo and gspo_token (GSPO's sequence ratio), cispo, sapo."""
    padding_free: bool = True
    """Forward passes on rows packed without padding."""
    use_torch_compile: bool = True
    """Compile the log-prob computation with torch.compile."""
    tau_positive: float = Field(1.0, gt=0)
    """SAPO's gate temperature for tokens with a positive (or zero) advantage."""
    tau_negative: float = Field(1.05, gt=0)
    """SAPO's gate temperature for tokens with a negative advantage."""
    entropy_coeff: float = Field(0.0, ge=0)
    """r1cloud: weight of an entropy bonus in the actor's loss (verl's entropy_coeff); 0: off."""
    rollout_is: Literal[ROLLOUT_IS_MODES] | None = None  # type: ignore[valid-type]
    """r1cloud: truncated importance sampling against the rollout engine's own log-probs, per token or
    per sequence (TRL's modes); null: off."""
    rollout_is_cap: float = Field(3.0, gt=0)
    """r1cloud: the weight's cap for rollout_is: *_truncate clips at it, *_mask drops what exceeds it."""
    disable_kl: bool = False
    """Auto: copied from algorithm.disable_kl."""
    use_kl_loss: bool = False
    """Auto: copied from algorithm.use_kl_loss."""
    kl_penalty: Literal[KL_PENALTIES] = "kl"  # type: ignore[valid-type]
    """Auto: copied from algorithm.kl_penalty."""
    kl_coef: float = 0.0
    """Auto: copied from algorithm.kl_coef."""


class CriticConfig(TrainedRole):
    cliprange_value: float = Field(0.5, ge=0)
    """PPO's value clipping: the value loss also sees the new value clipped to the old one ± this."""
    padding_free: bool = False
    """Forward passes on rows packed without padding."""


class RefConfig(Model):
    strategy: Literal["fsdp"] = "fsdp"
    """The reference model's backend: FSDP."""
    fsdp: FSDPConfig = Field(default_factory=FSDPConfig)
    """The reference model's FSDP sharding and mixed precision."""
    offload: OffloadConfig = Field(default_factory=OffloadConfig)
    """The reference model's parameters moved to CPU memory while not in use."""
    micro_batch_size_per_device_for_experience: int = -1
    """Auto: copied from the actor."""
    padding_free: bool = False
    """Auto: copied from the actor."""
    dynamic_batching: bool = False
    """Auto: copied from the actor."""
    ulysses_size: int = 1
    """Auto: copied from the actor."""
    use_torch_compile: bool = True
    """Auto: copied from the actor."""


class MultiTurnConfig(Model):
    """r1cloud's own: multi-turn episodes with tools (agents/)."""

    enable: bool = False
    """Episodes of several turns in which the model calls tools; false: one response per sample."""
    tools: str | None = None
    """The tools: file.py (its public functions) or file.py:add,mul; null: none."""
    tool_names: list[str] | None = None
    """Auto: the part of tools after ':' (null: every public function)."""
    environment: str | None = None
    """An environment per episode: file.py:Class, TRL-shaped or gym-shaped (agents/tools.py)."""
    max_turns: int = Field(4, ge=1)
    """The model's turns per episode."""
    max_tool_response_length: int = Field(1024, ge=1)
    """Characters of one tool's output the model is shown; the rest is cut."""
    tool_timeout: float = Field(10.0, gt=0)
    """Seconds one tool call may take."""
    tool_call_format: Literal["hermes", "python"] = "hermes"
    """Calls in <tool_call> tags: hermes (a JSON object {name, arguments}) or python (add(a=2, b=3))."""


class RolloutConfig(Model):
    name: Literal["vllm", "hf", "auto"] = "vllm"
    """The rollout engine: vllm; r1cloud adds hf (transformers generate) and auto (vllm when
    importable, else hf)."""
    n: int = Field(1, ge=1)
    """Responses sampled per prompt (the group size)."""
    temperature: float = Field(1.0, ge=0)
    """Sampling temperature; log-probs are computed at the same temperature."""
    top_p: float = Field(1.0, gt=0, le=1)
    """Nucleus sampling: only the most likely tokens making up this probability; 1: off."""
    top_k: int = Field(-1, ge=-1)
    """Only the k most likely tokens are sampled; -1: off."""
    seed: int = 1
    """Random seed of the rollout engine's sampling."""
    limit_images: int = Field(0, ge=0)
    """Most images vLLM accepts in one prompt; 0: vLLM's default."""
    dtype: Dtype = "bf16"
    """The rollout engine's dtype for weights and compute."""
    gpu_memory_utilization: float = Field(0.6, gt=0, le=1)
    """Fraction of each GPU's memory vLLM may use, weights and KV cache together."""
    ignore_eos: bool = False
    """Go on generating past the end-of-sequence token, up to max_response_length."""
    enforce_eager: bool = False
    """vLLM in eager mode, without CUDA graphs."""
    enable_chunked_prefill: bool = False
    """vLLM's chunked prefill (EasyR1: for the v0 engine only)."""
    tensor_parallel_size: int = Field(2, ge=1)
    """Devices one vLLM engine's weights are split across (tensor parallelism)."""
    max_model_len: int | None = Field(None, ge=1)
    """vLLM's context length in tokens; null: max_prompt_length + max_response_length."""
    max_num_batched_tokens: int = Field(8192, ge=1)
    """Most tokens vLLM processes in one scheduler step; at least prompt plus response length."""
    disable_log_stats: bool = True
    """Turn off vLLM's periodic statistics log."""
    disable_tqdm: bool = False
    """Hide the rollout's progress bar."""
    val_override_config: FreeForm = Field(default_factory=dict)
    """Sampling settings that replace the rollout's for validation (n, temperature, top_p, …)."""
    multi_turn: MultiTurnConfig = Field(default_factory=MultiTurnConfig)
    """r1cloud: multi-turn episodes with tools or environments."""
    prompt_length: int = -1
    """Auto: copied from data.max_prompt_length."""
    response_length: int = -1
    """Auto: copied from data.max_response_length."""
    trust_remote_code: bool = False
    """Auto: copied from worker.actor.model.trust_remote_code."""
    n_gpus_per_node: int = Field(0, ge=0)
    """Asynchronous training: devices per node that only generate (verl's rollout.n_gpus_per_node);
    trainer.n_gpus_per_node train. 0: rollout shares the training devices (synchronous)."""
    nnodes: int = Field(1, ge=1)
    """Asynchronous training: nodes of rollout devices (verl's rollout.nnodes)."""


class AsyncTraining(Model):
    """r1cloud's switch for verl's fully asynchronous mode (verl/experimental/fully_async_policy):
    rollout workers generate on devices of their own while the trainer trains."""

    enable: bool = False
    """Overlap rollout and training (worker.rollout.n_gpus_per_node devices generate)."""
    max_staleness: int | None = Field(None, ge=0)
    """Most updates a sample's policy may lag the one it trains (TRL's and AReaL's integer bound);
    null: from staleness_threshold. 0 with trigger_parameter_sync_step 1 is the synchronous run."""
    staleness_threshold: float = Field(0.0, ge=0)
    """verl's bound: up to (1 + this) × trigger_parameter_sync_step steps' worth of samples per sync;
    read in whole steps as max_staleness = ceil((1 + this) × trigger_parameter_sync_step) − 1."""
    trigger_parameter_sync_step: int = Field(1, ge=1)
    """Updates between weight pushes to the rollout workers (verl's; its default is 4)."""
    partial_rollout: bool = False
    """Pause sequences in flight at a weight push and go on with the new weights (verl's)."""
    use_rollout_log_probs: bool = False
    """The engine's sampling log-probs as the PPO ratio's old log-probs, none recomputed (verl's)."""

    @property
    def bound(self) -> int:
        """max_staleness, or staleness_threshold read in whole steps."""
        if self.max_staleness is not None:
            return self.max_staleness
        return math.ceil((1 + self.staleness_threshold) * self.trigger_parameter_sync_step) - 1


class RewardConfig(Model):
    reward_function: str | None = None
    """The reward function: file.py:function (`main` when not named); r1cloud: or an http(s):// URL."""
    reward_function_kwargs: FreeForm = Field(default_factory=dict)
    """Keyword arguments given to the reward function on every call."""
    skip_special_tokens: bool = True
    """Decode responses without special tokens before they are scored."""
    num_cpus: int = Field(1, ge=0)
    """CPUs for computing rewards (EasyR1: the reward worker's Ray num_cpus)."""
    reward_function_name: str | None = None
    """Auto: the part of reward_function after ':' (default `main`)."""
    reward_type: Literal["batch", "sequential"] | None = None
    """EasyR1 v0.3.2 chose batch/sequential here; now the module's REWARD_TYPE does. Kept so old
    configs still say what they meant; it wins over the module when set."""
    timeout: float = Field(30.0, gt=0)
    """r1cloud: seconds per sample before a call is given up."""


class WorkerConfig(Model):
    hybrid_engine: bool = True
    """The actor, its rollout engine and the reference share each device; only true is supported."""
    actor: ActorConfig = Field(default_factory=ActorConfig)
    """The policy being trained."""
    critic: CriticConfig = Field(default_factory=CriticConfig)
    """The value model, trained only for an estimator that has one (gae)."""
    ref: RefConfig = Field(default_factory=RefConfig)
    """The frozen reference policy that KL is measured against (none with algorithm.disable_kl)."""
    reward: RewardConfig = Field(default_factory=RewardConfig)
    """The reward function that scores responses."""
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    """The engine that samples responses."""


# --------------------------------------------------------------------------- trainer
class TrainerConfig(Model):
    total_epochs: int = Field(15, ge=1)
    """Passes over the training prompts; ignored when max_steps is set."""
    max_steps: int | None = Field(None, ge=1)
    """Training steps; set, it wins over total_epochs."""
    project_name: str = "easy_r1"
    """The project name in the loggers."""
    experiment_name: str | None = None
    """The trackers' run name; unset: the job's name (EasyR1: "demo")."""
    logger: tuple[Literal[LOGGERS], ...] = ("console", "wandb")  # type: ignore[valid-type]
    """Where metrics go: any of console, file, mlflow, swanlab, tensorboard and wandb."""
    nnodes: int = Field(1, ge=1)
    """Nodes the run trains on (kept equal to resources.num_nodes)."""
    n_gpus_per_node: int = Field(8, ge=1)
    """GPUs per node (kept equal to the count in resources.accelerators)."""
    max_try_make_batch: int = 20
    """Most generation rounds to fill one step's batch (with online filtering); 0 or less: no limit."""
    critic_warmup: int = Field(0, ge=0)
    """Steps that train only the critic before the actor starts updating."""
    val_freq: Off = -1
    """Validate every this many steps, and after the last; 0 or less: after the last step only."""
    val_before_train: bool = True
    """Validate before the first training step."""
    val_only: bool = False
    """Validate once and stop, without training."""
    val_generations_to_log: int = 0
    """Validation samples (prompt, response, answer, score) sent to the loggers; 0 or less: none."""
    save_freq: Off = -1
    """Save a checkpoint every this many steps, and after the last; 0 or less: after the last only."""
    save_limit: Off = -1
    """Checkpoints kept (the newest and the best validated among them); 0 or less: all."""
    save_model_only: bool = False
    """Checkpoints without the optimizer state."""
    save_checkpoint_path: str | None = None
    """Folder or bucket URL checkpoints go to; null: the job's run directory decides (r1cloud;
    EasyR1: checkpoints/<project_name>/<experiment_name>)."""
    load_checkpoint_path: str | None = None
    """A checkpoint (…/global_step_N) to resume from; null: find_last_checkpoint decides."""
    ray_timeline: str | None = None
    """File to write Ray's timeline to when the run ends; null: none."""
    find_last_checkpoint: bool = True
    """Resume from the newest checkpoint in save_checkpoint_path when there is one."""
    save_hf: bool = True
    """r1cloud: write merged Hugging Face weights into the last checkpoint, so it is INFERENCE READY."""

    @field_validator("logger", mode="before")
    @classmethod
    def _logger(cls, v: Any) -> Any:
        return (v,) if isinstance(v, str) else v


# --------------------------------------------------------------------------- r1cloud's own keys
class Resources(Model):
    infra: str = "local"
    """Where the job runs: local, or a SkyPilot infra (a cloud, cloud/region, k8s, …)."""
    accelerators: str | list[str] | dict[str, int] | None = None
    """Devices per node: one `H100:8`, a list tried in order, or a dict of alternatives
    {H100: 8, A100-80GB: 8}; null: none requested."""
    num_nodes: int = Field(1, ge=1)
    """Machines the job runs on (kept equal to trainer.nnodes)."""
    use_spot: bool = False
    """Spot (preemptible) instances."""
    disk_size: int | None = Field(None, ge=1)
    """Disk per node in GB; null: SkyPilot's default."""
    image: str | None = None
    """Docker image the nodes run; null: SkyPilot's default machine image."""
    region: str | None = None
    """The cloud region (joined to infra as cloud/region); null: any."""
    bucket: str | None = None
    """Cloud jobs: checkpoints go to <bucket>/<job name>/checkpoints (s3://, gs://, r2://, …)."""
    max_cost: float | None = Field(None, gt=0, allow_inf_nan=False)
    """Dollars for the whole job at its catalog price: the trainer saves and stops before passing it."""

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
        counts = {c for _, c in accelerator_options(v)} if v is not None else set()
        if len(counts) > 1:
            raise ValueError(
                f"alternatives must use the same count (got {sorted(counts)}): the trainer needs one "
                "device count per node"
            )
        return v


ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
NAME_RE = re.compile(r"^[a-z0-9]([a-z0-9-]{1,61})[a-z0-9]$")


def normalise_name(text: str) -> str:
    """A file stem such as `Math12k_GRPO.v2` -> `math12k-grpo-v2` (3–63 chars of a-z0-9-)."""
    name = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:63].strip("-")
    return name if len(name) >= 3 else (name + "-job")[:63].strip("-")


# --------------------------------------------------------------------------- the whole spec
class Spec(Model):
    name: str
    """The job's name: 3 to 63 characters of a-z, 0-9 and '-'."""
    resources: Resources = Field(default_factory=Resources)
    """r1cloud: where the job runs and on what."""
    envs: dict[str, str] = Field(default_factory=dict)
    """r1cloud: environment variables set for the job."""
    secrets: list[str] = Field(default_factory=list)
    """r1cloud: names of environment variables whose values come from --secret or the environment."""
    data: DataConfig = Field(default_factory=DataConfig)
    """The prompt sets and how prompts are built from them."""
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)
    """Advantages, KL and online filtering."""
    worker: WorkerConfig = Field(default_factory=WorkerConfig)
    """The models and engines: actor, critic, reference, reward and rollout."""
    trainer: TrainerConfig = Field(default_factory=TrainerConfig)
    """The training loop: steps, validation, checkpoints, loggers and nodes."""
    async_training: AsyncTraining = Field(default_factory=AsyncTraining)
    """Rollout and training overlapped on devices of their own (verl's section)."""

    @property
    def roles(self) -> tuple[str, ...]:
        """The models the run trains: the actor, and the critic where the estimator has one."""
        return ("actor", "critic") if self.algorithm.estimator.critic else ("actor",)

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
            if written := [k for k, val in v.items() if val is not None]:
                raise ValueError(
                    f"secret values must not be written in a blueprint ({', '.join(map(shown, written))}): "
                    "list the names only and pass values with --secret NAME or the environment"
                )
            v = list(v)
        if isinstance(v, str):
            v = [v]
        if isinstance(v, list):
            if bad := [s for s in v if not isinstance(s, str) or not ENV_NAME_RE.match(s)]:
                raise ValueError(f"{bad[0]!r} is not an environment variable name")
            return list(dict.fromkeys(v))
        return v

    @model_validator(mode="after")
    def _derive(self) -> Spec:
        """EasyR1's post_init copies, so the trainer reads one consistent tree."""
        d, a, w = self.data, self.algorithm, self.worker
        for section, values in a.estimator.preset.items():
            target = w.actor if section == "actor" else a
            for key, value in values.items():
                if key not in target.model_fields_set:
                    setattr(target, key, value)
        w.rollout.prompt_length = d.max_prompt_length
        w.rollout.response_length = d.max_response_length
        w.rollout.trust_remote_code = w.actor.model.trust_remote_code
        for key in ("disable_kl", "use_kl_loss", "kl_penalty", "kl_coef"):
            setattr(w.actor, key, getattr(a, key))
        for key in ("padding_free", "dynamic_batching", "ulysses_size", "use_torch_compile"):
            setattr(w.ref, key, getattr(w.actor, key))
        w.ref.micro_batch_size_per_device_for_experience = w.actor.micro_batch_size_per_device_for_experience
        for model in (w.actor.model, w.critic.model):
            if model.tokenizer_path is None:
                model.tokenizer_path = model.model_path
        for role in (w.actor, w.critic):
            per_device = role.global_batch_size * w.rollout.n // max(self.world_size // role.ulysses_size, 1)
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

    @property
    def rollout_size(self) -> int:
        """Rollout-only workers: 0 unless asynchronous."""
        r = self.worker.rollout
        return r.nnodes * r.n_gpus_per_node if self.async_training.enable else 0


def _is_url(text: str) -> bool:
    return bool(re.match(r"^[a-z][a-z0-9+.-]*://", text))
