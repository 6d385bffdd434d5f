"""Asynchronous training's rollout stream: batches of prompts sent to the rollout workers ahead of
the trainer, each tagged with the version of the weights it is generated with (the updates in
them); the trainer takes them oldest first.

Ray runs one actor's calls in the order they are sent, so a weight push sent after a batch's
generate reaches a rollout worker once that batch is done (no partial rollouts): a batch's version
is the last push sent before it. Batch b, trained at step b + 1 by the policy of b updates, is sent
only while b − version ≤ bound, so no sample trains more than `bound` updates after the policy
that sampled it. With bound 0 and a push after every update each batch is generated after the
update before it, as in the synchronous run. The bound must be at least the pushes' interval − 1,
or the trainer would wait for a batch that waits for a push (validate refuses that).

The loader's state before each batch in flight is kept: a checkpoint records the first batch not
yet trained, so a resumed run regenerates what was in flight and trains no sample twice.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from r1cloud.rollout.sampling import sampling as spec_sampling


@dataclass
class InFlight:
    number: int  # batch b: trained at step b + 1
    version: int  # the updates in the weights it is generated with
    loader: dict  # the loader's state before its prompts were drawn
    sent: dict  # Trainer.submit's handle


class Stream:
    def __init__(self, trainer, bound: int, sync_every: int):
        self.t, self.bound, self.sync_every = trainer, bound, sync_every
        self.queue: deque[InFlight] = deque()
        self.version = self.next = 0

    def start(self, step: int) -> None:
        """The run goes on after step `step`: the rollout workers hold its weights (pushed)."""
        self.version = self.next = step

    def fill(self) -> None:
        """Send every batch the bound allows."""
        while self.next - self.version <= self.bound and self.next < self.t.steps:
            loader = self.t.loader.state_dict()
            sampling = spec_sampling(self.t.spec, self.next + 1)
            sent = self.t.submit(self.t.train_set, self.t.loader.next(), sampling)
            self.queue.append(InFlight(self.next, self.version, loader, sent))
            self.next += 1

    def take(self, step: int):
        """Step `step`'s batch (scored), the reward errors, and its staleness metrics."""
        self.fill()
        head = self.queue.popleft()
        assert head.number == step - 1, (head.number, step)
        batch, errors = self.t.score(self.t.collect(head.sent), self.t.train_set)
        self.fill()  # what the push it may have waited for allows
        metrics = {
            "async/staleness": float(step - 1 - head.version),
            "async/in_flight": float(len(self.queue)),
        }
        return batch, errors, metrics

    def push(self, step: int, force: bool = False) -> None:
        """After step `step`'s update: the weights to the rollout workers when it is their turn
        (every `sync_every` updates), or now (`force`: validation, the end)."""
        if self.version == step or (step % self.sync_every and not force):
            return
        self.t.push_weights(step)
        self.version = step

    def loader_state(self) -> dict:
        """The loader as it was before the first batch not yet trained."""
        return self.queue[0].loader if self.queue else self.t.loader.state_dict()
