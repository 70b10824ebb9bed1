"""MQTT over WebSocket: websockets' sans-IO server protocol wrapped as an anyio ByteStream.

The handler above sees a plain byte stream: binary frames may split or join MQTT packets anywhere,
so frame payloads are simply concatenated. Text frames are refused (MQTT over WebSocket is binary
only, MQTT 5.0 section 6.0).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import anyio
from anyio.abc import ByteStream
from websockets.exceptions import InvalidState, ProtocolError
from websockets.frames import CloseCode, Frame, Opcode
from websockets.http11 import Request
from websockets.server import ServerProtocol
from websockets.typing import Subprotocol

log = logging.getLogger(__name__)

READ_CHUNK = 65536
HANDSHAKE_TIMEOUT = 10.0


class WebSocketError(Exception):
    """The opening handshake failed; the HTTP error response has been sent."""


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


class _NoSubprotocol(Exception):
    def __init__(self, offered: Sequence[str]) -> None:
        super().__init__(f"no supported subprotocol among {list(offered)}")


class WebSocketStream(ByteStream):
    def __init__(self, transport: ByteStream, protocol: ServerProtocol, peer: str) -> None:
        self.transport = transport
        self.protocol = protocol
        self.peer = peer
        self.subprotocol = protocol.subprotocol
        self._pending: list[bytes] = []
        self._send_lock = anyio.Lock()
        self._eof = False

    @classmethod
    async def accept(
        cls,
        transport: ByteStream,
        *,
        path: str,
        subprotocols: Sequence[str] = ("mqtt", "mqttv3.1"),
        max_message_size: int | None = None,
        peer: str = "",
    ) -> WebSocketStream:
        """Run the opening handshake; raise WebSocketError (after answering) when it fails."""
        protocol = ServerProtocol(
            subprotocols=[Subprotocol(name) for name in subprotocols],
            select_subprotocol=_select_subprotocol(subprotocols),
            max_size=max_message_size,
        )
        with anyio.fail_after(HANDSHAKE_TIMEOUT):
            request = await cls._read_request(transport, protocol)
        if request.path.split("?", 1)[0] != path:
            response = protocol.reject(404, f"no WebSocket endpoint at {request.path}; try {path}\n")
        else:
            try:
                response = protocol.accept(request)
            except _NoSubprotocol as exc:
                response = protocol.reject(400, f"{exc}\n")
        protocol.send_response(response)
        await transport.send(b"".join(protocol.data_to_send()))
        if response.status_code != 101:
            log.info(
                "websocket: handshake with %s refused: %s %s",
                peer,
                response.status_code,
                response.body.decode(errors="replace").strip() if response.body else "",
            )
            raise WebSocketError(response.status_code)
        return cls(transport, protocol, peer)

    @staticmethod
    async def _read_request(transport: ByteStream, protocol: ServerProtocol) -> Request:
        while True:
            try:
                data = await transport.receive(READ_CHUNK)
            except anyio.EndOfStream:
                raise WebSocketError("closed during handshake") from None
            protocol.receive_data(data)
            for event in protocol.events_received():
                if isinstance(event, Request):
                    return event
            if protocol.handshake_exc is not None:
                protocol.send_response(protocol.reject(400, f"bad handshake: {protocol.handshake_exc}\n"))
                await transport.send(b"".join(protocol.data_to_send()))
                raise WebSocketError(str(protocol.handshake_exc))

    async def receive(self, max_bytes: int = READ_CHUNK) -> bytes:
        while not self._pending:
            if self._eof:
                raise anyio.EndOfStream
            try:
                data = await self.transport.receive(READ_CHUNK)
            except anyio.EndOfStream:
                self.protocol.receive_eof()
                self._eof = True
                continue
            self.protocol.receive_data(data)
            for event in self.protocol.events_received():
                if not isinstance(event, Frame):
                    continue
                if event.opcode in (Opcode.BINARY, Opcode.CONT):
                    if event.data:
                        self._pending.append(bytes(event.data))
                elif event.opcode is Opcode.TEXT:
                    log.info("websocket: %s sent a text frame; MQTT needs binary frames", self.peer)
                    self.protocol.send_close(CloseCode.UNSUPPORTED_DATA, "MQTT needs binary frames")
                    self._eof = True
                elif event.opcode is Opcode.CLOSE:
                    self._eof = True
            # Pongs and close replies the protocol queued on its own.
            await self._flush()
            if self.protocol.close_expected():
                self._eof = True
        data = b"".join(self._pending)
        self._pending.clear()
        return data

    async def send(self, item: bytes) -> None:
        async with self._send_lock:
            try:
                self.protocol.send_binary(item)
            except InvalidState:
                raise anyio.BrokenResourceError from None
            await self.transport.send(b"".join(self.protocol.data_to_send()))

    async def _flush(self) -> None:
        data = self.protocol.data_to_send()
        if data:
            async with self._send_lock:
                await self.transport.send(b"".join(data))

    async def send_eof(self) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        try:
            self.protocol.send_close(CloseCode.NORMAL_CLOSURE)
            await self._flush()
        except (InvalidState, ProtocolError, anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            pass
        await self.transport.aclose()


__all__ = ["WebSocketError", "WebSocketStream"]
