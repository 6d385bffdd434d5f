"""How a model calls a tool, and how the answer comes back as tokens.

Two call formats (`worker.rollout.multi_turn.tool_call_format`), both between `<tool_call>` tags:
- `hermes`: a JSON object `{"name": ..., "arguments": {...}}`, the format Qwen's and Hermes' chat
  templates teach;
- `python`: a call such as `add(a=2, b=3)` (literal arguments only, read with `ast`, never run),
  shorter for small models whose template has no tool format.

Observations enter as a delta: the chat template's tool turn (and the next assistant header) is
rendered once for a fixed conversation, and only the text after the assistant's end-of-turn is
tokenized. Earlier turns are never tokenized again: the ids the trainer scores are the ids the
engine sampled, followed by the observation's ids.
"""

from __future__ import annotations

import ast
import contextlib
import json
import re

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_CALL = re.compile(re.escape(OPEN) + r"(.*?)" + re.escape(CLOSE), re.S)


def parse(text: str, fmt: str) -> list[tuple[str, dict] | str]:
    """The tool calls in one assistant turn, in order: (name, arguments), or an error message for
    a call that cannot be read (the model sees it as that call's observation)."""
    return [(_hermes if fmt == "hermes" else _python)(body.strip()) for body in _CALL.findall(text)]


def refused(call: tuple[str, dict] | str, names: set[str]) -> str | None:
    """The error observation for a call that is not run (unreadable, or no such tool), else None."""
    if isinstance(call, str):
        return call
    if call[0] not in names:
        return f"Error: there is no tool {call[0]!r} (the tools are {', '.join(sorted(names))})"
    return None


def render(call: tuple[str, dict], fmt: str) -> str:
    """A call as the model writes it in `fmt` (what `parse` reads back)."""
    name, arguments = call
    if fmt == "hermes":
        body = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
    else:
        body = f"{name}({', '.join(f'{k}={v!r}' for k, v in arguments.items())})"
    return f"{OPEN}{body}{CLOSE}"


def cut_mid_call(text: str) -> bool:
    """A turn cut off inside a tool call (an open tag with no close after it)."""
    return text.rfind(OPEN) > text.rfind(CLOSE)


def _hermes(body: str) -> tuple[str, dict] | str:
    try:
        call = json.loads(body)
    except ValueError as e:
        return f"Error: the tool call is not JSON ({e})"
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        return 'Error: a tool call is {"name": ..., "arguments": {...}}'
    args = call.get("arguments", {})
    if isinstance(args, str):  # some models send the arguments as a JSON string
        with contextlib.suppress(ValueError):
            args = json.loads(args)
    if not isinstance(args, dict):
        return "Error: the tool call's arguments must be a JSON object"
    return call["name"], args


def _python(body: str) -> tuple[str, dict] | str:
    try:
        call = ast.parse(body, mode="eval").body
        if not isinstance(call, ast.Call) or not isinstance(call.func, ast.Name) or call.args:
            raise ValueError
        return call.func.id, {k.arg: ast.literal_eval(k.value) for k in call.keywords if k.arg}
    except (SyntaxError, ValueError):
        return "Error: a tool call is name(argument=value, ...) with literal values"


class Observations:
    """Observations as token ids in the chat template's tool turn (or user turn: a gym-shaped
    environment's). With a vision-language model's processor (vision.ImageProcessor), an
    observation may hold pictures (TRL's content blocks, each image as PNG bytes from the
    sandbox): the template renders their placeholders and the processor expands them, as it
    does a prompt's; `pixels` (min, max) resizes them as the data's images are."""

    BASE = ({"role": "user", "content": "\x01"}, {"role": "assistant", "content": "\x01"})

    def __init__(self, tokenizer, role: str = "tool", processor=None, pixels: tuple = (None, None)):
        self.tokenizer, self.role, self.processor, self.pixels = tokenizer, role, processor, pixels
        self.before = self._render(list(self.BASE), False)
        self.end_of_turn = self.before[self.before.rindex("\x01") + 1 :]  # e.g. "<|im_end|>\n"
        self.text(["\x02"])  # a template that cannot append a tool turn fails now, not mid-run

    def _render(self, messages: list[dict], generation: bool) -> str:
        if self.processor is not None:
            return self.processor.apply_template(messages, generation)
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation)

    def text(self, contents: list) -> str:
        """What the template adds after an assistant turn's end: the tool turns, the next header."""
        tools = [{"role": self.role, "content": c} for c in contents]
        after = self._render([*self.BASE, *tools], True)
        if not after.startswith(self.before):
            raise ValueError(
                f"the chat template does not extend a conversation by appending a {self.role} turn; give "
                "worker.actor.model.tokenizer_path a tokenizer whose template does"
            )
        return after[len(self.before) :]

    def encode(self, contents: list, eos_text: str):
        """The tokens after an assistant turn that ended on `eos_text` (the EOS the model sampled):
        the rest of the template's end of turn, the tool turns of `contents`, the next header — as
        vision.Encoded: expanded ids, ids with one placeholder per picture (vLLM's), the pictures
        and their processor tensors."""
        from r1cloud.media.vision import Encoded

        rest = self.end_of_turn.removeprefix(eos_text)
        parts, images = [], []
        for c in contents:
            if isinstance(c, str):
                parts.append(c)
            elif self.processor is None:  # a text model: the words only
                words = "".join(b["text"] for b in c if b["type"] == "text")
                parts.append(words + " (a picture, which this model cannot see)")
            else:
                parts.append([{"type": "image"} if b["type"] == "image" else b for b in c])
                images += [self._image(b["image"]) for b in c if b["type"] == "image"]
        text = rest + self.text(parts)
        if not images:
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            return Encoded(ids, ids, [], {})
        return self.processor.encode(text, images)

    def _image(self, png: bytes):
        from r1cloud.media.vision import open_image, resize

        return resize(open_image(png), *self.pixels)
