"""Talking to a model the way it was trained: the blueprint's Jinja format prompt applied to the
user's text, sent through the official `openai` client to a served endpoint — or to a private
server started for a checkpoint or model folder and stopped afterwards."""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from . import serve as sv


@dataclass
class Endpoint:
    url: str
    api_key: str | None
    model: str
    label: str

    def client(self):
        from openai import OpenAI

        return OpenAI(base_url=self.url, api_key=self.api_key or "none", max_retries=0, timeout=600)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def remote(url: str, api_key: str | None) -> Endpoint:
    import http.client
    import urllib.error
    import urllib.parse

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
def open_endpoint(target: str, api_key: str | None, engine: str, merge_fn, cache: Path) -> Iterator[Endpoint]:
    """An endpoint for `target`: a URL as it is, anything else served privately for the duration."""
    if target.startswith(("http://", "https://")):
        yield remote(target, api_key)
        return
    model = sv.resolve(target, merge_fn, cache)
    key, port = secrets.token_hex(16), _free_port()
    cmd = sv.command(sv.pick_engine(engine), model, "127.0.0.1", port, model.name, None, [])
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
            if not sv.wait_ready(url, key, lambda: proc.poll() is None, 900, lambda: None):
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


def job_format_prompt(target: str) -> str | None:
    """The format prompt of the job `target` names (from its resolved spec), if it is a job."""
    from .checkpoint.store import parse_ref
    from .jobs.store import JobStore

    store, name = JobStore(), parse_ref(target)[0]
    if "://" in target or not store.has(name) or not (spec_file := store.path(name) / "spec.yaml").is_file():
        return None
    from .spec import load_resolved

    return load_resolved(spec_file).data.format_prompt


def render(template_file: str | None, text: str) -> str:
    """EasyR1's format prompt: a Jinja template over `content`."""
    if not template_file:
        return text
    from . import prompts

    return prompts.load(template_file).render(content=text)


def content(text: str, images: list[str]) -> str | list[dict]:
    """A user message's content: the text, or with images OpenAI's parts (data URLs), each image
    where the text has an `<image>` placeholder (the format prompt's own), else all first."""
    if not images:
        return text
    from .vision import PLACEHOLDER, data_url

    pieces = (
        text.split(PLACEHOLDER)
        if text.count(PLACEHOLDER) == len(images)
        else ["", *[""] * (len(images) - 1), text]
    )
    parts: list[dict] = []
    for i, piece in enumerate(pieces):
        if i:
            parts.append({"type": "image_url", "image_url": {"url": data_url(images[i - 1])}})
        if piece:
            parts.append({"type": "text", "text": piece})
    return parts


def ask(endpoint: Endpoint, messages: list[dict], max_tokens: int, temperature: float, on_piece=None) -> str:
    """One chat completion; with `on_piece`, streamed piece by piece as it arrives."""
    client = endpoint.client()
    if on_piece is None:
        reply = client.chat.completions.create(
            model=endpoint.model, messages=messages, max_tokens=max_tokens, temperature=temperature
        )
        return reply.choices[0].message.content or ""
    text = ""
    for chunk in client.chat.completions.create(
        model=endpoint.model, messages=messages, max_tokens=max_tokens, temperature=temperature, stream=True
    ):
        piece = chunk.choices[0].delta.content if chunk.choices else None
        if piece:
            text += piece
            on_piece(piece)
    return text
