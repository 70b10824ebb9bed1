"""What every link to another broker has, whatever it speaks: MQTT bridges (``mqtt.py``) and AMQP
shovels (``shovel.py``) are kinds of :class:`Link`.

A link is, locally, one more client of the router and the queues, in its vhost; remotely, one
connection it keeps up, reconnecting with backoff. It holds the local half of the promises:

- **Out.** What it takes from the router goes into a durable queue of its own (``$bridge.NAME`` or
  ``$shovel.NAME``), committed by the group-commit writer and kept across restarts; the link
  consumes that queue (and any queue it reads) with credit as wide as its window to the remote, and
  settles a delivery only once the remote has acknowledged it. The queue is bounded in payload
  bytes: while the remote is connected and behind, the publishers feeding the link are held (the
  runtime's gate); while it is away, newer messages past the bound are dropped and counted.
- **In.** A message from the remote is acknowledged to it only once it is here: routed, or
  committed to its queue, in the order the messages came (``InOrder``). While a local subscriber
  it feeds is behind, the link's socket is not read (one more publisher the gates hold).

The subclass speaks the remote's protocol through a sans-IO client machine: it builds the machine
in :meth:`Link._connect_once`, feeds it in :meth:`Link._data`, and answers the hooks below.
"""

from __future__ import annotations

import asyncio
import logging
import random
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, cast

import anyio

from trimaran.broker.core import Broker
from trimaran.broker.drops import LINK_AWAY, LINK_LOOP, LINK_UNQUEUED
from trimaran.broker.message import Message
from trimaran.config import QueuePolicySettings
from trimaran.queue.groups import QueueDelivery
from trimaran.queue.handles import ConsumerHandle
from trimaran.queue.manager import PublishResult, QueueManager
from trimaran.queue.outcomes import ACK
from trimaran.queue.policy import QueueError, parse_queue_topic
from trimaran.runtime.flow import Gate, Stalled
from trimaran.runtime.runner import Runner

log = logging.getLogger("trimaran.bridges")

CONNECT_TIMEOUT_S = 10.0
#: A delivery the remote has not acknowledged stays the link's however long the remote is away (a
#: reconnect sends it again itself); the queue must not hand it out again meanwhile.
HELD_FOR_S = 10 * 365 * 24 * 3600.0
#: The header that lists the links a message went out through, NODE/NAME, comma-separated (an MQTT
#: 5 user property, an AMQP 0.9.1 header, an AMQP 1.0 application property): a link sends out no
#: message it sent before, so that a loop of links through other brokers stops after one turn.
VIA = "x-trimaran-via"
#: States, as the log, the API and the metrics name them.
CONNECTING, CONNECTED, WAITING, STOPPED = "connecting", "connected", "waiting", "stopped"


@dataclass(slots=True)
class BridgeFigures:
    """What an operator reads of one link (the API, metrics, ``trimaran bridges``)."""

    state: str = CONNECTING
    address: str = ""  # the remote's, of the current or last connection
    last_error: str | None = None
    connects: int = 0  # connections the remote accepted
    sent: int = 0  # outbound messages handed to the remote (acknowledged by it where it acknowledges)
    received: int = 0  # inbound messages taken here
    dropped: int = 0  # outbound messages not kept (QoS 0 while away, past queue_bytes while away, loops)
    refused: int = 0  # messages a side refused: the remote, or a local queue
    in_flight: int = 0  # outbound messages sent and not yet acknowledged by the remote
    since: float = 0.0  # loop time of the last state change


def via(message: Message) -> str:
    """The links ``message`` went out through, as its header says ("" when none)."""
    properties = message.user_properties
    if not properties:
        return ""
    return next((value for key, value in properties if key == VIA), "")


class Pending(Protocol):
    """An inbound message, acknowledged to the remote once ``done`` (in arrival order)."""

    done: bool


class Machine(Protocol):
    """What a link asks of every client machine (MQTT, AMQP 0.9.1, AMQP 1.0)."""

    def data_to_send(self) -> bytes: ...

    def next_deadline(self) -> float | None: ...

    def tick(self, now: float) -> None: ...


def tls_context(
    cafile: str | None, certfile: str | None, keyfile: str | None, *, check_hostname: bool = True
) -> ssl.SSLContext:
    """A client context that verifies the remote by ``cafile`` (the system's CAs when None)."""
    context = ssl.create_default_context(cafile=cafile)
    if certfile is not None:
        context.load_cert_chain(certfile, keyfile)
    if not check_hostname:
        context.check_hostname = False
    return context


class Link:
    """One link's local side and its connection. ``kind``: ``bridge`` or ``shovel`` (its id,
    ``$KIND/NAME``, and its queue, ``$KIND.NAME``).

    ``runner``: whose frames are being acted on (a publisher the gate holds) and the loop;
    ``make_gate``: the runtime's gates (app.flow_gates), one for the link's queue.
    """

    kind = "bridge"

    def __init__(
        self,
        name: str,
        broker: Broker,
        *,
        node_name: str,
        vhost_prefix: str,
        queue_bytes: int,
        runner: Runner,
        make_gate: Callable[[Stalled], Gate],
        queues: QueueManager,
        stalled_timeout_s: float = 30.0,
    ) -> None:
        self.name = name
        self.broker = broker
        self.queues = queues
        self.runner = runner
        self.vhost_prefix = vhost_prefix
        self.queue_bytes = queue_bytes
        # What an operator reads of it (the kind sets them): its name at the remote (a client id,
        # a connection name), the protocol spoken there, its vhost here, the remote's address as
        # configured, and its lines (topic lines, a shovel's source and destination).
        self.client_id = ""
        self.protocol_version = ""
        self.vhost = ""
        self.configured_address = ""
        self.lines: tuple[str, ...] = ()
        self.figures = BridgeFigures()
        self._id = f"${self.kind}/{name}"
        self.mark = f"{node_name}/{name}"  # in VIA
        self.queue = vhost_prefix + f"${self.kind}.{name}"  # its outbound queue's key
        self._handles: list[ConsumerHandle] = []  # the queues it reads, its own first if it has one
        self._gate = make_gate(self._stalled)
        self._stalled_timeout_s = stalled_timeout_s
        self._acked: dict[ConsumerHandle, list[int]] = {}  # what the remote acknowledged in this read
        self._transport: asyncio.Transport | None = None
        self._writable = True
        self._held_by = 0
        self._flush_due = False
        self._acks_due = False  # inbound messages committed, their acknowledgements not yet sent
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        self._gone: anyio.Event | None = None
        self._dropped_in_gap = 0
        self._sent_mark = 0
        self._restart = anyio.Event()  # set: connect again now (the operator's restart)
        self._restarting = False  # the connection is being closed for a restart

    @property
    def id(self) -> str:
        return self._id

    # -- hooks of the kind -------------------------------------------------------------------------

    def subscribe_locally(self) -> None:
        """Subscribe to the router for what goes out (none by default)."""

    async def _open(self) -> None:
        """Declare and consume the queues it reads (before the first connection)."""

    def _targets(self) -> list[tuple[str, int]]:
        """The remote's addresses, tried in turn."""
        raise NotImplementedError

    def _delays(self) -> tuple[float, float]:
        """The backoff between tries: (base, cap), seconds."""
        raise NotImplementedError

    async def _connect_once(self, host: str, port: int) -> None:
        """Connect to ``host``, build the machine, and keep the connection until it goes."""
        raise NotImplementedError

    def _data(self, data: bytes) -> None:
        raise NotImplementedError

    def _lost(self, exc: Exception | None) -> None:
        raise NotImplementedError

    def _flush(self) -> None:
        """Send what the window lets go and write what the machine has."""
        raise NotImplementedError

    def _tick(self) -> None:
        raise NotImplementedError

    def _from_queue(self, delivery: QueueDelivery, handle: ConsumerHandle, line: Any) -> None:
        """A queued message, with the credit given: to the remote."""
        raise NotImplementedError

    def _acknowledge_ready(self) -> None:
        """Acknowledge to the remote the inbound messages now done at the head."""
        raise NotImplementedError

    def _down(self) -> None:
        """The connection went (after the common clean-up)."""

    def _is_up(self) -> bool:
        """Connected, and the remote set up to take messages."""
        raise NotImplementedError

    def _farewell(self) -> bytes:
        """The protocol's goodbye (DISCONNECT, close), b"" when there is nothing to say."""
        raise NotImplementedError

    async def stop(self) -> None:
        """At shutdown: take nothing more from the queues, let the remote acknowledge what is in
        flight (the app bounds the wait), then say goodbye. What it has not acknowledged stays
        queued for the next start."""
        for handle in self._handles:
            handle.set_credit(0)
        while self._is_up() and self.figures.in_flight:
            await anyio.sleep(0.02)
        if self._transport is not None:
            goodbye = self._farewell()
            if goodbye:
                self._transport.write(goodbye)

    def _as_publisher(self, act: Callable[[], None]) -> None:
        """``act`` (what the remote sent, acted on) with the link the runner's current publisher,
        whom the gates of the local subscribers and queues it feeds can hold."""
        runner = self.runner
        outer = runner.current
        runner.current = self
        try:
            act()
        finally:
            runner.current = outer

    # -- the local side -----------------------------------------------------------------------------

    @property
    def backlog_bytes(self) -> int:
        """Payload bytes of the outbound messages queued or in flight: its queue's own count."""
        state = self.queues.queues.get(self.queue)
        return 0 if state is None else state.bytes

    def _keep(self, message: Message, connected: bool) -> None:
        """Into the link's own queue, for the remote: bounded while it is away, and holding the
        publisher while it is connected and behind."""
        backlog = self.backlog_bytes
        if not connected and backlog + len(message.payload) > self.queue_bytes:
            self._drop(LINK_AWAY)  # the queue is full while the remote is away: as an offline session
            return
        try:
            self.queues.publish_nowait(self.queue, message)
        except QueueError as exc:  # the storage refuses writes (disk full, PostgreSQL away)
            self._drop(LINK_UNQUEUED)
            log.warning("%s %s: a message for the remote was not queued: %s", self.kind, self.name, exc)
            return
        if connected and backlog > self.queue_bytes // 2:
            self._gate.hold()  # the remote is behind: the publisher waits for it

    def _marked(self, message: Message) -> str | None:
        """``message``'s VIA header with this link added, or None when this link sent it out before
        (a loop: it is not sent again, and counted as dropped)."""
        went = via(message)
        if not went:
            return self.mark
        if self.mark not in went.split(","):
            return f"{went},{self.mark}"
        self._drop(LINK_LOOP)
        return None

    def _drop(self, reason: str) -> None:
        """A message for the remote not kept: counted here and by the broker (drops.py), which logs
        once a minute; those of a gap are told again when the remote is back."""
        self.figures.dropped += 1
        if reason != LINK_LOOP:
            self._dropped_in_gap += 1
        self.broker.stats.drops.drop(reason, self.vhost, self._id)

    async def _open_own_queue(self) -> None:
        # No max-length: the link bounds it (a limited queue's publishes each take their own
        # commit; these join the loop turn's), and paces its publishers itself.
        policy = QueuePolicySettings(visibility_timeout_s=HELD_FOR_S, max_attempts=1_000_000)
        self.queues.flow.ungated.add(self.queue)
        await self.queues.declare(self.queue, policy)
        self._consume(self.queue, self.kind, None, None)

    def _consume(self, queue: str, group: str | None, keys: str | None, line: Any) -> ConsumerHandle:
        """Read ``queue`` in ``group`` (None: the default one), the messages whose routing keys
        ``keys`` takes (a filter; None: all); ``line``: what the link makes of its messages."""
        outlet = _Outlet(self, line)
        outlet.handle = self.queues.consume(queue, outlet, group=group, routing_filter=keys)
        self._handles.append(outlet.handle)
        return outlet.handle

    def _to_queue(self, message: Message, entry: Pending | None) -> None:
        """Into a local queue (``message.topic``, a ``$queue/`` one); ``entry``: acknowledged to
        the remote once committed, None: unacknowledged."""
        parsed = parse_queue_topic(message.topic)

        def done(_result: PublishResult | None, error: QueueError | None) -> None:
            if entry is None:
                return
            if error is not None:
                # The write failed: not acknowledged, and the connection goes, so that the remote
                # sends it (and what came after) again.
                log.error("%s %s: %r was not stored: %s", self.kind, self.name, message.topic, error)
                if self._transport is not None:
                    self._transport.abort()
                return
            entry.done = True
            if not self._acks_due:  # once for the commit's messages: one ack (or one write)
                self._acks_due = True
                self.runner.loop().call_soon(self._acknowledge_committed)

        try:
            if parsed is None or parsed[2] is not None:
                raise QueueError("bad-topic", f"{message.topic!r} is not a queue to publish to")
            queue, routing_key, _control = parsed
            self.queues.publish_nowait(queue, message, routing_key, done, held=self)
        except QueueError as exc:
            log.warning("%s %s: %s refused: %s", self.kind, self.name, message.topic, exc)
            self.figures.refused += 1
            if entry is not None:
                entry.done = True  # refused here for good: the remote need not send it again
                self._acknowledge_ready()

    def _acknowledge_committed(self) -> None:
        self._acks_due = False
        self._acknowledge_ready()
        self._flush()

    def _settled_out(self, handle: ConsumerHandle, offset: int, refused: str | None) -> None:
        """The remote acknowledged (``refused`` None) or refused an outbound message: it leaves the
        queue (a refused one dead-lettered), and the gate sees the remote move."""
        figures = self.figures
        figures.in_flight -= 1
        if refused is not None:
            figures.refused += 1
            log.warning(
                "%s %s: the remote refused a message (%s); dead-lettered", self.kind, self.name, refused
            )
            handle.reject_nowait(offset, f"the remote refused it ({refused})")
            handle.add_credit(1)
        else:
            figures.sent += 1
            # Settled, and its credit given back, once for the read.
            self._acked.setdefault(handle, []).append(offset)
        self._sent_mark += 1
        self._gate.saw(self._sent_mark)
        if self._gate.holding and self.backlog_bytes <= self.queue_bytes // 4:
            self._gate.release()

    def _settle_acked(self) -> None:
        """The deliveries the remote acknowledged in one read: one change and one dispatch a queue."""
        for handle, offsets in self._acked.items():
            handle.settle_all_nowait(offsets, ACK)
            handle.add_credit(len(offsets))
        self._acked.clear()

    # -- the flow control's view: a publisher held, and a place that holds ---------------------------

    def held(self, on: bool) -> None:
        """A local subscriber the link feeds is behind (``on``): the remote is not read."""
        self._held_by += 1 if on else -1
        transport = self._transport
        if transport is not None and not transport.is_closing():
            if self._held_by:
                transport.pause_reading()
            else:
                transport.resume_reading()

    def _stalled(self, idle_s: float) -> bool:
        """The remote has taken nothing for ``idle_s`` while publishers wait: past the stalled
        consumer time-out the connection is dropped (it is made again, and the queue sent again)."""
        if idle_s < self._stalled_timeout_s:
            return True
        log.warning(
            "%s %s: the remote acknowledged nothing for %.0f s, %d messages in flight; reconnecting",
            self.kind,
            self.name,
            idle_s,
            self.figures.in_flight,
        )
        self._gate.release()
        if self._transport is not None:
            self._transport.abort()
        return False

    # -- the connection ---------------------------------------------------------------------------

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Open its queues, subscribe locally, then keep a connection to the remote until cancelled."""
        await self._open()
        self.subscribe_locally()
        self.figures.since = self._loop_time()
        task_status.started()
        base, cap = self._delays()
        delay = base
        addresses = self._targets()
        turn = 0
        try:
            while True:
                host, port = addresses[turn % len(addresses)]
                turn += 1
                self.figures.address = f"{host}:{port}"
                self._set_state(CONNECTING, None)
                connects = self.figures.connects
                try:
                    await self._connect_once(host, port)
                except (OSError, TimeoutError, ssl.SSLError) as exc:
                    self._set_state(WAITING, f"cannot connect to {host}:{port}: {exc}")
                if self.figures.connects > connects:
                    delay = base  # it was up: start the backoff again
                else:
                    delay = min(cap, random.uniform(base, delay * 3)) if cap > base else base
                log.info("%s %s: next try in %.1f s", self.kind, self.name, delay)
                with anyio.move_on_after(delay):
                    await self._restart.wait()  # (at once when a restart was asked meanwhile)
                self._restart = anyio.Event()
        finally:
            # What the queue handed it stays held: at the next start (or on release()) it is
            # handed out again.
            self.broker.router.unsubscribe_all(self)
            self._set_state(STOPPED, None)

    async def _connect(self, host: str, port: int, context: ssl.SSLContext | None, name: str) -> None:
        """The socket to the remote (its bytes go to :meth:`_data`); ``name``: the TLS server name."""
        loop = asyncio.get_running_loop()
        with anyio.fail_after(CONNECT_TIMEOUT_S):
            transport, _wire = await loop.create_connection(
                lambda: _Wire(self), host, port, ssl=context, server_hostname=name if context else None
            )
        self._made(transport)  # (uvloop may call connection_made after this returns: the same)

    async def _keep_connection(self) -> None:
        """Until the connection goes; then what it held is let go."""
        gone = self._gone = anyio.Event()
        self._flush()
        try:
            await gone.wait()
        finally:
            for handle in self._handles:
                handle.set_credit(0)
            self._gate.release()
            if self._transport is not None:
                self._transport.abort()
            self._transport = None
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            self._down()

    def _connected(self) -> None:
        """The remote accepted the connection."""
        self.figures.connects += 1
        if self._restart.is_set():  # asked while this connection was being made: it is the new one
            self._restart = anyio.Event()
        self._set_state(CONNECTED, None)
        if self._dropped_in_gap:
            log.warning(
                "%s %s: %d outbound messages dropped while the remote was away",
                self.kind,
                self.name,
                self._dropped_in_gap,
            )
            self._dropped_in_gap = 0

    def _close_socket(self, reason: str, data: bytes) -> None:
        """The machine closed: write its last bytes and close the socket; the link waits."""
        if self._restarting:  # this side closed it: not the remote's failure
            self._restarting = False
            self._set_state(WAITING, None)
        else:
            self._set_state(WAITING, reason)
        transport = self._transport
        if transport is not None:
            transport.write(data)
            transport.close()
        if self._gone is not None:
            self._gone.set()

    def restart(self) -> None:
        """The operator's restart: the connection (if any) is closed and made again at once."""
        log.info("%s %s: restart asked", self.kind, self.name)
        if self._transport is not None:
            self._restarting = True
            self._transport.abort()
        self._restart.set()

    async def release(self) -> None:
        """Gone for good (a reload removed or changed it): what the remote has not acknowledged
        goes back to the queues, for whoever consumes them next."""
        with anyio.CancelScope(shield=True):
            for handle in self._handles:
                await handle.cancel()

    def _made(self, transport: asyncio.Transport) -> None:
        if transport is self._transport:
            return
        self._transport = transport
        self._writable = True
        if self._held_by:
            transport.pause_reading()

    def _writing(self, on: bool) -> None:
        self._writable = on
        if on:
            self._flush_soon()

    def _flush_soon(self) -> None:
        if not self._flush_due:
            self._flush_due = True
            self.runner.loop().call_soon(self._flush)

    def _write(self, machine: Machine) -> None:
        """What the machine has, to the socket, and its next deadline armed."""
        transport = self._transport
        if transport is None:
            return
        data = machine.data_to_send()
        if data:
            transport.write(data)
        deadline = machine.next_deadline()
        if deadline is None:
            return
        if self._timer is not None and self._timer_at <= deadline:
            return  # an earlier timer looks again when it fires
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = deadline
        self._timer = self.runner.loop().call_at(deadline, self._timer_fired)

    def _timer_fired(self) -> None:
        self._timer = None
        self._tick()

    # -- what is said about it ------------------------------------------------------------------------

    def _set_state(self, state: str, error: str | None) -> None:
        figures = self.figures
        if error is not None:
            figures.last_error = error
        if state == figures.state and error is None:
            return
        figures.state = state
        figures.since = self._loop_time()
        kind, name = self.kind, self.name
        if state == CONNECTED:
            log.info("%s %s: connected to %s as %s", kind, name, figures.address, self.client_id)
        elif state == WAITING:
            if error is None:
                log.info("%s %s: disconnected for the restart", kind, name)
            else:
                log.warning("%s %s: %s", kind, name, error)
        elif state == STOPPED:
            log.info("%s %s: stopped", kind, name)

    def _loop_time(self) -> float:
        return self.runner.loop().time()


class _Wire(asyncio.Protocol):
    """The socket's callbacks, handed to the link."""

    __slots__ = ("_link",)

    def __init__(self, link: Link) -> None:
        self._link = link

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._link._made(cast(asyncio.Transport, transport))  # (uvloop's is not a subclass)

    def data_received(self, data: bytes) -> None:
        self._link._data(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self._link._lost(exc)

    def pause_writing(self) -> None:
        self._link._writing(False)

    def resume_writing(self) -> None:
        self._link._writing(True)


class _Outlet:
    """The link as a queue's consumer; ``line``: what the link makes of the queue's messages."""

    __slots__ = ("_link", "handle", "id", "line")

    def __init__(self, link: Link, line: Any) -> None:
        self._link = link
        self.id = link.id
        self.line = line
        self.handle: ConsumerHandle | None = None  # set once consume() returns, before any credit

    def deliver(self, delivery: QueueDelivery) -> None:
        assert self.handle is not None
        self._link._from_queue(delivery, self.handle, self.line)

    def stalled(self, idle_s: float) -> None:
        """Not asked: the queue's flow leaves the link's queue to the link's gate."""
