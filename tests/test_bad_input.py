"""Bad input and damaged state, through the CLI: one clear line and exit 2, or the damaged part
shown as damaged while everything else works — never `internal error`, never a hang, never lost
data. (Each case names the cause it checks.)"""

import json
import time
from dataclasses import asdict
from pathlib import Path

import pytest

from r1cloud.core.jobstore import Job


@pytest.fixture
def store(tmp_path, monkeypatch):
    """A job store holding one good finished job (`good`, its metrics.jsonl's last line cut by a
    kill mid-write) and six damaged ones."""
    home = tmp_path / "home"
    monkeypatch.setenv("R1CLOUD_HOME", str(home))
    jobs = home / "jobs"

    def job(name: str, record, spec: str | None = None):
        (jobs / name).mkdir(parents=True)
        text = record if isinstance(record, str) else json.dumps(record)
        (jobs / name / "job.json").write_text(text)
        if spec is not None:
            (jobs / name / "spec.yaml").write_text(spec)

    now = time.time()
    good = asdict(Job("good", status="SUCCEEDED", created_at=now, started_at=now, ended_at=now + 5))
    job("good", good)
    lines = [json.dumps({"step": s, "reward/overall": s / 10}) for s in (1, 2)]
    (jobs / "good" / "metrics.jsonl").write_text("\n".join(lines) + '\n{"step": 3, "rewa')
    job("listed", "[1, 2]")
    job("broken", "{broken")
    job("typed", json.dumps({**good, "name": "typed", "status": 5}))
    job("noname", {k: v for k, v in good.items() if k != "name"})
    job("elsewhere", {**good, "name": "../evil"})  # a name not its folder's: no path is built from it
    job("badspec", {**good, "name": "badspec"}, spec="a: [\n")
    return jobs


def test_damaged_jobs_are_listed_as_damaged_and_the_others_as_usual(cli, store):
    r = cli("jobs")
    assert r.exit_code == 0, r.stderr
    rows = {line.split()[0]: line for line in r.stdout.splitlines()[1:] if line.strip()}
    assert (
        "SUCCEEDED" in rows["good"] and "2" in rows["good"] and "0.200" in rows["good"]
    )  # the cut line skipped
    assert all("DAMAGED" in rows[n] for n in ("listed", "broken", "typed", "noname", "elsewhere"))
    assert (
        "listed: job.json holds a JSON list" in r.stderr and "broken: job.json is not valid JSON" in r.stderr
    )
    assert "typed: job.json has status of the wrong type" in r.stderr
    assert "noname: job.json has no name" in r.stderr and "elsewhere: job.json names '../evil'" in r.stderr


@pytest.mark.parametrize("command", ["status", "logs", "checkpoints", "stop", "plot"])
@pytest.mark.parametrize("name", ["listed", "broken", "typed", "noname", "elsewhere"])
def test_a_damaged_job_is_one_line(cli, store, command, name):
    r = cli(command, name)
    assert r.exit_code == 2, r.stdout + r.stderr
    assert f"error: job {name!r} is damaged" in r.stderr and str(store / name) in r.stderr
    assert (store / name / "job.json").exists()  # nothing removed


@pytest.mark.parametrize("command", ["logs", "checkpoints", "stop", "plot"])
def test_with_every_job_damaged_a_command_without_a_name_says_so(cli, store, command):
    import shutil

    for name in ("good", "badspec"):
        shutil.rmtree(store / name)
    r = cli(command)
    assert r.exit_code == 2 and "error: no job to show: " in r.stderr and "noname" in r.stderr, r.stderr


def test_a_damaged_spec_is_said_and_the_rest_shown(cli, store):
    r = cli("status", "badspec")
    assert r.exit_code == 0 and "spec.yaml cannot be read" in r.stdout and "SUCCEEDED" in r.stdout
    r = cli("checkpoints", "badspec")  # the default checkpoint folder is where it looks
    assert r.exit_code == 0 and "no checkpoints yet" in r.stdout
    r = cli("status", "good")
    assert r.exit_code == 0 and "step       2/?" in r.stdout


@pytest.mark.parametrize(
    "args,said",
    [
        (["train", "{bp}", "trainer.n_gpus_per_node=999999999989", "--dry-run"], "trainer.n_gpus_per_node: 999999999989 devices"),
        (["train", "{bp}", "--accels", "999999999989", "--dry-run"], "Invalid value for '--accels'"),
        (["validate", "{bp}", "data.rollout_batch_size=1000000007"], "data.rollout_batch_size: 1000000007 is not"),
        (["validate", "{bp}", "worker.actor.micro_batch_size_per_device_for_experience=999999937"],
         "micro_batch_size_per_device_for_experience: 999999937 does not divide"),
    ],
)  # fmt: skip
def test_huge_counts_end_at_once_naming_the_field_set(tmp_path, args, said):
    """These once looped over every integer below the count looking for a divisor."""
    import subprocess
    import sys
    from pathlib import Path

    from spec_helpers import ROOT

    r1cloud = str(Path(sys.executable).parent / "r1cloud")
    argv = [a.format(bp=ROOT / "blueprints" / "quickstart.yaml") for a in args]
    r = subprocess.run([r1cloud, *argv], capture_output=True, text=True, timeout=60,
                       env={**__import__("os").environ, "R1CLOUD_HOME": str(tmp_path)})  # fmt: skip
    assert r.returncode == 2 and said in r.stderr, r.stderr


NO_AWS = {"AWS_ACCESS_KEY_ID": "", "AWS_SECRET_ACCESS_KEY": "", "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent",
          "AWS_CONFIG_FILE": "/nonexistent"}  # fmt: skip
OFFLINE = {"AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "y", "AWS_ENDPOINT_URL": "http://127.0.0.1:9",
           "AWS_MAX_ATTEMPTS": "1"}  # fmt: skip


@pytest.mark.parametrize("command", [["checkpoints"], ["merge"], ["serve", "-c"], ["chat"], ["plot"]])
@pytest.mark.parametrize(
    "url,env,said",
    [
        ("s3://bucket/run", NO_AWS, "cannot read s3://bucket/run: no credentials"),
        ("s3://bucket/run", OFFLINE, "cannot reach s3://bucket/run"),
        ("foo://bucket/run", {}, "foo://bucket/run: unknown protocol foo://"),
        ("gs://bucket/run", {}, "gs://bucket/run: reading gs:// needs gcsfs"),
    ],
    ids=["no-credentials", "unreachable", "unknown-protocol", "missing-package"],
)
def test_a_bucket_url_that_cannot_be_read_is_one_line(tmp_path, monkeypatch, command, url, env, said):
    """A fake only where nothing else can exist here: no network and a closed port stand in for a
    cloud's bucket."""
    import importlib.util
    import subprocess
    import sys
    from pathlib import Path

    if url.startswith("gs://") and importlib.util.find_spec("gcsfs"):
        pytest.skip("gcsfs is installed here")
    r1cloud = str(Path(sys.executable).parent / "r1cloud")
    environ = {**__import__("os").environ, "R1CLOUD_HOME": str(tmp_path), **env}
    environ.pop("AWS_PROFILE", None)
    r = subprocess.run([r1cloud, *command, url], capture_output=True, text=True, timeout=120, env=environ)
    assert r.returncode == 2 and said in r.stderr and "internal error" not in r.stderr, r.stderr


def _quickstart(tmp_path):
    from spec_helpers import ROOT

    text = (ROOT / "blueprints" / "quickstart.yaml").read_text().replace("../", f"{ROOT}/")
    (tmp_path / "q.yaml").write_text(text)
    return tmp_path / "q.yaml"


@pytest.mark.parametrize(
    "make,args,said",
    [
        (lambda d: d / ("a" * 300 + ".yaml"), [], "File name too long"),
        (lambda d: "~nosuchuser9/x.yaml", [], "~nosuchuser9/x.yaml does not exist"),
        (lambda d: _write(d, "deep.yaml", "a: " + "[" * 1200 + "]" * 1200), [], "nested too deeply"),
        (lambda d: _write(d, "nul.yaml", "name: x\x00y\n"), [], "unacceptable character #x0000"),
        (lambda d: _write(d, "bell.yaml", "name: x\x07y\n"), [], "unacceptable character #x0007"),
        (_quickstart, ["data.format_prompt=" + "b" * 300], "has a part longer than 255 bytes"),
        (_quickstart, ['data.format_prompt="a\\0b"'], "holds a control character"),
        (_quickstart, ["worker.reward.reward_function=http://[::1"], "is not a valid URL (Invalid IPv6 URL)"),
        (_quickstart, ["worker.reward.reward_function=http://h:abc/x"], "is not a valid URL (Port could not"),
        (_quickstart, ["--secret", "HF_TOKEN="], "--secret HF_TOKEN=: the value is empty"),
    ],
    ids=["long-name", "unknown-user", "deep-yaml", "nul", "control", "long-part", "nul-in-value",
         "ipv6-url", "port-url", "empty-secret"],
)  # fmt: skip
def test_malformed_paths_files_and_values_are_one_line(cli, tmp_path, monkeypatch, make, args, said):
    monkeypatch.chdir(tmp_path)
    r = cli("validate", make(tmp_path), *args)
    assert r.exit_code == 2 and said in r.stderr, r.stderr
    assert all(len(line) < 400 for line in r.stderr.splitlines()), r.stderr


def _write(d, name, text):
    (d / name).write_text(text)
    return d / name


def test_a_yaml_merge_key_may_override_what_it_merges(cli, tmp_path, monkeypatch):
    """`{<<: *fsdp, key: …}` overrides a merged key (legal YAML); a key written twice by hand is not."""
    path = _quickstart(tmp_path)
    actor = "    fsdp:\n      torch_dtype: fp32\n      mp_param_dtype: fp32\n"
    ref = "  ref:\n    fsdp:\n      <<: *fsdp\n      enable_full_shard: false\n"
    text = path.read_text().replace(actor, actor.replace("fsdp:", "fsdp: &fsdp") + ref, 1)
    path.write_text(text)
    r = cli("validate", path, "--json")
    assert r.exit_code == 0, r.stderr
    fsdp = json.loads(r.stdout)["worker"]["ref"]["fsdp"]
    assert fsdp["enable_full_shard"] is False and fsdp["torch_dtype"] == "fp32"
    path.write_text(text.replace(ref, ref + "      enable_full_shard: true\n"))
    r = cli("validate", path)
    assert r.exit_code == 2 and "worker.ref.fsdp.enable_full_shard: is written twice" in r.stderr


@pytest.mark.parametrize(
    "args,said",
    [
        (["chat", "http://[::1", "hi"], "is not a valid URL (Invalid IPv6 URL)"),
        (["chat", "http://localhost:abc/v1", "hi"], "is not a valid URL"),
        (["serve", "-c", "x", "--port", "70000"], "Invalid value for '--port'"),
        (["serve", "-c", "x", "--port", "-1"], "Invalid value for '--port'"),
    ],
)
def test_bad_urls_and_ports_are_one_line(cli, tmp_path, monkeypatch, args, said):
    monkeypatch.setenv("R1CLOUD_HOME", str(tmp_path))
    r = cli(*args)
    assert r.exit_code == 2 and said in r.stderr + r.stdout, r.stderr


def _easyr1_checkpoint(root, shard: bytes | None = None, config: str = '{"architectures": ["X"]}', log=None):
    """An EasyR1-layout checkpoint at root/global_step_1 with one rank's shard."""
    import torch

    actor = root / "global_step_1" / "actor"
    (actor / "huggingface").mkdir(parents=True)
    (actor / "huggingface" / "config.json").write_text(config)
    path = actor / "model_world_size_1_rank_0.pt"
    if shard is None:
        torch.save({"w": torch.zeros(2)}, path)
    else:
        path.write_bytes(shard)
    if log is not None:
        (root / "experiment_log.jsonl").write_text(log)
    return root


@pytest.mark.parametrize(
    "log",
    [
        '{"step": 1, "reward": 5, "val": [1]}\n',
        '{"step": "one"}\n[1, 2]\n"text"\n{"step": 1, "reward": {"overall": "high"}}\n',
    ],
)
def test_checkpoint_metadata_of_the_wrong_shape_is_shown_as_unknown(cli, tmp_path, log, monkeypatch):
    _easyr1_checkpoint(tmp_path / "ck", log=log)
    monkeypatch.chdir(tmp_path)  # a short ID: the table fits 80 columns, as a pipe gets them
    r = cli("checkpoints", "ck")
    assert r.exit_code == 0 and "step-1" in r.stdout and "internal error" not in r.stderr, r.stderr
    state = tmp_path / "r1" / "global_step_2"
    (state / "actor").mkdir(parents=True)
    (state / "trainer_state.json").write_text("[1, 2]")  # a list: not r1cloud's record
    (state / "huggingface").mkdir()
    (state / "huggingface" / "config.json").write_text("5")
    r = cli("checkpoints", tmp_path / "r1")
    assert r.exit_code == 0 and "internal error" not in r.stderr, r.stderr


@pytest.mark.parametrize(
    "shard,config,said",
    [
        (b"not a torch file", '{"architectures": ["X"]}', "cannot be read as a torch shard"),
        (None, "{broken", "config.json is not valid JSON"),
        (None, "[1]", "config.json holds a JSON list"),
    ],
    ids=["corrupt-shard", "broken-config", "config-list"],
)
def test_merging_a_corrupt_checkpoint_is_one_line(cli, tmp_path, shard, config, said):
    root = _easyr1_checkpoint(tmp_path / "ck", shard=shard, config=config)
    r = cli("merge", f"{root}:step-1", "--out", tmp_path / "out")
    assert r.exit_code == 2 and said in r.stderr, r.stderr
    assert not (tmp_path / "out").exists()


def _bomb(d, mappings: bool = False):
    """A 600-byte file whose last alias would expand to 10 million values (lists of lists, or
    mappings of mappings, which reading the file's keys used to walk at every alias)."""
    lines = ["worker:", "  reward:", "    reward_function_kwargs:"]
    if mappings:
        lines += ["      a0: &a0 {" + ", ".join(f"k{j}: x" for j in range(10)) + "}"]
        lines += [
            f"      a{i}: &a{i} {{" + ", ".join(f"k{j}: *a{i - 1}" for j in range(10)) + "}"
            for i in range(1, 8)
        ]
    else:
        lines += ["      a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
        lines += [f"      a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 8)]
    return _write(d, "bomb.yaml", "\n".join(lines) + "\n")


@pytest.mark.parametrize(
    "args,said",
    [
        (["validate", "Q", "worker.actor.optim.lr=.inf"], "worker.actor.optim.lr: Input should be a finite number"),
        (["validate", "Q", "worker.rollout.temperature=.nan"], "worker.rollout.temperature: Input should be a finite"),
        (["validate", "Q", "algorithm.kl_coef=-.inf"], "algorithm.kl_coef: Input should be a finite number"),
        (["validate", "Q", "algorithm.filter_high=.nan"], "algorithm.filter_high: Input should be a finite number"),
        (["validate", "Q", "data.train_files_probs=[.nan]"], "data.train_files_probs.0: Input should be a finite"),
        (["validate", "Q", "worker.rollout.n=true"], "worker.rollout.n: true is not a number"),
        (["validate", "Q", "worker.rollout.val_override_config={top_p: 5}"], "top_p: 5 is not valid: must be a number above 0 and at most 1 (command line)"),
        (["validate", "Q", "worker.rollout.val_override_config={top_k: abc}"], "top_k: 'abc' is not valid"),
        (["validate", "Q", "worker.rollout.val_override_config={max_tokens: -5}"], "max_tokens: -5 is not valid"),
        (["validate", "Q", "worker.reward.reward_function_kwargs={a: .nan}"], "reward_function_kwargs: holds nan"),
        (["validate", "BOMB", "--json"], "reward_function_kwargs: is too large or too deep"),
        (["validate", "MAPBOMB"], "reward_function_kwargs: is too large or too deep"),
        (["validate", "BIG"], "data.rollout_batch_size: a number of more than 4,300 digits is no setting's value (big.yaml:2)"),
        (["validate", "KEYS"], "true: YAML reads this key as a boolean, not a name"),
        (["validate", "Q", "config="], "config= is empty"),
        (["train", "Q", "--nodes", "0", "--dry-run"], "Invalid value for '--nodes'"),
        (["train", "Q", "--gpu", "", "--dry-run"], "--gpu is empty"),
        (["train", "Q", "--infra", "", "--dry-run"], "--infra is empty"),
        (["train", "Q", "--gpu", "H 100", "--dry-run"], "--gpu 'H 100' is not an accelerator name"),
        (["train", "Q", "--env", "1X=y", "--dry-run"], "'1X' is not an environment variable name"),
        (["train", "Q", "--env", "A.B=c", "--dry-run"], "'A.B' is not an environment variable name"),
        (["train", "no-such-job", "--resume"], "no job named 'no-such-job'"),
        (["train", "a" * 300, "--resume"], "no job named 'aaaa"),
        (["train", "a" * 300 + ".yaml", "--resume"], "cannot read aaaa"),
        (["logs", "--tail", "-5"], "Invalid value for '--tail'"),
        (["checkpoints", "FILE"], "is a file"),
        (["merge", "FILE"], "is a file"),
    ],
)  # fmt: skip
def test_bad_values_and_flags_are_refused_in_one_line(cli, tmp_path, monkeypatch, args, said):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("R1CLOUD_HOME", str(tmp_path / "home"))
    files = {
        "Q": lambda: _quickstart(tmp_path),
        "BOMB": lambda: _bomb(tmp_path),
        "MAPBOMB": lambda: _bomb(tmp_path, mappings=True),
        "BIG": lambda: _write(tmp_path, "big.yaml", "data:\n  rollout_batch_size: " + "9" * 5000 + "\n"),
        "KEYS": lambda: _write(tmp_path, "keys.yaml", "true: 1\nname: keys-test\n"),
        "FILE": lambda: _write(tmp_path, "plain.txt", "not a checkpoint"),
    }
    r = cli(*[str(files[a]()) if a in files else a for a in args])
    assert r.exit_code == 2 and said in r.stderr + r.stdout, r.stderr + r.stdout
    assert "internal error" not in r.stderr and all(len(x) < 400 for x in r.stderr.splitlines())


def test_dry_run_with_a_taken_name_says_what_the_launch_would(cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("R1CLOUD_HOME", str(tmp_path / "home"))
    (tmp_path / "home" / "jobs" / "quickstart").mkdir(parents=True)
    (tmp_path / "home" / "jobs" / "quickstart" / "job.json").write_text(json.dumps(asdict(Job("quickstart", status="SUCCEEDED"))))  # fmt: skip
    q = _quickstart(tmp_path)
    r = cli("train", q, "--name", "quickstart", "--dry-run", "--secret", "HF_TOKEN=x")
    assert r.exit_code == 2 and "a job named 'quickstart' already exists" in r.stderr
    r = cli("train", q, "--dry-run", "--secret", "HF_TOKEN=x")  # no --name: the free suffix it would take
    assert r.exit_code == 0 and "jobs/quickstart-2 " in r.stdout and "job        quickstart-2" in r.stdout


def test_a_cloud_job_folder_that_is_a_system_folder_or_too_big_is_refused(cli, tmp_path, monkeypatch):
    """The job's folder is what SkyPilot uploads with every launch (the upload itself is not run here)."""
    import shutil
    import uuid

    from spec_helpers import ROOT

    monkeypatch.setenv("R1CLOUD_HOME", str(tmp_path / "home"))
    project = tmp_path / "project"
    project.mkdir()
    for name in ("reward_functions/arithmetic.py", "format_prompts/arithmetic.jinja", "data/arithmetic/train.jsonl",
                 "data/arithmetic/test.jsonl"):  # fmt: skip
        (project / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, project / name)
    bp = project / "q.yaml"
    bp.write_text((ROOT / "blueprints" / "quickstart.yaml").read_text().replace("../", ""))
    cloud = ["--infra", "aws", "--bucket", "s3://bucket/runs", "--dry-run", "--secret", "HF_TOKEN=x"]
    assert cli("train", bp, *cloud).exit_code == 0
    elsewhere = Path("/tmp") / f"r1cloud-test-{uuid.uuid4().hex}"  # a second folder under /tmp
    elsewhere.mkdir()
    try:
        shutil.copy(project / "reward_functions/arithmetic.py", elsewhere / "reward.py")
        r = cli("train", bp, f"worker.reward.reward_function={elsewhere}/reward.py:compute_score", *cloud)
        assert r.exit_code == 2 and "the blueprint's files span /tmp, too wide" in r.stderr, r.stderr
    finally:
        shutil.rmtree(elsewhere)
    with open(project / "data" / "big.bin", "wb") as f:  # sparse: 3 GiB on paper, nothing on disk
        f.truncate(3 << 30)
    r = cli("train", bp, *cloud)
    assert r.exit_code == 2 and "holds more than 2 GiB" in r.stderr, r.stderr
    (project / ".skyignore").write_text("# what SkyPilot leaves out\n/data/big.bin\n")  # as SkyPilot reads it
    assert cli("train", bp, *cloud).exit_code == 0
    (project / ".skyignore").write_text("*.jsonl\n")
    r = cli("train", bp, *cloud)  # the big file is uploaded again
    assert r.exit_code == 2 and "holds more than 2 GiB" in r.stderr, r.stderr


# --------------------------------------------------------------------------- the CLI's whole surface
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

names = st.one_of(
    st.sampled_from(["good", "listed", "broken", "typed", "badspec", "nope", "..", "/", ".", ""]),
    st.text(max_size=40),
    st.from_regex(r"[a-z0-9-]{1,70}", fullmatch=True),
)
paths = st.one_of(
    st.sampled_from(["OUTSIDE", "OUTSIDE/kept.txt", "missing.yaml", "a" * 300, "~nobody9/x", "/", "."]),
    st.text(max_size=30),
)
overrides = st.one_of(
    st.builds(
        lambda k, v: f"{k}={v}",
        st.sampled_from(
            [
                "worker.rollout.n",
                "data.rollout_batch_size",
                "worker.actor.optim.lr",
                "trainer.n_gpus_per_node",
                "config",
                "name",
                "resources.bucket",
                "worker.rollout.val_override_config",
                "worker.reward.reward_function_kwargs",
            ]
        ),
        st.one_of(
            st.text(max_size=20),
            st.integers().map(str),
            st.sampled_from([".inf", ".nan", "true", "[1, 2]", "{a: 1}", ""]),
        ),
    ),  # fmt: skip
    st.text(max_size=30),
)
commands = st.one_of(
    st.builds(lambda p, o: ["validate", p, *o], st.sampled_from(["Q", "OUTSIDE", "missing.yaml"]) | paths, st.lists(overrides, max_size=3)),
    st.builds(lambda o, f: ["train", "Q", *o, *f, "--dry-run"], st.lists(overrides, max_size=2),
              st.sampled_from([[], ["--accels", "3"], ["--nodes", "2"], ["--gpu", "H100"], ["--env", "A=b"], ["--name", "good"]])),
    st.builds(lambda c, n: [c, n], st.sampled_from(["status", "logs", "checkpoints", "stop", "plot"]), names),
    st.builds(lambda n, p: ["merge", n, "--out", p], names | paths, paths),
    st.builds(lambda n, d: ["eval", n, "--data", d, "--reward", "missing.py"], names, paths),
    st.builds(lambda t: ["logs", "good", "--tail", t], st.integers(-5, 5).map(str)),
    st.just(["jobs"]),
)  # fmt: skip


@settings(max_examples=int(__import__("os").environ.get("HYPOTHESIS_EXAMPLES", 120)), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # fmt: skip
@given(command=commands)
def test_any_command_ends_in_exit_0_or_2_with_short_lines_and_touches_nothing_outside(
    cli, store, tmp_path_factory, monkeypatch, command
):
    """Whatever is typed — blueprints, overrides, flags, job names, paths — the CLI ends in exit 0
    or 2, each line it prints is short, never `internal error`, never a hang, and a folder given
    as a path (OUTSIDE) is left as it was."""
    import time as clock

    here = tmp_path_factory.mktemp("cwd")
    monkeypatch.chdir(here)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    outside = here / "OUTSIDE"
    outside.mkdir()
    (outside / "kept.txt").write_text("mine")
    q = _quickstart(here)
    argv = [str(q) if a == "Q" else a for a in command]
    tick = clock.monotonic()
    r = cli(*argv)
    assert clock.monotonic() - tick < 60, argv
    assert r.exit_code in (0, 2), (argv, r.exit_code, r.stdout[-500:], r.stderr[-500:])
    assert "internal error" not in r.stderr and "Traceback" not in r.stderr, (argv, r.stderr[-800:])
    assert all(len(line) < 500 for line in r.stderr.splitlines()), (argv, r.stderr[-800:])
    assert (
        sorted(p.name for p in outside.iterdir()) == ["kept.txt"]
        and (outside / "kept.txt").read_text() == "mine"
    )


@pytest.mark.parametrize("key", ["data.format_prompt", "worker.reward.reward_function"])
def test_a_folder_where_a_file_belongs_is_said_so(cli, tmp_path, monkeypatch, key):
    monkeypatch.chdir(tmp_path)
    r = cli("validate", _quickstart(tmp_path), f"{key}={tmp_path}")
    assert r.exit_code == 2 and f"{key}: {tmp_path} is a folder: give a file" in r.stderr, r.stderr


def test_logs_without_a_name_says_whose_log_it_prints(cli, store):
    import shutil

    for name in ("listed", "broken", "typed", "noname", "elsewhere", "badspec"):
        shutil.rmtree(store / name)
    (store / "good" / "train.log").write_text("step 1/2 | reward 0.1\n")
    r = cli("logs")
    assert r.exit_code == 0 and "job good (the latest" in r.stderr and "job good" not in r.stdout, r.stderr
    r = cli("logs", "good")  # named: nothing to say
    assert r.exit_code == 0 and r.stderr == ""


def test_a_failed_servers_reason_is_the_root_cause_not_vllms_summary(tmp_path):
    """The shape of vLLM 0.32's log when a worker fails at start-up (the Qwen2-VL dummy-video case):
    the cause in a worker's prefixed traceback, then summaries that point back to it."""
    from r1cloud.jobs.supervise import last_error

    w = "(Worker pid=6949) ERROR 11-25 01:45:50 [multiproc_executor.py:1063] "
    log = tmp_path / "serve.log"
    log.write_text("\n".join([
        "(APIServer pid=1) INFO 11-25 01:45:31 [api_server.py:1] vLLM API server version 0.32.0",
        w + "Traceback (most recent call last):",
        w + '  File "/x/vision_compat.py", line 79, in __call__',
        w + "ValueError: videos need torchvision, which has no build for this machine's torch",
        w + "The above exception was the direct cause of the following exception:",
        w + "ValueError: Failed to apply Qwen2VLProcessor on data={'videos': [array([[[[255, 255, 255],",
        "         [255, 255, 255]]]], shape=(14, 112, 112, 3), dtype=uint8)]} with kwargs={}",
        "RuntimeError: Worker failed with error 'Failed to apply Qwen2VLProcessor on data={'videos': [array([[[[255,",
        "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {'EngineCore': 1}",
    ]) + "\n")  # fmt: skip
    assert (
        last_error(log) == "ValueError: videos need torchvision, which has no build for this machine's torch"
    )
    log.write_text(log.read_text() + "error: the trainer's own words\n")
    assert last_error(log) == "error: the trainer's own words"


def test_a_vision_language_model_is_served_with_the_videos_r1cloud_can_process():
    """What r1cloud.serving.vllm_server adds for a VLM without torchvision: one video per prompt and
    processor-normalized pixels for Qwen-VL (r1cloud's video processor), no video for the others;
    a user's own limit or normalization flag stays theirs."""
    from types import SimpleNamespace

    from r1cloud.serving.serve import media_limits

    qwen, idefics = (
        SimpleNamespace(vision_config={}, model_type="qwen2_5_vl"),
        SimpleNamespace(vision_config={}, model_type="idefics3"),
    )
    assert media_limits(["--model", "m"], qwen) == [
        "--model", "m", "--limit-mm-per-prompt", '{"video": 1}', "--no-mm-device-do-normalize",
        "--media-io-kwargs", '{"video": {"video_backend": "qwen2_vl"}}']  # fmt: skip
    assert media_limits(["--model", "m"], idefics) == [
        "--model",
        "m",
        "--limit-mm-per-prompt",
        '{"video": 0}',
    ]
    assert media_limits(["--model", "m"], SimpleNamespace()) == ["--model", "m"]  # a text model
    own = ["--limit-mm-per-prompt={}", "--mm-device-do-normalize", "--media-io-kwargs={}"]
    assert media_limits(own, qwen) == own
    assert media_limits([], None) == []
