"""`r1cloud try` for a multi-turn run: a few episodes of the training data played by the base model
(the hf engine, here, before any GPU is rented), each with its transcript, counts and reward — the
tools, environment, prompt and reward as the trainer will use them."""

from __future__ import annotations


def play(spec, k: int, progress=lambda msg: None) -> list[dict]:
    """One episode for each of the first `k` training prompts, sampled as the trainer's first step."""
    import torch

    from r1cloud.agents import episodes
    from r1cloud.agents.tools import tool_schemas
    from r1cloud.core.dtypes import torch_dtype
    from r1cloud.data.loader import PromptSet, load_tokenizer
    from r1cloud.rewards.pool import from_config, reward_input
    from r1cloud.rollout.engine import Request, Sampling, eos_ids
    from r1cloud.rollout.hf import HFEngine
    from r1cloud.rollout.sampling import sampling

    d, m, mt = spec.data, spec.worker.actor.model, spec.worker.rollout.multi_turn
    progress("loading the tokenizer")
    tokenizer, processor = load_tokenizer(m, d)
    rows = PromptSet(
        d.train_files, tokenizer, d, processor=processor, limit=k, tools=tool_schemas(mt),
        environment=bool(mt.environment),
    )  # fmt: skip
    prompts = rows.prompts
    progress(f"loading {m.model_path}")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch_dtype(spec.worker.rollout.dtype) if device == "cuda" else torch.float32
    engine = HFEngine(m.model_path, eos_ids(m.model_path, tokenizer), tokenizer.pad_token_id, dtype, device)
    agent = episodes.Agent.of(mt, d, tokenizer, processor, spec.worker.reward.num_cpus)
    progress(f"playing {len(prompts)} episode(s)")
    requests = [
        Request(p.prompt_ids, p.raw_ids, p.images, rows.image_inputs(i), p.reset)
        for i, p in enumerate(prompts)
    ]
    try:
        s = Sampling(**{**sampling(spec, 0), "n": 1})
        samples = episodes.run(engine, requests, s, agent)
    finally:
        agent.sandbox.close()
    progress("scoring the last turns")
    reward = from_config(spec.worker.reward, bounded=True)
    skip = spec.worker.reward.skip_special_tokens
    try:
        answers = [
            tokenizer.decode(
                episodes.last_turn(torch.tensor(x.response), torch.tensor(x.mask), len(x.response)),
                skip_special_tokens=skip,
            )
            for x in samples
        ]
        inputs = [
            reward_input(reward, tokenizer, prompts[x.prompt], a, len(x.response), skip)
            for x, a in zip(samples, answers, strict=True)
        ]
        scores, _ = reward(inputs)
    finally:
        reward.close()
    return [
        {
            "prompt": tokenizer.decode(
                x.prompt_ids or prompts[x.prompt].prompt_ids, skip_special_tokens=False
            ),
            "transcript": tokenizer.decode(x.response, skip_special_tokens=False),
            "finished": x.finished,
            "stats": x.stats,
            "scores": episodes.with_environment(score, x.reward),
        }
        for x, score in zip(samples, scores, strict=True)
    ]
