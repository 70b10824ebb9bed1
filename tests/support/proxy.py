"""A TCP proxy on loopback that a test controls: the network between two brokers, cut at will."""

from __future__ import annotations

import selectors
import socket
import struct
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress


class Proxy:
    """Forwards every connection made to ``port`` to ``target``, in one thread.

    ``reset()`` ends every connection with a TCP reset at both ends (a network that fails loudly);
    ``silence()`` stops forwarding and answers nothing, leaving the sockets open (a network gone
    quiet, which only keep-alives find); ``heal()`` forwards again, to new connections.
    """

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.setblocking(False)
        self.port: int = self._listener.getsockname()[1]
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ)
        self._pairs: dict[socket.socket, socket.socket] = {}
        self._quiet: dict[socket.socket, socket.socket] = {}  # silenced: open, never read
        self._lock = threading.Lock()
        self._silent = False
        self._stopped = False
        self._wake_r, self._wake_w = socket.socketpair()
        self._selector.register(self._wake_r, selectors.EVENT_READ)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        self.connections = 0  # accepted so far

    def reset(self) -> None:
        with self._lock:
            for sock in list(self._pairs):
                if sock in self._pairs:  # (its peer's close took it)
                    self._close(sock, reset=True)

    def silence(self) -> None:
        with self._lock:
            self._silent = True
            for sock in list(self._pairs):
                self._selector.unregister(sock)
            # Kept open and unread: the peers see a quiet network, not a closed one.
            self._quiet.update(self._pairs)
            self._pairs.clear()

    def heal(self) -> None:
        with self._lock:
            for sock in self._quiet:
                _abort(sock)
            self._quiet.clear()
            self._silent = False

    def stop(self) -> None:
        self._stopped = True
        self._wake_w.send(b"x")
        self._thread.join(5)
        self.reset()
        self.heal()
        self._listener.close()

    def _run(self) -> None:
        while not self._stopped:
            for key, _ in self._selector.select(0.5):
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                with self._lock:
                    if sock is self._wake_r:
                        sock.recv(16)
                    elif sock is self._listener:
                        self._accept()
                    elif sock in self._pairs:
                        self._forward(sock)

    def _accept(self) -> None:
        try:
            client, _ = self._listener.accept()
        except BlockingIOError:
            return
        if self._silent:
            client.close()
            return
        try:
            upstream = socket.create_connection(self.target, timeout=2)
        except OSError:
            _abort(client)
            return
        self.connections += 1
        for sock in (client, upstream):
            sock.setblocking(False)
            self._selector.register(sock, selectors.EVENT_READ)
        self._pairs[client] = upstream
        self._pairs[upstream] = client

    def _forward(self, sock: socket.socket) -> None:
        peer = self._pairs[sock]
        try:
            data = sock.recv(65536)
            if data:
                peer.setblocking(True)
                peer.sendall(data)
                peer.setblocking(False)
                return
        except OSError:
            pass
        self._close(sock, reset=False)

    def _close(self, sock: socket.socket, *, reset: bool) -> None:
        peer = self._pairs.pop(sock)
        self._pairs.pop(peer, None)
        for end in (sock, peer):
            self._selector.unregister(end)
            if reset:
                _abort(end)
            else:
                end.close()


def _abort(sock: socket.socket) -> None:
    """Close with a reset (SO_LINGER 0), not a FIN."""
    with suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


@contextmanager
def proxy_to(port: int) -> Iterator[Proxy]:
    proxy = Proxy(("127.0.0.1", port))
    try:
        yield proxy
    finally:
        proxy.stop()
