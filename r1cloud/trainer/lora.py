"""LoRA on the actor (EasyR1's `worker.actor.model.lora`): peft adapters injected into the
transformers model itself (no PeftModel wrapper, so packing, FSDP2's shard units and the forward
pass are the same code as for full fine-tuning), the reference model as the same weights with the
adapters switched off, and the merged weights the rollout engine loads.

peft, not hand-written adapters: it is what EasyR1, verl, TRL and OpenRLHF use, its LoRA layers
and `adapter_config.json` are what vLLM and `PeftModel.from_pretrained` read back.
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import re
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from r1cloud.checkpoint.folder import ADAPTER, peft_name

if TYPE_CHECKING:  # light at import: `serve` reads VLLM_RANKS without loading torch
    import torch


def targets(spec: str | list[str] | None) -> str | list[str] | None:
    """EasyR1's `target_modules`/`exclude_modules` string ("all-linear", or names separated by
    commas) as peft takes it."""
    if spec is None or isinstance(spec, list):
        return spec
    names = [n.strip() for n in spec.split(",") if n.strip()]
    return names[0] if names == ["all-linear"] else names


def add(
    model: torch.nn.Module, lora, exclude_prefixes: list[str] = (), also_train: tuple[str, ...] = ()
) -> torch.nn.Module:
    """Injects the adapters of a spec's `lora` block (B starts at zero: the adapted model equals the
    base at step 0), none in `exclude_prefixes` (module paths: a frozen vision tower) nor the user's
    `exclude_modules`, and freezes everything else but the modules named in `also_train` (a critic's
    new value head)."""
    from peft import LoraConfig

    exclude = targets(lora.exclude_modules)
    if exclude_prefixes:  # peft matches a string as a regex over the whole module path
        own = [] if exclude is None else [exclude] if isinstance(exclude, str) else exclude
        exclude = "|".join(
            [rf"(.*\.)?{re.escape(n)}" for n in own] + [rf"{re.escape(p)}(\..*)?" for p in exclude_prefixes]
        )
    config = LoraConfig(
        r=lora.rank,
        lora_alpha=lora.alpha,
        target_modules=targets(lora.target_modules),
        exclude_modules=exclude,
        lora_dropout=0.0,
        bias="none",
    )
    model.add_adapter(config, adapter_name=ADAPTER)
    for name, p in model.named_parameters():
        p.requires_grad_(".lora_" in name or name.split(".", 1)[0] in also_train)
    return model


def adapt(model: torch.nn.Module, m, tower: torch.nn.Module | None, heads: list[str] = (), seed: int = 0):
    """The adapters a run trains for `m` (a spec's worker model block): none in a frozen vision
    `tower`; `heads` (a critic's new value head) kept out and trained in full; A drawn from `seed`,
    so every worker starts the same."""
    import torch

    frozen = [n for n, x in model.named_modules() if x is tower and m.freeze_vision_tower]
    torch.manual_seed(seed)
    return add(model, m.lora, frozen + list(heads), also_train=tuple(heads))


def share(model: torch.nn.Module, rank: int) -> str:
    """What is trained: rank, trainable parameters and their share (full sizes: a DTensor's numel
    is; a 4-bit weight counts its unpacked size)."""

    def size(p) -> int:
        state = getattr(p, "quant_state", None)
        return math.prod(state.shape) if state is not None else p.numel()

    params = list(model.parameters())
    trained, total = sum(size(p) for p in params if p.requires_grad), sum(size(p) for p in params)
    four = ", base in 4-bit NF4" if any(getattr(p, "quant_state", None) is not None for p in params) else ""
    return (
        f"LoRA rank {rank}: {trained:,} of {total:,} parameters trained ({100 * trained / total:.2f}%){four}"
    )


def nf4(compute_dtype: torch.dtype):
    """QLoRA's quantisation (`lora.load_in_4bit`): the frozen base in 4-bit NormalFloat with its
    scales quantised too, computed in `compute_dtype`, as the QLoRA paper and TRL/OpenRLHF do."""
    from transformers import BitsAndBytesConfig

    return BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=compute_dtype,
    )


def four_bit_params(model: torch.nn.Module) -> set:
    """The 4-bit weights, which FSDP2 leaves out (`ignored_params`): each worker holds them whole,
    a quarter of bf16's bytes, as DDP-style QLoRA does; FSDP cannot shard bitsandbytes' packed
    weights with their quantisation state. Also turns off bitsandbytes' CPU inference repacking,
    which an eval-mode forward applies for good and which has no backward."""
    found = set()
    for module in model.modules():
        weight = getattr(module, "weight", None)
        if getattr(weight, "quant_state", None) is not None:
            module.support_avx512bf16_for_cpu = False
            found.update(module.parameters(recurse=False))
    return found


def dense(p: torch.Tensor) -> torch.Tensor:
    """A weight in full precision: a 4-bit one dequantised (what the trainer computes with, so
    the rollout engine samples from the same policy), any other as it is."""
    state = getattr(p, "quant_state", None)
    if state is None:
        return p.detach()
    from bitsandbytes.functional import dequantize_4bit

    return dequantize_4bit(p.data, state)


def plan(m) -> str | None:
    """`validate`'s line of what LoRA trains, from the model's config alone: the model built on the
    meta device (no weights read, no memory), adapted as the trainer adapts it. None when the config
    is not on this machine (a Hub model not yet downloaded)."""
    import torch
    from transformers import AutoConfig

    from r1cloud.media.vision import auto_class
    from r1cloud.trainer.model import vision_tower

    try:
        config = AutoConfig.from_pretrained(
            m.model_path, trust_remote_code=m.trust_remote_code, local_files_only=True
        )
        with torch.device("meta"):
            model = auto_class(config).from_config(config, trust_remote_code=m.trust_remote_code)
        return share(adapt(model, m, vision_tower(model)), m.lora.rank)
    except Exception:  # no config here, or one transformers cannot build: the run's first line says
        return None


def sync_adapters(lora, cuda: bool) -> bool:
    """Whether vLLM gets the adapters only (a LoRA-enabled engine) or the merged weights:
    `lora.merge` when the blueprint says; otherwise adapters on GPUs, merged weights on CPU. A 4-bit
    base always syncs merged (dequantised): vLLM's own base would be the full-precision one."""
    return not lora.load_in_4bit and (not lora.merge if lora.merge is not None else cuda)


def has_adapters(model: torch.nn.Module) -> bool:
    return getattr(model, "_hf_peft_config_loaded", False)


@contextlib.contextmanager
def disabled(model: torch.nn.Module):
    """The base model: the adapters switched off (the reference model of a LoRA run).

    The layers' own flag is set, not through peft's `disable_adapters()`: that also flips the
    adapters' requires_grad, and under FSDP2 it skips the unsharded (non-leaf) parameters a
    forward pass leaves registered, so the sharded ones stayed frozen afterwards and the next
    checkpoint held no adapters."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    layers = [m for m in model.modules() if isinstance(m, BaseTunerLayer)]
    for layer in layers:
        layer._disable_adapters = True
    try:
        yield model
    finally:
        for layer in layers:
            layer._disable_adapters = False


def describe(model: torch.nn.Module, base: str) -> dict:
    """The adapter's `adapter_config.json` (as peft writes it, naming `base`) and its `share` line."""
    config = copy.copy(model.peft_config[ADAPTER])
    config.base_model_name_or_path = base
    with tempfile.TemporaryDirectory() as tmp:
        config.save_pretrained(tmp)
        saved = json.loads((Path(tmp) / "adapter_config.json").read_text())
    return {"config": saved, "line": share(model, config.r)}


def adapter_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The adapters' full tensors under peft's names (a collective under FSDP: every worker calls)."""
    out = {}
    for name, p in model.named_parameters():
        if ".lora_" in name:
            full = p.full_tensor() if hasattr(p, "full_tensor") else p
            out[peft_name(name)] = full.detach().contiguous()
    return out


def merged(
    named: Iterator[tuple[str, torch.Tensor]], model: torch.nn.Module
) -> Iterator[tuple[str, torch.Tensor]]:
    """The base model's tensors with each adapter folded in: W + (alpha/r)·B·A, under the base
    names; the adapter tensors themselves are consumed. `named` yields full (gathered) tensors in
    the model's parameter order, a layer's `lora_A`/`lora_B` right after its `base_layer`."""
    from peft.tuners.lora import LoraLayer

    scaling = {n: m.scaling[ADAPTER] for n, m in model.named_modules() if isinstance(m, LoraLayer)}
    pending: dict = {}  # a base weight waiting for its A and B
    parts: dict[str, dict] = {}
    for name, tensor in named:
        if ".lora_" in name:
            layer, kind = name.split(".lora_", 1)
            parts.setdefault(layer, {})[kind.split(".", 1)[0]] = tensor
            got = parts[layer]
            if len(got) == 2:
                w = pending.pop(layer)
                delta = (got["B"].float() @ got["A"].float()) * scaling[layer]
                yield f"{layer}.weight", (w.float() + delta).to(w.dtype)
                del parts[layer]
            continue
        if name.endswith(".base_layer.weight"):
            pending[name[: -len(".base_layer.weight")]] = tensor
            continue
        yield name.replace(".base_layer.", "."), tensor  # the base model's name (an adapted layer's bias)
    if pending:  # a base weight whose adapter never came: a bug, not a silent un-merged weight
        raise RuntimeError(f"adapter tensors missing for {sorted(pending)[:3]}")


def trained_state(model) -> dict:
    """The weights a checkpoint holds: all of them, or with LoRA what trains (the adapters, a
    critic's new head), without the 4-bit base's quantisation state bitsandbytes adds as extra
    entries, which are no parameters and so pass `ignore_frozen_params`."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    state = get_model_state_dict(model, options=state_options(model))
    if not has_adapters(model):
        return state
    trained = {n for n, p in model.named_parameters() if p.requires_grad}
    return {k: v for k, v in state.items() if k in trained}


def state_options(model):
    """With LoRA a checkpoint holds the adapters only (the base is the model it started from)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(ignore_frozen_params=has_adapters(model), strict=not has_adapters(model))
