"""Per-channel consuming state: consumers, delivery tags, prefetch as queue-manager credit.

A consumer (basic.consume) is a queue-manager consumer. Prefetch is credit: a consumer holds at most
``prefetch_count`` unacknowledged deliveries (RabbitMQ's per-consumer qos), and a channel-wide
limit (``global`` qos) caps the sum over the channel's consumers. A consumer without a prefetch
count has no limit on what it leaves unacknowledged, as in RabbitMQ; what it has been handed but its
socket has not yet taken is bounded (``UNWRITTEN``, given back as the runtime writes, not while the
socket is more than ``UNWRITTEN_BYTES`` behind), as is a no-ack consumer's under its prefetch: so
a consumer that reads slowly leaves its messages in its queue, whose backlog holds the publishers
(queue/flow.py), rather than in the server's buffers for its socket.

basic.ack / nack / reject become typed outcomes where they are read (:data:`BASIC_OUTCOMES`),
settled through each consumer's handle: requeue comes back at once (an attempt), ``requeue=false``
dead-letters (when the queue has a dead-letter target, else the message is dropped).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Final

from trimaran.amqp091.mapping import delivery_form
from trimaran.amqp091.properties import BasicProperties
from trimaran.amqp091.spec import PRECONDITION_FAILED, BasicGetOk, BasicPublish, ProtocolError
from trimaran.queue.manager import ConsumerHandle, QueueDelivery
from trimaran.queue.outcomes import ACK, RETRY_NOW, UNSENT, DeadLetter, Outcome

if TYPE_CHECKING:
    from trimaran.amqp091.connection import ServerConnection
    from trimaran.amqp091.ports import ChannelOwner
    from trimaran.broker.stats import Stats
    from trimaran.queue.journal import Receipt
    from trimaran.runtime.transport import Conn

log = logging.getLogger(__name__)


#: The deliveries a consumer without a prefetch count may have that its socket has not yet taken.
UNWRITTEN: Final = 10_000
#: Bytes behind on a connection's socket past which its consumers' credit waits for it to drain.
UNWRITTEN_BYTES: Final = 1 << 20


class Consumer:
    """One basic.consume (or the hidden consumer basic.get uses); the manager's QueueConsumer."""

    __slots__ = (
        "cancelled",
        "channel",
        "exclusive",
        "handle",
        "id",
        "no_ack",
        "outstanding",
        "prefetch",
        "queue",
        "tag",
        "unacked",
    )

    def __init__(
        self, channel: ChannelState, tag: str, queue: str, *, no_ack: bool, prefetch: int, exclusive: bool
    ) -> None:
        self.channel = channel
        self.tag = tag
        self.queue = queue
        self.no_ack = no_ack
        self.prefetch = prefetch
        self.exclusive = exclusive
        self.id = f"{channel.conn.name}/{channel.number}/{tag}"
        self.handle: ConsumerHandle | None = None
        self.unacked = 0  # delivered, waiting for basic.ack
        self.outstanding = 0  # deliveries queued but not yet written (no-ack, or no prefetch)
        self.cancelled = False

    def deliver(self, delivery: QueueDelivery) -> None:
        """A delivery from the queue: written on the channel (one call a message, not a hop to the
        channel's own method), or given back when the channel has closed or cannot send."""
        channel = self.channel
        message = delivery.message
        if channel.closed:
            channel.give_back(self, delivery)
            return
        exchange, key, properties = delivery_form(message)
        tag = channel.next_tag
        channel.next_tag = tag + 1
        sent = channel.machine.send_delivery(
            channel.number, self.tag, tag, delivery.redelivered, exchange, key, properties, message.payload
        )
        if not sent:
            channel.give_back(self, delivery)
            return
        channel.stats.messages_sent += 1
        io = channel.io
        io.messages_out += 1
        if not self.no_ack:
            channel.unacked[tag] = (self, delivery.offset)
            self.unacked += 1
        if self.no_ack or not self.prefetch:  # its credit comes back once its socket takes it
            self.outstanding += 1
            channel.conn.written_hooks.add(channel)
        if not io.dirty:  # once a flush, not once a delivery: the runtime's wake, straight
            io.wake()

    def stalled(self, idle_s: float) -> None:
        """Its queue held publishers and nothing was settled for ``idle_s`` seconds: the channel
        closes with 406, as RabbitMQ's consumer_timeout closes it, and its deliveries go back."""
        conn = self.channel.conn
        conn.front.stalled(conn, self, idle_s)


class Getter(Consumer):
    """basic.get: a consumer with no credit except while a get runs."""

    __slots__ = ("got",)

    def __init__(self, channel: ChannelState, queue: str, no_ack: bool) -> None:
        super().__init__(channel, "", queue, no_ack=no_ack, prefetch=1, exclusive=False)
        self.got: QueueDelivery | None = None

    def deliver(self, delivery: QueueDelivery) -> None:
        self.got = delivery

    def take(self) -> QueueDelivery | None:
        """What the queue handed over since :meth:`ChannelState.get` gave credit, if anything: read
        through a call, since a type checker narrows ``got`` to None after the reset."""
        got = self.got
        self.got = None
        return got


class ChannelState:
    __slots__ = (
        "closed",
        "confirm",
        "conn",
        "consumers",
        "flow_active",
        "getters",
        "global_prefetch",
        "io",
        "last_queue",
        "last_write",
        "machine",
        "next_tag",
        "number",
        "prefetch",
        "publish_seq",
        "reply_tag",
        "reply_token",
        "stats",
        "tx",
        "tx_acks",
        "tx_publishes",
        "unacked",
    )

    def __init__(self, conn: ChannelOwner, number: int) -> None:
        self.conn = conn
        # What a delivery writes to and counts on, held typed rather than reached through the
        # connection's protocol on every message: the connection's for its whole life.
        self.machine: ServerConnection = conn.amqp
        self.io: Conn = conn.io
        self.stats: Stats = conn.front.broker.stats
        self.number = number
        self.consumers: dict[str, Consumer] = {}
        self.getters: dict[tuple[str, bool], Getter] = {}
        #: delivery tag -> (consumer, queue offset), in tag order.
        self.unacked: dict[int, tuple[Consumer, int]] = {}
        self.next_tag = 1
        self.prefetch = 0  # for consumers created from now on; 0 = no limit
        self.global_prefetch = 0
        self.flow_active = True
        self.confirm = False
        self.publish_seq = 0
        self.tx = False
        self.tx_publishes: list[tuple[BasicPublish, BasicProperties, bytes]] = []
        self.tx_acks: list[Callable[[], None]] = []
        self.last_queue = ""
        #: The channel's latest durable publish not yet known committed: its own basic.get waits for
        #: it (RabbitMQ orders a channel's publish and get).
        self.last_write: Receipt | None = None
        self.closed = False  # the channel is gone; its consumers are being released
        #: Direct reply-to: the consumer tag on amq.rabbitmq.reply-to and the channel's token.
        self.reply_tag = ""
        self.reply_token: str | None = None

    # -- delivering -------------------------------------------------------------------------------

    def give_back(self, consumer: Consumer, delivery: QueueDelivery) -> None:
        """A delivery handed over as the channel closed, never sent: back to the queue, and not
        as a redelivery (it was not delivered)."""
        handle = consumer.handle
        if handle is None:
            return
        handle.set_credit(0)
        if not consumer.no_ack:
            handle.settle_nowait(delivery.offset, UNSENT)

    def offer(self, getter: Getter) -> None:
        """basic.get's credit: what the queue has ready is handed over now (``getter.got``); then
        :meth:`answer` (a shared queue's get waits for a claim in between)."""
        handle = getter.handle
        assert handle is not None
        getter.got = None
        handle.add_credit(1)

    def answer(self, getter: Getter, message_count: Callable[[], int]) -> bool:
        """What the getter was handed since :meth:`offer`, as get-ok (True); else its credit ends."""
        handle = getter.handle
        assert handle is not None
        delivery = getter.take()
        if delivery is None:
            handle.set_credit(0)
            return False
        tag = self.next_tag
        self.next_tag = tag + 1
        exchange, key, properties = delivery_form(delivery.message)
        method = BasicGetOk(tag, delivery.redelivered, exchange, key, message_count())
        self.machine.send_content(self.number, method, properties, delivery.message.payload)
        self.stats.messages_sent += 1
        self.io.messages_out += 1
        if not getter.no_ack:
            self.unacked[tag] = (getter, delivery.offset)
            getter.unacked += 1
        self.conn.wake()
        return True

    def after_write(self) -> None:
        """Deliveries counted until written were written: their credit comes back."""
        for consumer in self.consumers.values():
            if consumer.outstanding:
                consumer.outstanding = 0
                self.refill(consumer)

    # -- credit -----------------------------------------------------------------------------------

    def refill(self, consumer: Consumer) -> None:
        handle = consumer.handle
        if handle is None or handle.closed or consumer.cancelled or not self.flow_active:
            return
        if consumer.prefetch:
            want = consumer.prefetch - consumer.unacked - consumer.outstanding - handle.credit
        else:
            want = UNWRITTEN - consumer.outstanding - handle.credit
        if self.global_prefetch:
            held = len(self.unacked) + sum(
                c.handle.credit + (c.outstanding if c.no_ack else 0)  # (the others' are in unacked)
                for c in self.consumers.values()
                if c.handle is not None
            )
            want = min(want, self.global_prefetch - held)
        if want > 0:
            handle.add_credit(want)

    def refill_all(self) -> None:
        for consumer in list(self.consumers.values()):
            self.refill(consumer)

    def stop_flow(self) -> None:
        for consumer in self.consumers.values():
            if consumer.handle is not None:
                consumer.handle.set_credit(0)

    # -- settling ---------------------------------------------------------------------------------

    def _take(self, delivery_tag: int, multiple: bool, what: str) -> list[tuple[Consumer, int]]:
        unacked = self.unacked
        if multiple:
            if delivery_tag == 0:
                tags = list(unacked)
            else:
                tags = []
                for t in unacked:  # in tag order: stop at the first one past delivery_tag
                    if t > delivery_tag:
                        break
                    tags.append(t)
            taken = [unacked.pop(t) for t in tags]
        elif delivery_tag in unacked:
            taken = [unacked.pop(delivery_tag)]
        else:
            raise ProtocolError(
                PRECONDITION_FAILED,
                f"unknown delivery tag {delivery_tag}",
                channel=self.number,
                class_id=60,
                method_id={"ack": 80, "reject": 90, "nack": 120}[what],
            )
        for consumer, _offset in taken:
            consumer.unacked -= 1
        return taken

    def settle(self, delivery_tag: int, multiple: bool, action: str, requeue: bool = False) -> None:
        """basic.ack (action "ack"), basic.nack ("nack") or basic.reject ("reject")."""
        held = None if multiple else self.unacked.pop(delivery_tag, None)
        if held is not None:  # one tag, the usual case
            held[0].unacked -= 1
            taken = [held]
        else:
            taken = self._take(delivery_tag, multiple, action)
        self.settle_taken(
            taken, BASIC_OUTCOMES["ack" if action == "ack" else "requeue" if requeue else "reject"]
        )

    def settle_taken(self, taken: list[tuple[Consumer, int]], outcome: Outcome) -> None:
        touched: dict[Consumer, list[int]] = {}
        for consumer, offset in taken:
            handle = consumer.handle
            if handle is None or handle.closed:
                continue
            offsets = touched.get(consumer)
            if offsets is None:
                touched[consumer] = [offset]
            else:
                offsets.append(offset)
        for consumer, offsets in touched.items():  # an ack of 100 with multiple: one settle a consumer
            consumer.handle.settle_all_nowait(offsets, outcome)  # type: ignore[union-attr]
        for consumer in touched:
            if consumer.cancelled and not consumer.unacked:
                self.conn.release(consumer)
        if self.global_prefetch:
            self.refill_all()
        else:
            for consumer in touched:
                if not isinstance(consumer, Getter):
                    self.refill(consumer)

    def recover(self) -> None:
        """basic.recover: every unacknowledged delivery goes back to its queue, redelivered."""
        taken = list(self.unacked.values())
        self.unacked.clear()
        for consumer, _ in taken:
            consumer.unacked -= 1
        self.settle_taken(taken, RETRY_NOW)

    def handles(self) -> list[ConsumerHandle]:
        """Every manager consumer of this channel (to cancel when it closes)."""
        found = [c.handle for c in self.consumers.values() if c.handle is not None]
        found += [g.handle for g in self.getters.values() if g.handle is not None]
        found += [c.handle for c, _ in self.unacked.values() if c.handle is not None and c.cancelled]
        return list({id(h): h for h in found}.values())


_REJECTED = DeadLetter("rejected by the AMQP 0.9.1 consumer")

#: AMQP 0.9.1's settlements as typed outcomes: basic.ack ("ack") acknowledges; basic.nack or
#: basic.reject with requeue ("requeue") comes back at once, an attempt; without requeue ("reject")
#: dead-letters (to the queue's dead-letter exchange, if any), as RabbitMQ does.
BASIC_OUTCOMES: Final[dict[str, Outcome]] = {"ack": ACK, "requeue": RETRY_NOW, "reject": _REJECTED}
