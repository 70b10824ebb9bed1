"""One AMQP 0.9.1 connection on the connection runtime: its machine, channels, publisher confirms
and exclusive queues, and the runtime's ``Hull`` surface.

The runtime hands the machine's events to :meth:`Amqp091Conn.handle` one at a time; the front end
(:mod:`trimaran.amqp091.handler`) turns them into deck operations. Nothing here waits per message:
outgoing bytes ask the runtime for a flush (``io.wake()``), confirms leave in publish order from the
commit callbacks, and background work runs through ``io.spawn``.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Coroutine
from functools import partial
from typing import TYPE_CHECKING, Any

import anyio

from trimaran.amqp091 import spec
from trimaran.amqp091.channels import UNWRITTEN_BYTES, ChannelState, Consumer
from trimaran.amqp091.connection import ConnectionState, ServerConnection
from trimaran.amqp091.events import ContentReceived, ContentRun
from trimaran.broker.clients import ClientInfo
from trimaran.queue.manager import PublishResult
from trimaran.queue.policy import QueueError
from trimaran.runtime.confirms import InOrder
from trimaran.runtime.transport import Conn, Hull

#: A publish's route through a named exchange, as kept in Amqp091Conn.routes: the queues it reaches
#: (all of them allowed), whether the router takes it too, and with one queue its name and topic.
Route = tuple[tuple[str, ...], bool, "str | None", str]

if TYPE_CHECKING:
    from trimaran.amqp091.ports import FrontEnd
    from trimaran.security.guard import Principal

log = logging.getLogger(__name__)

FORCED = "CONNECTION_FORCED - broker forced connection closure"
#: At most this long, close-ok waits for the confirms of the publishes before the close.
CONFIRM_WAIT_S = 5.0


class Pending:
    """A publish waiting for its commits before its confirm, or a tx.commit before its commit-ok.

    ``waiting`` counts the commits still to come, plus one while the publish is still being routed
    (so a commit that completes during routing cannot confirm it early); ``done`` once it is 0.
    """

    __slots__ = ("channel", "conn", "done", "failed", "reply", "seq", "waiting")

    def __init__(self, conn: Amqp091Conn, channel: ChannelState, seq: int, reply: spec.Method | None) -> None:
        self.conn = conn
        self.channel = channel
        self.seq = seq
        self.reply = reply
        self.failed = False
        self.waiting = 1
        self.done = False  # read once a confirm by InOrder.ready: an attribute, not a property

    def expect(self) -> None:
        """One more commit to wait for."""
        self.waiting += 1

    def committed(self, _result: PublishResult | None, error: QueueError | None) -> None:
        """A commit this entry waits for is done (``error``: the write failed)."""
        if error is not None:
            self.failed = True
        self.waiting -= 1
        if not self.waiting:
            self.done = True
            conn = self.conn
            if not conn.confirm_is_due:  # once a turn: the first confirm done asks for the write
                conn.confirm_due()

    def sealed(self) -> None:
        """Routing is over: nothing more will be expected (``committed`` with no error, inline)."""
        self.waiting -= 1
        if not self.waiting:
            self.done = True
            self.conn.confirm_due()


class Amqp091Conn(Hull):
    """The runtime's hull for one AMQP 0.9.1 connection."""

    def __init__(self, front: FrontEnd, io: Conn, machine: ServerConnection) -> None:
        self.front = front
        self.io = io
        self.machine = machine  # the runtime drives it as a Machine; the front end, as itself:
        self.amqp = machine
        self.peer = self.name = io.peer  # (made once: the runtime makes the text when asked)
        self.user: str | None = None
        self.principal: Principal | None = None  # who logged in: what the rules let it do
        self.client: ClientInfo | None = None
        self.channels: dict[int, ChannelState] = {}
        self.written_hooks: set[ChannelState] = set()
        self.pending: InOrder[Pending] = InOrder()  # confirms and tx.commit-oks, in arrival order
        self.exclusive_queues: set[str] = set()
        # Where its publishes through named exchanges went, allowed, by (exchange, routing key):
        # while neither the vhost's bindings nor the rules have changed since (the two generations),
        # a publish to the same key takes its route from here, not from the exchange and the rules.
        self.routes: dict[tuple[str, str], Route] = {}
        self.routes_bindings = -1
        self.routes_rules = -1
        # The vhost it works in (``tenants.Tenant``, a floor above: typed Any here, read back as a
        # Tenant by the handler): set by the front end at open, again at connection.open.
        self.tenant: Any
        self.vhost_prefix = ""  # its tenant's key prefix (trimaran/vhosts.py), set with ``tenant``
        self._blocked_sent = False
        self._confirmed: anyio.Event | None = None  # set when the last pending confirm is sent
        self.confirm_is_due = False  # a confirm is done: send what is ready before the next write

    @property
    def virtual_host(self) -> str | None:
        """The vhost connection.open named (None before it)."""
        return self.amqp.virtual_host

    # -- the runtime's Hull -----------------------------------------------------------------------

    def handle(self, event: object) -> Awaitable[None] | None:
        if type(event) is ContentReceived:  # a publish, most events: without a hop through on_event
            self.front.content(self, event)
            return None
        if type(event) is ContentRun:
            self.front.content_run(self, event)
            return None
        return self.front.on_event(self, event)

    def before_write(self) -> None:
        if self.confirm_is_due:
            self.confirm_is_due = False
            self.confirm_ready()

    def written(self) -> None:
        # A consumer's credit for what it was handed comes back once that is written; not while
        # the socket is behind by more than UNWRITTEN_BYTES (what comes would pile up in the
        # transport, unbounded): its queue's backlog grows instead and holds the publishers
        # (queue/flow.py), and the runtime calls this again once the socket drains.
        if self.written_hooks and self.io.backlog() <= UNWRITTEN_BYTES:
            hooks, self.written_hooks = self.written_hooks, set()
            for channel in hooks:
                channel.after_write()

    def shutdown(self) -> None:
        self.amqp.close(spec.CONNECTION_FORCED, FORCED)

    def behind(self) -> int | None:
        """Nothing waits for the peer beyond its socket: a queue's backlog is the queue's."""
        return None

    def stalled(self, idle_s: float) -> None:
        """Never asked: ``behind`` is always None."""

    def blocked(self, on: bool, why: str) -> None:
        """connection.blocked (saying ``why``: low on memory, low on disk) / unblocked, to a client
        that announced the capability."""
        machine = self.amqp
        if machine.state is not ConnectionState.OPEN:
            return
        if machine.client_capabilities.get("connection.blocked") is not True:
            return
        if on and not self._blocked_sent:
            machine.send_method(0, spec.ConnectionBlocked(why))
            self._blocked_sent = True
        elif not on and self._blocked_sent:
            machine.send_method(0, spec.ConnectionUnblocked())
            self._blocked_sent = False
        self.io.wake()

    def finish(self) -> Callable[[], Coroutine[Any, Any, None]]:
        return partial(self.front.finish, self)

    # -- what the front end and the channels call -------------------------------------------------

    def wake(self) -> None:
        """The machine has bytes to send."""
        self.io.wake()

    def kick(self, code: int, text: str) -> None:
        """Close from outside an event (an administrator, a shutdown)."""
        self.amqp.close(code, text)
        self.io.pump()

    def release(self, consumer: Consumer) -> None:
        """A cancelled consumer has nothing unacknowledged left: detach it from its queue."""
        handle = consumer.handle
        if handle is not None and not handle.closed:
            self.io.spawn(handle.cancel)

    # -- confirms: in publish order, after the commits ---------------------------------------------

    def begin_confirm(self, channel: ChannelState, seq: int, reply: spec.Method | None = None) -> Pending:
        """An entry for a publish (confirm ``seq``) or a tx.commit (``reply``); ``sealed()`` ends it."""
        entry = Pending(self, channel, seq, reply)
        self.pending.add(entry)
        return entry

    def drop_confirm(self, entry: Pending) -> None:
        """A publish (or tx.commit) refused before it was routed: nothing to confirm, nothing after
        it waits for it."""
        self.pending.remove(entry)
        self.confirm_ready()

    def confirm_due(self) -> None:
        """An entry is done. Its confirm goes out before the connection's next write, with every
        other one done by then: a commit of a thousand publishes is one ``multiple`` ack, not a
        thousand acks."""
        if not self.confirm_is_due:
            self.confirm_is_due = True
            self.io.wake()

    def confirm_ready(self) -> None:
        """Send every confirm whose commits are done and that has none left before it. Acks on a
        channel in a row go as one ``multiple`` ack."""
        pending = self.pending
        machine = self.amqp
        acks: dict[ChannelState, tuple[int, int]] = {}  # channel -> (last seq, how many)
        for entry in pending.ready():
            channel = entry.channel
            if entry.reply is not None:
                self._flush_ack(acks, channel)
                machine.send_method(channel.number, entry.reply)
            elif entry.failed:
                self._flush_ack(acks, channel)
                machine.send_method(channel.number, spec.BasicNack(entry.seq, False, False))
            else:
                _, count = acks.get(channel, (0, 0))
                acks[channel] = (entry.seq, count + 1)
        for channel in list(acks):
            self._flush_ack(acks, channel)
        self.io.wake()
        if not pending and self._confirmed is not None:
            self._confirmed.set()

    async def confirms_sent(self) -> None:
        """Wait until every pending confirm has been sent (before close-ok answers a close)."""
        if self.pending:
            self._confirmed = anyio.Event()
            with anyio.move_on_after(CONFIRM_WAIT_S):  # commits always report; this is a backstop
                await self._confirmed.wait()

    def _flush_ack(self, acks: dict[ChannelState, tuple[int, int]], channel: ChannelState) -> None:
        got = acks.pop(channel, None)
        if got is not None:
            seq, count = got
            self.amqp.send_method(channel.number, spec.BasicAck(seq, count > 1))
