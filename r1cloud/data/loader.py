"""Prompts for the trainer: datasets (`name@split`, local files and folders), the Jinja format prompt
with `content`, the chat template, images (media/vision.py), EasyR1's truncation and overlong filter, and
a seeded loader whose position is part of every checkpoint.

Prompt lengths count expanded image tokens, as EasyR1's do. Unlike EasyR1, a prompt with images
is never truncated (a cut through its image tokens fails deep in the model): with
`filter_overlong_prompts` off, an overlong image prompt is an error naming its row.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from r1cloud.core.rows import conversation, placeholder_mismatch, row_videos
from r1cloud.data import prompts
from r1cloud.media import video, vision

EXTENSION_BUILDERS = {
    ".jsonl": "json",
    ".json": "json",
    ".parquet": "parquet",
    ".csv": "csv",
    ".arrow": "arrow",
    ".txt": "text",
}


@dataclass
class Prompt:
    index: int  # row in the (filtered) data set
    prompt_ids: list[int]
    ground_truth: str
    extra: dict[str, Any] = field(default_factory=dict)  # the row's other columns
    content: str = ""  # the prompt column's text, before the format prompt
    length: int = 0  # prompt tokens before truncation
    raw_ids: list[int] | None = None  # with images: one placeholder per image (what vLLM takes)
    images: list = field(default_factory=list)  # PIL, resized as EasyR1
    history: list = field(default_factory=list)  # a conversational row's messages before its last
    reset: dict | None = None  # with an environment: what its reset takes (rollout.Request.reset)
    videos: list = field(default_factory=list)  # as the row gives them (PromptSet.clips decodes)


def load_rows(files: str):
    """EasyR1's path syntax: `name@split` (Hub), a local file, or a folder of files. A split that
    is not there is an error naming the splits that are."""
    import datasets

    path, _, split = files.rpartition("@") if "@" in files else (files, "", "train")
    split = split or "train"
    if os.path.isdir(path):
        first = sorted(p for p in os.listdir(path) if Path(p).suffix in EXTENSION_BUILDERS)
        if not first:
            raise ValueError(f"{path}: no data files ({', '.join(EXTENSION_BUILDERS)}) in this folder")
        args, kwargs = (EXTENSION_BUILDERS[Path(first[0]).suffix],), {"data_dir": path}
    elif os.path.isfile(path):
        builder = EXTENSION_BUILDERS.get(Path(path).suffix.lower())
        if builder is None:
            raise ValueError(f"{path}: unsupported data file type; use {', '.join(EXTENSION_BUILDERS)}")
        args, kwargs = (builder,), {"data_files": path}
    else:
        args, kwargs = (path,), {}
    try:
        return datasets.load_dataset(*args, **kwargs, split=split)
    except ValueError as e:
        if "split" not in str(e).lower():
            raise
        try:
            splits = ", ".join(datasets.load_dataset(*args, **kwargs).keys())
        except Exception:
            splits = "unknown"
        raise ValueError(f"{files}: no split {split!r}; the splits there are: {splits}") from None
    except (OSError, ConnectionError) as e:  # the Hub: no such dataset, or no network
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ValueError(f"{files}: cannot load it from the Hugging Face Hub ({first})") from None


def load_tokenizer(model_cfg, data_cfg):
    """The tokenizer, and for a vision-language model its processor (vision.ImageProcessor, else
    None), with `data.override_chat_template` applied to both."""
    from transformers import AutoConfig, AutoTokenizer

    source = model_cfg.tokenizer_path or model_cfg.model_path
    remote = model_cfg.trust_remote_code
    images = None
    try:
        config = AutoConfig.from_pretrained(model_cfg.model_path, trust_remote_code=remote)
        if vision.is_vision_config(config):
            images = vision.ImageProcessor(vision.load_processor(source, remote))
            tokenizer = images.tokenizer
        else:
            tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=remote)
    except OSError as e:  # a Hub id with no Hub to reach and nothing cached, or a folder without it
        raise ValueError(
            f"the model {source!r} cannot be loaded: {str(e).splitlines()[0]} Give a local model folder "
            "(scripts/quickstart writes SmolLM2-135M-Instruct to .models/), or reach the Hub"
        ) from None
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if data_cfg.override_chat_template:
        template = Path(data_cfg.override_chat_template).read_text()
        tokenizer.chat_template = template
        if images is not None:
            images.processor.chat_template = template
    return tokenizer, images


def mix(parts: list[list[dict]], probs: list[float] | None, seed: int) -> list[dict]:
    """Several data sets as one. Without weights, one after another; with them (OpenRLHF's prompt
    data probabilities), as many rows as all sets hold, each drawn from set i with probability
    probs[i] (normalised), cycling through each set in a seeded order, so every row of every set is
    used before any repeats."""
    if len(parts) == 1:
        return parts[0]
    if probs is None:
        return [row for part in parts for row in part]
    import random

    rng = random.Random(seed)
    orders = [rng.sample(range(len(p)), len(p)) for p in parts]
    used = [0] * len(parts)
    out = []
    for _ in range(sum(len(p) for p in parts)):
        i = rng.choices(range(len(parts)), weights=probs)[0]
        out.append(parts[i][orders[i][used[i] % len(parts[i])]])
        used[i] += 1
    return out


class PromptSet:
    """Rows rendered into prompt token ids (and images), as EasyR1's RLHFDataset does."""

    def __init__(
        self,
        files: str | list[str],
        tokenizer,
        data_cfg,
        filter_overlong: bool | None = None,
        limit: int | None = None,
        probs: list[float] | None = None,
        processor=None,  # vision.ImageProcessor, for a vision-language model
        tools: list[dict] | None = None,  # multi-turn: the tools' schemas, shown by the templates
        environment: bool = False,  # multi-turn with an environment: each prompt's Prompt.reset
    ):
        self.cfg, self.processor, self.tools = data_cfg, processor, tools
        parts, columns = [], None
        for source in [files] if isinstance(files, str) else files:
            rows = load_rows(source)
            here = set(rows.column_names)
            for key in (data_cfg.prompt_key, data_cfg.answer_key):
                if key not in here:
                    raise ValueError(
                        f"{source}: no column {key!r}; the columns are {', '.join(sorted(here))}"
                    )
            columns = here if columns is None else columns & here  # a mixture keeps the shared ones
            if limit is not None and isinstance(files, str):  # `try`: read (and decode) only those rows
                rows = rows.select(range(min(limit, len(rows))))
            parts.append([(source, i, row) for i, row in enumerate(rows)])
        rows = mix(parts, probs, data_cfg.seed)
        if limit is not None:
            rows = rows[:limit]
        self.template = prompts.load(data_cfg.format_prompt) if data_cfg.format_prompt else None
        self.template_images = prompts.placeholders(data_cfg.format_prompt)  # `<image>` in the template
        self.tokenizer = tokenizer
        self.max_len = data_cfg.max_prompt_length
        keep_all = not (data_cfg.filter_overlong_prompts if filter_overlong is None else filter_overlong)
        self.prompts: list[Prompt] = []
        self.dropped, self.longest = 0, 0  # prompts dropped as too long, and the longest of them
        own = {data_cfg.prompt_key, data_cfg.answer_key, data_cfg.image_key, data_cfg.video_key}
        for source, i, row in rows:
            history, content = conversation(row[data_cfg.prompt_key], f"{source}: row {i}")
            imgs = self.row_images(source, i, row, content)
            videos = self.row_videos(source, i, row, content)
            if history and self.processor is not None:
                raise ValueError(
                    f"{source}: row {i}: a conversation as the prompt is for text models only for now; "
                    "give the prompt as one text"
                )
            if self.processor is not None:
                clips = [self.clip(v, f"{source}: row {i}") for v in videos]
                text = self.render(content, imgs is not None or bool(videos))
                enc = self.processor.encode(text, imgs or [], clips)
                ids, raw, imgs = enc.ids, enc.raw_ids, enc.images
            else:
                text = self.render(content, history=history)
                ids, raw = self.tokenizer(text, add_special_tokens=False)["input_ids"], None
            media = bool(imgs or videos)
            if len(ids) > self.max_len:
                if not keep_all:
                    self.dropped += 1
                    self.longest = max(self.longest, len(ids))
                    continue
                if media and not data_cfg.filter_overlong_prompts:
                    raise ValueError(
                        f"{source}: row {i} is {len(ids)} tokens with its images or videos, more than "
                        f"data.max_prompt_length ({self.max_len}), and such a prompt is never cut "
                        "(the cut would fall in their tokens): raise max_prompt_length, lower "
                        "data.max_pixels (or video_fps), or set data.filter_overlong_prompts: true to drop such rows"
                    )
            extra = {k: v for k, v in row.items() if k not in own and k in columns}
            self.prompts.append(
                Prompt(
                    len(self.prompts),
                    ids if media else ids[: self.max_len],
                    str(row[data_cfg.answer_key]),
                    extra,
                    content,
                    len(ids),
                    raw if media else None,
                    imgs or [],
                    history,
                    self.reset_input(row, f"{source}: row {i}", content, history, media)
                    if environment
                    else None,
                    videos,
                )
            )
        self.columns = sorted(columns - {data_cfg.image_key, data_cfg.video_key})

    def row_images(self, source: str, i: int, row: dict, content: str) -> list | None:
        """The row's images, opened and resized; None when the data set has no image column (then
        the prompt is text, as EasyR1 decides). One error naming the row for anything wrong."""
        d = self.cfg
        if d.image_key not in row:
            return None
        items = row[d.image_key] or []
        items = items if isinstance(items, list) else [items]
        wanted = content.count(vision.PLACEHOLDER) + self.template_images
        if wanted != len(items):
            raise ValueError(placeholder_mismatch(source, i, wanted, len(items), d))
        if items and self.processor is None:
            raise ValueError(
                f"{source}: row {i} has images, and the model is a text model; train a vision-language "
                f"model (its config has a vision_config), or drop the {d.image_key!r} column"
            )
        with self.reading(f"{source}: row {i}", "image"):
            return [
                vision.resize(vision.open_image(item, d.image_dir), d.min_pixels, d.max_pixels)
                for item in items
            ]

    def row_videos(self, source: str, i: int, row: dict, content: str) -> list:
        """The row's videos as written (files or frame lists, decoded when used: `clip`); one
        `<video>` in the prompt for each."""
        d = self.cfg
        items = row_videos(row.get(d.video_key))
        if content.count(video.PLACEHOLDER) != len(items):
            raise ValueError(
                f"{source}: row {i} has {content.count(video.PLACEHOLDER)} <video> in its prompt and "
                f"{len(items)} videos in {d.video_key!r}: put one <video> where each video goes"
            )
        if items and self.processor is None:
            raise ValueError(
                f"{source}: row {i} has videos, and the model is a text model; train a vision-language "
                f"model (its config has a vision_config), or drop the {d.video_key!r} column"
            )
        return items

    def clip(self, item, where: str) -> video.Clip:
        """One video of a row, sampled at data.video_fps and resized as EasyR1's fetch_video does."""
        d = self.cfg
        with self.reading(where, "video"):
            if not isinstance(item, str):  # a list of frames
                item = [vision.open_image(f, d.image_dir) for f in item]
            return video.load(
                item, d.image_dir, d.video_fps, d.min_pixels, d.max_pixels, self.processor.video_factor
            )

    @contextlib.contextmanager
    def reading(self, where: str, kind: str):
        """One error naming the row for an image or video (`kind`) that cannot be read."""
        d = self.cfg
        try:
            yield
        except FileNotFoundError as e:
            raise ValueError(
                f"{where}: {kind} {e} not found (relative paths are joined with data.image_dir"
                f"{', ' + d.image_dir if d.image_dir else ', which is not set'})"
            ) from None
        except Exception as e:  # PIL or OpenCV cannot read it, or an unknown form
            raise ValueError(f"{where}: cannot read its {kind} ({type(e).__name__}: {e})") from None

    def check_images(self, name: str, limit: int) -> None:
        """More images per prompt than `limit_images`, said before a step (vLLM would refuse the
        prompt mid-run)."""
        most = max((len(p.images) for p in self.prompts), default=0)
        if limit and most > limit:
            raise ValueError(
                f"the {name} data has prompts with {most} images, more than "
                f"worker.rollout.limit_images ({limit}); raise limit_images, or 0 for the engine's own limit"
            )

    def render(self, content: str, with_images: bool = False, history: list = (), after: str = "") -> str:
        """The prompt as the model sees it: the format prompt over `content` (and `tools`, the
        tools' schemas, in a multi-turn run) and `after`, after a conversational row's earlier
        messages, in the chat template (given the tools too)."""
        text = self.template.render(content=content, tools=self.tools or []) if self.template else content
        text += after
        if self.processor is not None:
            return self.processor.render(text, with_images)
        return self.tokenizer.apply_chat_template(
            [*history, {"role": "user", "content": text}],
            add_generation_prompt=True,
            tokenize=False,
            tools=self.tools,
        )

    def reset_input(self, row: dict, where: str, content: str, history: list, images: bool = False) -> dict:
        """An environment's reset takes the whole row (TRL passes its prompt too); the text it
        returns goes at the end of the last message, between `around`'s two halves."""
        cut = "\x00reset\x00"
        head, _, tail = self.render(content, images, history=history, after=cut).partition(cut)
        keep = {k: v for k, v in row.items() if k not in (self.cfg.image_key, self.cfg.video_key)}
        return {"row": keep, "around": (head, tail), "where": where}

    def image_inputs(self, index: int, clips: list | None = None) -> dict:
        """The processor's image and video tensors for prompt `index` (recomputed: a data set's
        pixels would not fit in memory at once); `clips`: its videos, decoded already."""
        p = self.prompts[index]
        if not p.images and not p.videos:
            return {}
        clips = self.clips(index) if clips is None else clips
        return self.processor.encode(self.render(p.content, True), p.images, clips).image_inputs

    def clips(self, index: int) -> list[video.Clip]:
        """Prompt `index`'s videos, decoded (again: a data set's frames would not fit in memory)."""
        p = self.prompts[index]
        return [self.clip(v, f"prompt {index}") for v in p.videos]

    def __len__(self) -> int:
        return len(self.prompts)


class Loader:
    """Seeded batches of prompts with drop_last; `state_dict` resumes mid-epoch exactly.

    The order of epoch e is a permutation drawn from a generator seeded with (seed, e), so it does
    not depend on how many batches were drawn before, or on the number of workers.
    """

    def __init__(self, size: int, batch_size: int, seed: int, shuffle: bool = True):
        if size < batch_size:
            raise ValueError(f"the data set has {size} prompts, fewer than one batch of {batch_size}")
        self.size, self.batch_size, self.seed, self.shuffle = size, batch_size, seed, shuffle
        self.epoch, self.position = 0, 0

    @property
    def batches_per_epoch(self) -> int:
        return self.size // self.batch_size

    def order(self, epoch: int) -> list[int]:
        if not self.shuffle:
            return list(range(self.size))
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        return torch.randperm(self.size, generator=g).tolist()

    def next(self) -> list[int]:
        if self.position >= self.batches_per_epoch:
            self.epoch, self.position = self.epoch + 1, 0
        start = self.position * self.batch_size
        self.position += 1
        return self.order(self.epoch)[start : start + self.batch_size]

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.position = int(state["epoch"]), int(state["position"])


def check_sets(sets: dict, data_cfg, limit_images: int, wants, batch: int, log) -> None:
    """Each prompt set as the trainer will take it — what was dropped, its images, the columns the
    reward asks for, at least one batch — or one clear error before the first step."""
    for name, ps in sets.items():
        if ps is None:
            continue
        if ps.dropped:
            log(
                f"[data] {name}: dropped {ps.dropped} prompts longer than {data_cfg.max_prompt_length} tokens"
            )
        ps.check_images(name, limit_images)
        missing = [k for k in wants if k != "prompt" and k not in ps.columns]
        if missing:
            raise ValueError(
                f"the reward function asks for {', '.join(missing)} (REWARD_INPUT_KEYS), which the {name} "
                f"data does not have; its columns are {', '.join(ps.columns)}"
            )
        need = batch if name == "train" else 1
        if len(ps) >= need:
            continue
        why = "; lower data.rollout_batch_size (and mini_rollout_batch_size), or add data"
        if ps.dropped:
            why = (
                f": {ps.dropped} were dropped as longer than data.max_prompt_length ({ps.max_len}), the "
                f"longest {ps.longest} tokens with the format prompt and chat template; raise "
                f"data.max_prompt_length to {ps.longest}, or set data.filter_overlong_prompts: false to "
                "cut them to length"
            )
        short = f", fewer than one batch of {need}" if name == "train" else ""
        raise ValueError(f"the {name} data has {len(ps)} prompts{short}{why}")


def chunk_evenly(items: list, parts: int) -> list[list]:
    """Split into `parts` contiguous chunks whose sizes differ by at most one."""
    base, extra = divmod(len(items), parts)
    return [items[i * base + min(i, extra) : (i + 1) * base + min(i + 1, extra)] for i in range(parts)]
