"""A real HTTP server on loopback that answers POST requests with JSON, for tests that need a peer
which cannot run here (the Hub, a reward model service, a judge model). `answer(path, headers,
body)` gets the raw request body and returns (status, JSON-able reply or None)."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

Answer = Callable[[str, Message, bytes], tuple[int, object]]  # headers: case-insensitive


class JsonServer:
    def __init__(self, answer: Answer, path: str = ""):
        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                status, reply = answer(self.path, self.headers, body)
                data = b"" if reply is None else json.dumps(reply).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base = f"http://127.0.0.1:{self.http.server_address[1]}"
        self.url = self.base + path
        threading.Thread(target=self.http.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.http.shutdown()
        self.http.server_close()
