"""Tools as users write them for TRL: plain Python functions with type hints and a Google-style
docstring, in a file of their own. `file.py` offers every public function defined there,
`file.py:add,mul` those named (the spec splits it into `tools` and `tool_names`). The schema each
tool shows the model is transformers' own (`get_json_schema`, the one TRL and the chat templates
use), not one of ours.

The tools run in a pool of spawned processes (pebble, as the reward functions do): a tool that
raises becomes an error observation, one that hangs is killed at `tool_timeout`, a flood is cut
to `max_tool_response_length` characters inside the tool's process; none of them ends the run.
"""

from __future__ import annotations

import functools
import inspect
import json
import multiprocessing
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path

_TOOLS: dict[str, Callable] = {}  # inside a pool process: the tools by name


def load(path: str, names: list[str] | None = None) -> dict[str, Callable]:
    """The tools of the file `path` (those in `names`, or every public function), by name.
    ValueError of one line for a file, a name or a function the schema helper cannot describe."""
    from ..rewards import load_module

    if not Path(path).is_file():
        raise ValueError(f"worker.rollout.multi_turn.tools: {path} is not a file")
    module = load_module(path)
    if names is None:
        names = [
            n
            for n, f in vars(module).items()
            if inspect.isfunction(f) and not n.startswith("_") and f.__module__ == module.__name__
        ]
        if not names:
            raise ValueError(f"worker.rollout.multi_turn.tools: {path} defines no public function")
    tools = {}
    for name in names:
        fn = getattr(module, name, None)
        if not callable(fn):
            raise ValueError(f"worker.rollout.multi_turn.tools: {path} has no function {name!r}")
        schema(fn, path)  # describable, or an error now
        tools[name] = fn
    return tools


def schema(fn: Callable, path: str = "") -> dict:
    """The OpenAI function schema of `fn`, from its signature and docstring (transformers)."""
    from transformers.utils import get_json_schema

    try:
        return get_json_schema(fn)
    except Exception as e:  # transformers' TypeHintParsingException / DocstringParsingException
        raise ValueError(
            f"worker.rollout.multi_turn.tools: {path}:{fn.__name__} cannot be shown to the model ({e}); "
            "give every argument a type hint and describe it under Args: in the docstring"
        ) from None


def _init(path: str, names: list[str] | None) -> None:
    global _TOOLS
    _TOOLS = load(path, names)


def _run(name: str, arguments: dict, limit: int) -> str:
    result = _TOOLS[name](**arguments)
    text = result if isinstance(result, str) else str(result)
    return text[:limit]


class ToolPool:
    """The tools of `path` (`names`), called in `workers` spawned processes, each call under
    `timeout` s, its output cut to `limit` characters."""

    def __init__(self, path: str, names: list[str] | None, workers: int, timeout: float, limit: int):
        import pebble

        self.names = set(load(path, names))  # here too: errors early
        self.timeout, self.limit = timeout, limit
        self.pool = pebble.ProcessPool(
            max_workers=max(1, workers),
            initializer=_init,
            initargs=(path, names),
            context=multiprocessing.get_context("spawn"),  # never fork a Ray worker
        )

    def close(self) -> None:
        self.pool.stop()
        self.pool.join()

    def call_all(self, calls: list[tuple[str, dict]]) -> list[tuple[str, bool, float]]:
        """Each (name, arguments) run at once across the pool: (observation, failed, seconds)."""
        start = time.monotonic()
        futures = [
            self.pool.schedule(_run, (name, args, self.limit), timeout=self.timeout)
            if name in self.names
            else None
            for name, args in calls
        ]
        out = []
        for (name, _), future in zip(calls, futures, strict=True):
            if future is None:
                known = ", ".join(sorted(self.names))
                out.append((f"Error: there is no tool {name!r} (the tools are {known})", True, 0.0))
                continue
            try:
                out.append((future.result(), False, time.monotonic() - start))
            except FutureTimeout:
                out.append((f"Error: {name} did not finish in {self.timeout:g} s", True, self.timeout))
            except Exception as e:  # the tool raised, or its process died: the model sees why
                message = str(e).splitlines()[0][: self.limit] if str(e) else ""
                out.append((f"Error: {type(e).__name__}: {message}", True, time.monotonic() - start))
        return out


def check(path: str, names: list[str] | None) -> list[dict]:
    """The tools' schemas, read by importing the file in a child process (a file from elsewhere
    never runs in the CLI's), once per process; ValueError of one line for anything wrong."""
    return _check(path, tuple(names) if names is not None else None, Path(path).stat().st_mtime_ns)


@functools.lru_cache(maxsize=8)
def _check(path: str, names: tuple[str, ...] | None, _mtime: int) -> list[dict]:
    code = (
        "import json, sys; from r1cloud.agents.tools import load, schema\n"
        "try:\n    print(json.dumps([schema(f) for f in load(sys.argv[1], json.loads(sys.argv[2])).values()]))\n"
        "except ValueError as e:\n    print(e, file=sys.stderr); sys.exit(2)\n"
    )
    try:
        r = subprocess.run(
            [sys.executable, "-c", code, path, json.dumps(list(names) if names else None)],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except subprocess.TimeoutExpired:
        raise ValueError(f"worker.rollout.multi_turn.tools: importing {path} took over 60 s") from None
    if r.returncode == 0:
        return json.loads(r.stdout.strip().splitlines()[-1])
    last = (r.stderr.strip().splitlines() or ["(no output)"])[-1]
    if r.returncode == 2:
        raise ValueError(last)
    raise ValueError(f"worker.rollout.multi_turn.tools: importing {path} failed: {last}")


def tool_schemas(spec) -> list[dict] | None:
    """The tools a multi-turn spec offers, as the prompt shows them (None without multi-turn)."""
    mt = spec.worker.rollout.multi_turn
    return check(mt.tools, mt.tool_names) if mt.enable else None
