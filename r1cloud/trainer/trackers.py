"""Where a run's numbers go. metrics.jsonl always (jobs, status, plot and resume read it); then each
`trainer.logger` entry through the tracker's own client: tensorboard, wandb, swanlab, mlflow. The
run is named `trainer.experiment_name` as EasyR1 names it (else after the job; `project_name` is the
project), the resolved config is logged once, every step's metrics go out under EasyR1's names, and
`val_generations_to_log` samples go out as a table where the tracker has one. A tracker's run id is
kept in the run folder, so a resumed job continues the same tracker run.

A tracker that cannot start is a TrackerError before the first step (never hours of silent loss);
one that fails later is reported once in the log and the run goes on (metrics.jsonl has it all).
When checkpoints go to a bucket, metrics.jsonl and the tracker ids are kept there too, so a job
that comes back on a new machine (a recovered preemption) keeps its curve and its tracker runs.

Why not accelerate's trackers (accelerate.tracking, 1.15): each tracker here is a few lines of its
client's own calls; what costs the lines is what accelerate leaves to its caller: a tracker that
fails is reported once and dropped while the others go on (accelerate's raise), the run id read
back and passed again on resume, TensorBoard's purge_step on resume, and the validation samples as
a table on tensorboard, swanlab and mlflow too (accelerate's log_table is wandb's and clearml's only).
"""

from __future__ import annotations

import json
import os
import random
import re
import time
from pathlib import Path

from r1cloud.core.records import flatten

IDS = "trackers.json"  # {tracker: run id}, for resuming the same tracker run
UPLOAD_EVERY = 60.0  # seconds between copies of metrics.jsonl to the bucket between checkpoints

# What each tracker needs to reach its service, and how to run it without one.
HINTS = {
    "wandb": "set WANDB_API_KEY (secrets: [WANDB_API_KEY]), or envs: {WANDB_MODE: offline}",
    "swanlab": "set SWANLAB_API_KEY (secrets: [SWANLAB_API_KEY]), or envs: {SWANLAB_MODE: offline}",
    "mlflow": "check MLFLOW_TRACKING_URI (and MLFLOW_TRACKING_TOKEN) in envs or secrets",
    "tensorboard": "pip install tensorboard",
}


class TrackerError(Exception):
    pass


def run_name(spec) -> str:
    """The run's name in every tracker: `trainer.experiment_name` as written (EasyR1's
    logger.py sends it to each), else the job's name."""
    return spec.trainer.experiment_name or spec.name


SECRET_WORDS = ("key", "token", "secret", "password", "credential")


def run_config(spec) -> dict:
    """The resolved spec for a tracker, with nothing secret: secrets and envs by name only (a value
    in envs may be a key put in the wrong place), a reward's kwargs whose names say key, token,
    secret or password masked (an LLM judge's API key), and no user:password in any URL."""
    config = spec.model_dump(mode="json")
    config["envs"] = sorted(config.get("envs", {}))
    kwargs = config["worker"]["reward"].get("reward_function_kwargs") or {}
    for k in kwargs:
        if any(w in k.lower() for w in SECRET_WORDS):
            kwargs[k] = "***"
    return _scrub(config)


def _scrub(value):
    if isinstance(value, dict):
        return {k: _scrub(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_scrub(v) for v in value]
    return _no_password(value) if isinstance(value, str) else value


def _no_password(text: str) -> str:
    """Every `scheme://user:password@host/…` in `text` without the user and password."""
    return re.sub(r"([a-z][a-z0-9+.-]*://)[^/@\s]+@", r"\1", text)


class TensorBoard:
    def __init__(self, spec, run_dir: Path, run_id: str | None):
        from torch.utils.tensorboard import SummaryWriter

        base = os.environ.get("TENSORBOARD_DIR")
        where = Path(base) / spec.trainer.project_name / run_name(spec) if base else run_dir / "tensorboard"
        self.writer = SummaryWriter(str(where))
        self.id, self.where = None, str(where)
        self.reopen = lambda step: SummaryWriter(str(where), purge_step=step)
        if run_id is None:
            self.writer.add_text("config", "```\n" + json.dumps(run_config(spec), indent=2) + "\n```", 0)

    def log(self, step: int, metrics: dict) -> None:
        for k, v in metrics.items():
            self.writer.add_scalar(k, v, step)
        self.writer.flush()

    def table(self, step: int, rows: list[dict]) -> None:
        cells = ["| prompt | response | ground truth | score |", "|---|---|---|---|"]
        cells += [
            "| " + " | ".join(str(r[k]).replace("|", "\\|").replace("\n", " ") for k in COLUMNS[1:]) + " |"
            for r in rows
        ]
        self.writer.add_text("val/generations", "\n".join(cells), step)

    def resumed(self, step: int) -> None:
        """A run resumed from step `step`: what an earlier attempt logged after it is redone, and
        TensorBoard's readers drop the earlier points from `step + 1` on (its purge_step)."""
        self.writer.close()
        self.writer = self.reopen(step + 1)

    def close(self, status: str) -> None:
        self.writer.close()


class WandB:
    def __init__(self, spec, run_dir: Path, run_id: str | None):
        import wandb

        self.wandb = wandb
        self.run = wandb.init(
            project=spec.trainer.project_name,
            name=run_name(spec),
            id=run_id,
            resume="allow",
            config=run_config(spec),
            dir=None if os.environ.get("WANDB_DIR") else str(run_dir),
        )
        self.id, self.rows = self.run.id, []
        self.where = f"{self.run.settings.mode} run {self.run.id} in {self.run.dir}"

    def log(self, step: int, metrics: dict) -> None:
        self.run.log(metrics, step=step)

    def table(self, step: int, rows: list[dict]) -> None:
        # EasyR1's shape: one growing table, re-logged each validation (a logged table is frozen)
        self.rows += [[r[k] for k in COLUMNS] for r in rows]
        self.run.log({"val/generations": self.wandb.Table(columns=list(COLUMNS), data=self.rows)}, step=step)

    def close(self, status: str) -> None:
        self.run.finish(exit_code=0 if status == "FINISHED" else 1)


class SwanLab:
    def __init__(self, spec, run_dir: Path, run_id: str | None):
        import swanlab

        self.swanlab = swanlab
        self.run = swanlab.init(
            project=spec.trainer.project_name,
            name=run_name(spec),
            config=run_config(spec),
            log_dir=os.environ.get("SWANLAB_DIR") or str(run_dir / "swanlog"),
            mode=os.environ.get("SWANLAB_MODE") or None,
            **({"id": run_id, "resume": "allow"} if run_id else {}),
        )
        self.id = self.run.id
        self.where = f"run {self.id}"

    def log(self, step: int, metrics: dict) -> None:
        self.swanlab.log(metrics, step=step)

    def table(self, step: int, rows: list[dict]) -> None:
        texts = [
            self.swanlab.Text(
                f"{r['prompt']}\n---\n{r['response']}",
                caption=f"truth {r['ground_truth']} · score {r['score']}",
            )
            for r in rows
        ]
        self.swanlab.log({"val/generations": texts}, step=step)

    def close(self, status: str) -> None:
        self.swanlab.finish(state={"FINISHED": "success", "KILLED": "aborted"}.get(status, "crashed"))


class MLflow:
    def __init__(self, spec, run_dir: Path, run_id: str | None):
        from mlflow import MlflowClient
        from mlflow.entities import Param

        # without a tracking server, a database in the run folder (mlflow ui --backend-store-uri …)
        uri = os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{run_dir.resolve()}/mlflow.db"
        self.client = client = MlflowClient(tracking_uri=uri)
        if run_id is not None:
            try:
                client.update_run(run_id, status="RUNNING")
            except Exception:  # not in this store (a run-folder database left on a lost machine)
                run_id = None
        if run_id is None:
            project = os.environ.get("MLFLOW_EXPERIMENT_NAME") or spec.trainer.project_name
            exp = client.get_experiment_by_name(project)
            exp_id = exp.experiment_id if exp else client.create_experiment(project)
            run_id = client.create_run(exp_id, run_name=run_name(spec)).info.run_id
            # (the client splits a batch into its server's limits per request)
            params = [Param(k, str(v)[:6000]) for k, v in flatten(run_config(spec), sep=".").items()]
            client.log_batch(run_id, params=params)
        self.id, self.where = run_id, f"run {run_id} at {_no_password(uri)}"

    def log(self, step: int, metrics: dict) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(self.id, metrics=[Metric(k, float(v), now, step) for k, v in metrics.items()])

    def table(self, step: int, rows: list[dict]) -> None:
        data = {k: [r[k] for r in rows] for k in COLUMNS}
        self.client.log_table(self.id, data, f"val_generations/step_{step:06d}.json")

    def close(self, status: str) -> None:
        self.client.set_terminated(self.id, status=status)


TRACKERS = {"tensorboard": TensorBoard, "wandb": WandB, "swanlab": SwanLab, "mlflow": MLflow}
COLUMNS = ("step", "prompt", "response", "ground_truth", "score")


def val_samples(batch, prompt_set, tokenizer, k: int) -> list[dict]:
    """`k` validation samples for the trackers, the same prompts every time (a fixed-seed shuffle,
    as EasyR1's val_generations_to_log)."""
    index = batch.index.tolist()
    picked = sorted(range(len(index)), key=lambda i: (index[i], i))
    random.Random(42).shuffle(picked)
    out = []
    for i in picked[: max(k, 0)]:
        p = prompt_set.prompts[index[i]]
        prompt = batch.prompt_ids[i, : int(batch.prompt_len[i])].tolist()  # an episode's own
        response = batch.response_ids[i, : int(batch.response_len[i])].tolist()
        turns = batch.loss_mask is not None  # an episode's turns keep their chat template's headers
        out.append(
            {
                "prompt": tokenizer.decode(prompt, skip_special_tokens=True),
                "response": tokenizer.decode(response, skip_special_tokens=not turns),
                "ground_truth": p.ground_truth,
                "score": float(batch.scores["overall"][i]),
            }
        )
    return out


def unframed(prompts: list[str], tail: int = 120) -> list[str]:
    """The prompts as the log shows them: the whole lines every one of them starts and ends with
    (a chat template's system turn and headers) cut to '…', so each line shows its question. A
    prompt with nothing to compare with (alone, or the same as the others): its last `tail` characters."""
    head = os.path.commonprefix(prompts)
    head = head[: head.rfind("\n") + 1]
    backwards = [p[len(head) :][::-1] for p in prompts]
    end = os.path.commonprefix(backwards)
    end = end[: end.rfind("\n") + 1]
    middles = [b[len(end) :][::-1] for b in backwards]
    if len(prompts) < 2 or not all(m.strip() for m in middles):
        return [p if len(p) <= tail else "…" + p[-tail:] for p in prompts]
    return [("…" if head else "") + m + ("…" if end else "") for m in middles]


class Trackers:
    def __init__(self, spec, run_dir: Path, log, mirror: str | None = None):
        self.spec, self.run_dir, self.log = spec, Path(run_dir), log
        self.names = tuple(spec.trainer.logger)
        self.open: dict[str, object] = {}
        self.broken: set[str] = set()
        self.mirror, self.uploaded = None, float("-inf")
        if mirror:  # a bucket URL: the checkpoints' root
            from r1cloud.checkpoint.store import filesystem

            self.mirror = filesystem(mirror)

    def start(self) -> None:
        """Start every tracker the blueprint names, or raise TrackerError naming the first that fails."""
        if self.mirror:  # a new machine: what the bucket kept comes down first
            fs, root = self.mirror
            for name in ("metrics.jsonl", IDS):
                if not (self.run_dir / name).exists() and fs.exists(f"{root}/{name}"):
                    fs.get_file(f"{root}/{name}", str(self.run_dir / name))
        ids_file = self.run_dir / IDS
        prior = json.loads(ids_file.read_text()) if ids_file.exists() else {}
        ids = dict(prior)
        for name in self.names:
            if name not in TRACKERS:
                continue
            try:
                tracker = TRACKERS[name](self.spec, self.run_dir, prior.get(name))
            except ImportError as e:
                raise TrackerError(
                    f"trainer.logger: {name} is not installed ({e.name}): pip install '{name}', "
                    f"or remove {name} from trainer.logger"
                ) from None
            except Exception as e:  # the client's own error, whatever its type: say it in one line
                first = _no_password((str(e).strip().splitlines() or [type(e).__name__])[0])
                raise TrackerError(
                    f"trainer.logger: {name} could not start ({type(e).__name__}: {first}); {HINTS[name]}"
                ) from None
            self.open[name] = tracker
            ids[name] = tracker.id
            verb = "continues" if prior.get(name) and prior[name] == tracker.id else "logs to"
            self.log(f"[logger] {name} {verb} {tracker.where}")
        ids_file.write_text(json.dumps({k: v for k, v in ids.items() if v}))
        self._upload(IDS)

    def resumed(self, step: int) -> None:
        """The run continues after step `step`; a tracker that can forget later points does."""
        for name, tracker in self.open.items():
            if hasattr(tracker, "resumed") and name not in self.broken:
                tracker.resumed(step)

    def record(self, step: int, metrics: dict, saved: bool = False) -> None:
        """One step's line; the bucket's copy is refreshed at each checkpoint (`saved`: a recovery
        resumes from one) and at most once a minute in between, not rewritten every step."""
        with open(self.run_dir / "metrics.jsonl", "a") as f:
            f.write(json.dumps({"step": step, **metrics}) + "\n")
        if saved or time.monotonic() - self.uploaded >= UPLOAD_EVERY:
            self._upload("metrics.jsonl")
        self._each("log", step, metrics)

    def _upload(self, name: str) -> None:
        if not self.mirror or "bucket" in self.broken or not (self.run_dir / name).exists():
            return
        fs, root = self.mirror
        try:
            fs.put_file(str(self.run_dir / name), f"{root}/{name}")
            self.uploaded = time.monotonic()
        except Exception as e:  # the checkpoints' own writes will say more if the bucket is gone
            self.broken.add("bucket")
            self.log(f"[logger] cannot copy {name} to the bucket ({type(e).__name__}: {e}); the run goes on")

    def generations(self, step: int, rows: list[dict]) -> None:
        """Validation samples: {prompt, response, ground_truth, score}; `step` is added."""
        rows = [{"step": step, **r} for r in rows]
        if not rows:
            return
        if "file" in self.names:
            with open(self.run_dir / "generations.jsonl", "a") as f:
                f.writelines(json.dumps(r) + "\n" for r in rows)
        if "console" in self.names:
            for i, (r, prompt) in enumerate(zip(rows, unframed([r["prompt"] for r in rows]), strict=True), 1):
                self.log(
                    f"[val] sample {i}: {prompt!r} -> {r['response']!r} "
                    f"(ground truth {r['ground_truth']!r}, score {r['score']:.3f})"
                )
        self._each("table", step, rows)

    def close(self, status: str = "FINISHED") -> None:
        """status: FINISHED, FAILED or KILLED (MLflow's names)."""
        self._upload("metrics.jsonl")
        self._each("close", status)
        self.open.clear()

    def _each(self, method: str, *args) -> None:
        for name, tracker in self.open.items():
            if name in self.broken:
                continue
            try:
                getattr(tracker, method)(*args)
            except Exception as e:  # a tracker that fails mid-run must not end hours of training
                self.broken.add(name)
                self.log(
                    f"[logger] {name} failed ({type(e).__name__}: {e}); it gets nothing more this run, "
                    "metrics.jsonl keeps every step"
                )
