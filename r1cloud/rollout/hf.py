"""Rollouts with transformers `generate` on an unsharded copy of the actor's weights.

A copy, because generate calls forward a different number of times on each worker (sequences stop
at different lengths); a sharded FSDP model would deadlock in its all-gathers. A prompt with
images is generated with its n samples as one batch (same length, no padding), its image tensors
repeated.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch.nn.utils.rnn import pad_sequence

from r1cloud.media import vision
from r1cloud.media.vision import auto_class, image_inputs
from r1cloud.rollout import onednn
from r1cloud.rollout.engine import HF_EXTRA, Request, Sample, Sampling, cut_at_eos, placeholder_ids


class HFEngine:
    name = "hf"
    micro_batch = 64  # text samples per generate call

    def __init__(self, model_path: str, eos_ids: set[int], pad_id: int, dtype: torch.dtype, device: str):
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(model_path)
        self.model = auto_class(config).from_pretrained(model_path, dtype=dtype).to(device).eval()
        vision.use_qwen2_rope(self.model)  # the positions the trainer and vLLM give videos
        self.forbidden = placeholder_ids(config)
        if dtype == torch.float32 and device == "cpu":
            onednn.use_in(self.model)  # fp32 linear layers at twice MKL's speed on AMD CPUs
        self.eos, self.pad, self.device = eos_ids, pad_id, device

    @torch.no_grad()
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """The policy's weights by their names in the model's state dict. A name the model lacks
        is an error: skipped, the engine would go on sampling from that weight's first value."""
        params = self.model.state_dict()
        unknown = []
        for name, tensor in weights:
            if name in params:
                params[name].copy_(tensor.to(params[name].dtype))
            else:
                unknown.append(name)
        if unknown:
            raise RuntimeError(
                f"the hf engine's model has no weight named {unknown[0]!r} ({len(unknown)} of the policy's "
                "names are not in its state dict): the trainer's and the engine's models differ"
            )

    @torch.no_grad()
    def generate(self, prompts: list[Request], sampling: Sampling) -> list[Sample]:
        work = [(i, j) for i in range(len(prompts)) for j in range(sampling.n)]
        samples: list[Sample] = []
        text = [w for w in work if not prompts[w[0]].image_inputs]
        for start in range(0, len(text), self.micro_batch):
            chunk = text[start : start + self.micro_batch]
            samples += self._generate([prompts[i] for i, _ in chunk], [i for i, _ in chunk], sampling, start)
        for i, p in enumerate(prompts):  # with images or videos: one prompt's samples at a time
            if p.image_inputs:
                offset = work.index((i, 0))
                samples += self._generate([p] * sampling.n, [i] * sampling.n, sampling, offset)
        return sorted(samples, key=lambda x: x.prompt)  # stable: each prompt's samples in order

    def _generate(self, batch: list[Request], owners: list[int], s: Sampling, offset: int) -> list[Sample]:
        inputs = vision.merge([p.image_inputs for p in batch])
        rows = [torch.tensor(p.ids, dtype=torch.long) for p in batch]
        ids = pad_sequence(rows, batch_first=True, padding_value=self.pad, padding_side="left")
        mask = pad_sequence([torch.ones_like(r) for r in rows], batch_first=True, padding_side="left")
        width = ids.shape[1]
        greedy = s.temperature == 0
        torch.manual_seed(s.seed + offset)
        out = self.model.generate(
            input_ids=ids.to(self.device),
            attention_mask=mask.to(self.device),
            do_sample=not greedy,
            temperature=None if greedy else s.temperature,
            top_p=None if greedy else s.top_p,
            top_k=None if greedy or s.top_k <= 0 else s.top_k,
            max_new_tokens=s.max_tokens,
            eos_token_id=None if s.ignore_eos else sorted(self.eos),
            pad_token_id=self.pad,
            # the driver refuses the others (no equivalent); transformers wants these types exactly
            **{HF_EXTRA[k]: int(v) if k == "min_tokens" else float(v) for k, v in s.extra.items()},
            output_logits=True,
            return_dict_in_generate=True,
            **{k: v.to(self.device) for k, v in image_inputs(self.model, ids, inputs).items()},
        )
        tokens = out.sequences[:, width:].cpu()
        logits = torch.stack(out.logits, dim=1).float().cpu()  # (B, steps, V), raw
        if not greedy:
            logits = logits / s.temperature
        logp = torch.log_softmax(logits, dim=-1).gather(-1, tokens[..., None])[..., 0]
        result = []
        for r in range(len(batch)):
            resp, lp, done = cut_at_eos(
                tokens[r].tolist(), logp[r].tolist(), set() if s.ignore_eos else self.eos, self.forbidden
            )
            result.append(Sample(owners[r], resp, lp, done))
        return result
