"""Multi-turn episodes on any rollout engine, token in, token out.

Each episode is one sample of one prompt. A turn continues from the exact ids of the episode so
far (the prompt, every sampled token, every observation token); the model's tokens carry loss mask
1 and their sampling log-probs, observation tokens mask 0 (no loss, no KL, no entropy). An episode
ends when a turn calls no tool (its answer), after `max_turns` turns, when a turn is cut at the
response budget (`data.max_response_length` bounds the whole episode), or when an observation
would not fit.

Turns are generated for every live episode at once, so the engine batches across episodes; the
tool calls of a turn run at once across the tool pool.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from ..rollout import Request, Sample, Sampling
from . import calls

STATS = ("turns", "tool_calls", "tool_errors", "tool_seconds", "cut_mid_call")


@dataclass
class Agent:
    """What an episode needs besides the engine: the settings, the tools, the tokenizer."""

    max_turns: int
    tool_call_format: str
    tools: object  # tools.ToolPool
    tokenizer: object
    observations: calls.Observations

    @classmethod
    def of(cls, spec, tokenizer) -> Agent:
        from .tools import ToolPool

        mt = spec.worker.rollout.multi_turn
        pool = ToolPool(
            mt.tools, mt.tool_names, spec.worker.reward.num_cpus, mt.tool_timeout, mt.max_tool_response_length
        )
        return cls(mt.max_turns, mt.tool_call_format, pool, tokenizer, calls.Observations(tokenizer))


@dataclass
class Episode:
    prompt: int
    ids: list[int]  # the next turn's input: the prompt and the response so far
    response: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finished: bool = False
    done: bool = False
    stats: dict = field(default_factory=lambda: dict.fromkeys(STATS, 0.0))

    def add(self, ids: list[int], mask: int, logprobs: list[float] | None = None) -> None:
        self.ids += ids
        self.response += ids
        self.mask += [mask] * len(ids)
        self.logprobs += logprobs if logprobs is not None else [0.0] * len(ids)


def run(engine, prompts: list[Request], s: Sampling, agent: Agent) -> list[Sample]:
    """`s.n` episodes per prompt, in prompt order."""
    episodes = [Episode(i, list(p.ids)) for i, p in enumerate(prompts) for _ in range(s.n)]
    for turn in range(agent.max_turns):
        live = [e for e in episodes if not e.done]
        if not live:
            break
        room = [s.max_tokens - len(e.response) for e in live]
        turn_s = replace(s, n=1, max_tokens=max(room), seed=s.seed + turn * 104_729)
        outputs = engine.generate([Request(e.ids) for e in live], turn_s)
        pending: list[tuple[Episode, list, str]] = []
        for e, out, limit in zip(live, outputs, room, strict=True):
            cut = len(out.response) > limit
            e.add(out.response[:limit], 1, out.logprobs[:limit])
            e.stats["turns"] += 1
            text = agent.tokenizer.decode(out.response[:limit], skip_special_tokens=True)
            if cut or not out.finished:  # out of budget: the episode ends here
                e.done = True
                e.stats["cut_mid_call"] = float(calls.cut_mid_call(text))
                continue
            found = calls.parse(text, agent.tool_call_format)
            if not found or turn == agent.max_turns - 1:
                e.done, e.finished = True, True
                continue
            pending.append((e, found, agent.tokenizer.decode(out.response[-1:])))
        _observe(pending, agent, s.max_tokens)
    return [
        Sample(e.prompt, e.response, e.logprobs, e.finished, mask=e.mask, stats=e.stats) for e in episodes
    ]


def _observe(pending: list[tuple[Episode, list, str]], agent: Agent, budget: int) -> None:
    """Every pending call of the turn run at once; each episode's observations appended, or the
    episode ended where they do not fit in the response budget."""
    wanted = [c for _, found, _ in pending for c in found if not isinstance(c, str)]
    results = iter(agent.tools.call_all(wanted) if wanted else [])
    for e, found, eos_text in pending:
        contents = []
        for c in found:
            text, failed, seconds = (c, True, 0.0) if isinstance(c, str) else next(results)
            contents.append(text)
            e.stats["tool_calls"] += 1
            e.stats["tool_errors"] += float(failed)
            e.stats["tool_seconds"] += seconds
        ids = agent.observations.ids(contents, eos_text)
        if len(e.response) + len(ids) >= budget:  # no room left for an answer after it
            e.done = True
            continue
        e.add(ids, 0)


def last_turn(ids, mask, length: int) -> list[int]:
    """The model's last turn in an episode's response: its tokens after the last observation."""
    gaps = (~mask[:length].bool()).nonzero()
    start = int(gaps[-1]) + 1 if len(gaps) else 0
    return ids[start:length].tolist()
