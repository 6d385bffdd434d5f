"""Multi-turn pieces without a model: tools as TRL takes them (schemas from transformers), their
isolated pool (errors, hangs and floods become observations), the call formats, observations as
a token delta of the chat template, conversational prompts, and what validate says and refuses."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from r1cloud.agents import calls, tools

ROOT = Path(__file__).resolve().parents[1]

TOOLS = '''
import time
from math import floor  # imported: not one of the file's tools


def add(a: int, b: int) -> int:
    """Add two numbers.

    Args:
        a: The first.
        b: The second.
    """
    return a + b


def shout(text: str) -> str:
    """Repeat a text many times.

    Args:
        text: What to repeat.
    """
    return text * 10_000_000


def fail(x: int) -> int:
    """Always fails.

    Args:
        x: Anything.
    """
    raise KeyError("no such row")


def hang(x: int) -> int:
    """Never returns.

    Args:
        x: Anything.
    """
    time.sleep(60)


def _helper():
    return 1
'''


@pytest.fixture
def tool_file(tmp_path) -> Path:
    path = tmp_path / "my_tools.py"
    path.write_text(TOOLS)
    return path


def test_a_file_offers_its_public_functions_with_transformers_schemas(tool_file):
    assert sorted(tools.load(str(tool_file))) == ["add", "fail", "hang", "shout"]
    assert list(tools.load(str(tool_file), ["add"])) == ["add"]
    (schema,) = tools.check(str(tool_file), ["add"])  # read in a child process
    assert schema["function"]["name"] == "add"
    assert schema["function"]["description"] == "Add two numbers."
    assert schema["function"]["parameters"]["properties"]["a"] == {
        "type": "integer",
        "description": "The first.",
    }
    with pytest.raises(ValueError, match="has no function 'mul'"):
        tools.load(str(tool_file), ["mul"])


def test_a_tool_the_model_cannot_be_shown_is_refused_in_one_line(tmp_path):
    path = tmp_path / "bad.py"
    path.write_text("def add(a, b):\n    return a + b\n")
    with pytest.raises(ValueError) as e:
        tools.check(str(path), None)
    assert "bad.py:add cannot be shown to the model" in str(e.value) and "type hint" in str(e.value)
    assert "\n" not in str(e.value)
    path.write_text("import no_such_module_here\n")
    with pytest.raises(ValueError, match="importing .*bad.py failed: ModuleNotFoundError"):
        tools.check(str(path), None)


def test_the_pool_turns_errors_hangs_and_floods_into_observations(tool_file):
    pool = tools.ToolPool(str(tool_file), None, workers=2, timeout=2.0, limit=50)
    try:
        out = pool.call_all(
            [
                ("add", {"a": 2, "b": 3}),
                ("shout", {"text": "ab"}),
                ("fail", {"x": 1}),
                ("hang", {"x": 1}),
                ("nope", {}),
                ("add", {"a": 1}),
            ]  # fmt: skip
        )
        texts, failed = [o[0] for o in out], [o[1] for o in out]
        assert texts[0] == "5" and not failed[0]
        assert texts[1] == "ab" * 25 and not failed[1]  # cut to the limit inside the tool's process
        assert texts[2] == "Error: KeyError: 'no such row'" and failed[2]
        assert texts[3] == "Error: hang did not finish in 2 s" and failed[3]
        assert texts[4].startswith("Error: there is no tool 'nope'") and failed[4]
        assert texts[5].startswith("Error: TypeError") and failed[5]  # a missing argument
        assert pool.call_all([("add", {"a": 1, "b": 1})])[0][:2] == ("2", False)  # the pool lives on
    finally:
        pool.close()


def test_call_formats():
    text = 'x <tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call> <tool_call>{"name"</tool_call>'
    first, second = calls.parse(text, "hermes")
    assert first == ("add", {"a": 1, "b": 2}) and second.startswith("Error: the tool call is not JSON")
    assert calls.parse('<tool_call>{"name": "f", "arguments": "{\\"x\\": 1}"}</tool_call>', "hermes") == [
        ("f", {"x": 1})
    ]
    assert calls.parse("<tool_call>add(a=1, b='x')</tool_call>", "python") == [("add", {"a": 1, "b": "x"})]
    for bad in ("__import__('os').system('ls')", "add(1, 2)", "add(a=f())"):
        assert calls.parse(f"<tool_call>{bad}</tool_call>", "python")[0].startswith("Error:")
    assert calls.parse("no call here", "python") == []
    assert calls.cut_mid_call("<tool_call>add(a=1") and not calls.cut_mid_call("<tool_call>x</tool_call>")


def test_observations_are_the_templates_tool_turn_as_a_delta(tmp_path):
    from r1cloud.testing import make_tokenizer

    tok = make_tokenizer(tmp_path)
    obs = calls.Observations(tok)
    eos = tok.decode([tok.eos_token_id])
    turn = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "call"}]
    full = tok.apply_chat_template(
        [*turn, {"role": "tool", "content": "42"}], tokenize=False, add_generation_prompt=True
    )
    head = tok.apply_chat_template([turn[0]], tokenize=False, add_generation_prompt=True) + "call" + eos
    # what the model sampled (ending on its EOS) + the observation's ids = the whole conversation
    assert tok.decode(tok(head, add_special_tokens=False)["input_ids"] + obs.ids(["42"], eos)) == full


def test_validate_prints_the_tools_and_refuses_what_cannot_work(blueprint, cli, tool_file):
    base = {"worker.rollout.multi_turn.enable=true", f"worker.rollout.multi_turn.tools={tool_file}:add"}
    bp = blueprint()
    r = cli("validate", str(bp), *base)
    assert r.exit_code == 0, r.stdout + r.stderr
    assert "tool       add(a: integer, b: integer): Add two numbers." in (r.stdout + r.stderr)
    assert "episodes   up to 4 turns" in (r.stdout + r.stderr)

    r = cli("validate", str(bp), "worker.rollout.multi_turn.enable=true")
    assert (
        r.exit_code == 2
        and "multi_turn.tools" in (r.stdout + r.stderr)
        and "need tools" in (r.stdout + r.stderr)
    )
    r = cli("validate", str(bp), f"worker.rollout.multi_turn.tools={tool_file}")
    assert r.exit_code == 2 and "has no effect while worker.rollout.multi_turn.enable is false" in (
        r.stdout + r.stderr
    )
    r = cli("validate", str(bp), "worker.rollout.multi_turn.tool_names=[add]")
    assert r.exit_code == 2 and "multi_turn.tool_names: has no effect" in (r.stdout + r.stderr)
    r = cli("validate", str(bp), *base, "worker.rollout.multi_turn.environment=envs/game.py:Game")
    assert (
        r.exit_code == 2
        and "environments" in (r.stdout + r.stderr)
        and "not supported yet" in (r.stdout + r.stderr)
    )
    r = cli(
        "validate",
        str(bp),
        "worker.rollout.multi_turn.enable=true",
        "worker.rollout.multi_turn.tools=nope.py",
    )
    assert (
        r.exit_code == 2 and "nope.py" in (r.stdout + r.stderr) and "Traceback" not in (r.stdout + r.stderr)
    )
    bad = tool_file.with_name("undocumented.py")
    bad.write_text("def add(a, b):\n    return a + b\n")
    r = cli(
        "validate", str(bp), "worker.rollout.multi_turn.enable=true", f"worker.rollout.multi_turn.tools={bad}"
    )
    assert r.exit_code == 2 and "undocumented.py:add cannot be shown to the model" in (r.stdout + r.stderr)


def test_a_conversation_as_the_prompt_reaches_the_template_whole(tmp_path):
    from r1cloud.data import PromptSet
    from r1cloud.spec.models import DataConfig
    from r1cloud.testing import make_tokenizer

    tok = make_tokenizer(tmp_path / "tok")
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}]
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"problem": chat, "answer": "4"}) + "\n")
    cfg = DataConfig(prompt_key="problem", answer_key="answer", max_prompt_length=512)
    p = PromptSet(str(data), tok, cfg).prompts[0]
    want = tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
    assert tok.decode(p.prompt_ids) == want and p.content == "2+2?" and p.history == chat[:1]
    data.write_text(
        json.dumps(
            {
                "problem": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}],
                "answer": "4",
            }
        )
        + "\n"
    )
    with pytest.raises(ValueError, match=r"row 0: a prompt given as a list must be a conversation"):
        PromptSet(str(data), tok, cfg)


def test_eval_refuses_a_run_whose_episodes_call_tools(cli, tmp_path):
    r = cli(
        "eval",
        "some/model",
        "--blueprint",
        ROOT / "blueprints" / "tools_calculator.yaml",
        "--out",
        tmp_path / "e",
    )
    assert r.exit_code == 2 and "eval answers in one turn" in r.stderr and "Traceback" not in r.stderr


def test_the_calculator_blueprint_validates(cli):
    r = cli("validate", str(ROOT / "blueprints" / "tools_calculator.yaml"))
    # the model is a Hub id here; validate reads the tools and the data all the same
    assert "tool       multiply(a: integer, b: integer): Multiply two whole numbers." in (
        r.stdout + r.stderr
    ), r.stdout + r.stderr
    rows = [json.loads(line) for line in (ROOT / "data" / "multiply" / "test.jsonl").read_text().splitlines()]
    assert all(row["problem"][-1]["role"] == "user" for row in rows)
