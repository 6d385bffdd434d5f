"""Answer extraction and comparison shared by the bundled reward functions (`reward_functions/`).

Pure string and number logic with no heavy imports, so reward workers start fast. Symbolic
equivalence (math-verify) is layered on top of this by the rewards issue; what is here is exact
after normalisation, plus numeric equality of integers, decimals and simple fractions.
"""

from __future__ import annotations

import re
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
