"""The `r1cloud` command line: parse, call one function, render. Heavy libraries (torch, ray,
transformers, vllm, sky) are imported only inside the commands that need them."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from . import __version__

app = typer.Typer(
    name="r1cloud",
    help=(
        "R1-style reinforcement learning (GRPO, DAPO, RLOO, PPO, …) of language and vision-language "
        "models with one command, on this machine or on GPU clusters.\n\n"
        "A blueprint is a YAML job spec: EasyR1's config tree (data, algorithm, worker, trainer) plus "
        "name, resources, envs and secrets. An EasyR1 config.yaml is a valid blueprint as it is.\n\n"
        "Start with:  r1cloud validate blueprints/quickstart.yaml"
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)
out = Console(soft_wrap=True, highlight=False)
err = Console(stderr=True, soft_wrap=True, highlight=False)

EXIT_BAD_INPUT = 2


def _version(value: bool) -> None:
    if value:
        print(f"r1cloud {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    pass


def _fail(title: str, lines: list[str], warnings: list[str] = ()) -> None:
    for w in warnings:
        err.print(f"warning: {w}", style="yellow", markup=False)
    err.print(title, style="bold red", markup=False)
    for line in lines:
        err.print(f"  ✗ {line}", markup=False)
    raise typer.Exit(EXIT_BAD_INPUT)


def _parse_secrets(values: list[str]) -> dict[str, str]:
    """`--secret NAME` takes the value from the environment; `--secret NAME=VALUE` from the flag."""
    secrets, problems = {}, []
    for item in values:
        name, sep, value = item.partition("=")
        if not name.isidentifier():
            problems.append(f"--secret {item.split('=')[0]!r}: not an environment variable name")
        elif sep:
            secrets[name] = value
        elif os.environ.get(name):
            secrets[name] = os.environ[name]
        else:
            problems.append(
                f"--secret {name}: {name} is not set in the environment; export it or pass --secret {name}=VALUE"
            )
    if problems:
        _fail("error: bad --secret", problems)
    return secrets


@app.command()
def validate(
    blueprint: Annotated[
        Path,
        typer.Argument(help="Blueprint YAML (an EasyR1 config.yaml works as it is).", show_default=False),
    ],
    overrides: Annotated[
        list[str] | None,
        typer.Argument(
            help="EasyR1-style overrides: key.path=value (YAML-typed), e.g. worker.rollout.n=8 "
            "trainer.logger=['console','file'] worker.rollout.val_override_config='{\"n\":4}'. "
            "config=base.yaml is a base the blueprint is merged onto.",
            show_default=False,
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the fully resolved spec as JSON.")] = False,
    secret: Annotated[
        list[str] | None,
        typer.Option(
            "--secret",
            help="NAME (value from the environment) or NAME=VALUE; repeatable. Checked, never stored.",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Check a blueprint without running anything: unknown keys, types, ranges, batch arithmetic,
    files, secrets. Every problem is listed at once; exit code 2 when there is any."""
    from .spec import SpecError, load_spec, summarize

    try:
        loaded = load_spec(blueprint, overrides or [], secrets=_parse_secrets(secret or []))
    except SpecError as e:
        n = len(e.problems)
        _fail(
            f"error: {blueprint} has {n} problem{'s' if n != 1 else ''}:",
            [p.render() for p in e.problems],
            [w.render() for w in e.warnings],
        )
    spec = loaded.spec
    for w in loaded.warnings:
        err.print(f"warning: {w.render()}", style="yellow", markup=False)
    if as_json:
        print(json.dumps(spec.model_dump(mode="json"), indent=2))
        return
    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column(style="bold cyan", no_wrap=True)
    table.add_column(overflow="fold")
    for label, value in summarize(spec):
        table.add_row(label, value)
    out.print(table)
    out.print(f"✓ {blueprint} is valid", style="green", markup=False)


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        err.print("interrupted", style="yellow")
        sys.exit(130)
    except Exception as e:  # a bug, not bad input: one line, the traceback on request
        if os.environ.get("R1CLOUD_DEBUG"):
            raise
        err.print(f"internal error: {type(e).__name__}: {e}", style="bold red", markup=False)
        err.print(
            "this is a bug in r1cloud; rerun with R1CLOUD_DEBUG=1 for the traceback and report it",
            markup=False,
        )
        sys.exit(1)


if __name__ == "__main__":
    main()
