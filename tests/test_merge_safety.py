"""merge deletes or replaces only what it wrote itself, and a checkpoint from elsewhere is data,
never code: crafted pickles in DCP's index, in its non-tensor state and in EasyR1's `.pt` shards
run nothing; damaged shards and adapter configs are one line naming the file. Every data-loss case
hashes what was there before and after. (Small checkpoints written by DCP here, no training.)"""

import hashlib
import json
import os
import pickle
from pathlib import Path

import pytest
import torch


def _tree(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def _checkpoint(root: Path, lora: bool = False) -> Path:
    """root/global_step_1 as r1cloud's trainer writes it: actor/ (DCP), huggingface/, trainer_state.json."""
    import torch.distributed.checkpoint as dcp

    step = root / "global_step_1"
    state = {"model.embed_tokens.weight": torch.randn(8, 4), "model.norm.weight": torch.ones(4)}
    if lora:
        state |= {"model.proj.lora_A.default.weight": torch.randn(2, 4)}
    dcp.save(state, checkpoint_id=str(step / "actor"), no_dist=True)
    if lora:
        (step / "actor" / "adapter_config.json").write_text(json.dumps({"r": 2, "lora_alpha": 4}))
    hf = step / "huggingface"
    hf.mkdir()
    (hf / "config.json").write_text(json.dumps({"architectures": ["X"], "tie_word_embeddings": False}))
    (hf / "tokenizer.json").write_text("{}")
    (hf / "added_tokens.json").write_text('{"<x>": 9}')  # a tokenizer extra the trainer writes
    (step / "trainer_state.json").write_text(json.dumps({"step": 1}))
    return root


@pytest.fixture
def ckpts(tmp_path, monkeypatch):
    monkeypatch.setenv("R1CLOUD_HOME", str(tmp_path / "home"))
    return _checkpoint(tmp_path / "ck")


def test_merge_into_the_checkpoint_keeps_what_merge_did_not_write(cli, ckpts):
    hf = ckpts / "global_step_1" / "huggingface"
    (hf / "README.md").write_text("my notes")
    (hf / "extra").mkdir()
    (hf / "extra" / "data.bin").write_bytes(b"\x00\x01")
    before = {k: v for k, v in _tree(hf).items() if k != "config.json"}  # merge sets the config's dtype
    r = cli("merge", f"{ckpts}:step-1", "--dtype", "fp32")
    assert r.exit_code == 0, r.stderr
    after = _tree(hf)
    assert {k: v for k, v in after.items() if k in before} == before  # every file there, unchanged
    assert "model.safetensors" in after and json.loads((hf / "config.json").read_text())["dtype"] == "float32"
    r = cli("merge", f"{ckpts}:step-1", "--dtype", "bf16")  # again: its own weights replaced, the rest kept
    assert r.exit_code == 0, r.stderr
    again = _tree(hf)
    assert {k: v for k, v in again.items() if k in before} == before
    assert again["model.safetensors"] != after["model.safetensors"]
    assert not [p for p in hf.parent.iterdir() if p.name.startswith(".")]  # no leftovers beside it


def test_force_never_replaces_a_folder_merge_did_not_write(cli, ckpts, tmp_path):
    base = tmp_path / "Qwen2.5-0.5B"  # a downloaded model: only files a merge could also write
    base.mkdir()
    (base / "config.json").write_text('{"architectures": ["Qwen2ForCausalLM"]}')
    (base / "tokenizer.json").write_text("{}")
    from safetensors.torch import save_file

    save_file({"w": torch.ones(3)}, str(base / "model.safetensors"))
    before = _tree(base)
    r = cli("merge", f"{ckpts}:step-1", "--out", base, "--force")
    assert (
        r.exit_code == 2 and "holds files merge did not write (config.json, model.safetensors, " in r.stderr
    )
    assert _tree(base) == before
    out = tmp_path / "merged"
    assert cli("merge", f"{ckpts}:step-1", "--out", out).exit_code == 0
    (out / "mine.txt").write_text("x")  # a file added to a previous merge is not merge's either
    r = cli("merge", f"{ckpts}:step-1", "--out", out, "--force")
    assert r.exit_code == 2 and "(mine.txt)" in r.stderr and (out / "mine.txt").read_text() == "x"
    (out / "mine.txt").unlink()
    assert cli("merge", f"{ckpts}:step-1", "--out", out, "--force").exit_code == 0


def test_a_merging_folder_of_someone_else_is_left_alone(cli, ckpts, tmp_path):
    theirs = tmp_path / ".model.merging"
    theirs.mkdir()
    (theirs / "keep.txt").write_text("theirs")
    deleting = tmp_path / ".model.deleting"
    deleting.mkdir()
    (deleting / "keep.txt").write_text("theirs too")
    out = tmp_path / "model"
    assert cli("merge", f"{ckpts}:step-1", "--out", out).exit_code == 0
    assert cli("merge", f"{ckpts}:step-1", "--out", out, "--force").exit_code == 0
    assert (theirs / "keep.txt").read_text() == "theirs" and (
        deleting / "keep.txt"
    ).read_text() == "theirs too"
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".model")) == [
        ".model.deleting",
        ".model.merging",
    ]


class _RunsCode:
    """Unpickling this writes a file: the proof that a pickle ran code."""

    def __init__(self, flag: Path):
        self.flag = flag

    def __reduce__(self):
        return (Path.write_text, (self.flag, "ran"))


def test_a_crafted_dcp_index_runs_no_code(cli, ckpts, tmp_path):
    flag = tmp_path / "pwned"
    meta = ckpts / "global_step_1" / "actor" / ".metadata"
    meta.write_bytes(pickle.dumps(_RunsCode(flag)))
    r = cli("merge", f"{ckpts}:step-1", "--out", tmp_path / "out")
    assert r.exit_code == 2 and not flag.exists(), r.stderr
    assert ".metadata is not read: it names pathlib.Path.write_text" in r.stderr or "write_text" in r.stderr
    assert len(r.stderr.strip().splitlines()) <= 2 and not (tmp_path / "out").exists()
    with pytest.raises(pickle.UnpicklingError):  # the file really runs code when unpickled plainly
        try:
            pickle.loads(meta.read_bytes())
        finally:
            assert flag.read_text() == "ran"
            flag.unlink()
            raise pickle.UnpicklingError


def test_a_crafted_tensor_record_runs_no_code(cli, ckpts, tmp_path):
    """merge reads a tensor's record itself (dcp.read_chunks, mapping its bytes): a record whose
    pickle names a function is refused by torch's weights-only unpickler, and nothing runs."""
    import dataclasses
    import io

    from r1cloud.checkpoint.dcp import read_metadata

    flag = tmp_path / "pwned"
    actor = ckpts / "global_step_1" / "actor"
    crafted = io.BytesIO()
    torch.save(_RunsCode(flag), crafted)
    with open(actor / ".metadata", "rb") as f:
        meta = read_metadata(f)
    meta.storage_data = {
        k: dataclasses.replace(v, offset=0, length=len(crafted.getvalue()))
        for k, v in meta.storage_data.items()
    }
    next(actor.glob("*.distcp")).write_bytes(crafted.getvalue())
    (actor / ".metadata").write_bytes(pickle.dumps(meta))
    r = cli("merge", f"{ckpts}:step-1", "--out", tmp_path / "out", "--dtype", "fp32")
    assert r.exit_code == 2 and "not a plain tensor" in r.stderr and not flag.exists(), r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) <= 2
    assert not (tmp_path / "out").exists()
    with pytest.raises(pickle.UnpicklingError):  # the record really runs code when loaded plainly
        try:
            torch.load(io.BytesIO(crafted.getvalue()), weights_only=False)
        finally:
            assert flag.read_text() == "ran"
            raise pickle.UnpicklingError


def test_crafted_non_tensor_state_in_a_checkpoint_runs_no_code(tmp_path):
    """What a resume loads (an optimizer's param_groups are such state): through r1cloud's reader
    the crafted object is refused; through DCP's default planner it would have run."""
    import torch.distributed.checkpoint as dcp

    from r1cloud.checkpoint.dcp import storage

    flag = tmp_path / "pwned"
    dcp.save({"w": torch.ones(2), "extra": _RunsCode(flag)}, checkpoint_id=str(tmp_path / "c"), no_dist=True)
    flag.unlink(missing_ok=True)
    with pytest.raises((pickle.UnpicklingError, BaseException)) as caught:
        dcp.load(
            {"w": torch.empty(2), "extra": None}, **storage(str(tmp_path / "c"), write=False), no_dist=True
        )
    assert not flag.exists() and "Weights only load failed" in str(caught.value)
    state = {"w": torch.empty(2), "extra": None, "lr": 0.0}
    dcp.save(
        {"w": torch.ones(2), "extra": [1, "a", (0.9, 0.99)], "lr": 1e-3},
        checkpoint_id=str(tmp_path / "d"),
        no_dist=True,
    )
    dcp.load(state, **storage(str(tmp_path / "d"), write=False), no_dist=True)  # plain state loads as before
    assert state["extra"] == [1, "a", (0.9, 0.99)] and state["lr"] == 1e-3 and state["w"].sum() == 2
    dcp.load({"extra": None}, checkpoint_id=str(tmp_path / "c"), no_dist=True)  # DCP's own planner
    assert flag.read_text() == "ran"


def test_a_crafted_easyr1_shard_runs_no_code(cli, tmp_path):
    flag = tmp_path / "pwned"
    actor = tmp_path / "ck" / "global_step_1" / "actor"
    (actor / "huggingface").mkdir(parents=True)
    (actor / "huggingface" / "config.json").write_text('{"architectures": ["X"]}')
    torch.save({"w": torch.zeros(2), "evil": _RunsCode(flag)}, actor / "model_world_size_1_rank_0.pt")
    flag.unlink(missing_ok=True)
    r = cli("merge", f"{tmp_path / 'ck'}:step-1", "--out", tmp_path / "out")
    assert r.exit_code == 2 and "cannot be read as a torch shard" in r.stderr and not flag.exists(), r.stderr


@pytest.mark.parametrize("damage", ["missing", "empty", "truncated"])
def test_a_damaged_dcp_shard_is_one_line_naming_it(cli, ckpts, tmp_path, damage):
    shard = next((ckpts / "global_step_1" / "actor").glob("*.distcp"))
    if damage == "missing":
        shard.unlink()
    else:
        shard.write_bytes(b"" if damage == "empty" else shard.read_bytes()[: shard.stat().st_size // 2])
    r = cli("merge", f"{ckpts}:step-1", "--out", tmp_path / "out")
    assert r.exit_code == 2 and f"{shard.name} is " in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) <= 2
    assert ("missing" if damage == "missing" else "cut short") in r.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "text,said",
    [
        (None, "holds LoRA adapters but no adapter_config.json"),
        ("{garbage", "adapter_config.json is not valid JSON"),
        ("[1, 2]", "adapter_config.json holds a JSON list"),
        ('{"r": 0, "lora_alpha": 4}', "r is 0, not a positive number"),
        ('{"r": 2}', "lora_alpha is None, not a positive number"),
        ('{"r": "2", "lora_alpha": 4}', "r is '2', not a positive number"),
    ],
)
@pytest.mark.parametrize("adapter_only", [True, False])
def test_a_damaged_adapter_config_is_one_line(cli, tmp_path, monkeypatch, text, said, adapter_only):
    monkeypatch.setenv("R1CLOUD_HOME", str(tmp_path / "home"))
    ckpts = _checkpoint(tmp_path / "ck", lora=True)
    config = ckpts / "global_step_1" / "actor" / "adapter_config.json"
    config.unlink() if text is None else config.write_text(text)
    args = ["--adapter-only"] if adapter_only else []
    r = cli("merge", f"{ckpts}:step-1", "--out", tmp_path / "out", *args)
    assert r.exit_code == 2 and said in r.stderr, r.stderr
    assert not (tmp_path / "out").exists() and not [p for p in tmp_path.iterdir() if ".merging" in p.name]


def test_the_trainers_tokenizer_extras_reach_a_merged_folder(cli, ckpts, tmp_path):
    r = cli("merge", f"{ckpts}:step-1", "--out", tmp_path / "out")
    assert r.exit_code == 0, r.stderr
    names = set(os.listdir(tmp_path / "out"))
    assert {"config.json", "tokenizer.json", "added_tokens.json", "model.safetensors"} <= names
