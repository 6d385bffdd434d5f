"""`train`: validate a blueprint, start it here or in the cloud, and follow it."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Annotated

import typer

from r1cloud.cli.common import (
    AccelsOption,
    GpuOption,
    SecretOption,
    accelerator_overrides,
    app,
    budget_price,
    cloud_logs,
    err,
    fail,
    find_job,
    load_blueprint,
    out,
    parse_secrets,
    refreshed,
    report_end,
)
from r1cloud.cli.spec_cmds import OverridesArg, print_estimate
from r1cloud.core.budget import usd
from r1cloud.core.jobstore import ACTIVE, JobExists, JobRunning, JobStore, home
from r1cloud.costs.prices import hourly_price
from r1cloud.jobs import follow as f
from r1cloud.jobs import local, remote
from r1cloud.jobs.cloud import CloudError
from r1cloud.jobs.sky_task import TaskError, to_yaml


@app.command()
def train(
    target: Annotated[
        str,
        typer.Argument(
            help="Blueprint YAML or EasyR1 launch script (.sh), or with --resume the name of a job."
        ),
    ],
    overrides: OverridesArg = None,
    name: Annotated[
        str | None,
        typer.Option(
            "--name",
            help="Job name; taken names are an error. Default: the blueprint's name:, else "
            "trainer.experiment_name, else the file's name, with -2, -3, … added when taken.",
        ),
    ] = None,
    accels: AccelsOption = None,
    nodes: Annotated[int | None, typer.Option("--nodes", min=1, max=4096, help="Number of nodes.")] = None,
    gpu: GpuOption = None,
    infra: Annotated[
        str | None, typer.Option("--infra", help="local (default) or a SkyPilot infra: aws, gcp, k8s, …")
    ] = None,
    spot: Annotated[bool, typer.Option("--spot", help="Use spot instances (cloud).")] = False,
    env: Annotated[
        list[str] | None, typer.Option("--env", help="K=V environment variable for the job; repeatable.")
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
    max_cost: Annotated[
        float | None,
        typer.Option(
            "--max-cost",
            min=0.0001,
            max=1e9,
            help="Dollars for the whole job at its catalog price (resources.max_cost): the trainer saves "
            "and stops before the next step would pass it; with --resume, the new cap.",
        ),
    ] = None,
) -> None:
    """Validate a blueprint, start it as a job, and follow its progress (Ctrl-C detaches; the
    job keeps running)."""
    store = JobStore()
    source = Path(target)
    try:
        a_file = source.is_file()
    except (OSError, ValueError):  # a name too long to be a path, a NUL in it: no file (load says so)
        a_file = False
    resuming_job = (
        resume and not a_file and store.has(target) and (store.path(target) / "spec.yaml").is_file()
    )
    if resuming_job:
        source = store.path(target) / "spec.yaml"
    elif resume and not a_file and not target.endswith((".yaml", ".yml", ".sh")):
        find_job(target)  # not a file and not a job: "no job named …", with the closest names
    for flag, value in (("--gpu", gpu), ("--infra", infra), ("--name", name), ("--bucket", bucket)):
        if value is not None and not value.strip():
            fail(f"error: {flag} is empty", [f"give a value, or leave {flag} out"])
    if gpu is not None and not re.fullmatch(r"[A-Za-z][A-Za-z0-9_.-]*(:\d+)?", gpu):
        fail(
            f"error: --gpu {gpu!r} is not an accelerator name",
            ["write it as SkyPilot does: H100, A100-80GB, L4, …"],
        )
    extra = list(overrides or [])
    for item in env or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            fail("error: bad --env", [f"--env {item!r}: write KEY=VALUE"])
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            fail(
                "error: bad --env", [f"--env {item[:60]!r}: {key[:40]!r} is not an environment variable name"]
            )
        extra.append(f"envs.{key}={json.dumps(value)}")
    extra += [f"name={name}"] if name else []
    extra += [f"resources.infra={infra}"] if infra else []
    extra += ["resources.use_spot=true"] if spot else []
    extra += [f"resources.bucket={bucket}"] if bucket else []
    extra += [f"resources.max_cost={max_cost}"] if max_cost is not None else []
    extra += [f"resources.num_nodes={nodes}", f"trainer.nnodes={nodes}"] if nodes else []
    extra += accelerator_overrides(source, extra, accels, gpu)
    provided = parse_secrets(secret or [])
    spec = load_blueprint(source, extra, provided, target)
    if resuming_job and spec.name != target:  # --name, or a name=… override
        fail(
            f"error: resuming {target} as {spec.name!r}: a resumed job keeps its name",
            [f"leave the name out, or start a new job from its blueprint with --name {spec.name}"],
        )
    secrets = {n: provided.get(n) or os.environ[n] for n in spec.secrets}
    secrets.update(provided)
    price = budget_price(spec)
    record = _resumable(store, target, spec) if resuming_job else None
    if record and price:
        _check_spent(record, spec.resources.max_cost)
    if spec.resources.infra != "local":
        where = Path(record.blueprint) if record else source  # the folder a resumed job was launched from
        _train_in_cloud(
            store, spec, secrets, where, managed, dry_run, detach, name is None, price, bool(record)
        )
        return
    if dry_run:
        from r1cloud.validate import summarize  # loads the schema (pydantic): not at start-up

        taken = store.path(spec.name).exists() and not resume
        if taken and name:  # as the real launch would say
            _taken(spec.name)
        job_name = store.free_name(spec.name) if taken else spec.name
        for label, value in summarize(spec.model_copy(update={"name": job_name})):
            out.print(f"{label:10} {value}", markup=False)
        out.print(
            f"would run  python -m r1cloud.jobs.supervise {store.path(job_name)}  (local, detached)",
            markup=False,
        )
        if spec.envs or secrets:
            out.print(
                f"env        {', '.join([*spec.envs, *(f'{k} (secret)' for k in secrets)])}", markup=False
            )
        print_estimate(spec, out)
        return
    try:
        job, fresh, log_start = local.submit(
            store,
            spec,
            secrets,
            resume=resume,
            blueprint="" if resuming_job else target,
            unique=name is None,
            price=price,
        )
    except JobExists as e:
        _taken(spec.name, f" ({e.args[1]})")
    except JobRunning:
        fail(f"error: {spec.name} is already running", [f"follow it with: r1cloud logs -f {spec.name}"])
    verb = "started" if fresh else "resumed"
    if job.name != spec.name:
        err.print(f"a job named {spec.name} exists; this one is {job.name} (--name to choose)", markup=False)
    out.print(
        f"{verb} {job.name} · {spec.trainer.n_gpus_per_node} worker slot(s) · run folder {job.dir}",
        markup=False,
    )
    if detach:
        out.print(f"follow: r1cloud logs -f {job.name}    stop: r1cloud stop {job.name}", markup=False)
        return
    raise typer.Exit(_follow_with_progress(store, job.name, log_start))


def _taken(name: str, detail: str = "") -> None:
    fail(
        f"error: a job named {name!r} already exists{detail}",
        [f"pick another name with --name {name}-2, or continue it with: r1cloud train --resume {name}"],
    )


def _resumable(store, name: str, spec):
    """The job `train --resume` continues, brought up to date; refused where it cannot go on."""
    job = refreshed(store, [store.get(name)])[0]
    if job.remote != (spec.resources.infra != "local"):
        here = "in the cloud (checkpoints in its bucket)" if job.remote else "on this machine"
        fail(
            f"error: {name} ran {here}",
            [f"resume it where it ran: r1cloud train --resume {name} without --infra"],
        )
    if job.remote and job.status in ACTIVE:
        fail(f"error: {name} is already running ({job.status})", [f"follow it with: r1cloud logs -f {name}"])
    return job


def _check_spent(job, cap: float) -> None:
    if job.spent >= cap:
        fail(
            f"error: {job.name} has already spent {usd(job.spent)} of its {usd(cap)} (resources.max_cost)",
            [f"give it a higher cap: r1cloud train --resume {job.name} --max-cost DOLLARS"],
        )


def _train_in_cloud(
    store,
    spec,
    secrets: dict,
    blueprint: Path,
    managed: bool,
    dry_run: bool,
    detach: bool,
    unique: bool,
    price,
    resume: bool,
):
    kind = "a managed job" if managed else "a cluster (autostop, down at the end)"
    try:
        if dry_run:
            folder = home() / "dry-run" / spec.name
            folder.mkdir(parents=True, exist_ok=True)
            config, _ = remote.prepare(spec, blueprint, folder, managed, price)
            err.print(f"# {spec.name} as {kind}; the nodes read {folder / 'node-spec.yaml'}", markup=False)
            print(to_yaml(config), end="")
            print_estimate(spec, err)  # on stderr: stdout stays the YAML `sky launch` takes
            return
        err.print(f"launching {spec.name} on {spec.resources.infra} as {kind}…", markup=False)
        if price is None:  # no budget: the price still shows the spend in `jobs` and `status`
            price = hourly_price(spec)[0]
        job = remote.submit(store, spec, secrets, blueprint, managed, unique and not resume, price, resume)
        if job.name != spec.name:
            err.print(f"a job named {spec.name} exists; this one is {job.name}", markup=False)
    except (TaskError, CloudError) as e:
        fail(f"error: {e}", getattr(e, "hints", []))
    except JobExists:
        _taken(spec.name)
    except JobRunning:
        fail(f"error: {spec.name} is already running", [f"follow it with: r1cloud logs -f {spec.name}"])
    ident = f"managed job {job.cloud['job_id']}" if managed else f"cluster {job.cloud['cluster']}"
    verb = "resumed" if resume else "started"
    out.print(f"{verb} {job.name} · {ident} · checkpoints {spec.resources.bucket}", markup=False)
    if detach:
        out.print(f"follow: r1cloud logs -f {job.name}    stop: r1cloud stop {job.name}", markup=False)
        return
    raise typer.Exit(cloud_logs(job, follow=True))


def _follow_with_progress(store, name: str, log_start: int) -> int:
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

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
                    progress.update(task, completed=m["step"], total=f.planned_steps(run), stats=stats)

            job = f.follow(store, name, on_line, start=log_start)
    except KeyboardInterrupt:
        err.print(
            f"\ndetached: {name} keeps running.  reattach: r1cloud logs -f {name}    stop: r1cloud stop {name}",
            markup=False,
        )
        return 0
    return report_end(job)
