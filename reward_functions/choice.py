"""Multiple-choice reward (EasyR1 interface): the chosen letter against the ground truth's.

The letter is read from the last \\boxed{}, else the <answer>…</answer> tag, else the last
"answer is (X)" / "Answer: X" phrase, else a response that is only a letter ("(B)", "B."). The
ground truth may be "B", "(B)" or "B. some text". overall = (1 - w)·accuracy + w·format, where the
format is met when a letter could be read at all."""

import re

from r1cloud.rewards.grading import extract_boxed

REWARD_NAME = "choice"
REWARD_TYPE = "batch"

_LETTER = r"\(?\s*([A-Z])\s*\)?"
_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_PHRASE = re.compile(rf"(?:answer\s*is|answer\s*:)\s*(?:option\s*)?{_LETTER}(?![A-Za-z])", re.IGNORECASE)
_ALONE = re.compile(rf"^\s*{_LETTER}\s*[.:)]?\s*$")
_LEADING = re.compile(rf"^\s*(?:\\text\{{)?{_LETTER}(?:\}})?(?:[.:)\s]|$)")


def letter_of(text: str) -> str | None:
    boxed = extract_boxed(text)
    for candidate in (boxed, *(_TAG.findall(text)[-1:])):
        if candidate is not None:
            m = _LEADING.match(candidate.strip())
            return m.group(1).upper() if m else None
    phrases = _PHRASE.findall(text)
    if phrases:
        return phrases[-1].upper()
    m = _ALONE.match(text)
    return m.group(1).upper() if m else None


def compute_score(reward_inputs: list[dict], format_weight: float = 0.1) -> list[dict[str, float]]:
    scores = []
    for item in reward_inputs:
        given = letter_of(item["response"])
        truth = _LEADING.match(str(item["ground_truth"]).strip())
        acc = 1.0 if given is not None and truth is not None and given == truth.group(1).upper() else 0.0
        fmt = 1.0 if given is not None else 0.0
        scores.append(
            {"overall": (1 - format_weight) * acc + format_weight * fmt, "format": fmt, "accuracy": acc}
        )
    return scores
