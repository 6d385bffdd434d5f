"""Reward functions through EasyR1's interface: `file.py:function`, `REWARD_TYPE` batch or
sequential, kwargs from `worker.reward.reward_function_kwargs`, `overall` required.

A function that raises, or returns the wrong length, no `overall` or a non-finite number, costs only
the samples concerned: they score 0 and are counted in `reward/errors`; the run goes on.
"""

from __future__ import annotations

import functools
import importlib.util
import math
import sys
from collections.abc import Callable
from pathlib import Path

Score = dict[str, float]


class RewardFunction:
    def __init__(
        self, path: str, name: str = "main", kwargs: dict | None = None, reward_type: str | None = None
    ):
        spec = importlib.util.spec_from_file_location(f"r1cloud_reward_{Path(path).stem}", path)
        if spec is None or spec.loader is None:
            raise ValueError(f"{path}: not a Python file")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # pickling by reference, dataclasses inside the module
        spec.loader.exec_module(module)
        fn = getattr(module, name, None)
        if not callable(fn):
            raise ValueError(f"{path} has no function {name!r}")
        self.fn: Callable = functools.partial(fn, **(kwargs or {}))
        self.name = getattr(module, "REWARD_NAME", "unknown")
        self.type = reward_type or getattr(module, "REWARD_TYPE", "batch")
        self.reasons: set[str] = set()

    def __call__(self, inputs: list[dict]) -> tuple[list[Score], int]:
        """Scores for `inputs`, and how many samples errored."""
        if self.type == "batch":
            try:
                out = self.fn(inputs)
                if isinstance(out, list) and len(out) == len(inputs) and all(self._valid(s) for s in out):
                    return [self._clean(s) for s in out], 0
                self._note(
                    f"batch call returned {self._describe(out, len(inputs))}; scoring samples one by one"
                )
            except Exception as e:  # the batch failed: find which samples did
                self._note(f"batch call raised {type(e).__name__}: {e}; scoring samples one by one")
            return self._each(lambda x: self._first(self.fn([x])), inputs)
        return self._each(self.fn, inputs)

    def _each(self, call: Callable, inputs: list[dict]) -> tuple[list[Score], int]:
        scores, errors = [], 0
        for x in inputs:
            try:
                s = call(x)
                if not self._valid(s):
                    raise ValueError(f"returned {self._describe(s, 1)}")
                scores.append(self._clean(s))
            except Exception as e:
                self._note(f"{type(e).__name__}: {e}")
                scores.append({"overall": 0.0})
                errors += 1
        return scores, errors

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
        return math.isfinite(float(v))
    except (TypeError, ValueError):
        return False
