"""`r1cloud try`: prompts rendered from the data, the dataset's own answers and corrupted ones
scored by the reward function, through the real CLI on the tiny model's tokenizer."""

import json

from tinyrun import ROOT, r1, tiny_blueprint


def test_try_scores_own_and_corrupted_answers(tmp_path, tiny_model, digits_reward):
    bp = tmp_path / "bp.yaml"
    bp.write_text(tiny_blueprint(tiny_model, digits_reward))
    math = [
        f"worker.reward.reward_function={ROOT}/reward_functions/math.py:compute_score",
        "worker.reward.reward_function_kwargs={format_weight: 0.5, require_think: false}",
    ]
    r = r1("try", bp, *math, "--n", "6")
    assert r.returncode == 0, r.stderr
    assert "What is 19 - 5?" in r.stdout and "Give only the final number" in r.stdout  # the format prompt
    assert "answers written as 'boxed' score 1.000" in r.stdout
    assert "✓ the reward tells" in r.stdout and "warning" not in r.stderr
    r = r1("try", bp, *math, "--n", "6", "--json")
    data = json.loads(r.stdout)
    assert len(data["rows"]) == 6 and all(
        row["own"] == 1.0 and row["corrupted"] == 0.5 for row in data["rows"]
    )
    assert all(row["prompt_tokens"] > 0 for row in data["rows"])
    # The digit-share reward gives wrong numbers as much as right ones: try says so.
    r = r1("try", bp, "--n", "6")
    assert r.returncode == 0 and "does not score the right answers above wrong ones" in r.stderr
    # Prompts over max_prompt_length are counted.
    r = r1("try", bp, *math, "--n", "6", "data.max_prompt_length=8")
    assert "6 of 6 over max_prompt_length 8" in r.stdout and "would be dropped" in r.stderr
    r = r1("try", bp, *math, "--n", "6", "data.max_prompt_length=8", "data.filter_overlong_prompts=false")
    assert "would be truncated" in r.stderr


def test_try_bad_column_is_one_clear_line(tmp_path, tiny_model, digits_reward):
    bp = tmp_path / "bp.yaml"
    bp.write_text(tiny_blueprint(tiny_model, digits_reward))
    r = r1("try", bp, "data.answer_key=solution")
    assert r.returncode == 2 and "no column 'solution'" in r.stderr and "answer, problem" in r.stderr
    assert "Traceback" not in r.stderr


def test_a_reward_that_fails_everywhere_or_hangs_ends_try_in_exit_2(tmp_path, tiny_model, digits_reward):
    """A reward that raises on every sample, or returns a non-number, is exit 2 naming why; one that
    never returns ends `try` at one deadline for the whole check (2 × worker.reward.timeout + 10 s),
    not after the timeout of every sample."""
    import time

    bp = tmp_path / "bp.yaml"
    bp.write_text(tiny_blueprint(tiny_model, digits_reward))
    bodies = {
        "raises.py": ("def compute_score(reward_inputs):\n    raise KeyError('ground_truth')\n",
                      "failed on every sample (36)", "KeyError"),
        "text.py": ("def compute_score(reward_inputs):\n    return [{'overall': 'high'} for _ in reward_inputs]\n",
                    "failed on every sample (36)", "a non-finite or non-numeric score"),
        "hangs.py": ("import time\ndef compute_score(reward_inputs):\n    time.sleep(600)\n",
                     "the reward function did not finish in time", "worker.reward.timeout, 1 s a sample"),
    }  # fmt: skip
    for name, (body, said, why) in bodies.items():
        (tmp_path / name).write_text(body)
        tick = time.monotonic()
        r = r1("try", bp, f"worker.reward.reward_function={tmp_path / name}:compute_score",
               "worker.reward.timeout=1", "--n", "6")  # fmt: skip
        assert r.returncode == 2 and said in r.stderr and why in r.stderr, (name, r.stderr[-2000:])
        assert "Traceback" not in r.stderr and time.monotonic() - tick < 60, name


def test_try_plays_episodes_of_an_environment_with_the_base_model(tmp_path, tiny_model, digits_reward):
    bp = tmp_path / "bp.yaml"
    bp.write_text(tiny_blueprint(tiny_model, digits_reward))
    data = tmp_path / "count.jsonl"
    data.write_text(
        "".join(json.dumps({"problem": "Go.", "answer": "", "target": t}) + "\n" for t in (0, 2, 5, 0))
    )
    env = [
        "worker.rollout.multi_turn.enable=true",
        f"worker.rollout.multi_turn.environment={ROOT}/envs/counter.py:Counter",
        "worker.reward.reward_function=null",  # the environment's get_reward() alone
        f"data.train_files={data}",
        "data.format_prompt=null",
        "data.max_prompt_length=160",
    ]
    r = r1("try", bp, *env, "--episodes", "2", "--json")
    assert r.returncode == 0, r.stderr
    played = json.loads(r.stdout)["episodes"]
    assert len(played) == 2 and [e["scores"]["environment"] for e in played] == [1.0, 0.0]  # 0 needs no call
    assert played[0]["prompt"].endswith(
        "Go. Use the tool to bring the counter from 0 to 0.<|im_end|>\n<|im_start|>assistant\n"
    )
    r = r1("try", bp, *env)  # two by default, printed
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("episode ") == 2 and "reward: environment 1.000, overall 1.000" in r.stdout
    assert "turns 1, tool calls 0 (0 failed)" in r.stdout
    # a row the environment's reset cannot take: one line naming it, exit 2
    data.write_text(
        "".join(json.dumps({"problem": "Go.", "answer": "", "target": t}) + "\n" for t in ("1", "many") * 2)
    )
    r = r1("try", bp, *env)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert f"reset failed on {data}: row 1: ValueError: invalid literal for int()" in r.stderr
    r = r1("try", bp, "--episodes", "2")
    assert r.returncode == 2 and "--episodes is for multi-turn runs" in r.stderr
