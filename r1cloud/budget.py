"""A job's budget: `resources.max_cost` dollars at the job's hourly price.

The price is SkyPilot's catalog price (prices.py) of the accelerators the job names, all nodes
counted: the cheapest offer among the clouds it may run on, spot when `resources.use_spot`. `train`
looks it up at launch and keeps it in the job record; the trainer gets it in `R1CLOUD_PRICE`, with
the spend of the job's earlier attempts (`R1CLOUD_SPENT`) and when this one started
(`R1CLOUD_STARTED`, epoch seconds). After each step it projects the spend at the end of the next
one from the last step's time; when that passes the cap it saves a checkpoint and exits with
`EXIT`, which the job records as BUDGET_REACHED. `validate` refuses a cap that one step's
estimate (costs.plan) already passes, and a cap with no price to count it by.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass

EXIT = 75  # the trainer's exit code when the budget stops it (EX_TEMPFAIL: more budget, then resume)
STATUS = "BUDGET_REACHED"
PRICE, SPENT, STARTED = "R1CLOUD_PRICE", "R1CLOUD_SPENT", "R1CLOUD_STARTED"


def usd(x: float) -> str:
    return f"${x:,.2f}" if x >= 1 else f"${x:.4f}"


@dataclass(frozen=True)
class Budget:
    cap: float  # dollars for the whole job, all attempts
    price: float  # dollars an hour, all nodes
    spent_before: float = 0.0
    started: float = 0.0

    def spent(self, now: float | None = None) -> float:
        return self.spent_before + self.price * ((now or time.time()) - self.started) / 3600

    def stop_line(self, step_s: float, now: float | None = None) -> str | None:
        """The reason to stop now, or None when the next step (`step_s` seconds) fits the cap."""
        spent = self.spent(now)
        after = spent + self.price * step_s / 3600
        if after <= self.cap:
            return None
        return (
            f"budget reached: {usd(spent)} spent of {usd(self.cap)} (resources.max_cost, at "
            f"{usd(self.price)}/hour); the next step would bring it to {usd(after)}"
        )

    @classmethod
    def from_env(cls, cap: float | None, env=os.environ) -> Budget | None:
        """The trainer's budget: None without a cap. A cap with no price (the trainer started by
        hand, not by `r1cloud train`) is an error: it would be a key accepted and ignored."""
        if cap is None:
            return None
        try:
            price = float(env[PRICE])
            spent, started = float(env.get(SPENT) or 0), float(env.get(STARTED) or time.time())
            if not all(map(math.isfinite, (price, spent, started))) or price <= 0:
                raise ValueError
        except (KeyError, ValueError):
            raise ValueError(
                f"resources.max_cost is set, but {PRICE} (dollars an hour) is not a price: "
                "`r1cloud train` looks it up; to run the trainer by hand, set it or drop max_cost"
            ) from None
        if spent >= cap:
            raise ValueError(
                f"this job has already spent {usd(spent)} of its {usd(cap)} (resources.max_cost): "
                "resume it with a higher cap (--max-cost)"
            )
        return cls(cap, price, spent, started)


def hourly_price(spec) -> tuple[float | None, str]:
    """The job's price an hour (all nodes) and where it comes from; or None and why not."""
    from . import prices
    from .spec.models import accelerator_options

    r = spec.resources
    if not r.accelerators:
        return None, "the job names no accelerator to price (resources.accelerators, or --gpu)"
    kinds = accelerator_options(r.accelerators)
    cloud, _, region = r.infra.lower().partition("/")
    region = (r.region or region.split("/")[0]).lower()
    if cloud in ("k8s", "kubernetes", "ssh"):
        return None, f"{cloud} has no catalog price (SkyPilot prices clouds only)"
    found, why = prices.offers(kinds, None if cloud == "local" else [cloud])
    cheapest: dict[tuple[str, int], tuple[float, str]] = {}  # each alternative's cheapest offer
    wanted = {(k.upper(), n) for k, n in kinds}
    for o in found:
        price, key = (o.spot_price if r.use_spot else o.price), (o.accelerator.upper(), o.count)
        here = not region or o.region.lower() == region
        if key in wanted and here and price and price < cheapest.get(key, (math.inf,))[0]:
            cheapest[key] = (price, f"{o.accelerator}:{o.count} {o.cloud} {o.region}" + " spot" * r.use_spot)
    if not cheapest:
        where = f" in {region}" if region else ""
        return (
            None,
            why or f"SkyPilot's catalog has no {'spot ' * r.use_spot}price for {r.accelerators}{where}",
        )
    best = max(cheapest.values())  # alternatives: the job may land on the dearest of them
    nodes = spec.trainer.nnodes
    return best[0] * nodes, f"{best[1]}, {usd(best[0])}/hour" + f" × {nodes} nodes" * (nodes > 1)


def check(spec, step_s: float | None) -> tuple[float | None, str | None]:
    """(the hourly price, None) when `resources.max_cost` can be kept, else (price, the problem).
    `step_s`: one step's estimate on the job's accelerator, if there is one."""
    cap = spec.resources.max_cost
    if cap is None:
        return None, None
    price, where = hourly_price(spec)
    if price is None:
        return None, f"resources.max_cost needs the job's hourly price: {where}"
    one = price * (step_s or 0) / 3600
    if one > cap:
        return price, (
            f"resources.max_cost {usd(cap)} does not pay for one step: about {usd(one)} a step on "
            f"{where}; raise it (--max-cost), or use fewer or cheaper accelerators"
        )
    return price, None
