"""A reward service for the tests (``reward.url``, rlsys/rewards/remote.py): a real local HTTP
server that scores 1.0 a completion holding a digit, else 0.25, fails its first batch with 503
(the client retries) and answers 400 to a path other than /score."""

from __future__ import annotations

import http.server
import json
import threading

import pytest


class Service(http.server.BaseHTTPRequestHandler):
    """Scores 1.0 a completion holding a digit, else 0.25; fails its first batch with 503
    (the client retries) and answers 400 to a path other than /score."""

    seen: list[int] = []
    failed_once = False

    def do_POST(self):  # noqa: N802 (http.server's name)
        items = json.loads(self.rfile.read(int(self.headers["Content-Length"])))["items"]
        if self.path != "/score":
            self.send_response(400)
            self.end_headers()
            return
        cls = type(self)
        if not cls.failed_once:
            cls.failed_once = True
            self.send_response(503)
            self.end_headers()
            return
        cls.seen.append(len(items))
        scores = [1.0 if any(ch.isdigit() for ch in i["completion"]) else 0.25 for i in items]
        body = json.dumps({"scores": scores}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def service():
    Service.seen, Service.failed_once = [], False
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Service)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
