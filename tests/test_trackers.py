"""The trackers around a resume, through their own readers (the whole runs are in trainer/test_runs.py)."""

import pytest

from r1cloud.trainer.trackers import Trackers
from r1cloud.validate import load_spec


def test_tensorboard_forgets_the_steps_a_resumed_run_redoes(blueprint, tmp_path):
    """Steps 1-3 logged, the checkpoint at step 2: the resumed attempt redoes step 3 (other
    numbers) and goes on to 4. TensorBoard's reader sees each step once, the redone one's value."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    spec = load_spec(blueprint(), ["trainer.logger=['tensorboard']"]).spec
    run = tmp_path / "run"
    run.mkdir()
    first = Trackers(spec, run, print)
    first.start()
    for step in (1, 2, 3):
        first.record(step, {"reward/overall": step / 10})
    first.close("KILLED")

    again = Trackers(spec, run, print)
    again.start()
    again.resumed(2)
    for step in (3, 4):
        again.record(step, {"reward/overall": step})
    again.close()

    acc = EventAccumulator(str(run / "tensorboard"))
    acc.Reload()
    got = [(e.step, e.value) for e in acc.Scalars("reward/overall")]
    assert [s for s, _ in got] == [1, 2, 3, 4]
    assert [v for _, v in got] == pytest.approx([0.1, 0.2, 3.0, 4.0])


def test_console_samples_show_the_question_not_the_chat_template():
    """The log's sample lines cut what every prompt shares (system turn, role headers) to '…';
    a prompt with nothing to compare with keeps its end; none is ever cut to nothing."""
    from r1cloud.trainer.trackers import unframed

    system = "system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face\nuser\n"
    questions = [
        "What is 16 - 13? Give only the final number.",
        "What is 14 + 20? Give only the final number.",
    ]
    prompts = [f"{system}{q}\nassistant\n" for q in questions]
    assert unframed(prompts) == [f"…{q}…" for q in questions]
    assert unframed(prompts[:1]) == ["…" + prompts[0][-120:]]
    assert unframed([prompts[0], prompts[0]]) == ["…" + prompts[0][-120:]] * 2  # the same prompt twice
    assert unframed(["7 + 5", "3 - 1"]) == ["7 + 5", "3 - 1"]  # no shared line: as they are
