"""Math grading from a table of cases: r1cloud's `math_equal` (exact check, then math-verify) against
the right verdict, with EasyR1's grader (`mathruler.grader.grade_answer`) alongside — r1cloud must
agree with it where it is right and be right where it is not (the rows marked mathruler=False but
equal=True). The math reward and the multiple-choice reward are then checked end to end."""

import importlib.util

import pytest

from r1cloud.rewards.grading import math_equal
from spec_helpers import ROOT

# (given, ground truth, equal, mathruler's verdict)
CASES = [
    (r"\frac{1}{2}", "0.5", True, True),
    ("0.5", r"\frac{1}{2}", True, True),
    (r"\frac{1}{2}", ".5", True, True),
    (r"\dfrac{3}{4}", r"\frac34", True, True),
    (r"\dfrac{\sqrt{3}}{2}", r"\frac{\sqrt3}{2}", True, True),
    (r"\frac{2}{4}", r"\frac{1}{2}", True, False),  # mathruler wants unreduced fractions verbatim
    (r"\frac{12}{2}", "6", True, False),
    (r"2 \cdot 3", "6", True, False),
    ("5 cm", "5", True, True),
    (r"5\text{ cm}", "5", True, True),
    (r"10^\circ", "10", True, True),
    (r"50\%", "50", True, True),
    (r"\$5", "5", True, True),
    (r"(1, 2]", "(1,2]", True, True),
    (r"\left(1,2\right]", "(1,2]", True, True),
    (r"(-\infty, 3)", r"(-\infty,3)", True, True),
    (r"x \in [1,2]", "[1,2]", True, False),
    ("[1,2]", "(1,2]", False, False),
    (r"\{1, 2\}", r"\{2, 1\}", True, False),  # a set has no order
    (r"\{1,2,3\}", "1,2,3", True, True),
    ("(1,2)", "(2,1)", False, False),  # a point does
    ("x=3", "3", True, True),
    ("3", "x = 3", True, True),
    (r"x=3 \text{ or } x=-3", r"\pm 3", True, False),
    ("3, -3", "-3, 3", True, False),
    (r"2\sqrt{2}", r"\sqrt{8}", True, True),
    (r"\sqrt{2}/2", r"\frac{\sqrt{2}}{2}", True, True),
    ("x^2+2x+1", "(x+1)^2", True, True),
    ("1,000", "1000", True, True),
    ("1e3", "1000", True, True),
    ("6.0", "6", True, True),
    ("3/2", r"1\frac{1}{2}", True, True),
    (r"\text{A}", "A", True, True),
    ("2", "3", False, False),
    ("-1", "1", False, False),
    (r"\pi", "3.14", False, False),
    ("0.333", r"\frac{1}{3}", False, False),
    ("None", "0", False, False),
]


@pytest.mark.parametrize("given,truth,equal,mathruler", CASES)
def test_math_equal_against_the_table_and_mathruler(given, truth, equal, mathruler):
    assert math_equal(given, truth) is equal
    grader = pytest.importorskip("mathruler.grader")
    assert grader.grade_answer(given, truth) is mathruler  # the table's record of EasyR1's grader


def load(name: str):
    spec = importlib.util.spec_from_file_location(
        "custom_reward_fn", ROOT / "reward_functions" / f"{name}.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_math_reward_uses_the_equivalence_and_easyr1s_format():
    m = load("math")
    rows = [
        ("<think>half</think> so \\boxed{0.5}", r"\frac{1}{2}", 1.0, 1.0),
        ("<think>a set</think> \\boxed{\\{3, 1\\}}", r"\{1,3\}", 1.0, 1.0),
        ("< think >x</ think > \\boxed{x = 3}", "3", 1.0, 1.0),  # EasyR1 normalises "< think >"
        ("no thinking \\boxed{4}", "4", 0.0, 1.0),
        ("<think>wrong</think> \\boxed{5}", "4", 1.0, 0.0),
        ("<think>no box</think> 4", "4", 0.0, 0.0),
    ]
    out = m.compute_score(
        [{"response": r, "response_length": 1, "ground_truth": t} for r, t, _, _ in rows], format_weight=0.1
    )
    for (_, _, fmt, acc), score in zip(rows, out, strict=True):
        assert (score["format"], score["accuracy"]) == (fmt, acc)
        assert score["overall"] == pytest.approx(0.9 * acc + 0.1 * fmt)


@pytest.mark.parametrize(
    "response,truth,accuracy,fmt",
    [
        (r"so \boxed{B}", "B", 1.0, 1.0),
        (r"\boxed{(C)}", "(C)", 1.0, 1.0),
        (r"\boxed{\text{B}}", "B", 1.0, 1.0),
        ("<think>…</think><answer>D</answer>", "D. 12 apples", 1.0, 1.0),
        ("The answer is (A).", "A", 1.0, 1.0),
        ("Answer: c", "C", 1.0, 1.0),
        ("(B)", "B", 1.0, 1.0),
        ("The answer is (A).", "B", 0.0, 1.0),
        ("I am not sure", "A", 0.0, 0.0),
        ("B", "B", 1.0, 1.0),  # the VL quickstart's one-letter answers
        ("B.", "B", 1.0, 1.0),
        ("A", "B", 0.0, 1.0),
        ("The", "B", 0.0, 0.0),
        ("", "B", 0.0, 0.0),
    ],
)
def test_choice_reward(response, truth, accuracy, fmt):
    [score] = load("choice").compute_score(
        [{"response": response, "response_length": 1, "ground_truth": truth}]
    )
    assert (score["accuracy"], score["format"]) == (accuracy, fmt)


def test_the_fast_verdicts_are_math_verifys_on_the_benchmark_and_the_tables():
    """`settled` answers without parsing LaTeX; where it answers, math-verify (parsing both) must
    answer the same: on every distinct (answer, truth) of benchmarks/rewards.py's 2,000 responses,
    the table above, the reward tests' answers, and cases chosen to sit on its rules' edges."""
    pytest.importorskip("math_verify")
    from r1cloud.rewards.grading import extract_boxed, settled, verified

    bench = load_benchmark()
    pairs = {(extract_boxed(r["response"]), r["ground_truth"]) for r in bench.make(2000)}
    pairs |= {(g, t) for g, t, _, _ in CASES} | {(t, g) for g, t, _, _ in CASES}
    pairs |= {
        ("0.333333", r"\frac{1}{3}"),  # rounded to 6 places: equal for math-verify
        ("0.3333", r"\frac{1}{3}"),
        ("0.1234565", "0.1234574"),  # 9e-7 apart, the same 6 places
        ("0.1234565", "0.1234555"),
        ("2.5", r"\frac{5}{2}"),
        ("2.50001", r"\frac{5}{2}"),
        ("-7", "7"),
        (r"-\frac{1}{2}", r"\frac{-1}{2}"),
        ("007", "7"),
        (r"\{1,2,2\}", r"\{2,1\}"),
        (r"\{1,2\}", r"\{1,2,3\}"),
        (r"\left\{ 3, \frac{1}{2} \right\}", r"\{\frac{1}{2},3\}"),
        (r"\{0.5, 1\}", r"\{\frac{1}{2}, 1\}"),  # a decimal in a set: left to math-verify
        (r"\sqrt{12}", r"2\sqrt{3}"),
        (r"\sqrt{12}", r"3\sqrt{2}"),
        (r"-2\sqrt{3}", r"2\sqrt{3}"),
        (r"\sqrt4", "2"),
        (r"\sqrt{50}", r"5\sqrt2"),
        (r"\sqrt{0}", "0"),
        (r"0\sqrt{2}", "0"),  # zero times a surd: math-verify says equal
        (r"0\sqrt{2}", r"0\sqrt{3}"),
        ("1" * 5000, "2"),  # too long for int(): left to math-verify
        (r"3\sqrt{2}", "4"),
        (r"50\%", "0.5"),
        ("1,000", "1000"),
        (r"\$5", "5"),
    }
    checked = 0
    for given, truth in sorted(pairs):
        verdict = settled(given, truth)
        if verdict is not None:
            assert verdict is verified(given, truth), (given, truth, verdict)
            checked += 1
    assert checked > 150  # most of the benchmark's wrong answers, sets and surds are settled
    assert settled("1" * 5000, "2") is None and settled(r"0\sqrt{2}", "0") is None


def load_benchmark():
    spec = importlib.util.spec_from_file_location("rewards_bench", ROOT / "benchmarks" / "rewards.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
