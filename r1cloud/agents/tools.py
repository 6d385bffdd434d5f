"""Tools and environments as users write them for TRL and gym, read without running the trainer.

Tools: plain Python functions with type hints and a Google-style docstring, in a file of their
own. `file.py` offers every public function defined there, `file.py:add,mul` those named (the
spec splits it into `tools` and `tool_names`). The schema each tool shows the model is
transformers' own (`get_json_schema`, the one TRL and the chat templates use), not one of ours.

Environments (`file.py:Class`), one object per episode, in one of two shapes:
- TRL's `environment_factory` class (trl 1.16 grpo_trainer.py): `reset(**row) -> str | None`
  (a text is appended to the prompt's last message), every other public method is a tool, and an
  optional `get_reward() -> float` is read once the episode ends;
- gym-shaped: `reset(**row) -> str | None` the same way, then `step(action: str) -> (observation,
  reward, done)` on each of the model's turns (its whole text is the action); the episode's
  reward is the sum of its steps' rewards. A class that defines `step` is read as this shape.

They run in the sandbox's processes (sandbox.py); `check` reads them in a child process.
"""

from __future__ import annotations

import functools
import inspect
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from r1cloud.rewards.pool import load_module

ENV = "worker.rollout.multi_turn.environment"
TOOLS = "worker.rollout.multi_turn.tools"
NOT_TOOLS = {"reset", "get_reward"}  # TRL's: every other public method of the class is a tool


def load(path: str, names: list[str] | None = None, described: bool = True) -> dict[str, Callable]:
    """The tools of the file `path` (those in `names`, or every public function), by name.
    ValueError of one line for a file, a name or (`described`) a function the schema helper
    cannot describe (the sandbox skips that check: `check` made it, and transformers' import)."""
    if not Path(path).is_file():
        raise ValueError(f"{TOOLS}: {path} is not a file")
    module = load_module(path)
    if names is None:
        names = [
            n
            for n, f in vars(module).items()
            if inspect.isfunction(f) and not n.startswith("_") and f.__module__ == module.__name__
        ]
        if not names:
            raise ValueError(f"{TOOLS}: {path} defines no public function")
    tools = {}
    for name in names:
        fn = getattr(module, name, None)
        if not callable(fn):
            raise ValueError(f"{TOOLS}: {path} has no function {name!r}")
        if described:
            schema(fn, path)  # describable, or an error now
        tools[name] = fn
    return tools


def schema(fn: Callable, where: str = "", at: str = TOOLS) -> dict:
    """The OpenAI function schema of `fn`, from its signature and docstring (transformers)."""
    from transformers.utils import get_json_schema

    try:
        return get_json_schema(fn)
    except Exception as e:  # transformers' TypeHintParsingException / DocstringParsingException
        raise ValueError(
            f"{at}: {where}: {fn.__qualname__} cannot be shown to the model ({e}); "
            "give every argument a type hint and describe it under Args: in the docstring"
        ) from None


def environment_class(where: str) -> type:
    """The class of `file.py:Class`; ValueError of one line if it is not an environment."""
    path, _, name = where.rpartition(":")
    if not Path(path).is_file():
        raise ValueError(f"{ENV}: {path} is not a file")
    cls = getattr(load_module(path), name, None)
    if not inspect.isclass(cls):
        raise ValueError(f"{ENV}: {path} has no class {name!r}")
    if not callable(getattr(cls, "reset", None)):
        raise ValueError(f"{ENV}: {name} has no reset(**row) method (TRL's and gym's environments have one)")
    return cls


def is_gym(cls: type) -> bool:
    return callable(getattr(cls, "step", None))


def environment_tools(cls: type) -> list[str]:
    """A TRL environment's tools: its public methods but reset and get_reward (none for gym's)."""
    if is_gym(cls):
        return []
    return [
        n
        for n, _ in inspect.getmembers(cls, inspect.isfunction)
        if not n.startswith("_") and n not in NOT_TOOLS
    ]


def describe(env: str | None, tools: str | None, names: list[str] | None) -> dict:
    """What the model is shown and what rewards an episode: {"tools": schemas, "shape": "trl" |
    "gym" | None, "reward": whether the environment gives one}. Makes one environment object, as
    TRL does to probe its factory."""
    out = {"tools": [schema(f, tools) for f in (load(tools, names) if tools else {}).values()], "shape": None}
    if env:
        cls = environment_class(env)
        try:
            probe = cls()
        except Exception as e:
            raise ValueError(f"{ENV}: {env}() failed: {type(e).__name__}: {e}") from None
        out["tools"] += [
            schema(getattr(probe, n), env.rpartition(":")[0], ENV) for n in environment_tools(cls)
        ]
        out["shape"] = "gym" if is_gym(cls) else "trl"
        out["reward"] = is_gym(cls) or callable(getattr(cls, "get_reward", None))
    return out


def check(env: str | None, tools: str | None, names: list[str] | None) -> dict:
    """`describe`, read by importing the files in a child process (a file from elsewhere never
    runs in the CLI's), once per process; ValueError of one line for anything wrong."""
    files = [p for p in (env and env.rpartition(":")[0], tools) if p]
    stamps = tuple(Path(p).stat().st_mtime_ns for p in files)
    return json.loads(_check(env, tools, tuple(names) if names is not None else None, stamps))


@functools.lru_cache(maxsize=8)
def _check(env: str | None, tools: str | None, names: tuple[str, ...] | None, _stamps: tuple) -> str:
    code = (
        "import json, sys; from r1cloud.agents.tools import describe\n"
        "try:\n    print(json.dumps(describe(*json.loads(sys.argv[1]))))\n"
        "except ValueError as e:\n    print(e, file=sys.stderr); sys.exit(2)\n"
    )
    what = f"{ENV}: {env}" if env else f"{TOOLS}: {tools}"
    try:
        r = subprocess.run(
            [sys.executable, "-c", code, json.dumps([env, tools, list(names) if names else None])],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except subprocess.TimeoutExpired:
        raise ValueError(f"{what}: importing it took over 60 s") from None
    if r.returncode == 0:
        return r.stdout.strip().splitlines()[-1]
    last = (r.stderr.strip().splitlines() or ["(no output)"])[-1]
    if r.returncode == 2:
        raise ValueError(last)
    raise ValueError(f"{what}: importing it failed: {last}")


def tool_schemas(mt) -> list[dict] | None:
    """The tools a multi-turn section (worker.rollout.multi_turn) offers, as the prompt shows them
    (None without multi-turn)."""
    return check(mt.environment, mt.tools, mt.tool_names)["tools"] or None if mt.enable else None
