"""Judge reward (EasyR1 interface; R1V-Free's open-ended tasks): a model on an OpenAI-compatible
endpoint scores each response against the reference answer through a Jinja template, and the
first number in its reply, divided by `max_score`, is the reward.

    worker:
      reward:
        reward_function: reward_functions/judge.py:compute_score
        reward_function_kwargs:
          base_url: http://judge-host:8000/v1   # e.g. `r1cloud serve` of a judge model
          model: judge
          api_key_env: JUDGE_API_KEY             # the key's environment variable (a blueprint secret)

`template` (a Jinja file or text over `question`, `response`, `reference`) replaces the default.
Requests go out concurrently (`concurrency`); each has `timeout` seconds. A reply with no number
raises for that sample, so it scores 0 and counts in `reward/errors`.
"""

import os
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REWARD_NAME = "judge"
REWARD_TYPE = "batch"
REWARD_INPUT_KEYS = ["prompt"]

DEFAULT_TEMPLATE = """You are grading an answer against a reference.
{% if question %}Question: {{ question }}
{% endif %}Reference answer: {{ reference }}
Candidate answer: {{ response }}
How well does the candidate's final answer agree with the reference? Reply with one integer from 0 (wrong) to 10 (fully correct)."""

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def _template(template: str | None):
    import jinja2

    text = template or DEFAULT_TEMPLATE
    if template and len(template) < 4096 and "\n" not in template and Path(template).is_file():
        text = Path(template).read_text(encoding="utf-8")
    return jinja2.Template(text)


def compute_score(
    reward_inputs: list[dict],
    base_url: str,
    model: str,
    api_key_env: str = "JUDGE_API_KEY",
    template: str | None = None,
    max_score: float = 10.0,
    concurrency: int = 8,
    timeout: float = 60.0,
    max_tokens: int = 16,
) -> list[dict[str, float]]:
    from openai import OpenAI

    client = OpenAI(
        base_url=base_url, api_key=os.environ.get(api_key_env) or "none", timeout=timeout, max_retries=2
    )
    prompt = _template(template)

    def judge(x: dict) -> dict[str, float]:
        message = prompt.render(
            question=x.get("prompt", ""), response=x["response"], reference=x["ground_truth"]
        )
        reply = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": message}], max_tokens=max_tokens, temperature=0
        )
        text = reply.choices[0].message.content or ""
        found = _NUMBER.search(text)
        if not found:
            raise ValueError(f"the judge's reply has no score: {text[:80]!r}")
        score = min(max(float(found.group()) / max_score, 0.0), 1.0)
        return {"overall": score, "judge": score}

    with ThreadPoolExecutor(max(1, concurrency)) as pool:
        return list(pool.map(judge, reward_inputs))
