"""Answer extraction and comparison shared by the bundled reward functions (`reward_functions/`).

`answers_equal` is pure string and number logic (exact after normalisation, plus numeric equality
of integers, decimals and simple fractions): fast, and enough for most answers. `math_equal` adds
Hugging Face's math-verify behind it — LaTeX parsed to sympy, so `\frac{1}{2}` = 0.5, `x=3` = 3,
intervals, sets and units — only when neither the cheap check nor `settled` can answer.

`settled` gives math-verify's own verdict without parsing LaTeX, for the answers that need no
parser: two plain numbers (integers, decimals, fractions), two sets of such numbers, two surds
(k√m). It follows math-verify's rules (math_verify/grader.py, `sympy_numeric_eq`: exact for
integers and fractions, rounded to 6 decimals once either side is a decimal; a set is its distinct
elements), and answers None where they could go either way. tests/test_math_grading.py checks it
against math-verify on every case of the rewards benchmark and of the reward tests.
"""

from __future__ import annotations

import contextlib
import re
import threading
from fractions import Fraction

_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")


def extract_boxed(text: str) -> str | None:
    """The content of the last `\\boxed{...}` (braces matched), or None."""
    starts = [m.end() for m in _BOXED.finditer(text)]
    if not starts:
        return None
    start, depth = starts[-1], 1
    for i in range(start, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[start:i]
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
    with contextlib.suppress(ValueError, ZeroDivisionError):
        if m:
            value = Fraction(int(m.group(2)), int(m.group(3)))
            return -value if m.group(1) else value
        if re.fullmatch(r"-?\d+/\d+|-?(\d+\.?\d*|\.\d+)(e-?\d+)?", s):
            return Fraction(s)
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


_SPACING = re.compile(r"\s+|\\left|\\right|\\[,;:!]|\$")
_NUMBER = r"-?(?:\d+(?:\.\d*)?|\.\d+)|-?\\frac\{-?\d+\}\{-?\d+\}|-?\d+/\d+"
_SURD = re.compile(r"(-?)(\d*)\\sqrt(?:\{(\d+)\}|(\d))")


def _number(s: str) -> tuple[Fraction, bool] | None:
    """A plain number as math-verify reads one (exactly), and whether it is a decimal (a Float there)."""
    if not re.fullmatch(_NUMBER, s):
        return None
    value = to_number(s)
    return None if value is None else (value, "." in s)


def _surd(s: str) -> tuple[int, int] | None:
    """k√m (or an integer) as (k', r) with m = s²·r, r square-free: equal surds, equal pairs."""
    if re.fullmatch(r"-?\d+", s):
        return int(s), 1
    m = _SURD.fullmatch(s)
    if not m:
        return None
    k, n = int(m.group(2) or 1) * (-1 if m.group(1) else 1), int(m.group(3) or m.group(4))
    if n == 0 or n > 10**8 or k == 0:  # 0·√m is 0: left to math-verify
        return None
    root = 1
    for p in range(2, int(n**0.5) + 1):
        while n % (p * p) == 0:
            n, root = n // (p * p), root * p
    return k * root, n


def settled(given: str, truth: str) -> bool | None:
    """math-verify's verdict where it can be had without parsing (see the module's docstring)."""
    if len(given) > 200 or len(truth) > 200:  # int() refuses over 4,300 digits: math-verify decides
        return None
    a, b = (
        _SPACING.sub("", x).replace(r"\dfrac", r"\frac").replace(r"\tfrac", r"\frac") for x in (given, truth)
    )
    x, y = _number(a), _number(b)
    if x and y:
        if x[1] or y[1]:  # a decimal: math-verify rounds both to 6 places
            return True if x[0] == y[0] else (False if abs(x[0] - y[0]) > Fraction(2, 10**6) else None)
        return x[0] == y[0]
    if a[:2] == b[:2] == r"\{" and a[-2:] == b[-2:] == r"\}":
        xs, ys = ([_number(e) for e in t[2:-2].split(",")] for t in (a, b))
        if all(e and not e[1] for e in xs + ys):  # exact numbers only: no rounding to weigh
            return {e[0] for e in xs} == {e[0] for e in ys}
        return None
    x, y = _surd(a), _surd(b)
    return x == y if x and y and (x[1] > 1 or y[1] > 1) else None


def math_equal(given: str | None, truth: str, timeout: int | None = 5) -> bool:
    """`given` equals `truth` as mathematics. math-verify's own time limit (SIGALRM) applies where
    signals can be used, the main thread; elsewhere the caller's limit is the guard."""
    if given is None:
        return False
    if answers_equal(given, truth):
        return True
    verdict = settled(given, truth)
    return verdict if verdict is not None else verified(given, truth, timeout)


def verified(given: str, truth: str, timeout: int | None = 5) -> bool:
    """math-verify's verdict, parsing both."""
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
