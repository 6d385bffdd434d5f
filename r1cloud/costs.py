"""What a run will cost before it starts: its time on each accelerator it could run on (estimate.py)
and dollars from SkyPilot's catalog (prices.py), cheapest first, with the assumptions in one line.

Calibration: each finished local run leaves `throughput.json` in its folder (`measure`: the FLOP/s
each device achieved in generation and in training, the mean response and prompt lengths, the
seconds before the first step and per validation); the job's supervisor appends it to the store's
`throughput.jsonl`, and the next estimate for the same device kind uses the run of the nearest
model size and says which."""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

from . import estimate as est

CALIBRATION = "throughput.jsonl"
ALTERNATIVES = ("H100", "A100-80GB", "H200")  # offered beside the blueprint's own choice
SHOWN = 10  # rows of the table


def measure(run_dir: Path, spec, device: str, devices: int, wall_s: float, after: int = 0) -> dict | None:
    """A finished run's achieved speed, from its metrics.jsonl (steps after `after`, where it
    resumed); None under 2 steps (the first step's warm-up would be most of the figure) or for a
    model of unknown size. Overhead is the wall time no step or validation accounts for: start-up
    (Ray, the model, the engine), checkpoints, shutdown."""
    m = est.model_size(spec.worker.actor.model.model_path)
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    lines = [x for x in lines if x.get("step", 0) > after or (after == 0 and x.get("step") == 0)]
    steps = [x for x in lines if "timing_s/step" in x and "timing_s/gen" in x]
    if m is None or len(steps) < 2:
        return None
    critic = est.model_size(spec.worker.critic.model.model_path or spec.worker.actor.model.model_path)
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
    from .spec import load_spec

    info = json.loads((run_dir / "trainer.json").read_text())
    spec = load_spec(run_dir / "spec.yaml", [], check_files=False).spec
    device = est.device_kind(info.get("device", "cpu"))
    got = measure(run_dir, spec, device, info["workers"], wall_s, info.get("resumed_from", 0))
    if got:
        with open(home / CALIBRATION, "a") as f:
            f.write(json.dumps({"job": job, **got}) + "\n")
    return got


def calibrated(home: Path | None, device: str, params: float) -> est.Speed | None:
    """The speed of the finished run on this device kind nearest in model size (the latest of equals)."""
    path = home / CALIBRATION if home else None
    if not path or not path.is_file():
        return None
    runs = []
    for line in path.read_text().splitlines():
        try:
            r = json.loads(line)
            if r["device"].upper() == device.upper() and r["gen_flops"] > 0 and r["train_flops"] > 0:
                runs.append(r)
        except (ValueError, KeyError, TypeError, AttributeError):
            continue  # a damaged line: the others still count
    if not runs:
        return None
    best = min(runs, key=lambda r: (abs(math.log(r["params"] / params)), -r["when"]))
    return est.Speed(
        best["gen_flops"],
        best["train_flops"],
        f"calibrated by job {best['job']} ({best['model']}, {best['devices']}× {device})",
        best["response_fraction"],
        best["prompt_fraction"],
        best["overhead_s"],
        best["validation_s"],
    )


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
    from .spec.models import accelerator_options
    from .spec.summary import total_steps

    out = Estimate()
    m = est.model_size(spec.worker.actor.model.model_path)
    if m is None:
        out.notes.append(
            f"no estimate: the size of {spec.worker.actor.model.model_path!r} is unknown here "
            "(no config.json in its folder or the Hugging Face cache, no size in its name)"
        )
        return out
    steps, _ = total_steps(spec)
    t, r = spec.trainer, spec.resources
    count, nodes = t.n_gpus_per_node, t.nnodes
    kinds = [n for n, _ in accelerator_options(r.accelerators)] if r.accelerators else []
    local = r.infra == "local"
    if local and not kinds:
        kinds = ["cpu"]
    if not local or r.accelerators:
        kinds += [k for k in ALTERNATIVES if k not in kinds]
    critic = est.model_size(spec.worker.critic.model.model_path or spec.worker.actor.model.model_path)
    vals = (steps // t.val_freq if steps and t.val_freq > 0 else 0) + bool(t.val_before_train)
    speeds = {}
    for kind in kinds:
        speed = calibrated(home, kind, m.params) or est.default_speed(kind)
        if speed is None:
            what = "this machine's CPU" if kind == "cpu" else kind
            out.notes.append(
                f"{what}: no time estimate until a run on it finishes (each finished run calibrates the next "
                "estimate; scripts/quickstart is one)"
            )
            continue
        w = est.work_of(spec, critic, speed.response_fraction, speed.prompt_fraction)
        step = est.step_seconds(m, w, speed, count * nodes)
        total = steps * step + speed.overhead_s + vals * speed.validation_s if steps else None
        speeds[kind] = (step, total, speed)
    sources = sorted({s.source for _, _, s in speeds.values()})
    first = next(iter(speeds.values()), None)
    if first:
        s = first[2]
        out.notes.append(
            f"assumes {'; '.join(sources)}; responses {s.response_fraction:.0%} of {spec.data.max_response_length} "
            f"tokens, prompts {s.prompt_fraction:.0%} of {spec.data.max_prompt_length}; "
            f"{m.params / 1e9:.3g}B parameters (from {m.source})"
        )
    if not steps:
        out.notes.append(f"total: unknown until the data loads ({total_steps(spec)[1]}); per step only")
    offers, why = ([], "") if not with_prices else _offers(kinds, count)
    if why:
        out.notes.append(why)
    for kind, (step, total, _) in speeds.items():
        mine = [o for o in offers if o.accelerator.upper() == kind.upper()]
        if not mine:
            out.rows.append(
                Row(f"{kind}:{count}" + (" (this machine)" if kind == "cpu" else ""), step, total)
            )
        best: dict[tuple[str, bool], tuple[float, str]] = {}  # (cloud, spot) -> the cheapest offer
        for o in mine:
            for spot, price in ((False, o.price), (True, o.spot_price)):
                cheaper = price and price < best.get((o.cloud, spot), (math.inf,))[0]
                if cheaper and not (spot and price == o.price):  # a "spot" price equal to on demand: one row
                    best[o.cloud, spot] = (price, o.region)
        for (cloud, spot), (price, region) in best.items():
            out.rows.append(
                Row(f"{kind}:{count} {cloud} {region}" + " spot" * spot, step, total, price * nodes)
            )
    # cheapest first: dollars a step order the same as dollars in all (the steps are the same)
    out.rows.sort(key=lambda x: (x.dollars_per_hour is None, (x.dollars_per_hour or 0) * x.step_s, x.step_s))
    if len(out.rows) > SHOWN:
        out.notes.append(
            f"and {len(out.rows) - SHOWN} dearer offers (each cloud's cheapest, on demand and spot)"
        )
        out.rows = out.rows[:SHOWN]
    return out


def _offers(kinds: list[str], count: int):
    from . import prices

    wanted = [(k, count) for k in kinds if k != "cpu"]
    return prices.offers(wanted) if wanted else ([], "")
