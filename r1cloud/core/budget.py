"""A job's budget: `resources.max_cost` dollars at the job's hourly price.

The price is SkyPilot's catalog price (prices.hourly_price) of the accelerators the job names, all nodes
counted: the cheapest offer among the clouds it may run on, spot when `resources.use_spot`. `train`
looks it up at launch and keeps it in the job record; the trainer gets it in `R1CLOUD_PRICE`, with
the spend of the job's earlier attempts (`R1CLOUD_SPENT`) and when this one started
(`R1CLOUD_STARTED`, epoch seconds). After each step it projects the spend at the end of the next
one from the last step's time; when that passes the cap it saves a checkpoint and exits with
`EXIT`, which the job records as BUDGET_REACHED. `validate` refuses a cap that one step's
estimate already passes, and a cap with no price to count it by (costs.check_budget).
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
