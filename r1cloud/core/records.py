"""JSON read back from files: job records, metrics lines, trainer state, EasyR1's logs. Any damage —
text cut or invalid, nesting deep enough to exhaust the stack, an integer past Python's 4,300
digits — ends as ValueError, never another exception; and a number is checked before it is
formatted, compared or used as a step (a 400-digit value, infinity, NaN, a step of 10^30)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

BIG = 1e15  # beyond this no metric, time or count r1cloud shows is meaningful


def loads(text: str | bytes) -> Any:
    """json.loads, with nesting that exhausts the stack a ValueError like any other damage."""
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("nested too deeply") from None
    except ValueError as e:  # Python's own limit, whose message suggests changing the interpreter
        if "integer string conversion" in str(e):
            raise ValueError("a number of more than 4,300 digits") from None
        raise


def load_object(path: str | Path) -> dict:
    """The JSON object in `path`: OSError when it cannot be read, ValueError when it is not one."""
    data = loads(Path(path).read_bytes())
    if not isinstance(data, dict):
        raise ValueError(f"holds a JSON {type(data).__name__}, not an object")
    return data


def finite(value: Any, limit: float = BIG) -> float | None:
    """`value` as a float when it is a number to show (not a bool, finite, below `limit`), else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if isinstance(value, int) and abs(value) >= limit:
        return None
    value = float(value)
    return value if math.isfinite(value) and abs(value) < limit else None


def cut(text: str, most: int = 120) -> str:
    """`text` as a message shows it: at most `most` characters."""
    return text if len(text) <= most else f"{text[: most - 1]}…"


def whole(value: Any, lo: int = 0, hi: int = 10**9) -> int | None:
    """`value` when it is an int in [lo, hi] (a step, a count), else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) and lo <= value <= hi else None


def flatten(tree: dict, sep: str = "/", prefix: str = "") -> dict:
    """Nested keys joined with `sep` (EasyR1's metric rows; the config as MLflow params); an
    empty section stays a value."""
    out = {}
    for k, v in tree.items():
        if isinstance(v, dict) and v:
            out.update(flatten(v, sep, f"{prefix}{k}{sep}"))
        else:
            out[f"{prefix}{k}"] = v
    return out
