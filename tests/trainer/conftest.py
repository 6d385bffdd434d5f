from pathlib import Path

import pytest

from r1cloud.spec import dump_spec, load_spec
from tinyrun import DIGITS_REWARD, tiny_blueprint


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    from r1cloud.testing import make_tiny_model

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
        bp = tmp_path / f"{name}.yaml"
        bp.write_text(tiny_blueprint(tiny_model, digits_reward, engine=engine))
        spec = load_spec(bp, list(overrides)).spec
        run = tmp_path / name
        run.mkdir(exist_ok=True)
        (run / "spec.yaml").write_text(dump_spec(spec))
        return run

    return make
