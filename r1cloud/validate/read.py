"""The entry point: a blueprint read (load.py), checked against the schema, its values and files
(checks.py, files.py), every problem at once."""

from __future__ import annotations

import os
import re

from r1cloud.core.paths import expand
from r1cloud.spec.load import (
    CLI,
    Loaded,
    Origins,
    apply_legacy,
    deep_merge,
    display_path,
    fill_empty_sections,
    get_path,
    origin_of,
    parse_override,
    read_yaml,
    set_path,
    sync_resources,
    validate_tree,
)
from r1cloud.spec.models import normalise_name
from r1cloud.spec.numbers import drop_path, huge_numbers
from r1cloud.spec.problems import Problem, SpecError
from r1cloud.validate.checks import check_spec
from r1cloud.validate.files import resolve_files
from r1cloud.validate.script import is_script, read_script


def load_spec(
    path: str | os.PathLike,
    overrides: list[str] | tuple[str, ...] = (),
    *,
    check_files: bool = True,
    secrets: dict[str, str] | None = None,
) -> Loaded:
    """Read, merge, validate and check a blueprint (YAML, or an EasyR1 launch script: validate/script.py).
    Raises SpecError with every problem found.

    With `secrets` (the values given at launch), secrets the spec names but neither they nor the
    environment supply are problems too."""
    source = expand(path)
    problems: list[Problem] = []
    warnings: list[Problem] = []
    layers: list[tuple[dict, Origins]] = []
    cli_tree: dict = {}
    cli_origins: Origins = {}
    base: str | None = None
    words = [(text, CLI) for text in overrides]
    if is_script(source):  # its command line's words come before this one's
        script = read_script(source, display_path(source))
        words = script.overrides + words
        warnings += script.skipped
        for name, (value, where) in script.envs.items():
            set_path(cli_tree, ("envs", name), value)
            cli_origins[("envs", name)] = where
    for text, where in words:
        try:
            key, value = parse_override(text)
        except ValueError as e:
            problems.append(Problem("", str(e), where))
            continue
        if key == ("config",):
            if not value:
                problems.append(
                    Problem("", "config= is empty: give the base, config=path/to/config.yaml", where)
                )
            base = str(value) if value else None
            continue
        set_path(cli_tree, key, value)
        cli_origins[key] = where
    files = [] if base is None else [expand(base)]  # the base first, then the blueprint
    for file in files + [source] * (not is_script(source)):
        data, origins, probs = read_yaml(file)
        problems += probs
        layers.append((data, origins))
    layers.append((cli_tree, cli_origins))

    raw: dict = {}
    merged_origins: Origins = {}
    for tree, origins in layers:
        raw = deep_merge(raw, tree)
        merged_origins.update(origins)
    huge = huge_numbers(raw, lambda key: origin_of(merged_origins, key))
    for problem in huge:  # said, and dropped: no later check repeats the number
        problems.append(problem)
        drop_path(raw, tuple(problem.path.split(".")))
    if problems and not raw:
        raise SpecError(problems)
    if "name" not in raw:
        experiment = get_path(raw, ("trainer", "experiment_name"))
        named = isinstance(experiment, str) and experiment.strip()  # EasyR1 configs name their run here
        raw["name"] = normalise_name(experiment if named else source.stem)
        merged_origins[("name",)] = (
            "from trainer.experiment_name" if named else f"from the file name {source.name}"
        )

    fill_empty_sections(raw)
    warnings += apply_legacy(raw, merged_origins)
    problems += sync_resources(raw, merged_origins)
    spec, schema_problems, bad = validate_tree(raw, merged_origins)
    problems += schema_problems
    if spec is not None:
        later = check_spec(spec, merged_origins)
        if secrets is not None:  # the names neither `--secret` nor the environment supplies
            later += [
                Problem(
                    f"secrets.{m}",
                    f"is not set: export {m}=… or pass --secret {m}=VALUE",
                    merged_origins.get(("secrets",)),
                )
                for m in spec.secrets
                if m not in secrets and not os.environ.get(m)
            ]
        if check_files:
            later = resolve_files(spec, merged_origins, source) + later
        bad_paths = {".".join(k) for k in bad}
        for p in later:
            if not _touches(p, bad_paths):
                (warnings if p.warning else problems).append(p)
    if problems or spec is None:
        raise SpecError(sorted(problems, key=_reading_order), warnings)
    return Loaded(spec, warnings, merged_origins, source)


def _reading_order(problem: Problem) -> tuple:
    """File problems first, by line, as one reads the file; then the command line; then defaults."""
    if m := re.match(r"^(.*):(\d+)$", problem.origin or ""):
        return (0, m.group(1), int(m.group(2)))
    return (1 if problem.origin == CLI else 2, "", 0)


def _touches(problem: Problem, bad_paths: set[str]) -> bool:
    return any(
        path == bad or path.startswith(bad + ".") or bad.startswith(path + ".")
        for path in (problem.path, *problem.related)
        for bad in bad_paths
    )
