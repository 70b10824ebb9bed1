"""A real HTTP server for webhook tests: records each POST and answers as the test scripts it.

Runs in threads (``ThreadingHTTPServer``, HTTP/1.1 keep-alive) on port 0, optionally over TLS.
``statuses`` is consumed one per request (then 200); ``hang`` makes every request wait unanswered
until the receiver is closed, like an endpoint that never answers; ``close_silently`` closes each
kept-alive connection after its answer, as servers with a short idle timeout do.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import ssl
import threading
import time
from collections import deque
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Received:
    path: str
    headers: dict[str, str]  # lower-case names
    body: bytes
    at: float  # monotonic
    status: int

    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def events(self) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = self.json()["events"]
        return events


def verify(secret: bytes, headers: dict[str, str], body: bytes, max_age_s: float = 300) -> bool:
    """The receiver's check, as the README documents it."""
    timestamp = headers["x-trimaran-timestamp"]
    expected = "sha256=" + hmac.new(secret, timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()
    fresh = abs(time.time() - int(timestamp)) <= max_age_s
    return fresh and hmac.compare_digest(expected, headers["x-trimaran-signature"])


class Receiver:
    def __init__(self, tls: ssl.SSLContext | None = None) -> None:
        self.requests: list[Received] = []
        self.statuses: deque[int] = deque()
        self.hang = False
        self.close_silently = False  # close each connection after answering, without saying so
        self.connections = 0
        self._released = threading.Event()
        self._changed = threading.Condition()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self) -> None:
                super().setup()
                with receiver._changed:
                    receiver.connections += 1

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                body = self.rfile.read(length)
                if receiver.hang:
                    receiver._record(self, body, 0)
                    receiver._released.wait(30)
                    self.close_connection = True
                    return
                status = receiver.statuses.popleft() if receiver.statuses else 200
                # Record before answering: once the sender has its answer, the test may look.
                receiver._record(self, body, status)
                self.send_response(status)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")
                if receiver.close_silently:
                    self.close_connection = True

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.scheme = "http"
        if tls is not None:
            self.server.socket = tls.wrap_socket(self.server.socket, server_side=True)
            self.scheme = "https"
        self.port = self.server.server_address[1]
        self._thread = threading.Thread(target=self.server.serve_forever, args=(0.02,), daemon=True)

    def _record(self, handler: BaseHTTPRequestHandler, body: bytes, status: int) -> None:
        headers = {name.lower(): value for name, value in handler.headers.items()}
        with self._changed:
            self.requests.append(Received(handler.path, headers, body, time.monotonic(), status))
            self._changed.notify_all()

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}/hooks"

    def __enter__(self) -> Receiver:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._released.set()
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(5)

    def wait_for(self, count: int, timeout: float = 5.0) -> list[Received]:
        """Wait until ``count`` requests have arrived; returns them all."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while len(self.requests) < count:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"{len(self.requests)} requests arrived, expected {count}")
                self._changed.wait(left)
            return list(self.requests)

    def events(self) -> list[dict[str, Any]]:
        """Every event received so far (answered ones and unanswered alike), in arrival order."""
        with self._changed:
            return [event for request in self.requests for event in request.events]

    def wait_for_events(self, predicate: Any, timeout: float = 5.0) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            events = self.events()
            if predicate(events):
                return events
            time.sleep(0.02)
        raise AssertionError(f"condition not met; events: {json.dumps(self.events(), indent=1)[:4000]}")
