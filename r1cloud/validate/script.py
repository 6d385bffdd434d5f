"""EasyR1's launch scripts as blueprints: `r1cloud validate examples/qwen3_4b_math_grpo.sh`.

An EasyR1 example is a shell script that sets a few variables and runs
`python3 -m verl.trainer.main config=examples/config.yaml key=value …`. r1cloud reads such a
script without running it: variable assignments (`MODEL_PATH=…`, `export NAME=…`), then the
trainer's command line, whose `config=` is the base and whose `key=value` words are overrides.
Words are split and quoted as bash does (single and double quotes, backslashes, comments);
expansions are bash's for variables (`$X`, `${X}`, `${X:-default}`, from the script in order,
then the environment), the script's arguments (none: `$1` is unset, `$@` is empty) and
`$(date +FORMAT)`. Any other command is named, not run and not expanded. Exported variables
become the job's `envs`.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from r1cloud.spec.problems import Problem, SpecError

ENTRY = "verl.trainer.main"
NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
HARMLESS = ("set ", "#", "echo ", "ulimit ")  # shell settings that change nothing about the run
# $NAME, ${NAME}, ${NAME:-default}, ${NAME-default}; NAME may be a positional parameter (a digit)
VAR_RE = re.compile(
    r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*|[0-9]+)(?:(:?-)([^}]*))?\}|([A-Za-z_][A-Za-z0-9_]*|[0-9]))"
)
DATE_RE = re.compile(r"\$\(\s*date\s+(?:'\+([^']*)'|\"\+([^\"]*)\"|\+(\S+))\s*\)")
ARGS = {"$@": "", "$*": "", "$#": "0"}  # r1cloud runs a script with no arguments


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
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise SpecError([Problem("", f"cannot read {shown}: {getattr(e, 'strerror', None) or e}")]) from None
    script, variables, found = Script(), dict(os.environ), False
    for line_no, line, physical in _logical_lines(text):
        where = f"{shown}:{line_no}"
        if not line.strip() or line.lstrip().startswith(HARMLESS):
            continue
        try:
            raw = list(_words(line, None))  # unexpanded: what kind of line this is
        except ValueError as e:
            raise SpecError([Problem("", f"{e}", where)]) from None
        if not raw:  # a comment after blanks
            continue
        exported = raw[0] == "export"
        body = raw[1:] if exported else raw
        k = next((i for i, word in enumerate(body) if not NAME_RE.match(word)), len(body))
        command = body[k:]  # after its NAME=VALUE prefix
        at = command.index(ENTRY) if ENTRY in command else -1
        if command and not exported and not (at > 0 and command[at - 1] == "-m"):
            script.skipped.append(
                Problem(
                    "",
                    f"`{line.strip()[:60]}` is not run: r1cloud reads the script without running it",
                    where,
                )
            )
            continue
        try:
            words = _assigning(line, variables, script.envs if exported else None, where)
        except ValueError as e:
            raise SpecError([Problem("", f"{e}", where)]) from None
        if exported:
            for name in words[1:]:  # `export NAME` of a variable set before
                if not NAME_RE.match(name) and name in variables:
                    script.envs[name] = (variables[name], where)
        if at > 0:
            if found:
                raise SpecError(
                    [Problem("", f"a second `python3 -m {ENTRY}` line: keep one run per script", where)]
                )
            found = True
            assigned = [w.partition("=") for w in words[:k]]
            script.envs.update({name: (value, where) for name, _, value in assigned})
            at = words.index(ENTRY)
            script.overrides += [(w, f"{shown}:{_line_of(w, line_no, physical)}") for w in words[at + 1 :]]
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


def _assigning(line: str, variables: dict[str, str], envs: dict | None, where: str) -> list[str]:
    """The line's words, expanded; its leading NAME=VALUE words assigned in order as they come (so
    `X=1 Y=$X` sees X), and with `envs` (an export) recorded there too."""
    words = []
    leading = True
    for word in _words(line, variables):
        if leading and NAME_RE.match(word):
            name, _, value = word.partition("=")
            variables[name] = value
            if envs is not None:
                envs[name] = (value, where)
        elif word != "export" or words:
            leading = False
        words.append(word)
    return words


def _words(line: str, variables: dict[str, str] | None):
    """bash's words of `line`: blanks split them, quotes and backslashes quote, `#` at a word's start
    comments the rest. With `variables`, each word's expansions are made as the word is read (bash's
    field splitting of an unquoted expansion included); with None they are left as written."""
    word: list[str] = []
    started = False  # a word is open (an empty "" is a word)
    i, n = 0, len(line)
    while i < n:
        c = line[i]
        if c in " \t":
            if started:
                yield "".join(word)
                word, started = [], False
            i += 1
        elif c == "#" and not started:
            break
        elif c == "\\":
            word.append(line[i + 1 : i + 2])
            started, i = True, i + 2
        elif c == "'":
            end = line.find("'", i + 1)
            if end < 0:
                raise ValueError("No closing quotation")
            word.append(line[i + 1 : end])
            started, i = True, end + 1
        elif line.startswith('"$@"', i) and variables is not None:  # the arguments, each a word: none
            i += 4
        elif c == '"':
            i, text = _double_quoted(line, i + 1, variables)
            word.append(text)
            started = True
        elif c == "$" and variables is None and line[i + 1 : i + 2] in ("{", "("):
            end = _closing(line, i + 1)  # left as written, blanks inside and all
            word.append(line[i:end])
            started, i = True, end
        elif c in "$`" and variables is not None:
            i, value, expanded = _expansion(line, i, variables)
            if not expanded:  # a lone $
                word.append(value)
                started = True
                continue
            fields = value.split()  # unquoted: split on blanks, as bash's field splitting
            if value[:1].isspace() and started and fields:
                yield "".join(word)
                word = []
            for k, f in enumerate(fields):
                if k:
                    yield "".join(word)
                    word = []
                word.append(f)
                started = True
            if fields and value[-1:].isspace():
                yield "".join(word)
                word, started = [], False
        else:
            word.append(c)
            started, i = True, i + 1
    if started:
        yield "".join(word)


def _closing(line: str, i: int) -> int:
    """The index after the brace or parenthesis at `line[i]` closes (nesting counted)."""
    depth = 0
    for j in range(i, len(line)):
        depth += line[j] in "({"
        depth -= line[j] in ")}"
        if depth == 0:
            return j + 1
    return len(line)


def _double_quoted(line: str, i: int, variables: dict[str, str] | None) -> tuple[int, str]:
    """The text of a double-quoted part starting after its `"`: expanded (no field splitting),
    backslash quoting only $ ` " \\ and a newline. Returns (the index after the closing quote, text)."""
    out = []
    while i < len(line):
        c = line[i]
        if c == '"':
            return i + 1, "".join(out)
        if c == "\\" and line[i + 1 : i + 2] in ("$", "`", '"', "\\"):
            out.append(line[i + 1])
            i += 2
        elif c in "$`" and variables is not None:
            i, value, _ = _expansion(line, i, variables)
            out.append(value)
        else:
            out.append(c)
            i += 1
    raise ValueError("No closing quotation")


def _expansion(line: str, i: int, variables: dict[str, str]) -> tuple[int, str, bool]:
    """The expansion at `line[i]` (a `$` or a backquote): (index after it, value, whether it was
    one). ValueError for a command substitution other than $(date +FORMAT), or an unset variable."""
    if m := DATE_RE.match(line, i):
        return m.end(), time.strftime(next(g for g in m.groups() if g is not None)), True
    if line.startswith("$(", i) or line[i] == "`":
        raise ValueError(
            f"`{line.strip()[:60]}` runs a command (`$(…)` or backquotes): r1cloud reads the script "
            "without running it and understands only $(date +FORMAT); write the value itself"
        )
    if line[i : i + 2] in ARGS:
        return i + 2, ARGS[line[i : i + 2]], True
    if m := VAR_RE.match(line, i):
        return m.end(), _variable(m, variables), True
    return i + 1, "$", False


def _variable(m: re.Match, variables: dict[str, str]) -> str:
    name = m.group(1) or m.group(4)
    value = None if name.isdigit() else variables.get(name)  # no arguments: $1… are unset
    if m.group(2) is not None and (value is None or (m.group(2) == ":-" and value == "")):
        return _double_quoted(m.group(3) + '"', 0, variables)[1]  # the default's own expansions
    if value is None and name.isdigit():
        raise ValueError(
            f"${name} is the script's argument {name}, and r1cloud runs it with none: write the value, "
            f"or give a default (${{{name}:-…}})"
        )
    if value is None:
        raise ValueError(
            f"${name} is not set: set it in the script or export {name}=… before running r1cloud"
        )
    return value
