"""Asynchronous training's rollout-only worker: a device of its own with a rollout engine (and the
agent's episodes when the run has tools), no training state. The rollout workers form a
torch.distributed world of their own (vLLM's external_launcher joins it, tensor parallel inside
it), and each is a member of the weights group through which train rank 0 sends the actor's
weights (trainer/broadcast.py). `version` is the number of updates in the weights it holds.
"""

from __future__ import annotations

import torch

from r1cloud.data import no_sklearn
from r1cloud.spec import Spec
from r1cloud.trainer import broadcast
from r1cloud.trainer.engine_host import EngineHost
from r1cloud.trainer.transport import zero_copy_tensors
from r1cloud.trainer.world import join_world


class RolloutWorker(EngineHost):
    lora = False  # the engine gets merged weights

    def __init__(self, spec: dict, rank: int, world: int, master: str, threads: int = 1):
        no_sklearn.install()  # before the first model loads in this Ray worker
        self.spec = Spec.model_validate(spec)
        self.rank, self.world, self.master = rank, world, master
        zero_copy_tensors()
        self.cuda = torch.cuda.is_available()
        self.device = f"cuda:{torch.cuda.current_device()}" if self.cuda else "cpu"
        if not self.cuda:
            torch.set_num_threads(threads)
        join_world(master, rank, world, "nccl" if self.cuda else "gloo", prefix="rollout/")
        self.weights = None  # the weights group (join_weights)
        self.version = 0

    def join_weights(self, size: int) -> None:
        """Join the weights group as its member rank + 1 (train rank 0 is its 0)."""
        self.weights = broadcast.group(self.master, self.rank + 1, size)

    def receive_weights(self, version: int) -> None:
        """Load what train rank 0 sends (WeightSync.push_weights) into the engine."""
        self.engine.load_weights(broadcast.receive(self.weights))
        self.version = version

    def shutdown(self) -> None:
        import torch.distributed as dist

        if self.agent is not None:
            self.agent.sandbox.close()
        if dist.is_initialized():
            dist.destroy_process_group()
