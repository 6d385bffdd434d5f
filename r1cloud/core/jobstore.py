"""The job store: one folder per job under `$R1CLOUD_HOME/jobs` (default `~/.r1cloud/jobs`).

```
<home>/jobs/<name>/
  job.json        the record below (written atomically, updated under a lock)
  spec.yaml       the resolved spec the trainer reads (secret names only, never values)
  train.log       the trainer's output, appended across restarts (serve.log for a server)
  metrics.jsonl, checkpoints/, trainer.json      written by the trainer
```

Names are claimed with an exclusive mkdir, so two jobs started at once cannot take the same name.
A RUNNING job whose supervisor process is gone (kill -9, reboot) is reported FAILED with the
reason, never RUNNING forever.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

from r1cloud.core.records import cut, loads

ACTIVE = ("PENDING", "RUNNING")
# ENDED: a cloud job whose outcome is unknown; BUDGET_REACHED: stopped by resources.max_cost
TERMINAL = ("SUCCEEDED", "FAILED", "STOPPED", "ENDED", "BUDGET_REACHED")
DIED = "its process ended without a word (killed, or the machine restarted)"


def launch_lost(name: str) -> str:
    return (
        "its launch was cut off before SkyPilot answered; the launch may still go on: check "
        f"`sky jobs queue` / `sky status`, and cancel it there (`sky jobs cancel -n {name}`)"
    )


def home() -> Path:
    return Path(os.environ.get("R1CLOUD_HOME") or Path.home() / ".r1cloud")


@dataclass
class Job:
    name: str
    status: str = "PENDING"
    infra: str = "local"
    accelerators: str = ""
    nodes: int = 1
    blueprint: str = ""
    created_at: float = field(default_factory=time.time)
    started_at: float | None = None
    ended_at: float | None = None
    pid: int | None = None
    pid_started: float | None = None  # the process's start time: tells a reused pid apart
    exit_code: int | None = None
    reason: str = ""
    stop_requested: bool = False
    attempts: int = 0
    kind: str = "train"  # or "serve": an OpenAI-compatible server
    command: list[str] = field(default_factory=list)  # what the supervisor runs (default: the trainer)
    url: str = ""  # a server's base URL
    model: str = ""  # a server's model: served name and where it comes from
    cloud: dict = field(default_factory=dict)  # a cloud job: {"managed", "job_id", "cluster"}
    price: float | None = None  # dollars an hour, all nodes (prices.hourly_price), when known
    spent: float = 0.0  # dollars over the attempts (a cloud job's launches) that ended, at the price

    def spent_by(self, now: float) -> float:
        """Dollars spent by `now`: the ended attempts' and this one's time at the price."""
        ran = max(0.0, now - self.started_at) if self.price and self.started_at else 0.0
        return self.spent + (self.price or 0.0) * ran / 3600

    def settle(self, now: float) -> None:
        """End this attempt: its time at the price joins what the job has spent."""
        self.spent, self.ended_at = self.spent_by(now), now

    def own(self) -> None:
        """Make this process the one the job lives by (`alive`): its supervisor, or its launcher."""
        self.pid, self.pid_started = os.getpid(), process_start_time(os.getpid())

    @property
    def remote(self) -> bool:
        """A cloud job (its state is SkyPilot's), whether or not SkyPilot has answered its launch yet."""
        return self.infra != "local"

    @property
    def launching(self) -> bool:
        """A cloud training job whose launch SkyPilot has not answered yet (no `cloud` record): its
        `pid` is the `r1cloud train` launching it."""
        return self.remote and self.kind == "train" and self.started_at is None and self.status in ACTIVE

    @property
    def dir(self) -> Path:
        return home() / "jobs" / self.name

    @property
    def log(self) -> Path:
        return self.dir / ("train.log" if self.kind == "train" else f"{self.kind}.log")


class JobExists(Exception):
    pass


class JobRunning(Exception):
    pass


class NoSuchJob(Exception):
    pass


class DamagedJob(NoSuchJob):
    """A job folder whose job.json cannot be read as a job record: (name, what is wrong)."""


STATUSES = (*ACTIVE, *TERMINAL)


def _wrong_fields(job: Job) -> list[str]:
    """The record's fields whose JSON types are not the record's (a hand-edited or foreign job.json)."""
    kinds = {"str": str, "int": int, "float": (int, float), "bool": bool, "dict": dict}
    bad = []
    for name, f in Job.__dataclass_fields__.items():
        value, kind = getattr(job, name), str(f.type).split(" |")[0].split("[")[0]
        if value is None and "None" in str(f.type):
            continue
        if kind == "list":
            ok = isinstance(value, list) and all(isinstance(x, str) for x in value)
        else:
            ok = isinstance(value, kinds.get(kind, object)) and not (
                kind in ("int", "float") and isinstance(value, bool)
            )
        if ok and kind in ("int", "float") and value is not None:  # a time, a pid, a count: in range
            top = 1e11 if name.endswith(("_at", "_started")) else 2**31 - 1
            ok = math.isfinite(value) and (0 if name != "exit_code" else -top) <= value <= top
        if not ok:
            bad.append(name)
    if not bad and job.status not in STATUSES:
        bad.append("status")
    return bad


def process_start_time(pid: int) -> float | None:
    """Seconds since boot when `pid` started (Linux /proc), or None if it does not exist."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        if fields[0] == "Z":  # a zombie has finished
            return None
        return int(fields[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def alive(job: Job) -> bool:
    if job.pid is None:
        return False
    started = process_start_time(job.pid)
    return started is not None and (job.pid_started is None or abs(started - job.pid_started) < 1.0)


class JobStore:
    def __init__(self, root: Path | None = None):
        self.root = (root or home()) / "jobs"

    def path(self, name: str) -> Path:
        """The job's folder; a name that is not a job name (a path, `..`) names no job in the store."""
        if not self.is_name(name):
            raise NoSuchJob(name)
        return self.root / name

    @staticmethod
    def is_name(name: str) -> bool:
        """Whether `name` could name a job here (a path or `..` never does)."""
        ok = bool(name) and "/" not in name and name not in (".", "..") and "\0" not in name
        return ok and len(name.encode()) <= 255

    def has(self, name: str) -> bool:
        """Whether a job named `name` exists (for telling a job from a path or a model id)."""
        return self.is_name(name) and (self.root / name / "job.json").exists()

    def create(self, job: Job) -> Job:
        self.root.mkdir(parents=True, exist_ok=True)
        try:
            self.path(job.name).mkdir()  # atomic: exactly one creator wins
        except FileExistsError as e:
            raise JobExists(job.name) from e
        self._write(job)
        return job

    def create_unique(self, job: Job) -> Job:
        """Create `job` under its name, or the first free of name-2, name-3, …"""
        base = job.name
        for candidate in self.candidates(base):
            job.name = candidate
            with contextlib.suppress(JobExists):
                return self.create(job)
        raise JobExists(base)

    @staticmethod
    def candidates(base: str) -> Iterator[str]:
        """name, name-2, name-3, … (job names are at most 63 characters)."""
        for i in range(1, 1000):
            suffix = "" if i == 1 else f"-{i}"
            yield base[: 63 - len(suffix)].rstrip("-") + suffix

    def free_name(self, base: str) -> str:
        """The name create_unique would take now."""
        return next((c for c in self.candidates(base) if not self.path(c).exists()), base)

    def remove(self, name: str) -> None:
        """Forget a job that never started (a launch that failed): nothing half-created is left."""
        shutil.rmtree(self.path(name), ignore_errors=True)

    def _write(self, job: Job) -> None:
        target = self.path(job.name) / "job.json"
        tmp = target.with_name(f".job.json.{os.getpid()}")
        tmp.write_text(json.dumps(asdict(job), indent=2))
        os.replace(tmp, target)

    def _read(self, name: str) -> Job:
        try:
            data = loads((self.path(name) / "job.json").read_bytes())
        except FileNotFoundError as e:
            raise NoSuchJob(name) from e
        except OSError as e:
            raise DamagedJob(name, f"job.json cannot be read ({getattr(e, 'strerror', None) or e})") from None
        except json.JSONDecodeError as e:
            raise DamagedJob(name, f"job.json is not valid JSON ({e.msg}, line {e.lineno})") from None
        except (ValueError, UnicodeDecodeError) as e:
            raise DamagedJob(name, f"job.json is not valid JSON ({str(e)[:80]})") from None
        if not isinstance(data, dict):
            raise DamagedJob(name, f"job.json holds a JSON {type(data).__name__}, not a job record")
        if data.get("name") != name:  # the folder's name is the job's: any other is not its record
            said = f"names {cut(repr(data['name']), 60)}, not {name!r}" if "name" in data else "has no name"
            raise DamagedJob(name, f"job.json {said}")
        job = Job(**{k: v for k, v in data.items() if k in Job.__dataclass_fields__})
        if bad := _wrong_fields(job):
            raise DamagedJob(name, f"job.json has {', '.join(bad)} of the wrong type or out of range")
        return job

    @contextlib.contextmanager
    def locked(self, name: str) -> Iterator[Job]:
        """Read-modify-write one job under its lock; the yielded record is written back."""
        if not (self.path(name) / "job.json").exists():
            raise NoSuchJob(name)
        with open(self.path(name) / ".lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            job = self._read(name)
            yield job
            self._write(job)

    def get(self, name: str) -> Job:
        job = self._read(name)

        # a local job lives as long as its supervisor; a cloud job's state is SkyPilot's
        # (jobs/remote.py) once its launch is answered, and until then its launcher's
        def dead(job: Job) -> bool:
            return (
                job.status in ACTIVE
                and (not job.remote or job.launching)
                and not alive(job)
                and (job.pid is not None or time.time() - job.created_at > 60)
            )

        if dead(job):
            with self.locked(name) as job:
                if dead(job):  # again under the lock: the launcher may have just been answered
                    job.status = "FAILED"
                    job.reason = launch_lost(name) if job.remote else DIED
                    job.settle(job.ended_at or time.time())
        return job

    def list(self) -> list[Job]:
        """Every job; one whose record is damaged is listed as DAMAGED with the reason."""
        if not self.root.exists():
            return []
        jobs = []
        for p in self.root.iterdir():
            if (p / "job.json").exists():
                try:
                    jobs.append(self.get(p.name))
                except DamagedJob as e:
                    jobs.append(Job(p.name, status="DAMAGED", reason=e.args[1], created_at=0.0))
                except (NoSuchJob, ValueError):
                    continue
        return sorted(jobs, key=lambda j: j.created_at)

    def latest(self) -> Job | None:
        """The job started last, leaving out damaged records (they have no time of their own)."""
        jobs = [j for j in self.list() if j.status != "DAMAGED"]
        return max(jobs, key=lambda j: j.started_at or j.created_at) if jobs else None
