"""Asynchronous training's rollout-only worker: a device of its own with a rollout engine (and the
agent's episodes when the run has tools), no training state. The rollout workers form a
torch.distributed world of their own (vLLM's external_launcher joins it, tensor parallel inside
it), and each is a member of the weights group through which train rank 0 sends the actor's
weights (trainer/broadcast.py). `version` is the number of updates in the weights it holds.

A push is received in a thread of its own (Ray's concurrency group "weights") into host memory,
while the engine may still be generating: train rank 0 is not held up by the batches queued before
it. The weights go into the engine between batches, when a batch asks for their version; a batch
is always generated with exactly the version it was sent with (its staleness as the trainer
planned it, the run reproducible). One push is held at a time: a second waits until the first is
loaded.
"""

from __future__ import annotations

import threading
import time

import torch

from r1cloud.trainer import broadcast
from r1cloud.trainer.engine_host import EngineHost
from r1cloud.trainer.world import join_world

WEIGHTS = "weights"  # the concurrency group pushes are received in (trainer/group.py declares it)


class RolloutWorker(EngineHost):
    lora = False  # the engine gets merged weights

    def __init__(self, spec: dict, rank: int, world: int, master: str, threads: int = 1):
        self._begin(spec, rank, world, master, threads)
        join_world(master, rank, world, "nccl" if self.cuda else "gloo", prefix="rollout/")
        self.weights = None  # the weights group (join_weights)
        self.version = (
            -1
        )  # none pushed yet (the run's first push, at its start, is version 0 or the resumed step)
        self.held: tuple[int, list] | None = None  # a push received and not yet loaded: (version, tensors)
        self.failed: BaseException | None = None  # a push that could not be received
        self.changed = threading.Condition()

    def join_weights(self, size: int) -> None:
        """Join the weights group as its member rank + 1 (train rank 0 is its 0)."""
        self.weights = broadcast.group(self.master, self.rank + 1, size)

    def receive_weights(self, version: int) -> None:
        """Hold what train rank 0 sends (WeightSync.push_weights) until a batch asks for it; runs in
        the "weights" thread, beside a batch being generated."""
        with self.changed:
            self.changed.wait_for(lambda: self.held is None)
        try:
            tensors = list(broadcast.receive(self.weights))
        except BaseException as e:
            with self.changed:
                self.failed = e
                self.changed.notify_all()
            raise
        with self.changed:
            self.held = (version, tensors)
            self.changed.notify_all()

    def _load(self, version: int | None) -> None:
        """The engine at `version` (None: the newest weights received), loading the push held."""
        with self.changed:
            if version is not None:
                self.changed.wait_for(
                    lambda: self.failed or self.version == version or (self.held and self.held[0] == version)
                )
            if self.failed:
                raise RuntimeError(f"the weights of update {version} never arrived: {self.failed}")
            if self.held is None or (version is not None and self.version == version):
                return
            self.version, tensors = self.held
            self.engine.load_weights(tensors)
            self.held = None
            self.changed.notify_all()

    def generate(self, prompts, sampling: dict, version: int | None = None) -> dict:
        """EngineHost.generate with the weights of `version` (the updates in them), reporting the
        version and the seconds it took."""
        self._load(version)
        tick = time.perf_counter()
        out = super().generate(prompts, sampling)
        out["version"] = torch.full((len(out["length"]),), self.version, dtype=torch.long)
        out["seconds"] = time.perf_counter() - tick
        return out
