"""One network connection: bytes in -> machine -> hull, batched writes out, flow control.

The fast path is an ``asyncio.Protocol``: ``data_received`` feeds the machine and hands its events to
the hull one at a time, synchronously, with no task or wake-up per message. Whatever the machines
queue for their peers is written once per loop iteration for every connection that has something to
send (the runner's flush). A hull that must wait for something (a declare waiting for its commit)
returns an awaitable from ``handle``; the connection reads no further frame until it is done, so
frames still take effect in the order they arrived.

A close is the protocol's: once the machine is closed the runtime writes what it queued, half-closes
the socket and reads (and drops) what the peer still sends until it closes or the linger time passes,
so that no reset destroys the last frame. Where the protocol leaves the end to the peer (the machine's
``peer_close_s``), the runtime does not half-close: it waits that long for the peer to close first.
A bug in the hull or the machine closes this connection, logged once with the peer, and reaches
nothing else.
"""

from __future__ import annotations

import asyncio
import logging
import math
import socket
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Final, cast

from trimaran.compiled import mypyc_attr
from trimaran.runtime.flow import SESSION, Gate, Held
from trimaran.runtime.limits import RuntimeLimits, RuntimeStats
from trimaran.runtime.machine import Machine
from trimaran.runtime.memory import Memory
from trimaran.runtime.outlet import LoopOutlet, Outlet
from trimaran.tenant_limits import Rate
from trimaran.traffic import Traffic
from trimaran.vhosts import DEFAULT_VHOST

log = logging.getLogger(__name__)
# The clocks as module constants: compiled, a call of either is a static's, not two lookups by name.
_time_ns: Final = time.time_ns
_monotonic: Final = time.monotonic

# Reading while closing: at most this long after the machine closed, then the socket goes.
LINGER_S: Final = 2.0


@mypyc_attr(allow_interpreted_subclasses=True)  # the tests' hulls
class Hull:
    """A hull's per-connection state: the machine's events in, the deck's work out. A base class
    (as ``Machine`` is): the runtime calls it for every frame."""

    __slots__ = ("machine",)

    machine: Machine

    def handle(self, event: object) -> Awaitable[None] | None:
        """Act on one event. An awaitable holds back the connection's later frames until it is done;
        it runs in the runtime's task group."""
        raise NotImplementedError

    def before_write(self) -> None:
        """The runtime is about to take the machine's queued bytes: queue what gathered during the
        loop iteration (the confirms of a commit's publishes go as one)."""
        raise NotImplementedError

    def written(self) -> None:
        """The runtime has just handed this connection's queued bytes (if any) to the socket: once per
        loop iteration in which the connection read (unless its hull was ``quiet`` after) or was given
        something to send."""
        raise NotImplementedError

    def quiet(self) -> bool:
        """After a read whose events were all acted on: True when the turn's flush would have nothing
        to do for the hull (no bytes queued, nothing for ``before_write`` or ``written``, the
        protocol not over, no deadline moved earlier), so the read's connection is not flushed
        unless the runtime has work of its own there (a gate to let go). The default is False:
        every read is flushed."""
        return False

    def shutdown(self) -> None:
        """The server stops: close the protocol's way (the runtime then flushes and closes)."""
        raise NotImplementedError

    def blocked(self, on: bool, why: str) -> None:
        """An alarm is raised (``on``: memory above the high-water mark, the disk below its
        watermark; ``why`` says which) or the last one cleared; the runtime stops reading the socket
        either way, the hull tells its peer where the protocol can."""
        raise NotImplementedError

    def behind(self) -> int | None:
        """None unless what waits for this peer beyond the socket (an MQTT session's queue) is above
        its low-water mark; then a count that grows as the peer takes messages (its progress). The
        publishers it holds (``Conn.push_back``) wait until it is None."""
        raise NotImplementedError

    def stalled(self, idle_s: float) -> None:
        """The peer took nothing for ``idle_s`` seconds while ``behind`` and holding publishers: close
        it the protocol's way, leaving its messages with its session (they then go on)."""
        raise NotImplementedError

    def finish(self) -> Callable[[], Coroutine[Any, Any, None]] | None:
        """The connection is gone: the clean-up that gives back what it held (deliveries, exclusive
        queues), run in the runner's task group; None when it held nothing that needs one (a task
        per connection was a third of an MQTT connect's cost)."""
        raise NotImplementedError


# Makes the hull for a new connection, given its first bytes (None: need more; the AMQP port picks
# the protocol from the 8-byte header). Raise ``Refused`` to close without a hull.
HullFactory = Callable[["Conn", bytes], "Hull | None"]


@mypyc_attr(allow_interpreted_subclasses=True)  # a test may stand in for the runner, as for hulls
class Runner:
    """The runner (``runner.Runner``, its only subclass outside the tests) as its connections call
    it: admission, the flush of every dirty connection once per loop iteration, deadlines, tasks,
    memory accounting and counters. A base class for the runner's sake as ``Hull`` is for hulls'."""

    limits: RuntimeLimits
    stats: RuntimeStats
    traffic: Traffic
    memory: Memory
    current: Held | None  # whose events are being acted on (a connection, a bridge)
    read_work: list[Callable[[], None]]  # queued by after_read: run at the end of a read
    # Wall-clock epoch ms of the last read: when the messages it carried arrived (a hull's message
    # creation time, without a clock call per message; the runner's, not a field of every connection).
    read_at_ms: int

    def admit(self, conn: Conn) -> str | None:
        raise NotImplementedError

    def take_turn(self, conn: Conn) -> bool:
        raise NotImplementedError

    def opened(self, conn: Conn) -> None:
        raise NotImplementedError

    def closed(self, conn: Conn) -> None:
        raise NotImplementedError

    def loop(self) -> asyncio.AbstractEventLoop:
        raise NotImplementedError

    def mark_dirty(self, conn: Conn) -> None:
        raise NotImplementedError

    def turn_begins(self) -> bool:
        raise NotImplementedError

    def end_turn(self) -> None:
        raise NotImplementedError

    def end_turn_soon(self) -> None:
        raise NotImplementedError

    def run_read_work(self) -> None:
        raise NotImplementedError

    def watch_deadline(self, conn: Conn) -> None:
        raise NotImplementedError

    def spawn(self, job: Callable[[], Coroutine[Any, Any, object]], conn: Conn) -> None:
        raise NotImplementedError

    def memory_changed(self, conn: Conn) -> None:
        raise NotImplementedError

    def enter(self, conn: Conn, user: str | None, vhost: str) -> str | None:
        raise NotImplementedError

    def throttled(self, conn: Conn) -> None:
        raise NotImplementedError


class Refused(Exception):
    """The first bytes name nothing this listener serves; the reply (if any) is in ``reply``."""

    def __init__(self, reason: str, reply: bytes = b"") -> None:
        super().__init__(reason)
        self.reply = reply


OPEN: Final = 0
CLOSING: Final = 1
GONE: Final = 2
WAITING: Final = 3  # accepted, its turn not come yet (limits.accept_rate): not read, not opened
NOT_SCHEDULED: Final = math.inf  # Conn.scheduled when the runner holds no deadline of it


class Listening:
    """What the connections of one listener share: its name and the factory of their hulls (one
    field of each connection where they were two, issue #47)."""

    __slots__ = ("factory", "name")

    def __init__(self, name: str, factory: HullFactory) -> None:
        self.name = name
        self.factory = factory


class _Flow:
    """A connection's flow control, made at its first use, as most connections never need it
    (three fields of every connection were 24 bytes; issue 47)."""

    __slots__ = ("gate", "held_by", "rate")

    def __init__(self) -> None:
        self.gate: Gate | None = None  # the publishers waiting for this one (made at the first hold)
        self.held_by = 0  # slow readers this connection's publishes wait for (push_back)
        self.rate: Rate | None = None  # the user's token buckets, when it has a rate limit


class Conn:
    """The runtime's side of one connection. Hulls hold it as their ``io``.

    An ``asyncio.Protocol`` by its methods, not a subclass of it: compiled, a class with a Python
    class among its bases gets a ``__dict__`` and a weak-reference slot, 16 bytes of every
    connection (issue 47). The event loops ask nothing of a protocol but its methods."""

    __slots__ = (
        "_first",
        "_flow",
        "_peer_closes",
        "_peer_eof",
        "_read_paused",
        "_reading_paused",
        "_throttled",
        "_until",
        "_waiting",
        "bytes_in",
        "bytes_out",
        "dirty",
        "entered",
        "hull",
        "listening",
        "messages_in",
        "messages_out",
        "peer_host",
        "peer_port",
        "publisher",
        "runner",
        "scheduled",
        "slot",
        "state",
        "transport",
        "user",
        "vhost",
        "writable",
        "write_buffered",
    )

    def __init__(self, runner: Runner, listening: Listening) -> None:
        # Four flags first: compiled, they fill the word of mypyc's 4-byte bitmap, which comes first
        # (ten flags took two words beside it, issue 47).
        self.entered = False  # counted against its vhost's and user's connection limits (Runner.enter)
        self.dirty = False  # queued in the runner's flush for this loop iteration
        self.publisher = False  # has published (``publishing``): paused while an alarm is raised
        # Not read until its user's buckets refill: a timer of the loop will say when (it holds the
        # connection until then; a field for the handle was 8 bytes of every connection).
        self._throttled = False
        self.runner = runner
        self.listening = listening
        self.transport: Outlet | None = None
        self.hull: Hull | None = None
        self.peer_host = ""
        self.peer_port = 0
        self.state = OPEN
        self.bytes_in = 0
        self.bytes_out = 0
        # Messages this connection published and was delivered, bumped by its hull beside the
        # broker's totals: a tenant's $SYS figures are summed from them (broker/tenants.py).
        self.messages_in = 0
        self.messages_out = 0
        self.write_buffered = 0  # the transport's write buffer at the last look (memory accounting)
        # Who the hull let in, and into which vhost (set at login; runtime limits key on them).
        self.vhost = DEFAULT_VHOST
        self.user: str | None = None
        self._first = b""  # bytes read before the hull was chosen
        self._waiting = False  # a hull step is in flight; later frames wait
        # False while the socket's buffer is above its high-water mark. A field, not a property:
        # every QoS 0 delivery reads it.
        self.writable = True
        self._reading_paused = False  # the hull asked
        self._read_paused = False  # the transport is paused (hull, a step in flight, or memory)
        self._peer_eof = False
        self._peer_closes = False  # closing: the protocol left the end of the connection to the peer
        # (the flags above are set one after the other: compiled, they share a word)
        self._flow: _Flow | None = None  # made at its first hold, or at a login with a rate limit
        # The runtime's own deadline: until then the first bytes must name a protocol; once closing,
        # until then the peer's last bytes are read and dropped (one field: never both at once).
        self._until = 0.0
        # When the runner's entry of it falls due (runtime/deadlines.py). A float, not an optional
        # one: compiled, it is a field of the object rather than an object of its own.
        self.scheduled = NOT_SCHEDULED
        self.slot = -1  # its index in the runner's connections (runner.Connections), -1 if not there

    @property
    def rate(self) -> Rate | None:
        """The user's token buckets, when it has a rate limit (set by the login, Runner.enter)."""
        flow = self._flow
        return None if flow is None else flow.rate

    @rate.setter
    def rate(self, rate: Rate | None) -> None:
        if rate is not None or self._flow is not None:
            self._flows().rate = rate

    def _flows(self) -> _Flow:
        """The flow control, to use it."""
        flow = self._flow
        if flow is None:
            flow = self._flow = _Flow()
        return flow

    @property
    def listener(self) -> str:
        """The name of the listener that accepted it (log lines, per-listener settings)."""
        return self.listening.name

    @property
    def peer(self) -> str:
        """``host:port`` of the peer ("?" if not an IP socket): made when asked (log lines, the
        admin API), as a string kept for every connection would be 64 bytes of each (issue #47)."""
        return f"{self.peer_host}:{self.peer_port}" if self.peer_host else "?"

    # -- asyncio.Protocol ---------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # The poller's transports are outlets; a loop's is wrapped in one (uvloop's transports are not
        # subclasses of asyncio.Transport, but have its methods).
        if isinstance(transport, Outlet):
            self.transport = transport
        else:
            self.transport = LoopOutlet(cast(asyncio.Transport, transport))
        try:
            self._admit(self.transport)
        except Exception as exc:
            self.crash(exc)

    def set_peer(self, address: Any) -> None:
        """Where the connection comes from (an IP socket's ``(host, port)``; anything else leaves it
        unnamed): the poller tells it as it adopts the socket, a loop's transport is asked."""
        if isinstance(address, tuple):
            # One string for every connection from a host (interned strings go with their last user):
            # accept makes a new one each time, 58 bytes of every connection.
            self.peer_host = sys.intern(str(address[0]))
            self.peer_port = int(address[1])

    def _admit(self, transport: Outlet) -> None:
        if not self.peer_host:
            self.set_peer(transport.get_extra_info("peername"))
        refusal = self.runner.admit(self)
        if refusal is not None:
            log.warning("%s: refused connection from %s: %s", self.listener, self.peer, refusal)
            self.state = GONE
            transport.abort()
            return
        if not self.runner.take_turn(self):
            self.state = WAITING
            transport.pause_reading()  # its bytes wait in the socket until its turn (admitted)
            return
        self._start(transport)

    def admitted(self) -> None:
        """Its turn came (``limits.accept_rate``): read from now on, its handshake time from now,
        what it sent before its turn first."""
        transport = self.transport
        if transport is None or self.state != WAITING:
            return
        self.state = OPEN
        try:
            transport.resume_reading()
            self._start(transport)
        except Exception as exc:
            self.crash(exc)

    def _start(self, transport: Outlet) -> None:
        # TCP_NODELAY (limits.tcp_nodelay; the runtime batches writes itself, so Nagle only adds
        # latency): the poller sets it as asked, and both event loops set it on every TCP transport
        # they make (asyncio since 3.6, uvloop always), so theirs is asked for only to turn it off.
        # Asking uvloop for it keeps a socket object on the transport: 72 bytes a connection.
        if not self.runner.limits.tcp_nodelay:
            sock = transport.get_extra_info("socket")
            if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 0)
        self._until = time.monotonic() + self.runner.limits.handshake_timeout_s
        self.runner.opened(self)
        self._open_hull(b"")

    def data_received(self, data: bytes) -> None:
        if self.state != OPEN:
            if self.state == WAITING:  # a read the event loop made before the pause took hold
                self._first += data
                self.bytes_in += len(data)
                if self.transport is not None:
                    self.transport.pause_reading()
            return  # closing: the peer's last bytes are read and dropped
        self.bytes_in += len(data)
        self.runner.traffic.bytes_received += len(data)
        if self.hull is None:
            self._open_hull(data)
            return
        runner = self.runner
        runner.read_at_ms = _time_ns() // 1_000_000
        hull = self.hull
        try:
            hull.machine.receive_data(data, _monotonic())
            self._act()
            # What the read caused is written at the end of the loop's turn; a read that left the
            # hull nothing to flush (a device's QoS 0 publish) costs its connection no flush, unless
            # its gate holds publishers (the flush lets them go once it has drained).
            flow = self._flow
            if not hull.quiet() or (flow is not None and flow.gate is not None and flow.gate.holding):
                runner.mark_dirty(self)
            if flow is not None and flow.rate is not None:
                self._charge(0, len(data))
        except Exception as exc:
            self.crash(exc)
        finally:
            if runner.read_work:  # the queues' end of the read (Runner.after_read)
                runner.run_read_work()

    def eof_received(self) -> bool:
        self._peer_eof = True
        if self.state == CLOSING or self.hull is None:
            self._close_now()
        elif self.state == OPEN:
            try:
                self.hull.machine.receive_eof()
            except Exception as exc:
                self.crash(exc)
                return True
            self.pump()  # the flush writes the machine's last bytes, then closes
        # True: the transport stays open until the runtime has written what the machine queued.
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        was = self.state
        self.state = GONE
        if self._flow is not None and self._flow.held_by > 0 and was != GONE:
            self.runner.stats.held -= 1  # gone: no longer held, whenever its gates let go
        hull = self.hull
        if was == OPEN and hull is not None and not hull.machine.closed:
            try:
                hull.machine.receive_eof()
                self._act()
            except Exception as crash:
                self._log_crash(crash)
        self._release_held()
        self._throttled = False  # (its timer finds it gone)
        self.runner.closed(self)
        if hull is not None and (finish := hull.finish()) is not None:
            self.runner.spawn(finish, self)
        # The runner's deadline heap may hold this object until its deadline passes: keep it small.
        self.hull = None
        self.transport = None

    def pause_writing(self) -> None:
        self.writable = False

    def resume_writing(self) -> None:
        self.writable = True
        self.runner.memory_changed(self)
        gate = None if self._flow is None else self._flow.gate
        if gate is not None:
            gate.stuck = False
            gate.moved()
            if gate.holding and (self.hull is None or self.hull.behind() is None):
                gate.release()
        if self.hull is not None:
            self.runner.mark_dirty(self)

    def _stalled(self, idle_s: float) -> bool:
        """The gate has held publishers ``idle_s`` seconds without progress (``flow.Stalled``)."""
        gate = None if self._flow is None else self._flow.gate
        assert gate is not None
        hull = self.hull
        mark = None if hull is None else hull.behind()
        if hull is not None and mark is not None:
            # Messages it must be given (QoS 1/2) wait in its session: a reader that is behind
            # holds its publishers as long as it moves; one that takes nothing is closed.
            gate.saw(mark)
            idle_s = gate.idle_s()
            if idle_s < self.runner.limits.stalled_consumer_timeout_s:
                return True
            gate.release()
            self.runner.stats.stalled(SESSION)
            try:
                hull.stalled(idle_s)
            except Exception as exc:
                self.crash(exc)
            return False
        # Only its socket is full: a QoS 0 reader that is stuck, not behind. Its publishers go on,
        # and until it drains its QoS 0 deliveries queue up to the outbox and are then dropped.
        log.info("%s: %s is not reading; its publishers are no longer held", self.listener, self.peer)
        gate.stuck = True
        gate.release()
        return False

    def _release_held(self) -> None:
        if self._flow is not None and self._flow.gate is not None:
            self._flow.gate.release()

    def held(self, on: bool) -> None:
        """A gate holds this connection (``on``: a consumer it fed is behind), or lets it go."""
        flow = self._flows()
        before = flow.held_by
        flow.held_by = after = before + (1 if on else -1)
        if (before == 0) != (after == 0) and self.state != GONE:
            self.runner.stats.held += 1 if on else -1  # connections held now (the gauge)
        self._sync_reading()

    # -- what hulls call ----------------------------------------------------------------------------

    def pump(self) -> None:
        """Act on every event the machine has ready, then schedule a flush. Hulls call it after a
        call on their machine made outside an event (a delivery, a kick, a login decided later)."""
        if self.state == GONE or self.hull is None:
            return
        try:
            self._act()
        except Exception as exc:
            self.crash(exc)
            return
        self.runner.mark_dirty(self)

    def wake(self) -> None:
        """The machine has bytes to send: write them in this loop iteration's flush."""
        if not self.dirty and self.state != GONE:
            self.runner.mark_dirty(self)

    def send_now(self) -> None:
        """Write what the machine has queued at once, before the turn's flush: for a reader fed by
        many reads of one turn (thousands of paced publishers), whose bytes would otherwise pile
        up until the turn ends. The flush still comes (the connection stays dirty)."""
        hull = self.hull
        transport = self.transport
        if hull is None or transport is None or self.state != OPEN:
            return
        data = hull.machine.data_to_send()
        if data:
            self._write(transport, data)

    def spawn(self, job: Callable[[], Coroutine[Any, Any, object]]) -> None:
        """Run a coroutine for this connection in the runtime's task group (errors close it)."""
        self.runner.spawn(job, self)

    def backlog(self) -> int:
        """Bytes queued for the peer and not yet on the wire (the transport's buffer)."""
        transport = self.transport
        return 0 if transport is None else transport.get_write_buffer_size()

    def peer_certificate(self) -> dict[str, Any] | None:
        if self.transport is None:
            return None
        cert = self.transport.get_extra_info("peercert")
        return cert if isinstance(cert, dict) and cert else None

    def enter(self, user: str | None, vhost: str) -> str | None:
        """The login of ``user`` into ``vhost`` succeeded: None if the connection limits let it in,
        else the reason for the hull's refusal (see ``Runner.enter``)."""
        return self.runner.enter(self, user, vhost)

    def push_back(self) -> None:
        """This connection is behind and a delivery is coming to it: its socket is full (not
        ``writable``), or the hull's queue for it is above its high-water mark (``Hull.behind``
        stays true until it is below the low one). The connection whose frames are being acted on
        (the publisher) is not read again until this one drains, or goes. So a subscriber that is
        merely behind slows its publishers instead of losing their messages.

        One whose socket alone is full and that holds them longer than ``hold_publishers_s`` is stuck,
        not behind: they go on, and its QoS 0 deliveries fill its outbox and are then dropped (the
        hull's bound) until it drains again. One that is ``behind`` holds them as long as it takes
        something; after ``stalled_consumer_timeout_s`` without, it is closed (``Hull.stalled``)
        and they go on."""
        flow = self._flows()
        gate = flow.gate
        if gate is None:
            if self.state != OPEN:
                return
            runner = self.runner
            gate = flow.gate = Gate(
                runner, runner.limits.hold_publishers_s, self._stalled, lambda: runner.stats.began(SESSION)
            )
        elif gate.stuck and self.hull is not None and self.hull.behind() is not None:
            gate.stuck = False  # stuck on QoS 0, now behind on messages it must be given: held again
        gate.hold()

    def publishing(self) -> None:
        """The hull's first publish on this connection: from now on the alarms pause it, at once
        while one is raised (its peer is told then, as RabbitMQ tells a connection that publishes
        during an alarm)."""
        self.publisher = True
        memory = self.runner.memory
        if memory.blocked:
            self.block(True, memory.alarms[0])

    def pause_reading(self) -> None:
        self._reading_paused = True
        self._sync_reading()

    def resume_reading(self) -> None:
        self._reading_paused = False
        self._sync_reading()

    def block(self, on: bool, why: str) -> None:
        """An alarm was raised (``why``) or the last one cleared: a publisher stops (or starts)
        being read."""
        if self.hull is not None and self.state == OPEN:
            try:
                self.hull.blocked(on, why)
            except Exception as exc:
                self.crash(exc)
                return
            self.wake()
        self._sync_reading()

    def _sync_reading(self) -> None:
        transport = self.transport
        if transport is None or self.state == GONE:
            return
        pause = self.state == OPEN and (
            self._reading_paused
            or self._waiting
            or (self._flow is not None and self._flow.held_by > 0)
            or self._throttled
            or self.runner.memory.blocking(self)
        )
        if pause != self._read_paused:
            self._read_paused = pause
            if pause:
                transport.pause_reading()
            else:
                transport.resume_reading()
                hull = self.hull
                if hull is not None and self.state == OPEN:
                    # What it sent meanwhile waits in the socket: its time-outs start from now, or a
                    # deadline could fire before the read that brings its heartbeat.
                    hull.machine.paused(time.monotonic())

    def _flow_paused(self) -> bool:
        """Not read for flow control: a gate holds it, its user is over its rate, or an alarm."""
        held = self._flow is not None and self._flow.held_by > 0
        return held or self._throttled or self.runner.memory.blocking(self)

    def _charge(self, messages: int, size: int) -> None:
        """What was read and published counts against the user's rate (per read, not per message);
        over it, the socket is not read until the buckets refill: the client is slowed, nothing is
        refused or dropped."""
        rate = None if self._flow is None else self._flow.rate
        if rate is None:
            return
        wait = rate.charge(messages, size, time.monotonic())
        if wait > 0 and not self._throttled and self.state == OPEN:
            self.runner.throttled(self)
            self._throttled = True
            self.runner.loop().call_later(wait, self._unthrottle)
            self._sync_reading()

    def _unthrottle(self) -> None:
        if not self._throttled:
            return  # gone meanwhile
        rate = None if self._flow is None else self._flow.rate
        wait = 0.0 if rate is None else rate.charge(0, 0, time.monotonic())
        if wait > 0 and self.state == OPEN:
            self.runner.loop().call_later(wait, self._unthrottle)
        else:
            self._throttled = False
            self._sync_reading()

    def abort(self) -> None:
        if self.transport is not None and self.state != GONE:
            self.transport.abort()

    # -- inside the runtime ------------------------------------------------------------------------

    def _open_hull(self, data: bytes) -> None:
        first = self._first + data
        try:
            hull = self.listening.factory(self, first)
        except Refused as refused:
            log.info("%s: %s from %s; closing", self.listener, refused, self.peer)
            self._first = b""
            assert self.transport is not None
            if refused.reply:
                self.transport.write(refused.reply)
            self.state = CLOSING
            self._close_soon()
            return
        except Exception as exc:
            self.crash(exc)
            return
        if hull is None:
            self._first = first
            if len(first) > 64:
                self.crash(RuntimeError("protocol header not recognised in 64 bytes"))
            return
        self._first = b""
        self.hull = hull
        if first:
            try:
                hull.machine.receive_data(first, time.monotonic())
            except Exception as exc:
                self.crash(exc)
                return
        self.pump()

    def _act(self) -> None:
        hull = self.hull
        assert hull is not None
        if self._waiting:
            return
        machine = hull.machine
        runner = self.runner
        outer, runner.current = runner.current, self  # whose frames are being acted on (push_back)
        rate = None if self._flow is None else self._flow.rate
        if rate is not None:
            before = runner.traffic.messages_received
        try:
            while (event := machine.next_event()) is not None:
                step = hull.handle(event)
                if step is not None:
                    self._hold(step)
                    return
        finally:
            runner.current = outer
            if rate is not None:
                published = runner.traffic.messages_received - before
                if published:
                    self._charge(published, 0)

    def _hold(self, step: Awaitable[None]) -> None:
        """A hull step is in flight: read no more frames until it is done."""
        self._waiting = True
        self._sync_reading()

        async def finish_step() -> None:
            try:
                await step
            finally:
                self._waiting = False
                self._sync_reading()
            self.pump()

        self.runner.spawn(finish_step, self)

    def flush(self) -> None:
        """Write what the machine queued (called once per loop iteration by the runner)."""
        self.dirty = False
        hull = self.hull
        transport = self.transport
        if hull is None or transport is None or self.state == GONE:
            return
        try:
            self._act()
            hull.before_write()
            data = hull.machine.data_to_send()
        except Exception as exc:
            self.crash(exc)
            return
        if data:
            self._write(transport, data)
        gate = None if self._flow is None else self._flow.gate
        if gate is not None and gate.holding and self.writable:
            mark = hull.behind()
            if mark is None:
                gate.release()  # drained, and written without filling the socket: the publishers go on
            else:
                gate.saw(mark)
        try:
            hull.written()
        except Exception as exc:
            self.crash(exc)
            return
        if self.state == OPEN and (hull.machine.closed or self._peer_eof):
            self._begin_close()
        self.runner.watch_deadline(self)

    def _write(self, transport: Outlet, data: bytes) -> None:
        self.bytes_out += len(data)
        runner = self.runner
        runner.traffic.bytes_sent += len(data)
        transport.write(data)  # calls pause_writing at once when the buffer passes its mark
        buffered = transport.get_write_buffer_size()
        if buffered or self.write_buffered:  # mostly the socket took it all, as before
            runner.memory.changed(self, buffered)

    def next_deadline(self) -> float | None:
        if self.state == CLOSING:
            return self._until
        if self.state == GONE:
            return None
        if self.hull is None:
            return self._until
        deadline = self.hull.machine.next_deadline()
        if self.bytes_in == 0:
            # Silent so far: the handshake deadline holds whatever the protocol's own is.
            return self._until if deadline is None else min(deadline, self._until)
        return deadline

    def tick(self, now: float) -> None:
        """The runner's timer: a deadline of ours is due."""
        if self.state == CLOSING:
            self._close_now()
            return
        if self.hull is None or (self.bytes_in == 0 and now >= self._until):
            log.info("%s: %s sent no protocol header in time; closing", self.listener, self.peer)
            self.abort()
            return
        try:
            machine = self.hull.machine
            if self._read_paused and self._flow_paused():
                machine.paused(now)  # its silence is ours: only what we must send is due
            machine.tick(now)
        except Exception as exc:
            self.crash(exc)
            return
        self.pump()

    def _begin_close(self) -> None:
        """The machine is closed and its last bytes are written: half-close, linger, then close
        (at once when the peer has closed its side already). Where the protocol leaves the end to
        the peer, no half-close: its end of stream, or the machine's ``peer_close_s``, closes."""
        self.state = CLOSING
        if self._peer_eof:
            self._close_now()
            return
        hull = self.hull
        wait = hull.machine.peer_close_s if hull is not None else 0.0
        if wait > 0:
            self._peer_closes = True
            self._close_soon(wait, half_close=False)
        else:
            self._close_soon()

    def _close_soon(self, wait: float = LINGER_S, *, half_close: bool = True) -> None:
        transport = self.transport
        assert transport is not None
        self._until = time.monotonic() + wait
        if self._read_paused:
            self._read_paused = False
            transport.resume_reading()
        if half_close and transport.can_write_eof():
            try:
                transport.write_eof()
            except OSError:
                self._close_now()
                return
        self.runner.watch_deadline(self)

    def stop_waiting(self) -> None:
        """The server stops: a connection left to its peer to close (``peer_close_s``) closes now."""
        if self.state == CLOSING and self._peer_closes:
            self._close_now()

    def _close_now(self) -> None:
        if self.transport is not None and self.state != GONE:
            self.transport.close()

    def crash(self, exc: BaseException) -> None:
        """A bug in this connection's handling: close it, say so once, count it."""
        if self.state == GONE:
            return
        self._log_crash(exc)
        self.runner.stats.crashes += 1
        self.abort()

    def _log_crash(self, exc: BaseException) -> None:
        log.warning(
            "%s: closing connection from %s after an internal error: %s: %s",
            self.listener,
            self.peer,
            type(exc).__name__,
            exc,
            exc_info=log.isEnabledFor(logging.DEBUG),
        )
