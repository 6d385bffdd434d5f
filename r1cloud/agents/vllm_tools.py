"""vLLM's OpenAI server reading r1cloud's `python` tool-call format: `--tool-parser-plugin
r1cloud.agents.vllm_tools --tool-call-parser r1cloud_python`.

A call is `<tool_call>add(a=2, b=3)</tool_call>` (calls.py reads it the same way in training):
the tags and the streaming of text around them are Hermes' (vLLM's own parser, subclassed), only
the body between the tags is read as a call instead of JSON. A call streams once it is complete.
`hermes`-format runs need no plugin: vLLM's `hermes` parser reads them as they were trained.
Imported only inside vLLM's server process.
"""

from __future__ import annotations

import json

from vllm.entrypoints.generate.base.protocol import ExtractedToolCallInformation, FunctionCall, ToolCall
from vllm.tool_parsers.abstract_tool_parser import ToolParserManager
from vllm.tool_parsers.hermes_tool_parser import Hermes2ProToolParser

from r1cloud.agents.calls import CLOSE, OPEN, parse

NAME = "r1cloud_python"


def _as_json(body: str) -> str | None:
    """A complete python call's body as the JSON object Hermes' parser reads, or None."""
    found = parse(f"{OPEN}{body}{CLOSE}", "python")
    if not found or isinstance(found[0], str):
        return None
    name, arguments = found[0]
    return json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)


@ToolParserManager.register_module(NAME)
class PythonCallParser(Hermes2ProToolParser):
    structural_tag_model = None  # no constrained decoding: the body is not JSON
    supports_required_and_named = False

    def extract_tool_calls(self, model_output: str, request) -> ExtractedToolCallInformation:
        found = [c for c in parse(model_output, "python") if not isinstance(c, str)]
        if not found:
            return ExtractedToolCallInformation(tools_called=False, tool_calls=[], content=model_output)
        calls = [
            ToolCall(function=FunctionCall(name=name, arguments=json.dumps(args, ensure_ascii=False)))
            for name, args in found
        ]
        content = model_output[: model_output.find(OPEN)]
        return ExtractedToolCallInformation(tools_called=True, tool_calls=calls, content=content or None)

    def _extract_tool_call_jsons(self, text: str) -> list[tuple[str, bool]]:
        """Hermes' regions, each body as JSON once the call is complete (until then, nothing)."""
        out = []
        for body, _ in super()._extract_tool_call_jsons(text):
            as_json = _as_json(body) if body else None
            out.append((as_json, True) if as_json else ("", False))
        return out
