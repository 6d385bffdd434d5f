"""What goes wrong in a blueprint: one `Problem` per mistake, all reported together."""

from __future__ import annotations

from dataclasses import dataclass, field


def shown(key) -> str:
    """A key as a one-line message shows it: as written when printable, else quoted."""
    return key if isinstance(key, str) and key.isprintable() else repr(key)


@dataclass(frozen=True)
class Problem:
    path: str  # dotted key ("worker.rollout.n"), or "" for the file as a whole
    message: str
    origin: str | None = None  # "blueprint.yaml:23", "command line", or a file path
    related: tuple[str, ...] = field(default=())  # other keys the problem involves
    warning: bool = False

    def render(self) -> str:
        where = f" ({self.origin})" if self.origin else ""
        head = f"{shown(self.path)}: " if self.path else ""
        return f"{head}{self.message}{where}"


class SpecError(Exception):
    """The blueprint cannot run; `problems` lists every reason at once."""

    def __init__(self, problems: list[Problem], warnings: list[Problem] | None = None):
        self.problems = problems
        self.warnings = warnings or []
        super().__init__("\n".join(p.render() for p in problems))
