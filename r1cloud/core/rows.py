"""The shapes a data row's cells may take, read the same way by validation, the trainer's data
loader, vision and chat: a prompt as text or a conversation, an image in EasyR1's forms, and the
line for a row whose image placeholders and images differ."""

from __future__ import annotations

import os


def conversation(value, where: str) -> tuple[list[dict], str]:
    """A prompt cell as (earlier messages, the last user message's text): a plain text, or a
    conversation as TRL's conversational data sets hold it (a list of {"role", "content"}, last
    the user's), whose system message and examples reach the model as they are."""
    if not isinstance(value, list):
        return [], str(value)
    ok = all(isinstance(m, dict) and isinstance(m.get("content"), str) and m.get("role") for m in value)
    if not value or not ok or value[-1]["role"] != "user":
        raise ValueError(
            f"{where}: a prompt given as a list must be a conversation, "
            '[{"role": ..., "content": "..."}, ...], ending with the user\'s message'
        )
    return [{"role": m["role"], "content": m["content"]} for m in value[:-1]], value[-1]["content"]


def image_source(item, image_dir: str | None):
    """One image of a row, in any of EasyR1's forms, as what opens it: a path (joined with
    `image_dir` when relative), bytes, or the item as it is (the trainer's vision.open_image too)."""
    if isinstance(item, dict):  # an HF Image feature
        item = item.get("bytes") or item.get("path")
    if isinstance(item, str):
        return os.path.join(image_dir, item) if image_dir and not os.path.isabs(item) else item
    return item


def placeholder_mismatch(where: str, row: int, wanted: int, images: int, d) -> str:
    """The one line for a row whose `<image>` placeholders and images differ (validate, data load)."""
    return (
        f"{where}: row {row} has {wanted} <image> placeholder(s) in {d.prompt_key!r} and {images} "
        f"image(s) in {d.image_key!r}; put one <image> in the prompt where each image goes"
    )


def row_videos(value) -> list:
    """A row's videos as written: a file, a list of them, or one video given as its decoded frames
    (a list of images that are not paths: one video, not several)."""
    items = value or []
    if isinstance(items, list) and not (items and not isinstance(items[0], str | list | tuple)):
        return items
    return [items]
