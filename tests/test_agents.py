"""Multi-turn pieces without a model: tools as TRL takes them (schemas from transformers), their
isolated pool (errors, hangs and floods become observations), the call formats, observations as
a token delta of the chat template, conversational prompts, and what validate says and refuses."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from r1cloud.agents import calls, tools
from r1cloud.agents.sandbox import Sandbox

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
    (schema,) = tools.check(None, str(tool_file), ["add"])["tools"]  # read in a child process
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
        tools.check(None, str(path), None)
    assert "bad.py: add cannot be shown to the model" in str(e.value) and "type hint" in str(e.value)
    assert "\n" not in str(e.value)
    path.write_text("import no_such_module_here\n")
    with pytest.raises(ValueError, match="bad.py: importing it failed: ModuleNotFoundError"):
        tools.check(None, str(path), None)


def test_the_sandbox_turns_errors_hangs_and_floods_into_observations(tool_file):
    box = Sandbox(None, str(tool_file), None, workers=2, timeout=2.0, limit=50)
    try:
        out = box.run(
            [
                ("call", 0, ("add", {"a": 2, "b": 3})),
                ("call", 1, ("shout", {"text": "ab"})),
                ("call", 2, ("fail", {"x": 1})),
                ("call", 3, ("hang", {"x": 1})),
                ("call", 4, ("add", {"a": 1})),
            ]  # fmt: skip
        )
        texts, ok = [o[1] for o in out], [o[0] for o in out]
        assert texts[0] == "5" and ok[0]
        assert texts[1] == "ab" * 25 and ok[1]  # cut to the limit inside the tool's process
        assert texts[2] == "Error: KeyError: 'no such row'" and not ok[2]
        assert texts[3] == "Error: hang did not finish in 2 s" and not ok[3]
        assert texts[4].startswith("Error: TypeError") and not ok[4]  # a missing argument
        assert box.run([("call", 3, ("add", {"a": 1, "b": 1}))])[0][:2] == (True, "2")  # it lives on
        # results come back as each process answers: a hanging call holds up only its own episode
        box.submit(
            [("call", 0, ("hang", {"x": 1})), ("call", 1, ("add", {"a": 1, "b": 2}))], ["slow", "fast"]
        )
        first = box.collect(wait=True)
        assert [tag for tag, _ in first] == ["fast"] and box.pending()
        assert box.collect(wait=True) == [("slow", (False, "Error: hang did not finish in 2 s", 2.0))]
    finally:
        box.close()


PICTURE_TOOL = '''
from PIL import Image


def look(size: int) -> list:
    """Look at a square.

    Args:
        size: Its side in pixels.
    """
    return [{"type": "text", "text": "here:"}, {"type": "image", "image": Image.new("RGB", (size, size), (9, 8, 7))}]


def bad() -> list:
    """Answer with something that is no content block."""
    return [{"type": "image", "image": Image.new("RGB", (2, 2))}, {"type": "audio"}]
'''


def test_a_tool_may_answer_with_a_picture(tmp_path):
    """TRL's multimodal tool answers (content blocks): the picture leaves the sandbox as PNG bytes
    (plain data, not a pickled object); a text model is told it cannot see it; chat sends it to
    an endpoint as an OpenAI image part."""
    from transformers import AutoTokenizer

    from r1cloud.serving.chat import _parts
    from tiny import make_tokenizer

    (tmp_path / "look.py").write_text(PICTURE_TOOL)
    box = Sandbox(None, str(tmp_path / "look.py"), None, workers=1, timeout=5.0, limit=50)
    try:
        (ok, blocks, _), (bad_ok, error, _) = box.run(
            [("call", 0, ("look", {"size": 4})), ("call", 0, ("bad", {}))]
        )
    finally:
        box.close()
    assert ok and blocks[0] == {"type": "text", "text": "here:"} and blocks[1]["type"] == "image"
    assert blocks[1]["image"].startswith(b"\x89PNG")
    assert not bad_ok and "content blocks are" in error
    make_tokenizer(tmp_path / "tok")
    tok = AutoTokenizer.from_pretrained(tmp_path / "tok")
    tok.chat_template = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}</s>{% endfor %}"
    enc = calls.Observations(tok).encode([blocks], "</s>")
    assert "here: (a picture, which this model cannot see)" in tok.decode(enc.ids) and not enc.images
    parts = _parts(blocks)
    assert parts[0] == blocks[0] and parts[1]["image_url"]["url"].startswith("data:image/png;base64,iVBOR")


TRL_ENV = '''
import os


class Counter:
    """Written for TRL's GRPOTrainer(environment_factory=Counter)."""

    def reset(self, target, **kwargs) -> str | None:
        if target < 0:
            raise ValueError("a negative target")
        self.counter, self.target = 0, target
        return f" Reach {target}."

    def get_reward(self) -> float:
        return float(self.counter == self.target)

    def increment(self, step: int) -> int:
        """Add to the counter.

        Args:
            step: How much to add.
        """
        self.counter += step
        return self.counter

    def crash(self) -> None:
        """End this process."""
        os._exit(3)
'''

GYM_ENV = '''
import re


class Guess:
    """reset(**row), then step(action) -> (observation, reward, done)."""

    def reset(self, secret, **kwargs):
        self.secret = int(secret)

    def step(self, action: str):
        said = re.findall(r"-?\\d+", action)
        if not said:
            return "Say a number.", 0.0, False
        if int(said[-1]) == self.secret:
            return "Right!", 1.0, True
        return ("Higher." if int(said[-1]) < self.secret else "Lower."), -0.1, False
'''


@pytest.fixture
def env_files(tmp_path) -> tuple[str, str]:
    (tmp_path / "counter.py").write_text(TRL_ENV)
    (tmp_path / "guess.py").write_text(GYM_ENV)
    return f"{tmp_path / 'counter.py'}:Counter", f"{tmp_path / 'guess.py'}:Guess"


def test_environments_keep_their_state_per_episode_in_either_shape(env_files):
    trl, gym = env_files
    info = tools.check(trl, None, None)
    assert info["shape"] == "trl" and info["reward"]
    assert [t["function"]["name"] for t in info["tools"]] == ["crash", "increment"]  # not reset, get_reward
    assert tools.check(gym, None, None) == {"tools": [], "shape": "gym", "reward": True}

    box = Sandbox(trl, None, None, workers=2, timeout=2.0, limit=100)
    try:
        assert box.run([("reset", 0, {"target": 3}), ("reset", 1, {"target": 1})]) == [
            (True, " Reach 3.", pytest.approx(0, abs=1)),
            (True, " Reach 1.", pytest.approx(0, abs=1)),
        ]
        got = box.run([("call", 0, ("increment", {"step": 2})), ("call", 1, ("increment", {"step": 1}))])
        assert [g[1] for g in got] == ["2", "1"]
        got = box.run([("call", 0, ("increment", {"step": 1})), ("reward", 0, None), ("reward", 1, None)])
        assert [g[1] for g in got] == ["3", 1.0, 1.0]  # episode 0 reached 3 over two turns
        ((ok, text, _),) = box.run([("reset", 2, {"target": -1})])
        assert not ok and text == "Error: ValueError: a negative target"
        # a process that dies takes its episodes' objects with it, and is started again
        ((ok, text, _),) = box.run([("call", 1, ("crash", {}))])
        assert not ok and "lost" in text
        ((ok, text, _),) = box.run([("reward", 1, None)])
        assert not ok and "LookupError" in text and "lost" in text
        assert box.run([("reward", 0, None)])[0][:2] == (True, 1.0)  # the other process kept its own
    finally:
        box.close()

    box = Sandbox(gym, None, None, workers=1, timeout=2.0, limit=100)
    try:
        box.run([("reset", 0, {"secret": "7"})])
        steps = box.run([("step", 0, "I say 5"), ("step", 0, "no idea"), ("step", 0, "7")])
        assert [s[1] for s in steps] == [
            ("Higher.", -0.1, False),
            ("Say a number.", 0.0, False),
            ("Right!", 1.0, True),
        ]
    finally:
        box.close()


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
    # `render` (chat writes a served model's parsed `tool_calls` back as the model wrote them) is
    # what `parse` reads back, in either format
    for call in [
        ("add", {"a": 1, "b": -2.5}),
        ("say", {"text": 'it\'s "quoted"\n', "items": [1, [2]]}),
        ("f", {}),
    ]:
        for fmt in ("hermes", "python"):
            assert calls.parse(calls.render(call, fmt), fmt) == [call]
    assert calls.render(("mul", {"a": 2, "b": 3}), "python") == "<tool_call>mul(a=2, b=3)</tool_call>"
    assert calls.refused(("add", {}), {"add"}) is None
    assert (
        calls.refused(("sub", {}), {"add", "mul"}) == "Error: there is no tool 'sub' (the tools are add, mul)"
    )
    assert calls.refused("Error: unreadable", {"add"}) == "Error: unreadable"


def test_observations_are_the_templates_tool_turn_as_a_delta(tmp_path):
    from tiny import make_tokenizer

    tok = make_tokenizer(tmp_path)
    obs = calls.Observations(tok)
    eos = tok.decode([tok.eos_token_id])
    turn = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "call"}]
    full = tok.apply_chat_template(
        [*turn, {"role": "tool", "content": "42"}], tokenize=False, add_generation_prompt=True
    )
    head = tok.apply_chat_template([turn[0]], tokenize=False, add_generation_prompt=True) + "call" + eos
    # what the model sampled (ending on its EOS) + the observation's ids = the whole conversation
    assert tok.decode(tok(head, add_special_tokens=False)["input_ids"] + obs.encode(["42"], eos).ids) == full


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
    assert r.exit_code == 2 and "undocumented.py: add cannot be shown to the model" in (r.stdout + r.stderr)
    bad.write_text('def add(a: int, b: int) -> int:\n    """Add."""\n    import sympy_zz\n    return a + b\n')
    r = cli(
        "validate", str(bp), "worker.rollout.multi_turn.enable=true", f"worker.rollout.multi_turn.tools={bad}"
    )
    assert r.exit_code == 2 and "undocumented.py:3 imports sympy_zz, which is not installed here" in r.stderr


def test_validate_reads_an_environment_says_the_reward_rule_and_refuses_what_cannot_work(
    blueprint, cli, env_files, tool_file
):
    trl, gym = env_files
    bp = str(blueprint())
    on = "worker.rollout.multi_turn.enable=true"
    r = cli("validate", bp, on, f"worker.rollout.multi_turn.environment={trl}")
    out = re.sub(" +", " ", r.stdout + r.stderr)  # the summary's columns
    assert r.exit_code == 0, out
    assert "environment Counter, one per episode, TRL-shaped" in out
    assert "tool increment(step: integer): Add to the counter." in out
    assert "reward is Counter.get_reward() + the reward function on the last turn" in out

    r = cli(
        "validate",
        bp,
        on,
        f"worker.rollout.multi_turn.environment={gym}",
        "worker.reward.reward_function=null",
    )
    out = re.sub(" +", " ", r.stdout + r.stderr)
    assert r.exit_code == 0, out
    assert "gym-shaped" in out and "reward is the sum of Guess.step() rewards \n" in out

    def refused(*overrides: str) -> str:
        r = cli("validate", bp, on, *overrides)
        out = r.stdout + r.stderr
        assert r.exit_code == 2 and "Traceback" not in out, out
        return out

    out = refused(
        f"worker.rollout.multi_turn.environment={gym}", f"worker.rollout.multi_turn.tools={tool_file}"
    )
    assert "multi_turn.tools: has no effect with Guess, a gym-shaped environment" in out
    plain = tool_file.with_name("plain.py")
    plain.write_text("class Plain:\n    def reset(self, **row):\n        return None\n")
    out = refused(
        f"worker.rollout.multi_turn.environment={plain}:Plain", "worker.reward.reward_function=null"
    )
    assert "worker.reward.reward_function: is not set, and Plain gives no reward" in out
    out = refused(f"worker.rollout.multi_turn.environment={plain}:Nope")
    assert f"multi_turn.environment: {plain} has no class 'Nope'" in out
    out = refused(f"worker.rollout.multi_turn.environment={plain}")
    assert "names no class: give file.py:Class" in out
    out = refused(
        f"worker.rollout.multi_turn.environment={trl}", "worker.rollout.multi_turn.tool_names=[add]"
    )
    assert "multi_turn.tool_names: picks functions of tools, which is not set" in out


def test_a_conversation_as_the_prompt_reaches_the_template_whole(tmp_path):
    from r1cloud.data.loader import PromptSet
    from r1cloud.spec.models import DataConfig
    from tiny import make_tokenizer

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


def test_the_calculator_blueprint_validates(cli):
    r = cli("validate", str(ROOT / "blueprints" / "tools_calculator.yaml"))
    # the model is a Hub id here; validate reads the tools and the data all the same
    assert "tool       multiply(a: integer, b: integer): Multiply two whole numbers." in (
        r.stdout + r.stderr
    ), r.stdout + r.stderr
    rows = [json.loads(line) for line in (ROOT / "data" / "multiply" / "test.jsonl").read_text().splitlines()]
    assert all(row["problem"][-1]["role"] == "user" for row in rows)
