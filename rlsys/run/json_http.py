"""JSON over HTTP for rlsys's OpenAI-compatible endpoints (the agents' endpoint,
rlsys/agents/server.py, and a served judge's, rlsys/rewards/chat_server.py).

The standard library's ``ThreadingHTTPServer`` serves it: a thread per request suits handlers
that block until their generation comes back, and it needs nothing the base install lacks.
Every request goes to one ``route(method, path, body) -> JSON body``; a ``RequestError``
answers with its status and an OpenAI-style error, any other exception answers 500 and the
server goes on, and a body over ``MAX_BODY_BYTES`` is refused before it is read."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

log = logging.getLogger(__name__)
MAX_BODY_BYTES = 8 << 20  # a larger request body is refused (400)

Route = Callable[[str, str, bytes], dict]  # (method, path, body) -> the answer's JSON body


class RequestError(Exception):
    """A request the endpoint refuses: an OpenAI-style error with an HTTP status."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str = "") -> None:
        super().__init__(message)
        self.status, self.message, self.param = status, message, param
        self.code = code or ("not_found" if status == 404 else "invalid_request")

    def body(self) -> dict:
        kind = "not_found_error" if self.status == 404 else "invalid_request_error"
        if self.status >= 500:
            kind = "server_error"
        return {
            "error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}
        }


def read_json(body: bytes) -> dict:
    """A request body as a JSON object; raises RequestError (400) otherwise."""
    try:
        data = json.loads(body or b"null")
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise RequestError(400, f"the request body is not JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise RequestError(400, "the request body must be a JSON object")
    return data


def answer(route: Route, method: str, path: str, body: bytes, name: str) -> tuple[int, dict]:
    """(status, JSON body) of a request; never raises."""
    try:
        return 200, route(method, path, body)
    except RequestError as exc:
        return exc.status, exc.body()
    except Exception as exc:  # noqa: BLE001 - one bad request must not stop the server
        log.exception("%s: %s %s failed", name, method, path)
        return 500, RequestError(500, f"internal error: {exc!r}", code="server_error").body()


class JsonServer:
    """``route`` served on ``host``:``port`` (0: a free port) by a daemon thread."""

    def __init__(self, route: Route, name: str, host: str = "127.0.0.1", port: int = 0) -> None:
        self.httpd = ThreadingHTTPServer((host, port), _handler(route, name))
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True, name=name)
        self.thread.start()

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}"

    def shutdown(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _handler(route: Route, name: str) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:  # noqa: N802 - the http.server name
            self._answer(*answer(route, "GET", self.path, b"", name))

        def do_POST(self) -> None:  # noqa: N802
            length = int(self.headers.get("Content-Length") or 0)
            if length > MAX_BODY_BYTES:
                self.close_connection = True
                body = RequestError(400, f"body over {MAX_BODY_BYTES} bytes").body()
                self._answer(400, body)
                return
            self._answer(*answer(route, "POST", self.path, self.rfile.read(length), name))

        def _answer(self, status: int, body: dict) -> None:
            data = json.dumps(body).encode()
            try:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):  # the client gave up waiting
                log.debug("%s: the client left before its answer", name)

        def log_message(self, format: str, *args) -> None:  # noqa: A002 - quiet per request
            log.debug(f"{name}: " + format, *args)

    return Handler
