"""A real MLflow tracking server on loopback (`mlflow server`, a sqlite store), for the tracker
tests: the trainer logs to it over HTTP exactly as to a team's server."""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from r1cloud.serving.serve import free_port


class MlflowServer:
    def __init__(self, folder: Path, host: str = "127.0.0.1"):
        port = free_port(host)
        self.url = f"http://{host}:{port}"
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "mlflow",
                "server",
                "--backend-store-uri",
                f"sqlite:///{folder}/mlflow.db",
                "--artifacts-destination",
                str(folder / "artifacts"),
                "--host",
                host,
                "--port",
                str(port),
                "--workers",
                "1",
            ],  # fmt: skip
            stdout=subprocess.DEVNULL,
            stderr=open(folder / "server.log", "wb"),  # noqa: SIM115 - handed to the child
        )
        deadline = time.time() + 180
        while True:
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                if time.time() > deadline or self.proc.poll() is not None:
                    raise RuntimeError(f"mlflow server did not start: {folder / 'server.log'}") from None
                time.sleep(0.5)

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)
