"""A process that saves checkpoints back to back until it is killed, for the SIGKILL-during-saves
test, which forks each one from a multiprocessing forkserver that imported torch and r1cloud's
checkpoint code once: a trial starts in milliseconds, not a fresh interpreter's ~2 s of imports.
Nothing here runs a torch op at import, so nothing forks with a thread pool started."""

from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp

from r1cloud.checkpoint.write import Checkpoints


def state(make=torch.randn) -> dict:
    return {"model": {f"w{i}": make(256, 256) for i in range(24)}}


def save_forever(root: str, conn) -> None:
    """Publish step after step under `root`, keeping 3, sending each step number to `conn`."""
    ck = Checkpoints(root)
    weights = state()
    step = (ck.latest() or (0, None))[0]
    while True:
        step += 1
        staging = Path(ck.begin(step))
        dcp.save(weights, checkpoint_id=str(staging / "actor"), no_dist=True)
        ck.publish(staging, step, {"step": step}, None)
        ck.prune(3)
        conn.send(step)
