"""What a run will cost before it starts: its time on each accelerator it could run on (costs/estimate.py)
and dollars from SkyPilot's catalog (costs/prices.py), cheapest first, with the assumptions in one line.

Calibration: when a local run ends (finished, or stopped), its supervisor measures it (`measure`:
the FLOP/s each device achieved in generation and in training, the mean response and prompt
lengths, the seconds per validation and those no step accounts for) into the store's
`throughput.jsonl`; the next estimate on the same device kind uses the run nearest in model size
and names it."""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

from r1cloud.core.accelerators import accelerator_options
from r1cloud.core.budget import usd
from r1cloud.costs import estimate as est
from r1cloud.costs import prices
from r1cloud.spec import load_resolved

CALIBRATION = "throughput.jsonl"
ALTERNATIVES = ("H100", "A100-80GB", "H200")  # offered beside the blueprint's own choice
SHOWN = 10  # rows of the table
HERE = "this machine"  # a local run on no named accelerator: the runs calibrated here


def sizes(spec) -> tuple[est.Model | None, est.Model | None]:
    """The actor's size and the critic's (its own model_path, else the actor's)."""
    actor = spec.worker.actor.model.model_path
    return est.model_size(actor), est.model_size(spec.worker.critic.model.model_path or actor)


def measure(run_dir: Path, spec, device: str, devices: int, wall_s: float, after: int = 0) -> dict | None:
    """A finished run's achieved speed, from its metrics.jsonl (steps after `after`, where it
    resumed); None under 2 steps (the first step's warm-up would be most of the figure) or for a
    model of unknown size. Overhead is the wall time no step or validation accounts for: start-up
    (Ray, the model, the engine), checkpoints, shutdown."""
    if spec.async_training.enable:  # its timing_s/gen is the wait for samples, not generation
        return None
    m, critic = sizes(spec)
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    lines = [x for x in lines if x.get("step", 0) > after or (after == 0 and x.get("step") == 0)]
    steps = [x for x in lines if "timing_s/step" in x and "timing_s/gen" in x]
    if m is None or len(steps) < 2:
        return None
    d = spec.data
    gen_s = train_s = gen_f = train_f = 0.0
    for x in steps[1:]:  # the first step pays for warm-up
        resp = x.get("response_length/mean", 0.0) / d.max_response_length
        prompt = x.get("prompt_length/mean", 0.0) / d.max_prompt_length
        g, t = est.step_flops(m, est.work_of(spec, critic, resp, prompt))
        gen_f, train_f = gen_f + g, train_f + t
        gen_s += x["timing_s/gen"]
        train_s += x["timing_s/step"] - x["timing_s/gen"]
    vals = [x["timing_s/validation"] for x in lines if "timing_s/validation" in x]
    accounted = sum(x.get(k, 0.0) for x in lines for k in ("timing_s/step", "timing_s/validation"))
    mean = lambda key: sum(x.get(key, 0.0) for x in steps) / len(steps)  # noqa: E731
    return {
        "device": device,
        "devices": devices,
        "params": m.params,
        "model": spec.worker.actor.model.model_path,
        "gen_flops": gen_f / max(gen_s, 1e-9) / devices,
        "train_flops": train_f / max(train_s, 1e-9) / devices,
        "response_fraction": mean("response_length/mean") / d.max_response_length,
        "prompt_fraction": mean("prompt_length/mean") / d.max_prompt_length,
        "validation_s": sum(vals) / len(vals) if vals else 0.0,
        "overhead_s": max(0.0, wall_s - accounted),
        "steps": len(steps),
        "when": time.time(),
    }


def calibrate(home: Path, run_dir: Path, job: str, wall_s: float) -> dict | None:
    """Append a finished local run's measured speed to the store's calibration file."""
    info = json.loads((run_dir / "trainer.json").read_text())
    spec = load_resolved(run_dir / "spec.yaml")
    device = est.device_kind(info.get("device", "cpu"))
    got = measure(run_dir, spec, device, info["workers"], wall_s, info.get("resumed_from", 0))
    if got:
        with open(home / CALIBRATION, "a") as f:
            f.write(json.dumps({"job": job, "local": True, **got}) + "\n")
    return got


def _speed(r: dict, device: str) -> est.Speed:
    """A calibration line as a Speed; ValueError when any field is missing or not a finite number."""
    positive = ("params", "gen_flops", "train_flops")
    rest = ("response_fraction", "prompt_fraction", "overhead_s", "validation_s")  # Speed's, in order
    got = {k: float(r[k]) for k in (*positive, *rest, "when")}
    if not all(math.isfinite(v) for v in got.values()) or min(got[k] for k in positive) <= 0:
        raise ValueError("not a measurement")
    source = f"calibrated by job {r['job']} ({r['model']}, {int(r['devices'])}× {device})"
    return est.Speed(got["gen_flops"], got["train_flops"], source, *(got[k] for k in rest))


def calibrated(home: Path | None, device: str | None, params: float) -> est.Speed | None:
    """The speed of the finished run nearest in model size (the latest of equals) on this device
    kind, or (device None) on this machine; lines that are not whole measurements are skipped."""
    path = home / CALIBRATION if home else None
    if not path or not path.is_file():
        return None
    runs = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            r = json.loads(line)
            if r.get("local") if device is None else str(r["device"]).upper() == device.upper():
                speed = _speed(r, str(r["device"]))
                runs.append((abs(math.log(float(r["params"]) / params)), -float(r["when"]), speed))
        except (ValueError, KeyError, TypeError, AttributeError):
            continue  # a damaged or older line: the others still count
    return min(runs, key=lambda x: x[:2])[2] if runs else None


@dataclass
class Row:
    where: str  # H100:8 on AWS (spot)
    step_s: float
    total_s: float | None
    dollars_per_hour: float | None = None

    @property
    def dollars(self) -> float | None:
        if self.dollars_per_hour is None or self.total_s is None:
            return None
        return self.dollars_per_hour * self.total_s / 3600


@dataclass
class Estimate:
    rows: list[Row] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # the assumptions, and what is missing


def plan(spec, home: Path | None, with_prices: bool = True) -> Estimate:
    """Time (and dollars, where the catalog has prices) of this blueprint on its own accelerators
    and the alternatives, cheapest first."""
    from r1cloud.validate.summary import step_count  # loads the schema (pydantic): not at start-up

    out = Estimate()
    m, critic = sizes(spec)
    if m is None:
        out.notes.append(
            f"no estimate: the size of {spec.worker.actor.model.model_path!r} is unknown here "
            "(no config.json in its folder or the Hugging Face cache, no size in its name)"
        )
        return out
    steps, how = step_count(spec)
    t, r = spec.trainer, spec.resources
    count, nodes = (
        t.n_gpus_per_node + spec.worker.rollout.n_gpus_per_node * spec.async_training.enable,
        t.nnodes,
    )
    kinds = [n for n, _ in accelerator_options(r.accelerators)] if r.accelerators else []
    local = r.infra == "local"
    if local and not kinds:
        kinds = [HERE]
    if not local or r.accelerators:
        kinds += [k for k in ALTERNATIVES if k.upper() not in {x.upper() for x in kinds}]
    vals = validations(spec, steps) if steps else 0
    speeds = {}
    for kind in kinds:
        found = one_step(spec, home, kind, m, critic)
        if found is None:
            out.notes.append(
                f"{kind}: no time estimate until a run on it finishes (each finished run calibrates the next "
                "estimate; scripts/quickstart is one)"
            )
            continue
        step, speed = found
        total = steps * step + speed.overhead_s + vals * speed.validation_s if steps else None
        speeds[kind] = (step, total, speed)
    if speeds:
        sources = sorted({s.source for _, _, s in speeds.values()})
        kind, (_, _, s) = next(iter(speeds.items()))
        if spec.rollout_size:
            out.notes.append(overlap(spec, m, critic, s, kind))
        out.notes.append(
            f"assumes {'; '.join(sources)}; responses {s.response_fraction:.0%} of {spec.data.max_response_length} "
            f"tokens, prompts {s.prompt_fraction:.0%} of {spec.data.max_prompt_length}; "
            f"{m.params / 1e9:.3g}B parameters (from {m.source})"
        )
    if not steps:
        out.notes.append(
            f"in all: unknown until the data loads ({how.removesuffix(', known when the data loads')})"
        )
    wanted = [(k, count) for k in kinds if k != HERE] if with_prices else []
    offers, why = prices.offers(wanted) if wanted else ([], "")
    if why:
        out.notes.append(why)
    for kind, (step, total, _) in speeds.items():
        best: dict[tuple[str, bool], tuple[float, str]] = {}  # (cloud, spot) -> the cheapest offer
        for o in (o for o in offers if o.accelerator.upper() == kind.upper()):
            for spot, price in ((False, o.price), (True, o.spot_price)):
                cheaper = price and price < best.get((o.cloud, spot), (math.inf,))[0]
                if cheaper and not (spot and price == o.price):  # a "spot" price equal to on demand: one row
                    best[o.cloud, spot] = (price, o.region)
        for (cloud, spot), (price, region) in best.items():
            out.rows.append(
                Row(f"{kind}:{count} {cloud} {region}" + " spot" * spot, step, total, price * nodes)
            )
        if not best:  # no price for it here: time only
            out.rows.append(
                Row(f"this machine, {count} worker slots" if kind == HERE else f"{kind}:{count}", step, total)
            )
    # cheapest first: dollars a step order the same as dollars in all (the steps are the same)
    out.rows.sort(key=lambda x: (x.dollars_per_hour is None, (x.dollars_per_hour or 0) * x.step_s, x.step_s))
    if len(out.rows) > SHOWN:
        out.notes.append(
            f"and {len(out.rows) - SHOWN} dearer offers (each cloud's cheapest, on demand and spot)"
        )
        out.rows = out.rows[:SHOWN]
    return out


def overlap(spec, m: est.Model, critic, speed: est.Speed, kind: str) -> str:
    """Asynchronous training's expected overlap: each pool's seconds a step, against the synchronous
    step on all the devices."""
    w = est.work_of(spec, critic, speed.response_fraction, speed.prompt_fraction)
    train, rollout = spec.world_size, spec.rollout_size
    gen_s, train_s = est.phase_seconds(m, w, speed, train, rollout)
    sync = est.step_seconds(m, w, speed, train + rollout)
    return (
        f"asynchronous on {kind}: generation {gen_s:.3g} s a step on {rollout}, training {train_s:.3g} s on "
        f"{train}, overlapped: {max(gen_s, train_s):.3g} s against {sync:.3g} s synchronous on all "
        f"{train + rollout} (FLOPs alone: a long tail's or tools' waits, which overlap hides, are not in it)"
    )


def one_step(spec, home: Path | None, kind: str, m: est.Model, critic: est.Model | None):
    """(seconds, speed) of one step on `kind` (HERE: this machine), or None with no speed for it."""
    speed = calibrated(home, None if kind == HERE else kind, m.params) or est.default_speed(kind)
    if speed is None:
        return None
    w = est.work_of(spec, critic, speed.response_fraction, speed.prompt_fraction)
    return est.step_seconds(m, w, speed, spec.world_size, spec.rollout_size), speed


def step_seconds(spec, home: Path | None) -> float | None:
    """One step's estimate on the job's own accelerators (the slowest of its alternatives)."""
    m, critic = sizes(spec)
    r = spec.resources
    kinds = [n for n, _ in accelerator_options(r.accelerators)] if r.accelerators else [HERE]
    found = [one_step(spec, home, k, m, critic) for k in kinds] if m else []
    return max((f[0] for f in found if f), default=None)


def validations(spec, steps: int) -> int:
    """How many times the trainer validates in `steps` steps (driver.fit: before the first step if
    asked, every val_freq steps, and after the last; never without a validation set)."""
    t = spec.trainer
    if not spec.data.val_files:
        return 0
    every = steps // t.val_freq if t.val_freq > 0 else 0
    return bool(t.val_before_train) + every + (t.val_freq <= 0 or steps % t.val_freq != 0)


def check_budget(spec, step_s: float | None) -> tuple[float | None, str | None]:
    """(the hourly price, None) when `resources.max_cost` can be kept, else (price, the problem).
    `step_s`: one step's estimate on the job's accelerator, if there is one."""
    cap = spec.resources.max_cost
    if cap is None:
        return None, None
    price, where = prices.hourly_price(spec)
    if price is None:
        return None, f"resources.max_cost needs the job's hourly price: {where}"
    one = price * (step_s or 0) / 3600
    if one > cap:
        return price, (
            f"resources.max_cost {usd(cap)} does not pay for one step: about {usd(one)} a step on "
            f"{where}; raise it (--max-cost), or use fewer or cheaper accelerators"
        )
    return price, None
