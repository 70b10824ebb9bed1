"""MQTT over WebSocket as a machine around the MQTT machine, so that the runtime drives both.

websockets' sans-IO ``ServerProtocol`` does the opening handshake and the framing. Binary frames
may split or join MQTT packets anywhere, so their payloads are fed to the inner machine as a byte
stream; what the inner machine sends leaves as one binary frame per flush. Text frames are refused
(MQTT over WebSocket is binary only, MQTT 5.0 section 6.0).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Sequence

from websockets.exceptions import InvalidState
from websockets.frames import CloseCode, Frame, Opcode
from websockets.http11 import Request
from websockets.server import ServerProtocol
from websockets.typing import Subprotocol

from trimaran.runtime.machine import Machine

log = logging.getLogger(__name__)

HANDSHAKE_TIMEOUT = 10.0


class _NoSubprotocol(Exception):
    def __init__(self, offered: Sequence[str]) -> None:
        super().__init__(f"no supported subprotocol among {list(offered)}")


def _select_subprotocol(
    supported: Sequence[str],
) -> Callable[[ServerProtocol, Sequence[Subprotocol]], Subprotocol | None]:
    def select(_protocol: ServerProtocol, offered: Sequence[Subprotocol]) -> Subprotocol | None:
        for name in offered:
            if name in supported:
                return name
        # A client that offers no subprotocol at all is let in, as Mosquitto does.
        if offered:
            raise _NoSubprotocol(offered)
        return None

    return select


class WebSocketMachine:
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
            select_subprotocol=_select_subprotocol(subprotocols),
            max_size=max_message_size,
        )
        self.upgraded = False
        self._refused = False
        self._ended = False  # the WebSocket is over (close frame, text frame, refused handshake)
        self._handshake_until: float | None = now + HANDSHAKE_TIMEOUT

    @property
    def closed(self) -> bool:
        return self._refused or (self.upgraded and self.inner.closed)

    peer_close_s = 0.0  # RFC 6455 7.1.1: the server closes the TCP connection first

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
            self._refuse(400, f"bad handshake: {self.protocol.handshake_exc}")

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
            response = self.protocol.accept(request)
        except _NoSubprotocol as exc:
            self._refuse(400, str(exc))
            return
        self.protocol.send_response(response)
        if response.status_code == 101:
            self.upgraded = True
            self._handshake_until = None
        else:
            self._refused = True

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
        return b"".join(self.protocol.data_to_send())

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
