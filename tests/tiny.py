"""Tiny real models for tests and benchmarks (not part of the package): a Qwen2-architecture model with random weights and a
small BPE tokenizer trained on the spot, with a chat template. No Hub access needed.

head_dim is 64 because vLLM's CPU attention rejects smaller heads.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

from r1cloud.offline.smollm import IDEFICS3_SPECIALS, idefics3, random_model, save_idefics3, save_vlm

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def _corpus() -> list[str]:
    sentence = "what is the answer think box plus minus equals number sum of and then so final result"
    words = sentence.split()  # the sentence and each of its rotations
    lines = [
        f"What is {a} + {b}? The answer is \\boxed{{{a + b}}}." for a in range(30) for b in range(0, 30, 3)
    ]
    lines += [" ".join(words[i:] + words[:i]) for i in range(len(words))]
    lines += ["<think> reasoning </think> <answer> 3 </answer>", "user assistant system"]
    return lines


def make_tokenizer(path: str | Path, vocab_size: int = 384):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token=None,
        unk_token=None,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(path))
    return fast


def make_tiny_model(
    path: str | Path, layers: int = 2, hidden: int = 128, seed: int = 0, tie: bool = False
) -> Path:
    """Write a random Qwen2 causal LM with its tokenizer to `path`; return the path."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    path = Path(path)
    tok = make_tokenizer(path)
    config = Qwen2Config(**text_config(tok, hidden, layers, tie, 1024), torch_dtype="float32")
    random_model(Qwen2ForCausalLM, config, tok, seed).save_pretrained(str(path))
    return path


def text_config(tok, hidden: int, layers: int, tie: bool, positions: int) -> dict:
    """A tiny language model's settings over `tok`: one KV head, head_dim 64 (vLLM's CPU attention)."""
    return dict(
        vocab_size=len(tok), hidden_size=hidden, intermediate_size=hidden * 2, num_hidden_layers=layers,
        num_attention_heads=hidden // 64, num_key_value_heads=1, head_dim=64, max_position_embeddings=positions,
        eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, bos_token_id=None, tie_word_embeddings=tie,
    )  # fmt: skip


# A chat template that takes image parts (Qwen-VL's placeholder), as the real models' do.
VL_CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['content'] is string %}{{ m['content'] }}{% else %}{% for c in m['content'] %}"
    "{% if c['type'] == 'image' or c['type'] == 'image_url' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif c['type'] == 'video' %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif c['type'] == 'text' %}{{ c['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
VISION_SPECIALS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]


def make_tiny_vlm(
    path: str | Path,
    arch: str = "qwen2_vl",
    seed: int = 0,
    hidden: int = 128,
    max_pixels: int = 28 * 28 * 16,
    tie: bool = False,
) -> Path:
    """Write a random Qwen2-VL-family model (`qwen2_vl`, `qwen2_5_vl` or `qwen3_vl`) or an Idefics3
    (`idefics3`) with its processor (image processor, tokenizer, chat template) to `path`. Text: 2
    layers, head_dim 64 (vLLM's CPU attention), mRoPE for Qwen; vision: 2 blocks, 32 wide. A 56×84
    image is 6 image tokens for Qwen2-VL; any image is 4 for Idefics3 (64 px, 16 px patches,
    scale factor 2). `tie`: the output layer is the embedding (as SmolVLM's, Qwen2.5-VL-3B's)."""
    if arch == "idefics3":
        return _tiny_idefics3(Path(path), seed, hidden, tie)

    import transformers
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    path = Path(path)
    tok = make_tokenizer(path)
    tok.add_special_tokens({"additional_special_tokens": VISION_SPECIALS})
    start, end, image, video = tok.convert_tokens_to_ids(VISION_SPECIALS)
    patch = 16 if arch == "qwen3_vl" else 14
    text = text_config(tok, hidden, 2, tie, 2048)
    text["rope_parameters"] = {"rope_type": "default", "rope_theta": 1e4, "mrope_section": [8, 12, 12]}
    family = {"qwen2_vl": "Qwen2VL", "qwen2_5_vl": "Qwen2_5_VL", "qwen3_vl": "Qwen3VL"}.get(arch)
    if family is None:
        raise ValueError(f"unknown tiny VLM architecture {arch!r}")
    vision = dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=hidden)
    if arch == "qwen2_vl":
        vision = dict(depth=2, embed_dim=32, num_heads=2, mlp_ratio=2, hidden_size=hidden)
    elif arch == "qwen2_5_vl":
        vision |= dict(window_size=56, fullatt_block_indexes=[1])
    else:
        text["rope_parameters"]["mrope_interleaved"] = True
        vision |= dict(num_position_embeddings=64, deepstack_visual_indexes=[1])
    config = getattr(transformers, f"{family}Config")(
        text_config=text, vision_config={**vision, "patch_size": patch}, image_token_id=image,
        video_token_id=video, vision_start_token_id=start, vision_end_token_id=end, tie_word_embeddings=tie,
    )  # fmt: skip
    model = random_model(getattr(transformers, f"{family}ForConditionalGeneration"), config, tok, seed)
    images = Qwen2VLImageProcessorPil(
        min_pixels=28 * 28, max_pixels=max_pixels, patch_size=patch, merge_size=2, temporal_patch_size=2
    )
    return save_vlm(path, model, tok, VL_CHAT_TEMPLATE, images, {"processor_class": f"{family}Processor"})


def _tiny_idefics3(path: Path, seed: int, hidden: int, tie: bool) -> Path:
    tok = make_tokenizer(path)
    tok.add_special_tokens({"additional_special_tokens": IDEFICS3_SPECIALS})
    text = {"model_type": "llama", **text_config(tok, hidden, 2, tie, 2048)}
    model = idefics3(tok, text, 32, 2, 64, seed)
    template = VL_CHAT_TEMPLATE.replace("<|vision_start|><|image_pad|><|vision_end|>", "<image>")
    return save_idefics3(path, model, tok, template)


# ---------------------------------------------------------------------------- worker calls by hand
# Samples as {"seq": (prompt ids, response ids[, {"key", **image tensors}]), "old", "ref", "adv",
# "rollout"} (lists, or one advantage per sequence), turned into what the driver sends a worker.


def batch_of(samples: list) -> tuple:
    """A Batch of `samples` (one group per distinct prompt and images), and their rows in it."""
    import torch

    from r1cloud.trainer.batch import Batch, ragged

    seqs = [s["seq"] if isinstance(s, dict) else s for s in samples]
    keys = [(tuple(q[0]), (q[2] if len(q) > 2 else {}).get("key")) for q in seqs]
    uid = {k: str(i) for i, k in enumerate(dict.fromkeys(keys))}
    pictures = {}
    for q, k in zip(seqs, keys, strict=True):
        if len(q) > 2 and q[2]:
            pictures.setdefault(k, {n: v for n, v in q[2].items() if n != "key"})
    rlen = torch.tensor([len(q[1]) for q in seqs], dtype=torch.long)
    width = int(rlen.max())
    mask = (torch.arange(width)[None, :] < rlen[:, None]).float()

    def per_token(name):
        if not isinstance(samples[0], dict) or samples[0].get(name) is None:
            return None
        rows = [s[name] if isinstance(s[name], list) else [s[name]] * len(s["seq"][1]) for s in samples]
        return ragged(rows, torch.float32, width) * mask

    order = list(pictures)
    b = Batch(
        uid=[uid[k] for k in keys],
        index=torch.tensor([int(uid[k]) for k in keys]),
        prompt_ids=ragged([list(q[0]) for q in seqs], torch.int32),
        prompt_len=torch.tensor([len(q[0]) for q in seqs], dtype=torch.long),
        response_ids=ragged([list(q[1]) for q in seqs], torch.int32),
        response_len=rlen,
        finished=torch.ones(len(seqs), dtype=torch.bool),
        rollout_logp=per_token("rollout"),
        old_logp=per_token("old"),
        ref_logp=per_token("ref"),
        advantages=per_token("adv"),
        loss_mask=per_token("mask").bool() if per_token("mask") is not None else None,
        image_inputs=[pictures[k] for k in order],
        image_of=torch.tensor([order.index(k) if k in pictures else -1 for k in keys]) if pictures else None,
    )
    return b, list(range(len(seqs)))


def shard(minibatches: list[dict]) -> tuple:
    """One rank's [{"total", "micro": [[sample, ...], ...]}, ...] as (its Batch, the plan in rows)."""
    samples = [s for mb in minibatches for micro in mb["micro"] for s in micro]
    b, _ = batch_of(samples)
    rows = iter(range(len(samples)))
    plan = [
        {"total": mb["total"], "micro": [[next(rows) for _ in m] for m in mb["micro"]]} for mb in minibatches
    ]
    return b, plan


def generated(result: dict) -> list[dict]:
    """A worker's `generate` result as one {"prompt", "response", "logprobs"} per sample."""
    lengths = result["length"].tolist()
    responses, logprobs = (per_sequence(result[k], lengths) for k in ("response", "logprobs"))
    return [
        {"prompt": p, "response": r, "logprobs": lp}
        for p, r, lp in zip(result["prompt"].tolist(), responses, logprobs, strict=True)
    ]


def per_sequence(flat, lengths: list[int]) -> list[list[float]]:
    """A worker's `log_probs` (its rows' tokens end to end) as one list per sequence."""
    starts = itertools.accumulate(lengths, initial=0)
    return [flat[at : at + n].tolist() for at, n in zip(starts, lengths, strict=False)]


def write_video(
    path: str | Path, frames: int = 20, fps: float = 10.0, size: tuple[int, int] = (84, 56)
) -> Path:
    """An mp4 (OpenCV's mp4v) of `frames` solid frames at `fps`, `size` (width, height): frame i
    is red i × 8 (mod 256), green 255 − that, blue 128 — its colour says which frame it is."""
    import cv2
    import numpy as np

    path = Path(path)
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"mp4v"), fps, size)
    try:
        for i in range(frames):
            red = (i * 8) % 256
            writer.write(np.full((size[1], size[0], 3), (128, 255 - red, red), np.uint8))  # BGR
    finally:
        writer.release()
    return path


def write_clips(root: str | Path) -> Path:
    """A small generated video set in `root`, EasyR1-style: rows {"videos": [file or frame list],
    "problem": "<video>…", "answer": …}, clips of 1 to 3 s and two rows whose video is a list of
    frames; train.jsonl holds all 8 rows, test.jsonl the first 4."""
    from PIL import Image

    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    rows = []
    for i in range(6):
        write_video(root / f"c{i}.mp4", frames=10 * (1 + i % 3), fps=10, size=(84, 56))
        rows.append({"videos": [f"c{i}.mp4"], "problem": "<video>How many seconds long is it?",
                     "answer": str(1 + i % 3)})  # fmt: skip
    for i in range(2):
        frames = [f"f{i}_{k}.png" for k in range(3)]
        for k, name in enumerate(frames):
            Image.new("RGB", (84, 56), (60 * k, 200 - 60 * k, 90)).save(root / name)
        rows.append({"videos": [frames], "problem": "Watch <video> and count the frames.", "answer": "3"})
    (root / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (root / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:4]))
    return root
