"""MQTT over WebSocket as a machine around the MQTT machine, so that the runtime drives both.

websockets' sans-IO ``ServerProtocol`` does the opening handshake and the framing. Binary frames
may split or join MQTT packets anywhere, so their payloads are fed to the inner machine as a byte
stream; what the inner machine sends leaves as one binary frame per flush. Text frames are refused
(MQTT over WebSocket is binary only, MQTT 5.0 section 6.0).

A handshake that cannot be taken gets one HTTP answer and one log line saying why: websockets'
own for what it refuses while parsing (414 for a request line, 431 for headers too large) and for
what ``accept`` refuses (400 for a missing or bad Sec-WebSocket-Key or version, 426 without
``Upgrade: websocket``, 405 for a method other than GET); ours for the rest (400 for what is not
an HTTP request, where websockets would only close; 404, 403, and 400 for no MQTT subprotocol).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Sequence

from websockets.exceptions import InvalidHandshake, InvalidState
from websockets.frames import CloseCode, Frame, Opcode
from websockets.headers import parse_subprotocol
from websockets.http11 import Request
from websockets.server import ServerProtocol
from websockets.typing import Subprotocol

from trimaran.runtime.machine import Machine

log = logging.getLogger(__name__)

HANDSHAKE_TIMEOUT = 10.0


def _offered_subprotocols(request: Request) -> list[str]:
    """The subprotocols the client offers (raises ``InvalidHandshake`` for a malformed header)."""
    offered: list[str] = []
    for value in request.headers.get_all("Sec-WebSocket-Protocol"):
        offered.extend(parse_subprotocol(value))
    return offered


def _first_supported(
    supported: Sequence[str],
) -> Callable[[ServerProtocol, Sequence[Subprotocol]], Subprotocol | None]:
    def select(_protocol: ServerProtocol, offered: Sequence[Subprotocol]) -> Subprotocol | None:
        # ``_answer`` refused a client that offers only others; none offered: let in, as Mosquitto does.
        return next((name for name in offered if name in supported), None)

    return select


class WebSocketMachine(Machine):
    """The runtime's machine for a WebSocket connection: the handshake, then the inner machine."""

    def __init__(
        self,
        inner: Machine,
        *,
        paths: Sequence[str],
        now: float,
        origins: Sequence[str] = (),
        subprotocols: Sequence[str] = ("mqtt", "mqttv3.1"),
        max_message_size: int | None = None,
        peer: str = "",
    ) -> None:
        self.inner = inner
        self.paths = tuple(paths)
        self.origins = tuple(origins)
        self.peer = peer
        self.protocol = ServerProtocol(
            subprotocols=[Subprotocol(name) for name in subprotocols],
            select_subprotocol=_first_supported(subprotocols),
            max_size=max_message_size,
        )
        self.supported = tuple(subprotocols)
        self.upgraded = False
        self._refused = False
        self._reply = b""  # our own answer where websockets would only close
        self._ended = False  # the WebSocket is over (close frame, text frame, refused handshake)
        self._handshake_until: float | None = now + HANDSHAKE_TIMEOUT

    @property
    def closed(self) -> bool:
        # peer_close_s stays 0: RFC 6455 7.1.1, the server closes the TCP connection first
        return self._refused or (self.upgraded and self.inner.closed)

    def receive_data(self, data: bytes, now: float) -> None:
        if self._ended:
            return
        self.protocol.receive_data(data)
        for event in self.protocol.events_received():
            if isinstance(event, Request):
                self._answer(event)
            elif isinstance(event, Frame):
                self._frame(event, now)
        if not self.upgraded and self.protocol.handshake_exc is not None and not self._refused:
            self._refused_by_parser(self.protocol.handshake_exc)

    def _refused_by_parser(self, exc: Exception) -> None:
        """websockets could not read the request: it answered (414, 431) or only closed (anything
        that is not an HTTP request), where h11 would answer 400: then we do."""
        self._refused = self._ended = True
        sent = b"".join(self.protocol.data_to_send())
        if sent.startswith(b"HTTP/"):
            status = int(sent.split(b" ", 2)[1])
        else:
            status = 400
            text = "Failed to open a WebSocket connection: not an HTTP request.\n"
            sent = self.protocol.reject(400, text).serialize()
        self._reply = sent
        reason = "; ".join(str(e) for e in _chain(exc))
        log.info("websocket: handshake with %s refused: %d %s", self.peer, status, reason)

    def _answer(self, request: Request) -> None:
        path = request.path.split("?", 1)[0]
        origin = request.headers.get("Origin")
        if path not in self.paths:
            self._refuse(404, f"no WebSocket endpoint at {request.path}; try {self.paths[0]}")
            return
        if self.origins and origin not in self.origins:
            self._refuse(403, f"origin {origin!r} is not allowed")
            return
        try:
            offered = _offered_subprotocols(request)
        except InvalidHandshake as exc:
            self._refuse(400, f"bad Sec-WebSocket-Protocol header: {exc}")
            return
        if offered and not any(name in self.supported for name in offered):
            self._refuse(
                400, f"no supported subprotocol among {offered}; this server speaks {list(self.supported)}"
            )
            return
        response = self.protocol.accept(request)
        self.protocol.send_response(response)
        if response.status_code == 101:
            self.upgraded = True
            self._handshake_until = None
        else:
            # websockets' refusal (a missing or bad key, version or upgrade header, another method).
            self._refused = True
            why = self.protocol.handshake_exc
            reason = "; ".join(str(e) for e in _chain(why)) if why is not None else response.reason_phrase
            log.info("websocket: handshake with %s refused: %d %s", self.peer, response.status_code, reason)

    def _refuse(self, status: int, reason: str) -> None:
        log.info("websocket: handshake with %s refused: %d %s", self.peer, status, reason)
        self.protocol.send_response(self.protocol.reject(status, reason + "\n"))
        self._refused = self._ended = True

    def _frame(self, frame: Frame, now: float) -> None:
        if frame.opcode in (Opcode.BINARY, Opcode.CONT):
            if frame.data:
                self.inner.receive_data(bytes(frame.data), now)
        elif frame.opcode is Opcode.TEXT:
            log.info("websocket: %s sent a text frame; MQTT needs binary frames", self.peer)
            self.protocol.send_close(CloseCode.UNSUPPORTED_DATA, "MQTT needs binary frames")
            self._end()
        elif frame.opcode is Opcode.CLOSE:
            self._end()

    def _end(self) -> None:
        self._ended = True
        self.inner.receive_eof()

    def receive_eof(self) -> None:
        self.protocol.receive_eof()
        if self.upgraded:
            self._end()
        else:
            self._refused = self._ended = True

    def next_event(self) -> object | None:
        return self.inner.next_event() if self.upgraded else None

    def data_to_send(self) -> bytes:
        if self.upgraded:
            payload = self.inner.data_to_send()
            if payload:
                # Once the WebSocket is closed under the inner machine, nothing more reaches the peer.
                with contextlib.suppress(InvalidState):
                    self.protocol.send_binary(payload)
            if self.inner.closed and not self._ended:
                self._ended = True
                with contextlib.suppress(InvalidState):
                    self.protocol.send_close(CloseCode.NORMAL_CLOSURE)
        data = b"".join(self.protocol.data_to_send())
        if self._reply:
            data, self._reply = self._reply + data, b""
        return data

    def next_deadline(self) -> float | None:
        return self._handshake_until if not self.upgraded else self.inner.next_deadline()

    def paused(self, now: float) -> None:
        if self.upgraded:
            self.inner.paused(now)

    def tick(self, now: float) -> None:
        if self.upgraded:
            self.inner.tick(now)
        elif self._handshake_until is not None and now >= self._handshake_until:
            log.info("websocket: %s did not finish the handshake in time", self.peer)
            self._refused = self._ended = True
            self._handshake_until = None


def _chain(exc: BaseException) -> list[BaseException]:
    """An exception and its causes: websockets says "did not receive a valid HTTP request" and
    puts what was wrong in the cause."""
    chain = [exc]
    while chain[-1].__cause__ is not None and len(chain) < 4:
        chain.append(chain[-1].__cause__)
    return chain
