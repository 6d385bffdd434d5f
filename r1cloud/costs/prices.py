"""Hourly prices from SkyPilot's own catalog (`sky.catalog.list_accelerators`, what `sky show-gpus`
prints), never a table of ours. Read in a child process under a time limit: importing sky is slow,
and SkyPilot fetches a cloud's catalog file that is missing from GitHub with no timeout, so only
clouds whose file is already on this machine are asked (`sky show-gpus` fetches them). A price is
per instance-hour for all its accelerators, as SkyPilot gives it."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import math
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from r1cloud.core.accelerators import accelerator_options
from r1cloud.core.budget import usd
from r1cloud.core.jobstore import home
from r1cloud.jobs.follow import record

TIME_LIMIT = 30  # seconds for the child (AWS's lookup also asks its account's zones)
CATALOG_VERSION = "v8"  # sky/skylet/constants.py CATALOG_SCHEMA_VERSION in SkyPilot 0.14
HOW = "prices: run `sky show-gpus H100` once (it fetches SkyPilot's catalog), with r1cloud[cloud] installed"

CHILD = r"""
import json, math, sys
from sky import sky_logging
from sky.utils import annotations
annotations.is_on_api_server = False  # else the catalog prints request payload lines
import sky.catalog as catalog
wanted, clouds = json.loads(sys.argv[1]), json.loads(sys.argv[2])
rows = []
with sky_logging.silent():
    for cloud in clouds:
        for name, count in wanted:
            try:
                found = catalog.list_accelerators(name_filter=f"^{name}$", quantity_filter=count,
                                                  clouds=[cloud], case_sensitive=False)
            except Exception as e:  # one cloud's catalog that cannot be read: the others still count
                print(json.dumps({"error": f"{cloud}: {type(e).__name__}: {str(e)[:200]}"}), flush=True)
                break
            for infos in found.values():
                for i in infos:
                    known = lambda x: None if x is None or math.isnan(x) else x  # a blank cell: no offer
                    rows.append({"cloud": i.cloud, "accelerator": i.accelerator_name,
                                 "count": int(i.accelerator_count), "instance": i.instance_type,
                                 "price": known(i.price), "spot_price": known(i.spot_price),
                                 "region": i.region})
print(json.dumps({"rows": rows}))
"""


@dataclass(frozen=True)
class Offer:
    cloud: str
    accelerator: str
    count: int
    instance: str
    region: str
    price: float | None  # dollars an hour for the instance, on demand (None: not offered)
    spot_price: float | None


def catalog_dir() -> Path:
    """Where SkyPilot keeps its catalogs (sky/skylet/runtime_utils.py: SKY_RUNTIME_DIR, else ~)."""
    root = Path(os.path.expanduser(os.environ.get("SKY_RUNTIME_DIR", "~")))
    return root / ".sky" / "catalogs" / CATALOG_VERSION


def offers(wanted: list[tuple[str, int]], clouds: list[str] | None = None) -> tuple[list[Offer], str]:
    """The catalog's offers of each (accelerator, count), cheapest on-demand price per cloud and
    instance type; and a line saying why there are none, or which clouds could not be read."""
    if importlib.util.find_spec("sky") is None:
        return [], "prices: SkyPilot is not installed here (pip install 'r1cloud[cloud]'), then " + HOW[8:]
    here = catalog_dir()
    on_disk = sorted(p.name for p in here.iterdir() if (p / "vms.csv").is_file()) if here.is_dir() else []
    clouds = [c for c in (clouds or on_disk) if c in on_disk]
    if not clouds:
        return [], f"no SkyPilot catalog in {here}; {HOW}"
    stamps = [(here / c / "vms.csv").stat() for c in clouds]
    key = json.dumps([wanted, clouds, [[st.st_mtime_ns, st.st_size] for st in stamps]])
    with contextlib.suppress(TypeError):  # a damaged entry: asked again
        if isinstance(hit := _cache().get(key), list):
            return [Offer(**row) for row in hit], ""
    try:
        r = subprocess.run(
            [sys.executable, "-c", CHILD, json.dumps(wanted), json.dumps(clouds)],
            capture_output=True,
            text=True,
            timeout=TIME_LIMIT,
            env={**os.environ, "SKYPILOT_DISABLE_USAGE_COLLECTION": "1"},
        )
    except subprocess.TimeoutExpired:
        return [], f"prices: SkyPilot's catalog did not answer in {TIME_LIMIT} s"
    # the child's JSON objects (SkyPilot's own output may start with a brace too)
    lines = [m for x in r.stdout.splitlines() if x.startswith("{") and (m := record(x)) is not None]
    if r.returncode or not lines or "rows" not in lines[-1]:
        tail = (r.stderr.strip().splitlines() or ["no output"])[-1][:200]
        return [], f"prices: SkyPilot's catalog could not be read ({tail})"
    errors = "; ".join(str(x["error"]) for x in lines if "error" in x)
    found = [Offer(**row) for row in lines[-1]["rows"]]
    if not errors:
        _remember(key, lines[-1]["rows"])
    return found, (f"prices: some catalogs could not be read: {errors}" if errors else "")


# The child is slow (importing sky, reading the catalogs), and `validate` then `train` ask the same:
# answers are kept as JSON beside the job store, each under its question and the catalog files'
# size and time, so a catalog SkyPilot fetches anew is read anew.
CACHE_ENTRIES = 64


def _cache_file() -> Path:
    return home() / "cache" / "prices.json"


def _cache() -> dict:
    try:
        data = json.loads(_cache_file().read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _remember(key: str, rows: list[dict]) -> None:
    data = {k: v for k, v in _cache().items() if k != key} | {key: rows}  # the newest last
    with contextlib.suppress(OSError):  # a cache that cannot be written: asked again next time
        path = _cache_file()
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_text(json.dumps(dict(list(data.items())[-CACHE_ENTRIES:])))
        os.replace(tmp, path)


def hourly_price(spec) -> tuple[float | None, str]:
    """The job's price an hour (all nodes) and where it comes from; or None and why not."""
    r = spec.resources
    if not r.accelerators:
        return None, "the job names no accelerator to price (resources.accelerators, or --gpu)"
    kinds = accelerator_options(r.accelerators)
    cloud, _, region = r.infra.lower().partition("/")
    region = (r.region or region.split("/")[0]).lower()
    if cloud in ("k8s", "kubernetes", "ssh"):
        return None, f"{cloud} has no catalog price (SkyPilot prices clouds only)"
    found, why = offers(kinds, None if cloud == "local" else [cloud])
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
