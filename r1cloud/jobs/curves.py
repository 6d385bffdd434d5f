"""A run's curves: read from its metrics.jsonl (a job's run folder, a folder, or a bucket URL; EasyR1's
experiment_log.jsonl too), smoothed on request, drawn in the terminal with plotext or into a PNG
with matplotlib. Both libraries are imported only when drawing."""

from __future__ import annotations

from r1cloud.checkpoint.store import bucket_errors, filesystem
from r1cloud.core.records import finite, flatten, whole
from r1cloud.jobs.follow import record

Curve = tuple[list[int], list[float]]
BLOCKS = "▁▂▃▄▅▆▇█"


class PlotError(Exception):
    pass


def read_rows(where: str) -> list[dict]:
    """The metric lines under `where` (a folder or a bucket URL): r1cloud's metrics.jsonl, else
    EasyR1's experiment_log.jsonl (nested keys joined with /). A line cut off mid-write is skipped."""
    fs, root = filesystem(where)
    for name in ("metrics.jsonl", "experiment_log.jsonl"):
        try:
            with bucket_errors(where):
                text = fs.cat_file(f"{root}/{name}").decode(errors="replace")
        except FileNotFoundError:
            continue
        rows = [record(line) for line in text.splitlines()]
        return [flatten(r) for r in rows if r is not None and whole(r.get("step")) is not None]
    raise PlotError(f"{where} has no metrics.jsonl (nor EasyR1's experiment_log.jsonl)")


def series(rows: list[dict], key: str) -> Curve:
    """(steps, values) of `key`; a restarted run's later line for a step wins."""
    by_step = {r["step"]: finite(r.get(key)) for r in rows if finite(r.get(key)) is not None}
    steps = sorted(by_step)
    return steps, [by_step[s] for s in steps]


def smooth(values: list[float], weight: float) -> list[float]:
    """TensorBoard's smoothing: an exponential moving average, debiased at the start."""
    if weight <= 0:
        return list(values)
    out, last, norm = [], 0.0, 0.0
    for v in values:
        last = last * weight + (1 - weight) * v
        norm = norm * weight + (1 - weight)
        out.append(last / norm)
    return out


def sparkline(values: list[float], width: int = 24) -> str:
    """The values' shape in `width` block characters (each the mean of its slice of the run)."""
    if not values:
        return ""
    n = min(width, len(values))
    parts = [values[i * len(values) // n : (i + 1) * len(values) // n] for i in range(n)]
    means = [sum(p) / len(p) for p in parts]
    lo, hi = min(means), max(means)
    scale = (len(BLOCKS) - 1) / (hi - lo) if hi > lo else 0.0
    return "".join(BLOCKS[round((m - lo) * scale)] for m in means)


def title(metric: str, smoothing: float) -> str:
    return f"{metric} (smoothed {smoothing:g})" if smoothing > 0 else metric


def terminal(
    panels: dict[str, dict[str, Curve]], width: int, height: int, color: bool, smoothing: float = 0.0
) -> str:
    """One panel per metric, one line per run in each (smoothed by `smoothing`), as text. Each panel
    is its own figure: plotext keeps a grid's sizes from one call to the next, and a later grid
    drew wrongly."""
    import plotext as plt

    texts = []
    for metric, runs in panels.items():
        plt.clear_figure()
        plt.plotsize(width, height)
        plt.title(title(metric, smoothing))
        plt.xlabel("step")
        if not color:
            plt.theme("clear")
        for j, (label, (x, y)) in enumerate(runs.items()):
            # without colour, runs differ by marker
            marker = "braille" if color else ("braille", "•", "+", "x")[j % 4]
            plt.plot(x, smooth(y, smoothing), label=label, marker=marker)
        steps = [s for x, _ in runs.values() for s in x]
        plt.xticks(step_ticks(min(steps), max(steps)))
        text = plt.build()
        texts.append(text if color else plt.uncolorize(text))
    return "\n".join(texts)


def step_ticks(lo: int, hi: int, most: int = 6) -> list[int]:
    """At most `most` whole, round steps from `lo` to `hi`: multiples of 1, 2 or 5 × 10^k."""
    for size in (m * 10**k for k in range(15) for m in (1, 2, 5)):
        if (hi - lo) // size < most:
            break
    first = -(-lo // size) * size
    return list(range(first, hi + 1, size)) or [lo]


def png(panels: dict[str, dict[str, Curve]], path: str, smoothing: float = 0.0) -> None:
    """The panels as a picture; smoothed as TensorBoard shows it: each run's raw values faint
    behind its smoothed line."""
    import matplotlib

    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as mpl

    fig, axes = mpl.subplots(len(panels), 1, figsize=(8, 3.2 * len(panels)), squeeze=False)
    for ax, (metric, runs) in zip(axes[:, 0], panels.items(), strict=True):
        for label, (x, y) in runs.items():
            marker = "o" if len(x) < 30 else None
            (line,) = ax.plot(x, smooth(y, smoothing), label=label, marker=marker, markersize=3)
            if smoothing > 0:
                ax.plot(x, y, color=line.get_color(), alpha=0.25, linewidth=1, marker=marker, markersize=2)
        ax.set_title(title(metric, smoothing))
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    mpl.close(fig)
