"""Listeners: bind, log the real address, and hand each connection to the runtime (protocol
listeners) or to an HTTP handler (the admin port).

Protocol listeners are the runtime's ``asyncio`` servers; each is owned by a task that the app's
task group runs, so shutdown stops accepting first and the runner then closes the connections.
"""

from __future__ import annotations

import logging
import socket
import ssl
from collections.abc import Awaitable, Callable

import anyio
from anyio.abc import ByteStream, SocketAttribute, SocketListener, SocketStream, TaskGroup, TaskStatus
from anyio.streams.tls import TLSStream

from trimaran.amqp091.frames import ProtocolHeader, classify_protocol_header
from trimaran.amqp091.spec import PROTOCOL_HEADER as AMQP091_HEADER
from trimaran.config import LISTEN_BACKLOG, Endpoint
from trimaran.runtime.runner import Runner
from trimaran.runtime.transport import Conn, Hull, HullFactory, Refused

log = logging.getLogger(__name__)

# An HTTP handler serves one accepted connection until it closes.
ConnectionHandler = Callable[[ByteStream, str], Awaitable[None]]

TLS_HANDSHAKE_TIMEOUT = 10.0

_AMQP091 = frozenset({ProtocolHeader.AMQP_0_9_1, ProtocolHeader.AMQP_0_9})
_AMQP1 = frozenset({ProtocolHeader.AMQP_1_0, ProtocolHeader.AMQP_1_0_SASL, ProtocolHeader.AMQP_1_0_TLS})


class ProtocolListener:
    """A listener whose connections the runtime serves."""

    def __init__(
        self,
        name: str,
        endpoint: Endpoint,
        factory: HullFactory,
        runner: Runner,
        *,
        tls: ssl.SSLContext | None = None,
        backlog: int = LISTEN_BACKLOG,
    ) -> None:
        self.name = name
        self.endpoint = endpoint
        self.factory = factory
        self.runner = runner
        self.tls = tls
        self.backlog = backlog
        self.bound: Endpoint | None = None

    async def serve(self, *, task_status: TaskStatus[Endpoint]) -> None:
        addresses = await self.runner.serve(
            self.name,
            self.endpoint.host,
            self.endpoint.port,
            self.factory,
            tls=self.tls,
            backlog=self.backlog,
        )
        for host, port in addresses:
            bound = Endpoint(host, port)
            self.bound = self.bound or bound
            log.info("%s listener ready on %s", self.name, bound)
        assert self.bound is not None
        task_status.started(self.bound)

    def stop_accepting(self) -> None:
        """The runner stops every protocol listener at once."""


def amqp_port(amqp091: Callable[[Conn], Hull] | None, amqp1: Callable[[Conn], Hull] | None) -> HullFactory:
    """Port 5672 serves AMQP 0.9.1 and AMQP 1.0: the 8-byte protocol header says which.

    A header neither front end speaks is answered with the AMQP 0.9.1 header and the connection
    closed, as both specifications ask of a server that does not support the requested version.
    """

    def choose(io: Conn, first: bytes) -> Hull | None:
        found = classify_protocol_header(first)
        if not isinstance(found, ProtocolHeader):
            return None  # fewer than 8 bytes so far
        open_hull = amqp091 if found in _AMQP091 else amqp1 if found in _AMQP1 else None
        if open_hull is None:
            raise Refused(f"protocol header {first[:8]!r} ({found.value}) is not served", AMQP091_HEADER)
        return open_hull(io)

    return choose


def peer_name(stream: SocketStream) -> str:
    try:
        address = stream.extra(SocketAttribute.remote_address)
    except Exception:
        return "?"
    if isinstance(address, tuple):
        return f"{address[0]}:{address[1]}"
    return str(address)


class Listener:
    """The admin HTTP listener: anyio streams, one task per request connection."""

    def __init__(
        self,
        name: str,
        endpoint: Endpoint,
        handler: ConnectionHandler,
        *,
        tls: ssl.SSLContext | None = None,
        backlog: int = LISTEN_BACKLOG,
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
        self._connections: TaskGroup | None = None

    async def serve(self, *, task_status: TaskStatus[Endpoint]) -> None:
        # One socket per address family the host resolves to (e.g. 'localhost': IPv4 and IPv6).
        multi = await anyio.create_tcp_listener(
            local_host=self.endpoint.host, local_port=self.endpoint.port, backlog=self.backlog
        )
        async with multi, anyio.create_task_group() as connections:
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
            connections.cancel_scope.cancel()

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
        # Everything about one connection, its socket options included, stays inside this try: a
        # peer that resets before its first byte must never reach the listener.
        peer = "?"
        connection: ByteStream = stream
        try:
            peer = peer_name(stream)
            if self.nodelay:
                try:
                    raw = stream.extra(SocketAttribute.raw_socket)
                    raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                except (OSError, AttributeError):
                    # Reset before we got here: anyio has no socket left to look at (AttributeError
                    # from inside its extra attributes), or the option is refused.
                    log.debug("%s: connection from %s was gone before its first byte", self.name, peer)
                    return
            if self.tls is not None:
                with anyio.fail_after(TLS_HANDSHAKE_TIMEOUT):
                    connection = await TLSStream.wrap(
                        stream, server_side=True, ssl_context=self.tls, standard_compatible=False
                    )
            await self.handler(connection, peer)
        except (TimeoutError, ssl.SSLError, OSError, anyio.BrokenResourceError, anyio.EndOfStream) as exc:
            log.info("%s: connection from %s ended: %s", self.name, peer, exc or type(exc).__name__)
        except Exception:
            log.exception("%s: connection from %s failed", self.name, peer)
        finally:
            try:
                await connection.aclose()
            except Exception:
                log.debug("%s: closing the connection from %s failed", self.name, peer, exc_info=True)
