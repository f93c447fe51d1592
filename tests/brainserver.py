"""A real HTTP server on 127.0.0.1 that answers like a model server, for the brain tests.

It speaks Ollama (``POST /api/generate``, ``POST /api/chat``) and the OpenAI chat API
(``POST /v1/chat/completions``), records every request, and is told per test what to
do with the next requests::

    with BrainServer() as brain:
        brain.script("FAIL: no tests", "PASS")    # one reply per request; the last repeats
        brain.script(Slow(5, "PASS"))              # answer after 5 s
        brain.script(Status(500, {"error": "boom"}), Malformed(), "")
        ... brain.url ... brain.requests[0].body["prompt"] ...

Stdlib only. Handler threads are daemons and a slow reply wakes up when the server
stops, so a test never waits for one.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Optional, Union


@dataclass
class Slow:
    """Answer ``text`` after ``seconds``."""

    seconds: float
    text: str = "PASS"


@dataclass
class Gated:
    """Answer ``text`` once the test sets ``gate`` (a reply that cannot come before)."""

    gate: threading.Event
    text: str = "PASS"


@dataclass
class Status:
    """Answer with an HTTP error status and a JSON (dict) or text (str) body."""

    code: int
    body: Union[dict[str, Any], str] = field(default_factory=dict)


@dataclass
class Malformed:
    """Answer 200 with a body that is not JSON."""

    body: bytes = b'{"response": "PASS", '


@dataclass
class Shape:
    """Answer 200 with this JSON, whatever the API (a reply without the usual fields)."""

    data: Any


@dataclass
class Redirect:
    """Answer with a redirect (3xx) to ``location``, which a brain client must not follow."""

    location: str
    code: int = 302


Reply = Union[str, Slow, Gated, Status, Malformed, Shape, Redirect]


@dataclass
class Request:
    path: str
    headers: dict[str, str]
    body: Any
    time: float

    @property
    def prompt(self) -> str:
        """The prompt text, whichever API carried it."""
        if isinstance(self.body, dict):
            if "prompt" in self.body:
                return str(self.body["prompt"])
            msgs = self.body.get("messages") or []
            return "\n".join(str(m.get("content", "")) for m in msgs if isinstance(m, dict))
        return ""


class BrainServer:
    """A model server on ``127.0.0.1:<free port>``, in a thread."""

    def __init__(self, models: Optional[list[str]] = None) -> None:
        self.models = models  # None: any model name is served
        self.requests: list[Request] = []
        self._replies: list[Reply] = ["PASS"]
        self._lock = threading.Lock()
        self.stopping = threading.Event()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:  # quiet
                pass

            def do_GET(self) -> None:
                if self.path == "/api/tags":
                    self._send(200, {"models": [{"name": m} for m in server.models or []]})
                else:
                    self._send(404, "404 page not found")

            def do_POST(self) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(n)
                try:
                    body = json.loads(raw)
                except ValueError:
                    body = raw.decode("utf-8", "replace")
                req = Request(self.path, {k.lower(): v for k, v in self.headers.items()}, body, time.time())
                reply = server._take(req)
                server._answer(self, req, reply)

            def _send(self, code: int, body: Union[dict[str, Any], str, bytes]) -> None:
                if isinstance(body, dict):
                    data, ctype = json.dumps(body).encode(), "application/json; charset=utf-8"
                elif isinstance(body, str):
                    data, ctype = body.encode(), "text/plain; charset=utf-8"
                else:
                    data, ctype = body, "application/json; charset=utf-8"
                try:
                    self.send_response(code)
                    self.send_header("Content-Type", ctype)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:
                    pass  # the client gave up (a timeout test)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.Handler = Handler
        self.port = self.httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    # -- control -------------------------------------------------------------------------

    def script(self, *replies: Reply) -> None:
        """What to answer: one reply per request, in order; the last one repeats."""
        assert replies
        with self._lock:
            self._replies = list(replies)

    def _take(self, req: Request) -> Reply:
        with self._lock:
            self.requests.append(req)
            return self._replies.pop(0) if len(self._replies) > 1 else self._replies[0]

    def _answer(self, h: Any, req: Request, reply: Reply) -> None:
        if isinstance(reply, Slow):
            if self.stopping.wait(reply.seconds):
                return
            reply = reply.text
        if isinstance(reply, Gated):
            while not reply.gate.wait(0.05):
                if self.stopping.is_set():
                    return
            reply = reply.text
        if isinstance(reply, Status):
            h._send(reply.code, reply.body)
            return
        if isinstance(reply, Malformed):
            h._send(200, reply.body)
            return
        if isinstance(reply, Shape):
            h._send(200, reply.data)
            return
        if isinstance(reply, Redirect):
            h.send_response(reply.code)
            h.send_header("Location", reply.location)
            h.send_header("Content-Length", "0")
            h.end_headers()
            return
        model = req.body.get("model") if isinstance(req.body, dict) else None
        if self.models is not None and model not in self.models:
            h._send(
                404,
                {"error": f"model '{model}' not found"}
                if req.path.startswith("/api/")
                else {"error": {"message": f"The model `{model}` does not exist", "type": "invalid_request_error"}},
            )
            return
        if req.path == "/api/generate":
            h._send(
                200,
                {
                    "model": model,
                    "created_at": "2025-01-01T00:00:00Z",
                    "response": reply,
                    "done": True,
                    "done_reason": "stop",
                },
            )
        elif req.path == "/api/chat":
            h._send(
                200,
                {
                    "model": model,
                    "created_at": "2025-01-01T00:00:00Z",
                    "message": {"role": "assistant", "content": reply},
                    "done": True,
                },
            )
        elif req.path == "/v1/chat/completions":
            h._send(
                200,
                {
                    "id": "chatcmpl-1",
                    "object": "chat.completion",
                    "created": 0,
                    "model": model,
                    "choices": [
                        {"index": 0, "message": {"role": "assistant", "content": reply}, "finish_reason": "stop"}
                    ],
                    "usage": {"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12},
                },
            )
        else:
            h._send(404, "404 page not found")

    # -- lifetime ------------------------------------------------------------------------

    def start(self) -> BrainServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.stopping.set()
        self.httpd.shutdown()
        self.httpd.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> BrainServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def closed_port() -> int:
    """A port on 127.0.0.1 nothing listens on (connecting is refused)."""
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return int(port)
