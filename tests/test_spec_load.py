"""Loading: the blueprint library, EasyR1 and FlexAI configs unchanged, overrides and precedence,
resources kept in step with the trainer, and the resolved spec's round trip through YAML."""

import json
import shutil
from pathlib import Path

import pytest
import yaml

from r1cloud.spec import Spec, SpecError, dump_spec, load_resolved, normalise_name, parse_override
from r1cloud.validate import load_spec
from spec_helpers import MINIMAL, ROOT

FIXTURES = Path(__file__).parent / "fixtures"
BLUEPRINTS = sorted((ROOT / "blueprints").glob("*.yaml"))


def test_library_has_the_promised_blueprints():
    names = {p.name for p in BLUEPRINTS}
    assert {
        "math12k_grpo.yaml",
        "geo3k_grpo.yaml",
        "dapo17k_dapo.yaml",
        "clevr_count_grpo.yaml",
        "quickstart.yaml",
        "math12k_drgrpo.yaml",
        "math12k_gspo.yaml",
        "math12k_reinforcepp.yaml",
        "math12k_rloo.yaml",
        "math12k_dapo.yaml",
        "math12k_ppo.yaml",
        "math12k_grpo_lora.yaml",
        "geo3k_grpo_lora.yaml",
    } <= names


@pytest.mark.parametrize("path", BLUEPRINTS, ids=lambda p: p.stem)
def test_library_blueprint_validates(path, cli, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)  # files resolve relative to the blueprint, not the shell
    r = cli("validate", path)
    assert r.exit_code == 0, r.stderr
    assert not [line for line in r.stderr.splitlines() if line.startswith("warning")], r.stderr
    spec = load_spec(path).spec
    assert spec.name == path.stem.replace("_", "-")
    mt = spec.worker.rollout.multi_turn
    # a conversational data set (tools_calculator and its control) brings its own instructions:
    # no format prompt there
    shown = [f for f in (spec.data.format_prompt, mt.tools) if f]
    assert shown or spec.name.startswith("tools-calculator")
    for f in (*shown, spec.worker.reward.reward_function):
        assert Path(f).is_file(), f


def test_library_blueprint_facts():
    specs = {p.stem: load_spec(p).spec for p in BLUEPRINTS}
    assert specs["math12k_grpo"].worker.actor.model.model_path == "Qwen/Qwen2.5-7B-Instruct"
    assert specs["math12k_grpo"].resources.accelerators == "H100:8"
    assert specs["math12k_grpo"].trainer.n_gpus_per_node == 8
    assert specs["geo3k_grpo"].worker.actor.model.model_path == "Qwen/Qwen2.5-VL-7B-Instruct"
    assert specs["geo3k_grpo"].data.train_files == "hiyouga/geometry3k@train"
    assert specs["dapo17k_dapo"].algorithm.online_filtering
    assert specs["dapo17k_dapo"].worker.actor.clip_ratio_high == 0.28
    dapo = specs["math12k_dapo"]  # the preset filled in what the blueprint left out
    assert dapo.algorithm.online_filtering and dapo.algorithm.disable_kl
    assert (dapo.worker.actor.clip_ratio_low, dapo.worker.actor.clip_ratio_high) == (0.2, 0.28)
    assert dapo.worker.actor.loss_avg_mode == "token" and dapo.algorithm.filter_key == "accuracy"
    ppo = specs["math12k_ppo"]
    assert ppo.algorithm.adv_estimator == "gae" and ppo.worker.critic.model.model_path
    assert ppo.trainer.critic_warmup == 5
    assert specs["clevr_count_grpo"].resources.accelerators == {"A100-80GB": 8, "H100": 8}
    quick = specs["quickstart"]
    assert quick.resources.infra == "local" and quick.trainer.n_gpus_per_node == 2
    assert Path(quick.data.train_files).is_file()


def test_easyr1_example_config_validates_unchanged(cli, monkeypatch):
    monkeypatch.chdir(FIXTURES / "easyr1")  # EasyR1 runs from its repository root
    r = cli("validate", "examples/config.yaml", "--json")
    assert r.exit_code == 0, r.stderr
    # nothing gives wandb a key: the one warning (its offload keys are honoured)
    warnings = r.stderr.splitlines()
    assert len(warnings) == 1 and warnings[0].startswith(
        "warning: trainer.logger: wandb has no WANDB_API_KEY"
    )
    spec = json.loads(r.stdout)
    assert spec["name"] == "qwen2-5-7b-math-grpo"  # from trainer.experiment_name
    assert spec["worker"]["reward"]["reward_function_name"] == "compute_score"
    assert spec["worker"]["reward"]["reward_function"] == str(
        FIXTURES / "easyr1/examples/reward_function/math.py"
    )
    # EasyR1's post_init copies
    assert spec["worker"]["rollout"]["prompt_length"] == 2048
    assert (
        spec["worker"]["actor"]["kl_penalty"] == "low_var_kl"
        and spec["worker"]["actor"]["use_kl_loss"] is True
    )
    assert spec["worker"]["ref"]["micro_batch_size_per_device_for_experience"] == 2
    assert spec["worker"]["actor"]["global_batch_size_per_device"] == 128 * 5 // 8
    assert spec["worker"]["actor"]["model"]["tokenizer_path"] == "Qwen/Qwen2.5-7B-Instruct"


def test_easyr1_command_line_style(cli, monkeypatch):
    """`python -m verl.trainer.main config=examples/config.yaml a.b=c` maps onto validate."""
    monkeypatch.chdir(FIXTURES / "easyr1")
    r = cli(
        "validate",
        "examples/config.yaml",
        "data.train_files=hiyouga/geometry3k@train",
        "worker.actor.model.model_path=Qwen/Qwen2.5-VL-7B-Instruct",
        "trainer.logger=['console','file']",
        'worker.rollout.val_override_config={"n":16,"temperature":1.0,"top_p":0.7}',
        "worker.actor.optim.lr=1.0e-5",
        "algorithm.disable_kl=True",
        "--json",
    )
    assert r.exit_code == 0, r.stderr
    spec = json.loads(r.stdout)
    assert spec["data"]["train_files"] == "hiyouga/geometry3k@train"
    assert spec["trainer"]["logger"] == ["console", "file"]
    assert spec["worker"]["rollout"]["val_override_config"] == {"n": 16, "temperature": 1.0, "top_p": 0.7}
    assert spec["worker"]["actor"]["optim"]["lr"] == 1e-5
    assert spec["algorithm"]["disable_kl"] is True and spec["worker"]["actor"]["disable_kl"] is True


def test_flexai_blueprint_validates_unchanged_with_its_warnings(cli, monkeypatch):
    monkeypatch.chdir(FIXTURES / "flexai")
    r = cli("validate", "code/easyR1/config.yaml", "--json")
    assert r.exit_code == 0, r.stderr
    warnings = r.stderr.strip().splitlines()
    assert any("worker.reward.reward_type: is deprecated" in w for w in warnings)
    assert any("wandb has no WANDB_API_KEY" in w for w in warnings)  # FlexAI passes it at launch
    assert len(warnings) == 2
    spec = json.loads(r.stdout)
    assert spec["worker"]["reward"]["reward_type"] == "batch"
    assert spec["trainer"]["save_checkpoint_path"] == "/output-checkpoint"
    assert spec["data"]["format_prompt"] == str(FIXTURES / "flexai/code/easyR1/format_prompt/math.jinja")


def test_precedence_defaults_base_file_overrides(blueprint):
    base = blueprint(MINIMAL.replace("n: 4", "n: 6"), name="base.yaml")
    path = blueprint("worker:\n  rollout:\n    n: 8\n    temperature: 0.7\n", name="job.yaml")
    spec = load_spec(path, [f"config={base}"]).spec
    assert spec.worker.rollout.n == 8 and spec.worker.rollout.temperature == 0.7  # file beats base
    assert spec.data.rollout_batch_size == 16  # from the base
    assert spec.worker.rollout.top_p == 1.0  # default
    spec = load_spec(path, [f"config={base}", "worker.rollout.n=2"]).spec
    assert spec.worker.rollout.n == 2  # override beats file


@pytest.mark.parametrize(
    "text,key,value",
    [
        ("a.b=1", ("a", "b"), 1),
        ("a.b=1.0e-6", ("a", "b"), 1e-6),
        ("a.b=true", ("a", "b"), True),
        ("a.b=null", ("a", "b"), None),
        ("a.b=['console','file']", ("a", "b"), ["console", "file"]),
        ('a.b=["x", "y"]', ("a", "b"), ["x", "y"]),
        ('a.b={"n":16,"top_p":0.7}', ("a", "b"), {"n": 16, "top_p": 0.7}),
        ("a.b=./x.py:fn", ("a", "b"), "./x.py:fn"),
        ("a.b=x=y", ("a", "b"), "x=y"),
        ("a_b.c-d=text with spaces", ("a_b", "c-d"), "text with spaces"),
        ("a=[unclosed", ("a",), "[unclosed"),
    ],
)
def test_override_values_are_yaml_typed(text, key, value):
    assert parse_override(text) == (key, value)


def test_float_written_without_a_dot_still_is_a_float(blueprint):
    # YAML 1.1 reads 1e-6 as a string; EasyR1 users write it anyway.
    spec = load_spec(blueprint(), ["worker.actor.optim.lr=1e-6", "algorithm.kl_coef=5e-3"]).spec
    assert spec.worker.actor.optim.lr == 1e-6 and spec.algorithm.kl_coef == 5e-3


def test_accelerators_set_the_trainer_and_back(blueprint):
    path = blueprint(MINIMAL.replace("  n_gpus_per_node: 2\n", ""))
    spec = load_spec(
        path,
        [
            "resources.accelerators=A100-80GB:4",
            "resources.num_nodes=2",
            "worker.actor.global_batch_size=16",
            "resources.infra=aws",
        ],
    ).spec
    assert spec.trainer.n_gpus_per_node == 4 and spec.trainer.nnodes == 2
    spec = load_spec(
        path, ["trainer.nnodes=3", "worker.actor.global_batch_size=16", "resources.infra=gcp"]
    ).spec
    assert spec.resources.num_nodes == 3
    spec = load_spec(path, ["resources.accelerators={H100: 2, A100-80GB: 2}"]).spec
    assert spec.trainer.n_gpus_per_node == 2


def test_name_defaults_to_the_normalised_file_stem(blueprint):
    assert load_spec(blueprint(name="Math12k_GRPO.v2.yaml")).spec.name == "math12k-grpo-v2"
    assert load_spec(blueprint(name="a.yaml")).spec.name == "a-job"
    assert load_spec(blueprint(), ["name=my-run"]).spec.name == "my-run"
    assert normalise_name("x" * 80) == "x" * 63
    # EasyR1 configs name their run in trainer.experiment_name: that beats the file's name
    named = MINIMAL.replace("trainer:\n", "trainer:\n  experiment_name: qwen2_5_7b_math_grpo\n")
    assert load_spec(blueprint(named, name="config.yaml")).spec.name == "qwen2-5-7b-math-grpo"
    assert load_spec(blueprint(named, name="config.yaml"), ["name=mine"]).spec.name == "mine"


def test_paths_resolve_from_the_blueprint_folder_then_the_working_directory(blueprint, tmp_path, monkeypatch):
    path = blueprint(
        MINIMAL, name="sub/job.yaml", files={"sub/p.jinja": "{{ content }}", "q.jinja": "{{ content }}"}
    )
    spec = load_spec(path, []).spec
    assert spec.data.format_prompt is None
    spec = load_spec(tmp_path / "sub/job.yaml", ["data.format_prompt=q.jinja"]).spec  # the shell's cwd
    assert spec.data.format_prompt == str(tmp_path / "q.jinja")
    (tmp_path / "sub/job.yaml").write_text(MINIMAL.replace("data:\n", "data:\n  format_prompt: ./p.jinja\n"))
    other = tmp_path / "elsewhere"
    other.mkdir()
    monkeypatch.chdir(other)
    assert load_spec(tmp_path / "sub/job.yaml").spec.data.format_prompt == str(tmp_path / "sub/p.jinja")


def test_local_data_and_model_become_absolute(blueprint, tmp_path):
    path = blueprint(files={"d/train.jsonl": '{"prompt": "q", "answer": "a"}\n' * 16, "m/config.json": "{}"})
    spec = load_spec(path, ["data.train_files=d/train.jsonl@train", "worker.actor.model.model_path=./m"]).spec
    assert spec.data.train_files == f"{tmp_path}/d/train.jsonl@train"
    assert spec.worker.actor.model.model_path == str(tmp_path / "m")
    assert spec.worker.actor.model.tokenizer_path == str(tmp_path / "m")


@pytest.mark.parametrize(
    "path",
    [*BLUEPRINTS, FIXTURES / "flexai/code/easyR1/config.yaml"],
    ids=lambda p: p.parent.name + "/" + p.stem,
)
def test_resolved_spec_round_trips(path, monkeypatch, tmp_path):
    monkeypatch.chdir(FIXTURES / "flexai" if "flexai" in str(path) else tmp_path)
    spec = load_spec(path).spec
    text = dump_spec(spec)
    again = Spec.model_validate(yaml.safe_load(text))
    assert again == spec
    assert dump_spec(again) == text
    # The trainer's view: the run directory holds only the resolved file.
    run = tmp_path / "run"
    run.mkdir(exist_ok=True)
    (run / "spec.yaml").write_text(text)
    assert load_resolved(run / "spec.yaml") == spec
    # ...and the resolved file is itself a valid blueprint that resolves to the same spec.
    assert load_spec(run / "spec.yaml").spec == spec


def test_round_trip_survives_moving_the_blueprint(tmp_path):
    """Resolved paths are absolute: the run directory can live anywhere."""
    src = ROOT / "blueprints/quickstart.yaml"
    spec = load_spec(src).spec
    moved = tmp_path / "runs/x/spec.yaml"
    moved.parent.mkdir(parents=True)
    moved.write_text(dump_spec(spec))
    shutil.copy(moved, tmp_path / "copy.yaml")
    assert load_spec(tmp_path / "copy.yaml").spec == spec


def test_spec_error_lists_problems_programmatically(blueprint):
    with pytest.raises(SpecError) as e:
        load_spec(blueprint(), ["worker.rollout.n=1", "data.rollout_batch_size=0"])
    paths = [p.path for p in e.value.problems]
    assert "data.rollout_batch_size" in paths and "worker.rollout.n" in paths


def test_dapo_preset_sets_what_the_blueprint_leaves_unset(tmp_path, cli):
    """`adv_estimator: dapo` fills DAPO's settings; a value the blueprint gives wins; the resolved
    spec round-trips; validate says what the preset did."""
    bp = tmp_path / "d.yaml"
    bp.write_text(MINIMAL.replace("adv_estimator: grpo", "adv_estimator: dapo"))
    spec = load_spec(bp, ["worker.actor.clip_ratio_high=0.35"], check_files=False).spec
    assert spec.algorithm.online_filtering and spec.algorithm.disable_kl
    assert spec.worker.actor.clip_ratio_high == 0.35 and spec.worker.actor.clip_ratio_low == 0.2
    assert Spec.model_validate(yaml.safe_load(dump_spec(spec))) == spec
    assert not load_spec(
        bp, ["algorithm.online_filtering=false"], check_files=False
    ).spec.algorithm.online_filtering
    r = cli("validate", bp)
    assert r.exit_code == 0, r.stderr
    assert "preset" in r.stdout and "clip-higher" in r.stdout and "dynamic: keep groups" in r.stdout
