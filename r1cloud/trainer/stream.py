"""Asynchronous training's rollout stream: batches of prompts sent to the rollout workers ahead of
the trainer, each with the version of the weights (the updates in them) to generate it with, the
last pushed; the trainer takes them oldest first.

Batch b, trained at step b + 1 by the policy of b updates, is sent only while b − version ≤ bound,
so no sample trains more than `bound` updates after the policy that sampled it; a rollout worker
holds a push until a batch sent with its version starts (rollout_worker.py), and reports the
version it sampled with, which the metrics count. With bound 0 and a push after every update each
batch is generated after the update before it, as in the synchronous run. The bound must be at
least the pushes' interval − 1, or the trainer would wait for a batch that waits for a push
(validate refuses that). Every push but the last is followed by a batch that loads it; a push no
batch would load (after the last batch is sent) is not made, unless validation generates with it.

The loader's state before each batch in flight is kept: a checkpoint records the first batch not
yet trained, so a resumed run regenerates what was in flight and trains no sample twice.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

from r1cloud.rollout.sampling import sampling as spec_sampling


@dataclass
class InFlight:
    number: int  # batch b: trained at step b + 1
    loader: dict  # the loader's state before its prompts were drawn
    sent: object  # Trainer.submit's handle (driver.Sent)


class Stream:
    def __init__(self, trainer, bound: int, sync_every: int):
        self.t, self.bound, self.sync_every = trainer, bound, sync_every
        self.queue: deque[InFlight] = deque()
        self.version = self.next = 0
        self.since = None  # when the last step took its batch

    def start(self, step: int) -> None:
        """The run goes on after step `step`: its weights to the rollout workers."""
        self.t.push_weights(step)
        self.version = self.next = step

    def fill(self) -> None:
        """Send every batch the bound allows."""
        while self.next - self.version <= self.bound and self.next < self.t.steps:
            loader = self.t.loader.state_dict()
            sampling = spec_sampling(self.t.spec, self.next + 1)
            sent = self.t.submit(self.t.train_set, self.t.loader.next(), sampling)
            self.queue.append(InFlight(self.next, loader, sent))
            self.next += 1

    def take(self, step: int):
        """Step `step`'s batch (scored), the reward errors, and the stream's metrics: the staleness of
        what it trains (from the version each rollout worker reports), the queue's depth, and how
        much of the time since the last step each pool spent waiting."""
        self.fill()
        head = self.queue.popleft()
        assert head.number == step - 1, (head.number, step)
        tick = time.perf_counter()
        batch = self.t.collect(head.sent)
        waited = time.perf_counter() - tick
        batch, errors = self.t.score(batch, self.t.train_set)
        now, since = time.perf_counter(), self.since
        self.since = now
        lag = (step - 1 - batch.version).double()
        metrics = {
            "async/staleness_mean": float(lag.mean()),
            "async/staleness_max": float(lag.max()),
            **{f"async/staleness_{k}": float((lag == k).double().mean()) for k in range(self.bound + 1)},
            "async/in_flight": float(len(self.queue)),
        }
        if since is not None:  # the trainer's wait for samples; the rollout workers' time not generating
            metrics["async/trainer_idle"] = waited / (now - since)
            busy = sum(head.sent.seconds) / len(head.sent.seconds)
            metrics["async/rollout_idle"] = max(0.0, 1 - busy / (now - since))
        return batch, errors, metrics

    def push(self, step: int, force: bool = False) -> None:
        """After step `step`'s update: the weights to the rollout workers when it is their turn
        (every `sync_every` updates), or now (`force`: validation generates with it)."""
        if self.version == step or (not force and (step % self.sync_every or self.next >= self.t.steps)):
            return  # not its turn, or no batch would load it
        self.t.push_weights(step)
        self.version = step

    def loader_state(self) -> dict:
        """The loader as it was before the first batch not yet trained."""
        return self.queue[0].loader if self.queue else self.t.loader.state_dict()
