"""runtime/poller.py: TCP and TLS connections on one epoll, with an asyncio transport's semantics.

Real sockets on port 0, on asyncio's loop and on uvloop; a recording stand-in for ``Conn``.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import socket
import ssl
import struct
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any, cast

import pytest
import trustme
import uvloop

from trimaran.runtime import poller as poller_module
from trimaran.runtime.poller import HIGH_WATER, Poller, SocketTransport, TlsTransport
from trimaran.runtime.transport import Runner

pytestmark = pytest.mark.skipif(not hasattr(__import__("select"), "epoll"), reason="epoll is Linux's")


class Recorder(asyncio.Protocol):
    """What a connection is told, in order; ``eof_keeps_open`` is eof_received's answer."""

    peer = "the peer"
    listener = "test"

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.data = bytearray()
        self.transport: SocketTransport | None = None
        self.lost: asyncio.Future[Exception | None] = asyncio.get_running_loop().create_future()
        self.eof = asyncio.Event()
        self.got = asyncio.Event()
        self.eof_keeps_open = True
        self.in_write = False
        self.address: Any = None
        self.peer_before_made = False

    def set_peer(self, address: Any) -> None:
        self.address = address

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        self.calls.append("made")
        self.peer_before_made = self.address is not None

    def data_received(self, data: bytes) -> None:
        assert type(data) is bytes
        self.data += data
        self.got.set()

    def eof_received(self) -> bool:
        self.calls.append("eof")
        self.eof.set()
        return self.eof_keeps_open

    def pause_writing(self) -> None:
        self.calls.append("pause_writing")

    def resume_writing(self) -> None:
        self.calls.append("resume_writing")

    def connection_lost(self, exc: Exception | None) -> None:
        assert not self.in_write, "connection_lost inside a write"
        self.calls.append("lost")
        self.lost.set_result(exc)


class Turns(Runner):
    """The runner as the poller sees it: whose turn ends when, among what the connections read."""

    def __init__(self, reads: bytearray) -> None:
        self.reads = reads  # the connection's data, to note how much had come at each turn's end
        self.scheduled = False
        self.log: list[tuple[str, int]] = []

    def turn_begins(self) -> bool:
        if self.scheduled:
            return False
        self.scheduled = True
        return True

    def end_turn(self) -> None:
        self.scheduled = False
        self.log.append(("end", len(self.reads)))

    def end_turn_soon(self) -> None:
        self.scheduled = True
        self.log.append(("soon", len(self.reads)))
        asyncio.get_running_loop().call_soon(self.end_turn)


Case = Callable[[Poller, Recorder, socket.socket], Awaitable[None]]


@contextlib.asynccontextmanager
async def _listener(
    tls: ssl.SSLContext | None = None,
) -> AsyncIterator[tuple[Poller, socket.socket, list[Recorder]]]:
    """A poller with one listener on a free port (``tls``: a TLS one), and the connections it
    accepts as they come; the poller is closed on the way out."""
    conns: list[Recorder] = []
    poller = Poller(asyncio.get_running_loop(), turns=Turns(bytearray()))

    def make() -> Any:
        conns.append(Recorder())
        cast(Turns, poller._turns).reads = conns[-1].data
        return conns[-1]

    (listening,) = poller.listen("127.0.0.1", 0, 16, make, tls)
    try:
        yield poller, listening, conns
    finally:
        poller.close()


def _serve(loop: str, case: Callable[[Poller, Recorder, Any], Awaitable[None]], tls: Any = None) -> None:
    """Run ``case`` on ``loop`` ("asyncio" or "uvloop") with a listener of a poller and one client
    connected to it. ``tls``: the server's and the client's ``SSLContext``, and the client is a
    blocking SSLSocket not yet shaken hands (else a non-blocking plain socket)."""

    async def main() -> None:
        async with _listener(None if tls is None else tls[0]) as (poller, listening, conns):
            client = socket.create_connection(listening.getsockname()[:2])
            if tls is None:
                client.setblocking(False)
            else:
                client = tls[1].wrap_socket(
                    client,
                    server_hostname="127.0.0.1",
                    do_handshake_on_connect=False,
                    suppress_ragged_eofs=False,
                )
                client.settimeout(10)  # a server that stops answering fails the case, never hangs its thread
            try:
                await _until(lambda: bool(conns) and conns[0].transport is not None)
                await case(poller, conns[0], client)
            finally:
                client.close()

    if loop == "uvloop":
        uvloop.run(main())
    else:
        asyncio.run(main())


@pytest.fixture(params=["asyncio", "uvloop"])
def run(request: pytest.FixtureRequest) -> Iterator[Callable[[Case], None]]:
    yield lambda case: _serve(request.param, case)


async def _until(check: Callable[[], bool], timeout: float = 5.0) -> None:
    async with asyncio.timeout(timeout):
        while not check():
            await asyncio.sleep(0.002)


async def _read_all(client: socket.socket, size: int) -> bytes:
    loop = asyncio.get_running_loop()
    got = bytearray()
    while len(got) < size:
        chunk = await loop.sock_recv(client, 1 << 20)
        if not chunk:
            break
        got += chunk
    return bytes(got)


def test_bytes_flow_both_ways_and_the_peer_is_named(run: Callable[[Case], None]) -> None:
    async def case(poller: Poller, conn: Recorder, client: socket.socket) -> None:
        transport = cast(SocketTransport, conn.transport)
        # Told to the connection before it is made; the transport keeps none and asks the socket.
        assert conn.peer_before_made and conn.address == client.getsockname()
        assert transport.get_extra_info("peername") == client.getsockname()
        assert transport.get_extra_info("sockname")[0] == "127.0.0.1"
        client.send(b"hello")
        await _until(lambda: bytes(conn.data) == b"hello")
        transport.write(b"world")
        assert await _read_all(client, 5) == b"world"
        with poller_module._over(transport._fd) as ours:
            assert ours.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)

    run(case)


def test_what_the_socket_does_not_take_is_buffered_and_pauses_the_writer(run: Callable[[Case], None]) -> None:
    async def case(poller: Poller, conn: Recorder, client: socket.socket) -> None:
        transport = cast(SocketTransport, conn.transport)
        payload = bytes(range(256)) * 40_000  # 10 MB: more than both socket buffers hold
        conn.in_write = True
        transport.write(payload)
        conn.in_write = False
        assert transport.get_write_buffer_size() > HIGH_WATER
        assert conn.calls == ["made", "pause_writing"]
        assert await _read_all(client, len(payload)) == payload
        await _until(lambda: "resume_writing" in conn.calls)
        assert transport.get_write_buffer_size() == 0

    run(case)


def test_close_writes_what_is_buffered_first_and_abort_does_not(run: Callable[[Case], None]) -> None:
    async def case(poller: Poller, conn: Recorder, client: socket.socket) -> None:
        transport = cast(SocketTransport, conn.transport)
        payload = b"x" * 5_000_000
        transport.write(payload)
        transport.close()
        transport.write(b"after close")  # dropped, as asyncio's transports do
        assert await _read_all(client, len(payload) + 1) == payload  # then the end of stream
        assert await conn.lost is None
        assert conn.calls.count("lost") == 1

    run(case)


def test_abort_drops_what_waits_and_tells_the_connection_once(run: Callable[[Case], None]) -> None:
    async def case(poller: Poller, conn: Recorder, client: socket.socket) -> None:
        transport = cast(SocketTransport, conn.transport)
        transport.write(b"x" * 5_000_000)
        conn.in_write = True
        transport.abort()
        transport.abort()
        conn.in_write = False
        assert await conn.lost is None
        await asyncio.sleep(0.01)
        assert conn.calls.count("lost") == 1

    run(case)


def test_the_peers_end_of_stream_and_ours(run: Callable[[Case], None]) -> None:
    async def case(poller: Poller, conn: Recorder, client: socket.socket) -> None:
        transport = cast(SocketTransport, conn.transport)
        client.send(b"last words")
        client.shutdown(socket.SHUT_WR)
        await conn.eof.wait()
        assert bytes(conn.data) == b"last words"
        assert not transport.is_reading()
        transport.write(b"answer")
        transport.write_eof()
        assert await _read_all(client, 100) == b"answer"  # and the end: our side is shut
        await asyncio.sleep(0.05)  # both sides shut: the hang-up must not spin or close by itself
        assert conn.calls == ["made", "eof"]
        transport.close()
        assert await conn.lost is None

    run(case)


def test_an_end_of_stream_that_does_not_keep_open_closes(run: Callable[[Case], None]) -> None:
    async def case(poller: Poller, conn: Recorder, client: socket.socket) -> None:
        conn.eof_keeps_open = False
        client.shutdown(socket.SHUT_WR)
        assert await conn.lost is None
        assert conn.calls == ["made", "eof", "lost"]

    run(case)


def test_nothing_is_read_while_paused(run: Callable[[Case], None]) -> None:
    async def case(poller: Poller, conn: Recorder, client: socket.socket) -> None:
        transport = cast(SocketTransport, conn.transport)
        transport.pause_reading()
        client.send(b"wait")
        await asyncio.sleep(0.05)
        assert not conn.data
        transport.resume_reading()
        await _until(lambda: bytes(conn.data) == b"wait")

    run(case)


def test_more_than_one_read_and_the_end_behind_it_are_all_read(run: Callable[[Case], None]) -> None:
    """Edge-triggered: a read that fills the buffer, and bytes with the end right behind them, are
    read on without a new edge."""

    async def case(poller: Poller, conn: Recorder, client: socket.socket) -> None:
        payload = bytes(range(256)) * 12_000  # 3 MB: a dozen full reads
        client.setblocking(True)
        client.sendall(payload)
        client.shutdown(socket.SHUT_WR)
        await conn.eof.wait()
        assert bytes(conn.data) == payload

    run(case)


def test_the_runners_turn_ends_once_the_ready_sockets_are_read(run: Callable[[Case], None]) -> None:
    """The poller's callback ends the runner's turn itself once it has read (no callback scheduled
    for it); after a read that filled the buffer, the turn ends after the reads still to come."""

    async def case(poller: Poller, conn: Recorder, client: socket.socket) -> None:
        turns = cast(Turns, poller._turns)
        turns.log.clear()
        client.sendall(b"ping")
        await _until(lambda: bool(turns.log))
        assert turns.log == [("end", 4)]
        turns.log.clear()
        # Room in the socket for more than a read, all sent before the loop looks: one full read.
        server = socket.socket(fileno=cast(SocketTransport, conn.transport)._fd)
        server.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 * poller_module.READ_SIZE)
        server.detach()
        payload = bytes(poller_module.READ_SIZE + 1000)
        client.setblocking(True)
        client.sendall(payload)
        await _until(lambda: len(conn.data) == 4 + len(payload) and not turns.scheduled)
        assert ("soon", 4 + poller_module.READ_SIZE) in turns.log  # a full read: more to come
        assert turns.log[-1] == ("end", 4 + len(payload))  # ended after the rest, not before
        # A turn already under way (a callback scheduled) is left to end as it would.
        turns.log.clear()
        turns.scheduled = True
        client.sendall(b"more")
        await _until(lambda: len(conn.data) == 8 + len(payload))
        await asyncio.sleep(0.01)
        assert turns.log == []

    run(case)


def test_more_ready_sockets_than_one_poll_takes_are_read_in_one_turn(run: Callable[[Case], None]) -> None:
    """The epoll gives READY_AT_ONCE sockets a poll: the rest of a wake-up's are polled again in the
    same callback, and one turn ends after all of them were read."""

    async def case(poller: Poller, conn: Recorder, client: socket.socket) -> None:
        listening = poller._listening[0]
        count = 2 * poller_module.READY_AT_ONCE + 5
        clients: list[socket.socket] = []
        try:
            for _ in range(count):  # (the listen backlog is 16: accepted as they come)
                other = socket.socket()
                other.setblocking(False)
                clients.append(other)
                await asyncio.get_running_loop().sock_connect(other, listening.getsockname()[:2])
            transports = lambda: [t for t in poller._socks if t is not None]  # noqa: E731
            await _until(lambda: len(transports()) == count + 1)
            conns = [cast(Recorder, t._conn) for t in transports()]
            turns = cast(Turns, poller._turns)
            read_at_ends: list[int] = []
            end_turn = turns.end_turn

            def noting_end_turn() -> None:
                read_at_ends.append(sum(1 for c in conns if c.data))
                end_turn()

            turns.end_turn = noting_end_turn  # type: ignore[method-assign]
            for other in clients:  # all sent before the loop looks again
                other.sendall(b"x")
            await _until(lambda: all(c.data for c in conns if c is not conn))
            assert read_at_ends[0] == count
        finally:
            for other in clients:
                other.close()

    run(case)


def test_what_came_while_paused_is_read_when_reading_resumes(run: Callable[[Case], None]) -> None:
    async def case(poller: Poller, conn: Recorder, client: socket.socket) -> None:
        transport = cast(SocketTransport, conn.transport)
        transport.pause_reading()
        client.send(b"one")
        await asyncio.sleep(0.02)
        client.send(b"two")
        client.shutdown(socket.SHUT_WR)
        await asyncio.sleep(0.05)
        assert not conn.data and not conn.eof.is_set()
        transport.resume_reading()
        await conn.eof.wait()
        assert bytes(conn.data) == b"onetwo"

    run(case)


def test_a_hang_up_while_paused_is_read_when_reading_resumes(
    run: Callable[[Case], None], monkeypatch: pytest.MonkeyPatch
) -> None:
    async def case(poller: Poller, conn: Recorder, client: socket.socket) -> None:
        transport = cast(SocketTransport, conn.transport)
        transport.pause_reading()
        transport.write_eof()  # our side shut: the peer's close makes it a hang-up
        client.send(b"bye")
        client.shutdown(socket.SHUT_WR)
        turns = 0
        ready = poller._ready

        def counted() -> None:
            nonlocal turns
            turns += 1
            ready()

        monkeypatch.setattr(poller, "_ready", counted)
        loop = asyncio.get_running_loop()
        loop.remove_reader(poller._epoll.fileno())
        loop.add_reader(poller._epoll.fileno(), counted)
        await asyncio.sleep(0.1)
        assert turns <= 2, f"{turns} turns for one hang-up: it spins"
        assert not conn.data
        transport.resume_reading()
        await conn.eof.wait()
        assert bytes(conn.data) == b"bye"

    run(case)


def test_a_reset_ends_the_connection_with_its_error(run: Callable[[Case], None]) -> None:
    async def case(poller: Poller, conn: Recorder, client: socket.socket) -> None:
        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        client.close()  # linger 0: a reset
        assert isinstance(await conn.lost, ConnectionResetError)

    run(case)


def test_a_reset_while_paused_ends_it_too(run: Callable[[Case], None]) -> None:
    async def case(poller: Poller, conn: Recorder, client: socket.socket) -> None:
        cast(SocketTransport, conn.transport).pause_reading()
        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        client.close()
        assert isinstance(await conn.lost, ConnectionResetError)

    run(case)


def test_a_write_into_a_reset_socket_is_told_from_the_loop(run: Callable[[Case], None]) -> None:
    async def case(poller: Poller, conn: Recorder, client: socket.socket) -> None:
        transport = cast(SocketTransport, conn.transport)
        transport.pause_reading()  # the reset is not seen by a read first
        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        client.close()
        await asyncio.sleep(0.02)
        conn.in_write = True
        transport.write(b"into the void")
        conn.in_write = False
        assert isinstance(await conn.lost, OSError)

    run(case)


def test_a_connection_that_raises_is_closed_and_the_others_go_on(
    run: Callable[[Case], None], caplog: pytest.LogCaptureFixture
) -> None:
    async def case(poller: Poller, conn: Recorder, client: socket.socket) -> None:
        def broken(data: bytes) -> None:
            raise RuntimeError("a bug")

        conn.data_received = broken  # type: ignore[method-assign]
        client.send(b"x")
        assert isinstance(await conn.lost, RuntimeError)
        assert "data_received from the peer failed: RuntimeError: a bug" in caplog.text

    run(case)


def test_accepting_pauses_when_out_of_descriptors(
    run: Callable[[Case], None], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    async def case(poller: Poller, conn: Recorder, client: socket.socket) -> None:
        listening = poller._listening[0]
        real_accept = socket.socket._accept  # type: ignore[attr-defined]  # (the C accept the poller calls)
        failures = 0

        def accept(self: socket.socket) -> tuple[int, Any]:
            nonlocal failures
            if self is listening and failures < 2:
                failures += 1
                if failures == 1:
                    raise OSError(errno.EPROTO, "a connection's own error: skipped")
                raise OSError(errno.EMFILE, "Too many open files")
            return real_accept(self)  # type: ignore[no-any-return]

        monkeypatch.setattr(socket.socket, "_accept", accept)
        monkeypatch.setattr(poller_module, "ACCEPT_RETRY_S", 0.05)
        other = socket.create_connection(listening.getsockname()[:2])
        try:
            await _until(lambda: failures == 2)
            assert "accept failed" in caplog.text
            await asyncio.sleep(0.1)  # accepted after the pause
            other.send(b"ping")
            await asyncio.sleep(0.05)
            assert sum(t is not None for t in poller._socks) == 2
        finally:
            other.close()

    run(case)


# -- TLS: OpenSSL on the socket itself (TlsTransport) --------------------------------------------------

TlsCase = Callable[[Poller, Recorder, ssl.SSLSocket], Awaitable[None]]


@pytest.fixture(scope="module")
def tls_contexts() -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """The server's context (asking for a client certificate) and a client's that shows one."""
    server_ca, client_ca = trustme.CA(), trustme.CA()
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ca.issue_cert("127.0.0.1").configure_cert(server)
    client_ca.configure_trust(server)
    server.verify_mode = ssl.CERT_OPTIONAL
    client = ssl.create_default_context()
    server_ca.configure_trust(client)
    client_ca.issue_cert("alice.example", common_name="alice").configure_cert(client)
    return server, client


@pytest.fixture(params=["asyncio", "uvloop"])
def run_tls(
    request: pytest.FixtureRequest, tls_contexts: tuple[ssl.SSLContext, ssl.SSLContext]
) -> Iterator[Callable[[TlsCase], None]]:
    """A case over a TLS listener of the poller; the client's calls go to a thread."""
    yield lambda case: _serve(request.param, case, tls_contexts)


def _receive(client: ssl.SSLSocket, size: int) -> bytes:
    got = bytearray()
    while len(got) < size:
        chunk = client.recv(1 << 20)
        if not chunk:
            break
        got += chunk
    return bytes(got)


def test_tls_bytes_flow_after_the_handshake_and_what_was_written_before_it_waits(
    run_tls: Callable[[TlsCase], None],
) -> None:
    async def case(poller: Poller, conn: Recorder, client: ssl.SSLSocket) -> None:
        transport = cast(TlsTransport, conn.transport)
        assert transport.get_extra_info("peercert") is None  # no handshake yet
        transport.write(b"early ")  # before the handshake: it waits for it
        await asyncio.to_thread(client.do_handshake)
        await asyncio.to_thread(client.sendall, b"hello")
        await _until(lambda: bytes(conn.data) == b"hello")
        subject = dict(pair[0] for pair in transport.get_extra_info("peercert")["subject"])
        assert subject["commonName"] == "alice"
        assert transport.get_extra_info("ssl_object").version() == client.version()
        transport.write(b"world")
        assert await asyncio.to_thread(_receive, client, 11) == b"early world"

    run_tls(case)


def test_tls_close_sends_what_waits_then_close_notify(run_tls: Callable[[TlsCase], None]) -> None:
    async def case(poller: Poller, conn: Recorder, client: ssl.SSLSocket) -> None:
        transport = cast(TlsTransport, conn.transport)
        await asyncio.to_thread(client.do_handshake)
        payload = bytes(range(256)) * 40_000  # 10 MB: more than the sockets hold
        conn.in_write = True
        transport.write(payload)
        conn.in_write = False
        assert conn.calls == ["made", "pause_writing"]
        transport.close()
        transport.write(b"after close")  # dropped
        # All of it, then a clean end (the client does not suppress a cut one: it would raise).
        assert await asyncio.to_thread(_receive, client, len(payload) + 1) == payload
        assert await conn.lost is None
        assert conn.calls == ["made", "pause_writing", "lost"]

    run_tls(case)


def test_tls_more_than_one_read_is_all_read_and_the_end_after_it(run_tls: Callable[[TlsCase], None]) -> None:
    async def case(poller: Poller, conn: Recorder, client: ssl.SSLSocket) -> None:
        await asyncio.to_thread(client.do_handshake)
        payload = bytes(range(256)) * 2_000  # 512 KB: several reads of the poller's
        await asyncio.to_thread(client.sendall, payload)
        client.setblocking(False)
        with contextlib.suppress(ssl.SSLWantReadError):  # (the server's close_notify is not waited for)
            client.unwrap()  # close_notify, and the socket stays open
        await conn.eof.wait()
        assert bytes(conn.data) == payload

    run_tls(case)


def test_a_failed_tls_handshake_is_one_line_and_ends_the_connection(
    run_tls: Callable[[TlsCase], None], caplog: pytest.LogCaptureFixture
) -> None:
    async def case(poller: Poller, conn: Recorder, client: ssl.SSLSocket) -> None:
        caplog.set_level(logging.DEBUG, logger=poller_module.__name__)
        plain = socket.socket(fileno=client.detach())  # the client speaks MQTT without TLS
        try:
            plain.sendall(b"\x10\x0c\x00\x04MQTT\x04\x02\x00\x3c\x00\x00")
            assert isinstance(await conn.lost, ssl.SSLError)
        finally:
            plain.close()
        (line,) = [r for r in caplog.records if r.name == poller_module.__name__]
        assert line.levelno == logging.INFO
        assert "TLS handshake with the peer failed" in line.getMessage()
        assert conn.calls == ["made", "lost"] and not conn.data

    run_tls(case)


def test_a_peer_that_leaves_before_its_handshake_is_no_news(
    run_tls: Callable[[TlsCase], None], caplog: pytest.LogCaptureFixture
) -> None:
    async def case(poller: Poller, conn: Recorder, client: ssl.SSLSocket) -> None:
        caplog.set_level(logging.INFO, logger=poller_module.__name__)
        socket.socket(fileno=client.detach()).close()  # a port probe
        await conn.lost
        assert not [r for r in caplog.records if r.name == poller_module.__name__]

    run_tls(case)


def test_a_tls_handshake_that_waits_for_room_to_write_resumes_when_there_is_room() -> None:
    """The server's first flight (a certificate of 400 names: about 10 KB) is more than a small
    send buffer and the client's small window hold while the client does not read: OpenSSL wants
    to write, the handshake waits for room (``_out`` empty), and goes on when the client reads."""
    big = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca = trustme.CA()
    ca.issue_cert("127.0.0.1", *(f"host-{n}.devices.example" for n in range(400))).configure_cert(big)
    client_context = ssl.create_default_context()
    ca.configure_trust(client_context)

    async def main() -> None:
        async with _listener(big) as (_poller, listening, conns):
            listening.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)  # what it accepts inherits it
            raw = socket.socket()
            raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 2048)  # (before connecting: the window)
            raw.connect(listening.getsockname()[:2])
            raw.setblocking(False)
            client = client_context.wrap_socket(
                raw, server_hostname="127.0.0.1", do_handshake_on_connect=False
            )
            try:
                with contextlib.suppress(ssl.SSLWantReadError):
                    client.do_handshake()  # the ClientHello; its answer is not read yet
                await _until(lambda: bool(conns) and conns[0].transport is not None)
                transport = cast(TlsTransport, conns[0].transport)
                await _until(lambda: transport._out is not None)  # the handshake waits for room
                assert not transport._shaken
                transport.write(b"early")  # waits behind the handshake
                client.settimeout(10)
                await asyncio.to_thread(client.do_handshake)  # reads: room, and the handshake goes on
                await asyncio.to_thread(client.sendall, b"hello")
                await _until(lambda: bytes(conns[0].data) == b"hello")
                assert transport._shaken
                assert await asyncio.to_thread(_receive, client, 5) == b"early"
            finally:
                client.close()

    asyncio.run(main())
    uvloop.run(main())
