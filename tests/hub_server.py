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
from pathlib import Path

from json_server import JsonServer


class FakeHub:
    def __init__(self, root: Path, token: str):
        self.root, self.token, self.commits = root, token, []
        self.http = JsonServer(self.answer)
        self.url = self.http.url

    def answer(self, path: str, headers, body: bytes):
        if headers.get("Authorization") != f"Bearer {self.token}":
            return 401, {"error": "Invalid credentials in Authorization header"}
        if path == "/api/repos/create":
            req = json.loads(body)
            repo = f"{req['organization']}/{req['name']}" if req.get("organization") else req["name"]
            (self.root / repo).mkdir(parents=True, exist_ok=True)
            return 200, {"url": f"{self.url}/{repo}", "name": repo}
        m = re.match(r"^/api/models/(.+)/(preupload|commit)/([^/?]+)", path)
        if not m:
            return 404, {"error": f"not handled: {path}"}
        repo, action = m.group(1), m.group(2)
        if action == "preupload":
            files = json.loads(body)["files"]
            return 200, {
                "files": [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False} for f in files]
            }
        lines = [json.loads(x) for x in body.decode().splitlines() if x.strip()]
        header = next(x["value"] for x in lines if x["key"] == "header")
        for x in lines:
            if x["key"] == "file":
                dest = self.root / repo / x["value"]["path"]
                dest.parent.mkdir(parents=True, exist_ok=True)
                dest.write_bytes(base64.b64decode(x["value"]["content"]))
        self.commits.append((repo, header["summary"]))
        oid = f"{len(self.commits):040x}"
        return 200, {"commitUrl": f"{self.url}/{repo}/commit/{oid}", "commitOid": oid}

    def close(self) -> None:
        self.http.close()
