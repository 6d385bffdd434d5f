import os
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest
from typer.testing import CliRunner

from r1cloud.cli import app
from spec_helpers import MINIMAL


@dataclass
class Result:
    exit_code: int
    stdout: str
    stderr: str


@pytest.fixture
def blueprint(tmp_path, monkeypatch):
    """Write a blueprint (and any side files) into a temp dir, chdir there, return its path."""
    monkeypatch.chdir(tmp_path)

    def write(text: str = MINIMAL, name: str = "job.yaml", files: dict[str, str] | None = None) -> Path:
        for rel, content in (files or {}).items():
            p = tmp_path / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(content)
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
        return path

    return write


@pytest.fixture
def cli(monkeypatch):
    """Run `r1cloud ARGS` in-process; secrets in the environment are cleared first."""
    for name in ("HF_TOKEN", "WANDB_API_KEY"):
        monkeypatch.delenv(name, raising=False)

    def run(*args: str, env: dict[str, str] | None = None) -> Result:
        r = CliRunner(env=env).invoke(app, [str(a) for a in args])
        if r.exception and not isinstance(r.exception, SystemExit):
            raise r.exception
        return Result(r.exit_code, r.stdout, r.stderr)

    return run


@pytest.fixture
def s3(monkeypatch):
    """moto's S3 server with the AWS_* environment pointing at it and a bucket `ckpts`."""
    from s3_server import S3Server

    server = S3Server()
    try:
        for k, v in server.env.items():
            monkeypatch.setenv(k, v)
        server.fs().mkdir("ckpts")
        yield server
    finally:
        server.close()


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory):
    """A real MLflow tracking server on loopback with a sqlite store (one per session: it takes
    tens of seconds to start)."""
    from mlflow_server import MlflowServer

    server = MlflowServer(tmp_path_factory.mktemp("mlflow"))
    try:
        yield server
    finally:
        server.close()


def pytest_configure(config):
    os.environ.setdefault("COLUMNS", "200")
