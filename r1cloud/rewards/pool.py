"""Reward functions through EasyR1's interface: `file.py:function`, `REWARD_TYPE` batch or
sequential, kwargs from `worker.reward.reward_function_kwargs`, `overall` required. Each input
is `{response, response_length, ground_truth}`; a module that sets `REWARD_INPUT_KEYS = [...]`
also gets those data columns (and "prompt": the prompt column's text) — EasyR1's own functions,
which do not set it, see exactly EasyR1's three keys.

They run in a pool of `worker.reward.num_cpus` processes (spawned, each loading the module once),
each call under a time limit (`worker.reward.timeout` seconds per sample; sympy can hang). A
batch function gets the batch split across the processes; if a part fails, hangs or returns
something malformed, its samples are scored again one by one. A function that raises, hangs (its
process is killed and replaced), returns the wrong length, no `overall` or a non-finite number
costs only the samples concerned: they score 0 and are counted in `reward/errors`, each reason is
logged once, and the run goes on.
"""

from __future__ import annotations

import functools
import importlib.util
import multiprocessing
import pickle
import sys
import time
from collections.abc import Callable
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path

from r1cloud.data import no_sklearn
from r1cloud.rewards.scores import Score, ScoreChecks

_FN: Callable | None = None  # the function, inside a pool process


def load_module(path: str):
    """A user's Python file (reward function, tools), run as a module of its own."""
    spec = importlib.util.spec_from_file_location(f"r1cloud_user_{Path(path).stem}", path)
    if spec is None or spec.loader is None:
        raise ValueError(f"{path}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # pickling by reference, dataclasses inside the module
    spec.loader.exec_module(module)
    return module


def load_function(path: str, name: str, kwargs: dict | None) -> tuple[Callable, object]:
    module = load_module(path)
    fn = getattr(module, name, None)
    if not callable(fn):
        raise ValueError(f"{path} has no function {name!r}")
    return functools.partial(fn, **(kwargs or {})), module


def _init(path: str, name: str, kwargs: dict | None) -> None:
    global _FN
    no_sklearn.install()  # a spawned process: a reward model loads here
    _FN = load_function(path, name, kwargs)[0]


def _call(payload):
    try:
        return _FN(payload)
    except Exception as e:
        try:  # it travels back to the trainer pickled: one that cannot be rebuilt would break the pool
            pickle.loads(pickle.dumps(e))
        except Exception:
            raise RuntimeError(f"{type(e).__name__}: {e}") from None
        raise


class RewardDeadline(Exception):
    """The whole of a bounded scoring (`try`'s) ran past its deadline: the function is stuck."""


class RewardFunction(ScoreChecks):
    deadline: float | None = None  # time.monotonic() by which every call must be done (None: none)

    def _wait(self, future):
        """The future's result, waiting no longer than the deadline allows."""
        if self.deadline is None:
            return future.result()
        try:
            return future.result(timeout=max(0.0, self.deadline - time.monotonic()))
        except FutureTimeout:
            if time.monotonic() >= self.deadline:
                raise RewardDeadline(
                    f"the reward function did not finish in time (it is stuck, or slower than "
                    f"worker.reward.timeout, {self.timeout:g} s a sample)"
                ) from None
            raise

    def __init__(
        self,
        path: str,
        name: str = "main",
        kwargs: dict | None = None,
        reward_type: str | None = None,
        workers: int = 1,
        timeout: float = 30.0,
    ):
        import pebble

        _, module = load_function(path, name, kwargs)  # here too: metadata, and errors early
        self.name = getattr(module, "REWARD_NAME", "unknown")
        self.type = reward_type or getattr(module, "REWARD_TYPE", "batch")
        self.wants = tuple(getattr(module, "REWARD_INPUT_KEYS", ()))  # data columns, or "prompt"
        self.workers, self.timeout = max(1, workers), timeout
        self.pool = pebble.ProcessPool(
            max_workers=self.workers,
            initializer=_init,
            initargs=(path, name, kwargs),
            context=multiprocessing.get_context("spawn"),  # never fork the Ray driver
        )
        super().__init__()

    def close(self) -> None:
        self.pool.stop()
        self.pool.join()

    def __call__(self, inputs: list[dict]) -> tuple[list[Score], int]:
        """Scores for `inputs`, and how many samples errored."""
        if not inputs:
            return [], 0
        if self.type != "batch":
            return self._each(inputs, sequential=True)
        size = -(-len(inputs) // self.workers)
        parts = [inputs[i : i + size] for i in range(0, len(inputs), size)]
        limit = self.timeout * size
        futures = [self.pool.schedule(_call, (part,), timeout=limit) for part in parts]
        scores, errors = [], 0
        for part, future in zip(parts, futures, strict=True):
            try:
                out = self._wait(future)
                if isinstance(out, list) and len(out) == len(part) and all(self._valid(s) for s in out):
                    scores += [self._clean(s) for s in out]
                    continue
                self._note(
                    f"batch call returned {self._describe(out, len(part))}; scoring samples one by one"
                )
            except FutureTimeout:
                self._note(f"batch call timed out after {limit:g}s; scoring samples one by one")
            except RewardDeadline:
                raise
            except Exception as e:  # the batch failed: find which samples did
                self._note(f"batch call raised {type(e).__name__}: {e}; scoring samples one by one")
            more, n = self._each(part, sequential=False)
            scores += more
            errors += n
        return scores, errors

    def _each(self, inputs: list[dict], sequential: bool) -> tuple[list[Score], int]:
        futures = [
            self.pool.schedule(_call, (x if sequential else [x],), timeout=self.timeout) for x in inputs
        ]
        scores, errors = [], 0
        for future in futures:
            try:
                try:
                    s = self._wait(future)
                except FutureTimeout:
                    raise TimeoutError(f"timed out after {self.timeout:g}s") from None
                s = s if sequential else self._first(s)
                if not self._valid(s):
                    raise ValueError(f"returned {self._describe(s, 1)}")
                scores.append(self._clean(s))
            except RewardDeadline:
                raise
            except Exception as e:
                self._note(f"{type(e).__name__}: {e}")
                scores.append({"overall": 0.0})
                errors += 1
        return scores, errors


class EnvironmentOnly(ScoreChecks):
    """No reward function: an environment's reward is the episode's (agents/)."""

    def __call__(self, inputs: list[dict]) -> tuple[list[dict], int]:
        return [{} for _ in inputs], 0


def from_config(r, bounded: bool = False):
    """The reward `worker.reward` names: a remote URL, or a function run in the process pool. With
    `bounded` (a check before a run: `try`, `eval`), the function's calls share one deadline,
    2 × `timeout` + 10 s from now: a stuck function ends the check, not each sample's timeout.
    No function (an environment gives the reward): EnvironmentOnly."""
    if not r.reward_function:
        return EnvironmentOnly()
    if r.reward_function.startswith(("http://", "https://")):
        from r1cloud.rewards.remote import RemoteReward

        return RemoteReward(r.reward_function, r.reward_function_kwargs, timeout=r.timeout)
    reward = RewardFunction(
        r.reward_function,
        r.reward_function_name or "main",
        r.reward_function_kwargs,
        r.reward_type,
        workers=r.num_cpus,
        timeout=r.timeout,
    )
    if bounded:
        reward.deadline = time.monotonic() + 2 * r.timeout + 10
    return reward


def reward_input(
    reward: ScoreChecks, tokenizer, source, response: str, length: int, skip: bool = True
) -> dict:
    """EasyR1's input for one response to the data row `source`, plus what `reward` asks for."""
    x = {"response": response, "response_length": length, "ground_truth": source.ground_truth}
    for key in reward.wants:  # REWARD_INPUT_KEYS
        x[key] = source.content if key == "prompt" else source.extra.get(key)
    if reward.sends_prompt:
        x["prompt"] = tokenizer.decode(source.prompt_ids, skip_special_tokens=skip)
    return x
