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

from r1cloud.agents import calls
from r1cloud.agents.sandbox import Sandbox
from r1cloud.agents.tools import ENV, check
from r1cloud.rollout.engine import Request, Sample, Sampling, request_seed

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
    def of(cls, mt, data, tokenizer, processor=None, workers: int = 1) -> Agent:
        """From the blueprint's multi-turn section (worker.rollout.multi_turn) and its data
        section; `workers`: the sandbox's processes (worker.reward.num_cpus)."""
        return cls.build(
            tokenizer,
            processor=processor,
            pixels=(data.min_pixels, data.max_pixels),
            environment=mt.environment,
            tools=mt.tools,
            tool_names=mt.tool_names,
            max_turns=mt.max_turns,
            tool_call_format=mt.tool_call_format,
            workers=workers,
            timeout=mt.tool_timeout,
            limit=mt.max_tool_response_length,
            max_prompt_length=data.max_prompt_length,
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
        processor=None,
        pixels: tuple = (None, None),
    ) -> Agent:
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
            calls.Observations(tokenizer, "user" if info["shape"] == "gym" else "tool", processor, pixels),
            max_prompt_length,
        )


@dataclass
class Episode:
    key: int  # its number in the sandbox
    prompt: int
    ids: list[int]  # the next turn's input: the prompt and the response so far
    prompt_ids: list[int] | None = None  # its own prompt, when the environment's reset added to it
    raw: list[int] | None = None  # with pictures: `ids` with one placeholder per picture (vLLM's)
    images: list = field(default_factory=list)  # PIL: the prompt's, then the observations'
    inputs: list = field(default_factory=list)  # their processor tensors, one dict per encoding
    seen: int = 0  # how many of `inputs` are the prompt's (the rest came in observations)
    response: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finished: bool = False
    done: bool = False
    reward: float = 0.0  # the environment's
    stats: dict = field(default_factory=lambda: dict.fromkeys(STATS, 0.0))

    @classmethod
    def of(cls, key: int, prompt: int, r: Request) -> Episode:
        pictures = bool(r.images)
        inputs = [r.image_inputs] if pictures else []
        return cls(key, prompt, list(r.ids), raw=list(r.raw_ids) if pictures else None,
                   images=list(r.images), inputs=inputs, seen=len(inputs))  # fmt: skip

    def request(self) -> Request:
        """The next turn's input: with pictures, the placeholder ids and pictures for vLLM and the
        expanded ids with their tensors for transformers."""
        if not self.images:
            return Request(self.ids)
        from r1cloud.media.vision import merge

        return Request(self.ids, self.raw, self.images, merge(self.inputs))

    def observed(self, enc, budget: int) -> bool:
        """An observation (vision.Encoded) appended, mask 0, if it fits in `budget` tokens."""
        if len(self.response) + len(enc.ids) >= budget:
            return False
        if enc.images and self.raw is None:  # the first pictures of a text prompt's episode
            self.raw = list(self.ids)
        if self.raw is not None:
            self.raw += enc.raw_ids
        self.images += enc.images
        self.inputs += [enc.image_inputs] if enc.images else []
        self.add(enc.ids, 0, own=False)
        return True

    def add(self, ids: list[int], mask: int, logprobs: list[float] | None = None, own: bool = True) -> None:
        if own and self.raw is not None:  # the model's tokens are the same in both layouts
            self.raw += ids
        self.ids += ids
        self.response += ids
        self.mask += [mask] * len(ids)
        self.logprobs += logprobs if logprobs is not None else [0.0] * len(ids)


def run(engine, prompts: list[Request], s: Sampling, agent: Agent) -> list[Sample]:
    """`s.n` episodes per prompt, in prompt order. An engine that can (vLLM's `stream`) takes each
    episode's next turn as soon as its observation is in; another plays turn by turn (`rounds`)."""
    order = [i for i in range(len(prompts)) for _ in range(s.n)]
    episodes = [Episode.of(k, i, prompts[i]) for k, i in enumerate(order)]
    try:
        if agent.shape:
            _reset(episodes, prompts, agent)
        play = Play(episodes, agent, s)
        (engine.stream if hasattr(engine, "stream") else lambda p: rounds(engine, p))(play)
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
            images=e.inputs[e.seen :] or None,
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
            if e.images:  # a prompt with pictures: encoded whole again, never cut
                enc = agent.observations.processor.encode(head + text + tail, e.images)
                e.prompt_ids, e.raw, e.inputs = enc.ids, list(enc.raw_ids), [enc.image_inputs]
            else:
                ids = agent.tokenizer(head + text + tail, add_special_tokens=False)["input_ids"]
                e.prompt_ids = ids[: agent.max_prompt_length]
            e.ids = list(e.prompt_ids)


@dataclass
class Turn:
    """One turn to generate: the episode's ids so far, its own budget and seed."""

    episode: Episode
    request: Request
    max_tokens: int
    seed: int


class Play:
    """The episodes of one `run`: a finished turn is taken (`took`), its tool calls or gym step go to
    the sandbox, and the episode's next turn is handed out (`ready`) once its observation is in."""

    def __init__(self, episodes: list[Episode], agent: Agent, s: Sampling):
        self.episodes, self.agent, self.s = episodes, agent, s
        self.waiting: dict[int, dict] = {}  # episode key → its calls' results so far
        self.next: list[Turn] = []

    def first(self) -> list[Turn]:
        return [self._turn(e) for e in self.episodes]

    def _turn(self, e: Episode) -> Turn:
        turn = int(e.stats["turns"])
        seed = request_seed(self.s.seed + turn * 104_729, e.key, 0)
        return Turn(e, e.request(), self.s.max_tokens - len(e.response), seed)

    def busy(self) -> bool:
        return bool(self.waiting or self.next)

    def took(self, turn: Turn, out: Sample) -> None:
        e, agent, limit = turn.episode, self.agent, turn.max_tokens
        cut = len(out.response) > limit
        e.add(out.response[:limit], 1, out.logprobs[:limit])
        e.stats["turns"] += 1
        last = e.stats["turns"] >= agent.max_turns
        text = agent.tokenizer.decode(out.response[:limit], skip_special_tokens=True)
        if cut or not out.finished:  # out of budget: the episode ends here
            e.done = True
            e.stats["cut_mid_call"] = float(calls.cut_mid_call(text))
            return
        wait = {"eos": agent.tokenizer.decode(out.response[-1:]), "last": last}
        if agent.shape == "gym":  # the whole turn is the action, the last one too (its reward)
            wait["results"], ops = [None], [("step", e.key, text)]
        else:
            found = calls.parse(text, agent.tool_call_format)
            if not found or last:  # the answer (a last turn's calls are not run, as in TRL)
                e.done, e.finished = True, True
                return
            refused = [calls.refused(c, agent.tool_names) for c in found]  # given here, not run
            wait["results"] = [None if error is None else (False, error, 0.0) for error in refused]
            ops = [("call", e.key, c) for c, r in zip(found, wait["results"], strict=True) if r is None]
        self.waiting[e.key] = wait
        if not ops:  # nothing to run: every call unreadable or unknown
            return self._observe(e)
        tags = [(e.key, k) for k, r in enumerate(wait["results"]) if r is None]
        agent.sandbox.submit(ops, tags)

    def ready(self, block: bool = False, everything: bool = False) -> list[Turn]:
        """The next turns whose observations are in: what has come back, waiting for one batch
        (`block`) or for all (`everything`)."""
        while True:
            for (key, k), result in self.agent.sandbox.collect(wait=block or everything):
                wait = self.waiting[key]
                wait["results"][k] = result
                if all(r is not None for r in wait["results"]):
                    self._observe(self.episodes[key])
            if not (everything and self.agent.sandbox.pending()):
                break
        turns, self.next = sorted(self.next, key=lambda t: t.episode.key), []  # as the episodes go
        return turns

    def _observe(self, e: Episode) -> None:
        wait = self.waiting.pop(e.key)
        for ok, _, seconds in wait["results"]:
            e.stats["tool_calls"] += 1
            e.stats["tool_errors"] += float(not ok)
            e.stats["tool_seconds"] += seconds
        if self.agent.shape == "gym":
            ok, value, _ = wait["results"][0]
            observation, reward, done = value if ok else (value, 0.0, False)
            e.reward += reward
            if done or observation is None or wait["last"]:
                e.done, e.finished = True, True
                return
            enc = self.agent.observations.encode([observation], wait["eos"])
        else:
            enc = self.agent.observations.encode([text for _, text, _ in wait["results"]], wait["eos"])
        if not e.observed(enc, self.s.max_tokens):  # no room left for an answer after it
            e.done = True
            return
        self.next.append(self._turn(e))


def rounds(engine, play: Play) -> None:
    """Turn by turn, for an engine that only generates batches (transformers'): every live
    episode's turn at once, then every observation, under the longest budget among them (each
    episode's own is applied when its turn is taken)."""
    turns = play.first()
    while turns:
        s = replace(play.s, n=1, max_tokens=max(t.max_tokens for t in turns), seed=turns[0].seed)
        for t, out in zip(turns, engine.generate([t.request for t in turns], s), strict=True):
            play.took(t, out)
        turns = play.ready(everything=True)


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
