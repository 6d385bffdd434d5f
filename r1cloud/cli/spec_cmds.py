"""`validate` and `try`: check a blueprint, and try its data and reward, before anything runs."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from r1cloud.agents.play import play
from r1cloud.cli.common import (
    AccelsOption,
    GpuOption,
    SecretOption,
    accelerator_overrides,
    app,
    budget_price,
    err,
    fail,
    load_blueprint,
    out,
    parse_secrets,
)
from r1cloud.core.jobstore import home
from r1cloud.costs.estimate import hours
from r1cloud.costs.plan import plan

OverridesArg = Annotated[list[str] | None, typer.Argument(help="key.path=value overrides, as for validate.")]


@app.command()
def validate(
    blueprint: Annotated[
        Path,
        typer.Argument(
            help="Blueprint YAML, or an EasyR1 launch script (.sh); EasyR1's config.yaml works as it is."
        ),
    ],
    overrides: Annotated[
        list[str] | None,
        typer.Argument(
            help="EasyR1-style overrides: key.path=value (YAML-typed), e.g. worker.rollout.n=8 "
            "trainer.logger=['console','file'] worker.rollout.val_override_config='{\"n\":4}'. "
            "config=base.yaml is a base the blueprint is merged onto."
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the fully resolved spec as JSON.")] = False,
    secret: SecretOption = None,
    accels: AccelsOption = None,
    gpu: GpuOption = None,
    cost: Annotated[
        bool,
        typer.Option(
            "--cost/--no-cost",
            help="Estimate each step's time, the run's, and its dollars on the blueprint's accelerators "
            "and the alternatives (prices from SkyPilot's catalog), cheapest first.",
        ),
    ] = True,
) -> None:
    """Check a blueprint without running anything: unknown keys, types, ranges, batch arithmetic,
    files, secrets. Every problem is listed at once; exit code 2 when there is any. Then what the
    run will take: time per step and in all, and dollars where SkyPilot's catalog has prices."""
    overrides = list(overrides or []) + accelerator_overrides(blueprint, overrides or [], accels, gpu)
    spec = load_blueprint(blueprint, overrides, parse_secrets(secret or []), str(blueprint))
    budget_price(spec)
    if as_json:
        print(json.dumps(spec.model_dump(mode="json"), indent=2))
        return
    from r1cloud.validate import summarize  # loads the schema (pydantic): not at start-up

    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column(style="bold cyan", no_wrap=True)
    table.add_column(overflow="fold")
    for label, value in summarize(spec):
        table.add_row(label, value)
    out.print(table)
    if cost:
        print_estimate(spec, out)
    out.print(f"✓ {blueprint} is valid", style="green", markup=False)


def print_estimate(spec, console) -> None:
    """The cost table (costs.plan): one row per accelerator and offer, cheapest first."""
    try:
        e = plan(spec, home())
    except Exception as ex:  # noqa: BLE001 - an estimate never fails validate
        console.print(f"  no estimate: {type(ex).__name__}: {ex}", style="dim", markup=False)
        return
    if e.rows:
        table = Table(box=None, pad_edge=False, header_style="bold")
        priced = any(r.dollars_per_hour is not None for r in e.rows)
        total = any(r.total_s is not None for r in e.rows)
        columns = ["estimate", "a step"] + ["in all"] * total + ["$/hour"] * priced
        columns += (["$ in all"] if total else ["$ a step"]) * priced
        for c in columns:
            table.add_column(c, justify="left" if c == "estimate" else "right")
        for r in e.rows:
            cells = [r.where, hours(r.step_s)] + [hours(r.total_s) if r.total_s else "?"] * total
            if priced:
                rate = r.dollars_per_hour
                cells.append(f"{rate:.2f}" if rate is not None else "")
                spend = r.dollars if total else (rate * r.step_s / 3600 if rate is not None else None)
                cells.append(f"{spend:,.2f}" if spend is not None else "")
            table.add_row(*cells)
        console.print(table)
    for note in e.notes:
        console.print(f"  {note}", style="dim", markup=False, highlight=False)


@app.command("try")
def try_(
    blueprint: Annotated[Path, typer.Argument(help="Blueprint YAML.")],
    overrides: OverridesArg = None,
    n: Annotated[int, typer.Option("--n", min=1, max=10_000, help="How many training prompts to try.")] = 20,
    episodes: Annotated[
        int | None,
        typer.Option(
            "--episodes",
            min=0,
            max=1000,
            help="Multi-turn runs: play this many episodes with the base model (transformers, here) and "
            "print their transcripts, counts and reward; 0 to skip.  [default: 2 for a multi-turn run]",
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the rows and summary as JSON.")] = False,
) -> None:
    """Pre-flight: render prompts from the data through the format prompt and chat template, and
    score the dataset's own answers (and corrupted ones) with the reward function — a table with
    token lengths, before any GPU is rented. A multi-turn run also plays a few episodes with the
    base model: its tool calls, the observations, the reward."""
    spec = load_blueprint(blueprint, list(overrides or []), {}, str(blueprint))
    multi = spec.worker.rollout.multi_turn.enable
    if episodes and not multi:
        fail(
            "error: --episodes is for multi-turn runs",
            ["set worker.rollout.multi_turn.enable: true, or drop it"],
        )
    playing = (2 if episodes is None else episodes) if multi else 0
    scoring = bool(spec.worker.reward.reward_function)
    if not spec.data.train_files or not (scoring or playing):
        fail(
            "error: nothing to try",
            ["the blueprint needs data.train_files and worker.reward.reward_function (or an environment)"],
        )
    played = _play(spec, playing) if playing else []
    if scoring:
        _score(spec, n, as_json, played)
    elif as_json:
        out.print_json(data={"episodes": played})
    if played and not as_json:
        _transcripts(played)


def _play(spec, k: int) -> list[dict]:
    try:
        with err.status("preparing…") as status:
            return play(spec, k, lambda msg: status.update(msg + "…"))
    except (ValueError, OSError) as e:
        fail(f"error: {str(e).splitlines()[0]}", ["`r1cloud validate` checks the rest of the blueprint"])


def _transcripts(played: list[dict]) -> None:
    for i, e in enumerate(played):
        out.print(f"\nepisode {i}: the prompt's end, then every turn (as the model sees them)", style="bold")
        out.print("…" + e["prompt"][-300:] + e["transcript"], markup=False, highlight=False)
        s = e["stats"]
        scores = ", ".join(f"{k} {v:.3f}" for k, v in sorted(e["scores"].items()))
        ending = "" if e["finished"] else ", cut at the response budget"
        out.print(
            f"turns {s['turns']:g}, tool calls {s['tool_calls']:g} ({s['tool_errors']:g} failed){ending}; "
            f"reward: {scores}",
            style="cyan",
            markup=False,
        )


def _score(spec, n: int, as_json: bool, played: list[dict]) -> None:
    from r1cloud.validate import preflight  # loads the schema (pydantic): not at start-up

    try:
        with err.status("preparing…") as status:
            rows, summary = preflight.run(spec, n, lambda msg: status.update(msg + "…"))
    except ValueError as e:
        fail(f"error: {e}", ["`r1cloud validate` checks the rest of the blueprint"])
    if summary["errors"] and summary["errors"] >= summary["samples"]:
        fail(
            f"error: the reward function failed on every sample ({summary['errors']})",
            [
                *summary["reasons"][:3],
                "fix the function: `r1cloud validate` checks its signature, this its results",
            ],
        )
    if as_json:
        out.print_json(data={"rows": [asdict(r) for r in rows], "summary": summary, "episodes": played})
        return
    out.print("the first prompt, as the model sees it (format prompt + chat template):", style="bold")
    out.print(summary["first_prompt"], markup=False, highlight=False)
    table = Table(box=None, header_style="bold")
    with_images = any(r.images for r in rows)
    cols = ("#", "PROMPT TOKENS", *(("IMAGES", "IMAGE TOKENS") if with_images else ()), "PROMPT")
    for col in (*cols, "ANSWER", "OWN ANSWER", "CORRUPTED"):
        table.add_column(
            col, no_wrap=col != "PROMPT", overflow="ellipsis", max_width=60 if col == "PROMPT" else 24
        )
    limit = spec.data.max_prompt_length
    for i, r in enumerate(rows):
        tokens = f"[red]{r.prompt_tokens}[/]" if r.prompt_tokens > limit else str(r.prompt_tokens)
        table.add_row(
            str(i),
            tokens,
            *((str(r.images), str(r.image_tokens)) if with_images else ()),
            r.content.replace("\n", " "),
            r.answer,
            f"{r.own:.3f}",
            f"{r.corrupted:.3f}",
        )
    out.print(table)
    s = summary
    out.print(
        f"answers written as {s['shape']!r} score {s['own_mean']:.3f} on average; corrupted answers "
        f"{s['corrupted_mean']:.3f}",
        markup=False,
    )
    out.print(f"prompt tokens: {s['overlong']} of {len(rows)} over max_prompt_length {limit}", markup=False)
    problems = []
    if s["own_mean"] <= s["corrupted_mean"]:
        problems.append(
            "the reward does not score the right answers above wrong ones: check answer_key and the reward function"
        )
    elif s["own_mean"] < 0.5 * max(1e-9, max(r.own for r in rows)):
        problems.append("many of the dataset's own answers score low: check answer_key and the answer format")
    if s["overlong"]:
        what = "dropped" if spec.data.filter_overlong_prompts else "truncated (an image prompt: refused)"
        problems.append(f"{s['overlong']} prompt(s) exceed max_prompt_length and would be {what}")
    if s["errors"]:
        problems.append(
            f"the reward function failed on {s['errors']} sample(s): {'; '.join(s['reasons'][:3])}"
        )
    for line in problems:
        err.print(f"warning: {line}", style="yellow", markup=False)
    if not problems:
        out.print("✓ the reward tells the dataset's answers from corrupted ones", style="green")
