"""What a run will cost before it starts: the step's FLOPs against the formulas by hand, a model's
size from its config against its real parameters, prices from SkyPilot's own catalog code reading
a small catalog in SkyPilot's format where SkyPilot reads it (HOME/.sky/catalogs/v8), the table
`validate` prints, and a calibration from a run's metrics."""

import json
import math
import re
import runpy
from pathlib import Path

import pytest

from r1cloud import costs, estimate, prices
from r1cloud.spec import load_spec
from spec_helpers import MINIMAL

AWS = """InstanceType,AcceleratorName,AcceleratorCount,vCPUs,MemoryGiB,GpuInfo,Price,SpotPrice,Region,AvailabilityZone
p5.48xlarge,H100,8,192,2048,"{'Gpus': [{'Name': 'H100', 'Manufacturer': 'NVIDIA', 'Count': 8, 'MemoryInfo': {'SizeInMiB': 81920}}], 'TotalGpuMemoryInMiB': 655360}",98.32,40.0,us-east-1,use1-az1
p4de.24xlarge,A100-80GB,8,96,1152,"{'Gpus': [{'Name': 'A100', 'Manufacturer': 'NVIDIA', 'Count': 8, 'MemoryInfo': {'SizeInMiB': 81920}}], 'TotalGpuMemoryInMiB': 655360}",40.97,15.5,us-east-1,use1-az1
p4d.24xlarge,A100,8,96,1152,"{'Gpus': [{'Name': 'A100', 'Manufacturer': 'NVIDIA', 'Count': 8, 'MemoryInfo': {'SizeInMiB': 40960}}], 'TotalGpuMemoryInMiB': 327680}",32.77,12.0,us-east-1,use1-az1
"""
LAMBDA = """InstanceType,AcceleratorName,AcceleratorCount,vCPUs,MemoryGiB,Price,Region,GpuInfo,SpotPrice
gpu_8x_h100_sxm5,H100,8,208,1800,23.92,us-east-1,H100,
"""
# Qwen2.5-VL-7B's text config (Qwen2.5-7B's): the paper comparison's model
PAPER = runpy.run_path(str(Path(__file__).parent.parent / "benchmarks" / "estimate_vs_easyr1.py"))
QWEN25_7B = PAPER["QWEN25_VL_7B"]


@pytest.fixture
def catalog(tmp_path, monkeypatch):
    """SkyPilot's catalog files for two clouds, in its format, where it reads them; the child
    process that asks SkyPilot inherits HOME."""
    home = tmp_path / "skyhome"
    for cloud, text in (("aws", AWS), ("lambda", LAMBDA)):
        (home / ".sky/catalogs/v8" / cloud).mkdir(parents=True)
        (home / ".sky/catalogs/v8" / cloud / "vms.csv").write_text(text)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("SKY_RUNTIME_DIR", raising=False)
    return home


def test_step_flops_are_the_formulas_by_hand():
    m = estimate.Model(params=1e9)  # no layers: no attention term
    w = estimate.Work(
        2, 4, 10, 20, share_prompt=True, epochs=1, old=False, ref=True, checkpointing=False, critic=None
    )
    gen, train = estimate.step_flops(m, w)
    assert gen == 2e9 * (2 * 10 + 8 * 20)  # the prompt prefilled once a group, each response decoded
    trained = 2 * 10 + 8 * 20  # the group's prompt packed once, and its four answers
    assert train == 2e9 * trained * (1 + 3)  # the reference's forward; forward and backward
    w2 = estimate.Work(
        2,
        4,
        10,
        20,
        False,
        2,
        True,
        True,
        True,
        estimate.Model(5e8),
        critic_epochs=2,
        critic_checkpointing=True,
    )
    _, train2 = estimate.step_flops(m, w2)
    trained2 = 8 * (10 + 20)  # a prompt copy per sample
    actor = 2e9 * trained2 * (2 + 2 * 4)  # old + ref, and two epochs of forward, recompute, backward
    critic = 1e9 * trained2 * (1 + 2 * 4)  # its values, and its own update
    assert math.isclose(train2, actor + critic)
    m3 = estimate.Model(1e9, layers=2, width=8)
    gen3, _ = estimate.step_flops(m3, w)
    assert math.isclose(gen3 - gen, 8 * 2 * 2 * 8 * 30**2)  # causal attention, each of 8 sequences


def test_model_size_from_config_counts_what_a_token_passes_through(tmp_path):
    torch = pytest.importorskip("torch")
    from r1cloud.testing import make_tiny_model

    path = make_tiny_model(tmp_path / "tiny")
    m = estimate.model_size(str(path))
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    matmuls = sum(p.numel() for n, p in model.named_parameters() if p.dim() == 2 and "embed" not in n)
    head = model.get_output_embeddings().weight.numel()  # tied or not, its matmul runs
    assert m.source.endswith("config.json") and m.layers == model.config.num_hidden_layers
    tied = model.config.tie_word_embeddings
    assert m.params == matmuls + head * tied
    big = estimate.model_of(QWEN25_7B)
    assert math.isclose(big.params, 7.07e9, rel_tol=1e-3)  # 7.62e9 less the 0.545e9 embedding lookup
    # a Hub model in the Hugging Face cache, laid out as huggingface_hub does
    hub = tmp_path / "hub"
    folder = hub / "models--Qwen--Qwen2.5-7B-Instruct"
    (folder / "refs").mkdir(parents=True)
    (folder / "refs/main").write_text("abc123")
    (folder / "snapshots/abc123").mkdir(parents=True)
    (folder / "snapshots/abc123/config.json").write_text(json.dumps(QWEN25_7B))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_HUB_CACHE", str(hub))
        cached = estimate.model_size("Qwen/Qwen2.5-7B-Instruct")
        assert cached.params == big.params and cached.source.endswith("snapshots/abc123/config.json")
    mixtral = {**QWEN25_7B, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32}
    mixtral |= {"num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 32000}
    mixtral |= {"num_local_experts": 8, "num_experts_per_tok": 2}  # a token passes through 2 of 8
    attention = 4096 * 128 * 32 * 2 + 4096 * 8 * 128 * 2
    assert estimate.model_of(mixtral).params == 32 * (attention + 2 * 3 * 4096 * 14336) + 32000 * 4096
    assert estimate.model_size("Qwen/Qwen3-VL-30B-A3B-Instruct-no-such").params == 3e9  # active, by name
    assert estimate.model_size("Qwen/Qwen2.5-VL-7B-Instruct-no-such").params == 7e9  # its name
    assert estimate.model_size("HuggingFaceTB/SmolLM2-135M-Instruct-x").params == 135e6
    assert estimate.model_size("someone/mystery-model") is None
    assert estimate.device_kind("NVIDIA H100 80GB HBM3") == "H100"
    assert estimate.device_kind("NVIDIA A100-SXM4-80GB") == "A100-80GB"


def test_prices_come_from_skypilots_catalog_code(catalog):
    pytest.importorskip("sky")
    found, why = prices.offers([("H100", 8), ("A100-80GB", 8), ("H200", 8)])
    assert why == ""
    got = sorted((o.cloud, o.accelerator, o.instance, o.price, o.spot_price) for o in found)
    assert got == [
        ("AWS", "A100-80GB", "p4de.24xlarge", 40.97, 15.5),
        ("AWS", "H100", "p5.48xlarge", 98.32, 40.0),
        ("Lambda", "H100", "gpu_8x_h100_sxm5", 23.92, None),  # no spot price in Lambda's catalog
    ]


def test_validate_prints_the_cost_table_cheapest_first(blueprint, cli, catalog, tmp_path, monkeypatch):
    pytest.importorskip("sky")
    monkeypatch.setenv("R1CLOUD_HOME", str(tmp_path / "r1"))
    path = blueprint(MINIMAL.replace("trainer:", "resources: {infra: aws, accelerators: H100:8}\ntrainer:"))
    r = cli("validate", path, "trainer.max_steps=100", "--accels", "8")
    assert r.exit_code == 0, r.stderr
    order = [
        "H100:8 Lambda us-east-1 ",  # 23.92 $/h
        "H100:8 AWS us-east-1 spot",  # 40.00
        "A100-80GB:8 AWS us-east-1 spot",  # 15.50 $/h, but over three times the hours
        "H100:8 AWS us-east-1 ",
        "A100-80GB:8 AWS us-east-1 ",
        "H200:8 ",  # no price in this catalog: last, time only
    ]
    lines = [line for line in r.stdout.splitlines() if line.startswith(("H100:8", "A100-80GB:8", "H200:8"))]
    assert len(lines) == len(order) and all(
        line.startswith(o) for line, o in zip(lines, order, strict=True)
    ), lines
    spec = load_spec(path, ["trainer.max_steps=100", "trainer.n_gpus_per_node=8"], check_files=False).spec
    m = estimate.model_size("Qwen/Qwen2.5-0.5B-Instruct")
    w = estimate.work_of(spec, None, 0.5, 0.5)
    step = estimate.step_seconds(m, w, estimate.default_speed("H100"), 8)
    assert lines[0].split()[-1] == f"{23.92 * 100 * step / 3600:,.2f}"  # $ in all: hourly × 100 steps
    assert "assumes 16% MFU" in r.stdout and "parameters (from" in r.stdout
    r = cli("validate", path, "--accels", "8", "--no-cost")
    assert r.exit_code == 0 and "$/hour" not in r.stdout


def test_without_a_catalog_the_time_is_still_estimated_and_the_line_says_how(
    blueprint, cli, tmp_path, monkeypatch
):
    monkeypatch.setenv("HOME", str(tmp_path / "empty"))
    path = blueprint(MINIMAL.replace("trainer:", "resources: {infra: aws, accelerators: H100:2}\ntrainer:"))
    r = cli("validate", path, "trainer.max_steps=10")
    assert r.exit_code == 0, r.stderr
    assert "H100:2" in r.stdout and "$/hour" not in r.stdout
    assert "sky show-gpus" in r.stdout


def test_a_runs_metrics_calibrate_the_next_estimate(tmp_path, blueprint):
    path = blueprint(MINIMAL)
    spec = load_spec(path, ["trainer.n_gpus_per_node=2"], check_files=False).spec
    m = estimate.model_size(spec.worker.actor.model.model_path)
    run = tmp_path / "run"
    run.mkdir()
    lines = [{"step": 0, "timing_s/validation": 7.0}]
    for step in (1, 2, 3):
        lines.append(
            {
                "step": step,
                "timing_s/gen": 4.0 if step > 1 else 40.0,  # the first step pays for warm-up
                "timing_s/step": 10.0 if step > 1 else 60.0,
                "response_length/mean": 512.0,
                "prompt_length/mean": 256.0,
            }
        )
    (run / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    got = costs.measure(run, spec, "cpu", 2, wall_s=200.0)
    d = spec.data
    g, t = estimate.step_flops(
        m, estimate.work_of(spec, None, 512 / d.max_response_length, 256 / d.max_prompt_length)
    )
    assert math.isclose(got["gen_flops"], g / 4.0 / 2) and math.isclose(got["train_flops"], t / 6.0 / 2)
    assert got["overhead_s"] == 200.0 - 80.0 - 7.0 and got["validation_s"] == 7.0
    home = tmp_path / "r1"
    home.mkdir()
    damaged = [
        "not json",
        '{"job": "old", "device": "cpu", "local": true, "gen_flops": 1e12, "train_flops": 1e12}',
    ]
    damaged.append(json.dumps({**got, "job": "zero", "local": True, "params": 0}))
    (home / costs.CALIBRATION).write_text(
        "\n".join([*damaged, json.dumps({"job": "j1", "local": True, **got})])
    )
    speed = costs.calibrated(home, None, m.params)  # this machine's runs
    assert speed.gen == got["gen_flops"] and "calibrated by job j1" in speed.source
    e = costs.plan(spec.model_copy(update={}), home, with_prices=False)
    assert [r.where for r in e.rows] == ["this machine, 2 worker slots"]
    share = f"responses {512 / d.max_response_length:.0%} of {d.max_response_length}"
    assert "calibrated by job j1" in e.notes[0] and share in e.notes[0]


def test_the_paper_comparison_with_easyr1_is_what_the_readme_says(capsys):
    """benchmarks/estimate_vs_easyr1.py: the README quotes these step times against EasyR1's 145 s."""
    PAPER["main"]()
    printed = capsys.readouterr().out
    assert "EasyR1's sequences average 725 tokens" in printed
    seconds = [int(re.search(r"(\d+)s +[\d.]+×$", line).group(1)) for line in printed.splitlines()[2:]]
    assert seconds == [258, 398, 83, 137], printed
