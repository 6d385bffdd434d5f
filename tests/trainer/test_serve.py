"""Serving as a user does it: a tiny model trained 2 steps as a real job, served by `r1cloud serve`
(merging the checkpoint first), queried with the official `openai` client — models, completions,
chat, streaming, 401 without the key, a port in use, 50 concurrent requests — and `r1cloud chat`
with the job's format prompt and --compare."""

import json
import os
import signal
import subprocess
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import openai
import pytest
from openai import OpenAI

from r1cloud.serving.serve import free_port
from tinyrun import R1CLOUD, ROOT, r1, tiny_blueprint

KEY = "sk-test-7f3a"


@pytest.fixture(scope="module")
def job(tmp_path_factory, tiny_model, digits_reward):
    """A finished 2-step training job in its own R1CLOUD_HOME; its step 1 is not INFERENCE READY."""
    d = tmp_path_factory.mktemp("serve")
    home = d / "home"
    os.environ["R1CLOUD_HOME"] = str(home)
    (d / "tiny.yaml").write_text(tiny_blueprint(tiny_model, digits_reward))
    r = r1("train", d / "tiny.yaml", "trainer.max_steps=2", "--name", "tiny")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    yield "tiny"
    os.environ.pop("R1CLOUD_HOME")


def check_openai_api(url: str, name: str, n_concurrent: int) -> None:
    client = OpenAI(base_url=url, api_key=KEY, max_retries=0)
    assert [m.id for m in client.models.list().data] == [name]
    done = client.completions.create(model=name, prompt="1 + 1 =", max_tokens=4, temperature=0)
    assert done.choices[0].finish_reason in ("length", "stop") and done.usage.completion_tokens >= 1
    again = client.completions.create(model=name, prompt="1 + 1 =", max_tokens=4, temperature=0)
    assert again.choices[0].text == done.choices[0].text  # greedy is deterministic
    msgs = [{"role": "user", "content": "What is 2+3?"}]
    reply = client.chat.completions.create(model=name, messages=msgs, max_tokens=4, temperature=0)
    assert reply.choices[0].message.role == "assistant" and reply.usage.completion_tokens >= 1
    pieces = [
        c.choices[0].delta.content or ""
        for c in client.chat.completions.create(
            model=name, messages=msgs, max_tokens=4, temperature=0, stream=True
        )
        if c.choices
    ]
    assert "".join(pieces) == reply.choices[0].message.content and len(pieces) >= 1
    streamed = [
        c.choices[0].text
        for c in client.completions.create(
            model=name, prompt="1 + 1 =", max_tokens=4, temperature=0, stream=True
        )
    ]
    assert "".join(streamed) == done.choices[0].text
    with pytest.raises(openai.AuthenticationError):
        OpenAI(base_url=url, api_key="wrong", max_retries=0).models.list()
    for path in ("models", "chat/completions"):  # no Authorization header at all
        with pytest.raises(urllib.error.HTTPError) as e:
            data = json.dumps({"model": name, "messages": msgs}).encode() if path != "models" else None
            urllib.request.urlopen(urllib.request.Request(f"{url}/{path}", data=data), timeout=30)
        assert e.value.code == 401

    def one(i: int) -> str:
        out = client.completions.create(model=name, prompt=f"{i} + {i} =", max_tokens=3, temperature=0)
        return out.choices[0].text

    with ThreadPoolExecutor(n_concurrent) as pool:
        answers = list(pool.map(one, range(n_concurrent)))
    assert len(answers) == n_concurrent and all(isinstance(a, str) for a in answers)


@pytest.mark.slow
def test_serve_a_checkpoint_with_vllm_and_query_it_with_openai(job):
    pytest.importorskip("vllm")
    port = free_port()
    r = r1(
        "serve", "-c", f"{job}:step-1", "--port", port, "--api-key", KEY, "--max-model-len", "256",
        "--detach", "--", "--enforce-eager",
        env={"VLLM_CPU_KVCACHE_SPACE": "1"},
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    assert "not INFERENCE READY: merging it first" in r.stderr
    url = f"http://127.0.0.1:{port}/v1"
    assert f"ready: {url}" in r.stdout and "with vllm" in r.stdout
    assert "from openai import OpenAI" in r.stdout and "curl " in r.stdout and KEY not in r.stdout
    try:
        listing = r1("jobs")
        assert "serve-tiny-step-1" in listing.stdout and url in listing.stdout
        record = json.loads(
            (Path(os.environ["R1CLOUD_HOME"]) / "jobs/serve-tiny-step-1/job.json").read_text()
        )
        assert KEY not in json.dumps(record)  # the key reaches the server's environment only
        check_openai_api(url, "tiny-step-1", 50)
        # The same port again: one clear line, exit 2, nothing started.
        r = r1("serve", "-c", job, "--port", port, "--engine", "transformers")
        assert r.returncode == 2 and f"cannot listen on 127.0.0.1:{port}" in r.stderr
        assert "Traceback" not in r.stderr and "--port" in r.stderr
    finally:
        stopped = r1("stop", "serve-tiny-step-1")
    assert stopped.returncode == 0 and "STOPPED" in stopped.stdout
    with pytest.raises(openai.APIConnectionError):
        OpenAI(base_url=url, api_key=KEY, max_retries=0).models.list()


def test_serve_with_the_transformers_engine(job):
    """The fallback engine (no vLLM needed) speaks the same API."""
    port = free_port()
    r = r1(
        "serve", "-c", job, "--port", port, "--api-key", KEY, "--engine", "transformers", "--detach",
        "--name", "fallback", "--served-model-name", "mine",
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    assert "with transformers" in r.stdout and "not INFERENCE READY" not in r.stderr  # last step: save_hf
    try:
        url = f"http://127.0.0.1:{port}/v1"
        check_openai_api(url, "mine", 50)
        logs = r1("logs", "fallback")
        assert "POST /v1/completions" in logs.stdout
        # `eval` of the endpoint beside the job itself: the same prompts, the job's prompt and reward
        r = r1("eval", url, job, "--limit", "8", "--engine", "hf", "--api-key", KEY, "--json")
        assert r.returncode == 0, r.stderr[-3000:]
        endpoint, local = json.loads(r.stdout)["targets"]
        assert (
            endpoint["model"] == f"{url} (mine)"
            and endpoint["all"]["prompts"] == local["all"]["prompts"] == 8
        )
        asked = [json.loads(x) for x in Path(endpoint["samples"]).read_text().splitlines()]
        here = [json.loads(x) for x in Path(local["samples"]).read_text().splitlines()]
        assert [a["question"] for a in asked] == [h["question"] for h in here]
        assert [a["response"] for a in asked] == [h["response"] for h in here]  # greedy, same prompt text
    finally:
        assert r1("stop", "fallback").returncode == 0


def test_serve_ctrl_c_stops_the_server(job):
    port = free_port()
    p = subprocess.Popen(
        [R1CLOUD, "serve", "-c", job, "--port", str(port), "--engine", "transformers", "--name", "fg"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # as from a terminal: a shell's background job inherits SIGINT ignored, and so would this
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        for line in p.stdout:
            if line.startswith("ready:"):
                break
        OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0).models.list()
        p.send_signal(signal.SIGINT)
        # drain both pipes while it stops: the server's log is relayed to stdout, and a pipe
        # nobody reads would block the exit's final flush
        _, errs = p.communicate(timeout=60)
        assert p.returncode == 0, errs[-2000:]
    finally:
        p.kill()
    assert (
        json.loads((Path(os.environ["R1CLOUD_HOME"]) / "jobs/fg/job.json").read_text())["status"] == "STOPPED"
    )
    with pytest.raises(openai.APIConnectionError):
        OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0).models.list()


@pytest.mark.parametrize(
    "args,message",
    [
        (["-c", "no-such-thing"], "not a job, a folder or a Hub model id"),
        (["-c", "tiny:step-7"], "steps there: 1, 2"),
        (["-c", "tiny", "--engine", "tgi"], "use auto, vllm or transformers"),
        (["-c", "tiny", "--infra", "aws"], "where a cloud replica cannot read it"),
        (["-c", "tiny", "--replicas", "2"], "needs a cloud --infra"),
        (["-c", "tiny", "--tool-call-format", "json"], "use auto, hermes, python, none"),
        (["-c", "tiny", "--infra", "aws", "--tool-call-format", "python"], "replicas do not install"),
    ],
)
def test_serve_bad_input_is_one_clear_line(job, args, message):
    r = r1("serve", *args)
    assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr


def test_chat_applies_the_jobs_format_prompt_and_compares(job, tiny_model):
    import jinja2

    template = jinja2.Template((ROOT / "format_prompts/arithmetic.jinja").read_text().strip())
    r = r1("chat", job, "What is 2+3?", "--show-prompt", "--max-tokens", "4")
    assert r.returncode == 0, r.stderr
    assert f"sent: {template.render(content='What is 2+3?')}" in r.stderr  # the job's format prompt
    r = r1("chat", job, "What is 2+3?", "--show-prompt", "--raw", "--max-tokens", "4")
    assert "sent: What is 2+3?\n" in r.stderr
    r = r1("chat", job, "--compare", tiny_model, "--raw", "--max-tokens", "4", input="hello\nworld\n")
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("tiny (tiny-step-2)") == 2 and r.stdout.count(f"{tiny_model} (tiny)") == 2
    assert "hello" in r.stdout and "world" in r.stdout  # each question heads its table
    r = r1("chat", "http://127.0.0.1:9/v1", "hi")
    assert r.returncode == 2 and "cannot reach" in r.stderr and "Traceback" not in r.stderr


def test_vllm_cpu_kv_cache_is_sized_to_the_model_not_the_machine(tmp_path, monkeypatch):
    """vLLM's CPU build would claim most of the machine's memory: serve sizes its KV cache to
    four sequences of the served context instead, unless the user sized it."""
    from r1cloud.serving.serve import kv_cache_env

    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    (tmp_path / "config.json").write_text(
        json.dumps({"num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4,
                    "hidden_size": 3584, "torch_dtype": "bfloat16", "max_position_embeddings": 131072})
    )  # fmt: skip
    # K and V × 28 layers × 4 heads × 128 dims × 2 bytes × 32768 tokens (the cap) × 4 sequences = 7 GiB
    assert kv_cache_env(str(tmp_path), None, []) == {"VLLM_CPU_KVCACHE_SPACE": "7"}
    assert kv_cache_env(str(tmp_path), 2048, []) == {"VLLM_CPU_KVCACHE_SPACE": "1"}  # at least 1
    # --max-model-len passed to vLLM after `--` sizes the cache (and wins over the option, as in vLLM)
    assert kv_cache_env(str(tmp_path), None, ["--max-model-len", "65536"]) == {"VLLM_CPU_KVCACHE_SPACE": "14"}
    assert kv_cache_env(str(tmp_path), 2048, ["--max-model-len=65536"]) == {"VLLM_CPU_KVCACHE_SPACE": "14"}
    assert kv_cache_env(str(tmp_path), None, ["--gpu-memory-utilization", "0.5"]) == {}
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "3")
    assert kv_cache_env(str(tmp_path), None, []) == {}


def test_an_engine_that_cannot_start_is_told_by_its_cause():
    from r1cloud.serving.serve import failure_cause

    assert "lower --max-model-len" in failure_cause(
        ["INFO starting", "ValueError: No available memory for the cache blocks. Try increasing ..."]
    )
    assert "--port" in failure_cause(["OSError: [Errno 98] Address already in use"])
    assert "--engine transformers" in failure_cause(
        ["Model architectures ['Foo'] are not supported for now."]
    )
    assert failure_cause(["RuntimeError: something else"]) is None


def test_serve_reads_tool_calls_and_chat_runs_the_tools(smollm2, tmp_path, monkeypatch):
    """OpenAI tool calling as a user gets it: SmolLM2 served by vLLM with r1cloud's `python` call
    format (its tool-parser plugin), asked with `tools=` by the official client in the tool
    quickstart's conversation, answers with `tool_calls` (and streams them); a tool message
    continues the conversation. `r1cloud chat --blueprint` then runs the calculator in the sandbox
    between turns and shows each call, against vLLM (`tool_calls`) and, side by side, the
    transformers engine (the call read from the text, as the trainer reads it)."""
    pytest.importorskip("vllm")
    from r1cloud.agents.tools import check

    monkeypatch.setenv("R1CLOUD_HOME", str(tmp_path / "home"))
    port, blueprint = free_port(), ROOT / "blueprints" / "tools_calculator.yaml"
    r = r1(
        "serve", "-c", smollm2, "--port", port, "--tool-call-format", "python", "--max-model-len", "1024",
        "--name", "tools", "--detach", "--", "--enforce-eager", env={"VLLM_CPU_KVCACHE_SPACE": "1"},
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    assert "tool calls: python" in r.stdout
    url, name = f"http://127.0.0.1:{port}/v1", Path(smollm2).name
    try:
        client = OpenAI(base_url=url, api_key="none", max_retries=0)
        row = json.loads((ROOT / "data/multiply/test.jsonl").read_text().splitlines()[0])
        tools = check(None, str(ROOT / "tools/calculator.py"), None)["tools"]
        ask = dict(model=name, messages=row["problem"], tools=tools, max_tokens=40, temperature=0)
        message = client.chat.completions.create(**ask).choices[0].message
        question = row["problem"][-1]["content"]  # "What is A times B?"
        a, b = (int(w.rstrip("?")) for w in question.split() if w.rstrip("?").isdigit())
        assert [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls] == [
            ("multiply", {"a": a, "b": b})
        ], message
        deltas = [c.choices[0].delta for c in client.chat.completions.create(**ask, stream=True) if c.choices]
        streamed = [t for d in deltas for t in d.tool_calls or []]
        assert streamed[0].function.name == "multiply"
        assert json.loads("".join(t.function.arguments or "" for t in streamed)) == {"a": a, "b": b}
        answered = [
            *row["problem"],
            {"role": "assistant", "content": f"<tool_call>multiply(a={a}, b={b})</tool_call>"},
            {"role": "tool", "content": str(a * b), "tool_call_id": message.tool_calls[0].id},
        ]
        final = client.chat.completions.create(**{**ask, "messages": answered}).choices[0].message
        assert not final.tool_calls and str(a * b) in final.content, final

        chat = r1("chat", url, "What is 237 times 83?", "--blueprint", blueprint, "--max-tokens", "40",
                  "--compare", smollm2)  # fmt: skip
        assert chat.returncode == 0, chat.stdout + chat.stderr
        assert "5 messages before the question" in chat.stderr  # the rows' lead-in
        assert chat.stdout.count("[tool] multiply(a=237, b=83) → 19671") == 2, chat.stdout
        assert chat.stdout.count("The answer is 19671") == 2, chat.stdout
        plain = r1("chat", url, "What is 237 times 83?", "--raw", "--max-tokens", "20")
        assert plain.returncode == 0 and "[tool]" not in plain.stdout  # no blueprint: no tools
    finally:
        r1("stop", "tools")
