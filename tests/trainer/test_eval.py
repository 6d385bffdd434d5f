"""`r1cloud eval` on real models: it agrees with the trainer's own validation (`trainer.val_only`)
on the same checkpoint, scores image prompts with a VLM, and keeps what it scored on Ctrl-C."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import run_folder
from tinyrun import R1CLOUD, r1, run_trainer, tiny_blueprint, tiny_vl_blueprint


def eval_json(*args, env=None) -> dict:
    r = r1("eval", *args, "--engine", "hf", "--json", env=env)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    return json.loads(r.stdout)


def val_metrics(run) -> dict:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()][-1]


def test_val_only_and_eval_agree_on_a_trained_checkpoint(tmp_path, tiny_model, digits_reward):
    """Two training steps; then the trainer's validation of the step-2 checkpoint (one worker, the hf
    engine, greedy) and `eval` of the same checkpoint give the same reward and lengths."""
    bp = tiny_blueprint(tiny_model, digits_reward)
    trained = run_folder(tmp_path, "trained", bp, ["trainer.max_steps=2", "trainer.save_freq=-1"])
    assert run_trainer(trained).returncode == 0
    checkpoint = trained / "checkpoints" / "global_step_2"
    val = run_folder(
        tmp_path,
        "val",
        bp,
        ["trainer.val_only=true", "trainer.n_gpus_per_node=1", f"trainer.load_checkpoint_path={checkpoint}"],
    )
    r = run_trainer(val)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    want = val_metrics(val)
    got = eval_json(checkpoint, "--blueprint", tmp_path / "trained.yaml", "--out", tmp_path / "eval")
    (target,) = got["targets"]
    figures = target["all"]
    assert figures["prompts"] == 64 and figures["n"] == 1
    assert figures["reward/overall"][0] == pytest.approx(want["val/overall_reward"], abs=1e-9)
    assert figures["reward/digits"][0] == pytest.approx(want["val/digits_reward"], abs=1e-9)
    assert figures["response_length"][0] == pytest.approx(want["val_response_length/mean"], abs=1e-9)
    rows = [json.loads(x) for x in Path(target["samples"]).read_text().splitlines()]
    assert len(rows) == 64 and {"question", "response", "ground_truth", "scores", "length"} <= set(rows[0])
    assert json.loads((tmp_path / "eval" / "summary.json").read_text()) == got


def test_a_vlm_is_scored_on_image_prompts(tmp_path, tiny_vlm, shapes, digits_reward):
    (tmp_path / "vl.yaml").write_text(tiny_vl_blueprint(tiny_vlm, shapes, digits_reward))
    got = eval_json(tiny_vlm, "--blueprint", tmp_path / "vl.yaml", "--n", "2", "--temperature", "1")
    figures = got["targets"][0]["all"]
    assert (figures["prompts"], figures["samples"]) == (4, 8) and "pass@2" in figures
    assert got["sampling"]["n"] == 2 and got["sampling"]["temperature"] == 1


def test_ctrl_c_keeps_what_was_scored(tmp_path, tiny_model, digits_reward):
    bp = tmp_path / "small-batches.yaml"
    bp.write_text(
        tiny_blueprint(tiny_model, digits_reward).replace("val_batch_size: 16", "val_batch_size: 4")
    )
    out = tmp_path / "eval"
    proc = subprocess.Popen(
        [
            R1CLOUD,
            "eval",
            str(tiny_model),
            "--blueprint",
            str(bp),
            "--engine",
            "hf",
            "--out",
            str(out),
            "--n",
            "8",
            "--temperature",
            "1",
            "--max-tokens",
            "64",
        ],  # long enough to interrupt
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        # as from a terminal: a shell's background job (CI started with `&`) inherits SIGINT
        # ignored, and so would `eval` and its child, which then scored on through the Ctrl-C
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        env={**os.environ, "R1CLOUD_HOME": str(tmp_path / "home")},
    )
    deadline, lines = time.time() + 300, 0
    while time.time() < deadline and lines < 32:
        lines = sum(len(p.read_text().splitlines()) for p in out.glob("1-*/samples.jsonl"))
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C at the terminal reaches the whole group
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr[-3000:]
    assert "interrupted: the table holds what was scored" in stderr and "Traceback" not in stderr
    figures = json.loads((out / "summary.json").read_text())["targets"][0]["all"]
    assert 4 <= figures["prompts"] < 64 and figures["prompts"] % 4 == 0  # whole batches, as written
    assert "accuracy" in stdout


def test_a_math500_shaped_file_with_no_blueprint(tmp_path, tiny_model):
    """MATH-500's columns (problem, solution, answer, subject, level, unique_id), scored by the math
    reward with no blueprint and no job: each part given alone on the command line. A second target
    that fails (damaged weights) ends the command with its error, after the first one's table."""
    from tinyrun import ROOT

    rows = [
        {"problem": f"What is ${i} + {i}$?", "solution": f"${2 * i}$", "answer": str(2 * i),
         "subject": "Prealgebra", "level": 1, "unique_id": f"test/prealgebra/{i}.json"}
        for i in range(3)
    ]  # fmt: skip
    data = tmp_path / "math500.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    # a second target whose weights are damaged: its child fails; the first one's scores are kept
    broken = tmp_path / "broken"
    shutil.copytree(tiny_model, broken)
    (broken / "model.safetensors").write_bytes(b"not safetensors")
    r = r1(
        "eval", tiny_model, broken, "--engine", "hf", "--json",
        *("--data", data, "--reward", ROOT / "reward_functions/math.py:compute_score"),
        *("--format-prompt", ROOT / "format_prompts/math.jinja", "--max-tokens", "8", "--prompt-key", "problem"),
        *("--out", tmp_path / "eval"),
    )  # fmt: skip
    assert r.returncode == 1, r.stderr[-3000:]
    assert f"error: {broken}: " in r.stderr and "its log: " in r.stderr
    got = json.loads(r.stdout)
    assert got == json.loads((tmp_path / "eval" / "summary.json").read_text())
    assert [t["target"] for t in got["targets"]] == [str(tiny_model), str(broken)]
    assert got["targets"][1]["all"] == {"prompts": 0, "samples": 0}
    figures = got["targets"][0]["all"]
    assert figures["prompts"] == 3 and {"reward/accuracy", "reward/format", "reward/overall"} <= set(figures)
    assert got["sampling"]["max_tokens"] == 8 and got["data"] == str(data)
    first = json.loads(Path(got["targets"][0]["samples"]).read_text().splitlines()[0])
    assert first["question"] == "What is $0 + 0$?" and first["ground_truth"] == "0"


def test_an_r1v_superclevr_shaped_file(tmp_path, tiny_vlm, shapes, digits_reward):
    """R1-V's counting eval file as it ships: {image_path, question, ground_truth (a number)}, one
    picture path per row and no <image> in the question — the format prompt places the picture,
    as EasyR1 allows (it splits the prompt after the format prompt is applied)."""
    rows = [json.loads(x) for x in (shapes / "test.jsonl").read_text().splitlines()]
    data = tmp_path / "superclevr_test_counting_problems.jsonl"
    data.write_text("".join(
        json.dumps({"image_path": r["images"][0], "question": "How many shapes are there?",
                    "ground_truth": int(r["answer"])}) + "\n"
        for r in rows
    ))  # fmt: skip
    template = tmp_path / "r1v_count.jinja"
    template.write_text("<image>{{ content | trim }} Answer with a number.")
    (tmp_path / "vl.yaml").write_text(tiny_vl_blueprint(tiny_vlm, shapes, digits_reward))
    got = eval_json(
        tiny_vlm,
        *("--blueprint", tmp_path / "vl.yaml", "--data", data, "--format-prompt", template),
        *("--prompt-key", "question", "--answer-key", "ground_truth", "--image-key", "image_path"),
        *("--image-dir", shapes, "--out", tmp_path / "eval"),
    )
    assert got["targets"][0]["all"]["prompts"] == len(rows) == 4
    first = json.loads(Path(got["targets"][0]["samples"]).read_text().splitlines()[0])
    assert first["ground_truth"] == rows[0]["answer"] and first["question"] == "How many shapes are there?"


def test_eval_builds_one_vllm_engine_sized_to_a_batch(tmp_path, tiny_model, digits_reward):
    """eval's vLLM engine runs in its one process: no tensor parallelism whatever the spec says
    (the trainer's default, EasyR1's 2, had stopped every eval without a blueprint from starting),
    and its CPU KV cache holds one batch's sequences — min(val_batch_size, prompts) × n — not a
    fixed GiB. Its own process: vLLM joins a torch.distributed world."""
    run = run_folder(
        tmp_path, "tp2", tiny_blueprint(tiny_model, digits_reward, engine="vllm"),
        ["worker.rollout.tensor_parallel_size=2"],
    )  # fmt: skip
    script = f"""
from r1cloud.evaluation import run as evaluate
from r1cloud.data.loader import PromptSet, load_tokenizer
from r1cloud.rollout.engine import Sampling, eos_ids
from r1cloud.validate import load_spec
spec = load_spec({str(run / "spec.yaml")!r}, []).spec
m = spec.worker.actor.model
tokenizer, _ = load_tokenizer(m, spec.data)
prompts = PromptSet(spec.data.val_files, tokenizer, spec.data, limit=10).prompts
evaluate._one_process_world()
engine = evaluate.vllm_engine(spec, prompts, Sampling(n=3, max_tokens=12), eos_ids(m.model_path, tokenizer))
config = engine.llm.llm_engine.vllm_config
# four samples of one 40-token prompt in one step: the first computes its whole block of 32 tokens,
# the others find it in the prefix cache (CPU_BLOCK; vLLM's 128 there would share nothing)
ids = (prompts[0].prompt_ids * 40)[:40]
outs = engine.llm.generate([{{"prompt_token_ids": ids}}] * 4,
                           [engine._params(Sampling(max_tokens=2), 2, seed) for seed in range(4)], use_tqdm=False)
print(config.parallel_config.tensor_parallel_size, config.cache_config.kv_cache_max_concurrency,
      ",".join(str(o.num_cached_tokens) for o in outs))
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    tp, sequences, cached = out.stdout.split()[-3:]
    assert (int(tp), float(sequences)) == (1, 30.0)  # 10 prompts (fewer than the batch of 16) × 3
    assert sorted(map(int, cached.split(","))) == [0, 32, 32, 32]  # a group's prompt computed once
