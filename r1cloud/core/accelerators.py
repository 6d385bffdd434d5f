"""`resources.accelerators` read: `H100:8`, a list of such names tried in order, or a dict of
alternatives {H100: 8, A100-80GB: 8}."""

from __future__ import annotations

import re

ACCEL_RE = re.compile(r"^([A-Za-z][A-Za-z0-9_.-]*)(?::(\d+))?$")


def parse_accelerator(text: str) -> tuple[str, int]:
    """`H100:8` -> ("H100", 8); `H100` -> ("H100", 1)."""
    m = ACCEL_RE.match(text.strip())
    if not m or (m.group(2) is not None and not 1 <= int(m.group(2)) <= 4096):
        raise ValueError(f"{text[:40]!r} is not an accelerator; write NAME:COUNT (1 to 4096), e.g. H100:8")
    return m.group(1), int(m.group(2) or 1)


def accelerator_options(value: str | list[str] | dict[str, int]) -> list[tuple[str, int]]:
    if isinstance(value, str):
        return [parse_accelerator(value)]
    if not value:
        raise ValueError(f"the {type(value).__name__} of accelerators is empty")
    if isinstance(value, list):
        return [parse_accelerator(a) for a in value]
    out = []
    for name, count in value.items():
        parsed, _ = parse_accelerator(name)
        if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= 4096:
            raise ValueError(
                f"{name}: {str(count)[:20]} is not a count of devices (a whole number from 1 to 4096)"
            )
        out.append((parsed, count))
    return out
