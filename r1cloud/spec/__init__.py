"""The job spec: the one contract between the CLI, the backends and the trainer."""

from __future__ import annotations

from pathlib import Path

import yaml

from .checks import missing_secrets
from .load import Loaded, parse_override
from .models import Spec, normalise_name
from .problems import Problem, SpecError
from .read import load_spec
from .summary import summarize, total_steps

__all__ = [
    "Loaded",
    "Problem",
    "Spec",
    "SpecError",
    "dump_spec",
    "load_resolved",
    "load_spec",
    "missing_secrets",
    "normalise_name",
    "parse_override",
    "summarize",
    "total_steps",
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
    return Spec.model_validate(tree)
