"""Asynchronous training's rollout-only worker: a device of its own with a rollout engine (and the
agent's episodes when the run has tools), no training state. The rollout workers form a
torch.distributed world of their own (vLLM's external_launcher joins it, tensor parallel inside
it), and each is a member of the weights group through which train rank 0 sends the actor's
weights (trainer/broadcast.py). `version` is the number of updates in the weights it holds.
"""

from __future__ import annotations

import time

import torch

from r1cloud.trainer import broadcast
from r1cloud.trainer.engine_host import EngineHost
from r1cloud.trainer.world import join_world


class RolloutWorker(EngineHost):
    lora = False  # the engine gets merged weights

    def __init__(self, spec: dict, rank: int, world: int, master: str, threads: int = 1):
        self._begin(spec, rank, world, master, threads)
        join_world(master, rank, world, "nccl" if self.cuda else "gloo", prefix="rollout/")
        self.weights = None  # the weights group (join_weights)
        self.version = 0

    def join_weights(self, size: int) -> None:
        """Join the weights group as its member rank + 1 (train rank 0 is its 0)."""
        self.weights = broadcast.group(self.master, self.rank + 1, size)

    def generate(self, prompts, sampling: dict) -> dict:
        """EngineHost.generate, with the version of the weights that sampled it and the seconds it took."""
        tick = time.perf_counter()
        out = super().generate(prompts, sampling)
        out["version"] = torch.full((len(out["length"]),), self.version, dtype=torch.long)
        out["seconds"] = time.perf_counter() - tick
        return out

    def receive_weights(self, version: int) -> None:
        """Load what train rank 0 sends (WeightSync.push_weights) into the engine."""
        self.engine.load_weights(broadcast.receive(self.weights))
        self.version = version
