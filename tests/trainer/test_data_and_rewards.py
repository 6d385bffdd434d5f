"""The trainer's data and reward plumbing: prompts rendered as EasyR1 does, a loader that resumes
exactly, and reward functions that cannot take the run down."""

import json
import math
import os

import pytest
from transformers import AutoTokenizer

from json_server import JsonServer
from r1cloud.data.loader import Loader, PromptSet
from r1cloud.rewards.pool import RewardFunction
from r1cloud.spec.models import DataConfig
from tinyrun import run_trainer


@pytest.fixture
def rows(tmp_path):
    path = tmp_path / "d.jsonl"
    lines = [{"q": f"What is {i} + 1?", "a": str(i + 1), "source": "gen"} for i in range(10)]
    lines.append({"q": "long " * 200, "a": "0", "source": "gen"})
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


def test_prompts_use_the_format_prompt_and_chat_template(tiny_model, rows, tmp_path):
    tok = AutoTokenizer.from_pretrained(tiny_model)
    tpl = tmp_path / "p.jinja"
    tpl.write_text("  {{ content | trim }} Box it.  \n")
    cfg = DataConfig(prompt_key="q", answer_key="a", format_prompt=str(tpl), max_prompt_length=64)
    ps = PromptSet(str(rows), tok, cfg)
    assert len(ps) == 10 and ps.dropped == 1  # the overlong row is filtered, and counted
    text = tok.decode(ps.prompts[0].prompt_ids)
    assert text == "<|im_start|>user\nWhat is 0 + 1? Box it.<|im_end|>\n<|im_start|>assistant\n"
    assert ps.prompts[3].ground_truth == "4" and ps.prompts[3].extra == {"source": "gen"}
    kept = PromptSet(f"{rows}@train", tok, cfg, filter_overlong=False)
    assert len(kept) == 11 and len(kept.prompts[-1].prompt_ids) == 64  # truncated, as EasyR1


def test_mixing_follows_the_probabilities_and_uses_every_row():
    from collections import Counter

    from r1cloud.data.loader import mix

    big = [{"set": "big", "i": i} for i in range(900)]
    small = [{"set": "small", "i": i} for i in range(100)]
    assert mix([big, small], None, 0) == big + small  # no weights: one after the other
    mixed = mix([big, small], [0.5, 0.5], seed=3)
    assert len(mixed) == 1000
    counts = Counter(r["set"] for r in mixed)
    assert abs(counts["small"] - 500) < 60  # binomial(1000, 0.5): 60 is ~3.8 standard deviations
    assert {r["i"] for r in mixed if r["set"] == "small"} == set(range(100))  # cycled, all used
    assert mix([big, small], [0.5, 0.5], seed=3) == mixed  # seeded
    assert mix([big, small], [5, 5], seed=3) == mixed  # weights are normalised


def test_a_mixture_keeps_the_columns_its_sets_share(tiny_model, rows, tmp_path):
    other = tmp_path / "other.jsonl"
    other.write_text("".join(json.dumps({"q": f"Say {i}", "a": str(i), "level": i}) + "\n" for i in range(6)))
    tok = AutoTokenizer.from_pretrained(tiny_model)
    cfg = DataConfig(prompt_key="q", answer_key="a", max_prompt_length=64, seed=1)
    ps = PromptSet([str(rows), str(other)], tok, cfg, probs=[1, 1])
    assert len(ps) + ps.dropped == 17 and ps.columns == ["a", "q"]
    assert {p.content.split()[0] for p in ps.prompts} == {"What", "Say"}
    with pytest.raises(ValueError, match=f"{other}: no column 'source'"):
        PromptSet([str(rows), str(other)], tok, DataConfig(prompt_key="q", answer_key="source"))


def test_a_missing_column_names_the_columns(tiny_model, rows):
    tok = AutoTokenizer.from_pretrained(tiny_model)
    with pytest.raises(ValueError, match="no column 'problem'; the columns are a, q, source"):
        PromptSet(str(rows), tok, DataConfig(prompt_key="problem", answer_key="a"))


def test_loader_is_seeded_wraps_epochs_and_resumes_exactly():
    a = Loader(10, 3, seed=1)
    first = [a.next() for _ in range(7)]  # 3 batches per epoch (drop_last), into epoch 2
    assert len({tuple(b) for b in first}) == 7
    assert all(
        len(set(sum(first[e * 3 : e * 3 + 3], []))) == 9 for e in range(2)
    )  # no repeats within an epoch
    b = Loader(10, 3, seed=1)
    for _ in range(4):
        b.next()
    state = b.state_dict()
    c = Loader(10, 3, seed=1)
    c.load_state_dict(state)
    assert [c.next() for _ in range(3)] == first[4:7]
    assert Loader(10, 3, seed=2).next() != first[0]
    with pytest.raises(ValueError, match="fewer than one batch"):
        Loader(2, 3, seed=1)


def write(tmp_path, body: str):
    path = tmp_path / "r.py"
    path.write_text(body)
    return str(path)


INPUTS = [{"response": f"r{i}", "response_length": 2, "ground_truth": "x"} for i in range(4)]


@pytest.mark.parametrize(
    "body,errors",
    [
        ("def f(xs):\n    return [{'overall': 1.0, 'acc': 1.0} for _ in xs]\n", 0),
        ("def f(xs):\n    raise RuntimeError('boom')\n", 4),
        (
            "def f(xs):\n    if any(x['response'] == 'r2' for x in xs):\n        raise RuntimeError('bad r2')\n    return [{'overall': 1.0} for _ in xs]\n",
            1,
        ),
        (
            "def f(xs):\n    return [{'overall': float('nan') if x['response'] == 'r1' else 1.0} for x in xs]\n",
            1,
        ),
        (
            "def f(xs):\n    return [{'overall': 1.0}]\n",
            0,
        ),  # wrong length for the batch; right for one sample
        ("def f(xs):\n    return [{'score': 1.0} for _ in xs]\n", 4),
        (
            "REWARD_TYPE = 'sequential'\ndef f(x):\n    return {'overall': 1 / (int(x['response'][1]) - 3)}\n",
            1,
        ),
        (  # hangs on one sample: the batch part times out, then that sample alone does
            "import time\ndef f(xs):\n    if any(x['response'] == 'r3' for x in xs):\n        time.sleep(3600)\n    return [{'overall': 1.0} for _ in xs]\n",
            1,
        ),
        (  # kills its own process on one sample: the pool replaces it
            "import os\nREWARD_TYPE = 'sequential'\ndef f(x):\n    if x['response'] == 'r0':\n        os._exit(3)\n    return {'overall': 1.0}\n",
            1,
        ),
        ("def f(xs):\n    return [{'overall': 'high'} for _ in xs]\n", 4),
        (  # raises an exception that pickles but cannot be rebuilt (as openai's APIStatusError)
            "class Bad(Exception):\n    def __init__(self, m, *, response):\n        super().__init__(m)\n"
            "def f(xs):\n    if any(x['response'] == 'r1' for x in xs):\n        raise Bad('no', response=1)\n"
            "    return [{'overall': 1.0} for _ in xs]\n",
            1,
        ),
    ],
    ids=[
        "ok",
        "raises",
        "one-sample-raises",
        "nan",
        "wrong-length",
        "no-overall",
        "sequential-zero-division",
        "hangs",
        "process-dies",
        "not-a-number",
        "unrebuildable-exception",
    ],
)
def test_reward_failures_cost_only_the_samples_concerned(tmp_path, body, errors):
    fn = RewardFunction(write(tmp_path, body), "f", workers=2, timeout=1.0)
    try:
        scores, n_errors = fn(INPUTS)
        assert len(scores) == 4 and n_errors == errors
        assert all(math.isfinite(s["overall"]) for s in scores)
        assert sum(s["overall"] == 0.0 for s in scores) >= errors
        assert fn(INPUTS)[1] == errors  # the pool still works after a kill or a timeout
    finally:
        fn.close()


def test_reward_calls_run_in_parallel_processes(tmp_path):
    body = "import os, time\ndef f(xs):\n    time.sleep(1)\n    return [{'overall': float(os.getpid())} for _ in xs]\n"
    fn = RewardFunction(write(tmp_path, body), "f", workers=2, timeout=10)
    try:
        fn(INPUTS)  # the processes start
        scores, errors = fn(INPUTS)
        assert errors == 0 and len({s["overall"] for s in scores}) == 2  # two processes shared it
        assert os.getpid() not in {s["overall"] for s in scores}
    finally:
        fn.close()


def test_reward_kwargs_and_legacy_type(tmp_path):
    fn = RewardFunction(
        write(tmp_path, "def f(x, w=0):\n    return {'overall': w}\n"),
        "f",
        {"w": 0.5},
        reward_type="sequential",
    )
    assert fn(INPUTS[:1]) == ([{"overall": 0.5}], 0)


NASTY_REWARD = """
import time, zlib

REWARD_TYPE = "sequential"

def compute_score(x):
    kind = zlib.crc32(x["response"].encode()) % 6
    if kind == 0:
        time.sleep(3600)  # hangs
    if kind == 1:
        raise RuntimeError("reward bug")
    if kind == 2:
        return {"overall": float("nan")}
    if kind == 3:
        return {"score": 1.0}  # no overall
    return {"overall": sum(c.isdigit() for c in x["response"]) / max(len(x["response"]), 1)}
"""


def test_hanging_raising_and_malformed_rewards_inside_a_training_run(make_run, tmp_path):
    """A real run (tiny model, 2 workers, 2 steps) whose reward hangs, raises, returns NaN or no
    `overall` on about 2/3 of the samples: it finishes, and reward/errors counts those samples."""
    reward = tmp_path / "nasty.py"
    reward.write_text(NASTY_REWARD)
    run = make_run(
        "trainer.max_steps=2",
        f"worker.reward.reward_function={reward}:compute_score",
        "worker.reward.timeout=1",
        "worker.reward.num_cpus=2",
        name="nasty",
    )
    r = run_trainer(run)
    assert r.returncode == 0, r.stderr[-3000:]
    steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    errors = [m["reward/errors"] for m in steps if "reward/errors" in m]
    assert len(errors) == 2 and sum(errors) > 0
    log = r.stdout + r.stderr
    for reason in ("timed out after 1s", "RuntimeError: reward bug", "non-finite", "without 'overall'"):
        assert log.count(reason) == 1, reason  # each reason is logged once, not per sample


class RewardServer:
    """A real HTTP reward server on loopback, as LMM-R1 users run one: scores the share of digits,
    answers 503 to its first request (so the client's retry is exercised), records every batch."""

    def __init__(self, mode: str = "scores"):
        self.batches, self.returned, self.mode = [], [], mode
        self.http = JsonServer(self.answer, "/score")
        self.url = self.http.url

    def answer(self, path: str, headers, raw: bytes):
        body = json.loads(raw)
        self.batches.append(body)
        if len(self.batches) == 1:
            return 503, None
        values = [
            sum(c.isdigit() for c in x["response"]) / max(len(x["response"]), 1)
            for x in body["reward_inputs"]
        ]
        self.returned.append(values)
        if self.mode == "rewards":
            return 200, {"rewards": values}
        if self.mode == "short":
            return 200, {"rewards": values[:-1]}
        return 200, {"scores": [{"overall": v, "digits": v} for v in values]}

    def close(self):
        self.http.close()


def test_a_training_run_driven_by_a_remote_reward_server(make_run):
    server = RewardServer()
    try:
        run = make_run("trainer.max_steps=2", f"worker.reward.reward_function={server.url}", name="remote")
        r = run_trainer(run)
        assert r.returncode == 0, r.stderr[-3000:]
    finally:
        server.close()
    first = server.batches[1]
    assert len(first["reward_inputs"]) == 16 and first["labels"] == [
        x["ground_truth"] for x in first["reward_inputs"]
    ]
    assert all(
        q == p + x["response"]
        for q, p, x in zip(first["query"], first["prompts"], first["reward_inputs"], strict=True)
    )
    assert all("What is" in p or "+" in p for p in first["prompts"])  # the decoded prompt is sent
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in metrics if "reward/overall" in m]
    assert len(steps) == 2  # after one retried 503: one batch per training step, then validation
    for m, values in zip(steps, server.returned[:2], strict=True):
        assert m["reward/overall"] == pytest.approx(sum(values) / len(values), abs=1e-6)
        assert m["reward/errors"] == 0 and "reward/digits" in m
    val = [v for batch in server.returned[2:] for v in batch]
    assert steps[-1]["val/reward_score"] == pytest.approx(sum(val) / len(val), abs=1e-6)


def test_remote_reward_failures_cost_only_those_samples():
    from r1cloud.rewards.remote import RemoteReward

    server = RewardServer(mode="rewards")
    try:
        fn = RemoteReward(server.url, timeout=5, retries=1)
        scores, errors = fn(INPUTS)  # 503 first, then the answer
        assert errors == 0 and [s["overall"] for s in scores] == server.returned[0]
        server.mode = "short"
        assert fn(INPUTS) == ([{"overall": 0.0}] * 4, 4)
        assert any("3 scores for 4 samples" in r for r in fn.reasons)
    finally:
        server.close()
    down = RemoteReward(server.url, timeout=1, retries=1)
    assert down(INPUTS) == ([{"overall": 0.0}] * 4, 4)
    assert any("unreachable after 2 tries" in r for r in down.reasons)


ASKING_REWARD = """
REWARD_INPUT_KEYS = ["prompt", "level"]

def compute_score(reward_inputs):
    out = []
    for x in reward_inputs:
        assert set(x) == {"response", "response_length", "ground_truth", "prompt", "level"}, sorted(x)
        assert x["prompt"] == f"What is {x['level']} + {x['level']}?", x["prompt"]
        out.append({"overall": float(x["level"]) / 100})
    return out
"""


def test_extra_columns_reach_a_reward_function_that_asks_for_them(make_run, tmp_path):
    data = tmp_path / "levels.jsonl"
    data.write_text(
        "".join(
            json.dumps({"problem": f"What is {i} + {i}?", "answer": str(2 * i), "level": i}) + "\n"
            for i in range(1, 9)
        )
    )
    reward = tmp_path / "asking.py"
    reward.write_text(ASKING_REWARD)
    common = [
        "trainer.max_steps=1",
        f"data.train_files={data}",
        f"data.val_files={data}",
        "data.val_batch_size=8",
    ]
    run = make_run(*common, f"worker.reward.reward_function={reward}:compute_score", name="asking")
    r = run_trainer(run)
    assert r.returncode == 0, r.stderr[-3000:]
    [m] = [
        m for m in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if "reward/overall" in m
    ]
    assert m["reward/errors"] == 0 and 0.01 <= m["reward/overall"] <= 0.08
    reward.write_text(ASKING_REWARD.replace('"level"]', '"levels"]'))
    run = make_run(*common, f"worker.reward.reward_function={reward}:compute_score", name="missing")
    r = run_trainer(run)
    assert r.returncode == 2 and "asks for levels" in r.stderr and "answer, level, problem" in r.stderr
    assert "Traceback" not in r.stderr


class ScriptedJudge:
    """An OpenAI-compatible /v1/chat/completions on loopback whose 'model' is a rule (no capable
    judge model can run here): 10 when the candidate answer equals the reference, 0 when it does
    not, and no number at all when the candidate says '??'. It records the prompts it was sent."""

    def __init__(self, key: str):
        self.key, self.prompts = key, []
        self.http = JsonServer(self.answer, "/v1")
        self.url = self.http.url

    def answer(self, path: str, headers, raw: bytes):
        if headers.get("Authorization") != f"Bearer {self.key}":
            return 401, None
        body = json.loads(raw)
        text = body["messages"][0]["content"]
        self.prompts.append(text)
        ref = text.split("Reference answer: ")[1].split("\n")[0]
        cand = text.split("Candidate answer: ")[1].split("\n")[0]
        reply = "I cannot tell" if "??" in cand else ("Score: 10" if cand.strip() == ref.strip() else "0")
        choice = {"index": 0, "message": {"role": "assistant", "content": reply}, "finish_reason": "stop"}
        return 200, {
            "id": "j",
            "object": "chat.completion",
            "created": 0,
            "model": body["model"],
            "choices": [choice],
        }

    def close(self):
        self.http.close()


def test_judge_reward_against_an_openai_compatible_endpoint(monkeypatch):
    from tinyrun import ROOT

    monkeypatch.setenv("JUDGE_API_KEY", "judge-key")  # inherited by the spawned reward processes
    judge = ScriptedJudge("judge-key")
    fn = RewardFunction(
        str(ROOT / "reward_functions/judge.py"),
        "compute_score",
        {"base_url": judge.url, "model": "j"},
        workers=1,
        timeout=30,
    )
    try:
        rows = [("12", "12", 1.0), ("13", "12", 0.0), ("??", "12", None), ("7", "7", 1.0)]
        inputs = [
            {"response": r, "response_length": 1, "ground_truth": t, "prompt": f"What is {t}?"}
            for r, t, _ in rows
        ]
        scores, errors = fn(inputs)
        assert errors == 1 and [s["overall"] for s in scores] == [1.0, 0.0, 0.0, 1.0]
        assert any("no score" in r for r in fn.reasons)
        # the prompt reaches the template (requests go out concurrently: order is not fixed)
        assert sum("Question: What is 12?" in p for p in judge.prompts) >= 3
    finally:
        fn.close()
        judge.close()


def test_reward_model_reward_scores_like_the_model_itself(tiny_model, tmp_path):
    """A sequence-classification model (tiny, random head) run by the reward worker: batched,
    padded scores equal the model's own score of each conversation alone."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from tinyrun import ROOT

    rm_dir = tmp_path / "rm"
    torch.manual_seed(0)
    rm = AutoModelForSequenceClassification.from_pretrained(tiny_model, num_labels=1)
    rm.save_pretrained(rm_dir)
    tok = AutoTokenizer.from_pretrained(tiny_model)
    tok.save_pretrained(rm_dir)
    inputs = [
        {"response": r, "response_length": 1, "ground_truth": "", "prompt": p}
        for p, r in [
            ("What is 2+2?", "4"),
            ("Name a colour.", "A rather long answer: blue, or maybe green."),
            ("Hi", ""),
        ]
    ]
    fn = RewardFunction(
        str(ROOT / "reward_functions/reward_model.py"),
        "compute_score",
        {"model_path": str(rm_dir), "batch_size": 3},
    )
    try:
        scores, errors = fn(inputs)
    finally:
        fn.close()
    assert errors == 0
    rm = AutoModelForSequenceClassification.from_pretrained(rm_dir).eval()
    for x, s in zip(inputs, scores, strict=True):
        chat = [{"role": "user", "content": x["prompt"]}, {"role": "assistant", "content": x["response"]}]
        ids = tok(
            tok.apply_chat_template(chat, tokenize=False), return_tensors="pt", add_special_tokens=False
        )
        with torch.no_grad():
            alone = rm(**ids).logits[0, 0].item()
        assert s["overall"] == pytest.approx(alone, abs=1e-4)


def test_a_missing_split_names_the_splits_there():
    from r1cloud.data.loader import load_rows
    from tinyrun import ROOT

    with pytest.raises(ValueError, match=r"no split 'test'; the splits there are: train$"):
        load_rows(f"{ROOT}/data/arithmetic/train.jsonl@test")
    with pytest.raises(ValueError, match=r"no split 'validation'; the splits there are: train, test"):
        load_rows(f"{ROOT}/data/arithmetic@validation")
    assert len(load_rows(f"{ROOT}/data/arithmetic@test")) > 0


def test_use_modelscope_hub_without_modelscope_is_one_clear_line(tmp_path):
    """As EasyR1: USE_MODELSCOPE_HUB=1 switches Hub downloads to ModelScope through modelscope's
    patch, which needs the package (not installed here; the download itself needs a network)."""
    import importlib.util
    import subprocess
    import sys

    if importlib.util.find_spec("modelscope") is not None:
        pytest.skip("modelscope is installed here")
    r = subprocess.run(
        [sys.executable, "-m", "r1cloud.trainer", str(tmp_path)],
        capture_output=True,
        text=True,
        env={**os.environ, "USE_MODELSCOPE_HUB": "1"},
        timeout=120,
    )
    assert r.returncode == 2 and "pip install modelscope" in r.stderr and "Traceback" not in r.stderr


def test_parquet_csv_and_folders_load_like_jsonl(tiny_model, rows, tmp_path):
    import datasets

    tok = AutoTokenizer.from_pretrained(tiny_model)
    cfg = DataConfig(prompt_key="q", answer_key="a", max_prompt_length=64)
    want = [(p.content, p.ground_truth) for p in PromptSet(str(rows), tok, cfg).prompts]
    table = datasets.load_dataset("json", data_files=str(rows), split="train")
    (tmp_path / "folder").mkdir()
    table.to_parquet(str(tmp_path / "d.parquet"))
    table.to_csv(str(tmp_path / "d.csv"), index=False)
    table.to_parquet(str(tmp_path / "folder/train.parquet"))
    for source in (
        tmp_path / "d.parquet",
        tmp_path / "d.csv",
        tmp_path / "folder",
        f"{tmp_path / 'folder'}@train",
    ):
        got = [(p.content, p.ground_truth) for p in PromptSet(str(source), tok, cfg).prompts]
        assert got == want, source


def test_override_chat_template_replaces_the_models(make_run, tmp_path):
    """The trainer renders prompts with data.override_chat_template instead of the model's."""
    from r1cloud.trainer.driver import Trainer

    template = tmp_path / "chat.jinja"
    template.write_text("{% for m in messages %}<<{{ m['content'] }}>>{% endfor %}ANSWER:")
    trainer = Trainer(make_run(f"data.override_chat_template={template}", name="chat-template"))
    try:  # the constructor loads tokenizer, data and reward; no Ray until training starts
        text = trainer.tokenizer.decode(trainer.train_set.prompts[0].prompt_ids)
    finally:
        trainer.reward.close()
    assert text.startswith("<<") and text.endswith(">>ANSWER:") and "Give only the final number" in text


def test_chunked_prefill_on_cpu_is_refused_not_dropped(make_run):
    """vLLM's CPU build crashes on chunked prompts of seeded requests, so r1cloud schedules whole
    prompts there: a blueprint asking for chunked prefill on CPU is told so, not ignored."""
    from r1cloud.trainer.driver import Trainer

    with pytest.raises(ValueError, match="enable_chunked_prefill: vLLM's CPU build"):
        Trainer(make_run("worker.rollout.enable_chunked_prefill=true", engine="vllm"))


def test_freezing_the_language_model_of_a_text_model_is_refused(make_run):
    """freeze_language_model is for VLMs: on a text model nothing would train, which validate says
    when the model's config is here (the trainer says it too, for a model it fetches)."""
    from r1cloud.spec import SpecError

    with pytest.raises(SpecError, match="is text-only \\(no vision_config\\): freezing its language model"):
        make_run("worker.actor.model.freeze_language_model=true")


def test_hf_engine_applies_the_extra_sampling_fields(tiny_model):
    """val_override_config's vLLM fields reach transformers generate under its names: a strong
    repetition penalty changes a greedy answer and leaves fewer repeated tokens; min_tokens holds
    off the end of text."""
    import torch
    from tokenizers import Tokenizer

    from r1cloud.rollout.engine import Request, Sampling, hf_lacks
    from r1cloud.rollout.hf import HFEngine

    ids = Tokenizer.from_file(str(tiny_model / "tokenizer.json")).encode("What is 2 + 3?").ids
    engine = HFEngine(str(tiny_model), set(), 0, torch.float32, "cpu")

    def answer(**extra) -> list[int]:
        (s,) = engine.generate([Request(ids)], Sampling(temperature=0, max_tokens=16, extra=extra))
        return s.response

    plain, penalised = answer(), answer(repetition_penalty=50)
    assert plain != penalised
    assert len(set(penalised)) > len(set(plain))  # the penalty spreads the answer over more tokens
    eos = answer()[0]  # make the first greedy token the end of text: min_tokens must defer it
    engine.eos = {eos}
    assert answer() == [eos] and len(answer(min_tokens=5)) >= 5  # the response keeps its end token
    assert hf_lacks(["n", "temperature", "min_p", "repetition_penalty", "min_tokens"]) == []
    assert hf_lacks(["presence_penalty", "frequency_penalty"]) == ["frequency_penalty", "presence_penalty"]


def test_hf_engine_top_k_minus_one_samples_every_token(tiny_model):
    """top_k: -1 (vLLM's and EasyR1's "all tokens") is the whole vocabulary in the hf engine too,
    not generate's global default of the 50 most likely (GenerationConfig._get_default_generation_params,
    which the engine's top_k=None overrides): at a temperature that flattens the distribution, 512
    first tokens take far more than 50 values; top_k: 5 keeps them to 5."""
    import torch

    from r1cloud.rollout.engine import Request, Sampling
    from r1cloud.rollout.hf import HFEngine

    engine = HFEngine(str(tiny_model), set(), 0, torch.float32, "cpu")

    def first_tokens(top_k: int) -> set[int]:
        s = Sampling(n=512, temperature=100.0, top_k=top_k, max_tokens=1, ignore_eos=True)
        return {x.response[0] for x in engine.generate([Request([5, 6, 7])], s)}

    assert len(first_tokens(-1)) > 100
    assert len(first_tokens(5)) <= 5


def test_hf_engine_load_weights_refuses_a_name_it_lacks(tiny_model):
    """A synced weight lands in the engine's model by name (its samples change); a name the model
    lacks raises instead of leaving the engine sampling from that weight's first value."""
    import torch

    from r1cloud.rollout.engine import Request, Sampling
    from r1cloud.rollout.hf import HFEngine

    engine = HFEngine(str(tiny_model), set(), 0, torch.float32, "cpu")
    name, weight = next(iter(engine.model.state_dict().items()))

    def greedy() -> list[int]:
        return engine.generate([Request([5, 6, 7])], Sampling(temperature=0, max_tokens=8))[0].response

    before = greedy()
    engine.load_weights([(name, torch.randn_like(weight) * 3)])
    assert greedy() != before
    with pytest.raises(RuntimeError, match="no weight named 'model.nope.weight'"):
        engine.load_weights([(name, weight), ("model.nope.weight", weight)])


@pytest.mark.parametrize("asked", [False, True])
def test_chunked_prefill_on_a_gpu_reaches_vllm_as_written(make_run, monkeypatch, asked):
    """EasyR1 passes `enable_chunked_prefill=config.enable_chunked_prefill` to vLLM as it is
    (EasyR1 b44b311, verl/workers/rollout/vllm_rollout_spmd.py:142; default false, config.py:35):
    `false` must not become vLLM's default (on). No GPU here, so the two things that cannot exist
    are faked at their boundary: torch says a device is there, and vLLM's `LLM` records what it
    is given instead of starting."""
    import torch
    import vllm

    from r1cloud.rollout.vllm import VLLMEngine
    from r1cloud.spec import load_resolved

    given = {}

    class Recorder:
        def __init__(self, **kwargs):
            given.update(kwargs)

        def sleep(self, level: int) -> None:
            pass

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(vllm, "LLM", Recorder)
    spec = load_resolved(
        make_run(f"worker.rollout.enable_chunked_prefill={str(asked).lower()}") / "spec.yaml"
    )
    path = spec.worker.actor.model.model_path
    VLLMEngine(path, path, spec.worker.rollout, {0}, 1)
    assert given["enable_chunked_prefill"] is asked


def test_a_model_the_hub_cannot_give_is_one_line_naming_it(monkeypatch, tmp_path):
    """No Hub to reach and nothing cached (HF_HUB_OFFLINE here): one line naming the model and the
    fix, not transformers' two tracebacks."""
    from types import SimpleNamespace

    from r1cloud.data.loader import load_tokenizer

    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)  # read once, at import
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path))
    model = SimpleNamespace(model_path="nobody/no-such-model", tokenizer_path=None, trust_remote_code=False)
    with pytest.raises(
        ValueError, match=r"^the model 'nobody/no-such-model' cannot be loaded: .*local model folder"
    ):
        load_tokenizer(model, SimpleNamespace(override_chat_template=None))
