"""`r1cloud eval`'s figures (evaluation/metrics.py) against their formulas, and its bad input as one line."""

import itertools
import math

import pytest

from r1cloud.evaluation.metrics import correct, ks_for, mean_se, pass_at_k, summarize


@pytest.mark.parametrize(
    "n,c,k,want",
    [
        (1, 0, 1, 0.0),
        (1, 1, 1, 1.0),
        (10, 3, 1, 0.3),
        (4, 1, 2, 0.5),  # 1 - C(3,2)/C(4,2) = 1 - 3/6
        (5, 0, 5, 0.0),
        (5, 5, 3, 1.0),
        (8, 2, 8, 1.0),
        (8, 2, 7, 1.0),  # n - c < k: every draw of 7 holds a correct one
        (16, 4, 4, 1 - math.comb(12, 4) / math.comb(16, 4)),
        (100, 7, 10, 1 - math.comb(93, 10) / math.comb(100, 10)),
    ],
)
def test_pass_at_k_is_the_unbiased_estimator(n, c, k, want):
    assert pass_at_k(n, c, k) == pytest.approx(want, abs=1e-12)
    assert pass_at_k(n, c, k) == pytest.approx(1 - math.comb(n - c, k) / math.comb(n, k), abs=1e-12)


@pytest.mark.parametrize("n,c,k", [(5, 2, 2), (6, 1, 3), (7, 3, 4), (4, 0, 2)])
def test_pass_at_k_is_the_chance_that_k_of_the_n_hold_a_correct_one(n, c, k):
    """Enumerated: the share of the k-subsets of n samples (c correct) holding a correct sample."""
    samples = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(samples, k))
    assert pass_at_k(n, c, k) == pytest.approx(sum(any(s) for s in subsets) / len(subsets))


def test_pass_at_k_refuses_impossible_counts():
    with pytest.raises(ValueError):
        pass_at_k(4, 1, 5)
    with pytest.raises(ValueError):
        pass_at_k(4, 5, 1)


def test_mean_se_and_ks():
    assert mean_se([1.0, 0.0, 1.0, 0.0]) == pytest.approx((0.5, math.sqrt((4 * 0.25 / 3) / 4)))
    assert mean_se([0.3]) == (0.3, 0.0)
    assert ks_for(1) == [1] and ks_for(8) == [1, 2, 4, 8] and ks_for(6) == [1, 2, 4, 6]


def test_correct_reads_accuracy_then_overall():
    assert correct({"overall": 0.1, "accuracy": 1.0}) and not correct({"overall": 1.0, "accuracy": 0.0})
    assert correct({"overall": 1.0}) and not correct({"overall": 0.5})
    assert not correct({"overall": -1.0, "accuracy": -1.0})  # EasyR1's DAPO reward: -1 wrong, 1 right


def _sample(prompt, ok, source=None, length=5, finished=True):
    return {"prompt": prompt, "scores": {"overall": float(ok), "accuracy": float(ok)}, "length": length,
            "finished": finished, "data_source": source}  # fmt: skip


def test_summary_over_prompts_by_source():
    # prompt 0: 2 of 4 right, prompt 1: 0 of 4, prompt 2: 4 of 4 (a second source)
    samples = [_sample(0, i < 2, "a") for i in range(4)] + [
        _sample(1, False, "a", finished=False) for _ in range(4)
    ]
    samples += [_sample(2, True, "b", length=9) for _ in range(4)]
    s = summarize(samples)
    figures = s["all"]
    assert (figures["prompts"], figures["samples"], figures["n"]) == (3, 12, 4)
    assert figures["accuracy"] == pytest.approx(mean_se([0.5, 0.0, 1.0]))
    assert figures["mean@4"] == figures["accuracy"]
    assert figures["pass@2"][0] == pytest.approx((pass_at_k(4, 2, 2) + 0 + 1) / 3)
    assert figures["pass@4"][0] == pytest.approx(2 / 3)
    assert figures["truncated"][0] == pytest.approx(1 / 3) and figures["response_length"][0] == pytest.approx(
        19 / 3
    )
    assert set(s["by_source"]) == {"a", "b"} and s["by_source"]["b"]["accuracy"] == (1.0, 0.0)
    assert "by_source" not in summarize(samples[:8])  # one source: no breakdown


def test_a_prompt_cut_short_by_an_interruption_is_left_out():
    # prompts 0 and 2 whole (4 samples), prompt 1 cut after one sample: n stays 4 for the others
    samples = (
        [_sample(0, True) for _ in range(4)] + [_sample(1, False)] + [_sample(2, i < 1) for i in range(4)]
    )
    figures = summarize(samples)["all"]
    assert figures["n"] == 4 and figures["prompts"] == 2 and figures["samples"] == 8
    assert figures["accuracy"][0] == pytest.approx((1 + 0.25) / 2) and figures["pass@4"][0] == 1.0


@pytest.mark.parametrize(
    "args,expected",
    [
        (["eval", "some/model", "--data", "missing.jsonl", "--reward", "r.py"], "--data missing.jsonl: no such file"),
        (["eval", "some/model", "--data", "d.jsonl"], "no reward to score with"),
        (["eval", "some/model", "--reward", "r.py"], "no data to score"),
        (["eval", "some/model", "--data", "d.jsonl", "--reward", "nope.py"], "--reward nope.py: no such file"),
        (["eval", "some/model", "--data", "d.jsonl", "--reward", "r.py:scor"], "has no function 'scor'"),
        (["eval", "some/model", "--data", "d.jsonl", "--reward", "r.py", "--engine", "tgi"], "bad --engine"),
        (["eval", "some/model", "--data", "d.jsonl", "--reward", "r.py", "--out", "full"], "not an empty folder"),
        (["eval", "http://127.0.0.1:9/v1", "--data", "d.jsonl", "--reward", "r.py"], "cannot reach"),
        (["eval", "./no/such/folder", "--data", "d.jsonl", "--reward", "r.py"], "no/such/folder"),
        # checked before a model starts (they once failed after it, exit 1)
        (["eval", "some/model", "--data", "d.jsonl", "--reward", "raises.py"], "the reward fails on a row's own answer ('2')"),
        (["eval", "some/model", "--data", "null.jsonl", "--reward", "r.py"], "null.jsonl: row 0 (line 1): 'answer' is null"),
        (["eval", "some/model", "--data", "empty.jsonl", "--reward", "r.py"], "empty.jsonl holds no rows"),
        (["eval", "some/model", "--data", "d.jsonl", "--reward", "r.py", "--format-prompt", "bad.jinja"], "bad.jinja: line 1: not a valid Jinja template"),
        (["eval", "some/model", "--data", "d.jsonl", "--reward", "r.py", "--n", str(10**30)], "Invalid value for '--n'"),
        (["eval", "some/model", "--data", "d.jsonl", "--reward", "r.py", "--temperature", "inf"], "Invalid value for '--temperature'"),
    ],
)  # fmt: skip
def test_eval_bad_input_is_one_clear_line(cli, tmp_path, monkeypatch, args, expected):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("R1CLOUD_HOME", str(tmp_path / "home"))
    (tmp_path / "d.jsonl").write_text('{"prompt": "1+1", "answer": "2"}\n')
    (tmp_path / "null.jsonl").write_text('{"prompt": "1+1", "answer": null}\n')
    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "bad.jinja").write_text("{{ content ")
    (tmp_path / "r.py").write_text(
        "def score(reward_inputs):\n    return [{'overall': 1.0} for _ in reward_inputs]\n"
    )
    (tmp_path / "raises.py").write_text("def score(reward_inputs):\n    raise KeyError('answer')\n")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "kept.txt").write_text("mine")
    args = [f"{a}:score" if a in ("r.py", "raises.py") else a for a in args]
    r = cli(*args)
    assert r.exit_code == 2, r.stdout + r.stderr
    assert expected in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert (tmp_path / "full" / "kept.txt").read_text() == "mine"


def _spec(tmp_path, override: str):
    from r1cloud.validate import load_spec

    (tmp_path / "d.jsonl").write_text('{"question": "1+1", "answer": "2"}\n')
    (tmp_path / "r.py").write_text("def score(reward_inputs):\n    return []\n")
    (tmp_path / "bp.yaml").write_text(
        f"data: {{train_files: {tmp_path}/d.jsonl, val_files: {tmp_path}/d.jsonl, max_response_length: 32}}\n"
        f"worker:\n  actor: {{model: {{model_path: Qwen/Qwen2.5-0.5B-Instruct}}}}\n"
        f"  rollout: {{n: 4, seed: 3, val_override_config: {override}}}\n"
        f"  reward: {{reward_function: {tmp_path}/r.py:score}}\n"
    )
    return load_spec(tmp_path / "bp.yaml", check_files=False).spec  # eval's own checks, not validate's


def test_eval_samples_as_the_trainers_validation_does(tmp_path):
    """Every val_override_config key the trainer applies (seed, ignore_eos, max_tokens, vLLM's
    others as extras), the seed of rank 0 at step 0, then the command's options on top."""
    from r1cloud.evaluation.run import validation_sampling

    spec = _spec(tmp_path, "{seed: 5, ignore_eos: true, max_tokens: 7, min_p: 0.1, temperature: 0.5}")
    got = validation_sampling(spec, None, None, None)
    assert got == {"n": 1, "temperature": 0.5, "top_p": 1.0, "top_k": -1, "max_tokens": 7,
                   "seed": (5 + 1) * 1009, "ignore_eos": True, "extra": {"min_p": 0.1}}  # fmt: skip
    plain = validation_sampling(_spec(tmp_path, "{}"), 2, 1.0, 9)
    assert plain["seed"] == ((3 * 7919) * 2 + 1) * 1009 and (plain["n"], plain["max_tokens"]) == (2, 9)
    assert plain["extra"] == {} and plain["temperature"] == 1.0 and plain["ignore_eos"] is False


def test_an_endpoint_target_names_a_missing_column(tmp_path):
    from r1cloud.evaluation.run import _endpoint

    spec = _spec(tmp_path, "{}")  # its rows hold `question`, the spec reads `prompt`
    with pytest.raises(ValueError, match=r"no column 'prompt' \(its columns: question, answer\)"):
        _endpoint(spec, {"limit": None, "url": "http://127.0.0.1:9/v1", "served": "m"}, None)


def test_eval_sizes_the_engines_context_from_the_prompts_and_the_model(tmp_path):
    """An EasyR1 config's 2,048 + 2,048 tokens on a model of 1,024: vLLM gets what the model can
    take (it refused the blueprint's 4,096 at start-up), and never less than the prompts need."""
    import json
    from types import SimpleNamespace

    from r1cloud.evaluation.run import context_length

    (tmp_path / "config.json").write_text(json.dumps({"max_position_embeddings": 1024}))
    easyr1 = SimpleNamespace(max_model_len=None, prompt_length=2048, response_length=2048)
    assert context_length(str(tmp_path), easyr1, [30, 50], 8) == 1024
    assert context_length(str(tmp_path), easyr1, [1100], 8) == 1108  # the prompts' own need wins
    small = SimpleNamespace(max_model_len=None, prompt_length=64, response_length=32)
    assert context_length(str(tmp_path), small, [30], 8) == 96
    (tmp_path / "config.json").write_text(json.dumps({"text_config": {"max_position_embeddings": 512}}))
    assert context_length(str(tmp_path), easyr1, [30], 8) == 512  # a VLM's context is its text model's
    assert context_length(str(tmp_path / "missing"), easyr1, [30], 8) == 4096
