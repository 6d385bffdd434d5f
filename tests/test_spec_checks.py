"""Every pre-flight check: its message names the key, the value and the fix; exit code 2."""

import os
from pathlib import Path

import pytest

from spec_helpers import MINIMAL

ASYNC = ("async_training.enable=true", "worker.rollout.n_gpus_per_node=1")

# (overrides applied to the minimal valid blueprint, substrings the one error line must contain)
CHECKS = [
    pytest.param(  # never a silent single node: local nodes need a Ray cluster to spread over
        ["trainer.nnodes=2"],
        ["trainer.nnodes", "2 nodes on local infra need a Ray cluster", "set RAY_ADDRESS=HEAD:6379"],
        id="local-nodes-without-a-cluster",
    ),
    pytest.param(
        ["worker.rollout.temprature=0.5"],
        ["worker.rollout.temprature", "unknown key", "did you mean worker.rollout.temperature?"],
        id="unknown-key-sibling",
    ),
    pytest.param(
        ["worker.actor.n=8"], ["worker.actor.n", "did you mean worker.rollout.n?"], id="unknown-key-elsewhere"
    ),
    pytest.param(
        ["data.train_batch_size=8"],
        ["data.train_batch_size", "did you mean data.rollout_batch_size?"],
        id="unknown-key-verl-alias",
    ),
    pytest.param(["optimizer=adam"], ["optimizer", "unknown key", "top-level key"], id="unknown-top-level"),
    pytest.param(
        ["worker.rollout.n=five"], ["worker.rollout.n", "'five' is not valid", "integer"], id="wrong-type"
    ),
    pytest.param(
        ["worker.rollout.top_p=1.5"],
        ["worker.rollout.top_p", "1.5 is not valid", "less than or equal to 1"],
        id="out-of-range",
    ),
    pytest.param(["data.val_batch_size=0"], ["data.val_batch_size", "must be -1"], id="val-batch-zero"),
    pytest.param(
        ["algorithm.adv_estimator=grpoo"],
        ["algorithm.adv_estimator", "'grpoo' is not allowed", "did you mean 'grpo'?"],
        id="adv-estimator-name",
    ),
    pytest.param(
        ["algorithm.kl_penalty=k3"],
        ["algorithm.kl_penalty", "use one of: kl, abs, mse, low_var_kl"],
        id="kl-penalty-name",
    ),
    pytest.param(
        ["worker.actor.loss_type=gpso"],
        ["worker.actor.loss_type", "did you mean 'gspo'?"],
        id="loss-type-name",
    ),
    pytest.param(
        ["trainer.logger=['console','wandbb']"],
        ["trainer.logger.1", "'wandbb' is not allowed", "did you mean 'wandb'?"],
        id="logger-name",
    ),
    pytest.param(
        ["worker.actor.global_batch_size=5"],
        [
            "worker.actor.global_batch_size",
            "5 does not divide data.rollout_batch_size (16)",
            "global_batch_size=4",
        ],
        id="rollout-divisible",
    ),
    pytest.param(
        ["worker.actor.micro_batch_size_per_device_for_experience=5"],
        ["micro_batch_size_per_device_for_experience", "16 × 4 = 64", "set it to 4"],
        id="experience-divisible",
    ),
    pytest.param(
        ["worker.actor.micro_batch_size_per_device_for_update=3"],
        ["micro_batch_size_per_device_for_update", "16 samples each device", "set it to 4"],
        id="update-divisible",
    ),
    pytest.param(
        ["trainer.n_gpus_per_node=64"],
        ["trainer.n_gpus_per_node", "64 devices", "more than the 32 samples", "use at most 32 devices"],
        id="devices-set-here-more-than-the-batch",
    ),
    pytest.param(
        ["trainer.n_gpus_per_node=64", "worker.actor.global_batch_size=2"],
        ["worker.actor.global_batch_size", "fewer than the 64 data-parallel devices"],
        id="batch-smaller-than-devices",
    ),
    pytest.param(
        ["data.rollout_batch_size=1000000007"],
        ["data.rollout_batch_size", "not a multiple of worker.actor.global_batch_size", "=1000000008"],
        id="huge-prime-batch-named-as-set",
    ),
    pytest.param(
        ["worker.actor.fsdp.enable_cpu_offload=true"],
        ["enable_cpu_offload", "gradient accumulation", "micro_batch_size_per_device_for_update=16"],
        id="offload-accumulation",
    ),
    pytest.param(
        ["worker.rollout.n=1"],
        ["worker.rollout.n", "grpo compares samples within a group", "2 or more"],
        id="grpo-needs-n",
    ),
    pytest.param(
        ["algorithm.adv_estimator=rloo", "worker.rollout.n=1"],
        ["worker.rollout.n", "rloo"],
        id="rloo-needs-n",
    ),
    pytest.param(
        ["worker.rollout.tensor_parallel_size=4", "trainer.n_gpus_per_node=6"],
        ["worker.rollout.tensor_parallel_size", "4 does not divide trainer.n_gpus_per_node (6)"],
        id="tp-divides",
    ),
    pytest.param(
        ["data.max_prompt_length=4096", "data.max_response_length=8192"],
        ["worker.rollout.max_num_batched_tokens", "4096 + 8192 = 12288", "max_num_batched_tokens=12288"],
        id="batched-tokens",
    ),
    pytest.param(
        ['worker.rollout.val_override_config={"temprature": 0.6}'],
        ["val_override_config.temprature", "did you mean 'temperature'?"],
        id="val-override-key",
    ),
    pytest.param(
        ["algorithm.adv_estimator=gae"], ["worker.critic.model.model_path", "critic"], id="gae-needs-critic"
    ),
    pytest.param(
        ["algorithm.kl_penalty=full", "algorithm.use_kl_loss=true"],
        ["algorithm.kl_penalty", "whole vocabulary"],
        id="kl-full",
    ),
    pytest.param(
        ["algorithm.online_filtering=true", "algorithm.filter_low=0.9", "algorithm.filter_high=0.1"],
        ["algorithm.filter_low", "must be below"],
        id="filter-range",
    ),
    pytest.param(
        ["worker.actor.model.model_path=null"],
        ["worker.actor.model.model_path", "is not set"],
        id="model-required",
    ),
    pytest.param(["data.val_files="], ["data.val_files", "validation is on"], id="val-files-required"),
    pytest.param(
        ["worker.reward.reward_function=null"],
        ["worker.reward.reward_function", "is not set"],
        id="reward-required",
    ),
    pytest.param(["name=My_Job"], ["name", "not a job name", "'my-job'"], id="bad-name"),
    pytest.param(
        ["resources.accelerators=H100:4"],
        ["resources.accelerators", "trainer.n_gpus_per_node is 2"],
        id="accels-conflict",
    ),
    pytest.param(
        ["resources.accelerators={H100: 8, A100-80GB: 4}"],
        ["resources.accelerators", "same count"],
        id="accels-alternatives",
    ),
    pytest.param(
        ["resources.accelerators=H100:x"], ["resources.accelerators", "NAME:COUNT"], id="accels-syntax"
    ),
    pytest.param(
        ["resources.num_nodes=2", "trainer.nnodes=4"],
        ["resources.num_nodes", "trainer.nnodes is 4"],
        id="nodes-conflict",
    ),
    pytest.param(["resources.infra=awz"], ["resources.infra", "unknown infra 'awz'"], id="infra"),
    pytest.param(
        ["secrets={HF_TOKEN: hf_abc}"],
        ["secrets", "must not be written in a blueprint", "--secret"],
        id="secret-value-in-file",
    ),
    pytest.param(
        ["secrets=[HF_TOKEN]", "envs={HF_TOKEN: x}"], ["envs.HF_TOKEN", "also a secret"], id="secret-in-envs"
    ),
    pytest.param(
        ["secrets=[HF_TOKEN]"],
        ["secrets.HF_TOKEN", "is not set", "--secret HF_TOKEN=VALUE"],
        id="secret-missing",
    ),
    pytest.param(["envs={1BAD: x}"], ["envs", "not an environment variable name"], id="env-name"),
    pytest.param(
        ["data.train_files=[a/b@train, c/d@train]", "data.train_files_probs=[1.0]"],
        ["data.train_files_probs", "1 weight(s) for 2 data set(s)"],
        id="mix-probs-count",
    ),
    pytest.param(
        ["data.train_files=[a/b@train, c/d@train]", "data.train_files_probs=[1.0, 0]"],
        ["data.train_files_probs", "must be positive"],
        id="mix-probs-positive",
    ),
    pytest.param(
        ["data.train_files=[a/b@train, ./nowhere.jsonl]"],
        ["data.train_files", "nowhere.jsonl"],
        id="mix-missing-file",
    ),
    pytest.param(["worker.rollout.n"], ["is not an override", "key.path=value"], id="override-syntax"),
    pytest.param(
        ["worker.actor.model.lora.rank=600"],
        ["worker.actor.model.lora.rank", "largest adapter rank vLLM serves", "lora.merge=true"],
        id="lora-rank-beyond-vllm",
    ),
    pytest.param(
        ["worker.actor.model.lora.merge=true"],
        ["worker.actor.model.lora.merge", "no effect without LoRA"],
        id="lora-merge-without-lora",
    ),
    pytest.param(
        ["worker.actor.model.lora.rank=8", "worker.actor.model.lora.merge=false", "worker.rollout.name=hf"],
        ["worker.actor.model.lora.merge", "rollout engine is hf"],
        id="lora-adapter-sync-needs-vllm",
    ),
    pytest.param(
        ["worker.critic.model.lora.merge=false"],
        ["worker.critic.model.lora.merge", "never synced"],
        id="lora-merge-on-the-critic",
    ),
    pytest.param(
        ["worker.actor.model.lora.load_in_4bit=true"],
        ["worker.actor.model.lora.load_in_4bit", "set worker.actor.model.lora.rank"],
        id="qlora-without-lora",
    ),
    pytest.param(
        [
            "worker.actor.model.lora.rank=8",
            "worker.actor.model.lora.load_in_4bit=true",
            "worker.actor.model.lora.merge=false",
        ],
        ["worker.actor.model.lora.merge", "not supported with a 4-bit base yet"],
        id="qlora-adapter-sync",
    ),
    pytest.param(
        ["worker.critic.model.lora.load_in_4bit=true"],
        ["worker.critic.model.lora.load_in_4bit", "not supported yet"],
        id="qlora-critic",
    ),
    pytest.param(
        ["worker.actor.model.freeze_language_model=true", "worker.actor.model.freeze_vision_tower=true"],
        ["worker.actor.model.freeze_language_model", "keep one of them"],
        id="freeze-both",
    ),
    pytest.param(
        ["worker.actor.model.freeze_language_model=true", "worker.actor.model.lora.rank=8"],
        ["worker.actor.model.freeze_language_model", "not supported with LoRA"],
        id="freeze-language-model-with-lora",
    ),
    pytest.param(
        ["worker.critic.model.freeze_language_model=true"],
        ["worker.critic.model.freeze_language_model", "not supported for the critic"],
        id="freeze-language-model-of-the-critic",
    ),
    pytest.param(
        ["async_training.max_staleness=1"],
        ["async_training.max_staleness", "is set while async_training.enable is false"],
        id="async-key-while-off",
    ),
    pytest.param(
        ["worker.rollout.n_gpus_per_node=2"],
        ["worker.rollout.n_gpus_per_node", "for async_training.enable: true"],
        id="rollout-devices-while-sync",
    ),
    pytest.param(
        ["async_training.enable=true"],
        ["worker.rollout.n_gpus_per_node", "needs rollout devices", "set it to 1 or more"],
        id="async-pool-of-zero",
    ),
    pytest.param(
        [*ASYNC, "async_training.max_staleness=-1"],
        ["async_training.max_staleness", "greater than or equal to 0"],
        id="async-bound-below-0",
    ),
    pytest.param(
        [*ASYNC, "async_training.max_staleness=1", "async_training.trigger_parameter_sync_step=4"],
        ["async_training.max_staleness", "a bound of 1 cannot be kept with a push every 4", "at least 3"],
        id="async-bound-below-the-push-interval",
    ),
    pytest.param(
        [*ASYNC, "algorithm.adv_estimator=remax"],
        ["algorithm.adv_estimator", "not supported with async_training"],
        id="async-remax",
    ),
    pytest.param(
        [*ASYNC, "algorithm.online_filtering=true"],
        ["algorithm.online_filtering", "not supported with async_training"],
        id="async-online-filtering",
    ),
    pytest.param(
        [*ASYNC, "async_training.partial_rollout=true"],
        ["async_training.partial_rollout", "not supported yet"],
        id="async-partial-rollout",
    ),
    pytest.param(
        [*ASYNC, "worker.rollout.tensor_parallel_size=2"],
        ["worker.rollout.tensor_parallel_size", "does not divide worker.rollout.n_gpus_per_node (1)"],
        id="async-tensor-parallel-over-the-rollout-pool",
    ),
    pytest.param(
        [*ASYNC, "trainer.critic_warmup=2"],
        ["trainer.critic_warmup", "not supported with async_training"],
        id="async-critic-warmup",
    ),
    pytest.param(
        [*ASYNC, "resources.infra=aws"],
        ["async_training.enable", "runs on local infra only so far"],
        id="async-cloud",
    ),
]


@pytest.mark.parametrize("overrides,expected", CHECKS)
def test_check_reports_one_clear_line(blueprint, cli, overrides, expected):
    path = blueprint()
    r = cli("validate", path, *overrides)
    assert r.exit_code == 2, r.stdout
    lines = [line for line in r.stderr.splitlines() if line.startswith("  ✗ ")]
    assert lines, r.stderr
    hit = [line for line in lines if all(s in line for s in expected)]
    assert hit, f"no line has all of {expected}:\n{r.stderr}"
    assert "Traceback" not in r.stderr + r.stdout


def test_minimal_blueprint_is_valid(blueprint, cli):
    r = cli("validate", blueprint())
    assert r.exit_code == 0, r.stderr
    assert "is valid" in r.stdout


def test_all_problems_at_once_with_file_and_line(blueprint, cli):
    path = blueprint(
        MINIMAL.replace("n: 4", "n: four").replace(
            "adv_estimator: grpo", "adv_estimator: grpo\n  kl_coeff: 0.1"
        )
        + "resources:\n  accelerators: H100:8\n"
    )
    r = cli("validate", path, "worker.actor.global_batch_size=7")
    assert r.exit_code == 2
    lines = [line for line in r.stderr.splitlines() if line.startswith("  ✗ ")]
    text = "\n".join(lines)
    assert "worker.rollout.n: 'four' is not valid" in text and "(job.yaml:17)" in text
    assert "algorithm.kl_coeff: unknown key" in text and "(job.yaml:8)" in text
    assert "resources.accelerators: means 8 per node, but trainer.n_gpus_per_node is 2" in text
    assert "worker.actor.global_batch_size: 7 does not divide" in text and "(command line)" in text
    assert "has 4 problems" in r.stderr


def test_a_bad_value_does_not_cause_a_second_spurious_error(blueprint, cli):
    # n=five is dropped to check the rest; the rest must not then complain that n=1 is too small.
    r = cli("validate", blueprint(), "worker.rollout.n=five")
    assert "has 1 problem:" in r.stderr


def test_missing_files_are_errors_not_silent_none(blueprint, cli):
    path = blueprint(
        MINIMAL.replace("data:\n", "data:\n  format_prompt: ./prompts/mth.jinja\n"),
        files={"prompts/math.jinja": "{{ content }}"},
    )
    r = cli("validate", path)
    assert r.exit_code == 2
    assert "data.format_prompt: file not found: ./prompts/mth.jinja" in r.stderr
    assert "did you mean" in r.stderr and "prompts/math.jinja" in r.stderr


def test_missing_local_data_and_model(blueprint, cli):
    path = blueprint(
        MINIMAL.replace("hiyouga/math12k@train", "./data/train.jsonl").replace(
            "Qwen/Qwen2.5-0.5B-Instruct", "./models/tiny"
        )
    )
    r = cli("validate", path)
    assert r.exit_code == 2
    assert "data.train_files: not found: ./data/train.jsonl" in r.stderr
    assert "worker.actor.model.model_path: folder not found: ./models/tiny" in r.stderr


def test_missing_image_dir_and_chat_template(blueprint, cli):
    r = cli("validate", blueprint(), "data.image_dir=./imgs", "data.override_chat_template=./tpl.jinja")
    assert r.exit_code == 2
    assert "data.image_dir: folder not found: ./imgs" in r.stderr
    assert "data.override_chat_template: file not found: ./tpl.jinja" in r.stderr


@pytest.mark.parametrize(
    "source,fn,kwargs,expected",
    [
        ("def main(x):\n    return []\n", "compute_score", "{}", "has no function 'compute_score'"),
        ("def compute_scor(x):\n    return []\n", "compute_score", "{}", "did you mean compute_scor?"),
        ("def compute_score(:\n", "compute_score", "{}", "Python syntax error"),
        ("def compute_score():\n    return []\n", "compute_score", "{}", "takes no argument"),
        (
            "def compute_score(xs, format_weight=0.1):\n    return []\n",
            "compute_score",
            '{"fmt_weight": 1}',
            "does not accept fmt_weight",
        ),
        ("def compute_score(xs, max_len):\n    return []\n", "compute_score", "{}", "needs max_len"),
        (
            "REWARD_TYPE = 'batched'\ndef compute_score(xs):\n    return []\n",
            "compute_score",
            "{}",
            "REWARD_TYPE is 'batched'",
        ),
    ],
)
def test_reward_function_file_checks(blueprint, cli, source, fn, kwargs, expected):
    path = blueprint(files={"reward.py": source})
    r = cli(
        "validate",
        path,
        f"worker.reward.reward_function=./reward.py:{fn}",
        f"worker.reward.reward_function_kwargs={kwargs}",
    )
    assert r.exit_code == 2
    assert expected in r.stderr, r.stderr


def test_reward_function_is_imported_in_a_child_process_only(blueprint, cli, tmp_path):
    """validate imports the reward file as the trainer would, but never in its own process."""
    path = blueprint(
        files={"reward.py": f"import os\nopen({str(tmp_path / 'ran')!r}, 'w').write(str(os.getpid()))\n"
               "def main(xs):\n    return []\n"}
    )  # fmt: skip
    r = cli("validate", path, "worker.reward.reward_function=./reward.py")
    assert r.exit_code == 0, r.stderr
    assert int((tmp_path / "ran").read_text()) != os.getpid()


@pytest.mark.parametrize(
    "code, said",
    [
        # EasyR1's reward_function/math.py imports mathruler at the top; a reward may import lazily
        ("from mathruler_zz.grader import grade_answer\ndef main(xs):\n    return []\n",
         "reward.py:1 imports mathruler_zz, which is not installed here: pip install the package that provides it"),
        ("def main(xs):\n    import r1_scorer_zz\n    return []\n",
         "reward.py:2 imports r1_scorer_zz, which is not installed here"),
        ("import json\nraise RuntimeError('no API key')\ndef main(xs):\n    return []\n",
         "reward.py:2: importing it failed: RuntimeError: no API key"),
        ("import os\nprint('Traceback (most recent call last):')\nos._exit(3)\ndef main(xs):\n    return []\n",
         "reward.py: importing it failed: exit code 3"),
        ("import time\ntime.sleep(60)\ndef main(xs):\n    return []\n",
         "reward.py: importing it took over 2 s: move slow work at its top level into a function"),
    ],
)  # fmt: skip
def test_a_reward_function_that_would_not_import_on_the_job_is_one_line(
    blueprint, cli, monkeypatch, code, said
):
    from r1cloud.validate import imports

    monkeypatch.setattr(imports, "TIME_LIMIT", 2)
    path = blueprint(files={"reward.py": code})
    r = cli("validate", path, "worker.reward.reward_function=./reward.py")
    assert r.exit_code == 2 and "Traceback" not in r.stderr, r.stderr
    (line,) = [x for x in r.stderr.splitlines() if "worker.reward.reward_function" in x]
    assert said in line, line


def test_a_cloud_job_needs_its_reward_packages_in_requirements_txt(blueprint, cli, tmp_path):
    """EasyR1's own math.py imports mathruler, installed here but not by r1cloud[train]: a cloud
    node would not have it, so validate says where to list it; listed, the blueprint is valid."""
    easyr1 = Path(__file__).parent / "fixtures/easyr1/examples/reward_function/math.py"
    (tmp_path / "math.py").write_text(easyr1.read_text())
    text = MINIMAL + "resources: {infra: aws, accelerators: H100:2, bucket: s3://ckpts}\n"
    path = blueprint(text)
    args = ("validate", path, "worker.reward.reward_function=./math.py:compute_score")
    assert cli(*args, "resources.infra=local").exit_code == 0  # installed here
    r = cli(*args)
    assert r.exit_code == 2, r.stderr
    assert (
        f"math.py:3 imports mathruler, which a cloud node does not install (it installs r1cloud[train] and the "
        f"job folder's requirements.txt): add mathruler to {tmp_path / 'requirements.txt'}"
    ) in r.stderr
    (tmp_path / "requirements.txt").write_text("# graders\nmathruler==0.1.0  # EasyR1's\n")
    r = cli(*args)
    assert r.exit_code == 0, r.stderr
    # what r1cloud[train] brings (through its train-libs extra) needs no listing
    (tmp_path / "math.py").write_text(easyr1.read_text() + "\nimport peft\nimport cv2\nimport transformers\n")
    r = cli(*args)
    assert r.exit_code == 0, r.stderr
    # a package requirements.txt lists that r1cloud[train] also brings keeps its dependencies
    # (tokenizers comes with transformers); an optional import and one not installed here pass
    (tmp_path / "requirements.txt").write_text("mathruler\ntransformers>=4.56\n")
    (tmp_path / "math.py").write_text(
        easyr1.read_text()
        + "\nimport tokenizers\ntry:\n    import cv2_zz\nexcept ImportError:\n    cv2_zz = None\n"
    )
    r = cli(*args)
    assert r.exit_code == 0, r.stderr
    r = cli(*args, "resources.infra=local")  # here too: the optional import is not required
    assert r.exit_code == 0, r.stderr


def test_reward_function_kwargs_and_star_kwargs_accepted(blueprint, cli):
    path = blueprint(files={"reward.py": "def f(xs, **kw):\n    return []\n"})
    r = cli(
        "validate",
        path,
        "worker.reward.reward_function=./reward.py:f",
        'worker.reward.reward_function_kwargs={"anything": 1}',
    )
    assert r.exit_code == 0, r.stderr


def test_a_mixture_of_data_sets_validates(blueprint, cli):
    r = cli(
        "validate", blueprint(), "data.train_files=[hiyouga/math12k@train, hiyouga/geometry3k@train]",
        "data.train_files_probs=[0.7, 0.3]",
    )  # fmt: skip
    assert r.exit_code == 0, r.stderr
    assert "hiyouga/math12k@train + hiyouga/geometry3k@train" in r.stdout


def test_remote_reward_url_is_not_a_file(blueprint, cli):
    r = cli("validate", blueprint(), "worker.reward.reward_function=http://127.0.0.1:9000/score")
    assert r.exit_code == 0, r.stderr


def test_bad_jinja_template(blueprint, cli):
    path = blueprint(files={"p.jinja": "{{ content | trim }"})
    r = cli("validate", path, "data.format_prompt=./p.jinja")
    assert r.exit_code == 2
    assert "not a valid Jinja template" in r.stderr


def test_template_without_content_is_a_warning(blueprint, cli):
    path = blueprint(files={"p.jinja": "Always the same text"})
    r = cli("validate", path, "data.format_prompt=./p.jinja")
    assert r.exit_code == 0
    assert "warning:" in r.stderr and "never uses {{ content }}" in r.stderr


@pytest.mark.parametrize(
    "text,expected",
    [
        ("data: [1, 2\n", "not valid YAML"),
        ("- a\n- b\n", "a mapping of keys"),
        ("data:\n  seed: 1\n  seed: 2\n", "data.seed: is written twice"),
    ],
)
def test_bad_yaml_file(blueprint, cli, text, expected):
    r = cli("validate", blueprint(text))
    assert r.exit_code == 2
    assert expected in r.stderr
    assert "job.yaml" in r.stderr


def test_missing_blueprint_file(cli, tmp_path):
    r = cli("validate", tmp_path / "nope.yaml")
    assert r.exit_code == 2
    assert "nope.yaml does not exist" in r.stderr


def test_secret_from_flag_or_environment(blueprint, cli):
    path = blueprint()
    assert cli("validate", path, "secrets=[HF_TOKEN]", "--secret", "HF_TOKEN=hf_x").exit_code == 0
    assert cli("validate", path, "secrets=[HF_TOKEN]", env={"HF_TOKEN": "hf_y"}).exit_code == 0
    r = cli("validate", path, "--secret", "HF_TOKEN")
    assert r.exit_code == 2 and "HF_TOKEN is not set in the environment" in r.stderr


def test_secret_values_never_reach_the_resolved_spec(blueprint, cli):
    r = cli("validate", blueprint(), "secrets=[HF_TOKEN]", "--json", "--secret", "HF_TOKEN=hf_s3cr3t_value")
    assert r.exit_code == 0, r.stderr
    assert "HF_TOKEN" in r.stdout and "hf_s3cr3t_value" not in r.stdout


def test_deprecation_warning_for_legacy_keys(blueprint, cli):
    r = cli(
        "validate",
        blueprint(),
        "worker.reward.reward_type=batch",
        "worker.actor.optim.warmup_style=cosine",
        "--json",
    )
    assert r.exit_code == 0, r.stderr
    warnings = [line for line in r.stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 2
    assert any(
        "worker.actor.optim.warmup_style: is deprecated" in w and "lr_scheduler_type" in w for w in warnings
    )
    assert any("worker.reward.reward_type: is deprecated" in w for w in warnings)
    assert '"lr_scheduler_type": "cosine"' in r.stdout


@pytest.mark.parametrize(
    "overrides,warned",
    [
        (["trainer.logger=['console','wandb']"], "wandb has no WANDB_API_KEY"),
        (["trainer.logger=['console','wandb']", "envs.WANDB_MODE=offline"], None),
        (["trainer.logger=['console','wandb']", "secrets=[WANDB_API_KEY]"], None),
        (["trainer.logger=['swanlab']"], "swanlab has no SWANLAB_API_KEY"),
        (["trainer.logger=['swanlab']", "envs.SWANLAB_MODE=local"], None),
        (
            ["trainer.logger=['mlflow']"],
            "mlflow has no MLFLOW_TRACKING_URI: it logs to mlflow.db in the run folder",
        ),
        (["trainer.logger=['mlflow']", "envs.MLFLOW_TRACKING_URI=http://mlflow:5000"], None),
    ],
)
def test_an_online_tracker_without_a_key_is_a_warning(
    blueprint, cli, monkeypatch, tmp_path, overrides, warned
):
    for name in ("WANDB_API_KEY", "WANDB_MODE", "SWANLAB_API_KEY", "SWANLAB_MODE", "MLFLOW_TRACKING_URI"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc from `wandb login`
    r = cli("validate", blueprint(), *overrides, "--secret", "WANDB_API_KEY=x")
    assert r.exit_code == 0, r.stderr
    warnings = [line for line in r.stderr.splitlines() if line.startswith("warning: trainer.logger")]
    assert [warned in w for w in warnings] == ([True] if warned else [])


def test_easyr1s_off_values_are_accepted_with_easyr1s_meaning(blueprint, cli):
    """EasyR1 reads 0 or less as off (val_freq, save_freq), no limit (save_limit), none
    (val_generations_to_log); its dual clip takes C = 1."""
    r = cli(
        "validate",
        blueprint(),
        "trainer.val_freq=0",
        "trainer.save_freq=0",
        "trainer.save_limit=0",
        "trainer.val_generations_to_log=-1",
        "worker.actor.clip_ratio_dual=1.0",
        "--json",
    )
    assert r.exit_code == 0, r.stderr


@pytest.mark.parametrize(
    "setting,ok",
    [
        ('{"min_p": 0.05, "repetition_penalty": 1.1, "presence_penalty": -0.5, "min_tokens": 4}', True),
        ('{"min_p": 1.5}', False),
        ('{"frequency_penalty": 3}', False),
        ('{"repetition_penalty": "high"}', False),
        ('{"repetition_penalty": 0}', False),
        ('{"min_tokens": 2.5}', False),
        ('{"min_tokens": 100000}', False),
    ],
)
def test_val_override_config_takes_vllms_sampling_fields_in_range(blueprint, cli, setting, ok):
    r = cli("validate", blueprint(), f"worker.rollout.val_override_config={setting}")
    assert r.exit_code == (0 if ok else 2), r.stderr
    if not ok:
        assert "worker.rollout.val_override_config." in r.stderr and "is not valid: must be a" in r.stderr


def test_an_adaptive_kl_beside_a_kl_loss_is_said_to_have_no_effect(blueprint, cli):
    """EasyR1 (b44b311) verl/trainer/ray_trainer.py:635 applies its KL controller only when
    use_kl_loss is false: an adaptive controller beside a KL loss changes nothing, so validate says
    so (a warning: the run is still valid), and says nothing with the KL in the reward."""
    r = cli("validate", blueprint(), "algorithm.kl_type=adaptive", "algorithm.use_kl_loss=true")
    assert r.exit_code == 0, r.stderr
    assert "warning: algorithm.kl_type: 'adaptive' has no effect with use_kl_loss: true" in r.stderr
    r = cli("validate", blueprint(), "algorithm.kl_type=adaptive", "algorithm.use_kl_loss=false")
    assert r.exit_code == 0 and "algorithm.kl_type" not in r.stderr, r.stderr


def test_a_critic_tokenizer_that_maps_tokens_otherwise_is_refused(blueprint, cli, tmp_path):
    """worker.critic.model.tokenizer_path: the critic scores the actor's token ids, so its own
    tokenizer must map tokens as the actor's does (EasyR1 loads it for the critic's config and
    checkpoint, fsdp_workers.py:167-184, and never checks)."""
    import json

    def folder(name: str, vocab: dict) -> Path:
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps({"max_position_embeddings": 4096}))
        tok = {"model": {"type": "BPE", "vocab": vocab}, "added_tokens": [{"id": 3, "content": "<eos>"}]}
        (tmp_path / name / "tokenizer.json").write_text(json.dumps(tok))
        return tmp_path / name

    actor = folder("actor", {"a": 0, "b": 1, "c": 2})
    same, other = folder("same", {"a": 0, "b": 1, "c": 2}), folder("other", {"a": 0, "c": 1, "b": 2})
    args = ("validate", blueprint(), f"worker.actor.model.model_path={actor}", "algorithm.adv_estimator=gae",
            f"worker.critic.model.model_path={actor}", "worker.critic.global_batch_size=8")  # fmt: skip
    assert cli(*args, f"worker.critic.model.tokenizer_path={same}").exit_code == 0
    r = cli(*args, f"worker.critic.model.tokenizer_path={other}")
    assert (
        r.exit_code == 2
        and (
            f"worker.critic.model.tokenizer_path: {other} maps tokens to ids unlike the actor's tokenizer (4 vs 4 "
            "tokens): the critic scores the actor's token ids; give it the actor's tokenizer"
        )
        in r.stderr
    ), r.stderr


def test_local_nodes_with_a_ray_cluster_validate(blueprint, cli, monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")  # group.py then spreads one bundle per node
    r = cli("validate", blueprint(), "trainer.nnodes=2")
    assert r.exit_code == 0, r.stderr
    assert "× 2 nodes" in r.stdout


def test_a_tracker_not_installed_here_says_how_to_validate_without_it(blueprint, cli, monkeypatch):
    """EasyR1's examples log to wandb; without it installed, the refusal gives the install line and
    the override that validates (and runs) the example without it. wandb is installed for the
    tests, so its absence is faked at the one lookup validate makes."""
    import importlib.util

    from r1cloud.validate import checks

    real = importlib.util.find_spec
    monkeypatch.setattr(
        checks.importlib.util, "find_spec", lambda n, *a: None if n == "wandb" else real(n, *a)
    )
    path = blueprint()
    r = cli("validate", path, "trainer.logger=['console','wandb']", env={"WANDB_MODE": "offline"})
    assert r.exit_code == 2
    assert (
        "trainer.logger: names wandb, which is not installed here: pip install wandb, or run without it: "
        "trainer.logger=['console']"
    ) in r.stderr, r.stderr
    assert cli("validate", path, "trainer.logger=['console']").exit_code == 0


def test_the_summary_says_how_the_actor_is_sharded(cli):
    """validate prints hybrid sharding and Ulysses groups when on, and no line when off."""
    from spec_helpers import ROOT

    bp = ROOT / "blueprints" / "dapo17k_dapo.yaml"  # EasyR1's ulysses_size 8 on 8 GPUs
    r = cli("validate", bp)
    assert (
        r.exit_code == 0
        and "sharding   Ulysses, each row split over 8 devices (1 data-parallel group)" in r.stdout
    )
    r = cli("validate", bp, "worker.actor.fsdp.fsdp_size=4", "worker.actor.ulysses_size=2")
    assert (
        "sharding   hybrid FSDP, shards in groups of 4 × 2 replicas; Ulysses, each row split over 2 devices (4 "
        in r.stdout
    )
    assert "sharding" not in cli("validate", bp, "worker.actor.ulysses_size=1").stdout


def test_the_summary_gives_the_asynchronous_split(blueprint, cli):
    """validate prints which devices generate and which train, the bound and the push; none when off."""
    path = blueprint()
    r = cli("validate", path, *ASYNC, "async_training.staleness_threshold=0.5",
            "async_training.trigger_parameter_sync_step=2")  # fmt: skip
    assert r.exit_code == 0, r.stderr
    assert (
        "async      1 device(s) generate, 2 train; samples at most 2 update(s) old, weights pushed every 2 "
        "updates; the PPO ratio against the trainer's log-probs" in r.stdout
    )
    assert "local: 3 local worker slots" in r.stdout  # the rollout pool runs beside the trainers
    assert "async " not in cli("validate", path).stdout
