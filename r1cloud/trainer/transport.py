"""How tensors cross Ray between the driver and the workers: as views of their bytes, without a copy."""

from __future__ import annotations

import torch


def zero_copy_tensors() -> None:
    """Tensors through Ray as numpy views of their bytes, which Ray's pickle 5 sends out of band and
    a receiver on the same node maps from the object store without a copy, where Ray's default
    pickles a tensor's storage in band (docs/trainer.md, "CPU specifics"). Registered in the sending process (the driver, each worker); the receiver
    needs nothing. What arrives is read-only memory: nothing writes into a tensor it was sent."""
    import ray

    ray.util.register_serializer(torch.Tensor, serializer=_tensor_bytes, deserializer=_tensor_from)


def _tensor_bytes(t: torch.Tensor) -> tuple:
    t = t.detach().cpu().contiguous()
    return t.reshape(-1).view(torch.uint8).numpy(), str(t.dtype).removeprefix("torch."), tuple(t.shape)


def _tensor_from(args: tuple) -> torch.Tensor:
    import warnings

    data, dtype, shape = args
    with warnings.catch_warnings():  # read-only: "The given NumPy array is not writable"
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(data).view(getattr(torch, dtype)).reshape(shape)
