"""Admin HTTP server: h11 (sans-IO HTTP/1.1) over anyio streams.

Routes are registered as ``(method, pattern)`` where a pattern segment ``{name}`` captures one
path segment. Requests are bounded in size and time.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import anyio
import h11
from anyio.abc import ByteStream

log = logging.getLogger(__name__)

READ_CHUNK = 65536


@dataclass(slots=True)
class Request:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    body: bytes
    params: dict[str, str] = field(default_factory=dict)
    peer: str = ""

    def json(self) -> Any:
        if not self.body:
            return None
        try:
            return json.loads(self.body)
        except ValueError as exc:
            raise HttpError(400, "bad_json", f"request body is not JSON: {exc}") from None

    def arg(self, name: str, default: str | None = None) -> str | None:
        values = self.query.get(name)
        return values[-1] if values else default


@dataclass(slots=True)
class Response:
    status: int
    body: bytes = b""
    content_type: str = "application/json"
    headers: list[tuple[str, str]] = field(default_factory=list)

    @classmethod
    def json(cls, data: Any, status: int = 200) -> Response:
        return cls(status, json.dumps(data, separators=(",", ":")).encode())

    @classmethod
    def text(cls, body: str, status: int = 200, content_type: str = "text/plain; charset=utf-8") -> Response:
        return cls(status, body.encode(), content_type)


class HttpError(Exception):
    """Raised by a route; answered as ``{"error": {"code": ..., "message": ...}}``."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message

    def response(self) -> Response:
        return Response.json({"error": {"code": self.code, "message": self.message}}, self.status)


Handler = Callable[[Request], Awaitable[Response]]


@dataclass(slots=True)
class Route:
    method: str
    segments: tuple[str, ...]
    handler: Handler

    def match(self, segments: list[str]) -> dict[str, str] | None:
        if len(segments) != len(self.segments):
            return None
        params: dict[str, str] = {}
        for pattern, actual in zip(self.segments, segments, strict=True):
            if pattern.startswith("{") and pattern.endswith("}"):
                params[pattern[1:-1]] = unquote(actual)
            elif pattern != actual:
                return None
        return params


class HttpServer:
    def __init__(self, *, max_body_bytes: int = 1 << 20, request_timeout_s: float = 10.0) -> None:
        self.max_body_bytes = max_body_bytes
        self.request_timeout_s = request_timeout_s
        self.routes: list[Route] = []

    def route(self, method: str, pattern: str, handler: Handler) -> None:
        self.routes.append(Route(method.upper(), _split(pattern), handler))

    async def dispatch(self, request: Request) -> Response:
        segments = list(_split(request.path))
        allowed = False
        for route in self.routes:
            params = route.match(segments)
            if params is None:
                continue
            if route.method != request.method:
                allowed = True
                continue
            request.params = params
            try:
                return await route.handler(request)
            except HttpError as exc:
                return exc.response()
        if allowed:
            return HttpError(405, "method_not_allowed", f"{request.method} is not allowed here").response()
        return HttpError(404, "not_found", f"no resource at {request.path}").response()

    async def handle(self, stream: ByteStream, peer: str = "") -> None:
        """Serve one connection: keep-alive, one request at a time."""
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=64 * 1024)
        try:
            while True:
                request: Request | None = None
                with anyio.move_on_after(self.request_timeout_s) as scope:
                    request = await self._read_request(conn, stream, peer)
                if scope.cancelled_caught:
                    if conn.their_state not in (h11.IDLE, h11.DONE):
                        await self._send(
                            conn, stream, HttpError(408, "timeout", "request took too long").response()
                        )
                    return
                if request is None:
                    return
                response = await self.dispatch(request)
                await self._send(conn, stream, response)
                if conn.our_state is h11.MUST_CLOSE or conn.their_state is h11.MUST_CLOSE:
                    return
                conn.start_next_cycle()
        except _BadRequest as exc:
            log.info("http: bad request from %s: %s", peer, exc.error.message)
            if conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
                await self._send(conn, stream, exc.error.response(), close=True)
        except (
            anyio.EndOfStream,
            anyio.BrokenResourceError,
            anyio.ClosedResourceError,
            ConnectionError,
            h11.LocalProtocolError,
        ):
            pass
        finally:
            await stream.aclose()

    async def _read_request(self, conn: h11.Connection, stream: ByteStream, peer: str) -> Request | None:
        head: h11.Request | None = None
        body = bytearray()
        while True:
            try:
                event = conn.next_event()
            except h11.RemoteProtocolError as exc:
                raise _BadRequest(HttpError(exc.error_status_hint, "bad_request", str(exc))) from None
            if event is h11.NEED_DATA:
                if conn.they_are_waiting_for_100_continue:
                    await stream.send(conn.send(h11.InformationalResponse(status_code=100, headers=[])))
                try:
                    data = await stream.receive(READ_CHUNK)
                except anyio.EndOfStream:
                    data = b""
                conn.receive_data(data)
                if not data and conn.their_state is h11.IDLE:
                    return None
                continue
            if isinstance(event, h11.Request):
                head = event
                length = _content_length(event)
                if length is not None and length > self.max_body_bytes:
                    raise _BadRequest(_TOO_LARGE)
            elif isinstance(event, h11.Data):
                body += event.data
                if len(body) > self.max_body_bytes:
                    raise _BadRequest(_TOO_LARGE)
            elif isinstance(event, h11.EndOfMessage):
                assert head is not None
                target = urlsplit(head.target.decode("latin-1"))
                return Request(
                    method=head.method.decode("ascii"),
                    path=target.path,
                    query=parse_qs(target.query),
                    headers={k.decode("latin-1").lower(): v.decode("latin-1") for k, v in head.headers},
                    body=bytes(body),
                    peer=peer,
                )
            elif isinstance(event, h11.ConnectionClosed):
                return None

    async def _send(
        self, conn: h11.Connection, stream: ByteStream, response: Response, close: bool = False
    ) -> None:
        headers = [
            ("content-type", response.content_type),
            ("content-length", str(len(response.body))),
            ("server", "trimaran"),
            *response.headers,
        ]
        if close:
            headers.append(("connection", "close"))
        data = conn.send(
            h11.Response(status_code=response.status, headers=headers, reason=_reason(response.status))
        )
        data += conn.send(h11.Data(data=response.body)) + conn.send(h11.EndOfMessage())
        await stream.send(data)


class _BadRequest(Exception):
    """A request that gets an error answer and then the connection closed."""

    def __init__(self, error: HttpError) -> None:
        super().__init__(error.message)
        self.error = error


_TOO_LARGE = HttpError(413, "too_large", "request body is too large")


def _reason(status: int) -> bytes:
    """The status line's reason phrase (``404 Not Found``): h11 leaves it empty."""
    try:
        return HTTPStatus(status).phrase.encode("ascii")
    except ValueError:
        return b""


def _split(path: str) -> tuple[str, ...]:
    return tuple(part for part in path.split("/") if part)


def _content_length(request: h11.Request) -> int | None:
    for name, value in request.headers:
        if name == b"content-length":
            return int(value)
    return None
