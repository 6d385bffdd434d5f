"""Multi-turn episodes on a real model (SmolLM2-135M-Instruct, offline) with the calculator tool of
blueprints/tools_calculator.yaml: token in, token out (every id the engine sampled is an id the
trainer scores, in place; observations are the template's delta), the loss mask on exactly the
model's tokens, the engine's log-probs equal to the trainer's over whole episodes, a short run
through the CLI whose model learns the task (the suite's check that RL raises reward on a real
model), and a gym-shaped environment played by the model."""

from __future__ import annotations

import json

import pytest
import torch

from r1cloud.agents.episodes import Agent, last_turn, run
from r1cloud.rollout.engine import Request, Sampling, eos_ids
from r1cloud.validate import load_spec
from tinyrun import ROOT, run_of, run_trainer

pytestmark = pytest.mark.slow


class Recorder:
    """The engine itself, with each turn's requests and samples kept for the test to compare."""

    def __init__(self, engine):
        self.engine, self.turns = engine, []

    def generate(self, prompts, sampling):
        out = self.engine.generate(prompts, sampling)
        self.turns.append(([list(p.ids) for p in prompts], out))
        return out


def prompts_of(tok, model, n: int) -> tuple[list[Request], list[dict]]:
    from r1cloud.data.loader import PromptSet

    spec = load_spec(
        ROOT / "blueprints" / "tools_calculator.yaml", [f"worker.actor.model.model_path={model}"]
    ).spec
    rows = PromptSet(spec.data.val_files, tok, spec.data, limit=n)
    return [Request(p.prompt_ids) for p in rows.prompts], [json.loads(x) for x in open(spec.data.val_files)][
        :n
    ]


def test_episodes_are_token_in_token_out_and_score_as_sampled(smollm2):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from r1cloud.rollout.hf import HFEngine
    from r1cloud.trainer.model import packed_log_probs

    tok = AutoTokenizer.from_pretrained(smollm2)
    engine = Recorder(
        HFEngine(str(smollm2), eos_ids(str(smollm2), tok), tok.pad_token_id, torch.float32, "cpu")
    )
    agent = Agent.build(
        tok,
        tools=str(ROOT / "tools" / "calculator.py"),
        max_turns=3,
        tool_call_format="python",
        timeout=5,
        limit=64,
    )
    requests, rows = prompts_of(tok, smollm2, 6)
    try:
        samples = run(engine, requests, Sampling(n=4, temperature=1.0, max_tokens=64, seed=5), agent)
    finally:
        agent.sandbox.close()
    called = [s for s in samples if s.stats["tool_calls"] > 0]
    assert len(called) >= 4, [s.stats for s in samples]  # the worked example teaches the call
    # Replay: each episode's ids are exactly the ids each of its turns was given and sampled (turn
    # t's requests are the episodes still going, in order).
    mismatches = 0
    for k, s in enumerate(samples):
        at = 0
        for t, (given, outs) in enumerate(engine.turns):
            live = [j for j, x in enumerate(samples) if x.stats["turns"] > t]
            if k not in live:
                break
            j = live.index(k)
            assert given[j] == requests[s.prompt].ids + s.response[:at]  # the exact ids so far
            out = outs[j]
            got = s.response[at : at + len(out.response)]
            mismatches += sum(a != b for a, b in zip(got, out.response, strict=False))
            assert s.mask[at : at + len(got)] == [1] * len(got)
            assert s.logprobs[at : at + len(got)] == out.logprobs[: len(got)]
            at += len(got)
            obs = at
            while at < len(s.response) and s.mask[at] == 0:
                at += 1
            if at > obs:  # an observation: the template's tool turn around the tool's answer
                text = tok.decode(s.response[obs:at])
                assert "<|im_start|>tool\n" in text and text.endswith("<|im_start|>assistant\n")
        assert at == len(s.response), f"episode {k}: {at} of {len(s.response)} tokens accounted for"
        assert len(s.response) <= 64 and len(s.mask) == len(s.response) == len(s.logprobs)
    assert mismatches == 0
    # a correct call's observation holds the product; the answer is read from the last turn only
    right = [s for s in called if f"\n{int(rows[s.prompt]['answer'])}<|im_end|>" in tok.decode(s.response)]
    assert right, "no episode called multiply with the question's numbers"
    s = right[0]
    answer = tok.decode(last_turn(torch.tensor(s.response), torch.tensor(s.mask), len(s.response)))
    assert "<|im_start|>tool" not in answer
    # the trainer's log-probs of the whole episodes equal the engine's on the model's tokens
    model = AutoModelForCausalLM.from_pretrained(smollm2, dtype=torch.float32).eval()
    with torch.no_grad():
        scored = packed_log_probs(model, [(requests[s.prompt].ids, s.response) for s in samples], 1.0)
    worst = max(
        (torch.tensor(s.logprobs) - lp)[torch.tensor(s.mask, dtype=torch.bool)].abs().max().item()
        for s, lp in zip(samples, scored, strict=True)
    )
    assert worst <= 1e-4, worst


def test_a_short_tool_run_learns_the_task_with_the_tool(smollm2, tmp_path):
    """Learning is checked here, on a real model: 4 GRPO steps of the tool quickstart raise the
    reward, the tool calls and the held-out accuracy (sampled, 64 questions, before the first step
    and after the last). Two updates a step, so old log-probs are recomputed and the engine's
    log-probs are compared with the trainer's over whole episodes after every weight sync."""
    steps = 4
    run_dir = run_of(
        ROOT / "blueprints" / "tools_calculator.yaml",
        [
            f"worker.actor.model.model_path={smollm2}",
            f"trainer.max_steps={steps}",
            "trainer.val_freq=-1",  # before the first step and after the last
            "trainer.save_freq=-1",
            "data.rollout_batch_size=4",
            "worker.actor.global_batch_size=2",
        ],
        tmp_path / "run",
    )
    r = run_trainer(run_dir, timeout=1200)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps_ = [m for m in lines if "agent/tool_calls" in m and "reward/overall" in m]
    val = [m["val/accuracy_reward"] for m in lines if "val/accuracy_reward" in m]
    curve = [m["reward/overall"] for m in steps_]
    calls_ = [m["agent/tool_calls"] for m in steps_]
    print("reward:", curve, "tool calls:", calls_, "held-out accuracy:", val)
    assert len(steps_) == steps and len(val) == 2
    assert curve[-1] > curve[0] + 0.1 and calls_[-1] > calls_[0], (curve, calls_)
    assert val[1] > val[0] + 0.15, f"held-out accuracy did not rise: {val[0]:.3f} -> {val[1]:.3f}"
    assert all(m["agent/turns"] >= 1 and m["agent/tool_errors"] <= m["agent/tool_calls"] for m in steps_)
    # the engine's sampling log-probs against the trainer's over whole episodes, model tokens only
    diffs = [m["rollout/logp_diff_max"] for m in steps_]
    assert max(diffs) <= 1e-4, diffs  # after each weight sync too (a tied output layer included)
    generations = [json.loads(x) for x in (run_dir / "generations.jsonl").read_text().splitlines()]
    assert any("multiply(" in json.dumps(g) for g in generations)  # every turn is kept


def test_a_gym_environment_steps_each_turn_and_sums_its_rewards(smollm2, tmp_path):
    """GuessNumber (envs/guess_number.py) played by the real model: each finished turn is one
    step(), its observation the next user turn, the reward the sum the environment gave — checked by
    playing the same actions on a local copy of the environment."""
    import importlib.util

    from transformers import AutoTokenizer

    from r1cloud.data.loader import PromptSet
    from r1cloud.rollout.hf import HFEngine
    from r1cloud.spec.models import DataConfig

    tok = AutoTokenizer.from_pretrained(smollm2)
    engine = HFEngine(str(smollm2), eos_ids(str(smollm2), tok), tok.pad_token_id, torch.float32, "cpu")
    data = tmp_path / "guess.jsonl"
    data.write_text(
        "".join(
            json.dumps({"prompt": "Guess my number.", "answer": "", "secret": s}) + "\n" for s in (17, 60)
        )
    )
    where = str(ROOT / "envs" / "guess_number.py")
    prompts = PromptSet(str(data), tok, DataConfig(max_prompt_length=128), environment=True).prompts
    agent = Agent.build(tok, environment=f"{where}:GuessNumber", max_turns=3, max_prompt_length=128)
    try:
        requests = [Request(p.prompt_ids, reset=p.reset) for p in prompts]
        samples = run(engine, requests, Sampling(n=3, temperature=1.0, max_tokens=96, seed=3), agent)
    finally:
        agent.sandbox.close()
    spec = importlib.util.spec_from_file_location("guess_number", where)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert max(s.stats["turns"] for s in samples) >= 2, [s.stats for s in samples]
    for s in samples:
        assert tok.decode(s.prompt_ids).endswith(
            "Guess my number. The number is between 1 and 100.<|im_end|>\n<|im_start|>assistant\n"
        )
        mask = torch.tensor(s.mask)
        starts = [0] + [i for i in range(1, len(mask)) if mask[i] and not mask[i - 1]]
        ends = [i for i in range(1, len(mask)) if not mask[i] and mask[i - 1]] + [len(mask)]
        turns = [
            tok.decode(s.response[a:b], skip_special_tokens=True) for a, b in zip(starts, ends, strict=True)
        ]
        local = module.GuessNumber()
        local.reset(**json.loads(data.read_text().splitlines()[s.prompt]))
        expected, shown = 0.0, []
        for k, action in enumerate(turns):
            if s.response[ends[k] - 1] != tok.eos_token_id:
                break  # cut at the budget before its end: never stepped
            obs, reward, done = local.step(action)
            expected += reward
            shown.append(obs)
            if done:
                break
        assert s.reward == pytest.approx(expected) and s.stats["tool_calls"] == len(shown)
        for (a, b), obs in zip(zip(ends, starts[1:], strict=False), shown, strict=False):  # user turns
            assert tok.decode(s.response[a:b]).endswith(
                f"<|im_start|>user\n{obs}<|im_end|>\n<|im_start|>assistant\n"
            )
