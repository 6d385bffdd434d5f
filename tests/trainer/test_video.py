"""Videos as EasyR1 reads them (data.video_key, data.video_fps, min/max_pixels per frame): sampling
as qwen_vl_utils' fetch_video, patches in transformers' video layout without torchvision, packed
video rows whose log-probs equal the model's own forward (mRoPE from video grids, Qwen2.5-VL's
seconds per grid, Qwen3-VL's timestamps), and the hf engine's sampling log-probs against the
trainer's. Tiny random Qwen2/2.5/3-VL models (tests/tiny.py), videos written with OpenCV."""

import numpy as np
import pytest
import torch

from r1cloud.media import video, vision
from r1cloud.trainer.model import attention_for, packed_log_probs
from tiny import make_tiny_vlm, write_clips, write_video

ARCHS = ["qwen2_vl", "qwen2_5_vl", "qwen3_vl"]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("videovl")
    return {arch: make_tiny_vlm(root / arch, arch) for arch in ARCHS}


def test_a_file_is_sampled_as_fetch_video_samples_it(tmp_path):
    """30 frames at 10 fps (3 s), video_fps 2: 6 frames, linspace(0, 29, 6) rounded, each the
    frame it claims (its colour codes its index); a 1 s clip still gives 4, a frame list is padded
    to an even count, and every frame is resized to multiples of 28 inside the pixel bounds."""
    path = write_video(tmp_path / "count.mp4", frames=30, fps=10, size=(84, 56))
    clip = video.load(str(path), None, 2.0, 784, 3136)
    assert clip.indices == [0, 6, 12, 17, 23, 29] and clip.fps == pytest.approx(10)
    for index, frame in zip(clip.indices, clip.frames, strict=True):
        assert abs(int(np.asarray(frame)[..., 0].mean()) - index * 8) <= 6  # the frame it claims
    assert all(f.size == clip.frames[0].size for f in clip.frames)
    w, h = clip.frames[0].size
    assert w % 28 == 0 and h % 28 == 0 and 784 <= w * h <= 3136
    short = write_video(tmp_path / "short.mp4", frames=10, fps=10, size=(84, 56))
    assert video.load(str(short), None, 2.0, 784, 3136).indices == [0, 3, 6, 9]
    from PIL import Image

    frames = [tmp_path / f"f{i}.png" for i in range(3)]
    for i, f in enumerate(frames):
        Image.new("RGB", (56, 56), (40 * i,) * 3).save(f)
    listed = video.load([vision.open_image(f.name, str(tmp_path)) for f in frames], None, 2.0, 784, 3136)
    assert len(listed.frames) == 4 and listed.frames[3].tobytes() == listed.frames[2].tobytes()
    assert listed.metadata["fps"] == 2.0


def test_encode_gives_transformers_own_video_processor_metadata_it_takes(models, tmp_path):
    """Where torchvision is (GPU machines), transformers' own video processor builds a VideoMetadata
    of each dict encode passes, which refuses vLLM's do_sample_frames (seen on an H200); r1cloud's
    stand-in here would not notice, so the call's metadata goes through transformers' own step."""
    from transformers.video_utils import make_batched_metadata

    processor = vision.ImageProcessor(vision.load_processor(str(models["qwen2_5_vl"])))
    clip = video.load(str(write_video(tmp_path / "v.mp4", frames=20, fps=10)), None, 2.0, 784, 3136)
    seen, real = {}, processor.processor

    class Spy:
        def __getattr__(self, name):
            return getattr(real, name)

        def __call__(self, **kwargs):
            seen.update(kwargs)
            return real(**kwargs)

    processor.processor = Spy()
    processor.encode(processor.render("<video>What moves?", False), [], [clip])
    (meta,) = make_batched_metadata(seen["videos"], seen["video_metadata"])
    assert meta.frames_indices == clip.indices and meta.fps == pytest.approx(10)


@pytest.mark.parametrize("arch", ARCHS)
def test_video_patches_have_transformers_layout(models, arch):
    """pixel_values_videos as transformers' video processor lays them out: normalized frames,
    (T/2, 2, C, H/14/2, 2, 14, W/14/2, 2, 14) permuted to (T/2, H, W, 2, 2, C, 2, 14, 14) rows —
    computed here from that formula — and a still video's patches equal the picture's."""
    processor = vision.load_processor(str(models[arch]))
    vp = processor.video_processor
    assert isinstance(vp, video.VideoProcessor)
    rng = np.random.default_rng(0)
    frames = [rng.integers(0, 255, (56, 84, 3), dtype=np.uint8) for _ in range(4)]
    from PIL import Image

    out = vp([Image.fromarray(f) for f in frames])
    p, m, tp = vp.patch_size, vp.merge_size, 2
    h, w = vp.frame_size(4, 56, 84)
    assert (h, w) == (56, 84) or arch == "qwen3_vl"
    resized = np.stack([np.asarray(Image.fromarray(f).resize((w, h), resample=3)) for f in frames])
    x = (resized / 255.0 - np.array(vp.image_mean)) / np.array(vp.image_std)
    x = x.transpose(0, 3, 1, 2).reshape(4 // tp, tp, 3, h // p // m, m, p, w // p // m, m, p)
    want = x.transpose(0, 3, 6, 4, 7, 2, 1, 5, 8).reshape(-1, 3 * tp * p * p)
    assert out["video_grid_thw"].tolist() == [[2, h // p, w // p]]
    np.testing.assert_allclose(out["pixel_values_videos"].numpy(), want, atol=1e-5)
    still = vp([Image.fromarray(frames[0])] * 2)["pixel_values_videos"]
    h, w = vp.frame_size(2, 56, 84)  # Qwen3-VL sizes the whole clip: two frames may be larger
    picture = processor.image_processor(images=[Image.fromarray(frames[0]).resize((w, h), resample=3)])
    torch.testing.assert_close(still, torch.as_tensor(picture["pixel_values"]), rtol=0, atol=1e-6)


def video_rows(processor, clip, picture):
    """Video prompts (one shared by two answers), one with a video and a picture, and a text one."""
    one = processor.encode(processor.render("<video>What moves?", True), [], [clip])
    both = processor.encode(processor.render("<image> then <video>", True), [picture], [clip])
    text = processor.encode(processor.render("Count to three.", False), []).ids
    return [
        (one.ids, [5, 6, 7], {"key": "v", **one.image_inputs}),
        (both.ids, [10, 11], {"key": "b", **both.image_inputs}),
        (text, [12, 13]),
        (one.ids, [8, 9], {"key": "v", **one.image_inputs}),
    ]


@pytest.mark.parametrize("arch", ARCHS)
def test_packed_video_rows_equal_the_models_own_forward(models, tmp_path, arch):
    """Video rows packed with a picture row and a text row: each sequence's log-probs equal the
    model's own forward on it alone — positions from its own get_rope_index over
    mm_token_type_ids (video tokens 2), Qwen2.5-VL's second_per_grid_ts, Qwen3-VL's timestamps —
    ≤ 1e-5, and the vision tower gets a gradient from the video."""
    from PIL import Image
    from transformers import AutoConfig

    path = models[arch]
    processor = vision.ImageProcessor(vision.load_processor(str(path)))
    clip = video.load(str(write_video(tmp_path / "v.mp4", frames=20, fps=10, size=(84, 56))), None, 2.0, 784, 4704,
                      factor=processor.processor.video_processor.patch_size * 2)  # fmt: skip
    assert len(clip.frames) == 4
    seqs = video_rows(processor, clip, Image.new("RGB", (56, 56), (200, 30, 30)))
    config = AutoConfig.from_pretrained(path)
    model = vision.auto_class(config).from_pretrained(
        path, dtype=torch.float32, attn_implementation=attention_for(config)
    )
    video_token = config.video_token_id
    grid = seqs[0][2]["video_grid_thw"]
    assert grid[0, 0] == 2 and sum(t == video_token for t in seqs[0][0]) == int(grid.prod()) // 4
    if arch == "qwen2_5_vl":
        assert seqs[0][2]["second_per_grid_ts"].tolist() == [pytest.approx(2 / (4 / 20 * 10))]
    packed = packed_log_probs(model, seqs, 1.0)
    sum(lp.sum() for lp in packed).backward()
    assert any(
        ("visual" in n) and p.grad is not None and p.grad.abs().max() > 0 for n, p in model.named_parameters()
    )
    own = vision.auto_class(config).from_pretrained(path, dtype=torch.float32)  # its own attention
    vision.use_qwen2_rope(own)  # Qwen2/2.5-VL: Qwen's position rule, as vLLM (see the next test)
    with torch.no_grad():
        for seq, got in zip(seqs, packed, strict=True):
            ids = torch.tensor([seq[0] + seq[1]])
            tensors = {k: v for k, v in (seq[2] if len(seq) > 2 else {}).items() if k != "key"}
            logits = own(input_ids=ids, **vision.image_inputs(own, ids, tensors)).logits[0]
            want = torch.log_softmax(logits.float(), -1)[len(seq[0]) - 1 : -1].gather(
                -1, ids[0, len(seq[0]) :, None]
            )[:, 0]
            torch.testing.assert_close(got.detach(), want, rtol=0, atol=1e-5)


def test_qwen2_5_positions_follow_qwen_rule_after_a_video():
    """Two text tokens, a video of 2 × 4 × 6 patches (2 × 3 merged), two text tokens: the video at
    (t × seconds per grid × tokens_per_second, row, column) + 2, the text after it from one past the
    largest (Qwen's get_rope_index, vLLM's get_mrope_input_positions) — transformers 5.19 resumes at
    2 + max(2, 3) = 5 instead."""
    from types import SimpleNamespace

    config = SimpleNamespace(vision_config=SimpleNamespace(spatial_merge_size=2, tokens_per_second=2))
    types = torch.tensor([0, 0] + [2] * 12 + [0, 0])
    ((positions, delta),) = vision.qwen2_rope_index(
        config,
        [types.tolist()],
        video_grid_thw=torch.tensor([[2, 4, 6]]),
        second_per_grid_ts=torch.tensor([1.5]),
    )
    t = [0] * 6 + [3] * 6  # 1.5 s × 2 tokens a second
    h, w = [0, 0, 0, 1, 1, 1] * 2, [0, 1, 2] * 4
    want = [
        [0, 1, *(x + 2 for x in t), 6, 7],
        [0, 1, *(x + 2 for x in h), 6, 7],
        [0, 1, *(x + 2 for x in w), 6, 7],
    ]
    assert positions.tolist() == want and delta == 8 - 16


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    """A small generated video set, EasyR1-style (tiny.write_clips)."""
    return write_clips(tmp_path_factory.mktemp("clips"))


@pytest.mark.parametrize("arch", ["qwen2_5_vl", "qwen3_vl"])
def test_a_video_run_with_vllm_scores_the_engines_log_probs(models, clips, tmp_path, digits_reward, arch):
    """An EasyR1-format config on video rows (files and frame lists, relative to image_dir): validate
    passes it, then one step on 2 workers with vLLM — its rollouts take each video's frames with their
    metadata (Qwen2.5-VL's seconds per grid, Qwen3-VL's timestamps), and the trainer's old log-probs
    over the same frames equal the engine's (≤ 1e-4)."""
    pytest.importorskip("vllm")
    import json

    import yaml

    from tinyrun import r1, run_of, run_trainer, tiny_vl_blueprint

    bp = yaml.safe_load(tiny_vl_blueprint(models[arch], clips, digits_reward, engine="vllm", steps=1))
    bp["data"].update(train_files=f"{clips}/train.jsonl", val_files=f"{clips}/test.jsonl", image_dir=str(clips),
                      video_fps=2.0, max_pixels=4704, max_prompt_length=160)  # fmt: skip
    bp["trainer"].update(val_before_train=False, val_freq=-1, save_freq=-1)
    bp["worker"]["actor"]["global_batch_size"] = 2  # two updates a step: old log-probs recomputed
    (tmp_path / "video.yaml").write_text(yaml.safe_dump(bp))
    r = r1("validate", tmp_path / "video.yaml")
    assert r.returncode == 0, r.stdout + r.stderr
    run = run_of(tmp_path / "video.yaml", [], tmp_path / "run")
    r = run_trainer(run)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    (m,) = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert m["rollout/logp_diff_max"] <= 1e-4, m["rollout/logp_diff_max"]
    assert m["actor/grad_norm"] > 0


def test_validate_reads_local_video_rows(cli, blueprint, models, clips, tmp_path):
    """`validate` on video rows: a tiny Qwen2.5-VL passes; a row whose `<video>` placeholders and
    videos differ, a video file that is not there, and videos for a model family or a multi-turn run
    that takes none are each one line naming the row and the fix."""
    import json

    rows = [json.loads(line) for line in (clips / "train.jsonl").read_text().splitlines()]
    local = [f"worker.actor.model.model_path={models['qwen2_5_vl']}", f"data.train_files={clips}/train.jsonl",
             f"data.val_files={clips}/test.jsonl", "data.prompt_key=problem", f"data.image_dir={clips}",
             "data.rollout_batch_size=4", "worker.actor.global_batch_size=4"]  # fmt: skip
    good = blueprint()
    assert cli("validate", good, *local).exit_code == 0
    bad = tmp_path / "bad.jsonl"
    cases = {
        "two": ({**rows[1], "videos": ["c0.mp4", "c1.mp4"]}, "row 1 has 1 <video> in its prompt and 2 videos"),
        "gone": ({**rows[1], "videos": ["gone.mp4"]}, "row 1: video 'gone.mp4' not found (relative paths are joined with data.image_dir"),
    }  # fmt: skip
    for row, said in cases.values():
        bad.write_text("".join(json.dumps(r) + "\n" for r in [rows[0], row]))
        r = cli("validate", good, *local, f"data.train_files={bad}")
        assert r.exit_code == 2 and said in r.stdout + r.stderr, r.stdout + r.stderr
    idefics = make_tiny_vlm(tmp_path / "idefics3", "idefics3")
    r = cli("validate", good, *local, f"worker.actor.model.model_path={idefics}")
    assert r.exit_code == 2 and "the model's family (idefics3) takes no videos" in r.stdout + r.stderr


@pytest.mark.parametrize("arch", ["qwen2_5_vl", "qwen3_vl"])
def test_hf_engine_samples_videos_with_the_trainer_log_probs(models, tmp_path, arch):
    """The hf engine (generate, Qwen's position rule put in for Qwen2.5-VL): a video prompt's samples
    beside a text prompt's, log-probs equal to the trainer's packed ones (≤ 1e-4), and a 3-second
    clip whose temporal positions run past its rows and columns (where transformers' own rule would
    differ)."""
    from r1cloud.rollout.engine import Request, Sampling
    from r1cloud.rollout.hf import HFEngine

    path = models[arch]
    processor = vision.ImageProcessor(vision.load_processor(str(path)))
    clip = video.load(str(write_video(tmp_path / "v.mp4", frames=30, fps=10)), None, 2.0, 784, 4704,
                      factor=processor.video_factor)  # fmt: skip
    enc = processor.encode(processor.render("<video>What moves?", True), [], [clip])
    text = processor.encode(processor.render("How many?", False), [])
    engine = HFEngine(str(path), {processor.tokenizer.eos_token_id}, 0, torch.float32, "cpu")
    requests = [Request(text.ids), Request(enc.ids, enc.raw_ids, [], enc.image_inputs, None, [clip])]
    samples = engine.generate(requests, Sampling(n=2, temperature=0.9, max_tokens=6, seed=2))
    seqs = [(requests[s.prompt].ids, s.response) + (({"key": "v", **enc.image_inputs},) if s.prompt else ())
            for s in samples]  # fmt: skip
    with torch.no_grad():
        trainer = packed_log_probs(engine.model, seqs, 0.9)
    for s, lp in zip(samples, trainer, strict=True):
        assert (
            len(s.response) and max(abs(a - b) for a, b in zip(s.logprobs, lp.tolist(), strict=True)) <= 1e-4
        )
