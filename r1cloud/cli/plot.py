"""`plot`: a run's curves in the terminal or as a PNG, several runs overlaid."""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Annotated

import typer

from r1cloud.checkpoint.store import job_checkpoint_root
from r1cloud.cli.common import app, fail, find_job, not_nan, out
from r1cloud.core.paths import expand, is_dir
from r1cloud.jobs import curves as p

DEFAULT_METRICS = "reward/overall,val/reward_score"


def metrics_source(target: str | None) -> tuple[str, str]:
    """(label, where its metrics are) for a job name (default: the latest job), a run or
    checkpoint folder, or a bucket URL."""
    if target and ("://" in target or is_dir(expand(target))):
        return target.rstrip("/"), target if "://" in target else str(expand(target))
    store, job = find_job(target)
    run = store.path(job.name)
    if (run / "metrics.jsonl").exists():
        return job.name, str(run)
    return job.name, job_checkpoint_root(run)  # a cloud job: the copy in its bucket


@app.command()
def plot(
    targets: Annotated[
        list[str] | None,
        typer.Argument(
            help="Jobs, run folders or bucket URLs (default: the most recent job); several overlay."
        ),
    ] = None,
    metric: Annotated[
        str,
        typer.Option(
            "--metric", "-m", help="Comma-separated metric names, one panel each (metrics.jsonl keys)."
        ),
    ] = DEFAULT_METRICS,
    out_file: Annotated[
        Path | None, typer.Option("--out", "-o", help="Write a PNG here instead of drawing in the terminal.")
    ] = None,
    smoothing: Annotated[
        float,
        typer.Option(
            "--smooth",
            min=0.0,
            max=0.99,
            callback=not_nan,
            help="TensorBoard-style smoothing weight, 0 (none) to 0.99.",
        ),
    ] = 0.0,
    width: Annotated[
        int, typer.Option("--width", min=30, max=1000, help="Terminal plot width in characters.")
    ] = 100,
    height: Annotated[
        int, typer.Option("--height", min=8, max=200, help="Height of each terminal panel in lines.")
    ] = 16,
) -> None:
    """Plot training curves: reward and validation reward by default; compare runs by naming several.

    \b
    r1cloud plot                                  the latest job, in the terminal
    r1cloud plot run-a run-b -m reward/overall    two runs overlaid
    r1cloud plot JOB --smooth 0.6 -o curves.png   a picture, smoothed
    r1cloud plot s3://bucket/job/checkpoints      a cloud job's curve, from its bucket
    """
    keys = [k.strip() for k in metric.split(",") if k.strip()]
    if not keys:
        fail("error: --metric is empty", ["name at least one metric, e.g. --metric reward/overall"])
    runs: dict[str, list[dict]] = {}
    for target in targets or [None]:
        label, where = metrics_source(target)
        try:
            runs[label] = p.read_rows(where)
        except p.PlotError as e:
            fail(f"error: {e}", ["a job writes metrics.jsonl after its first step: r1cloud status " + label])
        except (OSError, ValueError) as e:
            fail(
                f"error: cannot read the metrics of {label}: {e}",
                [f"check {where} (and credentials for a bucket)"],
            )
    panels: dict[str, dict[str, p.Curve]] = {}
    for key in keys:
        curves = {label: p.series(rows, key) for label, rows in runs.items()}
        curves = {label: xy for label, xy in curves.items() if xy[0]}
        if curves:
            panels[key] = curves
    missing = [k for k in keys if k not in panels]
    if not panels:
        known = sorted({k for rows in runs.values() for r in rows for k in r if k != "step"})
        close = {k: difflib.get_close_matches(k, known, n=3) for k in missing}
        fail(
            "error: no values to plot for " + ", ".join(missing),
            [
                *(f"{k}: did you mean {', '.join(c)}?" for k, c in close.items() if c),
                f"{len(known)} metrics are logged, e.g. {', '.join(known[:6])}",
            ],
        )
    if out_file is not None:
        if out_file.suffix.lower() != ".png":
            fail(f"error: --out {out_file}", ["write to a .png file"])
        try:
            p.png(panels, str(out_file), smoothing)
        except ImportError:
            fail("error: --out needs matplotlib", ["pip install matplotlib (r1cloud[train] includes it)"])
        except OSError as e:
            fail(f"error: cannot write {out_file}: {e.strerror or e}", ["pick a folder you can write to"])
        out.print(f"wrote {out_file} ({', '.join(panels)}; {', '.join(runs)})", markup=False)
    else:
        print(p.terminal(panels, width, height, color=out.is_terminal, smoothing=smoothing))
    for key in missing:
        out.print(f"(no {key} in {', '.join(runs)})", markup=False)
