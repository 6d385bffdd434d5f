"""Images in prompts, as EasyR1 reads them, and the processor that turns them into model inputs.

A row's `image_key` column holds a list of images: paths (joined with `image_dir`), HF Image
dicts (`{"bytes": …}` or `{"path": …}`), raw bytes or PIL images. Its prompt holds one `<image>`
per image, where the image goes. Each image is resized as EasyR1 does (scaled by
√(max_pixels / w·h) when larger, by √(min_pixels / w·h) when smaller), then rendered through the
model's processor and chat template.

A prompt then has two forms: its ids with one placeholder per image (what vLLM takes; it expands
them itself, and already-expanded ids would give wrong log-probs with no error) and its ids with
every image token expanded (what the model sees in training, and what prompt lengths count).
"""

from __future__ import annotations

import atexit
import base64
import io
import json
import math
import mimetypes
import os
import re
import tempfile
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from r1cloud.core.rows import image_source
from r1cloud.media import compat, video

PLACEHOLDER = "<image>"
# the processor's outputs that are per image or video (the rest, input_ids and masks, are per token)
IMAGE_KEYS = ("pixel_values", "image_grid_thw", "pixel_attention_mask", *video.VIDEO_KEYS)


def is_vision_config(config) -> bool:
    return getattr(config, "vision_config", None) is not None


def load_processor(path: str, trust_remote_code: bool = False):
    compat.install()
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(path, trust_remote_code=trust_remote_code)


def open_image(item: Any, image_dir: str | None = None):
    """One image of a row, in any of EasyR1's forms, as an RGB PIL image."""
    from PIL import Image

    item = image_source(item, image_dir)  # a datasets Image feature decoded lazily; a path joined
    if isinstance(item, str):
        if not os.path.isfile(item):
            raise FileNotFoundError(item)
        item = Image.open(item)
    elif isinstance(item, bytes | bytearray):
        item = Image.open(io.BytesIO(item))
    if not isinstance(item, Image.Image):
        raise TypeError(
            f"an image is a path, bytes, an HF Image dict or a PIL image, not {type(item).__name__}"
        )
    item.load()
    return item


def resize(image, min_pixels: int | None, max_pixels: int | None):
    """EasyR1's process_image: scale into [min_pixels, max_pixels] keeping the aspect ratio; RGB."""
    if max_pixels and image.width * image.height > max_pixels:
        f = math.sqrt(max_pixels / (image.width * image.height))
        image = image.resize((max(1, int(image.width * f)), max(1, int(image.height * f))))
    if min_pixels and image.width * image.height < min_pixels:
        f = math.sqrt(min_pixels / (image.width * image.height))
        image = image.resize((int(image.width * f), int(image.height * f)))
    return image.convert("RGB") if image.mode != "RGB" else image


def messages(text: str, with_images: bool) -> list[dict]:
    """The user turn: text, image and video parts in the order of the `<image>` and `<video>`
    placeholders (EasyR1)."""
    if not with_images:
        return [{"role": "user", "content": text}]
    content: list[dict] = []
    for part in re.split(f"({PLACEHOLDER}|{video.PLACEHOLDER})", text):
        if part in (PLACEHOLDER, video.PLACEHOLDER):
            content.append({"type": "image" if part == PLACEHOLDER else "video"})
        elif part:
            content.append({"type": "text", "text": part})
    return [{"role": "user", "content": content}]


@dataclass
class Encoded:
    ids: list[int]  # image tokens expanded: what the model sees, and what lengths count
    raw_ids: list[int]  # one placeholder per image: what vLLM takes
    images: list  # PIL, resized
    image_inputs: dict[str, torch.Tensor]  # the processor's per-image and per-video outputs (IMAGE_KEYS)
    videos: list = field(default_factory=list)  # video.Clip


class ImageProcessor:
    """The model's processor over rendered prompts."""

    def __init__(self, processor):
        self.processor = processor
        self.tokenizer = processor.tokenizer
        self.image_token_id = getattr(processor, "image_token_id", None)

    def save_pretrained(self, folder) -> None:
        """The processor as separate files, as model repositories ship it: tokenizer, image
        processor (preprocessor_config.json), chat template, and processor_config.json with the
        processor's class and own settings (e.g. Idefics3's image_seq_len). Not the processor's
        own save, which would nest r1cloud's video processor (video.VideoProcessor) into its config."""
        folder = Path(folder)
        self.tokenizer.save_pretrained(folder)
        self.processor.image_processor.save_pretrained(folder)
        if self.processor.chat_template:
            (folder / "chat_template.jinja").write_text(self.processor.chat_template)
        parts = ("image_processor", "video_processor", "tokenizer", "chat_template", "audio_tokenizer")
        own = {k: v for k, v in self.processor.to_dict().items() if k not in parts}
        own["processor_class"] = type(self.processor).__name__
        (folder / "processor_config.json").write_text(json.dumps(own, indent=2, default=str))

    def render(self, text: str, with_images: bool) -> str:
        return self.apply_template(messages(text, with_images))

    def apply_template(self, msgs: list[dict], generation: bool = True) -> str:
        """Chat messages (image parts as `{"type": "image"}`) through the processor's chat
        template, or the tokenizer's where the processor has none."""
        source = self.processor if getattr(self.processor, "chat_template", None) else self.tokenizer
        return source.apply_chat_template(msgs, add_generation_prompt=generation, tokenize=False)

    @property
    def video_factor(self) -> int:
        """What a video frame's sides are a multiple of: the vision tower's patch × merge size."""
        vp = getattr(self.processor, "video_processor", None)
        return getattr(vp, "patch_size", 14) * getattr(vp, "merge_size", 2)

    def encode(self, prompt: str, images: list, videos: list = ()) -> Encoded:
        """`prompt`'s ids with its images (PIL) and videos (video.Clip: sampled frames and where
        they came from, for Qwen2.5-VL's seconds per grid and Qwen3-VL's timestamps)."""
        raw = self.tokenizer(prompt, add_special_tokens=False)["input_ids"]
        if not images and not videos:
            return Encoded(raw, raw, [], {})
        clips = {}
        if videos:
            clips = dict(videos=[c.frames for c in videos], video_metadata=[c.metadata for c in videos])
            clips["do_sample_frames"] = False  # sampled already (video.load), as EasyR1's fetch_video
        out = self.processor(
            images=images or None, text=[prompt], add_special_tokens=False, return_tensors="pt", **clips
        )
        tensors = {k: torch.as_tensor(out[k]) for k in IMAGE_KEYS if k in out}
        return Encoded(out["input_ids"][0].tolist(), raw, images, tensors, list(videos))


def merge(parts: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Several prompts' image and video tensors as one packed row's: Qwen-VL's patches and grids end to end
    (dim 0); Idefics3's (1, images, C, H, W) pixels side by side (dim 1), padded to the largest
    image with its pixel mask False there."""
    parts = [p for p in parts if p]
    out = {}
    for key in dict.fromkeys(k for p in parts for k in p):  # a prompt may hold pictures, videos or both
        xs = [p[key] for p in parts if key in p]
        if xs[0].dim() >= 4:  # (1, n, C, H, W) or its mask (1, n, H, W)
            h = max(x.shape[-2] for x in xs)
            w = max(x.shape[-1] for x in xs)
            xs = [torch.nn.functional.pad(x, (0, w - x.shape[-1], 0, h - x.shape[-2])) for x in xs]
            out[key] = torch.cat(xs, dim=1)
        else:
            out[key] = torch.cat(xs, dim=0)
    return out


def image_from_url(url: str):
    """An OpenAI chat `image_url`: a data URL (base64) or a file:// path, as an RGB PIL image."""
    if url.startswith("data:"):
        head, _, data = url.partition(",")
        if ";base64" not in head:
            raise ValueError("a data URL image must be base64 (data:image/png;base64,…)")
        return open_image(base64.b64decode(data)).convert("RGB")
    if url.startswith("file://"):
        return open_image(urllib.parse.unquote(url.removeprefix("file://"))).convert("RGB")
    raise ValueError("image_url must be a data URL (data:image/…;base64,…) or a file:// path on the server")


def data_url(path: str) -> str:
    """A local image or video file as a data URL, for an OpenAI chat message."""
    kind = mimetypes.guess_type(path)[0] or (
        "video/mp4" if path.endswith((".mp4", ".webm", ".avi", ".mov")) else "image/png"
    )
    with open(path, "rb") as f:
        return f"data:{kind};base64,{base64.b64encode(f.read()).decode()}"


def split_chat(messages: list[dict]) -> tuple[list[dict], list, list[str]]:
    """OpenAI chat messages -> (messages with `{"type": "image"}` and `{"type": "video"}` parts, the
    images in order, the videos' files in order), for a processor's chat template."""
    out, images, videos = [], [], []
    for m in messages:
        content = m.get("content")
        if isinstance(content, list):
            parts = []
            for part in content:
                kind = part.get("type")
                if kind in ("image_url", "video_url"):
                    url = part[kind]["url"] if isinstance(part[kind], dict) else part[kind]
                    if kind == "image_url":
                        images.append(image_from_url(url))
                    else:
                        videos.append(video_file(url))
                    parts.append({"type": kind.removesuffix("_url")})
                elif kind == "text":
                    parts.append({"type": "text", "text": part.get("text", "")})
            m = {**m, "content": parts}
        out.append(m)
    return out, images, videos


def video_file(url: str) -> str:
    """An OpenAI chat `video_url` as a file OpenCV reads: a file:// path, or a base64 data URL
    written to a temporary file (removed when the process ends)."""
    if url.startswith("file://"):
        return urllib.parse.unquote(url.removeprefix("file://"))
    head, _, data = url.partition(",")
    if not url.startswith("data:") or ";base64" not in head:
        raise ValueError(
            "video_url must be a base64 data URL (data:video/mp4;base64,…) or a file:// path on the server"
        )
    with tempfile.NamedTemporaryFile(suffix=".mp4", delete=False) as f:
        f.write(base64.b64decode(data))
    atexit.register(os.unlink, f.name)
    return f.name


def uses_mrope(model) -> bool:
    """Qwen-VL's multimodal rotary positions (computed on the inner model from image grids)."""
    return hasattr(getattr(model, "model", None), "get_rope_index")


def image_inputs(model, ids: torch.Tensor, tensors: dict) -> dict:
    """`generate`'s image and video kwargs for prompt ids (B, L): the processor's tensors and, for
    Qwen-VL, `mm_token_type_ids`, without which it silently gives their tokens 1-D positions."""
    if not tensors or not uses_mrope(model):
        return dict(tensors)
    return {**tensors, "mm_token_type_ids": token_types(model.config, ids)}


def token_types(config, ids: torch.Tensor) -> torch.Tensor:
    """Qwen-VL's `mm_token_type_ids`: 1 at image tokens, 2 at video tokens, else 0."""
    video_token = getattr(config, "video_token_id", None)
    types = (ids == config.image_token_id).int()
    return types + 2 * (ids == video_token).int() if video_token is not None else types


QWEN2_ROPE = ("qwen2_vl", "qwen2_5_vl")  # the families whose positions qwen2_rope_index gives


def qwen2_rope_index(config, rows: list[list[int]], image_grid_thw=None, video_grid_thw=None,
                     second_per_grid_ts=None) -> list[tuple[torch.Tensor, int]]:  # fmt: skip
    """Qwen2-VL's and Qwen2.5-VL's mRoPE positions (3, L) and delta of each sequence (its tokens'
    `token_types`; the grids are the rows' pictures and videos in order), by the rule
    the models were trained with (Qwen's get_rope_index, vLLM's get_mrope_input_positions): a
    picture's or video's tokens at (t × interval, row, column) after the text before it, the text
    after it from one past the largest of those. transformers 5.19 resumes the text at
    max(rows, columns) instead, which differs after a video whose temporal positions run further
    (Qwen2.5-VL's interval is seconds per grid × tokens_per_second) — and from what vLLM samples."""
    grids = {1: iter([] if image_grid_thw is None else image_grid_thw),
             2: iter([] if video_grid_thw is None else video_grid_thw)}  # fmt: skip
    seconds = iter([] if second_per_grid_ts is None else second_per_grid_ts)
    return [_qwen2_positions(config, kinds, grids, seconds) for kinds in rows]


def _qwen2_positions(config, kinds: list[int], grids: dict, seconds) -> tuple[torch.Tensor, int]:
    merge = config.vision_config.spatial_merge_size
    per_second = getattr(config.vision_config, "tokens_per_second", None)
    parts, start, at = [], 0, 0
    while at < len(kinds):
        if kinds[at] == 0:
            at += 1
            continue
        t, h, w = (int(x) for x in next(grids[kinds[at]]))
        h, w = h // merge, w // merge
        base = int(parts[-1].max()) + 1 if parts else 0
        parts.append(torch.arange(at - start).expand(3, -1) + base)
        step = 1.0  # Qwen2-VL: one position per temporal patch
        if per_second is not None:  # Qwen2.5-VL: a video's by its seconds; a picture has one patch
            step = float(next(seconds, 1.0)) * per_second if kinds[at] == 2 else 0.0
        grid = torch.stack(torch.meshgrid(torch.arange(t), torch.arange(h), torch.arange(w), indexing="ij"))
        grid = grid.reshape(3, -1)
        grid[0] = (grid[0] * step).long()
        parts.append(grid + base + at - start)
        at = start = at + t * h * w
    base = int(parts[-1].max()) + 1 if parts else 0
    parts.append(torch.arange(len(kinds) - start).expand(3, -1) + base)
    positions = torch.cat(parts, dim=1)
    return positions, int(positions.max()) + 1 - len(kinds)


def use_qwen2_rope(model) -> None:
    """Make a Qwen2/2.5-VL model's own position computation (its generate) follow
    qwen2_rope_index, so the hf engine samples with the positions the trainer and vLLM use."""
    if model.config.model_type not in QWEN2_ROPE:
        return
    config = model.config

    def get_rope_index(input_ids, mm_token_type_ids, image_grid_thw=None, video_grid_thw=None,
                       second_per_grid_ts=None, attention_mask=None, **kwargs):  # fmt: skip
        out = torch.ones(3, *input_ids.shape, dtype=input_ids.dtype, device=input_ids.device)
        mask = (torch.ones_like(input_ids) if attention_mask is None else attention_mask).bool()
        rows = [types[keep].tolist() for types, keep in zip(mm_token_type_ids, mask, strict=True)]
        found = qwen2_rope_index(config, rows, image_grid_thw, video_grid_thw, second_per_grid_ts)
        for b, (positions, _) in enumerate(found):  # left padding: the real tokens only
            out[:, b, mask[b]] = positions.to(out)
        return out, torch.tensor([delta for _, delta in found], device=input_ids.device)[:, None]

    model.model.get_rope_index = get_rope_index


def auto_class(config):
    """The transformers auto class for a checkpoint: image-text-to-text for a vision-language
    model (Qwen2/2.5/3-VL, Idefics3, SmolVLM), causal LM otherwise."""
    import transformers

    if is_vision_config(config):
        return transformers.AutoModelForImageTextToText
    return transformers.AutoModelForCausalLM
