"""The job spec: the one contract between the CLI, the backends and the trainer — its schema
(models), overrides and key paths (load), the table of what becomes of each key (keys). Reading a
blueprint with every check is the app layer's: r1cloud.validate.load_spec.

The schema loads pydantic (~0.2 s): it is imported when first asked for, so a command that only
names SpecError or writes a spec (`r1cloud --help`, `jobs`, `checkpoints`) starts without it."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from r1cloud.spec.problems import Problem, SpecError

if TYPE_CHECKING:
    from r1cloud.spec.load import Loaded, parse_override
    from r1cloud.spec.models import Spec, normalise_name

__all__ = [
    "Loaded",
    "Problem",
    "Spec",
    "SpecError",
    "dump_spec",
    "load_resolved",
    "normalise_name",
    "parse_override",
]


def dump_spec(spec: Spec) -> str:
    """The resolved spec as YAML: what the trainer reads from the run directory."""
    return yaml.safe_dump(spec.model_dump(mode="json"), sort_keys=False, allow_unicode=True)


def load_resolved(path: str | Path) -> Spec:
    """Read a spec written by `dump_spec` (already resolved and checked)."""
    try:
        tree = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except RecursionError:
        raise ValueError(f"{path} is nested too deeply to be a spec") from None
    from r1cloud.spec.models import Spec  # the schema: see the module's note

    return Spec.model_validate(tree)


def __getattr__(name: str):
    """Loaded, parse_override, Spec and normalise_name, from their module on first use (PEP 562)."""
    where = {"Loaded": "load", "parse_override": "load", "Spec": "models", "normalise_name": "models"}
    if name not in where:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{where[name]}"), name)
