"""Paths as a user writes them: `~` expanded, and a name no file can have read as no folder."""

from __future__ import annotations

import os
from pathlib import Path


def expand(path: str | os.PathLike) -> Path:
    """`~` and `~user` expanded; a `~user` with no such user stays as written (it then does not exist)."""
    try:
        return Path(path).expanduser()
    except RuntimeError:
        return Path(path)


def is_dir(path: Path) -> bool:
    """Path.is_dir, with a name no file can have (too long, a NUL) just not a folder."""
    try:
        return path.is_dir()
    except (OSError, ValueError):
        return False
