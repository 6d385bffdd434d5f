"""Ulysses on a vision-language model without Ray or FSDP: two gloo processes, one group of 2,
each running the tiny VLM's packed rows (pictures, a video, shared prompts, a text-only row) over its half.
Rank 0 writes the log-probs and the group's summed gradients of a weighted log-prob sum to
ROOT/ARCH/ulysses.pt for the test to hold against one process (test_vision.py).
Run: python ulysses_vlm.py ROOT ARCH..."""

import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def rows(processor) -> list[list[tuple]]:
    """Two micro-batches: pictures (a shared prompt, two pictures in one prompt) with a text-only
    sequence among them (and, for Qwen-VL, a video), then text-only sequences."""
    from PIL import Image

    from r1cloud.media import video

    a, b = Image.new("RGB", (56, 84), (200, 20, 20)), Image.new("RGB", (84, 56), (20, 20, 200))
    one = processor.encode(processor.render("<image>How many?", True), [a])
    two = processor.encode(processor.render("Compare <image> with <image>.", True), [a, b])
    text = processor.encode(processor.render("How many sides has a square?", False), []).ids
    first = [
        (one.ids, [5, 6, 7], {"key": "a", **one.image_inputs}),
        (text, [30, 31]),
        (two.ids, [10, 11, 12, 13], {"key": "b", **two.image_inputs}),
        (one.ids, [8, 9], {"key": "a", **one.image_inputs}),
    ]
    if isinstance(getattr(processor.processor, "video_processor", None), video.VideoProcessor):  # Qwen-VL
        frames = [Image.new("RGB", (84, 56), (50 * k, 90, 200 - 50 * k)) for k in range(4)]
        clip = video.load(frames, None, 2.0, 784, 4704, processor.video_factor)
        moving = processor.encode(processor.render("<video>What moves?", True), [], [clip])
        first.append((moving.ids, [14, 15, 16], {"key": "v", **moving.image_inputs}))
    return [first, [(text, [40, 41, 42]), (text[:5], [43])]]


def load(path: str):
    from transformers import AutoConfig

    from r1cloud.media import vision
    from r1cloud.trainer.model import attention_for

    config = AutoConfig.from_pretrained(path)
    model = vision.auto_class(config).from_pretrained(
        path, dtype=torch.float32, attn_implementation=attention_for(config)
    )
    return model, vision.ImageProcessor(vision.load_processor(path))


def run(model, processor, sp=None) -> tuple[list[torch.Tensor], dict[str, torch.Tensor]]:
    """The rows' log-probs and the gradients of Σ (i + 1) · Σ log-probs of sequence i."""
    from r1cloud.trainer.model import packed_log_probs

    logps = [lp for micro in rows(processor) for lp in packed_log_probs(model, micro, 0.7, sp=sp)]
    sum(lp.sum() * (i + 1) for i, lp in enumerate(logps)).backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return [lp.detach() for lp in logps], grads


def worker(rank: int, root: str, archs: list[str]) -> None:
    from r1cloud.trainer import ulysses

    torch.set_num_threads(1)
    init = f"file://{os.path.join(root, '.rendezvous')}"  # no port: one found free could be taken
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    sp = ulysses.groups(2, 2, rank)
    for arch in archs:
        model, processor = load(os.path.join(root, arch))
        logps, grads = run(model, processor, sp)
        for g in grads.values():  # each worker's part: its slice's
            dist.all_reduce(g)
        if rank == 0:
            torch.save({"logps": logps, "grads": grads}, os.path.join(root, arch, "ulysses.pt"))
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(worker, args=(sys.argv[1], sys.argv[2:]), nprocs=2)
