"""The deck side of AMQP 1.0 links: what each attached link is bound to.

- :class:`QueueOut`: the peer receives from a queue; a consumer of the queue manager whose
  manager credit *is* the link credit (no credit: nothing is taken from the queue, so other
  consumers get the messages).
- :class:`TopicOut`: the peer receives from a router topic (filters may hold ``+`` and ``#``);
  messages that arrive while the link has no credit wait in a bounded backlog.
  :class:`SelectedTopicOut` sends only what its JMS selector selects.
- :class:`InLink`: the peer sends to a queue, a topic, or (no target address) to each message's
  ``to`` address.

Everything here is synchronous and never blocks. Deliveries arrive outside the connection's
events, so each send ends with ``io.wake()``: the runtime writes it in this loop iteration's flush.
A link keeps its connection's machine, I/O state and the broker's counters itself: the connection
is typed by a protocol here (``ports.LinkOwner``), and compiled, each attribute read through one
is a lookup by name, where the link's own is a field.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from trimaran.amqp1.addresses import Address
from trimaran.amqp1.connection import AMQPStateError
from trimaran.amqp1.mapping import EXTRA_KEY, to_amqp1
from trimaran.amqp1.performatives import Accepted, Modified, Rejected, Released
from trimaran.amqp1.session import Link, LinkState
from trimaran.broker.drops import RECEIVER_BACKLOG_FULL, TOO_LARGE
from trimaran.broker.message import Message
from trimaran.broker.router import Delivery
from trimaran.queue.groups import Selects
from trimaran.queue.manager import BrowseHandle, ConsumerHandle, QueueDelivery
from trimaran.queue.outcomes import ACK, RELEASED, RETRY_NOW, DeadLetter, Outcome, Retry

if TYPE_CHECKING:
    from trimaran.amqp1.connection import ServerConnection
    from trimaran.amqp1.ports import LinkOwner
    from trimaran.amqp1.subscriptions import Subscription
    from trimaran.broker.stats import Stats
    from trimaran.queue.policy import QueueError
    from trimaran.runtime.transport import Conn

log = logging.getLogger(__name__)
ATTACHED = LinkState.ATTACHED


class OutLink:
    """Our sender link (the peer is the receiver)."""

    __slots__ = (
        "address",
        "conn",
        "id",
        "io",
        "link",
        "machine",
        "released",
        "settled",
        "stats",
        "stopped",
        "temp_queue",
    )

    def __init__(self, conn: LinkOwner, link: Link, address: Address, settled: bool) -> None:
        self.conn = conn
        self.machine: ServerConnection = conn.amqp
        self.io: Conn = conn.io
        self.stats: Stats = conn.front.broker.stats
        self.link = link
        self.address = address
        self.settled = settled  # pre-settled sends (snd-settle-mode settled): at most once
        self.id = f"{conn.container_id}/{link.name}"
        self.stopped = False  # the link is gone: send nothing more
        self.released = False  # its queue consumer is cancelled, its temporary queue deleted
        self.temp_queue: str | None = None  # a dynamic node, deleted with the link

    def __hash__(self) -> int:
        return id(self)

    def _send(self, payload: bytes) -> int | None:
        link = self.link
        if link.state is not ATTACHED or link.link_credit <= 0:
            return None
        try:
            did = self.machine.send(link, payload, settled=self.settled)
        except AMQPStateError as exc:
            log.info("amqp1: cannot send on %s: %s", self.id, exc)
            return None
        io = self.io
        if not io.dirty:  # once per loop iteration, not per message
            io.wake()
        return did

    def on_flow(self, drain: bool) -> None:
        raise NotImplementedError

    def on_outcome(self, delivery_id: int, state: Any, settled: bool) -> None:
        """The peer's disposition for one of our deliveries."""

    def on_outcomes(self, delivery_ids: list[int], state: Any, settled: bool) -> None:
        """The peer's disposition for several of our deliveries (one range, one state)."""
        for delivery_id in delivery_ids:
            self.on_outcome(delivery_id, state, settled)

    def stop(self) -> None:
        """Stop sending at once (the link is gone); the async part is ``Amqp1FrontEnd.release``."""
        self.stopped = True


class QueueOut(OutLink):
    __slots__ = ("handle", "offsets", "subscription")

    def __init__(self, conn: LinkOwner, link: Link, address: Address, settled: bool) -> None:
        super().__init__(conn, link, address, settled)
        self.handle: ConsumerHandle | None = None
        self.offsets: dict[int, int] = {}  # delivery id -> queue offset, until the outcome
        self.subscription: Subscription | None = None  # the topic subscription whose queue it reads

    def deliver(self, delivery: QueueDelivery) -> None:
        """Called by the queue manager (only while this link has credit)."""
        handle = self.handle
        message = delivery.message
        # What an AMQP 1.0 peer sent goes out as it came, unless a redelivery changes its header.
        payload = message.extra.get(EXTRA_KEY) if message.extra and not delivery.failed else None
        if payload.__class__ is not bytes:
            payload = to_amqp1(message, delivery_count=delivery.failed, cut=self.address.cut)
        link = self.link
        max_size = link.max_message_size
        if max_size and len(payload) > max_size:
            if handle is not None:
                too_large = DeadLetter(f"larger than {self.id}'s max-message-size {max_size}")
                handle.settle_nowait(delivery.offset, too_large)
            return
        # _send written out: a call less for every message a queue delivers
        did: int | None = None
        if link.state is ATTACHED and link.link_credit > 0:
            try:
                did = self.machine.send(link, payload, settled=self.settled)
            except AMQPStateError as exc:
                log.info("amqp1: cannot send on %s: %s", self.id, exc)
        if did is None:
            if handle is not None and not self.settled:
                handle.settle_nowait(delivery.offset, RETRY_NOW)
            return
        io = self.io
        if not io.dirty:
            io.wake()
        self.stats.messages_sent += 1
        io.messages_out += 1
        if not self.settled:
            self.offsets[did] = delivery.offset

    def stalled(self, idle_s: float) -> None:
        """Its queue held publishers and nothing was settled for ``idle_s`` seconds: the link is
        detached with an error, its unsettled deliveries go back to the queue."""
        self.conn.front.stalled(self.conn, self, idle_s)

    def on_flow(self, drain: bool) -> None:
        handle = self.handle
        if handle is None or handle.closed:
            return
        handle.set_credit(self.link.credit)  # delivers synchronously what the credit allows
        if drain and self.link.is_open and self.link.credit > 0:
            handle.when_claimed(self._drained)  # a shared queue's messages: a claim away

    def _drained(self) -> None:
        handle = self.handle
        if handle is not None and not handle.closed and self.link.is_open and self.link.credit > 0:
            self.machine.complete_drain(self.link)
            handle.set_credit(0)
            self.io.wake()

    def on_outcome(self, delivery_id: int, state: Any, settled: bool) -> None:
        offset = self.offsets.get(delivery_id)
        handle = self.handle
        if offset is None or handle is None or handle.closed:
            return
        if state is None and not settled:
            return  # no outcome yet
        del self.offsets[delivery_id]
        handle.settle_nowait(offset, disposition_outcome(state, self.id))

    def on_outcomes(self, delivery_ids: list[int], state: Any, settled: bool) -> None:
        """A range settles in one step: one outcome, one change for the queue."""
        handle = self.handle
        if handle is None or handle.closed or (state is None and not settled):
            return
        offsets = self.offsets
        ours = [d for d in delivery_ids if d in offsets]
        if not ours:
            return
        taken = [offsets[d] for d in ours]
        for d in ours:
            del offsets[d]
        handle.settle_all_nowait(taken, disposition_outcome(state, self.id))

    def stop(self) -> None:
        super().stop()
        if self.handle is not None:
            self.handle.set_credit(0)


class QueueBrowse(OutLink):
    """A ``distribution-mode copy`` receiver on a queue: it browses (sees what the queue holds and
    what arrives) and changes nothing; its settlements are taken and ignored."""

    __slots__ = ("handle",)

    def __init__(self, conn: LinkOwner, link: Link, address: Address, settled: bool) -> None:
        super().__init__(conn, link, address, settled)
        self.handle: BrowseHandle | None = None

    def deliver(self, delivery: QueueDelivery) -> None:
        payload = to_amqp1(delivery.message, delivery_count=0, cut=self.address.cut)
        max_size = self.link.max_message_size
        if max_size and len(payload) > max_size:
            return  # a copy: nothing to give back
        if self._send(payload) is not None:
            self.stats.messages_sent += 1
            self.io.messages_out += 1

    def stalled(self, idle_s: float) -> None:
        """Never asked: a browser holds nothing and is no consumer of a group."""

    def on_flow(self, drain: bool) -> None:
        handle = self.handle
        if handle is None or handle.closed:
            return
        handle.set_credit(self.link.credit)
        if drain:  # once what the credit asked for is read (a shared queue's rows: a read away)
            handle.when_read(self._drained)

    def _drained(self) -> None:
        handle = self.handle
        if handle is not None and self.link.is_open and self.link.credit > 0:
            self.machine.complete_drain(self.link)
            handle.set_credit(0)
            self.io.wake()

    def stop(self) -> None:
        super().stop()
        if self.handle is not None:
            self.handle.cancel_nowait()


class TopicOut(OutLink):
    """A router subscriber for one link."""

    __slots__ = ("backlog",)

    def __init__(self, conn: LinkOwner, link: Link, address: Address, settled: bool) -> None:
        super().__init__(conn, link, address, settled)
        self.backlog: deque[bytes] = deque()

    def deliver(self, message: Message, delivery: Delivery[Any]) -> None:
        """Called by the router: send now, or keep in the bounded backlog until credit comes."""
        if self.stopped:
            return
        stats = self.stats
        payload = self.conn.front.encode_once(message, self.address.cut)
        max_size = self.link.max_message_size
        if max_size and len(payload) > max_size:
            self.conn.front.dropped(message, self.id, TOO_LARGE, self.io.vhost)
            return
        if not self.backlog and self._send(payload) is not None:
            stats.messages_sent += 1
            self.io.messages_out += 1
            return
        if len(self.backlog) >= self.conn.front.outbox_size:
            self.conn.front.dropped(message, self.id, RECEIVER_BACKLOG_FULL, self.io.vhost)
            return
        self.backlog.append(payload)

    def on_flow(self, drain: bool) -> None:
        backlog = self.backlog
        stats = self.stats
        while backlog and self.link.is_open and self.link.credit > 0:
            if self._send(backlog.popleft()) is not None:
                stats.messages_sent += 1
                self.io.messages_out += 1
        if drain and self.link.is_open and self.link.credit > 0:
            self.machine.complete_drain(self.link)
            self.io.wake()

    def stop(self) -> None:
        super().stop()
        self.backlog.clear()


class SelectedTopicOut(TopicOut):
    """A topic link with a message selector: only the messages it selects are sent (the router's
    path for links without one does not test anything)."""

    __slots__ = ("selects",)

    def __init__(
        self, conn: LinkOwner, link: Link, address: Address, settled: bool, selects: Selects
    ) -> None:
        super().__init__(conn, link, address, settled)
        self.selects = selects

    def deliver(self, message: Message, delivery: Delivery[Any]) -> None:
        if self.selects(message):
            TopicOut.deliver(self, message, delivery)


class InLink:
    """Our receiver link (the peer sends). ``address`` None: an anonymous relay (per-message ``to``),
    or the transaction coordinator (``coordinator``).

    A queue that is behind holds the link, not its connection (``held``): the peer gets no new
    credit until the queue catches up, and the connection's other links go on."""

    __slots__ = ("address", "coordinator", "holds", "inflight", "link", "owner", "presettled")

    def __init__(
        self, link: Link, address: Address | None, coordinator: bool = False, owner: LinkOwner | None = None
    ) -> None:
        self.link = link
        self.address = address
        self.inflight = 0  # queue publishes not yet committed
        self.coordinator = coordinator  # its messages declare and discharge transactions
        # A queue address's: the commit callback of its pre-settled publishes (conn.SettledPublishes)
        self.presettled: Callable[[object, QueueError | None], None] | None = None
        self.owner = owner  # its connection, which refills its credit
        self.holds = 0  # queues behind that this link feeds (queue/flow.py): no new credit while > 0

    def held(self, on: bool) -> None:
        """A queue it feeds is behind (``on``), or caught up: no new credit while any is."""
        self.holds += 1 if on else -1
        if not self.holds and self.owner is not None:
            self.owner.refill(self)


def disposition_outcome(state: Any, link: str) -> Outcome:
    """AMQP 1.0's delivery state as a typed outcome. accepted (or settled with no state) acknowledges;
    rejected dead-letters; released is handed back unprocessed (at once, not an attempt); modified
    with delivery-failed is a failed attempt (counted, backs off), without it the message comes back
    unchanged (undeliverable-here too: the queue cannot exclude one consumer)."""
    if state is None or isinstance(state, Accepted):
        return ACK
    if isinstance(state, Rejected):
        error = state.error
        reason = error.description or str(error.condition) if error is not None else "rejected"
        return DeadLetter(f"rejected by {link}: {reason}")
    if isinstance(state, Released):
        return RELEASED
    if isinstance(state, Modified):
        return Retry(None) if state.delivery_failed else RELEASED
    return ACK
