"""A local S3 endpoint (moto's server, a real HTTP server speaking the S3 API) for bucket checkpoint
tests: boto/s3fs talk to it exactly as to AWS, through the standard AWS_* environment."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from r1cloud.serving.serve import free_port


class S3Server:
    def __init__(self, host: str = "127.0.0.1"):
        port = free_port(host)
        self.url = f"http://{host}:{port}"
        self.env = {
            "AWS_ENDPOINT_URL": self.url,
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
        }
        moto = Path(sys.executable).parent / "moto_server"
        self.proc = subprocess.Popen(
            [str(moto), "-H", host, "-p", str(port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.time() + 60
        while True:
            try:
                socket.create_connection((host, port), timeout=1).close()
                break
            except OSError:
                if time.time() > deadline or self.proc.poll() is not None:
                    raise RuntimeError("moto_server did not start") from None
                time.sleep(0.2)

    def fs(self):
        import s3fs

        return s3fs.S3FileSystem(
            key="testing",
            secret="testing",
            client_kwargs={"endpoint_url": self.url},
            skip_instance_cache=True,
        )

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)


def environ(server: S3Server) -> dict[str, str]:
    return {**os.environ, **server.env}
