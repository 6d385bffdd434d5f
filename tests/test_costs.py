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

from r1cloud.core import budget
from r1cloud.costs import estimate, prices
from r1cloud.costs import plan as costs
from r1cloud.validate import load_spec
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
    from tiny import make_tiny_model

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


def test_prices_come_from_skypilots_catalog_code(catalog, monkeypatch):
    pytest.importorskip("sky")
    found, why = prices.offers([("H100", 8), ("A100-80GB", 8), ("H200", 8)])
    assert why == ""
    got = sorted((o.cloud, o.accelerator, o.instance, o.price, o.spot_price) for o in found)
    assert got == [
        ("AWS", "A100-80GB", "p4de.24xlarge", 40.97, 15.5),
        ("AWS", "H100", "p5.48xlarge", 98.32, 40.0),
        ("Lambda", "H100", "gpu_8x_h100_sxm5", 23.92, None),  # no spot price in Lambda's catalog
    ]
    # asked again: the answer kept beside the job store, SkyPilot's child not run; a catalog that
    # changes is read anew, and a damaged cache is only asked past
    runs = []
    real_run = prices.subprocess.run
    monkeypatch.setattr(prices.subprocess, "run", lambda *a, **k: runs.append(a) or real_run(*a, **k))
    assert prices.offers([("H100", 8), ("A100-80GB", 8), ("H200", 8)]) == (found, "") and runs == []
    lam = catalog / ".sky/catalogs/v8/lambda/vms.csv"
    lam.write_text(lam.read_text().replace("23.92", "21.50"))
    again, _ = prices.offers([("H100", 8), ("A100-80GB", 8), ("H200", 8)])
    assert len(runs) == 1 and ("Lambda", 21.50) in {(o.cloud, o.price) for o in again}
    cache = catalog / ".r1cloud/cache/prices.json"
    cache.write_text(json.dumps({k: [{"cloud": 1}] for k in json.loads(cache.read_text())}))
    assert prices.offers([("H100", 8), ("A100-80GB", 8), ("H200", 8)]) == (again, "") and len(runs) == 2


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
    # asynchronous: the two pools overlap (the slower one sets the step), both count as slots, and an
    # asynchronous run does not calibrate (its gen time is the wait for samples)
    overrides = [
        "trainer.n_gpus_per_node=1",
        "async_training.enable=true",
        "worker.rollout.n_gpus_per_node=1",
    ]
    split = load_spec(path, overrides, check_files=False).spec
    e = costs.plan(split, home, with_prices=False)
    w = estimate.work_of(split, None, got["response_fraction"], got["prompt_fraction"])
    g, t = estimate.step_flops(m, w)
    assert [r.where for r in e.rows] == ["this machine, 2 worker slots"]
    assert math.isclose(e.rows[0].step_s, max(g / speed.gen, t / speed.train))
    assert (
        e.notes[0].startswith("asynchronous on this machine: generation ")
        and "synchronous on all 2" in e.notes[0]
    )
    assert costs.measure(run, split, "cpu", 1, wall_s=200.0) is None


def test_the_paper_comparison_with_easyr1_is_what_the_readme_says(capsys):
    """benchmarks/estimate_vs_easyr1.py: the README quotes these step times against EasyR1's 145 s."""
    PAPER["main"]()
    printed = capsys.readouterr().out
    assert "EasyR1's sequences average 725 tokens" in printed
    seconds = [int(re.search(r"(\d+)s +[\d.]+×$", line).group(1)) for line in printed.splitlines()[2:]]
    assert seconds == [258, 398, 83, 137], printed


# ---------------------------------------------------------------------------- the budget


def test_the_budget_stops_before_the_step_that_would_pass_it():
    b = budget.Budget(cap=10.0, price=36.0, spent_before=2.0, started=1000.0)  # $0.01 a second
    assert b.spent(now=1500.0) == pytest.approx(7.0)
    assert b.stop_line(step_s=300, now=1500.0) is None  # 7 + 3 = 10: the cap is reached, not passed
    line = b.stop_line(step_s=301, now=1500.0)
    assert line.startswith("budget reached: $7.00 spent of $10.00") and "to $10.01" in line
    env = {budget.PRICE: "36", budget.SPENT: "2", budget.STARTED: "1000"}
    assert budget.Budget.from_env(10.0, env) == b
    assert budget.Budget.from_env(None, {}) is None  # no cap: no budget, with or without a price
    for bad in ({}, {budget.PRICE: "nan"}, {budget.PRICE: "0"}, {budget.PRICE: "ten"}):
        with pytest.raises(ValueError, match="resources.max_cost is set, but R1CLOUD_PRICE"):
            budget.Budget.from_env(10.0, bad)
    with pytest.raises(ValueError, match=r"already spent \$10.00 of its \$10.00"):  # a resume, no cap left
        budget.Budget.from_env(10.0, {**env, budget.SPENT: "10"})


def test_the_jobs_price_is_the_catalogs_for_its_accelerators_infra_and_spot(catalog, blueprint, monkeypatch):
    pytest.importorskip("sky")
    found, _ = prices.offers([("H100", 8), ("A100-80GB", 8)])  # SkyPilot's code reads the catalog once
    asked = []

    def offers(wanted, clouds=None):  # the same rows for each question after it, a cloud's only
        asked.append(clouds)
        return [o for o in found if not clouds or o.cloud.lower() in clouds], ""

    monkeypatch.setattr(prices, "offers", offers)

    def price(resources: str, *extra: str):
        path = blueprint(MINIMAL.replace("trainer:", f"resources: {resources}\ntrainer:"))
        extra = ["trainer.n_gpus_per_node=8", *extra]
        return prices.hourly_price(load_spec(path, extra, check_files=False).spec)

    assert price("{infra: aws, accelerators: H100:8}") == (98.32, "H100:8 AWS us-east-1, $98.32/hour")
    # on this machine: the cheapest cloud; two nodes pay twice; spot where the catalog has it
    assert price("{accelerators: H100:8}")[0] == 23.92
    assert price("{infra: lambda, accelerators: H100:8, num_nodes: 2}", "trainer.nnodes=2")[0] == 2 * 23.92
    assert price("{infra: aws, accelerators: H100:8, use_spot: true}")[0] == 40.0
    assert price("{infra: aws/us-west-2, accelerators: H100:8}") == (
        None,
        "SkyPilot's catalog has no price for H100:8 in us-west-2",
    )
    assert (
        price("{infra: k8s, accelerators: H100:8}")[1]
        == "k8s has no catalog price (SkyPilot prices clouds only)"
    )
    # alternatives: the job may land on either, so the budget counts the dearer one's price
    assert price("{infra: aws, accelerators: {H100: 8, A100-80GB: 8}}")[0] == 98.32
    assert price("{infra: lambda, accelerators: H100:8, use_spot: true}") == (
        None,
        "SkyPilot's catalog has no spot price for H100:8",
    )
    assert asked == [["aws"], None, ["lambda"], ["aws"], ["aws"], ["aws"], ["lambda"]]
    assert price("{infra: aws}")[0] is None


def test_validate_refuses_a_budget_it_cannot_keep(cli, blueprint, tmp_path, monkeypatch):
    monkeypatch.setenv("R1CLOUD_HOME", str(tmp_path / "r1"))
    h100 = prices.Offer("AWS", "H100", 8, "p5.48xlarge", "us-east-1", 98.32, 40.0)  # a fake catalog row
    monkeypatch.setattr(prices, "offers", lambda wanted, clouds=None: ([h100], ""))
    path = blueprint(MINIMAL.replace("trainer:", "resources: {infra: aws, accelerators: H100:8}\ntrainer:"))
    r = cli("validate", path, "resources.max_cost=0.0001", "--accels", "8", "--no-cost")
    assert r.exit_code == 2 and "resources.max_cost $0.0001 does not pay for one step: about $" in r.stderr
    assert "on H100:8 AWS us-east-1, $98.32/hour; raise it (--max-cost)" in r.stderr
    r = cli("validate", path, "resources.max_cost=500", "--accels", "8", "--no-cost")
    assert r.exit_code == 0 and "at most $500.00" in r.stdout, r.stderr
    unpriced = blueprint(MINIMAL.replace("trainer:", "resources: {max_cost: 50}\ntrainer:"), name="b.yaml")
    r = cli("validate", unpriced)
    assert (
        r.exit_code == 2 and "resources.max_cost needs the job's hourly price: the job names no" in r.stderr
    )
    r = cli("validate", path, "resources.max_cost=-1")
    assert r.exit_code == 2 and "resources.max_cost" in r.stderr


def test_a_running_jobs_cost_is_its_spend_and_the_steps_left_at_the_last_steps_time(
    cli, tmp_path, monkeypatch
):
    import os
    import time

    from r1cloud.core.jobstore import Job, JobStore, process_start_time

    monkeypatch.setenv("R1CLOUD_HOME", str(tmp_path / "r1"))
    store = JobStore()
    began = time.time() - 3600  # an hour at $36 an hour, plus $1.00 from an earlier attempt
    job = Job("priced", status="RUNNING", started_at=began, price=36.0, spent=1.0)
    job.pid, job.pid_started = os.getpid(), process_start_time(os.getpid())  # alive: this process
    store.create(job)
    (job.dir / "trainer.json").write_text(json.dumps({"total_steps": 10}))
    (job.dir / "metrics.jsonl").write_text(
        json.dumps({"step": 2, "reward/overall": 0.5, "timing_s/step": 100})
    )
    r = cli("jobs")
    # 8 steps left at 100 s each: 800 s at $36 an hour is $8.00 more (a cent each second after)
    assert re.search(r"\$37\.[0-2]\d of ~\$45\.[0-2]\d", r.stdout), r.stdout
    r = cli("status", "priced")
    found = re.search(
        r"cost       \$37\.[0-2]\d spent, about \$45\.[0-2]\d in all, at \$36\.00/hour", r.stdout
    )
    assert found, r.stdout
