"""Answer extraction and comparison shared by the bundled reward functions (`reward_functions/`).

`answers_equal` is pure string and number logic (exact after normalisation, plus numeric equality
of integers, decimals and simple fractions): fast, and enough for most answers. `math_equal` adds
Hugging Face's math-verify behind it — LaTeX parsed to sympy, so `\frac{1}{2}` = 0.5, `x=3` = 3,
intervals, sets and units — only when the cheap check says no.
"""

from __future__ import annotations

import re
import threading
from fractions import Fraction

_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")


def extract_boxed(text: str) -> str | None:
    """The content of the last `\\boxed{...}` (braces matched), or None."""
    starts = [m.end() for m in _BOXED.finditer(text)]
    if not starts:
        return None
    i = start = starts[-1]
    depth = 1
    while i < len(text):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[start:i]
        i += 1
    return None


_REMOVE = [
    r"\left",
    r"\right",
    r"\!",
    r"\,",
    r"\;",
    r"\:",
    r"\displaystyle",
    "$",
    "^\\circ",
    "^{\\circ}",
    "\\%",
    "%",
]


def normalize(answer: str) -> str:
    s = answer.strip()
    s = re.sub(r"\\text\{\s*([^{}]*)\}", r"\1", s)
    s = re.sub(r"\\(?:mathrm|textbf|mathbf)\{([^{}]*)\}", r"\1", s)
    for token in _REMOVE:
        s = s.replace(token, "")
    s = s.replace(r"\dfrac", r"\frac").replace(r"\tfrac", r"\frac")
    s = re.sub(r"^[a-zA-Z]\s*=\s*", "", s)  # "x = 3" -> "3"
    s = re.sub(r"\s+", "", s).rstrip(".")
    s = re.sub(r"(\d),(?=\d{3}(?!\d))", r"\1", s)  # 1,000 -> 1000
    return s


def to_number(s: str) -> Fraction | None:
    m = re.fullmatch(r"(-?)\\frac\{(-?\d+)\}\{(-?\d+)\}", s) or re.fullmatch(r"(-?)\\frac(\d)(\d)", s)
    try:
        if m:
            value = Fraction(int(m.group(2)), int(m.group(3)))
            return -value if m.group(1) else value
        if re.fullmatch(r"-?\d+/\d+", s):
            return Fraction(s)
        if re.fullmatch(r"-?(\d+\.?\d*|\.\d+)(e-?\d+)?", s):
            return Fraction(s)
    except (ValueError, ZeroDivisionError):
        return None
    return None


def answers_equal(given: str | None, truth: str) -> bool:
    if given is None:
        return False
    a, b = normalize(given), normalize(truth)
    if a == b:
        return True
    x, y = to_number(a), to_number(b)
    return x is not None and y is not None and x == y


def last_answer_line(text: str) -> str | None:
    """DAPO's convention: the last `Answer: ...` line (case-insensitive)."""
    found = re.findall(r"(?i)Answer\s*:\s*([^\n]+)", text)
    return found[-1].strip() if found else None


def first_int(text: str) -> int | None:
    m = re.search(r"-?\d+", text.replace(",", ""))
    return int(m.group()) if m else None


def math_equal(given: str | None, truth: str, timeout: int | None = 5) -> bool:
    """`given` equals `truth` as mathematics. math-verify's own time limit (SIGALRM) applies where
    signals can be used, the main thread; elsewhere the caller's limit is the guard."""
    if given is None:
        return False
    if answers_equal(given, truth):
        return True
    try:
        from math_verify import parse, verify
    except ImportError:  # not installed: the exact check is the answer
        return False
    limit = timeout if threading.current_thread() is threading.main_thread() else None

    def as_math(text: str):
        text = text.strip().strip("$")
        return parse(f"${text}$", parsing_timeout=limit)

    try:
        gold, pred = as_math(truth), as_math(given)
        return bool(gold and pred and verify(gold, pred, timeout_seconds=limit))
    except Exception:  # a timeout or a sympy failure: not shown equal
        return False
