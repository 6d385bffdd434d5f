"""r1cloud's GRPO update against TRL's GRPOTrainer (trl 1.16, the peer in benchmarks/trainer_vs_trl.py)
on TRL's own batches: the benchmark's claim that both tools run the same loss, checked in their code.

TRL runs three real steps on the tiny Qwen2-VL and the shapes pictures (its generation, rewards,
group advantages, DAPO token-mean loss, AdamW at a constant lr), and what it trains on and its
gradients before clipping are kept (two of its methods wrapped, nothing replaced). The same rows then
go through r1cloud's trainer (two FSDP workers on gloo, token-mean, clip 0.2/0.28, on-policy): the
first step's gradients must agree, and after two optimizer steps on TRL's first two batches (clipping
and AdamW's moments), the third's too."""

from __future__ import annotations

import json

import pytest
import steps

from r1cloud.spec import load_resolved
from r1cloud.trainer.driver import Trainer

pytestmark = pytest.mark.slow


def trl_steps(model, shapes, tmp_path, monkeypatch, steps: int) -> dict:
    """TRL's `steps` steps on the first two pictures, 4 samples each: each one's batch and pre-clip
    gradients."""
    import accelerate
    import trl
    from datasets import Dataset
    from PIL import Image
    from transformers import AutoProcessor

    from r1cloud.media import compat as vision_compat

    vision_compat.install()  # Qwen-VL's processor wants torchvision, absent here (r1cloud's stand-in)
    rows = [json.loads(x) for x in (shapes / "train.jsonl").read_text().splitlines()[:2]]
    data = Dataset.from_list(
        [  # TRL puts the picture before the text, as the rows' leading <image>
            {
                "prompt": [{"role": "user", "content": r["problem"].replace("<image>", "")}],
                "images": [Image.open(shapes / r["images"][0]).convert("RGB")],
            }
            for r in rows
        ]
    )
    kept: dict = {"batches": [], "grads": []}
    generate = trl.GRPOTrainer._generate_and_score_completions

    def keep_batch(self, *a, **k):
        out = generate(self, *a, **k)
        kept["batches"].append(out)
        kept["model"] = self.model
        return out

    clip = accelerate.Accelerator.clip_grad_norm_

    def keep_grads(self, params, *a, **k):
        model = kept["model"]
        kept["grads"].append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
        return clip(self, params, *a, **k)

    monkeypatch.setattr(trl.GRPOTrainer, "_generate_and_score_completions", keep_batch)
    monkeypatch.setattr(accelerate.Accelerator, "clip_grad_norm_", keep_grads)

    def reward(completion_ids, **_):  # varies within a group, so advantages are not all zero
        return [float(sum(ids) % 3) for ids in completion_ids]

    config = trl.GRPOConfig(
        output_dir=str(tmp_path / "trl"), use_cpu=True, report_to=[], save_strategy="no", max_steps=steps,
        num_generations=4, per_device_train_batch_size=8, max_completion_length=8, learning_rate=1e-5,
        beta=0.0, loss_type="dapo", epsilon=0.2, epsilon_high=0.28, seed=3, shuffle_dataset=False,
        lr_scheduler_type="constant", weight_decay=0.0,  # max_grad_norm 1.0 and AdamW's betas: both defaults alike
        gradient_checkpointing=False, dataloader_num_workers=0, bf16=False,  # fp32, as the run (else autocast)
    )  # fmt: skip
    trl.GRPOTrainer(
        model=str(model), reward_funcs=reward, args=config, train_dataset=data,
        processing_class=AutoProcessor.from_pretrained(model),
    ).train()  # fmt: skip
    return kept


def test_grpo_update_equals_trls_on_its_own_batches(make_vl_run, tiny_vlm, shapes, tmp_path, monkeypatch):
    kept = trl_steps(tiny_vlm, shapes, tmp_path, monkeypatch, steps=3)
    assert all(b["advantages"].abs().max() > 0.5 for b in kept["batches"])  # a learning signal each step
    run = make_vl_run(
        "data.format_prompt=null", "algorithm.disable_kl=true", "algorithm.use_kl_loss=false",
        "worker.actor.clip_ratio_low=0.2", "worker.actor.clip_ratio_high=0.28",
        "worker.actor.optim.lr=1e-5", "worker.actor.optim.weight_decay=0.0", "worker.actor.max_grad_norm=1.0",
    )  # fmt: skip
    trainer = Trainer(run, load_resolved(run / "spec.yaml"))
    assert trainer.spec.worker.actor.loss_avg_mode == "token"  # EasyR1's token-mean
    assert trainer.spec.worker.actor.optim.lr_warmup_ratio == 0  # a constant lr, as TRL's here

    def rows(b) -> tuple[list[dict], float]:
        samples = []
        for r in range(len(b["advantages"])):
            i = r // 4  # TRL repeats each prompt num_generations times, in the data's order
            p = trainer.train_set.prompts[i]
            assert b["prompt_ids"][r][b["prompt_mask"][r].bool()].tolist() == p.prompt_ids  # the same prompt
            response = b["completion_ids"][r][b["completion_mask"][r].bool()].tolist()
            images = {"key": str(i), **trainer.train_set.image_inputs(i)}
            samples.append({"seq": (p.prompt_ids, response, images), "adv": float(b["advantages"][r])})
        total = float(sum(len(s["seq"][1]) for s in samples))
        assert total == float(b["num_items_in_batch"])  # TRL's DAPO divides by the same token count
        return samples, total

    def step(b, apply: bool) -> None:
        samples, total = rows(b)
        # on-policy, as TRL at num_iterations 1: the old log-probs are the current ones
        seqs = [s["seq"] for s in samples]
        old = [lp for rank in steps.log_probs(trainer, [[seqs[:4]], [seqs[4:]]]) for lp in rank[0]]
        for s, lp in zip(samples, old, strict=True):
            s["old"] = lp
        plan = [[{"total": total, "micro": [samples[:4]]}], [{"total": total, "micro": [samples[4:]]}]]
        steps.update(trainer, plan, apply=apply)

    def close(got: dict, want: dict, limit: float) -> None:
        assert set(got) == set(want)
        scale = max(g.abs().max().item() for g in want.values())
        gap = max((got[n] - want[n]).abs().max().item() for n in want) / scale
        assert gap <= limit, gap

    try:
        trainer.start_workers()
        step(kept["batches"][0], apply=False)
        first = trainer.call("full_grads")[0]  # and zeroes them
        for b in kept["batches"][:2]:  # two optimizer steps: clipping, AdamW and its moments
            step(b, apply=True)
        step(kept["batches"][2], apply=False)
        third = trainer.call("full_grads")[0]
    finally:
        trainer.shutdown()
    want = kept["grads"][0]
    assert any(n.startswith("model.visual.") and want[n].abs().max() > 0 for n in want)  # the pictures count
    close(first, want, 1e-5)
    close(third, kept["grads"][2], 1e-5)  # 4.5e-7 measured; with r1cloud's lr 10% off, 5.4e-3
