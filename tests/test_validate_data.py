"""`validate` reads what a run would stop at after the GPUs are rented: the local data's rows and
images, the model folder's config, a train set smaller than one batch, and the format prompt
rendered over a real row in Jinja's sandbox — each one line naming the file, row or template line,
exit 2. Property-based: whatever rows a JSON-lines file holds, validate ends in exit 0 or 2, and a
file it accepts is one the trainer's data loader (🤗 datasets) reads, every prompt text."""

import json
import os
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spec_helpers import ROOT

ROW = {"problem": "What is 1 + 1?", "answer": "2"}


def _blueprint(tmp_path: Path, data: str | None = None, *extra: str) -> Path:
    """The quickstart, with its train data replaced by `data` (a file or folder under tmp_path)."""
    text = (ROOT / "blueprints" / "quickstart.yaml").read_text().replace("../", f"{ROOT}/")
    path = tmp_path / "q.yaml"
    path.write_text(text)
    return path


def _jsonl(tmp_path, rows, name="train.jsonl") -> Path:
    path = tmp_path / name
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def _png(path: Path) -> Path:
    from PIL import Image

    Image.new("RGB", (8, 8), "red").save(path)
    return path


def _parquet_garbage(tmp_path):
    (tmp_path / "train.parquet").write_bytes(b"PAR1 not really a parquet file")
    return tmp_path / "train.parquet"


def _folder(tmp_path, files):
    (tmp_path / "d").mkdir()
    for name, text in files.items():
        (tmp_path / "d" / name).write_text(text)
    return tmp_path / "d"


CASES = {
    "empty": (lambda t: _jsonl(t, []), "train.jsonl holds no rows"),
    "no-prompt": (lambda t: _jsonl(t, [{"question": "x", "answer": "1"}]),
                  "train.jsonl: row 0 (line 1) has no column 'problem' (its columns: answer, question); set data.prompt_key"),
    "no-answer": (lambda t: _jsonl(t, [ROW, {"problem": "x"}]), "row 1 (line 2) has no column 'answer'"),
    "prompt-number": (lambda t: _jsonl(t, [{"problem": 5, "answer": "1"}]), "'problem' is a number, not text"),
    "prompt-null": (lambda t: _jsonl(t, [{"problem": None, "answer": "1"}]), "'problem' is null, not text"),
    "answer-null": (lambda t: _jsonl(t, [{"problem": "x", "answer": None}]), "'answer' is null: the ground truth"),
    "answer-list": (lambda t: _jsonl(t, [{"problem": "x", "answer": [1]}]), "'answer' is a list: the ground truth"),
    "mixed-types": (lambda t: _jsonl(t, [ROW, {"problem": "x", "answer": 3}]),
                    "row 1 (line 2): 'answer' is a number, and text in row 0 (line 1): a column holds one type"),
    "not-json": (lambda t: _jsonl(t, [ROW, ROW, "{oops"]), "train.jsonl: line 3 is not JSON"),
    "not-a-row": (lambda t: _jsonl(t, [ROW, "[1, 2]"]), "line 2 holds a JSON list, not a row"),
    "deep": (lambda t: _jsonl(t, ['{"problem": ' + "[" * 100000 + "]" * 100000 + "}"]), "line 1 is nested too deeply"),
    "deep-array": (lambda t: _jsonl(t, ["[" * 100000 + "]" * 100000]), "train.jsonl is nested too deeply"),
    "blank-lines": (lambda t: _jsonl(t, ["", ROW, ""]), "holds 1 rows, fewer than one rollout batch"),
    "garbage-parquet": (_parquet_garbage, "train.parquet is not a parquet file"),
    "empty-folder": (lambda t: _folder(t, {}), "no data files (.jsonl, .json, .parquet"),
    "unknown-extension": (lambda t: _folder(t, {"rows.xyz": "a"}) / "rows.xyz", ".xyz is not a data file type"),
    "not-utf8": (lambda t: (t / "train.jsonl").write_bytes(b'{"problem": "\xff"}\n') and t / "train.jsonl", "is not UTF-8"),
    "missing-image": (lambda t: _jsonl(t, [{**ROW, "problem": "<image>x", "images": ["nope.png"]}]),
                      "row 0 (line 1): image 'nope.png' not found (relative paths are joined with the working directory"),
    "not-an-image": (lambda t: (t / "a.png").write_text("text") and _jsonl(t, [{**ROW, "problem": "<image>x", "images": [str(t / "a.png")]}]),
                     "is not an image PIL can read"),
    "too-few-rows": (lambda t: _jsonl(t, [ROW] * 7), "holds 7 rows, fewer than one rollout batch (data.rollout_batch_size 8)"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(CASES))
def test_bad_data_is_one_line_naming_the_file_and_row(cli, tmp_path, monkeypatch, case):
    monkeypatch.chdir(tmp_path)
    make, said = CASES[case]
    data = make(tmp_path)
    bp = _blueprint(tmp_path)
    r = cli("validate", bp, f"data.train_files={data}")
    assert r.exit_code == 2 and said in r.stderr, r.stderr
    assert "data.train_files" in r.stderr and all(len(x) < 400 for x in r.stderr.splitlines())


def test_good_data_in_every_format_passes_and_counts_its_rows(cli, tmp_path, monkeypatch):
    import pyarrow as pa
    import pyarrow.parquet as pq

    monkeypatch.chdir(tmp_path)
    rows = [{"problem": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(20)]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "train.parquet")
    (tmp_path / "train.csv").write_text("problem,answer\n" + "".join(f"q{i},{i}\n" for i in range(20)))
    (tmp_path / "train.json").write_text(json.dumps(rows))
    image = _png(tmp_path / "red.png")
    _jsonl(
        tmp_path,
        [{**r, "problem": "<image>" + r["problem"], "images": [image.name]} for r in rows],
        "vl.jsonl",
    )
    for data in ("train.parquet", "train.csv", "train.json"):
        r = cli(
            "validate", _blueprint(tmp_path), f"data.train_files={tmp_path / data}", "trainer.max_steps=null"
        )
        assert r.exit_code == 0, (data, r.stderr)
        if data != "train.json":  # a JSON array is counted when it loads
            assert "1 epochs × (20 rows ÷ 8)" in r.stdout or "(20 rows ÷ 8)" in r.stdout, r.stdout
    config = {"architectures": ["LlamaForCausalLM"], "max_position_embeddings": 2048}
    for name, extra in (("text", {}), ("vlm", {"model_type": "qwen2_vl", "vision_config": {}})):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps({**config, **extra}))
    vl = [f"data.train_files={tmp_path / 'vl.jsonl'}", f"data.image_dir={tmp_path}"]
    r = cli("validate", _blueprint(tmp_path), *vl, f"worker.actor.model.model_path={tmp_path / 'text'}")
    assert r.exit_code == 2 and "vl.jsonl: row 0 has images, and the model is text-only" in r.stderr, r.stderr
    r = cli("validate", _blueprint(tmp_path), *vl, f"worker.actor.model.model_path={tmp_path / 'vlm'}")
    assert "data.train_files" not in r.stderr, r.stderr  # its images found and read
    two = {**rows[3], "problem": "<image><image>" + rows[3]["problem"], "images": [image.name] * 2}
    _jsonl(tmp_path, [{**r, "problem": "<image>" + r["problem"], "images": [image.name]} for r in rows[:3]] + [two], "vl2.jsonl")  # fmt: skip
    vl2 = [
        f"data.train_files={tmp_path / 'vl2.jsonl'}",
        f"data.image_dir={tmp_path}",
        "data.rollout_batch_size=4",
    ]
    vlm = f"worker.actor.model.model_path={tmp_path / 'vlm'}"
    r = cli("validate", _blueprint(tmp_path), *vl2, vlm, "worker.rollout.limit_images=1")
    assert (
        r.exit_code == 2
        and (
            "vl2.jsonl: row 3 has 2 images, more than worker.rollout.limit_images (1): raise it, or 0 for the engine"
        )
        in r.stderr
    ), r.stderr
    r = cli("validate", _blueprint(tmp_path), *vl2, vlm, "worker.rollout.limit_images=2")
    assert "data.train_files" not in r.stderr, r.stderr


@pytest.mark.parametrize(
    "make,said",
    [
        (lambda t: (t / "model.bin").write_text("x") and t / "model.bin", "is a file: give the model's folder"),
        (lambda t: (t / "m").mkdir() or t / "m", "has no config.json: give a Hugging Face model folder"),
        (lambda t: _model(t, {"max_position_embeddings": 64}), "(160) is more than the model's context (64 tokens"),
        (lambda t: _model(t, {"text_config": {"max_position_embeddings": 100}}), "more than the model's context (100 tokens"),
        (lambda t: _model(t, {}, "worker.actor.model.freeze_language_model=true"), "is text-only (no vision_config)"),
        (lambda t: (t / "m").mkdir() or (t / "m" / "config.json").write_text("[1]") and t / "m", "config.json cannot be read as a JSON object"),
        # Qwen3.5 (EasyR1 #657): Gated DeltaNet layers would carry state across packed sequences
        (lambda t: _model(t, {"model_type": "qwen3_5", "vision_config": {}, "text_config": {"layer_types": ["linear_attention", "full_attention"]}}),
         "qwen3_5 is not supported yet: its linear_attention layers carry a state along the sequence"),
        (lambda t: _model(t, {"model_type": "internvl", "vision_config": {}}),
         "internvl is not supported yet: r1cloud packs and tests the pictures of qwen2_vl, qwen2_5_vl, qwen3_vl, idefics3"),
        (lambda t: _model(t, {"num_attention_heads": 7}, "worker.actor.ulysses_size=2"),
         "worker.actor.ulysses_size: 2 does not divide the model's 7 attention heads"),
    ],
    ids=["file", "no-config", "context", "vlm-context", "freeze-text", "config-list", "qwen3.5", "internvl", "ulysses-heads"],
)  # fmt: skip
def test_a_model_folder_that_cannot_run_is_one_line(cli, tmp_path, monkeypatch, make, said):
    monkeypatch.chdir(tmp_path)
    made = make(tmp_path)
    path, extra = made if isinstance(made, tuple) else (made, [])
    r = cli("validate", _blueprint(tmp_path), f"worker.actor.model.model_path={path}", *extra)
    assert r.exit_code == 2 and said in r.stderr, r.stderr


def _model(tmp_path, config, *extra):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], **config}))
    return tmp_path / "m", list(extra)


TEMPLATES = {
    "divide": ("Q: {{ content }}\n{{ 1/0 }}", "line 2): ZeroDivisionError: division by zero"),
    "include": ('{% include "other.jinja" %}{{ content }}', "no loader for this environment"),
    "filter": ("{{ content | shout }}", "line 1: not a valid Jinja template: No filter named 'shout'"),
    "recursion": ("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}{{ content }}", "recurses without end"),
    "huge-range": ("{% for i in range(10**9) %}{% endfor %}{{ content }}", "Range too big"),
    "sandbox": ("{{ content.__class__.__mro__ }}", "SecurityError: access to attribute '__class__'"),
    "size": (
        '{% for i in range(99999) %}{{ "x" * 100 }}{% endfor %}{{ content }}',
        "renders more than 1,000,000",
    ),
    "syntax": ("{{ content ", "not a valid Jinja template"),
    "row-type": ("{{ content + 1 }}", "TypeError: can only concatenate str"),  # fails only on a real row
}


@pytest.mark.parametrize("case", list(TEMPLATES))
def test_a_format_prompt_that_fails_to_render_is_one_line_naming_its_line(cli, tmp_path, monkeypatch, case):
    monkeypatch.chdir(tmp_path)
    text, said = TEMPLATES[case]
    (tmp_path / "t.jinja").write_text(text)
    tick = time.monotonic()
    r = cli("validate", _blueprint(tmp_path), f"data.format_prompt={tmp_path / 't.jinja'}")
    assert r.exit_code == 2 and "data.format_prompt" in r.stderr and said in r.stderr, r.stderr
    assert time.monotonic() - tick < 20 and "internal error" not in r.stderr


def test_a_template_that_never_ends_is_stopped_at_its_deadline(tmp_path):
    from r1cloud.data.prompts import check

    (tmp_path / "t.jinja").write_text(
        "{% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}{% endfor %}"
    )
    tick = time.monotonic()
    assert "takes more than 0.5 s to render one row" in check(tmp_path / "t.jinja", "x", seconds=0.5)
    assert time.monotonic() - tick < 3


def test_the_trainer_renders_in_the_same_sandbox(tmp_path):
    """What validate refuses, the data loader refuses too (never renders it unsandboxed)."""
    from r1cloud.data import prompts

    (tmp_path / "t.jinja").write_text("{{ content.__class__.__mro__ }}")
    with pytest.raises(Exception, match="unsafe"):
        prompts.load(tmp_path / "t.jinja").render(content="x")


rows_strategy = st.lists(
    st.one_of(
        st.fixed_dictionaries(
            {},
            optional={
                "problem": st.one_of(st.text(max_size=10), st.integers(), st.none(), st.lists(st.integers(), max_size=2)),
                "answer": st.one_of(st.text(max_size=5), st.integers(-5, 5), st.floats(allow_nan=False), st.none(), st.booleans()),
                "id": st.one_of(st.integers(0, 9), st.text(max_size=3)),
            },
        ),
        st.sampled_from(["{oops", "[1]", '"text"', "", "null"]),
    ),
    max_size=12,
)  # fmt: skip


@settings(max_examples=int(os.environ.get("HYPOTHESIS_EXAMPLES", 60)), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # fmt: skip
@given(rows=rows_strategy)
def test_any_rows_end_in_0_or_2_and_what_passes_loads(tmp_path_factory, rows):
    from r1cloud.data.loader import load_rows
    from r1cloud.spec import SpecError
    from r1cloud.validate import load_spec

    d = tmp_path_factory.mktemp("rows")
    data = _jsonl(d, rows)
    bp = _blueprint(d)
    try:
        spec = load_spec(bp, [f"data.train_files={data}", "data.rollout_batch_size=1", "data.val_batch_size=1",
                              "worker.actor.global_batch_size=1"]).spec  # fmt: skip
    except SpecError as e:
        said = [p.render() for p in e.problems]
        assert all("\n" not in s for s in said) and any("train.jsonl" in s for s in said), said
        return
    loaded = load_rows(spec.data.train_files)  # the trainer's reader takes what validate passed
    assert len(loaded) >= 1 and all(isinstance(p, str) for p in loaded["problem"])
    assert all(a is not None for a in loaded["answer"])


def test_a_video_given_as_its_decoded_frames_is_one_video(cli, tmp_path):
    """A parquet row's video as a list of frames (image structs, not paths) is one video for the
    loader (data/loader.py, core/rows.row_videos); validate counted each frame as a video and refused
    the row ("1 <video> in its prompt and 3 videos")."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from r1cloud.core.rows import row_videos

    png = _png(tmp_path / "red.png").read_bytes()
    frames = [{"bytes": png, "path": None}] * 3
    assert row_videos(frames) == [frames] and row_videos(["a.mp4", "b.mp4"]) == ["a.mp4", "b.mp4"]
    assert row_videos(None) == [] and row_videos("a.mp4") == ["a.mp4"]
    rows = [{"problem": f"<video>How many frames? {i}", "answer": "3", "videos": frames} for i in range(8)]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "train.parquet")
    (tmp_path / "vlm").mkdir()
    config = {
        "architectures": ["Qwen2VLForConditionalGeneration"],
        "model_type": "qwen2_vl",
        "vision_config": {},
    }
    (tmp_path / "vlm" / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 2048}))
    r = cli(
        "validate",
        _blueprint(tmp_path),
        f"data.train_files={tmp_path / 'train.parquet'}",
        f"worker.actor.model.model_path={tmp_path / 'vlm'}",
    )
    assert "videos in 'videos'" not in r.stderr and "data.train_files" not in r.stderr, r.stderr
