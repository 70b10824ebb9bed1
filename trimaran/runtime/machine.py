"""The surface every hull's sans-IO machine implements, so that one runtime drives all three.

A machine hands its events out one frame at a time, as h11's ``next_event()`` does: it parses the
next frame only when the events of the previous one have been taken, so the hull acts on each frame
before a later one (a detach, a close) changes the machine's state. Feeding a byte stream in one
piece or cut anywhere therefore gives the same events and the same output.

Everything the machine produces, including what the hull's own calls cause (an accepted CONNECT, a
server close, a message dropped by a full session), comes out of ``next_event()``; the runtime drains
it after feeding bytes, after a tick, and after any call the hull makes outside an event.

``Machine`` is a base class, not a protocol: the runtime calls it on every read, and compiled, a
call through a base class is a direct one (its table of methods), where a call through a protocol
looks the method up by name each time. Pure: the sans-IO machines subclass it.
"""

from __future__ import annotations

from trimaran.compiled import mypyc_attr


@mypyc_attr(allow_interpreted_subclasses=True)  # the WebSocket machine and the tests' machines
class Machine:
    """A sans-IO protocol machine: bytes and ``now`` in, events and bytes out. No clock of its own."""

    __slots__ = ()

    @property
    def closed(self) -> bool:
        """The protocol is over: nothing more is read; what ``data_to_send()`` returns is the last."""
        raise NotImplementedError

    @property
    def peer_close_s(self) -> float:
        """Once ``closed``: how long the peer is given to end the TCP connection itself, where the
        protocol leaves that to it (AMQP 0.9.1 after the close-ok to the peer's connection.close, as
        RabbitMQ waits). 0 (the default): the runtime half-closes at once and only lingers to drain."""
        return 0.0

    def receive_data(self, data: bytes, now: float) -> None:
        """Buffer bytes from the peer; ``now`` is the caller's monotonic time. Parses nothing yet."""
        raise NotImplementedError

    def receive_eof(self) -> None:
        """The peer closed its side (or the socket is gone)."""
        raise NotImplementedError

    def next_event(self) -> object | None:
        """The next event, parsing at most one more frame; None when the buffered bytes hold no
        whole frame (or the machine waits for the hull, e.g. to decide on a login)."""
        raise NotImplementedError

    def data_to_send(self) -> bytes:
        """All bytes queued for the peer since the last call (b"" if none)."""
        raise NotImplementedError

    def next_deadline(self) -> float | None:
        """Monotonic time at which ``tick`` must be called, or None."""
        raise NotImplementedError

    def tick(self, now: float) -> None:
        """Handle the deadlines that are due (handshake, keep-alive, close waits)."""
        raise NotImplementedError

    def paused(self, now: float) -> None:
        """The runtime has not been reading the peer (flow control: a queue or subscriber it feeds
        is behind, an alarm, a rate limit) until ``now``: the peer's silence so far is not its own,
        so its time-outs on what it sends (heartbeats, keep-alive, idle) start again from ``now``.
        Timers of what the machine sends go on as before."""
        raise NotImplementedError


def drain(machine: Machine) -> list[object]:
    """Every event the machine has ready, in order (for tests and simple callers; the runtime acts
    on each event before taking the next)."""
    events: list[object] = []
    while (event := machine.next_event()) is not None:
        events.append(event)
    return events
