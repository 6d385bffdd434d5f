"""Prompts for the trainer: datasets (`name@split`, local files and folders), the Jinja format prompt
with `content`, the chat template, EasyR1's truncation and overlong filter, and a seeded loader
whose position is part of every checkpoint.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

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
    """Rows rendered into prompt token ids, as EasyR1's RLHFDataset does for text models."""

    def __init__(
        self,
        files: str | list[str],
        tokenizer,
        data_cfg,
        filter_overlong: bool | None = None,
        limit: int | None = None,
        probs: list[float] | None = None,
    ):
        import jinja2

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
            parts.append(rows)
        parts = [[{k: row[k] for k in columns} for row in p] for p in parts] if len(parts) > 1 else parts
        rows = mix(parts, probs, data_cfg.seed)
        if limit is not None:
            rows = rows.select(range(min(limit, len(rows)))) if hasattr(rows, "select") else rows[:limit]
        self.template = None
        if data_cfg.format_prompt:
            self.template = jinja2.Template(Path(data_cfg.format_prompt).read_text(encoding="utf-8").strip())
        self.tokenizer = tokenizer
        self.max_len = data_cfg.max_prompt_length
        keep_all = not (data_cfg.filter_overlong_prompts if filter_overlong is None else filter_overlong)
        self.prompts: list[Prompt] = []
        self.dropped = 0
        for row in rows:
            content = str(row[data_cfg.prompt_key])
            ids = self.tokenizer(self.render(content), add_special_tokens=False)["input_ids"]
            if len(ids) > self.max_len and not keep_all:
                self.dropped += 1
                continue
            extra = {k: v for k, v in row.items() if k not in (data_cfg.prompt_key, data_cfg.answer_key)}
            self.prompts.append(
                Prompt(
                    len(self.prompts),
                    ids[: self.max_len],
                    str(row[data_cfg.answer_key]),
                    extra,
                    content,
                    len(ids),
                )
            )
        self.columns = sorted(columns)

    def render(self, content: str) -> str:
        """The prompt as the model sees it: the format prompt over `content`, in the chat template."""
        text = self.template.render(content=content) if self.template else content
        return self.tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
        )

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


def total_steps(max_steps: int | None, epochs: int, batches_per_epoch: int) -> int:
    return max_steps if max_steps else epochs * batches_per_epoch


def chunk_evenly(items: list, parts: int) -> list[list]:
    """Split into `parts` contiguous chunks whose sizes differ by at most one."""
    base, extra = divmod(len(items), parts)
    out, start = [], 0
    for i in range(parts):
        end = start + base + (1 if i < extra else 0)
        out.append(items[start:end])
        start = end
    return out
