"""A local stand-in for the Hugging Face Hub's HTTP API — the part `create_repo` and `upload_folder`
use — so pushes run through the real huggingface_hub client with no network. The Hub is an account
r1cloud cannot have here; this is the narrowest boundary: the client, its requests and payloads are
real, only the server is local. It stores what a commit carries under `root/<repo_id>/`.

It answers every file's upload mode as "regular" (contents inline in the commit), which the real
Hub uses for small files, so no LFS/Xet transfer protocol is needed. A request without the
expected bearer token gets 401, as the Hub does."""

from __future__ import annotations

import base64
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


class FakeHub:
    def __init__(self, root: Path, token: str):
        self.root, self.token, self.commits = root, token, []
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _reply(self, status: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.headers.get("Authorization") != f"Bearer {hub.token}":
                    return self._reply(401, {"error": "Invalid credentials in Authorization header"})
                if self.path == "/api/repos/create":
                    req = json.loads(body)
                    repo = f"{req['organization']}/{req['name']}" if req.get("organization") else req["name"]
                    (hub.root / repo).mkdir(parents=True, exist_ok=True)
                    return self._reply(200, {"url": f"{hub.url}/{repo}", "name": repo})
                m = re.match(r"^/api/models/(.+)/(preupload|commit)/([^/?]+)", self.path)
                if not m:
                    return self._reply(404, {"error": f"not handled: {self.path}"})
                repo, action = m.group(1), m.group(2)
                if action == "preupload":
                    files = json.loads(body)["files"]
                    return self._reply(
                        200,
                        {
                            "files": [
                                {"path": f["path"], "uploadMode": "regular", "shouldIgnore": False}
                                for f in files
                            ]
                        },
                    )
                lines = [json.loads(x) for x in body.decode().splitlines() if x.strip()]
                header = next(x["value"] for x in lines if x["key"] == "header")
                for x in lines:
                    if x["key"] == "file":
                        dest = hub.root / repo / x["value"]["path"]
                        dest.parent.mkdir(parents=True, exist_ok=True)
                        dest.write_bytes(base64.b64decode(x["value"]["content"]))
                hub.commits.append((repo, header["summary"]))
                oid = f"{len(hub.commits):040x}"
                return self._reply(200, {"commitUrl": f"{hub.url}/{repo}/commit/{oid}", "commitOid": oid})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
