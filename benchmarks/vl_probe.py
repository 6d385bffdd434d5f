"""A first-token GRPO probe for the vision-language quickstart, outside the trainer.

The quickstart's answers are one token, so its RL is a contextual bandit: one forward per prompt
gives the first token's distribution, the group's 8 samples are drawn from it, and the update is
the policy gradient of the group-normalised reward (GRPO with one update a step, ratio 1). This
probe runs that loop on r1cloud's own prompt pipeline (the blueprint's data, format prompt, chat
template and processor) in about a minute, so a recipe can be screened over many seeds before a
6-minute trainer run. It is a screen, not the product: the trainer decides (benchmarks/vl_seeds.py).

    .venv/bin/python benchmarks/vl_probe.py [KEY=VALUE ...] [--seeds 1 2 3] [--steps 60]

KEY=VALUE are blueprint overrides, as `r1cloud train` takes them.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from vl_seeds import generator  # noqa: E402  (this folder)

from r1cloud.data.loader import PromptSet, load_tokenizer  # noqa: E402
from r1cloud.rewards import pool as rewards  # noqa: E402
from r1cloud.validate.read import load_spec  # noqa: E402


def batch_inputs(prompts: PromptSet, idx: list[int], pad: int) -> dict:
    ps = [prompts.prompts[i] for i in idx]
    width = max(len(p.prompt_ids) for p in ps)
    ids = torch.full((len(ps), width), pad)
    mask = torch.zeros((len(ps), width), dtype=torch.long)
    for row, p in enumerate(ps):  # left padding: the last position is every prompt's last token
        ids[row, width - len(p.prompt_ids) :] = torch.tensor(p.prompt_ids)
        mask[row, width - len(p.prompt_ids) :] = 1
    cache = prompts.__dict__.setdefault("_probe_images", {})  # the processor once per picture
    imgs = [cache[i] if i in cache else cache.setdefault(i, prompts.image_inputs(i)) for i in idx]
    out = {"input_ids": ids, "attention_mask": mask}
    for key in imgs[0]:
        out[key] = torch.cat([x[key] for x in imgs])
    return out


def run(spec, seed: int, steps: int, val_every: int, log=print) -> list[tuple[int, float]]:
    from transformers import AutoModelForImageTextToText

    s = spec
    tok, proc = load_tokenizer(s.worker.actor.model, s.data)
    train = PromptSet(s.data.train_files, tok, s.data, processor=proc)
    val = PromptSet(s.data.val_files, tok, s.data, processor=proc)
    r = s.worker.reward
    fn, module = rewards.load_function(r.reward_function, r.reward_function_name, r.reward_function_kwargs)
    sequential = getattr(module, "REWARD_TYPE", "batch") != "batch"
    torch.manual_seed(seed)
    model = AutoModelForImageTextToText.from_pretrained(s.worker.actor.model.model_path, dtype=torch.float32)
    for p in model.model.text_model.parameters():
        p.requires_grad_(False)
    for p in model.lm_head.parameters():
        p.requires_grad_(False)
    params = [p for p in model.parameters() if p.requires_grad]
    o = s.worker.actor.optim
    opt = torch.optim.AdamW(params, lr=o.lr, weight_decay=o.weight_decay, betas=tuple(o.betas))
    warmup = o.lr_warmup_steps or 0  # as the trainer's: k / warmup for the k-th update (the first at 0)
    schedule = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: k / warmup if k < warmup else 1.0)
    n, bs, temp = s.worker.rollout.n, s.data.rollout_batch_size, s.worker.rollout.temperature
    gen = torch.Generator().manual_seed(seed)
    order: list[int] = []
    curve = []

    def score(texts, truths):
        inputs = [{"response": t, "ground_truth": g} for t, g in zip(texts, truths, strict=True)]
        out = [fn(x) for x in inputs] if sequential else fn(inputs)
        return [r["overall"] for r in out], [r.get("accuracy", r["overall"]) for r in out]

    def validate(step):
        model.eval()
        accs = []
        with torch.no_grad():
            for lo in range(0, len(val), 32):
                idx = list(range(lo, min(lo + 32, len(val))))
                logits = model(**batch_inputs(val, idx, tok.pad_token_id)).logits[:, -1]
                texts = tok.batch_decode(logits.argmax(-1)[:, None])
                accs += score(texts, [val.prompts[i].ground_truth for i in idx])[1]
        model.train()
        curve.append((step, sum(accs) / len(accs)))
        log(f"  seed {seed} step {step:3d} val acc {curve[-1][1]:.3f}")

    validate(0)
    t0 = time.time()
    for step in range(1, steps + 1):
        if len(order) < bs:
            order += torch.randperm(len(train), generator=gen).tolist()
        idx, order = order[:bs], order[bs:]
        logp = torch.log_softmax(model(**batch_inputs(train, idx, tok.pad_token_id)).logits[:, -1] / temp, -1)
        picks = torch.multinomial(logp.detach().exp(), n, replacement=True, generator=gen)  # (bs, n)
        texts = tok.batch_decode(picks.reshape(-1, 1))
        truths = [train.prompts[i].ground_truth for i in idx for _ in range(n)]
        r = torch.tensor(score(texts, truths)[0]).view(bs, n)
        if s.algorithm.adv_estimator == "reinforce_plus_plus":  # whitened over the batch
            adv = (r - r.mean()) / (r.std() + 1e-8)
        else:  # grpo: normalised within each prompt's group
            adv = (r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + 1e-6)
        loss = -(adv * logp.gather(1, picks)).mean()
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, s.worker.actor.max_grad_norm)
        opt.step()
        schedule.step()
        if step % val_every == 0 or step == steps:
            log(f"  seed {seed} step {step:3d} train reward {r.mean():.3f} ({time.time() - t0:.0f} s)")
            validate(step)
    return curve


def main() -> None:
    sys.stdout.reconfigure(line_buffering=True)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--blueprint", default=str(ROOT / "blueprints/quickstart_vl.yaml"))
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--val-every", type=int, default=15)
    ap.add_argument("overrides", nargs="*")
    a = ap.parse_args()
    over = [f"worker.actor.model.model_path={ROOT / '.models/SmolVLM-shapes'}", *a.overrides]
    spec = load_spec(a.blueprint, over).spec
    steps = a.steps or spec.trainer.max_steps
    ceiling = generator().blind_ceiling(spec.data.val_files)[0]
    print(f"blind ceiling {ceiling:.3f}; {steps} steps; overrides {a.overrides}")
    finals = []
    for seed in a.seeds:
        curve = run(spec, seed, steps, a.val_every)
        finals.append(curve[-1][1])
    hit = sum(f >= ceiling + 0.2 for f in finals)
    print(f"final val acc {' '.join(f'{f:.3f}' for f in finals)}; {hit}/{len(finals)} at ceiling+0.20")


if __name__ == "__main__":
    main()
