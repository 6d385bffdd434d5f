"""What every command shares: the Typer app, the consoles, and turning bad input into one
clear message with exit code 2."""

from __future__ import annotations

import contextlib
import datetime
import difflib
import os
import sys
from pathlib import Path
from typing import Annotated

import typer
import yaml
from rich.console import Console

from r1cloud import __version__
from r1cloud.core.accelerators import accelerator_options
from r1cloud.core.jobstore import ACTIVE, DamagedJob, JobStore, NoSuchJob, home
from r1cloud.core.records import cut
from r1cloud.costs.plan import check_budget, step_seconds
from r1cloud.jobs.cloud import CloudError, tail_logs
from r1cloud.jobs.follow import exit_code
from r1cloud.jobs.remote import refresh
from r1cloud.spec import SpecError

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


def not_nan(value: float | None) -> float | None:
    """An option's callback: NaN passes click's ranges (no comparison holds), so it is refused here."""
    if value is not None and value != value:
        raise typer.BadParameter("nan is not a number")
    return value


def fail(title: str, lines: list[str], warnings: list[str] = ()) -> None:
    for w in warnings:
        err.print(f"warning: {w}", style="yellow", markup=False)
    err.print(title, style="bold red", markup=False)
    for line in lines:
        err.print(f"  ✗ {line}", markup=False)
    raise typer.Exit(EXIT_BAD_INPUT)


@contextlib.contextmanager
def failing(*errors: type[Exception]):
    """An error raised inside that carries (title, hints), as ServeError and NotFound do, becomes fail."""
    try:
        yield
    except errors as e:
        fail(*e.args)


def need_file(flag: str, path: Path, hint: str) -> None:
    if not path.is_file():
        fail(f"error: {flag} {path}: no such file", [hint])


def parse_secrets(values: list[str]) -> dict[str, str]:
    """`--secret NAME` takes the value from the environment; `--secret NAME=VALUE` from the flag."""
    secrets, problems = {}, []
    for item in values:
        name, sep, value = item.partition("=")
        if not name.isidentifier():
            problems.append(f"--secret {item.split('=')[0]!r}: not an environment variable name")
        elif sep and not value:
            problems.append(
                f"--secret {name}=: the value is empty; give --secret {name}=VALUE, or export {name}"
            )
        elif sep:
            secrets[name] = value
        elif os.environ.get(name):
            secrets[name] = os.environ[name]
        else:
            problems.append(
                f"--secret {name}: {name} is not set in the environment; export it or pass --secret {name}=VALUE"
            )
    if problems:
        fail("error: bad --secret", problems)
    return secrets


def load_blueprint(path: Path, overrides: list[str], secrets: dict[str, str], shown: str):
    """The validated spec, its warnings printed; or every problem and exit code 2."""
    from r1cloud.validate import load_spec  # loads the schema (pydantic): not at start-up

    shown = cut(shown)
    try:
        loaded = load_spec(path, overrides, secrets=secrets)
    except SpecError as e:
        n = len(e.problems)
        fail(
            f"error: {shown} has {n} problem{'s' if n != 1 else ''}:",
            [p.render() for p in e.problems],
            [w.render() for w in e.warnings],
        )
    for w in loaded.warnings:
        err.print(f"warning: {w.render()}", style="yellow", markup=False)
    return loaded.spec


def budget_price(spec) -> float | None:
    """The job's hourly price when it has a budget (resources.max_cost); exit 2 when the budget
    cannot be kept (no price to count it by, or less than one step)."""
    if spec.resources.max_cost is None:
        return None
    price, problem = check_budget(spec, step_seconds(spec, home()))
    if problem:
        fail("error: the budget cannot be kept:", [problem])
    return price


def find_job(name: str | None):
    """The named job, or the latest; a clear error when there is none."""
    store = JobStore()
    if name is None:
        job = store.latest()
        if job is None and (damaged := [j.name for j in store.list()]):  # every record is damaged
            fail(
                f"error: no job to show: {', '.join(damaged)} {'is' if len(damaged) == 1 else 'are'} damaged",
                ["`r1cloud jobs` says why; remove a damaged job's folder to forget it"],
            )
        if job is None:
            fail("error: no jobs yet", ["start one with: r1cloud train blueprints/quickstart.yaml"])
        return store, job
    try:
        return store, store.get(name)
    except DamagedJob as e:
        fail(
            f"error: job {name!r} is damaged: {e.args[1]}",
            [f"its files are kept in {store.path(name)}; remove that folder to forget the job"],
        )
    except NoSuchJob:
        names = [j.name for j in store.list()]
        close = difflib.get_close_matches(name, names, n=1)
        hint = f"did you mean {close[0]}? " if close else ""
        fail(f"error: no job named {name!r}", [f"{hint}`r1cloud jobs` lists the jobs ({len(names)} now)"])


def refreshed(store, jobs: list) -> list:
    """Cloud jobs' state from SkyPilot; if it cannot be reached, the last known state and a warning."""
    try:
        return refresh(store, jobs)
    except CloudError as e:
        err.print(f"warning: cloud jobs show their last known state: {e}", markup=False)
        return jobs


def cloud_logs(job, follow: bool) -> int:
    """A cloud job's log; following it, the job's end as `report_end` says it (a budget stop
    included), or the log's exit code while SkyPilot still calls the job running."""
    if not job.cloud:  # its first launch in flight, or cut off before SkyPilot answered
        fail(
            f"error: {job.name} has no log yet: SkyPilot has not answered its launch ({job.status})",
            [job.reason or f"follow it once `r1cloud jobs` shows it started: r1cloud logs -f {job.name}"],
        )
    try:
        code = tail_logs(job.cloud, follow)
    except CloudError as e:
        fail(f"error: {e}", e.hints)
    except KeyboardInterrupt:
        err.print(
            f"\ndetached: {job.name} keeps running.  reattach: r1cloud logs -f {job.name}", markup=False
        )
        return 0
    store = JobStore()
    if follow and (job := refreshed(store, [store.get(job.name)])[0]).status not in ACTIVE:
        return report_end(job)
    return int(code or 0)


def report_end(job) -> int:
    style = {"SUCCEEDED": "green", "STOPPED": "yellow", "ENDED": "yellow", "BUDGET_REACHED": "yellow"}
    style = style.get(job.status, "bold red")
    tail = f": {job.reason}" if job.reason else ""
    console = err if job.status == "FAILED" else out
    console.print(f"{job.name} {job.status}{tail}", style=style, markup=False)
    for line in next_steps(job):
        console.print(f"  {line}", markup=False)
    return exit_code(job)


def next_steps(job) -> list[str]:
    """What to run after a training job ends, with its real names."""
    if job.kind != "train":
        return []
    name = job.name
    if job.status == "FAILED":
        return [f"the whole log: r1cloud logs {name}", f"after a fix, resume: r1cloud train --resume {name}"]
    if job.status == "BUDGET_REACHED":
        return [f"resume with a new cap: r1cloud train --resume {name} --max-cost DOLLARS"]
    if job.status != "SUCCEEDED":
        return [f"resume: r1cloud train --resume {name}", f"the curves so far: r1cloud plot {name}"]
    base = _base_model(job)
    return [
        f"the curves:   r1cloud plot {name}",
        f"checkpoints:  r1cloud checkpoints {name}",
        "before/after: r1cloud chat " + name + (f" --compare {base}" if base else " --compare BASE_MODEL"),
        f"score both:   r1cloud eval {base or 'BASE_MODEL'} {name}",
        f"serve it:     r1cloud serve -c {name}",
    ]


def _base_model(job) -> str | None:
    """The job's model as the user can type it: a folder under the working directory relative to it."""
    try:
        spec = yaml.safe_load((job.dir / "spec.yaml").read_text())
        path = spec["worker"]["actor"]["model"]["model_path"] or None
    except (OSError, yaml.YAMLError, KeyError, TypeError, RecursionError):
        return None
    if isinstance(path, str) and path.startswith("/") and Path(path).is_relative_to(Path.cwd()):
        return str(Path(path).relative_to(Path.cwd()))
    return path


def when(ts: float | None) -> str:
    return datetime.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M") if ts else "—"


AccelsOption = Annotated[
    int | None,
    typer.Option(
        "--accels",
        min=1,
        max=4096,
        help="Devices per node; locally, worker slots (CPU processes or local GPUs).",
    ),
]
GpuOption = Annotated[str | None, typer.Option("--gpu", help="Accelerator type: H100, A100-80GB, …")]


def accelerator_overrides(
    blueprint: Path, overrides: list[str], accels: int | None, gpu: str | None
) -> list[str]:
    """--accels/--gpu set resources.accelerators and trainer.n_gpus_per_node together."""
    from r1cloud.validate import load_spec  # loads the schema (pydantic): not at start-up

    if accels is None and gpu is None:
        return []
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
