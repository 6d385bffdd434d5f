"""Multi-turn episodes on any rollout engine, token in, token out.

Each episode is one sample of one prompt. A turn continues from the exact ids of the episode so
far (the prompt, every sampled token, every observation token); the model's tokens carry loss mask
1 and their sampling log-probs, observation tokens mask 0 (no loss, no KL, no entropy). An episode
ends when a turn calls no tool (its answer) or a gym-shaped environment says done, after
`max_turns` turns, when a turn is cut at the response budget (`data.max_response_length` bounds
the whole episode), or when an observation would not fit.

With an environment, each episode has its own object: `reset(**row)` first (a text it returns is
appended to the prompt's last message, as TRL does, so the episode's prompt ids are its own), its
methods as tools (TRL's shape) or `step(action)` on every turn (gym's), its reward at the end.

Turns are generated for every live episode at once, so the engine batches across episodes; the
tool calls and steps of a turn run at once across the sandbox's processes.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from ..rollout import Request, Sample, Sampling
from . import calls
from .tools import ENV

STATS = ("turns", "tool_calls", "tool_errors", "tool_seconds", "cut_mid_call")


class BadRow(ValueError):
    """An environment's reset failed on a data row (the message names the row)."""


@dataclass
class Agent:
    """What an episode needs besides the engine: the settings, the sandbox, the tokenizer."""

    max_turns: int
    tool_call_format: str
    sandbox: object  # sandbox.Sandbox
    tool_names: set[str]
    shape: str | None  # the environment's: "trl", "gym", or None (tools only)
    env_reward: bool  # the environment gives each episode a reward
    tokenizer: object
    observations: calls.Observations
    max_prompt_length: int

    @classmethod
    def of(cls, spec, tokenizer) -> Agent:
        mt = spec.worker.rollout.multi_turn
        return cls.build(
            tokenizer,
            environment=mt.environment,
            tools=mt.tools,
            tool_names=mt.tool_names,
            max_turns=mt.max_turns,
            tool_call_format=mt.tool_call_format,
            workers=spec.worker.reward.num_cpus,
            timeout=mt.tool_timeout,
            limit=mt.max_tool_response_length,
            max_prompt_length=spec.data.max_prompt_length,
        )

    @classmethod
    def build(
        cls,
        tokenizer,
        *,
        environment: str | None = None,
        tools: str | None = None,
        tool_names: list[str] | None = None,
        max_turns: int = 4,
        tool_call_format: str = "hermes",
        workers: int = 1,
        timeout: float = 10.0,
        limit: int = 1024,
        max_prompt_length: int = 1024,
    ) -> Agent:
        from .sandbox import Sandbox
        from .tools import check

        info = check(environment, tools, tool_names)
        sandbox = Sandbox(environment, tools, tool_names, workers, timeout, limit)
        return cls(
            max_turns,
            tool_call_format,
            sandbox,
            {t["function"]["name"] for t in info["tools"]},
            info["shape"],
            bool(info.get("reward")),
            tokenizer,
            calls.Observations(tokenizer, "user" if info["shape"] == "gym" else "tool"),
            max_prompt_length,
        )


@dataclass
class Episode:
    key: int  # its number in the sandbox
    prompt: int
    ids: list[int]  # the next turn's input: the prompt and the response so far
    prompt_ids: list[int] | None = None  # its own prompt, when the environment's reset added to it
    response: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finished: bool = False
    done: bool = False
    reward: float = 0.0  # the environment's
    stats: dict = field(default_factory=lambda: dict.fromkeys(STATS, 0.0))

    def add(self, ids: list[int], mask: int, logprobs: list[float] | None = None) -> None:
        self.ids += ids
        self.response += ids
        self.mask += [mask] * len(ids)
        self.logprobs += logprobs if logprobs is not None else [0.0] * len(ids)

    def count(self, failed: bool, seconds: float) -> None:
        self.stats["tool_calls"] += 1
        self.stats["tool_errors"] += float(failed)
        self.stats["tool_seconds"] += seconds


def run(engine, prompts: list[Request], s: Sampling, agent: Agent) -> list[Sample]:
    """`s.n` episodes per prompt, in prompt order."""
    order = [i for i in range(len(prompts)) for _ in range(s.n)]
    episodes = [Episode(k, i, list(prompts[i].ids)) for k, i in enumerate(order)]
    try:
        if agent.shape:
            _reset(episodes, prompts, agent)
        for turn in range(agent.max_turns):
            if not _turn([e for e in episodes if not e.done], engine, s, agent, turn):
                break
        if agent.shape == "trl" and agent.env_reward:
            got = agent.sandbox.run([("reward", e.key, None) for e in episodes])
            for e, (ok, value, _) in zip(episodes, got, strict=True):
                e.reward = value if ok else float("nan")  # counted as a reward error, scored 0
    finally:
        if agent.shape:
            agent.sandbox.run([("close", e.key, None) for e in episodes])
    return [
        Sample(
            e.prompt,
            e.response,
            e.logprobs,
            e.finished,
            mask=e.mask,
            stats=e.stats,
            prompt_ids=e.prompt_ids,
            reward=e.reward if agent.env_reward else None,
        )
        for e in episodes
    ]


def _reset(episodes: list[Episode], prompts: list[Request], agent: Agent) -> None:
    got = agent.sandbox.run([("reset", e.key, prompts[e.prompt].reset["row"]) for e in episodes])
    for e, (ok, text, _) in zip(episodes, got, strict=True):
        r = prompts[e.prompt].reset
        if not ok:
            raise BadRow(f"{ENV}: reset failed on {r['where']}: {text.removeprefix('Error: ')}")
        if text:  # appended to the last message, as TRL does (no separator)
            head, tail = r["around"]
            ids = agent.tokenizer(head + text + tail, add_special_tokens=False)["input_ids"]
            e.prompt_ids = ids[: agent.max_prompt_length]
            e.ids = list(e.prompt_ids)


def _turn(live: list[Episode], engine, s: Sampling, agent: Agent, turn: int) -> bool:
    """One turn of every live episode; False when none was live."""
    if not live:
        return False
    room = [s.max_tokens - len(e.response) for e in live]
    turn_s = replace(s, n=1, max_tokens=max(room), seed=s.seed + turn * 104_729)
    outputs = engine.generate([Request(e.ids) for e in live], turn_s)
    last = turn == agent.max_turns - 1
    pending: list[tuple[Episode, object, str]] = []
    for e, out, limit in zip(live, outputs, room, strict=True):
        cut = len(out.response) > limit
        e.add(out.response[:limit], 1, out.logprobs[:limit])
        e.stats["turns"] += 1
        text = agent.tokenizer.decode(out.response[:limit], skip_special_tokens=True)
        if cut or not out.finished:  # out of budget: the episode ends here
            e.done = True
            e.stats["cut_mid_call"] = float(calls.cut_mid_call(text))
            continue
        eos_text = agent.tokenizer.decode(out.response[-1:])
        if agent.shape == "gym":  # the whole turn is the action, the last one too (its reward)
            pending.append((e, text, eos_text))
            continue
        found = calls.parse(text, agent.tool_call_format)
        if not found or last:
            e.done, e.finished = True, True
            continue
        pending.append((e, found, eos_text))
    (_step if agent.shape == "gym" else _observe)(pending, agent, s.max_tokens, last)
    return True


def _observe(pending: list[tuple[Episode, list, str]], agent: Agent, budget: int, _last: bool) -> None:
    """Every pending call of the turn run at once; each episode's observations appended, or the
    episode ended where they do not fit in the response budget."""
    wanted = [
        ("call", e.key, c)
        for e, found, _ in pending
        for c in found
        if not isinstance(c, str) and c[0] in agent.tool_names
    ]
    results = iter(agent.sandbox.run(wanted) if wanted else [])
    known = ", ".join(sorted(agent.tool_names))
    for e, found, eos_text in pending:
        contents = []
        for c in found:
            if isinstance(c, str):  # a call that could not be read
                text, ok, seconds = c, False, 0.0
            elif c[0] not in agent.tool_names:
                text, ok, seconds = f"Error: there is no tool {c[0]!r} (the tools are {known})", False, 0.0
            else:
                ok, text, seconds = next(results)
            contents.append(text)
            e.count(not ok, seconds)
        _append(e, agent.observations.ids(contents, eos_text), budget)


def _step(pending: list[tuple[Episode, str, str]], agent: Agent, budget: int, last: bool) -> None:
    """A gym-shaped environment's step on every pending action; its observation appended as the
    next user turn, unless the episode is done."""
    got = agent.sandbox.run([("step", e.key, action) for e, action, _ in pending])
    for (e, _, eos_text), (ok, value, seconds) in zip(pending, got, strict=True):
        e.count(not ok, seconds)
        observation, reward, done = value if ok else (value, 0.0, False)
        e.reward += reward
        if done or observation is None or last:
            e.done, e.finished = True, True
            continue
        _append(e, agent.observations.ids([observation], eos_text), budget)


def _append(e: Episode, ids: list[int], budget: int) -> None:
    if len(e.response) + len(ids) >= budget:  # no room left for an answer after it
        e.done = True
        return
    e.add(ids, 0)


def with_environment(scores: dict, reward: float | None) -> dict:
    """A sample's scores with its environment's reward: under `environment`, and added to
    `overall` (as TRL adds get_reward() to the reward functions'); NaN (get_reward() raised) as 0."""
    if reward is None:
        return scores
    env = 0.0 if reward != reward else float(reward)
    return {**scores, "environment": env, "overall": float(scores.get("overall", 0.0)) + env}


def last_turn(ids, mask, length: int) -> list[int]:
    """The model's last turn in an episode's response: its tokens after the last observation."""
    gaps = (~mask[:length].bool()).nonzero()
    start = int(gaps[-1]) + 1 if len(gaps) else 0
    return ids[start:length].tolist()
