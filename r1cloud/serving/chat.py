"""Talking to a model the way it was trained: the blueprint's Jinja format prompt applied to the
user's text, sent through the official `openai` client to a served endpoint — or to a private
server started for a checkpoint or model folder and stopped afterwards."""

from __future__ import annotations

import base64
import contextlib
import http.client
import json
import os
import re
import secrets
import subprocess
import tempfile
import urllib.error
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from r1cloud.agents import calls
from r1cloud.agents.sandbox import Sandbox
from r1cloud.agents.tools import check
from r1cloud.core.rows import conversation
from r1cloud.data import prompts
from r1cloud.serving import serve as sv


@dataclass
class Endpoint:
    url: str
    api_key: str | None
    model: str
    label: str

    def client(self):
        from openai import OpenAI

        return OpenAI(base_url=self.url, api_key=self.api_key or "none", max_retries=0, timeout=600)


def remote(url: str, api_key: str | None) -> Endpoint:
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number
        if any(c.isspace() or ord(c) < 32 for c in url):
            raise ValueError("it holds a space or a control character")
    except ValueError as e:
        raise sv.ServeError(
            f"error: {url[:120]!r} is not a valid URL ({e})", ["write it as http://HOST:PORT/v1"]
        ) from None
    if not parts.hostname:
        raise sv.ServeError(f"error: {url!r} names no host", ["write it as http://HOST:PORT/v1"])
    url = url.rstrip("/")
    url = url if url.endswith("/v1") else f"{url}/v1"
    try:
        names = sv.models(url, api_key)
    except urllib.error.HTTPError as e:
        hint = (
            "pass --api-key (or set R1CLOUD_API_KEY)"
            if e.code == 401
            else "is it an OpenAI-compatible server?"
        )
        raise sv.ServeError(f"error: {url}/models answered {e.code}", [hint]) from None
    except (urllib.error.URLError, OSError, ValueError, http.client.HTTPException) as e:  # InvalidURL
        reason = getattr(e, "reason", e)
        raise sv.ServeError(
            f"error: cannot reach {url}: {reason}", ["start one with: r1cloud serve --checkpoint JOB"]
        ) from None
    if not names:
        raise sv.ServeError(f"error: {url} serves no model", [])
    return Endpoint(url, api_key, names[0], names[0])


@contextlib.contextmanager
def open_endpoint(
    target: str, api_key: str | None, engine: str, merge_fn, tools: str | None = None
) -> Iterator[Endpoint]:
    """An endpoint for `target`: a URL as it is, anything else served privately for the duration
    (reading `tools`-format tool calls when the engine is vLLM)."""
    if target.startswith(("http://", "https://")):
        yield remote(target, api_key)
        return
    model = sv.resolve(target, merge_fn)
    key, port = secrets.token_hex(16), sv.free_port()
    engine = sv.pick_engine(engine)
    flags = sv.tool_flags(tools) if engine == "vllm" else []
    cmd = sv.command(engine, model, "127.0.0.1", port, model.name, None, flags)
    with tempfile.NamedTemporaryFile("w+b", prefix="r1cloud-chat-", suffix=".log") as log:
        proc = subprocess.Popen(
            cmd,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **sv.key_env(key)},
            start_new_session=True,
        )
        try:
            url = sv.base_url("127.0.0.1", port)
            if not sv.wait_ready(url, key, lambda: proc.poll() is None, 900):
                log.seek(0)
                tail = log.read().decode(errors="replace").splitlines()[-12:]
                raise sv.ServeError(f"error: the server for {target} did not start", tail)
            yield Endpoint(url, key, model.name, model.name)
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def lead_in(spec) -> list[dict]:
    """The messages a conversational run's prompts hold before the question (a system message,
    worked examples), from its first training row: in training the model always saw them first."""
    from r1cloud.data.loader import load_rows

    files = spec.data.train_files if isinstance(spec.data.train_files, str) else spec.data.train_files[0]
    if not Path(files.rpartition("@")[0] or files).exists():  # a Hub data set: not fetched for this
        return []
    try:
        value = load_rows(files)[0][spec.data.prompt_key]
        return conversation(value, files)[0]
    except (ValueError, OSError, KeyError, IndexError):  # a text prompt, or rows not readable here
        return []


def render(template_file: str | None, text: str) -> str:
    """EasyR1's format prompt: a Jinja template over `content`."""
    if not template_file:
        return text
    return prompts.load(template_file).render(content=text)


def content(text: str, images: list[str], videos: list[str] = ()) -> str | list[dict]:
    """A user message's content: the text, or with images and videos OpenAI's parts (data URLs),
    each where the text has its `<image>` / `<video>` placeholder (the format prompt's own), else
    all first, pictures then videos."""
    if not images and not videos:
        return text
    from r1cloud.media.video import PLACEHOLDER as VIDEO
    from r1cloud.media.vision import PLACEHOLDER, data_url

    placed = text.count(PLACEHOLDER) == len(images) and text.count(VIDEO) == len(videos)
    pieces = re.split(f"({PLACEHOLDER}|{VIDEO})", text) if placed else [
        *([PLACEHOLDER] * len(images)), *([VIDEO] * len(videos)), text]  # fmt: skip
    media = {PLACEHOLDER: iter(images), VIDEO: iter(videos)}
    parts: list[dict] = []
    for piece in pieces:
        if piece in media:
            kind = "image_url" if piece == PLACEHOLDER else "video_url"
            parts.append({"type": kind, kind: {"url": data_url(next(media[piece]))}})
        elif piece:
            parts.append({"type": "text", "text": piece})
    return parts


def ask(endpoint: Endpoint, messages: list[dict], max_tokens: int, temperature: float, on_piece=None) -> str:
    """One chat completion; with `on_piece`, streamed piece by piece as it arrives."""
    create = endpoint.client().chat.completions.create
    asked = dict(model=endpoint.model, messages=messages, max_tokens=max_tokens, temperature=temperature)
    if on_piece is None:
        return create(**asked).choices[0].message.content or ""
    text = ""
    for chunk in create(**asked, stream=True):
        piece = chunk.choices[0].delta.content if chunk.choices else None
        if piece:
            text += piece
            on_piece(piece)
    return text


@dataclass
class Toolbox:
    """A run's tools in `chat`: their schemas (sent as `tools=`, as the prompt showed them in
    training), the format the model writes calls in, and the sandbox the trainer runs them in.
    A TRL-shaped environment gets one object per conversation, `reset(prompt=messages)`."""

    schemas: list[dict]
    fmt: str
    max_turns: int
    sandbox: object
    environment: bool
    conversations: int = 0

    @classmethod
    def of(cls, spec) -> Toolbox | None:
        mt = spec.worker.rollout.multi_turn
        if not mt.enable:
            return None
        try:
            info = check(mt.environment, mt.tools, mt.tool_names)
        except (ValueError, OSError) as e:
            raise sv.ServeError(f"error: the run's tools cannot be read: {e}", []) from None
        if info["shape"] == "gym":
            raise sv.ServeError(
                "error: a gym-shaped environment writes the user's turns itself: there is no chat with it",
                ["play episodes with: r1cloud try --episodes K, or r1cloud eval"],
            )
        sandbox = Sandbox(
            mt.environment, mt.tools, mt.tool_names, 1, mt.tool_timeout, mt.max_tool_response_length
        )
        return cls(info["tools"], mt.tool_call_format, mt.max_turns, sandbox, bool(mt.environment))

    @property
    def names(self) -> set[str]:
        return {t["function"]["name"] for t in self.schemas}

    def start(self, messages: list[dict]) -> int:
        """A new conversation's number; with an environment, its object reset on the first
        message (a text reset returns is appended to it, as in training)."""
        self.conversations += 1
        if self.environment:
            ok, text, _ = self.sandbox.run([("reset", self.conversations, {"prompt": list(messages)})])[0]
            if not ok:
                raise sv.ServeError(f"error: the environment's reset(prompt=...) failed: {text}", [])
            if text and isinstance(messages[-1]["content"], str):
                messages[-1]["content"] += text
        return self.conversations


def ask_with_tools(endpoint: Endpoint, messages: list[dict], box: Toolbox, conversation: int,
                   max_tokens: int, temperature: float, show) -> str:  # fmt: skip
    """Turns until the model answers without a call (or `max_turns`): each reply's calls (the
    server's `tool_calls`, or read from the text when the server has no tool parser) run in the
    sandbox and come back as tool messages. `show(kind, text)` sees each turn and each call."""
    client, text = endpoint.client(), ""
    for turn in range(box.max_turns):
        reply = client.chat.completions.create(
            model=endpoint.model, messages=messages, tools=box.schemas, max_tokens=max_tokens, temperature=temperature
        ).choices[0].message  # fmt: skip
        if reply.tool_calls:  # the text the model wrote, as training saw it (not the parsed form)
            found = [(c.function.name, json.loads(c.function.arguments or "{}")) for c in reply.tool_calls]
            text = (reply.content or "") + "".join(calls.render(c, box.fmt) for c in found)
        else:
            text = reply.content or ""
            found = calls.parse(text, box.fmt)
        messages.append({"role": "assistant", "content": text})
        show("assistant", text)
        if not found or turn == box.max_turns - 1:  # the answer (a last turn's calls are not run)
            break
        errors = [calls.refused(c, box.names) for c in found]
        ran = iter(
            box.sandbox.run(
                [("call", conversation, c) for c, e in zip(found, errors, strict=True) if e is None]
            )
        )
        for k, (call, error) in enumerate(zip(found, errors, strict=True)):
            observation = _parts(error or next(ran)[1])
            what = "a call it cannot read" if isinstance(call, str) else calls.render(call, "python")
            said = observation if isinstance(observation, str) else " ".join(
                p.get("text", "[a picture]") for p in observation
            )  # fmt: skip
            show("tool", f"{what.removeprefix(calls.OPEN).removesuffix(calls.CLOSE)} → {said}")
            messages.append({"role": "tool", "content": observation, "tool_call_id": f"call_{turn}_{k}"})
    return text


def _parts(observation):
    """A tool's answer as a message's content: its text, or (TRL's content blocks, pictures as
    PNG bytes from the sandbox) OpenAI's parts with each picture as a data URL."""
    if isinstance(observation, str):
        return observation

    def part(block: dict) -> dict:
        if block["type"] == "text":
            return block
        url = "data:image/png;base64," + base64.b64encode(block["image"]).decode()
        return {"type": "image_url", "image_url": {"url": url}}

    return [part(b) for b in observation]
