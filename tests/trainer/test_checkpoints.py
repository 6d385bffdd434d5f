"""Checkpoints as users see them: listed with INFERENCE READY, merged to Hugging Face safetensors
bit for bit (r1cloud's DCP checkpoints and EasyR1's per-rank DTensor shards), and never listed or
resumed half-written, whenever a save is killed."""

import json
import os
import random
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from hub_server import FakeHub
from r1cloud.checkpoint.merge import iter_weights
from r1cloud.checkpoint.store import list_checkpoints
from s3_server import S3Server
from tinyrun import R1CLOUD, r1, run_trainer

HERE = Path(__file__).parent


def dcp_weights(actor_dir: Path) -> dict[str, torch.Tensor]:
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    out = actor_dir.parent / "full.pt"
    dcp_to_torch_save(actor_dir, out)
    return torch.load(out, weights_only=False)["model"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory, tiny_model, digits_reward):
    """A 2-step run with 2 workers, a checkpoint after each step."""
    from r1cloud.spec import dump_spec
    from r1cloud.validate import load_spec
    from tinyrun import tiny_blueprint

    d = tmp_path_factory.mktemp("trained")
    (d / "bp.yaml").write_text(tiny_blueprint(tiny_model, digits_reward))
    spec = load_spec(d / "bp.yaml", ["trainer.max_steps=2"]).spec
    run = d / "run"
    run.mkdir()
    (run / "spec.yaml").write_text(dump_spec(spec))
    r = run_trainer(run)
    assert r.returncode == 0, r.stderr[-3000:]
    return run


def test_listing_shows_steps_rewards_and_inference_ready(trained):
    found = list_checkpoints(str(trained / "checkpoints"), "run")
    assert [c.step for c in found] == [1, 2]
    assert [c.inference_ready for c in found] == [False, True]  # save_hf: the last one is merged
    metrics = [json.loads(x) for x in (trained / "metrics.jsonl").read_text().splitlines()]
    assert [c.train_reward for c in found] == [m["reward/overall"] for m in metrics]
    # on-policy (no old log-probs recomputed): the update measures the engine against the trainer
    assert all(m["perf/old_log_prob_recomputed"] == 0.0 for m in metrics)
    diffs = [(m["rollout/logp_diff_mean"], m["rollout/logp_diff_max"]) for m in metrics]
    assert all(0 <= mean <= top < 1e-3 for mean, top in diffs), diffs  # fp32, both sides
    assert found[0].id == "run:step-1" and found[0].size > 0
    r = r1("checkpoints", trained / "checkpoints")
    assert r.returncode == 0, r.stderr
    assert "step-1" in r.stdout and "r1cloud merge" in r.stdout and "yes" in r.stdout


def test_save_hf_and_merge_equal_the_trained_weights_bit_for_bit(trained, tmp_path):
    for step in (1, 2):
        want = dcp_weights(trained / f"checkpoints/global_step_{step}/actor")
        if step == 1:
            out = tmp_path / "merged1"
            r = r1("merge", f"{trained / 'checkpoints'}:step-1", "--out", out, "--dtype", "fp32")
            assert r.returncode == 0, r.stderr
        else:
            out = trained / "checkpoints/global_step_2/huggingface"  # written at save time
        got = dict(iter_weights(out))
        assert set(got) == set(want)
        for k in want:
            assert torch.equal(got[k], want[k]), k
        model = AutoModelForCausalLM.from_pretrained(out)
        assert torch.equal(model.state_dict()["model.norm.weight"], want["model.norm.weight"])
        assert (out / "tokenizer.json").exists() and (out / "generation_config.json").exists()


def test_merge_shards_and_loads_in_vllm(trained, tmp_path):
    out = tmp_path / "sharded"
    from r1cloud.checkpoint.merge import merge
    from r1cloud.checkpoint.store import list_checkpoints as ls

    merge(ls(str(trained / "checkpoints"))[0], out, "bf16", shard_bytes=100_000)
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 2
    model = AutoModelForCausalLM.from_pretrained(out)
    assert next(model.parameters()).dtype == torch.bfloat16
    pytest.importorskip("vllm")
    code = (
        "import os; os.environ['VLLM_ENABLE_V1_MULTIPROCESSING']='0'\n"
        "from vllm import LLM, SamplingParams\n"
        # float32: vLLM's CPU bf16 kernels stop on an illegal instruction on some hosts' CPUs with this
        # tiny model's shapes (exit -4 here, 2026-11); the check is that the merged shards load
        f"llm = LLM(model={str(out)!r}, dtype='float32', max_model_len=128, enforce_eager=True)\n"
        "o = llm.generate([{'prompt_token_ids': [1, 2, 3]}], SamplingParams(max_tokens=4, temperature=0))\n"
        "print('TOKENS', len(o[0].outputs[0].token_ids))\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"},
    )
    assert "TOKENS 4" in r.stdout, f"exit {r.returncode}: " + r.stderr[-3000:]


@pytest.mark.parametrize("world,mesh", [(2, "fsdp"), (4, "hsdp")])
def test_easyr1_shards_merge_and_load(tiny_model, tmp_path, world, mesh):
    out = tmp_path / "easyr1"
    r = subprocess.run(
        [sys.executable, HERE / "easyr1_shards.py", tiny_model, out, str(world), mesh],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    found = list_checkpoints(str(out), "easyr1")
    assert [(c.step, c.format, c.train_reward, c.val_reward, c.inference_ready) for c in found] == [
        (2, "easyr1", 0.25, 0.5, False)
    ]
    r = r1("merge", out / "global_step_2" / "actor", "--dtype", "fp32")
    assert r.returncode == 0, r.stderr
    hf = out / "global_step_2/actor/huggingface"
    want = torch.load(out / "reference_full.pt")
    got = dict(iter_weights(hf))
    assert set(got) == set(want)
    for k in want:
        assert torch.equal(got[k], want[k]), k
    assert list_checkpoints(str(out))[0].inference_ready
    AutoModelForCausalLM.from_pretrained(hf)


def test_unsupported_mesh_is_a_clear_error(tiny_model, tmp_path):
    out = tmp_path / "tp"
    # A mesh whose dimension is neither fsdp nor ddp, as a tensor-parallel run writes.
    r = subprocess.run(
        [sys.executable, HERE / "easyr1_shards.py", tiny_model, out, "2", "tp"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    r = r1("merge", out / "global_step_2")
    assert r.returncode == 2 and "mesh ['tp'] is not supported" in r.stderr and "Traceback" not in r.stderr
    assert not (out / "global_step_2/actor/huggingface/model.safetensors").exists()


def test_sigkill_during_saves_never_leaves_a_listed_or_resumable_half_checkpoint(tmp_path):
    import multiprocessing

    import saver
    import torch.distributed.checkpoint as dcp

    from r1cloud.checkpoint.write import Checkpoints

    # Each trial forks from a forkserver that imported torch and the checkpoint code once (a fresh
    # interpreter a trial spent ~2 s importing them). Python 3.11's forkserver preloads without the
    # test's sys.path, so the heavy modules are named, not `saver` itself.
    forks = multiprocessing.get_context("forkserver")
    forks.set_forkserver_preload(["torch.distributed.checkpoint", "r1cloud.checkpoint.write"])
    root = tmp_path / "ck"
    rng = random.Random(0)
    trials = 20
    for _ in range(trials):
        ours, theirs = forks.Pipe(duplex=False)
        # daemonic: a trial that fails before its kill leaves no saver for pytest's exit to wait on
        p = forks.Process(target=saver.save_forever, args=(str(root), theirs), daemon=True)
        p.start()
        theirs.close()
        # Wait for its first save (longer on a loaded machine), then kill it at a random point in
        # the saves that follow back to back (~20 ms each).
        assert ours.poll(300), f"the saver published nothing in 5 minutes (exit code {p.exitcode})"
        time.sleep(rng.random() * 0.5)
        p.kill()  # SIGKILL: no goodbye
        p.join()
        ours.close()
        listed = list_checkpoints(str(root))
        latest = Checkpoints(root).latest()
        for c in listed:  # everything listed loads completely
            dcp.load(saver.state(torch.empty), checkpoint_id=f"{c.path}/actor", no_dist=True)
        if latest:
            assert latest[0] == listed[-1].step
    assert listed and listed[-1].step >= trials  # the saves made progress across the kills


def test_merge_bad_input_is_one_clear_line(trained, tmp_path):
    r = r1("merge", f"{trained / 'checkpoints'}:step-9")
    assert r.returncode == 2 and "no step 9" in r.stderr and "steps there: 1, 2" in r.stderr
    r = r1("merge", tmp_path)
    assert r.returncode == 2 and "no complete checkpoint" in r.stderr
    r = r1("merge", trained / "checkpoints", "--dtype", "int8")
    assert r.returncode == 2 and "use bf16, fp16 or fp32" in r.stderr
    r = r1("checkpoints", "no-such-job")
    assert r.returncode == 2 and "no job named 'no-such-job'" in r.stderr


def test_merge_never_deletes_what_it_did_not_write(trained, tmp_path):
    """--out that is the checkpoint, inside it or above it, a file, a folder with other files, the
    working directory: refused, everything in place. --force replaces only a previous merge."""
    ckpts = trained / "checkpoints"
    step2 = ckpts / "global_step_2"
    before = sorted(p.relative_to(trained) for p in trained.rglob("*"))
    note = tmp_path / "notes.txt"
    note.write_text("mine")
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "data.csv").write_text("a,b")
    for out, said in [
        (step2, "inside the checkpoint"),
        (step2 / "actor", "inside the checkpoint"),
        (ckpts, "holds the checkpoint"),
        (trained, "holds the checkpoint"),
        (note, "is a file"),
        (mine, "holds files merge did not write (data.csv)"),
    ]:
        r = r1("merge", f"{ckpts}:step-2", "--out", out, "--force")
        assert r.returncode == 2 and said in r.stderr and "Traceback" not in r.stderr, (out, r.stderr)
    r = subprocess.run(
        [R1CLOUD, "merge", f"{ckpts}:step-2", "--out", "."], cwd=mine, capture_output=True, text=True
    )
    assert r.returncode == 2 and "holds files merge did not write" in r.stderr
    assert sorted(p.relative_to(trained) for p in trained.rglob("*")) == before
    assert note.read_text() == "mine" and (mine / "data.csv").read_text() == "a,b"
    model = tmp_path / "model"
    assert r1("merge", f"{ckpts}:step-1", "--out", model, "--dtype", "fp32").returncode == 0
    r = r1("merge", f"{ckpts}:step-2", "--out", model, "--dtype", "fp32")  # a model there already
    assert r.returncode == 2 and "--force to replace it" in r.stderr
    r = r1("merge", f"{ckpts}:step-2", "--out", model, "--dtype", "fp32", "--force")
    assert r.returncode == 0 and f"into {model}" in r.stdout
    r = r1("merge", f"{ckpts}:step-2", "--out", model, "--base", model, "--force")  # not over its own base
    assert r.returncode == 2 and "is the --base model's folder" in r.stderr
    empty = tmp_path / "empty"  # `--out .` in an empty folder: the merge lands there
    empty.mkdir()
    r = subprocess.run(
        [R1CLOUD, "merge", f"{ckpts}:step-1", "--out", ".", "--dtype", "fp32"],
        cwd=empty,
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0 and (empty / "config.json").is_file(), r.stderr


def test_merge_push_to_hub_uploads_the_merged_folder(trained, tmp_path):
    hub = FakeHub(tmp_path / "hub", token="hf_write")
    env = {**os.environ, "HF_ENDPOINT": hub.url, "HF_TOKEN": "hf_write"}
    try:
        out = tmp_path / "merged"
        r = r1(
            "merge", f"{trained / 'checkpoints'}:step-1", "--out", out, "--push-to-hub", "me/tiny-r1", env=env
        )
        assert r.returncode == 0, r.stderr
        assert "pushed to" in r.stdout and hub.commits == [
            ("me/tiny-r1", f"r1cloud merge {trained / 'checkpoints'}:step-1")
        ]
        pushed = hub.root / "me/tiny-r1"
        assert sorted(f.name for f in out.iterdir()) == sorted(f.name for f in pushed.iterdir())
        for f in out.iterdir():
            assert f.read_bytes() == (pushed / f.name).read_bytes(), f.name
        # A token the Hub refuses: one clear message, exit 2, the merged folder kept.
        r = r1(
            "merge",
            f"{trained / 'checkpoints'}:step-1",
            "--out",
            out,
            "--force",  # the previous merge there is replaced
            "--push-to-hub",
            "me/x",
            env={**env, "HF_TOKEN": "hf_read"},
        )
        assert r.returncode == 2 and "refused 'me/x' (401)" in r.stderr and "HF_TOKEN" in r.stderr
        assert "Traceback" not in r.stderr and (out / "config.json").exists()
    finally:
        hub.close()


def test_bucket_checkpoints_list_and_merge_through_s3(trained, tmp_path):
    """The trained run's checkpoints copied into a bucket on a local S3 server (moto): listed with
    rewards and INFERENCE READY, merged from the bucket back into it, and merged to a local folder."""
    s3 = S3Server()
    try:
        fs = s3.fs()
        fs.mkdir("ckpts")
        fs.put(str(trained / "checkpoints"), "ckpts/job/checkpoints", recursive=True)
        env = {**os.environ, **s3.env}
        url = "s3://ckpts/job/checkpoints"
        r = r1("checkpoints", url, env=env)
        assert r.returncode == 0, r.stderr
        assert f"{url}:step-1" in r.stdout and f"r1cloud merge {url}:step-1" in r.stdout
        local = list_checkpoints(str(trained / "checkpoints"))
        os.environ.update(s3.env)
        try:
            remote = list_checkpoints(url)
        finally:
            for k in s3.env:
                os.environ.pop(k)
        assert [(c.step, c.train_reward, c.inference_ready) for c in remote] == [
            (c.step, c.train_reward, c.inference_ready) for c in local
        ]
        r = r1("merge", f"{url}:step-1", "--dtype", "fp32", env=env)
        assert r.returncode == 0, r.stderr
        assert fs.exists("ckpts/job/checkpoints/global_step_1/huggingface/config.json")
        r = r1("merge", f"{url}:step-1", "--dtype", "fp32", "--out", tmp_path / "from-bucket", env=env)
        assert r.returncode == 0, r.stderr
        want = dcp_weights(trained / "checkpoints/global_step_1/actor")
        got = dict(iter_weights(tmp_path / "from-bucket"))
        assert set(got) == set(want) and all(torch.equal(got[k], want[k]) for k in want)
        r = r1("checkpoints", url, env=env)
        assert "r1cloud merge" not in r.stdout  # both steps INFERENCE READY in the bucket now
    finally:
        s3.close()


def test_bucket_put_uploads_a_file_and_a_folder(s3, tmp_path):
    """A LoRA run's adapter_config.json is one file put beside the shards: it must land (rglob under
    a file finds nothing, and it was never uploaded), as a folder's files do."""
    from r1cloud.checkpoint.write import Bucket

    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text("{}")
    (tmp_path / "adapter_config.json").write_text('{"r": 2}')
    bucket = Bucket("s3://ckpts/job/checkpoints")
    bucket.put(
        tmp_path / "adapter_config.json", "s3://ckpts/job/checkpoints/global_step_1/actor/adapter_config.json"
    )
    bucket.put(tmp_path / "hf", "s3://ckpts/job/checkpoints/global_step_1/huggingface")
    fs = s3.fs()
    assert json.loads(fs.cat("ckpts/job/checkpoints/global_step_1/actor/adapter_config.json")) == {"r": 2}
    assert fs.cat("ckpts/job/checkpoints/global_step_1/huggingface/config.json") == b"{}"


def test_trainer_saves_to_a_bucket_and_a_new_machine_resumes_from_it(make_run, s3):
    """trainer.save_checkpoint_path as an S3 URL (moto's server): the workers write their shards
    straight to the bucket, trainer_state.json comes last, nothing is kept on the machine, and
    save_limit applies in the bucket; a run on "another machine" (a fresh run folder) resumes from
    the bucket's newest complete checkpoint and goes on."""
    fs = s3.fs()
    url = "s3://ckpts/tiny/checkpoints"
    common = (f"trainer.save_checkpoint_path={url}", "trainer.save_freq=1", "trainer.save_limit=1")
    first = make_run(*common, "trainer.max_steps=2", name="first")
    r = run_trainer(first)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert fs.exists("ckpts/tiny/checkpoints/global_step_2/trainer_state.json")
    shards = fs.ls("ckpts/tiny/checkpoints/global_step_2/actor", detail=False)
    assert sum(p.endswith(".distcp") for p in shards) == 2  # one per worker, written by each
    assert not list(first.rglob("*.distcp"))  # nothing on the machine
    assert not fs.exists("ckpts/tiny/checkpoints/global_step_1")  # save_limit, in the bucket too
    tracker = json.loads(fs.cat("ckpts/tiny/checkpoints/checkpoint_tracker.json"))
    assert tracker["last_global_step"] == 2
    (step,) = list_checkpoints(url)
    assert step.step == 2 and step.inference_ready  # the last one is merged at save time

    second = make_run(*common, "trainer.max_steps=3", name="second")
    assert not (second / "checkpoints").exists()
    r = run_trainer(second)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert f"[resume] from step 2 ({url}/global_step_2)" in r.stdout
    # the curve came down from the bucket with the checkpoint, and went on
    lines = [json.loads(x) for x in (second / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == [1, 2, 3]
    assert fs.cat("ckpts/tiny/checkpoints/metrics.jsonl").decode() == (second / "metrics.jsonl").read_text()
    r = r1("plot", url, "--metric", "reward/overall", "--out", second / "curve.png")
    assert r.returncode == 0, r.stderr
    assert (second / "curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # save_limit=1 in the bucket keeps the newest and the best by validation reward; the best
    # is still known on the new machine because the tracker came down with the checkpoint
    vals = {
        m["step"]: m["val/reward_score"]
        for run in (first, second)
        for m in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
        if "val/reward_score" in m
    }
    best = max(vals, key=vals.get)
    assert json.loads(fs.cat("ckpts/tiny/checkpoints/checkpoint_tracker.json"))["best_global_step"] == best
    r = r1("checkpoints", url)  # a fresh process: no listing cached from above
    listed = {int(x) for x in re.findall(r":step-(\d+)", r.stdout)}
    assert r.returncode == 0 and listed == {3, best}, r.stdout


def test_a_checkpoint_without_its_config_merges_with_base(trained, tiny_model, tmp_path):
    import shutil

    bare = tmp_path / "bare" / "global_step_1"
    shutil.copytree(trained / "checkpoints" / "global_step_1" / "actor", bare / "actor")
    shutil.copy(trained / "checkpoints" / "global_step_1" / "trainer_state.json", bare)
    r = r1("merge", f"{bare.parent}:step-1", "--out", tmp_path / "m1", "--dtype", "fp32")
    assert r.returncode == 2 and "--base FOLDER" in r.stderr, r.stderr
    r = r1(
        "merge", f"{bare.parent}:step-1", "--out", tmp_path / "m1", "--dtype", "fp32", "--base", tiny_model
    )
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "m1" / "config.json").is_file() and any((tmp_path / "m1").glob("*.safetensors"))
