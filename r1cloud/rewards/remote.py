"""Remote rewards: `worker.reward.reward_function: http(s)://host:port/path` (LMM-R1/OpenRLHF's
remote reward model URL). Each batch is POSTed as JSON in both dialects at once:

    {"reward_inputs": [{"response", "response_length", "ground_truth", "prompt"}, ...],   # EasyR1
     "query": [prompt + response, ...], "prompts": [...], "labels": [...],               # OpenRLHF
     "kwargs": worker.reward.reward_function_kwargs}

and the answer is read as `{"scores": [{"overall": …, …}, …]}` (EasyR1's dicts) or
`{"rewards": [float, …]}` (OpenRLHF). Connection failures, timeouts and 5xx answers are retried
with backoff; a batch that still fails, or a malformed answer, scores 0 for the samples concerned
and counts them in `reward/errors` — the run goes on.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

from r1cloud.rewards.scores import Score, ScoreChecks


class RemoteReward(ScoreChecks):
    sends_prompt = True

    def __init__(self, url: str, kwargs: dict | None = None, timeout: float = 30.0, retries: int = 3):
        super().__init__()
        self.url, self.kwargs, self.timeout, self.retries = url, kwargs or {}, timeout, retries
        self.name = url

    def _post(self, body: dict) -> dict:
        data = json.dumps(body).encode()
        for attempt in range(self.retries + 1):
            request = urllib.request.Request(
                self.url, data=data, headers={"Content-Type": "application/json"}
            )
            try:
                with urllib.request.urlopen(request, timeout=self.timeout) as r:
                    return json.load(r)
            except urllib.error.HTTPError as e:
                if e.code < 500 or attempt == self.retries:
                    raise RuntimeError(f"HTTP {e.code} {e.reason}") from None
            except (urllib.error.URLError, OSError) as e:
                if attempt == self.retries:
                    raise RuntimeError(
                        f"unreachable after {self.retries + 1} tries: {getattr(e, 'reason', e)}"
                    ) from None
            time.sleep(min(2**attempt, 8))
        raise AssertionError("unreachable")

    def __call__(self, inputs: list[dict]) -> tuple[list[Score], int]:
        if not inputs:
            return [], 0
        body = {
            "reward_inputs": inputs,
            "query": [x.get("prompt", "") + x["response"] for x in inputs],
            "prompts": [x.get("prompt", "") for x in inputs],
            "labels": [x["ground_truth"] for x in inputs],
            "kwargs": self.kwargs,
        }
        failed = [{"overall": 0.0} for _ in inputs]
        try:
            answer = self._post(body)
        except (RuntimeError, ValueError) as e:
            self._note(f"the reward server failed: {e}")
            return failed, len(inputs)
        raw = answer.get("scores", answer.get("rewards")) if isinstance(answer, dict) else None
        if not isinstance(raw, list) or len(raw) != len(inputs):
            self._note(
                f"the reward server answered {self._describe(raw, len(inputs))}, not 'scores' or 'rewards'"
            )
            return failed, len(inputs)
        scores, errors = [], 0
        for s in raw:
            s = {"overall": s} if not isinstance(s, dict) else s
            if self._valid(s):
                scores.append(self._clean(s))
            else:
                self._note(f"the reward server answered {self._describe(s, 1)}")
                scores.append({"overall": 0.0})
                errors += 1
        return scores, errors
