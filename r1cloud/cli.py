"""The `r1cloud` command line: parse, call one function, render. Heavy libraries (torch, ray,
transformers, vllm, sky) are imported only inside the commands that need them."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
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
# Piped output keeps whole table rows (rich would cut them to 80 columns).
out = Console(soft_wrap=True, highlight=False, width=None if sys.stdout.isatty() else 240)
err = Console(stderr=True, soft_wrap=True, highlight=False)

EXIT_BAD_INPUT = 2
SecretOption = Annotated[
    list[str] | None,
    typer.Option(
        "--secret",
        help="NAME (value from the environment) or NAME=VALUE; repeatable. Reaches only the job's environment; never stored.",
        show_default=False,
    ),
]


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


def _load(path: Path, overrides: list[str], secrets: dict[str, str], shown: str):
    """The validated spec, its warnings printed; or every problem and exit code 2."""
    from .spec import SpecError, load_spec

    try:
        loaded = load_spec(path, overrides, secrets=secrets)
    except SpecError as e:
        n = len(e.problems)
        _fail(
            f"error: {shown} has {n} problem{'s' if n != 1 else ''}:",
            [p.render() for p in e.problems],
            [w.render() for w in e.warnings],
        )
    for w in loaded.warnings:
        err.print(f"warning: {w.render()}", style="yellow", markup=False)
    return loaded.spec


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
    secret: SecretOption = None,
) -> None:
    """Check a blueprint without running anything: unknown keys, types, ranges, batch arithmetic,
    files, secrets. Every problem is listed at once; exit code 2 when there is any."""
    from .spec import summarize

    spec = _load(blueprint, overrides or [], _parse_secrets(secret or []), str(blueprint))
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


# ---------------------------------------------------------------------------- jobs

JobArg = Annotated[
    str | None, typer.Argument(help="Job name (default: the most recent job).", show_default=False)
]


@app.command("try")
def try_(
    blueprint: Annotated[Path, typer.Argument(help="Blueprint YAML.", show_default=False)],
    overrides: Annotated[
        list[str] | None,
        typer.Argument(help="key.path=value overrides, as for validate.", show_default=False),
    ] = None,
    n: Annotated[int, typer.Option("--n", help="How many training prompts to try.")] = 20,
    as_json: Annotated[bool, typer.Option("--json", help="Print the rows and summary as JSON.")] = False,
) -> None:
    """Pre-flight: render prompts from the data through the format prompt and chat template, and
    score the dataset's own answers (and corrupted ones) with the reward function — a table with
    token lengths, before any GPU is rented."""
    from .preflight import run

    spec = _load(blueprint, list(overrides or []), {}, str(blueprint))
    if not spec.data.train_files or not spec.worker.reward.reward_function:
        _fail(
            "error: nothing to try",
            ["the blueprint needs data.train_files and worker.reward.reward_function"],
        )
    try:
        with err.status("preparing…") as status:
            rows, summary = run(spec, n, lambda msg: status.update(msg + "…"))
    except ValueError as e:
        _fail(f"error: {e}", ["`r1cloud validate` checks the rest of the blueprint"])
    if as_json:
        from dataclasses import asdict

        out.print_json(data={"rows": [asdict(r) for r in rows], "summary": summary})
        return
    out.print("the first prompt, as the model sees it (format prompt + chat template):", style="bold")
    out.print(summary["first_prompt"], markup=False, highlight=False)
    table = Table(box=None, header_style="bold")
    for col in ("#", "PROMPT TOKENS", "PROMPT", "ANSWER", "OWN ANSWER", "CORRUPTED"):
        table.add_column(
            col, no_wrap=col != "PROMPT", overflow="ellipsis", max_width=60 if col == "PROMPT" else 24
        )
    limit = spec.data.max_prompt_length
    for i, r in enumerate(rows):
        tokens = f"[red]{r.prompt_tokens}[/]" if r.prompt_tokens > limit else str(r.prompt_tokens)
        table.add_row(
            str(i), tokens, r.content.replace("\n", " "), r.answer, f"{r.own:.3f}", f"{r.corrupted:.3f}"
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
        what = "dropped" if spec.data.filter_overlong_prompts else "truncated"
        problems.append(f"{s['overlong']} prompt(s) exceed max_prompt_length and would be {what}")
    if s["errors"]:
        problems.append(
            f"the reward function failed on {s['errors']} sample(s): {'; '.join(s['reasons'][:3])}"
        )
    for line in problems:
        err.print(f"warning: {line}", style="yellow", markup=False)
    if not problems:
        out.print("✓ the reward tells the dataset's answers from corrupted ones", style="green")


def _store():
    from .jobs.store import JobStore

    return JobStore()


def _job(name: str | None):
    """The named job, or the latest; a clear error when there is none."""
    import difflib

    from .jobs.store import NoSuchJob

    store = _store()
    if name is None:
        job = store.latest()
        if job is None:
            _fail("error: no jobs yet", ["start one with: r1cloud train blueprints/quickstart.yaml"])
        return store, job
    try:
        return store, store.get(name)
    except NoSuchJob:
        names = [j.name for j in store.list()]
        close = difflib.get_close_matches(name, names, n=1)
        hint = f"did you mean {close[0]}? " if close else ""
        _fail(f"error: no job named {name!r}", [f"{hint}`r1cloud jobs` lists the jobs ({len(names)} now)"])


def _accelerator_overrides(
    blueprint: Path, overrides: list[str], accels: int | None, gpu: str | None
) -> list[str]:
    """--accels/--gpu set resources.accelerators and trainer.n_gpus_per_node together."""
    if accels is None and gpu is None:
        return []
    from .spec import SpecError, load_spec
    from .spec.models import accelerator_options

    current = None
    with contextlib.suppress(SpecError):  # reported by the real load below
        current = load_spec(blueprint, overrides, check_files=False).spec
    count = accels
    if count is None:
        count = current.trainer.n_gpus_per_node if current else 1
    out = [f"trainer.n_gpus_per_node={count}"]
    if gpu:
        out.append(f"resources.accelerators={gpu}:{count}")
    elif current is not None and current.resources.accelerators is not None:
        options = accelerator_options(current.resources.accelerators)
        out.append("resources.accelerators={" + ", ".join(f"{n}: {count}" for n, _ in options) + "}")
    return out


@app.command()
def train(
    target: Annotated[
        str, typer.Argument(help="Blueprint YAML, or with --resume the name of a job.", show_default=False)
    ],
    overrides: Annotated[
        list[str] | None,
        typer.Argument(help="key.path=value overrides, as for validate.", show_default=False),
    ] = None,
    name: Annotated[
        str | None, typer.Option("--name", help="Job name (default: the blueprint's name).")
    ] = None,
    accels: Annotated[
        int | None,
        typer.Option(
            "--accels", help="Devices per node; locally, worker slots (CPU processes or local GPUs)."
        ),
    ] = None,
    nodes: Annotated[int | None, typer.Option("--nodes", help="Number of nodes.")] = None,
    gpu: Annotated[str | None, typer.Option("--gpu", help="Accelerator type: H100, A100-80GB, …")] = None,
    infra: Annotated[
        str | None, typer.Option("--infra", help="local (default) or a SkyPilot infra: aws, gcp, k8s, …")
    ] = None,
    spot: Annotated[bool, typer.Option("--spot", help="Use spot instances (cloud).")] = False,
    env: Annotated[
        list[str] | None,
        typer.Option("--env", help="K=V environment variable for the job; repeatable.", show_default=False),
    ] = None,
    secret: SecretOption = None,
    detach: Annotated[
        bool, typer.Option("--detach", "-d", help="Start and return; follow later with r1cloud logs -f.")
    ] = False,
    resume: Annotated[
        bool, typer.Option("--resume", help="Continue a job from its last checkpoint.")
    ] = False,
    dry_run: Annotated[
        bool,
        typer.Option(
            "--dry-run",
            help="Print what would run, and run nothing; for a cloud infra, the SkyPilot task YAML "
            "(`sky launch` accepts it as it is).",
        ),
    ] = False,
    managed: Annotated[
        bool,
        typer.Option(
            "--managed/--no-managed",
            help="Cloud: a managed job that recovers from preemptions and resumes from its bucket "
            "(default), or a plain cluster that stops when idle and is torn down at the end.",
        ),
    ] = True,
    bucket: Annotated[
        str | None,
        typer.Option(
            "--bucket", help="Cloud: where checkpoints go, s3://BUCKET[/PREFIX] (resources.bucket)."
        ),
    ] = None,
) -> None:
    """Validate a blueprint, start it as a job, and follow its progress (Ctrl-C detaches; the
    job keeps running)."""
    from .jobs.store import JobExists
    from .spec import summarize

    store = _store()
    source = Path(target)
    resuming_job = resume and not source.is_file() and (store.path(target) / "spec.yaml").is_file()
    if resuming_job:
        source = store.path(target) / "spec.yaml"
    extra = list(overrides or [])
    for item in env or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            _fail("error: bad --env", [f"--env {item!r}: write KEY=VALUE"])
        extra.append(f"envs.{key}={json.dumps(value)}")
    extra += [f"name={name}"] if name else []
    extra += [f"resources.infra={infra}"] if infra else []
    extra += ["resources.use_spot=true"] if spot else []
    extra += [f"resources.bucket={bucket}"] if bucket else []
    extra += [f"resources.num_nodes={nodes}", f"trainer.nnodes={nodes}"] if nodes else []
    extra += _accelerator_overrides(source, extra, accels, gpu)
    provided = _parse_secrets(secret or [])
    spec = _load(source, extra, provided, target)
    secrets = {n: provided.get(n) or os.environ[n] for n in spec.secrets}
    secrets.update(provided)
    if spec.resources.infra != "local":
        _train_in_cloud(store, spec, secrets, source, managed, dry_run, detach)
        return
    if dry_run:
        for label, value in summarize(spec):
            out.print(f"{label:10} {value}", markup=False)
        out.print(
            f"would run  python -m r1cloud.jobs.supervise {store.path(spec.name)}  (local, detached)",
            markup=False,
        )
        if spec.envs or secrets:
            out.print(
                f"env        {', '.join([*spec.envs, *(f'{k} (secret)' for k in secrets)])}", markup=False
            )
        return
    from .jobs.local import JobRunning, submit

    try:
        job, fresh, log_start = submit(
            store, spec, secrets, resume=resume, blueprint="" if resuming_job else target
        )
    except JobExists as e:
        _fail(
            f"error: a job named {spec.name!r} already exists ({e.args[1]})",
            [
                f"pick another name with --name {spec.name}-2, or continue it with: r1cloud train --resume {spec.name}"
            ],
        )
    except JobRunning:
        _fail(f"error: {spec.name} is already running", [f"follow it with: r1cloud logs -f {spec.name}"])
    verb = "started" if fresh else "resumed"
    out.print(
        f"{verb} {job.name} · {spec.trainer.n_gpus_per_node} worker slot(s) · run folder {job.dir}",
        markup=False,
    )
    if detach:
        out.print(f"follow: r1cloud logs -f {job.name}    stop: r1cloud stop {job.name}", markup=False)
        return
    raise typer.Exit(_follow_with_progress(store, job.name, log_start))


def _train_in_cloud(store, spec, secrets: dict, blueprint: Path, managed: bool, dry_run: bool, detach: bool):
    from .jobs.cloud import CloudError
    from .jobs.sky_task import TaskError
    from .jobs.store import JobExists, home

    kind = "a managed job" if managed else "a cluster (autostop, down at the end)"
    try:
        if dry_run:
            from .jobs.remote import prepare
            from .jobs.sky_task import to_yaml

            folder = home() / "dry-run" / spec.name
            folder.mkdir(parents=True, exist_ok=True)
            config, _ = prepare(spec, blueprint, folder, managed)
            err.print(f"# {spec.name} as {kind}; the nodes read {folder / 'node-spec.yaml'}", markup=False)
            print(to_yaml(config), end="")
            return
        from .jobs.remote import submit

        err.print(f"launching {spec.name} on {spec.resources.infra} as {kind}…", markup=False)
        job = submit(store, spec, secrets, blueprint, managed)
    except (TaskError, CloudError) as e:
        _fail(f"error: {e}", getattr(e, "hints", []))
    except JobExists:
        _fail(
            f"error: a job named {spec.name!r} already exists",
            [f"pick another name with --name {spec.name}-2"],
        )
    ident = f"managed job {job.cloud['job_id']}" if managed else f"cluster {job.cloud['cluster']}"
    out.print(f"started {job.name} · {ident} · checkpoints {spec.resources.bucket}", markup=False)
    if detach:
        out.print(f"follow: r1cloud logs -f {job.name}    stop: r1cloud stop {job.name}", markup=False)
        return
    raise typer.Exit(_cloud_logs(job, follow=True))


def _cloud_logs(job, follow: bool) -> int:
    from .jobs.cloud import CloudError, tail_logs

    try:
        code = tail_logs(job.cloud, follow)
    except CloudError as e:
        _fail(f"error: {e}", e.hints)
    except KeyboardInterrupt:
        err.print(
            f"\ndetached: {job.name} keeps running.  reattach: r1cloud logs -f {job.name}", markup=False
        )
        return 0
    return int(code or 0)


def _follow_with_progress(store, name: str, log_start: int) -> int:
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    from .jobs import follow as f

    run = store.path(name)
    shown = ("step ", "[", "error", "Traceback", "warning")
    try:
        with Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[stats]}"),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=out,
            transient=False,
            disable=not out.is_terminal,
        ) as progress:
            task = progress.add_task(name, total=None, stats="starting…")

            def on_line(line: str) -> None:
                if line.startswith(shown) or not out.is_terminal and "Error" in line:
                    progress.console.print(line, markup=False, highlight=False)
                m = f.last_train_metrics(run)
                if m:
                    stats = f"reward {m.get('reward/overall', 0):.3f} · len {m.get('response_length/mean', 0):.0f} · {m.get('perf/throughput', 0):.0f} tok/s/dev"
                    progress.update(task, completed=m["step"], total=f.total_steps(run), stats=stats)

            job = f.follow(store, name, on_line, start=log_start)
    except KeyboardInterrupt:
        err.print(
            f"\ndetached: {name} keeps running.  reattach: r1cloud logs -f {name}    stop: r1cloud stop {name}",
            markup=False,
        )
        return 0
    return _report_end(job)


def _report_end(job) -> int:
    from .jobs.follow import exit_code

    style = {"SUCCEEDED": "green", "STOPPED": "yellow", "ENDED": "yellow"}.get(job.status, "bold red")
    tail = f": {job.reason}" if job.reason else ""
    (out if job.status != "FAILED" else err).print(
        f"{job.name} {job.status}{tail}", style=style, markup=False
    )
    return exit_code(job)


@app.command()
def logs(
    job: JobArg = None,
    follow_: Annotated[
        bool,
        typer.Option("--follow", "-f", help="Keep printing until the job ends; exit with its exit code."),
    ] = False,
    tail: Annotated[int, typer.Option("--tail", "-n", help="Lines from the end to print first.")] = 200,
) -> None:
    """Print a job's log (the trainer's or the server's output)."""
    from .jobs import follow as f

    store, record = _job(job)
    if record.cloud:
        raise typer.Exit(_cloud_logs(record, follow_))
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
    raise typer.Exit(_report_end(record))


def _duration(job) -> str:
    if not job.started_at:
        return "—"
    seconds = int((job.ended_at or time.time()) - job.started_at)
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s"


def _when(ts: float | None) -> str:
    import datetime

    return datetime.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M") if ts else "—"


STATUS_STYLE = {
    "RUNNING": "cyan",
    "PENDING": "cyan",
    "SUCCEEDED": "green",
    "FAILED": "red",
    "STOPPED": "yellow",
    "ENDED": "yellow",
}


def _refreshed(store, jobs: list) -> list:
    """Cloud jobs' state from SkyPilot; if it cannot be reached, the last known state and a warning."""
    if not any(j.cloud for j in jobs):
        return jobs
    from .jobs.cloud import CloudError
    from .jobs.remote import refresh

    try:
        return refresh(store, jobs)
    except CloudError as e:
        err.print(f"warning: cloud jobs show their last known state: {e}", markup=False)
        return jobs


def _jobs_table() -> None:
    from .jobs import follow as f

    store = _store()
    jobs = _refreshed(store, store.list())
    if not jobs:
        out.print("no jobs yet — start one with: r1cloud train blueprints/quickstart.yaml")
        return
    table = Table(box=None, header_style="bold")
    servers = any(j.kind == "serve" for j in jobs)
    cols = ("NAME", "INFRA", "ACCELERATORS", "STATUS", "STEP", "REWARD", "STARTED", "DURATION")
    for col in (*cols, "URL") if servers else cols:
        table.add_column(col, no_wrap=True)
    for j in jobs:
        m = f.last_train_metrics(j.dir) or {}
        total = f.total_steps(j.dir)
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
            _when(j.started_at),
            _duration(j),
            *url,
        )
    out.print(table)


@app.command()
def jobs() -> None:
    """List jobs: status, progress, last reward."""
    _jobs_table()


@app.command()
def status(
    job: Annotated[
        str | None, typer.Argument(help="A job name; without one, the jobs table.", show_default=False)
    ] = None,
) -> None:
    """One job in detail (or, with no name, the jobs table)."""
    if job is None:
        _jobs_table()
        return
    from .jobs import follow as f
    from .spec import load_resolved, summarize

    store, record = _job(job)
    record = _refreshed(store, [record])[0]
    run = store.path(record.name)
    out.print(
        f"{record.name}  [{STATUS_STYLE.get(record.status, '')}]{record.status}[/]  {_duration(record)}  (started {_when(record.started_at)})"
    )
    if record.reason:
        out.print(f"reason     {record.reason}", markup=False)
    if record.kind == "serve":
        out.print(f"url        {record.url}", markup=False)
        out.print(f"model      {record.model}", markup=False)
        out.print(f"engine     {record.accelerators}", markup=False)
    if (run / "spec.yaml").exists():
        for label, value in summarize(load_resolved(run / "spec.yaml")):
            out.print(f"{label:10} {value}", markup=False)
    m = f.last_train_metrics(run)
    if m:
        total = f.total_steps(run)
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
    from .checkpoints import job_checkpoint_root, list_checkpoints

    root = job_checkpoint_root(run)  # honours save_checkpoint_path (a cloud job's bucket)
    try:
        ckpts = list_checkpoints(root, record.name)
    except Exception as e:  # a bucket without credentials or network: say so, show the rest
        out.print(f"checkpoints cannot read {root}: {type(e).__name__}: {e}", markup=False)
        ckpts = []
    if ckpts:
        out.print(
            "checkpoints " + ", ".join(str(c.step) for c in ckpts),
            markup=False,
        )
    out.print(f"run folder {run}", markup=False)
    lines = f.tail_lines(run / record.log.name, 10)
    if lines:
        out.print("log tail:", style="bold")
        for line in lines:
            out.print("  " + line, markup=False)


@app.command()
def stop(
    job: JobArg = None,
    grace: Annotated[
        float, typer.Option("--grace", help="Seconds the trainer gets to save a checkpoint and exit.")
    ] = 180.0,
) -> None:
    """Stop a job cleanly: the trainer finishes its step and saves a checkpoint first."""
    from .jobs.local import stop as stop_local
    from .jobs.store import ACTIVE

    store, record = _job(job)
    if record.status not in ACTIVE:
        out.print(f"{record.name} is not running ({record.status})", markup=False)
        return
    if record.cloud:
        from .jobs.cloud import CloudError, cancel, serve_down

        try:
            how = serve_down(record.cloud["service"]) if record.kind == "serve" else cancel(record.cloud)
        except CloudError as e:
            _fail(f"error: {e}", e.hints)
        with store.locked(record.name) as j:
            j.status, j.stop_requested, j.ended_at = "STOPPED", True, time.time()
        kept = (
            ""
            if record.kind == "serve"
            else f"; its checkpoints stay in the bucket: r1cloud checkpoints {record.name}"
        )
        out.print(f"{record.name} STOPPED ({how}){kept}", markup=False)
        return
    if record.kind == "serve":
        out.print(f"stopping {record.name}…", markup=False)
        how = stop_local(store, record.name, grace)
        out.print(f"{record.name} {store.get(record.name).status} ({how})", markup=False)
        return
    out.print(f"stopping {record.name} (saving a checkpoint first; up to {grace:.0f}s)…", markup=False)
    how = stop_local(store, record.name, grace)
    record = store.get(record.name)
    out.print(
        f"{record.name} {record.status} ({how}); continue with: r1cloud train --resume {record.name}",
        markup=False,
    )


# ---------------------------------------------------------------------------- checkpoints


def _checkpoint_source(target: str | None) -> tuple[str, str, int | None]:
    """(checkpoints root, label for IDs, step or None) for a job, JOB:step-N, a folder or a URL."""
    from .checkpoints import job_checkpoint_root, locate, parse_ref

    ref, step = parse_ref(target) if target else (None, None)
    found = locate(ref, step) if ref else None
    if found:
        return found
    store, job = _job(ref)
    return job_checkpoint_root(store.path(job.name)), job.name, step


@app.command()
def checkpoints(
    target: Annotated[
        str | None,
        typer.Argument(
            help="A job (default: the latest), a checkpoints folder, or a URL (s3://…).", show_default=False
        ),
    ] = None,
) -> None:
    """List checkpoints: step, time, rewards, size, INFERENCE READY, and the ID to merge or serve."""
    from .checkpoints import human_size, list_checkpoints

    root, label, _ = _checkpoint_source(target)
    found = list_checkpoints(root, label)
    if not found:
        out.print(f"no checkpoints yet in {root}", markup=False)
        return
    table = Table(box=None, header_style="bold")
    for col in ("ID", "STEP", "TIME", "TRAIN REWARD", "VAL REWARD", "SIZE", "INFERENCE READY"):
        table.add_column(col, no_wrap=True)
    for c in found:
        fmt = lambda v: f"{v:.3f}" if v is not None else "—"  # noqa: E731
        ready = "[green]yes[/]" if c.inference_ready else f"no — r1cloud merge {c.id}"
        table.add_row(
            c.id,
            str(c.step),
            _when(c.time),
            fmt(c.train_reward),
            fmt(c.val_reward),
            human_size(c.size),
            ready,
        )
    out.print(table)


@app.command()
def merge(
    target: Annotated[
        str,
        typer.Argument(
            help="JOB[:step-N], a checkpoint folder (r1cloud's or EasyR1's), or PATH:step-N.",
            show_default=False,
        ),
    ],
    out_dir: Annotated[
        Path | None, typer.Option("--out", help="Output folder (default: the checkpoint's huggingface/).")
    ] = None,
    dtype: Annotated[
        str, typer.Option("--dtype", help="bf16, fp16 or fp32 (as trained: fp32 keeps the bits).")
    ] = "bf16",
    push_to_hub: Annotated[
        str | None,
        typer.Option(
            "--push-to-hub",
            metavar="REPO",
            help="Then upload the folder to this Hub model repo (created if missing; token from HF_TOKEN).",
        ),
    ] = None,
    private: Annotated[bool, typer.Option("--private", help="Create the Hub repo private.")] = False,
) -> None:
    """Write a Hugging Face model folder (config, tokenizer, sharded safetensors) from a checkpoint,
    streaming: memory stays about one output shard. A bucket checkpoint (s3://…) is merged locally
    and uploaded back into its huggingface/ folder unless --out is given."""
    from .checkpoints import NotFound, select

    if dtype not in ("bf16", "fp16", "fp32"):
        _fail("error: bad --dtype", [f"{dtype!r}: use bf16, fp16 or fp32"])
    import importlib.util

    if importlib.util.find_spec("torch") is None or importlib.util.find_spec("safetensors") is None:
        _fail(
            "error: merging needs torch and safetensors",
            ["install the training extra: scripts/install (or pip install 'r1cloud[train]')"],
        )
    try:
        chosen = select(*_checkpoint_source(target))
    except NotFound as e:
        _fail(*e.args)
    if push_to_hub and out_dir is None and "://" in chosen.path:
        import tempfile  # the Hub client uploads local files: merge a bucket checkpoint locally

        out_dir = Path(tempfile.mkdtemp(prefix="r1cloud-push-")) / "model"
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    from .merge import MergeError
    from .merge import merge as do_merge

    try:
        with Progress(
            TextColumn("merging {task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            console=err,
            disable=not err.is_terminal,
        ) as bar:
            task = bar.add_task(chosen.id, total=None)
            path = do_merge(
                chosen, out_dir, dtype, progress=lambda i, n: bar.update(task, completed=i, total=n)
            )
    except MergeError as e:
        _fail("error: cannot merge", [str(e)])
    out.print(f"merged {chosen.id} into {path}", markup=False)
    if push_to_hub:
        from .hub import HubError, push_folder

        err.print(f"pushing {path} to the Hub as {push_to_hub} …", markup=False)
        try:
            url = push_folder(path, push_to_hub, private=private, message=f"r1cloud merge {chosen.id}")
        except HubError as e:
            _fail("error: push to the Hub failed", [str(e), f"the merged model is kept in {path}"])
        out.print(f"pushed to {url}", markup=False)


# ---------------------------------------------------------------------------- serving


def _merge_for_serving(checkpoint, out_dir) -> None:
    from .merge import MergeError
    from .merge import merge as do_merge

    if checkpoint.inference_ready:  # a bucket's merged model, fetched by merging its weights here
        err.print(f"{checkpoint.id}: fetching the model from the bucket into {out_dir}…", markup=False)
    else:
        err.print(f"{checkpoint.id} is not INFERENCE READY: merging it first…", markup=False)
    try:
        do_merge(checkpoint, out_dir, "bf16")
    except MergeError as e:
        _fail("error: cannot merge", [str(e)])


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def serve(
    ctx: typer.Context,
    checkpoint: Annotated[
        str,
        typer.Option(
            "--checkpoint",
            "-c",
            help="JOB[:step-N] (default step: the last), a checkpoint or model folder, a bucket URL, or a Hub id.",
            show_default=False,
        ),
    ],
    port: Annotated[int, typer.Option("--port", help="Port to listen on.")] = 8000,
    host: Annotated[
        str, typer.Option("--host", help="Address to bind; 0.0.0.0 opens it to the network.")
    ] = "127.0.0.1",
    api_key: Annotated[
        str | None,
        typer.Option(
            "--api-key",
            envvar="R1CLOUD_API_KEY",
            help="Require this bearer key (401 without it). Also read from R1CLOUD_API_KEY.",
            show_default=False,
        ),
    ] = None,
    served_model_name: Annotated[
        str | None,
        typer.Option(
            "--served-model-name", help="Model name clients use (default: JOB-step-N).", show_default=False
        ),
    ] = None,
    max_model_len: Annotated[
        int | None, typer.Option("--max-model-len", help="Context length limit.", show_default=False)
    ] = None,
    engine: Annotated[
        str, typer.Option("--engine", help="auto (vLLM when installed), vllm, or transformers.")
    ] = "auto",
    infra: Annotated[
        str,
        typer.Option("--infra", help="local, or a SkyPilot infra (aws, gcp, k8s, …) for a SkyServe service."),
    ] = "local",
    replicas: Annotated[
        str, typer.Option("--replicas", help="Cloud: a replica count (2) or an autoscaling range (1-4).")
    ] = "1",
    gpu: Annotated[str, typer.Option("--gpu", help="Cloud: each replica's accelerator.")] = "L4:1",
    name: Annotated[
        str | None, typer.Option("--name", help="Job name (default: serve-MODEL).", show_default=False)
    ] = None,
    detach: Annotated[
        bool,
        typer.Option("--detach", "-d", help="Start, wait until ready, and return; stop with r1cloud stop."),
    ] = False,
    ready_timeout: Annotated[
        float, typer.Option("--ready-timeout", help="Seconds to wait for /v1/models to answer.")
    ] = 900.0,
) -> None:
    """Serve a checkpoint behind an OpenAI-compatible API (/v1/models, /v1/completions,
    /v1/chat/completions), merging it first when it is not INFERENCE READY. Runs as a job: `jobs`
    shows its URL, `logs` its output; Ctrl-C (or `r1cloud stop`) stops it. Arguments after `--`
    go to the engine, e.g. `-- --enforce-eager`."""
    from . import serve as sv
    from .jobs import follow as f
    from .jobs.local import launch
    from .jobs.local import stop as stop_local
    from .jobs.store import ACTIVE, Job

    if infra != "local":
        _serve_in_cloud(checkpoint, infra, gpu, replicas, api_key, served_model_name, max_model_len, name)
        return
    if replicas != "1":
        _fail(f"error: --replicas {replicas} needs a cloud --infra", ["locally, one server runs"])
    try:
        chosen_engine = sv.pick_engine(engine)
        sv.check_port(host, port)
        from .jobs.store import home

        model = sv.resolve(checkpoint, _merge_for_serving, home() / "models")
    except sv.ServeError as e:
        _fail(e.args[0], e.args[1])
    served = served_model_name or model.name
    url = sv.base_url(host, port)
    store = _store()
    job = store.create_unique(
        Job(
            name or f"serve-{served}".replace("/", "-"),
            kind="serve",
            accelerators=chosen_engine,
            blueprint=checkpoint,
            command=sv.command(chosen_engine, model, host, port, served, max_model_len, list(ctx.args)),
            url=url,
            model=f"{served} ← {model.origin}",
        )
    )
    job = launch(store, job, sv.key_env(api_key), {})
    out.print(f"serving {model.origin} as {served!r} with {chosen_engine} · job {job.name}", markup=False)
    if host in ("0.0.0.0", "::") and not api_key:
        err.print(
            "warning: listening on every interface with no --api-key: anyone who can reach it can use it"
        )
    with err.status(f"starting {chosen_engine} (log: {job.log})…"):
        ready = sv.wait_ready(
            url, api_key, lambda: store.get(job.name).status in ACTIVE, ready_timeout, lambda: None
        )
    if not ready:
        record = store.get(job.name)
        if record.status in ACTIVE:
            stop_local(store, job.name, 10)
            why = f"/v1/models did not answer within {ready_timeout:.0f}s"
        else:
            why = record.reason or "the server exited"
        lines = [why, *f.tail_lines(job.log, 12), f"full log: r1cloud logs {job.name}"]
        err.print("error: the server did not start", style="bold red", markup=False)
        for line in lines:
            err.print(f"  {line}", markup=False)
        raise typer.Exit(1)
    out.print(f"ready: {url}  (model {served!r})", style="bold green", markup=False)
    out.print(sv.snippets(url, served, bool(api_key)), markup=False)
    if detach:
        out.print(f"logs: r1cloud logs -f {job.name}    stop: r1cloud stop {job.name}", markup=False)
        return
    err.print("Ctrl-C stops the server", markup=False)
    try:
        record = f.follow(store, job.name, lambda line: print(line, flush=True), start=job.log.stat().st_size)
    except KeyboardInterrupt:
        err.print(f"stopping {job.name}…", markup=False)
        stop_local(store, job.name, 30)
        raise typer.Exit(0) from None
    raise typer.Exit(_report_end(record))


def _serve_in_cloud(checkpoint, infra, gpu, replicas, api_key, served_model_name, max_model_len, name):
    from . import serve as sv
    from .jobs.cloud import CloudError, serve_up
    from .jobs.sky_task import TaskError, service_config
    from .jobs.store import Job

    try:
        model = sv.resolve_for_cloud(checkpoint)
        served = served_model_name or model.name
        service = name or f"serve-{served}".replace("/", "-").lower()
        config = service_config(
            service, model.path, served, infra, gpu, replicas, bool(api_key), max_model_len
        )
        err.print(f"starting SkyServe service {service} on {infra} ({replicas} × {gpu})…", markup=False)
        endpoint = serve_up(config, {"R1CLOUD_API_KEY": api_key} if api_key else {}, service)
    except sv.ServeError as e:
        _fail(e.args[0], e.args[1])
    except (TaskError, CloudError) as e:
        _fail(f"error: {e}", getattr(e, "hints", []))
    url = f"{endpoint if '://' in endpoint else 'http://' + endpoint}/v1"
    store = _store()
    store.create_unique(
        Job(service, kind="serve", infra=infra, accelerators=gpu, blueprint=checkpoint, url=url,
            model=f"{served} ← {model.origin}", cloud={"service": service}, status="RUNNING")
    )  # fmt: skip
    out.print(
        f"ready: {url}  (model {served!r}, SkyServe service {service})", style="bold green", markup=False
    )
    out.print(sv.snippets(url, served, bool(api_key)), markup=False)
    out.print(f"stop: r1cloud stop {service}    status: sky serve status {service}", markup=False)


@app.command()
def chat(
    target: Annotated[
        str,
        typer.Argument(
            help="An endpoint URL (http://…/v1), or a job, JOB:step-N, checkpoint or model folder, or Hub id.",
            show_default=False,
        ),
    ],
    prompt: Annotated[
        str | None,
        typer.Argument(
            help="One prompt; without it, an interactive loop (or one prompt per stdin line).",
            show_default=False,
        ),
    ] = None,
    compare: Annotated[
        str | None,
        typer.Option(
            "--compare",
            help="A second target (e.g. the base model): answers side by side.",
            show_default=False,
        ),
    ] = None,
    blueprint: Annotated[
        Path | None,
        typer.Option(
            "--blueprint",
            help="Apply this blueprint's format prompt (default: the job's own).",
            show_default=False,
        ),
    ] = None,
    format_prompt: Annotated[
        Path | None,
        typer.Option(
            "--format-prompt", help="Apply this Jinja format prompt (over `content`).", show_default=False
        ),
    ] = None,
    raw: Annotated[
        bool, typer.Option("--raw", help="Send the text as it is, with no format prompt.")
    ] = False,
    show_prompt: Annotated[bool, typer.Option("--show-prompt", help="Print the message as sent.")] = False,
    api_key: Annotated[
        str | None,
        typer.Option(
            "--api-key", envvar="R1CLOUD_API_KEY", help="Bearer key of the endpoint(s).", show_default=False
        ),
    ] = None,
    max_tokens: Annotated[int, typer.Option("--max-tokens", help="Tokens per answer at most.")] = 512,
    temperature: Annotated[float, typer.Option("--temperature", help="0 is greedy.")] = 0.0,
    engine: Annotated[
        str,
        typer.Option(
            "--engine", help="Engine for a checkpoint target: transformers (starts in seconds) or vllm."
        ),
    ] = "transformers",
) -> None:
    """Ask a served endpoint or a checkpoint, with the blueprint's format prompt applied; --compare
    shows a second model's answer beside it (the before/after view)."""
    from . import chat as ch
    from . import serve as sv
    from .jobs.store import home

    template = None
    if not raw:
        if format_prompt:
            if not format_prompt.is_file():
                _fail(
                    f"error: --format-prompt {format_prompt}: no such file",
                    ["give a Jinja template over `content`"],
                )
            template = str(format_prompt)
        elif blueprint:
            template = _load(blueprint, [], {}, str(blueprint)).data.format_prompt
        else:
            template = ch.job_format_prompt(target)
    if sys.stdin.isatty() or prompt is not None:
        prompts = None
    else:
        prompts = [line.strip() for line in sys.stdin if line.strip()]
    with contextlib.ExitStack() as stack:
        try:
            sides = [
                stack.enter_context(
                    ch.open_endpoint(t, api_key, engine, _merge_for_serving, home() / "models")
                )
                for t in ([compare, target] if compare else [target])
            ]
        except sv.ServeError as e:
            _fail(e.args[0], e.args[1])
        if compare:
            sides[0].label, sides[1].label = f"{compare} ({sides[0].model})", f"{target} ({sides[1].model})"
        histories: list[list[dict]] = [[] for _ in sides]

        def turn(text: str) -> None:
            message = ch.render(template, text)
            if show_prompt:
                err.print(f"[dim]sent:[/] {message}", highlight=False)
            answers = []
            for side, history in zip(sides, histories, strict=True):
                history.append({"role": "user", "content": message})
                stream = None if compare else (lambda piece: out.print(piece, end="", markup=False))
                answer = ch.ask(side, history, max_tokens, temperature, stream)
                history.append({"role": "assistant", "content": answer})
                answers.append(answer)
            if not compare:
                out.print()
                return
            table = Table(title=text, title_justify="left", expand=sys.stdout.isatty())
            for side in sides:
                table.add_column(side.label, ratio=1, overflow="fold")
            table.add_row(*answers)
            out.print(table)

        if prompt is not None or prompts is not None:
            for text in [prompt] if prompt is not None else prompts:
                if prompts is not None:
                    histories = [[] for _ in sides]  # each stdin line is its own question
                turn(text)
            return
        err.print(
            f"chatting with {' and '.join(s.label for s in sides)}; empty line or Ctrl-D ends", markup=False
        )
        while True:
            try:
                text = out.input("[bold]you> [/]")
            except (EOFError, KeyboardInterrupt):
                out.print()
                return
            if not text.strip():
                return
            turn(text)


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
