"""What a connection's bytes go out through: the poller's socket, or an event loop's transport.

``transport.Conn`` writes, pauses and closes through an ``Outlet``. It is a base class, not the
``asyncio.Transport`` the loops hand over, for the same reason ``Machine`` is one: compiled, a call
through a base class is a direct one, where a call on a transport typed as asyncio's looks its method
up by name (a write and a look at the buffer: about a tenth of a PINGREQ's instructions). The poller's
``SocketTransport`` (and its ``TlsTransport``) subclasses it; a loop's transport (every connection
where there is no epoll, or a test's) is wrapped in a :class:`LoopOutlet`, which forwards each call.

The methods are the subset of ``asyncio.Transport`` that ``Conn`` uses, with its semantics.
"""

from __future__ import annotations

import asyncio
from typing import Any


class Outlet:
    """The subset of ``asyncio.Transport`` a connection uses."""

    __slots__ = ()

    def write(self, data: bytes) -> None:
        """Send ``data``; what the socket does not take is buffered (the protocol's
        ``pause_writing`` past the high-water mark)."""
        raise NotImplementedError

    def get_write_buffer_size(self) -> int:
        raise NotImplementedError

    def pause_reading(self) -> None:
        raise NotImplementedError

    def resume_reading(self) -> None:
        raise NotImplementedError

    def can_write_eof(self) -> bool:
        raise NotImplementedError

    def write_eof(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        """Write what is buffered, then close."""
        raise NotImplementedError

    def abort(self) -> None:
        """Close at once; what is buffered is dropped."""
        raise NotImplementedError

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        raise NotImplementedError


class LoopOutlet(Outlet):
    """An event loop's transport (uvloop's, asyncio's, or a test's), as an ``Outlet``."""

    __slots__ = ("transport",)

    def __init__(self, transport: asyncio.Transport) -> None:
        self.transport = transport

    def write(self, data: bytes) -> None:
        self.transport.write(data)

    def get_write_buffer_size(self) -> int:
        return self.transport.get_write_buffer_size()

    def pause_reading(self) -> None:
        self.transport.pause_reading()

    def resume_reading(self) -> None:
        self.transport.resume_reading()

    def can_write_eof(self) -> bool:
        return self.transport.can_write_eof()

    def write_eof(self) -> None:
        self.transport.write_eof()

    def close(self) -> None:
        self.transport.close()

    def abort(self) -> None:
        self.transport.abort()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self.transport.get_extra_info(name, default)
