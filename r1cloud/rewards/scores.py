"""What every reward source (a function in the pool, a remote endpoint) shares: the score's shape
and its checks, each failure reason logged once."""

from __future__ import annotations

import math
import sys

Score = dict[str, float]


class ScoreChecks:
    """What every reward source shares: checking scores, and logging each failure reason once."""

    name = "unknown"
    wants: tuple[str, ...] = ()  # extra inputs asked for: data columns, or "prompt"
    sends_prompt = False  # a remote model reads the whole prompt (chat template included)

    def __init__(self):
        self.reasons: set[str] = set()

    def close(self) -> None:
        pass

    @staticmethod
    def _first(out):
        return out[0] if isinstance(out, list) and len(out) == 1 else out

    @staticmethod
    def _valid(s) -> bool:
        return isinstance(s, dict) and "overall" in s and all(_finite(v) for v in s.values())

    @staticmethod
    def _clean(s: dict) -> Score:
        return {k: float(v) for k, v in s.items()}

    @staticmethod
    def _describe(out, n: int) -> str:
        if isinstance(out, list) and len(out) != n:
            return f"{len(out)} scores for {n} samples"
        if isinstance(out, dict) and "overall" not in out:
            return "a dict without 'overall'"
        if isinstance(out, dict | list):
            return "a non-finite or non-numeric score"
        return f"a {type(out).__name__}, not a dict with 'overall'"

    def _note(self, reason: str) -> None:
        if reason not in self.reasons and len(self.reasons) < 20:
            self.reasons.add(reason)
            print(f"[reward] {self.name}: {reason}", file=sys.stderr, flush=True)


def _finite(v) -> bool:
    try:
        return not isinstance(v, str) and math.isfinite(float(v))
    except (TypeError, ValueError, OverflowError):
        return False
