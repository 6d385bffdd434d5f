"""`logs`, `jobs`, `status` and `stop`: what the jobs are doing, and stopping them."""

from __future__ import annotations

import time
from typing import Annotated

import typer
from rich.table import Table
from rich.text import Text

from r1cloud.checkpoint.store import job_checkpoint_root, list_checkpoints
from r1cloud.cli.common import app, cloud_logs, err, fail, find_job, not_nan, out, refreshed, report_end, when
from r1cloud.core.budget import usd
from r1cloud.core.jobstore import ACTIVE, JobStore
from r1cloud.core.records import finite, whole
from r1cloud.jobs import curves as p
from r1cloud.jobs import follow as f
from r1cloud.jobs import local
from r1cloud.jobs.cloud import CloudError, cancel
from r1cloud.spec import load_resolved

JobArg = Annotated[str | None, typer.Argument(help="Job name (default: the most recent job).")]


@app.command()
def logs(
    job: JobArg = None,
    follow_: Annotated[
        bool,
        typer.Option("--follow", "-f", help="Keep printing until the job ends; exit with its exit code."),
    ] = False,
    tail: Annotated[
        int, typer.Option("--tail", "-n", min=0, max=10_000_000, help="Lines from the end to print first.")
    ] = 200,
) -> None:
    """Print a job's log (the trainer's or the server's output)."""
    store, record = find_job(job)
    if job is None:  # on stderr: the log itself stays what stdout carries
        err.print(f"job {record.name} (the latest; r1cloud logs NAME for another)", markup=False, style="dim")
    if record.remote:
        raise typer.Exit(cloud_logs(record, follow_))
    log = store.path(record.name) / record.log.name
    for line in f.tail_lines(log, tail):
        print(line)
    if not follow_:
        return
    size = log.stat().st_size if log.exists() else 0
    try:
        record = f.follow(store, record.name, lambda line: print(line, flush=True), start=size)
    except KeyboardInterrupt:
        raise typer.Exit(130) from None
    raise typer.Exit(report_end(record))


def _duration(job) -> str:
    if not job.started_at:
        return "—"
    seconds = int((job.ended_at or time.time()) - job.started_at)
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s"


def _spend(job, m: dict, total: int | None) -> tuple[float, float | None] | None:
    """Dollars spent so far at the job's hourly price, and the projected total while it runs (the
    last step's time for each step left); None without a price."""
    if not job.price or not job.started_at:
        return None
    running = job.status in ("PENDING", "RUNNING")
    spent = job.spent_by(time.time()) if running else job.spent  # each attempt is settled as it ends
    if not running:
        return spent, spent
    left = (total or 0) - (whole(m.get("step")) or 0)
    step_s = finite(m.get("timing_s/step"))
    return spent, spent + job.price * left * step_s / 3600 if total and step_s else None


def _dollars(job, m: dict, total: int | None) -> str:
    found = _spend(job, m, total)
    if found is None:
        return "—"
    spent, projected = found
    return usd(spent) + (f" of ~{usd(projected)}" if projected is not None and projected != spent else "")


STATUS_STYLE = {
    "RUNNING": "cyan",
    "PENDING": "cyan",
    "SUCCEEDED": "green",
    "FAILED": "red",
    "STOPPED": "yellow",
    "ENDED": "yellow",
    "BUDGET_REACHED": "yellow",
    "DAMAGED": "bold red",
}


@app.command()
def jobs() -> None:
    """List jobs: status, progress, last reward."""
    store = JobStore()
    jobs = refreshed(store, store.list())
    if not jobs:
        out.print("no jobs yet — start one with: r1cloud train blueprints/quickstart.yaml")
        return
    table = Table(box=None, header_style="bold")
    servers, priced = any(j.kind == "serve" for j in jobs), any(j.price for j in jobs)
    cols = ("NAME", "INFRA", "ACCELERATORS", "STATUS", "STEP", "REWARD", "STARTED", "DURATION")
    for col in (*cols, *["COST"] * priced, *["URL"] * servers):
        table.add_column(col, no_wrap=True)
    for j in jobs:
        m = f.last_train_metrics(j.dir) or {}
        total = f.planned_steps(j.dir)
        step = f"{m.get('step', 0)}/{total}" if total else str(m.get("step", "—"))
        reward = f"{m['reward/overall']:.3f}" if "reward/overall" in m else "—"
        url = ([j.url if j.status in ("PENDING", "RUNNING") and j.url else "—"]) if servers else []
        table.add_row(
            j.name,
            j.infra,
            j.accelerators,
            f"[{STATUS_STYLE.get(j.status, '')}]{j.status}[/]",
            step,
            reward,
            when(j.started_at),
            _duration(j),
            *[_dollars(j, m, total)] * priced,
            *url,
        )
    out.print(table)
    for j in jobs:
        if j.status == "DAMAGED":
            err.print(f"{j.name}: {j.reason}; its files are in {j.dir}", style="red", markup=False)


@app.command()
def status(
    job: Annotated[str | None, typer.Argument(help="A job name; without one, the jobs table.")] = None,
) -> None:
    """One job in detail (or, with no name, the jobs table)."""
    if job is None:
        jobs()
        return
    store, record = find_job(job)
    record = refreshed(store, [record])[0]
    run = store.path(record.name)
    out.print(
        f"{record.name}  [{STATUS_STYLE.get(record.status, '')}]{record.status}[/]  {_duration(record)}  (started {when(record.started_at)})"
    )
    if record.reason:
        out.print(f"reason     {record.reason}", markup=False)
    if record.kind == "serve":
        out.print(f"url        {record.url}", markup=False)
        out.print(f"model      {record.model}", markup=False)
        out.print(f"engine     {record.accelerators}", markup=False)
    if (run / "spec.yaml").exists():
        from r1cloud.validate import summarize  # loads the schema (pydantic): not at start-up

        try:
            summary = summarize(load_resolved(run / "spec.yaml"))
        except Exception as e:  # a damaged spec.yaml: said, and the rest of the status still shown
            said = " ".join(str(e).split())[:120]
            summary = [("spec", f"{run / 'spec.yaml'} cannot be read ({type(e).__name__}: {said})")]
        for label, value in summary:
            out.print(f"{label:10} {value}", markup=False)
    m = f.last_train_metrics(run)
    total = f.planned_steps(run)
    if m:
        keys = (
            "reward/overall",
            "response_length/mean",
            "actor/pg_loss",
            "actor/grad_norm",
            "perf/throughput",
            "timing_s/step",
        )
        out.print(
            f"step       {m['step']}/{total or '?'}  " + "  ".join(f"{k}={m[k]:.4g}" for k in keys if k in m),
            markup=False,
        )
        out.print(f"trend      {_trend(run)}  (r1cloud plot {record.name})", markup=False)
    if (spend := _spend(record, m or {}, total)) is not None:
        ahead = f", about {usd(spend[1])} in all" if spend[1] is not None and spend[1] != spend[0] else ""
        out.print(f"cost       {usd(spend[0])} spent{ahead}, at {usd(record.price)}/hour", markup=False)
    root = job_checkpoint_root(run)  # honours save_checkpoint_path (a cloud job's bucket)
    try:
        ckpts = list_checkpoints(root, record.name)
    except Exception as e:  # a bucket without credentials or network: say so, show the rest
        out.print(f"checkpoints cannot read {root}: {type(e).__name__}: {e}", markup=False)
        ckpts = []
    if ckpts:
        out.print("checkpoints " + ", ".join(str(c.step) for c in ckpts), markup=False)
    out.print(f"run folder {run}", markup=False)
    lines = f.tail_lines(run / record.log.name, 10)
    if lines:
        out.print("log tail:", style="bold")
        for line in lines:  # Ray colours its workers' lines: colours on a terminal, stripped elsewhere
            out.print(Text.from_ansi("  " + line))


def _trend(run) -> str:
    """The reward's shape over the run in one line, and the validation reward's first and last."""
    try:
        rows = p.read_rows(str(run))
    except (p.PlotError, OSError):
        return "—"
    _, reward = p.series(rows, "reward/overall")
    text = f"reward {reward[0]:.3f} {p.sparkline(reward)} {reward[-1]:.3f}" if reward else "—"
    _, val = p.series(rows, "val/reward_score")
    if val:
        text += f" · val {val[0]:.3f} → {val[-1]:.3f}"
    return text


@app.command()
def stop(
    job: JobArg = None,
    grace: Annotated[
        float,
        typer.Option(
            "--grace",
            min=0.0,
            max=3600.0,
            callback=not_nan,
            help="Seconds the trainer gets to save a checkpoint and exit.",
        ),
    ] = 180.0,
) -> None:
    """Stop a job cleanly: the trainer finishes its step and saves a checkpoint first."""
    store, record = find_job(job)
    if record.status not in ACTIVE:
        out.print(f"{record.name} is not running ({record.status})", markup=False)
        return
    if record.launching:  # SkyPilot has not answered yet: nothing to cancel (or, on a resume, the old launch)
        fail(f"error: {record.name} is being launched", ["stop it once `r1cloud jobs` shows it started"])
    serving = record.kind == "serve"
    if record.remote:
        try:
            how = cancel(record.cloud)
        except CloudError as e:
            fail(f"error: {e}", e.hints)
        with store.locked(record.name) as j:
            j.status, j.stop_requested = "STOPPED", True
            j.settle(time.time())
        kept = "" if serving else f"; its checkpoints stay in the bucket: r1cloud checkpoints {record.name}"
        out.print(f"{record.name} STOPPED ({how}){kept}", markup=False)
        return
    saving = "" if serving else f" (saving a checkpoint first; up to {grace:.0f}s)"
    out.print(f"stopping {record.name}{saving}…", markup=False)
    how = local.stop(store, record.name, grace)
    record = store.get(record.name)
    then = "" if serving else f"; continue with: r1cloud train --resume {record.name}"
    out.print(f"{record.name} {record.status} ({how}){then}", markup=False)
