"""Checkpoint publication and retention, on the files alone."""

import json
from pathlib import Path

import pytest

from r1cloud.checkpoint.write import Checkpoints


def save(ck: Checkpoints, step: int, val=None):
    staging = Path(ck.begin(step))
    (staging / "actor").mkdir()
    (staging / "actor" / "__0_0.distcp").write_bytes(b"x" * 10)
    return ck.publish(staging, step, {"step": step}, val)


def test_only_published_checkpoints_count(tmp_path):
    ck = Checkpoints(tmp_path)
    assert ck.latest() is None
    save(ck, 1)
    half = Path(ck.begin(2))  # a save that died before publishing
    (half / "actor").mkdir()
    assert ck.latest()[0] == 1 and ck.complete_steps() == [1]
    (tmp_path / "global_step_3").mkdir()  # a folder without its state file is not complete
    assert ck.latest()[0] == 1
    save(ck, 2)
    assert ck.latest()[0] == 2 and not list(tmp_path.glob(".global_step_2.tmp*"))
    tracker = json.loads((tmp_path / "checkpoint_tracker.json").read_text())
    assert tracker["last_global_step"] == 2 and tracker["last_actor_path"].endswith("global_step_2/actor")


def test_a_tracker_pointing_at_a_missing_step_falls_back(tmp_path):
    ck = Checkpoints(tmp_path)
    save(ck, 1)
    save(ck, 2)
    (tmp_path / "global_step_2" / "trainer_state.json").unlink()
    assert ck.latest()[0] == 1


def test_prune_keeps_the_newest_and_the_best(tmp_path):
    ck = Checkpoints(tmp_path)
    for step, val in [(1, 0.1), (2, 0.9), (3, 0.2), (4, 0.3), (5, None)]:
        save(ck, step, val)
        ck.prune(2)
    assert ck.complete_steps() == [2, 5]  # best (0.9 at step 2) and newest
    assert json.loads((tmp_path / "checkpoint_tracker.json").read_text())["best_global_step"] == 2
    ck.prune(-1)
    assert ck.complete_steps() == [2, 5]


@pytest.mark.parametrize("name", ["~", "a::b"])
def test_a_folder_named_like_a_url_is_listed_where_it_is_written(tmp_path, monkeypatch, name):
    """The folder is read as a path, not a URL: fsspec would expand a leading `~` to $HOME and
    split a path at `::`, listing another folder than the one the checkpoints went to."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    ck = Checkpoints(f"{name}/ckpts")
    for step, val in [(1, 0.9), (2, 0.1), (3, 0.2)]:
        save(ck, step, val)
        ck.prune(1)
    assert ck.complete_steps() == [1, 3] and ck.latest() == (3, f"{name}/ckpts/global_step_3")
    assert ck.tracker()["best_global_step"] == 1 and not (tmp_path / "home").exists()


@pytest.mark.parametrize(
    "text,said",
    [
        (None, "is missing: not a complete checkpoint"),
        ("{cut", "is damaged (Expecting"),
        ("[" * 50_000 + "]" * 50_000, "is damaged (nested too deeply)"),
        ('{"step": ' + "9" * 5000 + "}", "is damaged (a number of more than 4,300 digits)"),
        ("[1, 2]", "is not a trainer state r1cloud wrote"),
        ('{"step": 3, "loader": {"epoch": 0, "position": "x"}}', "is not a trainer state r1cloud wrote"),
        ('{"step": 3, "loader": {"epoch": 0, "position": 1}, "scheduler": [1]}', "is not a trainer state"),
        ('{"step": 3, "loader": {"epoch": 0, "position": 1}, "kl_coef": 1e400}', "is not a trainer state"),
    ],
)
def test_a_damaged_trainer_state_stops_a_resume_in_one_line(tmp_path, text, said):
    from r1cloud.checkpoint.write import DamagedCheckpoint, read_state

    if text is not None:
        (tmp_path / "trainer_state.json").write_text(text)
    with pytest.raises(DamagedCheckpoint, match="resume from another checkpoint") as caught:
        read_state(str(tmp_path))
    assert said in str(caught.value) and str(tmp_path) in str(caught.value)
    (tmp_path / "trainer_state.json").write_text(
        '{"step": 3, "loader": {"epoch": 1, "position": 2}, "scheduler": null}'
    )
    assert read_state(str(tmp_path))["step"] == 3
