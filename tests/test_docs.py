"""The manual in docs/: its generated references are current, every YAML snippet validates, and
every console block either runs here with the output it shows or is listed below with what keeps
it from running in a test (a trained job, a cloud account, minutes of training)."""

import os
import re
import subprocess
import sys

import pytest
import yaml

from r1cloud.spec.keys import REFUSED, classify, leaves, reference
from spec_helpers import MINIMAL, ROOT

DOCS = ROOT / "docs"
PAGES = sorted(DOCS.rglob("*.md")) + [ROOT / "README.md"]
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", re.M | re.S)


def blocks(lang: str) -> list[tuple[str, str]]:
    """(page:line, body) of each fenced block in `lang` (a block without one whose first line is a
    `$ ` command counts as console)."""
    found = []
    for page in PAGES:
        text = page.read_text()
        for m in FENCE.finditer(text):
            tag = m.group(1) or ("console" if m.group(2).startswith("$ ") else "")
            if tag == lang:
                found.append((f"{page.relative_to(ROOT)}:{text[: m.start()].count(chr(10)) + 1}", m.group(2)))
    return found


def test_the_generated_references_are_current(tmp_path):
    """scripts/reference writes both; run it and commit when this fails."""
    assert (DOCS / "reference" / "keys.md").read_text() == reference()
    out = tmp_path / "commands.md"
    typer = ROOT / ".venv" / "bin" / "typer"
    cmd = [str(typer) if typer.exists() else "typer", "r1cloud.cli", "utils", "docs", "--name", "r1cloud"]
    subprocess.run(
        [*cmd, "--title", "Command reference", "--output", str(out)], check=True, capture_output=True
    )
    assert (DOCS / "reference" / "commands.md").read_text() == out.read_text()


def test_the_key_reference_says_what_becomes_of_every_key():
    rows = {}
    for line in (DOCS / "reference" / "keys.md").read_text().splitlines():
        if m := re.match(r"\| `([\w.]+)` \|.*\| \*\*(\w+)\*\*: (.*) \|$", line):
            rows[m.group(1)] = (m.group(2), m.group(3))
    assert len(rows) > 200
    for key in leaves():
        path = ".".join(key)
        kind, text = classify(path)
        assert rows[path] == (kind, text.replace("|", "\\|")), path
    assert any(kind == REFUSED for kind, _ in rows.values())


def merged(fragment: dict) -> dict:
    """A docs fragment over the tests' minimal blueprint (a whole blueprint stays as it is)."""
    base = yaml.safe_load(MINIMAL)

    def merge(a: dict, b: dict) -> dict:
        return {**a, **{k: merge(a[k], v) if isinstance(v, dict) and isinstance(a.get(k), dict) else v
                        for k, v in b.items()}}  # fmt: skip

    if (fragment.get("resources") or {}).get("accelerators"):
        del base["trainer"]["n_gpus_per_node"]  # the fragment's accelerators say it
    return fragment if {"data", "worker"} <= set(fragment) else merge(base, fragment)


YAML = blocks("yaml")


def test_there_are_snippets_to_check():
    """The parametrized tests below would be skipped, not failed, with nothing to run."""
    assert len(YAML) >= 2 and len(CONSOLE) >= 10
    assert {command(b) for _, b in SHOWN} == {cmd for cmds in RUN.values() for cmd in cmds}


@pytest.mark.parametrize("where,body", YAML, ids=[w for w, _ in YAML])
def test_every_yaml_snippet_validates(cli, tmp_path, monkeypatch, where, body):
    """Written beside symlinks to the repository's folders, so its relative paths resolve as in
    blueprints/; the secrets it names are given."""
    for folder in ("tools", "envs", "data", "format_prompts", "reward_functions"):
        (tmp_path / folder).symlink_to(ROOT / folder)
    (tmp_path / "blueprints").mkdir()
    path = tmp_path / "blueprints" / "snippet.yaml"
    path.write_text(yaml.safe_dump(merged(yaml.safe_load(body))))
    monkeypatch.setenv("R1CLOUD_HOME", str(tmp_path / "home"))
    secrets = [f"--secret={name}=x" for name in yaml.safe_load(body).get("secrets", [])]
    r = cli("validate", path, "--no-cost", *secrets)
    assert r.exit_code == 0, f"{where}:\n{r.stderr}"


# Console blocks run here: the command as shown, from the repository's root, in a fresh job store;
# each line of the block that the run can reproduce (no time, price or path of another machine)
# must be in its output.
RUN = {
    "docs/running.md": ["r1cloud validate blueprints/quickstart.yaml"],
    "docs/cloud-and-cost.md": [
        "r1cloud train blueprints/math12k_grpo.yaml --infra aws --bucket s3://my-ckpts --spot --dry-run",
        "r1cloud validate blueprints/math12k_grpo.yaml --accels 8",
    ],
}
# Console blocks no test here runs as shown, and why (their commands run in the tests named).
NOT_RUN = {
    "r1cloud validate typo.yaml": "five mistakes at once; each is a case of tests/test_spec_checks.py",
    "r1cloud train blueprints/quickstart.yaml --gpu H100 --max-cost 0.01 trainer.max_steps=2":
        "a priced training run; the budget stop is tests/trainer/test_jobs_cli.py's",
    "r1cloud train /tmp/t.yaml --name tty --secret HF_TOKEN=x trainer.max_steps=200 trainer.save_freq=-1":
        "minutes of training; tests/trainer/test_jobs_cli.py",
    "r1cloud jobs": "the quickstart's jobs; tests/trainer/test_jobs_cli.py",
    "r1cloud plot quickstart-20261124-141022 -m val/reward_score --width 72 --height 12":
        "the quickstart's metrics; tests/test_plot.py",
    "r1cloud stop tty": "a running job; tests/trainer/test_jobs_cli.py",
    "r1cloud eval .models/SmolLM2-135M-Instruct quickstart-20261124-141022 --n 8 --temperature 1":
        "the quickstart's checkpoint; tests/trainer/test_eval.py",
    "r1cloud eval .models/SmolLM2-135M-Instruct toolrun --blueprint blueprints/tools_calculator.yaml --n 4 "
    "--temperature 1": "the calculator run's checkpoint (scripts/quickstart --agents); tests/trainer/test_eval.py",
    "r1cloud try blueprints/quickstart.yaml worker.actor.model.model_path=.models/SmolLM2-135M-Instruct --n 3":
        "the real model, a minute; tests/trainer/test_try.py on the tiny one",
    "r1cloud try blueprints/tools_calculator.yaml worker.actor.model.model_path=.models/SmolLM2-135M-Instruct "
    "--n 4 --episodes 2": "the real model playing episodes; tests/trainer/test_agent_episodes.py",
    "r1cloud chat http://127.0.0.1:8000/v1 \"What is 237 times 83?\" --blueprint blueprints/tools_calculator.yaml":
        "a served trained model; tests/trainer/test_serve.py",
    "export R1CLOUD_API_KEY=…": "serving with a key; tests/trainer/test_serve.py",
    "head -8 data/arithmetic/test.jsonl | jq -r .problem > questions.txt": "chat over a served model; tests/trainer/test_serve.py",
    "r1cloud validate blueprints/quickstart_async.yaml": "its estimate is this machine's calibration; the "
        "async line is tests/test_spec_checks.py's (test_the_summary_gives_the_asynchronous_split)",
    "[start] 2 workers, rollout engine vllm, 30 steps, each group's prompt packed once":
        "the quickstart's own output (scripts/quickstart)",
}  # fmt: skip
CONSOLE = blocks("console")


def command(body: str) -> str:
    first = body.splitlines()[0]
    return first.removeprefix("$ ").strip()


def test_every_console_block_is_run_or_says_why_not():
    for where, body in CONSOLE:
        cmd, page = command(body), where.split(":")[0]
        ran = cmd in RUN.get(page, [])
        excused = page == "docs/reference/commands.md" or cmd in NOT_RUN
        assert ran or excused, f"{where}: `{cmd}` is neither run by this test nor listed in NOT_RUN"


SHOWN = [(w, b) for w, b in CONSOLE if command(b) in RUN.get(w.split(":")[0], [])]


@pytest.mark.parametrize("where,body", SHOWN, ids=[w for w, _ in SHOWN])
def test_the_console_blocks_that_run_here_show_what_they_print(tmp_path, where, body):
    cmd = command(body).removeprefix("r1cloud ").split()
    env = dict(os.environ, R1CLOUD_HOME=str(tmp_path / "home"), COLUMNS="200")
    r = subprocess.run([sys.executable, "-m", "r1cloud", *cmd], cwd=ROOT, capture_output=True, text=True,
                       timeout=300, env=env)  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    out = {line.rstrip() for line in (r.stdout + r.stderr).splitlines()}
    # what varies by machine: prices and times (the catalog, a calibration), its own paths
    varies = re.compile(
        r"\d+(\.\d+)? (min|s|h)\b|\$|/home/me|r1cloud/dry-run|spot|H200:8|A100-80GB:8|RunPod|Lambda|GCP|dearer|…"
    )
    missing = [
        x.rstrip()
        for x in body.splitlines()[1:]
        if x.strip() and not varies.search(x) and x.rstrip() not in out
    ]
    assert missing == [], f"{where}: lines not printed:\n" + "\n".join(missing)
