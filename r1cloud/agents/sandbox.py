"""Where a run's tools and environments execute: `workers` spawned processes, each holding the
environment objects of its episodes (episode k lives in process k % workers, for all its turns).

Every operation runs under `tool_timeout` (a signal timer inside the process, so the objects'
state survives a time-out) and its text is cut to `max_tool_response_length` characters before it
leaves the process (pictures in TRL's content blocks leave it as PNG bytes). An exception becomes
an error observation; a process that stops answering (stuck where the signal cannot reach) is
killed and started again, and the episodes it held end.
None of them ends the run. Files from elsewhere run only here, never in the trainer's process.

Operations: `reset` (a new object per episode, `reset(**row)`), `call` (a tool: an environment's
method, or a function of the tools file), `step` (a gym-shaped environment's action), `reward`
(a TRL environment's `get_reward()`) and `close`.
"""

from __future__ import annotations

import contextlib
import io
import multiprocessing
import time
from collections import defaultdict, deque
from multiprocessing.connection import wait as ready

from r1cloud.agents.tools import environment_class, is_gym, load
from r1cloud.data import no_sklearn
from r1cloud.data.prompts import TooSlow, deadline

LOST = "the episode's environment was lost (its process stopped answering and was started again)"


def _text(value, limit: int) -> str | list[dict]:
    """An output as an observation: its text, cut to `limit` characters; or, for TRL's multimodal
    content blocks (a list of {"type": "text", "text"} and {"type": "image", "image": PIL}), the
    blocks with their texts cut and each picture as PNG bytes (plain data across the pipe)."""
    if isinstance(value, list) and any(isinstance(b, dict) and b.get("type") == "image" for b in value):
        return [_block(b, limit) for b in value]
    return (value if isinstance(value, str) else str(value))[:limit]


def _block(block, limit: int) -> dict:
    if not isinstance(block, dict) or block.get("type") not in ("text", "image"):
        raise TypeError('content blocks are {"type": "text", "text": ...} or {"type": "image", "image": ...}')
    if block["type"] == "text":
        return {"type": "text", "text": str(block.get("text", ""))[:limit]}
    image = block.get("image")
    if not hasattr(image, "save"):  # a numpy array, say
        from PIL import Image

        image = Image.fromarray(image)
    buffer = io.BytesIO()
    image.convert("RGB").save(buffer, format="PNG")
    return {"type": "image", "image": buffer.getvalue()}


def _transition(out, limit: int) -> tuple[str | None, float, bool]:
    """A gym-shaped step's (observation, reward, done); gymnasium's 5-tuple and a 4-tuple with
    info are read too."""
    if not isinstance(out, tuple) or len(out) not in (3, 4, 5):
        raise TypeError(f"step() must return (observation, reward, done), not {type(out).__name__}")
    done = bool(out[2]) or (len(out) == 5 and bool(out[3]))
    return (None if out[0] is None else _text(out[0], limit)), float(out[1] or 0.0), done


class _Objects:
    """Inside a sandbox process: the environment class, the tools, the live objects."""

    def __init__(self, env: str | None, tools: str | None, names: list[str] | None, limit: int):
        self.cls = environment_class(env) if env else None
        self.tools = load(tools, names, described=False) if tools else {}
        self.limit = limit
        self.live: dict[int, object] = {}

    def obj(self, episode: int):
        if episode not in self.live:
            raise LookupError(LOST)
        return self.live[episode]

    def reset(self, episode: int, row: dict) -> str | None:
        self.live[episode] = self.cls()
        out = self.live[episode].reset(**row)
        if out is not None and not isinstance(out, str):
            raise TypeError(f"reset() must return a text or None, not {type(out).__name__}")
        return None if out is None else out[: self.limit]

    def call(self, episode: int, call: tuple[str, dict]) -> str:
        name, arguments = call
        fn = self.tools.get(name) or getattr(self.obj(episode), name)
        return _text(fn(**arguments), self.limit)

    def step(self, episode: int, action: str) -> tuple[str | None, float, bool]:
        return _transition(self.obj(episode).step(action), self.limit)

    def reward(self, episode: int, _=None) -> float:
        return float(self.obj(episode).get_reward())

    def close(self, episode: int, _=None) -> None:
        obj = self.live.pop(episode, None)
        if self.cls is not None and is_gym(self.cls) and callable(getattr(obj, "close", None)):
            obj.close()  # gym's; for TRL's shape a `close` method is a tool


def _serve(conn, env, tools, names, limit: int, timeout: float) -> None:
    no_sklearn.install()  # a spawned process: an environment may load a model
    try:
        objects = _Objects(env, tools, names, limit)
    except Exception as e:
        conn.send(("error", str(e).splitlines()[0] if str(e) else type(e).__name__))
        return
    conn.send(("ready", None))
    while (batch := conn.recv()) is not None:
        out = []
        for op, episode, arg in batch:
            start = time.monotonic()
            try:
                with deadline(timeout):
                    value = getattr(objects, op)(episode, arg)
                out.append((True, value, time.monotonic() - start))
            except TooSlow:
                what = arg[0] if op == "call" else f"{op}()"
                out.append((False, f"Error: {what} did not finish in {timeout:g} s", timeout))
            except Exception as e:  # the model (or the trainer) sees why, in one line
                message = str(e).splitlines()[0][:limit] if str(e) else ""
                out.append((False, f"Error: {type(e).__name__}: {message}", time.monotonic() - start))
        conn.send(out)


class Sandbox:
    """The processes. `submit` sends (operation, episode, argument) items, each with a tag, and
    returns at once; `collect` gives back (tag, (ok, value or error text, seconds)) as processes
    answer, so episodes whose tools are slow do not hold up the others. `run` does both."""

    def __init__(self, env: str | None, tools: str | None, names, workers: int, timeout: float, limit: int):
        self.args = (env, tools, names, limit, timeout)
        self.timeout = timeout
        self.procs = [self._start() for _ in range(max(1, workers))]
        self.sent: list[deque] = [deque() for _ in self.procs]  # per process: its batches' tags, in order
        self.since = [0.0] * len(self.procs)  # when each process's oldest batch was due to start

    def _start(self):
        ctx = multiprocessing.get_context("spawn")  # never fork a Ray worker
        conn, child = ctx.Pipe()
        proc = ctx.Process(target=_serve, args=(child, *self.args), daemon=True)
        proc.start()
        child.close()
        if not conn.poll(120):
            proc.kill()
            raise ValueError("the tools' or environment's file took over 120 s to import")
        status, message = conn.recv()
        if status == "error":
            proc.join()
            raise ValueError(message)
        return proc, conn

    def submit(self, items: list[tuple[str, int, object]], tags: list) -> None:
        by_proc = defaultdict(list)
        for item, tag in zip(items, tags, strict=True):
            by_proc[item[1] % len(self.procs)].append((item, tag))
        now = time.monotonic()
        for w, batch in by_proc.items():
            self.procs[w][1].send([item for item, _ in batch])
            if not self.sent[w]:
                self.since[w] = now
            self.sent[w].append([tag for _, tag in batch])

    def pending(self) -> bool:
        return any(self.sent)

    def collect(self, wait: bool = False) -> list[tuple[object, tuple[bool, object, float]]]:
        """What has come back; with `wait`, at least one batch's results (if any is out)."""
        out: list = []
        while True:
            for w, queue in enumerate(self.sent):
                proc, conn = self.procs[w]
                while queue:
                    overdue = time.monotonic() > self.since[w] + self.timeout * len(queue[0]) + 30
                    try:
                        if not conn.poll(0):
                            if overdue:  # stuck where the signal cannot reach
                                raise EOFError
                            break
                        results = conn.recv()
                    except EOFError:  # or dead (a crash in native code, killed for memory)
                        proc.kill()
                        proc.join()
                        self.procs[w] = self._start()
                        for tags in queue:
                            out += [(tag, (False, f"Error: {LOST}", self.timeout)) for tag in tags]
                        queue.clear()
                        break
                    out += zip(queue.popleft(), results, strict=True)
                    self.since[w] = time.monotonic()
            if out or not wait or not self.pending():
                return out
            ready([self.procs[w][1] for w, q in enumerate(self.sent) if q], timeout=1.0)

    def run(self, items: list[tuple[str, int, object]]) -> list[tuple[bool, object, float]]:
        """Each item's result, in order, once all are in (results of earlier `submit`s still out,
        after a failure, are dropped)."""
        mine = object()
        self.submit(items, [(mine, k) for k in range(len(items))])
        out: list = [None] * len(items)
        while self.pending():
            for tag, result in self.collect(wait=True):
                if isinstance(tag, tuple) and tag[0] is mine:
                    out[tag[1]] = result
        return out

    def close(self) -> None:
        for proc, conn in self.procs:
            with contextlib.suppress(OSError):  # already gone
                conn.send(None)
            proc.join(timeout=5)
            if proc.is_alive():
                proc.kill()
