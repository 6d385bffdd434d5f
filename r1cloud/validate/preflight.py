"""`r1cloud try`: the check before renting GPUs. Renders prompts from the training data through the
format prompt and chat template, and scores the dataset's own answers — and corrupted ones — with
the reward function, so a reward that cannot tell right from wrong (or a wrong answer_key, or a
format the answers never meet) shows up in seconds, not after hours of flat reward.

The dataset's answer is written as a response in each of the usual shapes (bare, `\\boxed{}`,
`<think>…</think>` + boxed, `<answer>` tags, an `Answer:` line) and the best-scoring shape is kept:
that is the reward a perfect policy would get. A corrupted answer (another row's answer, or the
answer changed) in the same shape should score lower.
"""

from __future__ import annotations

from dataclasses import dataclass

SHAPES = {
    "bare": "{a}",
    "boxed": "The answer is \\boxed{{{a}}}.",
    "think+boxed": "<think>Working it out.</think> The answer is \\boxed{{{a}}}.",
    "think+answer": "<think>Working it out.</think><answer>{a}</answer>",
    "Answer: line": "Working it out.\nAnswer: {a}",
}


@dataclass
class Row:
    content: str
    prompt_tokens: int
    answer: str
    shape: str
    own: float
    corrupted: float
    images: int = 0  # images in the prompt
    image_tokens: int = 0  # the image tokens they expand to (counted in prompt_tokens)


def corrupt(answer: str, other: str) -> str:
    if other.strip() and other.strip() != answer.strip():
        return other
    if any(c.isdigit() for c in answer):
        i = max(i for i, c in enumerate(answer) if c.isdigit())
        return answer[:i] + str((int(answer[i]) + 1) % 10) + answer[i + 1 :]
    return answer + " not"


def run(spec, n: int, progress=lambda msg: None) -> tuple[list[Row], dict]:
    from r1cloud.data.loader import PromptSet, load_tokenizer
    from r1cloud.rewards.pool import RewardDeadline, from_config, reward_input

    d, r = spec.data, spec.worker.reward
    progress("loading the tokenizer")
    source = spec.worker.actor.model.tokenizer_path or spec.worker.actor.model.model_path
    try:
        tokenizer, processor = load_tokenizer(spec.worker.actor.model, d)
    except OSError as e:
        raise ValueError(f"cannot load the tokenizer of {source}: {str(e).splitlines()[0]}") from None
    progress(f"reading {d.train_files}")
    prompts = PromptSet(
        d.train_files,
        tokenizer,
        d,
        filter_overlong=False,
        limit=n,
        probs=d.train_files_probs,
        processor=processor,
    )
    reward = from_config(r, bounded=True)

    def inputs(answers: list[str], shape: str) -> list[dict]:
        texts = [SHAPES[shape].format(a=a) for a in answers]
        return [
            reward_input(reward, tokenizer, p, t, len(tokenizer(t)["input_ids"]))
            for p, t in zip(prompts.prompts, texts, strict=True)
        ]

    try:
        own = [p.ground_truth for p in prompts.prompts]
        best: dict[str, list[float]] = {}
        errors = 0
        for shape in SHAPES:
            progress(f"scoring the answers as {shape}")
            scores, e = reward(inputs(own, shape))
            best[shape], errors = [s["overall"] for s in scores], errors + e
        shape = max(best, key=lambda k: sum(best[k]))
        others = own[1:] + own[:1]
        bad = [corrupt(a, o) for a, o in zip(own, others, strict=True)]
        progress("scoring corrupted answers")
        scores, e = reward(inputs(bad, shape))
        errors += e
    except RewardDeadline as e:
        raise ValueError(str(e)) from None
    finally:
        reward.close()
    image_token = processor.image_token_id if processor is not None else None
    first = next(iter(prompts.prompts), None)
    rows = [
        Row(
            p.content,
            p.length,
            p.ground_truth,
            shape,
            good,
            s["overall"],
            len(p.images),
            sum(t == image_token for t in p.prompt_ids) if p.images else 0,
        )  # fmt: skip
        for p, good, s in zip(prompts.prompts, best[shape], scores, strict=True)
    ]
    summary = {
        "shape": shape,
        "own_mean": sum(x.own for x in rows) / max(len(rows), 1),
        "corrupted_mean": sum(x.corrupted for x in rows) / max(len(rows), 1),
        "overlong": sum(x.prompt_tokens > d.max_prompt_length for x in rows),
        "max_prompt_length": d.max_prompt_length,
        "errors": errors,
        "samples": len(rows) * (len(SHAPES) + 1),
        "reasons": sorted(getattr(reward, "reasons", ())),
        "columns": prompts.columns,
        "first_prompt": prompts.render(first.content, bool(first.images), first.history) if first else "",
    }
    return rows, summary
