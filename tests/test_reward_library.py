"""The bundled reward functions load through EasyR1's loader mechanics and score simple cases.
(Their full grading — math-verify equivalence — is the rewards issue.)"""

import importlib.util
from pathlib import Path

import pytest

from r1cloud.rewards.grading import answers_equal, extract_boxed
from spec_helpers import ROOT

FILES = sorted((ROOT / "reward_functions").glob("*.py"))


def load(path: Path):
    spec = importlib.util.spec_from_file_location("custom_reward_fn", path)  # as EasyR1 does
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_reward_module_has_easyr1_metadata(path):
    m = load(path)
    assert m.REWARD_TYPE in ("batch", "sequential")
    assert callable(m.compute_score)


def test_math_reward():
    m = load(ROOT / "reward_functions/math.py")
    out = m.compute_score(
        [
            {"response": "<think>2+2</think> so \\boxed{4}", "response_length": 9, "ground_truth": "4"},
            {
                "response": "the answer is \\boxed{\\dfrac{1}{2}}",
                "response_length": 9,
                "ground_truth": "\\frac{1}{2}",
            },
            {"response": "\\boxed{5}", "response_length": 3, "ground_truth": "4"},
        ],
        format_weight=0.1,
    )
    assert [o["accuracy"] for o in out] == [1.0, 1.0, 0.0]
    assert out[0]["format"] == 1.0 and out[0]["overall"] == pytest.approx(1.0)
    assert out[1]["overall"] == pytest.approx(0.9)


def test_r1v_and_count_rewards():
    r1v = load(ROOT / "reward_functions/r1v.py")
    s = r1v.compute_score(
        {"response": "<think>x</think><answer>12</answer>", "response_length": 5, "ground_truth": "12"}
    )
    assert s == {"overall": 1.0, "format": 1.0, "accuracy": 1.0}
    count = load(ROOT / "reward_functions/count.py")
    s = count.compute_score(
        {
            "response": "<think>I see 3</think> <answer>3</answer>",
            "response_length": 5,
            "ground_truth": "<answer> 3 </answer>",
        }
    )
    assert s["accuracy"] == 1.0 and s["format"] == 1.0
    assert (
        count.compute_score({"response": "<answer>4</answer>", "response_length": 2, "ground_truth": "3"})[
            "accuracy"
        ]
        == 0.0
    )


def test_dapo_reward_and_overlong_penalty():
    dapo = load(ROOT / "reward_functions/dapo.py")
    kw = {"max_response_length": 100, "overlong_buffer_length": 20, "overlong_penalty_factor": 1.0}
    out = dapo.compute_score(
        [
            {"response": "work\nAnswer: 42", "response_length": 50, "ground_truth": "42"},
            {"response": "Answer: 41", "response_length": 90, "ground_truth": "42"},
            {"response": "Answer: 42", "response_length": 120, "ground_truth": "42"},
        ],
        **kw,
    )
    assert [o["accuracy"] for o in out] == [1.0, -1.0, 1.0]
    assert [o["overlong"] for o in out] == [0.0, -0.5, -1.0]
    assert [o["overall"] for o in out] == [1.0, -1.5, 0.0]
    assert out[0]["accuracy_normalized"] == 1.0 and out[1]["accuracy_normalized"] == 0.0


@pytest.mark.parametrize(
    "given,truth,equal",
    [
        ("4", "4", True),
        ("x = 3", "3", True),
        ("0.5", "\\frac{1}{2}", True),
        ("1,000", "1000", True),
        ("\\text{5}", "5", True),
        ("5", "6", False),
        (None, "1", False),
    ],
)
def test_grading(given, truth, equal):
    assert answers_equal(given, truth) is equal


def test_extract_boxed_matches_braces_and_takes_the_last():
    assert extract_boxed("\\boxed{1} then \\boxed{\\frac{a}{b}}") == "\\frac{a}{b}"
    assert extract_boxed("no box") is None
    assert extract_boxed("\\boxed{unclosed") is None


def test_keyword_reward_scores_the_first_option_named():
    m = load(ROOT / "reward_functions/keyword.py")
    options = ["red", "green", "blue"]

    def score(response, truth="red"):
        return m.compute_score([{"response": response, "ground_truth": truth}], options=options)[0]["overall"]

    assert score("Red.") == 1.0 and score("The shapes are red") == 1.0
    assert score("blue") == 0.0 and score("blue or red") == 0.0  # hedging: the first one counts
    assert score("reddish") == 0.0 and score("") == 0.0  # whole words only
    assert m.compute_score([{"response": "Paris", "ground_truth": "paris"}])[0]["overall"] == 1.0
