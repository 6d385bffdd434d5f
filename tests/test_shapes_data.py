"""data/shapes/generate.py: the picture questions the VL quickstart and the tests train on, the blind
ceiling it prints, and the shipped rows it must reproduce."""

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def gen():
    spec = importlib.util.spec_from_file_location("shapes_generate", ROOT / "data/shapes/generate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_colour_choice_names_the_drawn_colour_by_letter_over_the_count_pictures(gen, tmp_path):
    from PIL import Image

    gen.write(tmp_path / "a", train=12, test=6, question="count")
    gen.write(tmp_path / "b", train=12, test=6, question="colour_choice")
    for split in ("train", "test"):
        counted = rows(tmp_path / "a" / f"{split}.jsonl")
        chosen = rows(tmp_path / "b" / f"colour_choice_{split}.jsonl")
        assert [r["images"] for r in counted] == [r["images"] for r in chosen]
        for row in chosen:
            assert row["problem"] == "<image>What colour are the shapes?\nA. red\nB. green\nC. blue"
            colours = Image.open(tmp_path / "b" / row["images"][0]).convert("RGB").getcolors()
            drawn = {c for _, c in colours if c != (255, 255, 255)}
            assert drawn == {gen.COLOURS[gen.CHOICES["ABC".index(row["answer"])]]}
            picture = row["images"][0]  # the same file, whichever question was asked about it
            assert (tmp_path / "a" / picture).read_bytes() == (tmp_path / "b" / picture).read_bytes()


def test_blind_ceiling_is_the_most_frequent_answers_share(gen, tmp_path):
    f = tmp_path / "rows.jsonl"
    f.write_text("".join(json.dumps({"answer": a}) + "\n" for a in ["A", "C", "C", "B", "C"]))
    assert gen.blind_ceiling(f) == (0.6, "C")


def test_the_shipped_rows_are_what_generate_writes(gen, tmp_path):
    """data/shapes ships generate.py's output for both questions (its docstring's command)."""
    for question in ("count", "colour_choice"):
        out = gen.write(tmp_path, train=1024, test=64, size=96, question=question)
        prefix = "" if question == "count" else f"{question}_"
        for split in ("train", "test"):
            name = f"{prefix}{split}.jsonl"
            assert (out / name).read_text() == (ROOT / "data/shapes" / name).read_text(), name
    assert gen.blind_ceiling(ROOT / "data/shapes/colour_choice_test.jsonl") == (23 / 64, "C")
