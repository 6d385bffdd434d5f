"""EasyR1's launch scripts as blueprints: `r1cloud validate examples/qwen3_4b_math_grpo.sh`.

An EasyR1 example is a shell script that sets a few variables and runs
`python3 -m verl.trainer.main config=examples/config.yaml key=value …`. r1cloud reads such a
script without running it: variable assignments (`MODEL_PATH=…`, `export NAME=…`), then the
trainer's command line, whose `config=` is the base and whose `key=value` words are overrides.
Expansions are bash's for variables (`$X`, `${X}`, `${X:-default}`, from the script, then the
environment) and `$(date +FORMAT)`; anything else a shell would run is named, not guessed at.
Exported variables become the job's `envs`.
"""

from __future__ import annotations

import os
import re
import shlex
import time
from dataclasses import dataclass, field
from pathlib import Path

from .problems import Problem, SpecError

ENTRY = "verl.trainer.main"
NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
HARMLESS = ("set ", "#", "echo ", "ulimit ")  # shell settings that change nothing about the run
VAR_RE = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?-)([^}]*))?\}|([A-Za-z_][A-Za-z0-9_]*))")
DATE_RE = re.compile(r"\$\(\s*date\s+(?:'\+([^']*)'|\"\+([^\"]*)\"|\+(\S+))\s*\)")


@dataclass
class Script:
    overrides: list[tuple[str, str]] = field(default_factory=list)  # (key=value, "file:LINE")
    envs: dict[str, tuple[str, str]] = field(default_factory=dict)  # name -> (value, "file:LINE")
    skipped: list[Problem] = field(default_factory=list)  # commands r1cloud does not run (warnings)


def is_script(path: Path) -> bool:
    return path.suffix == ".sh"


def read_script(path: Path, shown: str) -> Script:
    """The overrides and exports of an EasyR1 launch script. Raises SpecError naming the line."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise SpecError([Problem("", f"cannot read {shown}: {getattr(e, 'strerror', None) or e}")]) from None
    script, variables, found = Script(), dict(os.environ), False
    for line_no, line, physical in _logical_lines(text):
        where = f"{shown}:{line_no}"
        if not line.strip() or line.lstrip().startswith(HARMLESS):
            continue
        try:
            words = shlex.split(_expand(line, variables), comments=True)
        except ValueError as e:
            raise SpecError([Problem("", f"{e}", where)]) from None
        exported = words[:1] == ["export"]
        words = words[1:] if exported else words
        assigns = []  # NAME=VALUE words: the line's own, or the environment of its command
        while words and NAME_RE.match(words[0]):
            assigns.append(words.pop(0).partition("="))
        if not words or exported:
            for name, _, value in assigns:
                variables[name] = value
                if exported:
                    script.envs[name] = (value, where)
            for name in words:  # `export NAME` of a variable set before
                if name in variables:
                    script.envs[name] = (variables[name], where)
            continue
        at = words.index(ENTRY) if ENTRY in words else -1
        if at > 0 and words[at - 1] == "-m":
            if found:
                raise SpecError(
                    [Problem("", f"a second `python3 -m {ENTRY}` line: keep one run per script", where)]
                )
            found = True
            script.envs.update({name: (value, where) for name, _, value in assigns})
            script.overrides += [(w, f"{shown}:{_line_of(w, line_no, physical)}") for w in words[at + 1 :]]
        else:
            script.skipped.append(
                Problem(
                    "",
                    f"`{line.strip()[:60]}` is not run: r1cloud reads the script without running it",
                    where,
                )
            )
    if not found:
        raise SpecError([Problem("", f"{shown} has no `python3 -m {ENTRY} …` line to read the run from")])
    return script


def _logical_lines(text: str) -> list[tuple[int, str, list[str]]]:
    """Lines with backslash-newline continuations joined: (first line's number, text, its lines)."""
    out, current, lines, start = [], "", [], 0
    for n, raw in enumerate(text.splitlines(), 1):
        if not lines:
            start = n
        lines.append(raw)
        if raw.endswith("\\") and not raw.endswith("\\\\"):
            current += raw[:-1] + " "
            continue
        out.append((start, current + raw, lines))
        current, lines = "", []
    if lines:
        out.append((start, current, lines))
    return out


def _line_of(word: str, start: int, physical: list[str]) -> int:
    """The line of a continued command that sets `word`'s key (for messages that name the line)."""
    key = word.partition("=")[0] + "="
    return next((start + i for i, raw in enumerate(physical) if key in raw), start)


def _expand(line: str, variables: dict[str, str]) -> str:
    """bash's variable and `$(date +FMT)` expansion outside single quotes; ValueError for the rest."""
    parts = re.split(r"('[^']*')", line)  # odd parts are single-quoted: left as they are
    for i in range(0, len(parts), 2):
        part = DATE_RE.sub(lambda m: time.strftime(next(g for g in m.groups() if g is not None)), parts[i])
        part = VAR_RE.sub(lambda m: _variable(m, variables), part)
        if "$(" in part or "`" in part:
            raise ValueError(
                f"`{line.strip()[:60]}` runs a command (`$(…)` or backquotes): r1cloud reads the script "
                "without running it and understands only $(date +FORMAT); write the value itself"
            )
        parts[i] = part
    return "".join(parts)


def _variable(m: re.Match, variables: dict[str, str]) -> str:
    name = m.group(1) or m.group(4)
    value = variables.get(name)
    if m.group(2) is not None and (value is None or (m.group(2) == ":-" and value == "")):
        return m.group(3)
    if value is None:
        raise ValueError(
            f"${name} is not set: set it in the script or export {name}=… before running r1cloud"
        )
    return value
