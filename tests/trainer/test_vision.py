"""Vision-language models: EasyR1's image data, packed rows with images and mRoPE, FSDP2 gradients,
the frozen vision tower, vLLM's multimodal log-probs against the trainer's, and a VL run through
the CLI. Tiny random Qwen2/2.5/3-VL models (tests/tiny.py), pictures from data/shapes."""

import json

import pytest
import steps
import torch
from openai import OpenAI

from r1cloud.data.loader import PromptSet, load_tokenizer
from r1cloud.media import vision
from r1cloud.media.vision import auto_class
from r1cloud.serving.serve import free_port
from r1cloud.spec import load_resolved
from r1cloud.trainer import algorithms as alg
from r1cloud.trainer.driver import Trainer
from r1cloud.trainer.model import attention_for, packed_log_probs, pad
from tiny import generated, make_tiny_vlm
from tinyrun import r1, run_trainer, tiny_vl_blueprint


def pictures():
    from PIL import Image

    return [Image.new("RGB", (56, 84), (200, 20, 20)), Image.new("RGB", (84, 56), (20, 20, 200))]


def image_seqs(processor) -> list[tuple]:
    """A shared one-image prompt with three answers, a two-image prompt with two, in mixed order."""
    one = processor.encode(processor.render("<image>How many?", True), pictures()[:1])
    two = processor.encode(processor.render("Compare <image> with <image>.", True), pictures())
    a, b = {"key": "a", **one.image_inputs}, {"key": "b", **two.image_inputs}
    return [
        (one.ids, [5, 6, 7], a),
        (two.ids, [10, 11, 12, 13], b),
        (one.ids, [8, 9], a),
        (two.ids, [14], b),
        (one.ids, [20, 21, 22, 23, 24], a),
    ]


@pytest.mark.parametrize("arch", ["qwen2_vl", "qwen2_5_vl", "qwen3_vl", "idefics3"])
def test_packed_image_rows_equal_one_sequence_at_a_time(tmp_path, arch, monkeypatch):
    """Several image sequences in one row, a shared image prompt packed once, (4, 1, N) mRoPE
    positions for Qwen, Idefics3's pixel batches side by side: the log-probs and the summed
    gradients of one sequence at a time, ≤ 1e-5; and the same through the model's own lm_head
    instead of head.py's (Idefics3 tied, as SmolVLM)."""
    from transformers import AutoConfig

    from r1cloud.trainer import model as model_mod

    path = make_tiny_vlm(tmp_path / arch, arch, tie=arch == "idefics3")
    processor = vision.ImageProcessor(vision.load_processor(str(path)))
    seqs = image_seqs(processor)
    assert len(seqs[0][0]) > len(processor.encode(processor.render("<image>How many?", True), []).ids)
    config = AutoConfig.from_pretrained(path)
    model = auto_class(config).from_pretrained(
        path, dtype=torch.float32, attn_implementation=attention_for(config)
    )
    assert model_mod.plain_head(model) is not None  # the log-probs go through head.py

    def run(batches):
        model.zero_grad()
        logps = [lp for b in batches for lp in packed_log_probs(model, b, 0.7)]
        sum(lp.sum() * (i + 1) for i, lp in enumerate(logps)).backward()
        return [lp.detach() for lp in logps], {n: p.grad.clone() for n, p in model.named_parameters()}

    packed, together = run([seqs])
    alone, one_by_one = run([[s] for s in seqs])
    monkeypatch.setattr(model_mod, "PLAIN_HEADS", set())
    by_lm_head, lm_head_grads = run([seqs])
    vision_grads = [n for n in together if ("visual" in n or "vision" in n) and together[n].abs().max() > 0]
    assert vision_grads  # the images reach the loss
    scale = max(g.abs().max().item() for g in together.values())
    for lps, grads in ((alone, one_by_one), (by_lm_head, lm_head_grads)):
        for a, b in zip(packed, lps, strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
        assert max((together[n] - grads[n]).abs().max().item() for n in grads) <= 1e-5 * scale


@pytest.mark.parametrize(
    "arch, adapters",
    [("qwen2_vl", 0), ("qwen2_5_vl", 0), ("qwen3_vl", 0), ("idefics3", 0), ("qwen2_5_vl", 4), ("critic", 0)],
)
def test_one_worker_mixed_precision_is_fsdp_at_world_one(tmp_path, arch, adapters):
    """One CPU worker computing in bf16 over fp32 weights (trainer/precision.py, no FSDP) gives
    FSDP2's log-probs and gradients at world 1 with the same policy, bit for bit: two
    micro-batches whose gradients add up before the reduce (as the CPU workers defer it), each
    wrapped module's floating inputs cast as FSDP casts them (a Qwen-VL vision block's rotary
    embedding); with LoRA adapters (rank 4, B drawn at random) too, and for a GAE critic (a text
    model's value head)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from transformers import AutoConfig, AutoModelForTokenClassification

    from r1cloud.spec.models import LoraConfig
    from r1cloud.trainer import lora, precision
    from r1cloud.trainer.model import packed_values, shard_units, vision_tower
    from tiny import make_tiny_model

    critic = arch == "critic"
    path = make_tiny_model(tmp_path / arch) if critic else make_tiny_vlm(tmp_path / arch, arch)
    config = AutoConfig.from_pretrained(path)
    if critic:  # as the workers build it
        config.num_labels, config.classifier_dropout = 1, 0.0
        seqs = [([1, 2, 3, 4], [5, 6, 7]), ([1, 2, 3, 4], [8, 9]), ([10, 11], [12, 13, 14])] * 2
    else:
        seqs = image_seqs(vision.ImageProcessor(vision.load_processor(str(path))))

    def run(fsdp: bool):
        torch.manual_seed(0)  # the same new value head in both
        model = (AutoModelForTokenClassification if critic else auto_class(config)).from_pretrained(
            path, config=config, dtype=torch.float32, attn_implementation=attention_for(config)
        )
        if adapters:
            torch.manual_seed(0)
            lora.add(model, LoraConfig(rank=adapters, alpha=8))
            with torch.no_grad():
                for name, p in model.named_parameters():
                    if "lora_B" in name:
                        p.normal_(0, 0.02)
        tower = vision_tower(model)
        units = [*shard_units(model), *([tower] if tower else []), model]  # as the workers wrap them
        if fsdp:
            mp, mesh = MixedPrecisionPolicy(torch.bfloat16, torch.float32), init_device_mesh("cpu", (1,))
            for unit in units:
                fully_shard(unit, mesh=mesh, mp_policy=mp, reshard_after_forward=False)
        else:
            precision.attach(model, torch.bfloat16, torch.float32, units)
        logps = []
        for i, micro in enumerate((seqs[:3], seqs[3:])):
            if fsdp:
                model.set_requires_gradient_sync(i == 1)
                model.set_reshard_after_backward(i == 1)
            with precision.window(model):
                lps = packed_values(model, micro) if critic else packed_log_probs(model, micro, 0.7)
                sum(lp.sum() * (k + 1) for k, lp in enumerate(lps)).backward()
            logps += [lp.detach() for lp in lps]
        grads = {
            n: getattr(p.grad, "full_tensor", lambda g=p.grad: g)()
            for n, p in model.named_parameters()
            if p.grad is not None
        }
        return logps, grads

    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/pg", rank=0, world_size=1)
    try:
        want_logps, want = run(fsdp=True)
    finally:
        dist.destroy_process_group()
    logps, got = run(fsdp=False)
    assert all(torch.equal(a, b) for a, b in zip(want_logps, logps, strict=True))
    assert got.keys() == want.keys() and {g.dtype for g in got.values()} == {torch.float32}
    assert max(want[n].abs().max().item() for n in want if "vis" in n or critic) > 0  # pictures count
    assert not adapters or all(".lora_" in n for n in want)  # only the adapters train
    assert [n for n in want if not torch.equal(want[n], got[n])] == []


def test_image_data_as_easyr1_reads_it(make_vl_run, shapes):
    """Relative paths under image_dir, EasyR1's pixel bounds, expanded lengths; raw ids keep one
    placeholder per image for vLLM."""
    spec = load_resolved(make_vl_run() / "spec.yaml")
    tokenizer, images = load_tokenizer(spec.worker.actor.model, spec.data)
    ps = PromptSet(spec.data.train_files, tokenizer, spec.data, processor=images)
    p = ps.prompts[0]
    assert len(p.images) == 1 and p.images[0].size == (56, 56)  # within [784, 3136] pixels already
    pad_id = images.image_token_id
    assert p.raw_ids.count(pad_id) == 1 and p.prompt_ids.count(pad_id) == 4  # 56 px: 2×2 merged patches
    assert p.length == len(p.prompt_ids) and "images" not in p.extra
    assert ps.image_inputs(0)["image_grid_thw"].tolist() == [[1, 4, 4]]


def test_image_rows_that_cannot_work_are_one_clear_error(make_vl_run, shapes, tmp_path):
    spec = load_resolved(make_vl_run() / "spec.yaml")
    tokenizer, images = load_tokenizer(spec.worker.actor.model, spec.data)
    rows = [json.loads(line) for line in (shapes / "train.jsonl").read_text().splitlines()]
    rows[2]["problem"] = "<image><image>How many?"
    bad = tmp_path / "bad.jsonl"
    bad.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(
        ValueError, match=r"bad.jsonl: row 2 has 2 <image> placeholder\(s\).*and 1 image\(s\)"
    ):
        PromptSet(str(bad), tokenizer, spec.data, processor=images)
    rows[2]["problem"], rows[3]["images"] = "<image>How many?", ["images/nowhere.png"]
    bad.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(ValueError, match=r"row 3: image .*nowhere.png not found"):
        PromptSet(str(bad), tokenizer, spec.data, processor=images)
    rows[3]["images"], rows[3]["problem"] = [], "How many?"  # a text row among image rows
    bad.write_text("".join(json.dumps(r) + "\n" for r in rows))
    mixed = PromptSet(str(bad), tokenizer, spec.data, processor=images)
    mixed.check_images("train", 1)  # supported: a micro-batch without pictures carries a blank one
    assert [len(p.images) for p in mixed.prompts][2:5] == [1, 0, 1]
    rows[3]["images"], rows[3]["problem"] = rows[4]["images"] * 2, "<image><image>How many?"
    bad.write_text("".join(json.dumps(r) + "\n" for r in rows))
    two = PromptSet(str(bad), tokenizer, spec.data, processor=images)
    two.check_images("train", 0)  # 0: the engine's own limit
    with pytest.raises(
        ValueError, match=r"prompts with 2 images, more than worker.rollout.limit_images \(1\)"
    ):
        two.check_images("train", 1)
    # an image prompt over max_prompt_length is never cut: dropped, or refused when filtering is off
    spec.data.max_prompt_length = 20
    assert len(PromptSet(spec.data.train_files, tokenizer, spec.data, processor=images)) == 0
    spec.data.filter_overlong_prompts = False
    with pytest.raises(ValueError, match=r"row 0 is \d+ tokens with its images.*never cut"):
        PromptSet(spec.data.train_files, tokenizer, spec.data, processor=images)


def single_process_grads(model_path, samples, clip, mode):
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model_path)
    model = auto_class(config).from_pretrained(model_path, dtype=torch.float32)
    logp, mask = pad(packed_log_probs(model, [s["seq"] for s in samples], 1.0))
    old = pad([s["old"] for s in samples])[0]
    adv = alg.token_level(torch.tensor([s["adv"] for s in samples]), mask)
    loss_mat, _ = alg.ppo_loss(logp, old, adv, mask, clip)
    alg.aggregate(loss_mat, mask, mode).backward()
    return {n: p.grad.detach().clone() for n, p in model.named_parameters()}


def test_fsdp_gradients_with_images_across_two_workers_equal_one_process(make_vl_run, tiny_vlm):
    """The vision tower sharded like the language layers: 2 workers' full gradients (language,
    vision blocks, merger) equal one process's, ≤ 1e-5 — also when one worker's micro-batch has
    no picture at all."""
    run = make_vl_run("algorithm.disable_kl=true", "algorithm.use_kl_loss=false")
    spec = load_resolved(run / "spec.yaml")
    trainer = Trainer(run, spec)
    g = torch.Generator().manual_seed(0)
    samples = []
    for i in range(4):  # two pictures, two answers each
        p = trainer.train_set.prompts[i // 2]
        images = {"key": str(p.index), **trainer.train_set.image_inputs(p.index)}
        response = torch.randint(5, 300, (3 + i,), generator=g).tolist()
        old = (torch.randn(len(response), generator=g) * 0.3 - 4).tolist()
        samples.append({"seq": (p.prompt_ids, response, images), "old": old, "adv": float(i % 3 - 1) + 0.5})
    a = spec.worker.actor
    clip = alg.ClipConfig(a.clip_ratio_low, a.clip_ratio_high, a.clip_ratio_dual)
    want = single_process_grads(tiny_vlm, samples, clip, "token")
    total = float(sum(len(s["seq"][1]) for s in samples))
    try:
        trainer.start_workers()
        assert trainer.share_prompts
        plan = [[{"total": total, "micro": [samples[:2]]}], [{"total": total, "micro": [samples[2:]]}]]
        steps.update(trainer, plan, apply=False)
        got = trainer.call("full_grads")[0]
        assert any(n.startswith("model.visual.blocks") for n in got)
        scale = max(w.abs().max().item() for w in want.values())
        assert scale > 1e-4
        worst = max((got[n] - want[n]).abs().max().item() for n in want)
        assert worst <= 1e-5, worst
        # Text-only rows among image rows: worker 0 has pictures, worker 1 none, so worker 1's
        # micro-batch carries the blank picture (model.blank_sequence) and both run the tower.
        _, processor = load_tokenizer(spec.worker.actor.model, spec.data)
        text = processor.encode(processor.render("How many sides has a square?", False), []).ids
        plain = [{**s, "seq": (text, s["seq"][1])} for s in samples[2:]]
        mixed = samples[:2] + plain
        want = single_process_grads(tiny_vlm, mixed, clip, "token")
        plan = [[{"total": total, "micro": [samples[:2]]}], [{"total": total, "micro": [plain]}]]
        steps.update(trainer, plan, apply=False)
        got = trainer.call("full_grads")[0]
        assert max(want[n].abs().max().item() for n in want if n.startswith("model.visual.blocks")) > 1e-6
        assert max((got[n] - want[n]).abs().max().item() for n in want) <= 1e-5
    finally:
        trainer.shutdown()


FROZEN = {  # what each freezing key keeps still, by parameter name
    "freeze_vision_tower": ("model.visual.", "model.vision_model."),
    "freeze_language_model": ("model.text_model.", "model.language_model.", "lm_head."),
}


@pytest.mark.parametrize(
    "arch,freeze", [("qwen2_vl", "freeze_language_model"), ("idefics3", "freeze_vision_tower")]
)
def test_vllm_image_log_probs_equal_trainer_and_frozen_part_stays(make_vl_run, tmp_path, arch, freeze):
    """vLLM (one placeholder per image, multi_modal_data) samples with the trainer's log-probs
    (≤ 1e-4, fp32) before and after an update and a weight sync; with freeze_vision_tower the
    vision weights are bit-identical after the update and the language weights are not, and
    with freeze_language_model the other way round. The Idefics3 ties its output layer to the
    embedding, as SmolVLM does (vLLM names that embedding model.text_model.embed_tokens)."""
    pytest.importorskip("vllm")
    model = make_tiny_vlm(tmp_path / arch, arch, tie=arch == "idefics3")
    run = make_vl_run(
        "worker.actor.optim.lr=0.05",
        f"worker.actor.model.{freeze}=true",
        f"worker.actor.model.model_path={model}",
        engine="vllm",
    )
    trainer = Trainer(run)

    def weights(worker):
        return {n: t.full_tensor().clone() for n, t in worker.actor.state_dict().items()}

    try:
        assert trainer.start_workers() == "vllm"
        trainer.call("sync_weights")
        sampling = {"n": 2, "temperature": 0.8, "top_p": 1.0, "top_k": -1, "max_tokens": 8, "seed": 3,
                    "ignore_eos": False}  # fmt: skip
        requests, images = [], []
        for i in range(2):
            p = trainer.train_set.prompts[i]
            tensors = trainer.train_set.image_inputs(i)
            requests.append(vision_request(p, tensors))
            images.append({"key": str(i), **tensors})

        def compare():
            samples = generated(trainer.call("generate", requests, sampling)[0])
            seqs = [(requests[s["prompt"]].ids, s["response"], images[s["prompt"]]) for s in samples]
            recomputed = steps.log_probs(trainer, [[seqs], [seqs]], temperature=0.8)[0][0]
            worst = max(
                max(abs(a - b) for a, b in zip(s["logprobs"], lp, strict=True))
                for s, lp in zip(samples, recomputed, strict=True)
            )
            return worst, seqs

        before, seqs = compare()
        assert before <= 1e-4, before
        start = trainer.call("__ray_call__", weights)[0]
        samples = [
            {"seq": s, "old": None, "ref": [-5.0] * len(s[1]), "adv": 1.0 if i % 2 else -1.0}
            for i, s in enumerate(seqs)
        ]
        steps.update(trainer, [[{"total": 8.0, "micro": [samples]}]] * 2)
        end = trainer.call("__ray_call__", weights)[0]
        frozen = [n for n in start if n.startswith(FROZEN[freeze])]
        assert frozen and all(torch.equal(start[n], end[n]) for n in frozen)
        assert max((start[n] - end[n]).abs().max().item() for n in start if n not in frozen) > 1e-3
        trainer.call("sync_weights")
        after, _ = compare()
        assert after <= 1e-4, after
    finally:
        trainer.shutdown()


def test_hf_engine_samples_images_with_the_trainer_log_probs(tiny_vlm):
    """The hf engine: a prompt's samples with its image tensors, log-probs equal to the trainer's
    packed ones; a sampled image placeholder ends the response (no image behind it)."""
    from r1cloud.rollout.engine import Request, Sampling, cut_at_eos
    from r1cloud.rollout.hf import HFEngine

    processor = vision.ImageProcessor(vision.load_processor(str(tiny_vlm)))
    enc = processor.encode(processor.render("<image>How many?", True), pictures()[:1])
    text = processor.encode(processor.render("How many?", False), [])
    engine = HFEngine(str(tiny_vlm), {processor.tokenizer.eos_token_id}, 0, torch.float32, "cpu")
    requests = [Request(text.ids), Request(enc.ids, enc.raw_ids, enc.images, enc.image_inputs)]
    samples = engine.generate(requests, Sampling(n=3, temperature=0.9, max_tokens=6, seed=2))
    assert [s.prompt for s in samples] == [0, 0, 0, 1, 1, 1]
    seqs = [
        (requests[s.prompt].ids, s.response) + (({"key": "x", **enc.image_inputs},) if s.prompt else ())
        for s in samples
    ]
    with torch.no_grad():
        trainer = packed_log_probs(engine.model, seqs, 0.9)
    for s, lp in zip(samples, trainer, strict=True):
        assert (
            len(s.response) and max(abs(a - b) for a, b in zip(s.logprobs, lp.tolist(), strict=True)) <= 1e-4
        )
    pad_id = processor.image_token_id
    assert cut_at_eos([5, pad_id, 6], [-1.0, -2.0, -3.0], {7}, {pad_id}) == ([5], [-1.0], False)


def expected_text(processor, prompt: str) -> int:
    """The rendered prompt's tokens without the video's: one <|video_pad|> stands for it."""
    return len(processor.encode(processor.render(prompt, True), []).ids) - 1


def vision_request(prompt, tensors):
    from r1cloud.rollout.engine import Request

    return Request(prompt.prompt_ids, prompt.raw_ids, prompt.images, tensors)


@pytest.mark.slow
def test_vl_config_trains_with_two_workers_through_the_cli(tmp_path, tiny_vlm, shapes, digits_reward):
    """An EasyR1-format VL config with local pictures: 2 steps on 2 workers with vLLM, an INFERENCE
    READY checkpoint that loads with its processor, merged, served by vLLM and by the fallback and
    asked with a picture through the official `openai` client, `chat --image`; a placeholder/image
    mismatch is exit 2 naming the row. Both servers and `chat --video` take a clip too."""
    pytest.importorskip("vllm")
    home = {"R1CLOUD_HOME": str(tmp_path / "home")}
    bp = tmp_path / "vl.yaml"
    bp.write_text(tiny_vl_blueprint(tiny_vlm, shapes, digits_reward, engine="vllm"))
    done = r1("train", bp, "--name", "vl-job", env=home)
    assert done.returncode == 0, done.stdout + done.stderr
    listed = r1("checkpoints", "vl-job", env=home)
    assert "INFERENCE READY" in listed.stdout, listed.stdout
    job = tmp_path / "home" / "jobs" / "vl-job"
    assert [json.loads(line)["step"] for line in (job / "metrics.jsonl").read_text().splitlines()] == [1, 2]
    # the last checkpoint is a model folder with its processor: transformers loads both
    from transformers import AutoConfig

    hf = job / "checkpoints" / "global_step_2" / "huggingface"
    model = auto_class(AutoConfig.from_pretrained(hf)).from_pretrained(hf)
    processor = vision.ImageProcessor(vision.load_processor(str(hf)))
    enc = processor.encode(processor.render("<image>How many?", True), pictures()[:1])
    assert enc.ids.count(processor.image_token_id) == 6
    with torch.no_grad():
        assert (
            packed_log_probs(model, [(enc.ids, [5, 6], {"key": "x", **enc.image_inputs})], 1.0)[0]
            .isfinite()
            .all()
        )
    # merge (step 1 is not INFERENCE READY), serve with vLLM and with the fallback, ask with a picture
    merged = r1("merge", "vl-job:step-1", "--out", tmp_path / "merged", env=home)
    assert merged.returncode == 0, merged.stderr
    assert (tmp_path / "merged" / "preprocessor_config.json").is_file()
    picture = shapes / "images" / "test-00000.png"
    ask = [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": vision.data_url(str(picture))}},
        {"type": "text", "text": "How many shapes?"},
    ]}]  # fmt: skip
    expected = len(
        processor.encode(
            processor.render("<image>How many shapes?", True),
            [vision.open_image(str(picture)).convert("RGB")],
        ).ids
    )
    # and with a 2 s clip (20 frames at 10 fps): both servers sample 4 frames, 2 a second, and
    # size them by the processor, so the prompt holds 2 × 2 × 3 merged patches
    from r1cloud.media import video
    from tiny import write_video

    clip = write_video(tmp_path / "clip.mp4", frames=20, fps=10, size=(84, 56))
    watch = [{"role": "user", "content": [
        {"type": "video_url", "video_url": {"url": vision.data_url(str(clip))}},
        {"type": "text", "text": "What moves?"},
    ]}]  # fmt: skip
    frames = video.Clip(*video.read_frames(str(clip), 2.0))
    seen = len(processor.encode(processor.render("<video>What moves?", True), [], [frames]).ids)
    assert len(frames.frames) == 4 and seen == expected_text(processor, "<video>What moves?") + 12
    # vLLM serves the merged folder at the model's whole context (its start-up profiling feeds it a
    # dummy video, which r1cloud's video processor handles); the fallback serves the job's checkpoint
    for engine, what, extra in (
        ("vllm", [tmp_path / "merged"], ["--", "--enforce-eager"]),
        ("transformers", ["vl-job", "--max-model-len", "256"], []),
    ):
        port = free_port()
        served = r1(
            "serve", "-c", *what, "--port", port, "--engine", engine, "--served-model-name", "vl-job-step-2",
            "--detach", "--name", f"vl-{engine}", *extra, env={**home, "VLLM_CPU_KVCACHE_SPACE": "1"},
        )  # fmt: skip
        assert served.returncode == 0, served.stdout + served.stderr
        try:
            client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0)
            reply = client.chat.completions.create(
                model="vl-job-step-2", messages=ask, max_tokens=4, temperature=0
            )
            assert reply.usage.prompt_tokens == expected, engine  # the picture's tokens are in the prompt
            assert reply.usage.completion_tokens >= 1
            reply = client.chat.completions.create(
                model="vl-job-step-2", messages=watch, max_tokens=4, temperature=0
            )
            assert reply.usage.prompt_tokens == seen, engine  # the clip's frames are in the prompt
        finally:
            assert r1("stop", f"vl-{engine}", env=home).returncode == 0
    chatted = r1(
        "chat",
        "vl-job",
        "How many shapes?",
        "--image",
        picture,
        "--max-tokens",
        "4",
        "--show-prompt",
        env=home,
    )
    assert chatted.returncode == 0, chatted.stderr
    missing = r1("chat", "vl-job", "How many?", "--image", tmp_path / "nowhere.png", env=home)
    assert missing.returncode == 2 and "no such file" in missing.stderr
    watched = r1("chat", "vl-job", "What moves?", "--video", clip, "--max-tokens", "2", env=home)
    assert watched.returncode == 0, watched.stderr
    rows = [json.loads(line) for line in (shapes / "train.jsonl").read_text().splitlines()]
    rows[1]["problem"] = "How many shapes?"  # no placeholder for its image
    bad = tmp_path / "bad.jsonl"
    bad.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tried = r1("try", bp, f"data.train_files={bad}", "--n", "4", env=home)
    assert tried.returncode == 2
    assert "row 1 has 0 <image> placeholder(s)" in tried.stderr and "Traceback" not in tried.stderr


def test_validate_refuses_crossed_pixel_bounds(cli, blueprint):
    path = blueprint()
    r = cli("validate", path, "data.min_pixels=5000", "data.max_pixels=4000")
    assert r.exit_code == 2
    assert "data.min_pixels" in r.stdout + r.stderr and "lower min_pixels" in r.stdout + r.stderr


def write_rows(path, rows: list[dict]) -> None:
    """Rows as a local data file of `path`'s kind: JSON lines, a JSON array or parquet."""
    if path.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(rows), path)
    elif path.suffix == ".json":
        path.write_text(json.dumps(rows))
    else:
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.mark.parametrize("kind", [".jsonl", ".json", ".parquet"])
def test_validate_reads_local_image_rows(cli, blueprint, shapes, tmp_path, kind):
    """`validate` finds what data load would refuse in a local file of each kind: a row whose
    placeholders and images differ; text-only rows among image rows pass."""
    rows = [json.loads(line) for line in (shapes / "train.jsonl").read_text().splitlines()]
    good = blueprint()
    local = [
        f"data.train_files={shapes}/train.jsonl",
        f"data.val_files={shapes}/test.jsonl",
        "data.prompt_key=problem",
        f"data.image_dir={shapes}",  # validate opens the pictures, from where the trainer would
    ]
    assert cli("validate", good, *local).exit_code == 0
    bad = tmp_path / f"bad{kind}"
    write_rows(bad, [*rows[:5], {**rows[5], "images": rows[5]["images"] * 2}, *rows[6:]])
    r = cli("validate", good, *local, f"data.train_files={bad}")
    assert r.exit_code == 2
    said = r.stdout + r.stderr
    assert f"bad{kind}: row 5 has 1 <image> placeholder(s)" in said and "2 image(s)" in said
    write_rows(bad, [*rows[:3], {"problem": "How many sides has a square?", "images": [], "answer": "4"}])
    r = cli("validate", good, *local, f"data.val_files={bad}")
    assert r.exit_code == 0, r.stderr  # text-only rows among image rows: supported


def test_a_format_prompt_may_place_the_picture(cli, blueprint, shapes, tmp_path):
    """EasyR1 splits the prompt at `<image>` after the format prompt is applied: rows without the
    placeholder validate when the template adds it, and are refused when it does not."""
    rows = [json.loads(line) for line in (shapes / "train.jsonl").read_text().splitlines()]
    bare = tmp_path / "bare.jsonl"
    write_rows(bare, [{**r, "problem": r["problem"].replace("<image>", "")} for r in rows])
    (tmp_path / "place.jinja").write_text("<image>{{ content }}")
    local = [
        f"data.train_files={bare}",
        f"data.val_files={bare}",
        "data.prompt_key=problem",
        f"data.image_dir={shapes}",
    ]
    assert (
        cli("validate", blueprint(), *local, f"data.format_prompt={tmp_path / 'place.jinja'}").exit_code == 0
    )
    r = cli("validate", blueprint(), *local)
    assert r.exit_code == 2 and "row 0 has 0 <image> placeholder(s)" in r.stderr


ZOOM = '''from PIL import Image


class Zoom:
    """Gym-shaped: every turn is answered with a text and a picture (TRL's content blocks)."""

    def reset(self, **row):
        self.turn = 0

    def step(self, action):
        self.turn += 1
        picture = Image.new("RGB", (56, 56 + 28 * self.turn), (60 * self.turn, 120, 30))
        blocks = [{"type": "text", "text": f"zoom {self.turn}:"}, {"type": "image", "image": picture}]
        return blocks, 0.25, self.turn >= 3
'''


@pytest.mark.parametrize("arch", ["qwen2_vl", "qwen2_5_vl", "qwen3_vl", "idefics3"])
def test_pictures_in_observations_reach_the_next_turn_and_the_trainer(tmp_path, arch):
    """An environment answers each turn with a picture: it enters the next turn as the template's
    image tokens (the processor's expansion; one placeholder each in the ids vLLM takes), every
    turn continues from the exact ids so far, and the trainer's forward over the whole episode —
    the prompt's picture and the observations', mRoPE positions over all of them — gives the
    log-probs the engine sampled with (≤ 1e-4), on a text prompt and on a prompt with a picture."""
    from r1cloud.agents.episodes import Agent, run
    from r1cloud.rollout.engine import Request, Sampling
    from r1cloud.rollout.hf import HFEngine

    (tmp_path / "zoom.py").write_text(ZOOM)
    tiny_vlm = make_tiny_vlm(tmp_path / arch, arch)
    processor = vision.ImageProcessor(vision.load_processor(str(tiny_vlm)))
    tok, pad_id = processor.tokenizer, processor.image_token_id
    enc = processor.encode(processor.render("<image>How many?", True), pictures()[:1])
    text = processor.encode(processor.render("How many?", False), [])
    reset = {"row": {}, "around": ("", ""), "where": "row 0"}
    requests = [
        Request(text.ids, reset=reset),
        Request(enc.ids, enc.raw_ids, enc.images, enc.image_inputs, reset),
    ]
    # a third of the vocabulary ends a turn, so the random model's turns are short
    ends = {tok.eos_token_id, *range(50, 170)} - {pad_id}
    given = []

    class Recorder(HFEngine):
        def generate(self, prompts, sampling):
            given.append([(list(p.ids), list(p.raw_ids or p.ids), len(p.images)) for p in prompts])
            return super().generate(prompts, sampling)

    engine = Recorder(str(tiny_vlm), ends, 0, torch.float32, "cpu")
    agent = Agent.build(tok, environment=f"{tmp_path / 'zoom.py'}:Zoom", max_turns=3, processor=processor)
    try:
        samples = run(engine, requests, Sampling(n=2, temperature=0.9, max_tokens=200, seed=4), agent)
    finally:
        agent.sandbox.close()
    seen = [s for s in samples if s.images]
    assert len(seen) >= 3, [s.stats for s in samples]
    for s in samples:  # an observation picture's tokens, expanded, only where one came in
        assert (s.response.count(pad_id) > 0) == bool(s.images)
        assert all(t != pad_id for t, m in zip(s.response, s.mask, strict=True) if m)  # none trained
    # the turns: each episode's request is its prompt and its response so far, its pictures with it
    k = samples.index(seen[0])
    s, at = samples[k], 0
    for t, turn in enumerate(given):
        live = [j for j, x in enumerate(samples) if x.stats["turns"] > t]
        if k not in live:
            break
        ids, raw, n_images = turn[live.index(k)]
        assert ids == requests[s.prompt].ids + s.response[:at]
        assert raw.count(pad_id) == n_images == len(requests[s.prompt].images) + t  # one picture a turn
        at = len(ids) - len(requests[s.prompt].ids)
        while at < len(s.response) and s.mask[at] == 1:
            at += 1
        while at < len(s.response) and s.mask[at] == 0:
            at += 1
    # the trainer's forward over the whole episodes
    seqs = []
    for s in samples:
        mm = {"key": str(s.prompt), **requests[s.prompt].image_inputs} if requests[s.prompt].images else {}
        if s.images:
            mm = {"key": str(s.prompt), **mm, "after": vision.merge(s.images)}
        seqs.append((requests[s.prompt].ids, s.response, mm) if mm else (requests[s.prompt].ids, s.response))
    with torch.no_grad():
        scored = packed_log_probs(engine.model, seqs, 0.9)
    worst = max(
        (torch.tensor(s.logprobs) - lp)[torch.tensor(s.mask, dtype=torch.bool)].abs().max().item()
        for s, lp in zip(samples, scored, strict=True)
    )
    assert worst <= 1e-4, worst


@pytest.mark.parametrize("engine", ["hf", "vllm"])
def test_a_run_whose_environment_answers_with_pictures_trains_on_them(
    make_vl_run, tiny_vlm, tmp_path, engine
):
    """Through the trainer (Ray, two FSDP workers, either engine; vLLM takes each turn's ids with
    one placeholder per picture and the pictures beside them): episodes whose observations hold
    pictures go from the workers to the driver and back into every forward with their pixels; the
    old log-probs recomputed by FSDP equal the engine's over whole episodes (≤ 1e-4). The tiny
    model's generation config lists many end tokens (as Llama 3's lists several), so its random
    turns end and the environment answers. The hf run splits each row over both workers
    (ulysses_size 2): the sliced forward still scores the engine's log-probs."""
    import shutil

    model = tmp_path / "short-turns"
    shutil.copytree(tiny_vlm, model)
    gen = json.loads((model / "generation_config.json").read_text())
    pad_id = json.loads((model / "config.json").read_text())["image_token_id"]
    gen["eos_token_id"] = [gen["eos_token_id"], *[t for t in range(50, 170) if t != pad_id]]
    (model / "generation_config.json").write_text(json.dumps(gen))
    (tmp_path / "zoom.py").write_text(ZOOM)
    run = make_vl_run(
        f"worker.actor.model.model_path={model}",
        "data.max_response_length=64",
        "worker.actor.global_batch_size=2",  # two updates a step: old log-probs recomputed
        "worker.rollout.multi_turn.enable=true",
        f"worker.rollout.multi_turn.environment={tmp_path / 'zoom.py'}:Zoom",
        "worker.rollout.multi_turn.max_turns=3",
        "trainer.max_steps=1",
        "trainer.val_before_train=false",
        "trainer.val_freq=-1",
        "trainer.save_freq=-1",
        *(["worker.actor.ulysses_size=2"] if engine == "hf" else []),
        engine=engine,
    )
    if engine == "vllm":
        pytest.importorskip("vllm")
    r = run_trainer(run)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    (m,) = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    print({k: m[k] for k in ("agent/turns", "agent/env_reward", "rollout/logp_diff_max")})
    assert m["agent/turns"] > 1.5 and m["agent/env_reward"] > 0, m
    assert m["rollout/logp_diff_max"] <= 1e-4, m["rollout/logp_diff_max"]


def test_ulysses_on_a_vlm_gives_one_process_log_probs_and_gradients(tmp_path):
    """ulysses_size 2 on the tiny Qwen2/2.5/3-VL and Idefics3 (two gloo processes, ulysses_vlm.py):
    each embeds the whole row (its vision tower on every picture and, for Qwen, a video) and runs the
    language model on its half, Qwen3-VL's deepstack features included. Log-probs equal one process's and the group's
    gradients add up to its, vision tower and merger included, ≤ 1e-5."""
    import subprocess
    import sys
    from pathlib import Path

    from ulysses_vlm import load, run

    archs = ["qwen2_vl", "qwen2_5_vl", "qwen3_vl", "idefics3"]
    for arch in archs:
        make_tiny_vlm(tmp_path / arch, arch)
    helper = Path(__file__).with_name("ulysses_vlm.py")
    r = subprocess.run(
        [sys.executable, str(helper), str(tmp_path), *archs],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    for arch in archs:
        want_logps, want = run(*load(str(tmp_path / arch)))
        got = torch.load(tmp_path / arch / "ulysses.pt")
        for a, b in zip(got["logps"], want_logps, strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
        assert sorted(got["grads"]) == sorted(want)
        tower = [n for n in want if ("visual" in n or "vision" in n) and want[n].abs().max() > 1e-6]
        assert tower, arch  # the pictures reach the loss
        scale = max(g.abs().max().item() for g in want.values())
        worst = max((got["grads"][n] - want[n]).abs().max().item() for n in want)
        assert worst <= 1e-5 * max(scale, 1.0), (arch, worst, scale)
