"""Listeners: bind, log the real address, accept, hand each connection to its protocol handler.

A listener owns only its accept loop. Connection tasks run in a task group the app owns, so that
shutdown can stop accepting first and still let open connections finish what they acknowledged.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import ssl
from collections.abc import Awaitable, Callable

import anyio
from anyio.abc import ByteStream, SocketAttribute, SocketListener, SocketStream, TaskGroup, TaskStatus
from anyio.streams.tls import TLSStream

from trimaran.amqp091.frames import ProtocolHeader, classify_protocol_header
from trimaran.amqp091.spec import PROTOCOL_HEADER as AMQP091_HEADER
from trimaran.config import Endpoint, TlsSettings

log = logging.getLogger(__name__)

# A protocol handler serves one accepted connection until it closes.
ConnectionHandler = Callable[[ByteStream, str], Awaitable[None]]

# An AMQP handler also gets the bytes the port already read: the 8-byte header and any after it.
AmqpHandler = Callable[[ByteStream, str, bytes], Awaitable[None]]

TLS_HANDSHAKE_TIMEOUT = 10.0
PROTOCOL_HEADER_TIMEOUT = 10.0

_AMQP091 = frozenset({ProtocolHeader.AMQP_0_9_1, ProtocolHeader.AMQP_0_9})
_AMQP1 = frozenset({ProtocolHeader.AMQP_1_0, ProtocolHeader.AMQP_1_0_SASL, ProtocolHeader.AMQP_1_0_TLS})


def peer_name(stream: SocketStream) -> str:
    try:
        address = stream.extra(SocketAttribute.remote_address)
    except Exception:
        return "?"
    if isinstance(address, tuple):
        return f"{address[0]}:{address[1]}"
    return str(address)


def server_tls_context(settings: TlsSettings) -> ssl.SSLContext:
    if settings.cert_file is None or settings.key_file is None:
        raise ValueError("listeners.tls.cert_file and listeners.tls.key_file are needed for a TLS listener")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = (
        ssl.TLSVersion.TLSv1_3 if settings.min_version == "1.3" else ssl.TLSVersion.TLSv1_2
    )
    context.load_cert_chain(settings.cert_file, settings.key_file)
    if settings.ca_file is not None:
        context.load_verify_locations(settings.ca_file)
        context.verify_mode = ssl.CERT_REQUIRED if settings.require_client_cert else ssl.CERT_OPTIONAL
    return context


class Listener:
    def __init__(
        self,
        name: str,
        endpoint: Endpoint,
        handler: ConnectionHandler,
        *,
        tls: ssl.SSLContext | None = None,
        backlog: int = 1024,
        nodelay: bool = True,
    ) -> None:
        self.name = name
        self.endpoint = endpoint
        self.handler = handler
        self.tls = tls
        self.backlog = backlog
        self.nodelay = nodelay
        self.bound: Endpoint | None = None
        self._accepting = anyio.CancelScope()

    async def serve(self, connections: TaskGroup, *, task_status: TaskStatus[Endpoint]) -> None:
        # One socket per address family the host resolves to (e.g. 'localhost': IPv4 and IPv6).
        multi = await anyio.create_tcp_listener(
            local_host=self.endpoint.host, local_port=self.endpoint.port, backlog=self.backlog
        )
        async with multi:
            for sub in multi.listeners:
                address = sub.extra(SocketAttribute.local_address)
                assert isinstance(address, tuple)
                bound = Endpoint(str(address[0]), int(address[1]))
                self.bound = self.bound or bound
                log.info("%s listener ready on %s", self.name, bound)
            assert self.bound is not None
            task_status.started(self.bound)
            with self._accepting:
                async with anyio.create_task_group() as accepting:
                    for sub in multi.listeners:
                        assert isinstance(sub, SocketListener)
                        accepting.start_soon(self._accept_loop, sub, connections)
        log.info("%s listener on %s stopped accepting", self.name, self.bound)

    async def _accept_loop(self, listener: SocketListener, connections: TaskGroup) -> None:
        while True:
            try:
                stream = await listener.accept()
            except OSError as exc:
                # Out of file descriptors and the like: say so, back off, keep serving the others.
                log.error("%s: accept failed: %s", self.name, exc)
                await anyio.sleep(0.1)
                continue
            connections.start_soon(self._serve_one, stream, name=f"{self.name} connection")

    def stop_accepting(self) -> None:
        self._accepting.cancel()

    async def _serve_one(self, stream: SocketStream) -> None:
        peer = peer_name(stream)
        if self.nodelay:
            # We batch writes ourselves, so Nagle only adds latency.
            raw = stream.extra(SocketAttribute.raw_socket)
            raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        connection: ByteStream = stream
        if self.tls is not None:
            try:
                with anyio.fail_after(TLS_HANDSHAKE_TIMEOUT):
                    connection = await TLSStream.wrap(
                        stream, server_side=True, ssl_context=self.tls, standard_compatible=False
                    )
            except (TimeoutError, ssl.SSLError, OSError, anyio.BrokenResourceError, anyio.EndOfStream) as exc:
                log.info("%s: TLS handshake with %s failed: %s", self.name, peer, exc or type(exc).__name__)
                await stream.aclose()
                return
        try:
            await self.handler(connection, peer)
        except Exception:
            # A bug in one connection's handler must never take the listener down.
            log.exception("%s: connection from %s failed", self.name, peer)
        finally:
            await connection.aclose()


class AmqpPort:
    """Port 5672 serves AMQP 0.9.1 and AMQP 1.0: the 8-byte protocol header says which.

    A header neither front end speaks is answered with the AMQP 0.9.1 header and the connection
    closed, as both specifications ask of a server that does not support the requested version.
    """

    def __init__(
        self,
        amqp091: AmqpHandler | None,
        amqp1: AmqpHandler | None,
        *,
        header_timeout: float = PROTOCOL_HEADER_TIMEOUT,
    ) -> None:
        self.amqp091 = amqp091
        self.amqp1 = amqp1
        self.header_timeout = header_timeout

    async def handle(self, stream: ByteStream, peer: str) -> None:
        data = b""
        kind: ProtocolHeader | None = None
        with anyio.move_on_after(self.header_timeout):
            while True:
                try:
                    data += await stream.receive()
                except (anyio.EndOfStream, anyio.BrokenResourceError, OSError):
                    return
                found = classify_protocol_header(data)
                if isinstance(found, ProtocolHeader):
                    kind = found
                    break
        if kind is None:
            log.info("amqp: %s sent no protocol header within %.0fs; closing", peer, self.header_timeout)
            return
        handler = self.amqp091 if kind in _AMQP091 else self.amqp1 if kind in _AMQP1 else None
        if handler is None:
            log.info("amqp: %s sent header %r (%s), which is not served; closing", peer, data[:8], kind.value)
            with anyio.move_on_after(1), contextlib.suppress(anyio.BrokenResourceError, OSError):
                await stream.send(AMQP091_HEADER)
            return
        await handler(stream, peer, data)
