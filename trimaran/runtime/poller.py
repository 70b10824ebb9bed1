"""Plain TCP connections on one epoll: a socket and a small transport each, no event-loop handle.

An event-loop transport (uvloop's, asyncio's) costs about 1.3 KiB a connection before any protocol
state: the transport object, its libuv handle or selector key, the bound callbacks and buffers it
keeps (issue 47). Here every plain TCP connection of the runtime is a socket registered in one
``select.epoll``, and only that epoll's descriptor is registered with the event loop. When it is
ready, :meth:`Poller._ready` reads every ready socket once (up to 64 KiB) and hands each
connection its bytes, as the loop's own transports would, in one callback, which then ends the
runner's turn itself (``Runner.turn_begins``): the reads share one flush, and a wake-up schedules no
callback for it.

:class:`SocketTransport` is an ``outlet.Outlet``, the subset of ``asyncio.Transport`` that
``transport.Conn`` uses, with its semantics: a write goes to the socket at once and what the socket
does not take is buffered (``pause_writing`` past the high-water mark, ``resume_writing`` below the
low one); ``close`` writes what is buffered first, ``abort`` does not; ``connection_lost`` is
called once, from the loop and never from inside a call of the connection's own.
:class:`TlsTransport` is one for a TLS listener's connections, with OpenSSL on the socket itself.

Edge-triggered, each socket registered once for both directions: no system call to pause or resume
reading or to wait for room to write. A read that fills the buffer, or reading that resumes, asks
for one more read later in the turn (:meth:`Poller._read_again`); so a connection that sends much
takes one read at a time, in turn with the others. (Level-triggered, every ready socket was polled
again at the next wait, and again by the loop's wait on this epoll: 7% more CPU a message when
2,000 publishers each send alone.)
"""

from __future__ import annotations

import _socket
import asyncio
import errno
import logging
import os
import select
import socket
import ssl
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from typing import Any, Final, cast

from trimaran.runtime.outlet import Outlet
from trimaran.runtime.transport import Conn, Runner

log = logging.getLogger(__name__)

# One read's most. A read is made as a bytes object of this size and cut down to what came (no copy
# after the kernel's): glibc serves it from its heap below its mmap threshold (128 KiB at first),
# where uvloop's 256 KiB would be mapped and unmapped on every read.
READ_SIZE: Final = 64 * 1024
HIGH_WATER: Final = 64 * 1024  # the loops' write-buffer marks
LOW_WATER: Final = 16 * 1024
ACCEPTS_PER_TURN: Final = 128  # a listener's accepts in one turn of the loop (the others are read too)
ACCEPT_RETRY_S: Final = 0.5  # out of descriptors: accepting waits this long
# Ready sockets taken from the epoll at a time. epoll.poll makes an array of this many 12-byte
# events for each call: at its default (1,023) that came from the C library's malloc and free every
# wake-up; 42 fit Python's small-object allocator (512 bytes). More ready than that: polled again,
# up to about the thousand sockets of one default poll in a turn (the rest in the next).
READY_AT_ONCE: Final = 42
READY_POLLS: Final = 24

_IN: Final = select.EPOLLIN
_OUT: Final = select.EPOLLOUT
_ERR: Final = select.EPOLLERR
_ENDED: Final = select.EPOLLRDHUP | select.EPOLLHUP  # the peer has shut its side (or both are shut)
_INPUT: Final = select.EPOLLIN | _ENDED | _ERR  # something to read: bytes, the end, an error
_EVERYTHING: Final = select.EPOLLIN | select.EPOLLOUT | select.EPOLLRDHUP | select.EPOLLET
# The calls of every read and write as module constants: compiled, each is a static's, not two
# lookups by name.
_read: Final = os.read
_write: Final = os.write


def available() -> bool:
    """Whether this platform has epoll (Linux); where it has, the loops have readers too (only
    Windows' proactor loop has none, and Windows has no epoll)."""
    return hasattr(select, "epoll")


class Poller:
    """The epoll of the runtime's plain TCP connections, and their listening sockets."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, *, nodelay: bool = True, turns: Runner | None = None
    ) -> None:
        self._loop = loop
        self._turns = turns  # the runner, whose turn the callback ends (Runner.turn_begins)
        self._nodelay = nodelay  # TCP_NODELAY on accepted sockets (limits.tcp_nodelay)
        self._epoll = select.epoll()
        self._poll = self._epoll.poll  # (a bound method kept: no lookup by name each wake)
        # Each connection's transport at the index of its descriptor (None where there is none):
        # a wake-up looks each ready socket up, and in a dict keyed by descriptor that was three
        # lines of memory no other connection touched since (the table's slot, the entry, the key's
        # int) where a list slot is one (2,000 paced publishers: a sixtieth of the broker's CPU).
        self._socks: list[SocketTransport | None] = []
        self._again: list[SocketTransport] = []  # to read once more this turn (see _read_again)
        self._listening: list[socket.socket] = []
        loop.add_reader(self._epoll.fileno(), self._ready)

    # -- listening ---------------------------------------------------------------------------------

    def listen(
        self,
        host: str | None,
        port: int,
        backlog: int,
        make: Callable[[], Conn],
        tls: ssl.SSLContext | None = None,
    ) -> list[socket.socket]:
        """Bind every address ``host`` resolves to (all interfaces for None or ""), as the loop's
        ``create_server`` does, and accept on each; returns the sockets. With ``tls``, each accepted
        connection speaks TLS (:class:`TlsTransport`)."""
        bound: list[socket.socket] = []
        try:
            for family, kind, proto, _, address in socket.getaddrinfo(
                host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
            ):
                sock = socket.socket(family, kind, proto)
                bound.append(sock)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                if family == socket.AF_INET6 and hasattr(socket, "IPPROTO_IPV6"):
                    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                try:
                    sock.bind(address)
                except OSError as exc:
                    raise OSError(exc.errno, f"error while binding to {address}: {exc.strerror}") from None
                sock.listen(backlog)
                sock.setblocking(False)
        except BaseException:
            for sock in bound:
                sock.close()
            raise
        for sock in bound:
            self._listening.append(sock)
            # (its family an int once: socket.family makes an enum of it at every look)
            self._loop.add_reader(sock.fileno(), self._accept, sock, make, int(sock.family), tls)
        return bound

    def stop_accepting(self) -> None:
        for sock in self._listening:
            self._loop.remove_reader(sock.fileno())
            sock.close()
        self._listening.clear()

    def _accept(
        self, listening: socket.socket, make: Callable[[], Conn], family: int, tls: ssl.SSLContext | None
    ) -> None:
        for _ in range(ACCEPTS_PER_TURN):
            try:
                # The C accept beneath socket.socket's: a descriptor and an address. Python's wrapper
                # makes a socket object of its own class for it, converting the family and type to
                # enums on the way, which was half of a connection's accept (10 -> 5 µs).
                fd, address = cast(Any, listening)._accept()
            except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                return
            except OSError as exc:
                if exc.errno not in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    # Linux hands a new connection's pending network error to accept: that one is
                    # gone, the others wait.
                    log.debug("accept failed: %s", exc)
                    continue
                # Out of descriptors or memory: the connection waits in the backlog; accepting
                # pauses for a while rather than spin on the listening socket.
                log.error("accept failed: %s; accepting again in %g s", exc, ACCEPT_RETRY_S)
                self._loop.remove_reader(listening.fileno())
                self._loop.call_later(ACCEPT_RETRY_S, self._accept_again, listening, make, family, tls)
                return
            sock = _socket.socket(family, socket.SOCK_STREAM, 0, fd)
            try:
                sock.setblocking(False)
                if self._nodelay and family in (socket.AF_INET, socket.AF_INET6):
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                sock.close()  # reset before we got to it
                continue
            if tls is None:
                # The descriptor alone is kept: a socket object is 88 bytes of every connection.
                self.adopt(SocketTransport(self, sock.detach(), make()), address)
                continue
            try:
                plain = socket.socket(family, socket.SOCK_STREAM, 0, sock.detach())
                plain.setblocking(False)  # (a socket object made from a descriptor would block)
                wrapped = tls.wrap_socket(plain, server_side=True, do_handshake_on_connect=False)
            except (OSError, ValueError) as gone:  # (ssl.SSLError is an OSError)
                log.debug("TLS connection from %s gone before its handshake: %s", address, gone)
                continue
            self.adopt(TlsTransport(self, wrapped, make()), address)

    def _accept_again(
        self, listening: socket.socket, make: Callable[[], Conn], family: int, tls: ssl.SSLContext | None
    ) -> None:
        if listening in self._listening:
            self._loop.add_reader(listening.fileno(), self._accept, listening, make, family, tls)

    def adopt(self, transport: SocketTransport, address: Any) -> SocketTransport:
        """Serve ``transport``'s connection on its connected, non-blocking socket."""
        conn = transport._conn
        try:
            conn.set_peer(address)  # told, not kept by the transport for it to ask
            conn.connection_made(cast(asyncio.BaseTransport, transport))  # (an Outlet: taken as it is)
        except Exception:
            log.exception("connection_made failed for %s", address)
            transport.abort()
        if not transport._closing:
            fd = transport._fd
            socks = self._socks
            if fd >= len(socks):
                socks.extend([None] * (fd + 1 - len(socks)))
            socks[fd] = transport
            self._epoll.register(fd, _EVERYTHING)
        return transport

    def close(self) -> None:
        """The runtime stops: listening sockets, every connection (aborted), and the epoll go."""
        self.stop_accepting()
        for transport in [t for t in self._socks if t is not None]:
            transport.abort()
        self._loop.remove_reader(self._epoll.fileno())
        self._epoll.close()

    # -- readiness ---------------------------------------------------------------------------------

    def _ready(self) -> None:
        turns = self._turns
        if turns is None or not turns.turn_begins():
            self._read_ready()  # (a callback scheduled already ends the turn)
            return
        try:
            self._read_ready()
        finally:
            if self._again:
                turns.end_turn_soon()  # after the reads still to come this turn: one flush
            else:
                turns.end_turn()  # the writes the reads caused, in this callback

    def _read_ready(self) -> None:
        socks = self._socks
        for _ in range(READY_POLLS):
            polled = self._poll(0, READY_AT_ONCE)
            for fd, events in polled:
                transport = socks[fd]
                if transport is None:
                    continue  # closed earlier in this turn
                if events & _OUT and transport._out is not None:
                    transport._send_buffered()
                if events & _INPUT and not transport._closing:
                    if events & _ENDED:
                        transport._peer_shut = True
                    if transport._reading and not transport._read_eof:
                        transport._take()
                    elif events & _ERR:
                        transport._reset()
                    else:
                        transport._unread = True  # read when reading resumes
            if len(polled) < READY_AT_ONCE:
                break

    def read_again(self, transport: SocketTransport) -> None:
        """Read ``transport`` once more later in this turn (edge-triggered: no new edge may come)."""
        again = self._again
        if not again:
            self._loop.call_soon(self._read_again)
        again.append(transport)

    def _read_again(self) -> None:
        again, self._again = self._again, []
        for transport in again:
            if transport._fd < 0 or transport._closing or transport._read_eof:
                continue
            if transport._reading:
                transport._take()
            else:
                transport._unread = True


class SocketTransport(Outlet):
    """One plain TCP connection of the poller: the ``Outlet`` of its ``transport.Conn``."""

    __slots__ = (
        "_closing",
        "_conn",
        "_eof_sent",
        "_fd",
        "_out",
        "_peer_shut",
        "_poller",
        "_read_eof",
        "_reading",
        "_shut_after",
        "_unread",
        "_writing_paused",
    )

    def __init__(self, poller: Poller, fd: int, conn: Conn) -> None:
        self._poller = poller
        self._fd = fd  # -1 once closed
        self._conn = conn
        self._out: bytearray | None = None  # what the socket did not take yet (None: nothing)
        self._reading = True
        self._unread = False  # bytes (or the end) came while not reading
        self._peer_shut = False  # the peer's end of stream is in the socket (behind what is unread)
        self._read_eof = False
        self._closing = False  # close() or abort(): no more reads; the socket goes once drained
        self._shut_after = False  # write_eof(): the write side shuts once drained
        self._eof_sent = False
        self._writing_paused = False

    # -- the Outlet: asyncio.Transport's methods that Conn uses ---------------------------------------

    def write(self, data: bytes) -> None:
        if self._closing or self._eof_sent or not data:
            return
        out = self._out
        if out is None:
            try:
                sent = _write(self._fd, data)
            except (BlockingIOError, InterruptedError):
                sent = 0
            except OSError as exc:
                self._finish(exc)
                return
            if sent == len(data):
                return
            self._wait_for_room(memoryview(data)[sent:])
        else:
            self._wait_for_room(data)

    def _wait_for_room(self, data: bytes | memoryview) -> None:
        """Keep what the socket did not take, written when it has room; past the high-water mark,
        the writer pauses."""
        out = self._out
        if out is None:
            self._out = out = bytearray(data)
        else:
            out += data
        if not self._writing_paused and len(out) > HIGH_WATER:
            self._writing_paused = True
            try:
                self._conn.pause_writing()
            except Exception as crash:
                self._crashed("pause_writing", crash)

    def get_write_buffer_size(self) -> int:
        out = self._out
        return 0 if out is None else len(out)

    def pause_reading(self) -> None:
        self._reading = False

    def resume_reading(self) -> None:
        if not self._reading:
            self._reading = True
            if self._unread and self._fd >= 0:
                self._unread = False
                self._poller.read_again(self)

    def is_reading(self) -> bool:
        return self._reading and not self._closing and not self._read_eof

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        if self._closing or self._eof_sent:
            return
        self._shut_after = True
        if self._out is None:
            self._shut_write()

    def close(self) -> None:
        """Write what is buffered, then close; nothing more is read."""
        if self._closing:
            return
        self._closing = True
        if self._out is None:
            self._close_drained()

    def abort(self) -> None:
        """Close at once; what is buffered is dropped."""
        self._finish(None)

    def is_closing(self) -> bool:
        return self._closing

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        if name in ("peername", "sockname") and self._fd >= 0:
            # Asked of the socket: the poller told its connection the peer as it adopted it
            # (Conn.set_peer), and keeping the address here was 8 bytes of every connection.
            try:
                with _over(self._fd) as sock:
                    return sock.getpeername() if name == "peername" else sock.getsockname()
            except OSError:
                return default
        return default  # (no "socket": the poller sets its options itself)

    # -- inside the poller ---------------------------------------------------------------------------

    def _take(self) -> None:
        """One read of the socket, handed to the connection."""
        try:
            data = _read(self._fd, READ_SIZE)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._finish(exc)
            return
        if data:
            if len(data) == READ_SIZE or self._peer_shut:
                self._poller.read_again(self)  # more, or the end, may wait, and no edge will say so
            try:
                self._conn.data_received(data)
            except Exception as crash:
                self._crashed("data_received", crash)
        else:
            self._eof()

    def _send_buffered(self) -> None:
        out = self._out
        assert out is not None
        try:
            sent = _write(self._fd, out)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._finish(exc)
            return
        del out[:sent]
        self._sent_buffered(out)

    def _sent_buffered(self, out: bytearray) -> None:
        """Some of what was buffered went (``out`` holds the rest): close or shut once all went,
        resume the writer below the low-water mark."""
        if not out:
            self._out = None
            if self._closing:
                self._close_drained()
                return
            if self._shut_after:
                self._shut_write()
        if self._writing_paused and len(out) <= LOW_WATER:
            self._writing_paused = False
            try:
                self._conn.resume_writing()
            except Exception as crash:
                self._crashed("resume_writing", crash)

    def _close_drained(self) -> None:
        """``close()`` and nothing is left to write: the socket goes."""
        self._finish(None)

    def _eof(self) -> None:
        """The peer closed its side: no more reads; the connection says whether to close ours."""
        self._read_eof = True
        try:
            keep_open = self._conn.eof_received()
        except Exception as exc:
            self._crashed("eof_received", exc)
            return
        if not keep_open:
            self.close()

    def _reset(self) -> None:
        """An error on the socket while not reading (a reset): the connection is over."""
        with _over(self._fd) as sock:
            code = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        self._finish(ConnectionResetError(code, errno.errorcode.get(code, "socket error")))

    def _shut_write(self) -> None:
        self._shut_after = False
        self._eof_sent = True
        try:
            with _over(self._fd) as sock:
                sock.shutdown(socket.SHUT_WR)
        except OSError as exc:
            self._finish(exc)

    def _finish(self, exc: Exception | None) -> None:
        """The socket goes now (closing it takes it out of the epoll); the connection hears of it
        from the loop, never inside a call of its own."""
        self._closing = True
        self._out = None
        fd = self._fd
        if fd >= 0:
            self._fd = -1
            socks = self._poller._socks
            if fd < len(socks) and socks[fd] is self:  # (not there if it closed as it was adopted)
                socks[fd] = None
            try:  # noqa: SIM105 (contextlib.suppress is three interpreted calls every close)
                os.close(fd)
            except OSError:
                pass
            self._poller._loop.call_soon(self._lost, exc)

    def _crashed(self, callback: str, exc: Exception) -> None:
        log.error("%s from %s failed: %s: %s", callback, self._conn.peer, type(exc).__name__, exc)
        self._finish(exc)

    def _lost(self, exc: Exception | None) -> None:
        try:
            self._conn.connection_lost(exc)
        except Exception:
            log.exception("connection_lost failed for %s", self._conn.peer)


class TlsTransport(SocketTransport):
    """One TLS connection of the poller. OpenSSL reads and writes the socket itself (a socket BIO,
    as Mosquitto's): an idle connection holds OpenSSL's state and no buffer of ours, where uvloop's
    TLS transport held two memory BIOs and a read buffer besides, and copied every record through
    them (an idle connection 24.8 -> 15.3 KiB, Mosquitto's 14.6; a QoS 0 message 1.32 -> 0.21 µs
    of CPU; issue 47).

    The connection is told of it as it is accepted, and its handshake deadline (``Conn``'s) covers
    the TLS handshake too; it reads only what the handshake let through. What it writes before the
    handshake is over waits in ``_out``, as does what the socket did not take: OpenSSL wants the same
    bytes again then (no partial writes: a write takes all of it or nothing), and ``_out`` only grows
    at its end until it goes. While the handshake itself waits for room to write, ``_out`` is an empty
    buffer, so that the poller's next write-readiness resumes it (``_send_buffered``)."""

    __slots__ = ("_shaken", "_tls")

    def __init__(self, poller: Poller, tls: ssl.SSLSocket, conn: Conn) -> None:
        super().__init__(poller, tls.fileno(), conn)
        self._tls = tls
        self._shaken = False  # the handshake is over

    def write(self, data: bytes) -> None:
        if self._closing or not data:
            return
        if self._out is None and self._shaken:
            try:
                self._tls.send(data)
                return
            except (ssl.SSLWantWriteError, ssl.SSLWantReadError):
                pass  # (OpenSSL took none of it, or wants all of it again)
            except OSError as exc:  # (ssl.SSLError is one)
                self._finish(exc)
                return
        self._wait_for_room(data)

    def can_write_eof(self) -> bool:
        return False  # TLS has no half-close (close_notify ends both ways): the runtime lingers instead

    def write_eof(self) -> None:
        raise NotImplementedError("TLS has no half-close")

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        tls = self._tls
        if name == "peercert":
            return tls.getpeercert() if self._shaken else default
        if name == "ssl_object":
            return tls
        if name == "sslcontext":
            return tls.context
        if name == "cipher":
            return tls.cipher() if self._shaken else default
        return super().get_extra_info(name, default)

    def _take(self) -> None:
        """The handshake's next step, then what came decrypted (up to ``READ_SIZE`` a turn)."""
        if not self._shaken and not self._handshake():
            return
        tls = self._tls
        pieces: list[bytes] = []
        taken = 0
        ended = False
        try:
            while taken < READ_SIZE:
                piece = tls.read(READ_SIZE)  # a record's worth at most
                if not piece:
                    ended = True  # close_notify, or the socket's end without it
                    break
                pieces.append(piece)
                taken += len(piece)
            else:
                self._poller.read_again(self)  # more may wait, decrypted or in the socket
        except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
            pass  # all read: the next bytes come with an edge
        except ssl.SSLEOFError:
            ended = True
        except OSError as exc:
            if not pieces:
                self._failed("TLS", exc)
                return
            # What came before the error is the connection's; the error ends it after.
            self._poller._loop.call_soon(self._failed, "TLS", exc)
        if pieces:
            try:
                self._conn.data_received(pieces[0] if len(pieces) == 1 else b"".join(pieces))
            except Exception as crash:
                self._crashed("data_received", crash)
                return
        if ended and not self._closing:
            self._eof()

    def _handshake(self) -> bool:
        """A step of the handshake: True once it is over."""
        try:
            self._tls.do_handshake()
        except ssl.SSLWantReadError:
            return False
        except ssl.SSLWantWriteError:
            if self._out is None:
                self._out = bytearray()  # resumed when the socket has room
            return False
        except OSError as exc:
            self._failed("TLS handshake", exc)
            return False
        self._shaken = True
        if self._out is not None:  # written before the handshake was over
            if self._out:
                self._send_buffered()
            else:
                self._out = None
        return True

    def _send_buffered(self) -> None:
        if not self._shaken:
            self._take()  # the handshake waited for room to write; then what came meanwhile
            return
        out = self._out
        assert out is not None
        try:
            self._tls.send(out)
        except (ssl.SSLWantWriteError, ssl.SSLWantReadError):
            return
        except OSError as exc:
            self._finish(exc)
            return
        out.clear()
        self._sent_buffered(out)

    def _close_drained(self) -> None:
        # close_notify: the peer reads a clean end, not a cut connection (its own is not waited for).
        with suppress(OSError, ValueError):
            self._tls.unwrap()
        self._finish(None)

    def _finish(self, exc: Exception | None) -> None:
        if self._fd >= 0:
            self._tls.detach()  # the descriptor is closed once, by the base, not again when this goes
        super()._finish(exc)

    def _failed(self, what: str, exc: OSError) -> None:
        """The peer broke TLS (a failed handshake, a bad record): one line, and the connection goes
        (OpenSSL has sent the alert that says why). A peer that only connected and left (a port
        probe) is no news: that line is a debug one."""
        if self._fd < 0:
            return
        conn = self._conn
        left = isinstance(exc, (ssl.SSLEOFError, ssl.SSLZeroReturnError, ConnectionError))
        log.log(
            logging.DEBUG if left else logging.INFO,
            "%s: %s with %s failed: %s",
            conn.listener,
            what,
            conn.peer,
            exc,
        )
        self._finish(exc)


@contextmanager
def _over(fd: int) -> Iterator[socket.socket]:
    """A socket object over a transport's descriptor, for what os cannot do; it leaves it open."""
    sock = socket.socket(fileno=fd)
    try:
        yield sock
    finally:
        sock.detach()
