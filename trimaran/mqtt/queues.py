"""MQTT onto the durable queue manager: ``$queue/<q>`` topics (DESIGN.md, "Cross-protocol model").

- PUBLISH to ``$queue/<q>[/<key>]`` appends; the PUBACK/PUBREC leaves only after the commit, and in
  the order the PUBLISHes arrived.
- PUBLISH to ``$queue/<q>/$ack|$nack|$reject|$commit`` with user property ``message-id`` (and
  ``reason``, ``consumer-group``) settles a delivery; it is never enqueued.
- SUBSCRIBE to ``$queue/<q>[/<key filter>]`` consumes in the default group; ``$share/<g>/$queue/<q>``
  or user property ``consumer-group`` names a group; ``stream-offset`` picks a stream start.
  Credit is the client's Receive Maximum, so the queue never parks messages in an MQTT session.
- PUBACK / PUBCOMP acks; 5.0 PUBACK 0x80 nacks, 0x83 and 0x99 reject. A QoS 0 subscription
  consumes at most once (settled when sent).

Credit: each QoS 1/2 delivery takes one unit of the consumer's credit and gives it back once, when
the delivery is settled: by its PUBACK/PUBCOMP, or by a control topic (from any connection), whichever
comes first. Control topics are applied in memory as soon as they are read, so a PUBACK that follows
a ``$nack`` on the same connection finds the delivery settled and only completes the MQTT exchange.
Every delivery has its own tag, so a late PUBACK of an earlier delivery never settles a redelivery.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import anyio

from trimaran.broker.message import Message
from trimaran.mqtt.codec import NO_PROPERTIES
from trimaran.mqtt.mapping import publish_properties
from trimaran.mqtt.packets import MQTT_5, SubscriptionOptions
from trimaran.mqtt.properties import Properties
from trimaran.mqtt.reason_codes import ReasonCode
from trimaran.mqtt.session import OutboundMessage
from trimaran.queue.control import holder_by_id, parse_message_id, settle_by_id_now
from trimaran.queue.journal import Receipt, committed
from trimaran.queue.manager import (
    ConsumerHandle,
    PublishResult,
    QueueDelivery,
    QueueManager,
    settle_many_nowait,
)
from trimaran.queue.outcomes import ACK, RETRY_NOW, Commit, DeadLetter, Outcome, Retry
from trimaran.queue.policy import DEFAULT_GROUP, QUEUE_PREFIX, QueueError, parse_queue_topic, queue_topic
from trimaran.runtime.confirms import InOrder
from trimaran.security.guard import subscription_filter
from trimaran.topics import TopicError, split_shared
from trimaran.vhosts import describe, prefix, split_key

if TYPE_CHECKING:
    from collections.abc import Callable, Coroutine, Mapping
    from typing import Any

    from trimaran.mqtt.connection import ServerConnection

log = logging.getLogger(__name__)

NACK_CODES = frozenset({ReasonCode.UNSPECIFIED_ERROR})
REJECT_CODES = frozenset({ReasonCode.IMPLEMENTATION_SPECIFIC_ERROR, ReasonCode.PAYLOAD_FORMAT_INVALID})
QOS0_CREDIT = 256


class QueueEndpoint(Protocol):
    """A client's session endpoint as the queue bindings see it (``handler.MqttEndpoint``)."""

    @property
    def client_id(self) -> str: ...

    @property
    def vhost_prefix(self) -> str: ...

    @property
    def cut(self) -> int: ...

    @property
    def conn(self) -> QueueConn | None: ...


class QueueFront(Protocol):
    """The front end as the queue bindings see it: the endpoints by client id."""

    @property
    def endpoints(self) -> Mapping[str, QueueEndpoint]: ...


class QueueConn(Protocol):
    """A connection as the queue bindings see it (``conn.MqttConn``): imports go down only, so this
    module names neither ``conn.py`` nor ``handler.py`` above it."""

    @property
    def mqtt(self) -> ServerConnection: ...

    @property
    def endpoint(self) -> QueueEndpoint | None: ...

    @property
    def front(self) -> QueueFront: ...

    @property
    def queue_bindings(self) -> ConnQueues: ...

    @property
    def uses_queues(self) -> bool: ...

    def wake(self) -> None: ...

    def spawn(self, job: Callable[[], Coroutine[Any, Any, object]]) -> None: ...

    def close(self, reason_code: int, reason: str) -> None: ...


def is_queue_filter(topic_filter: str) -> bool:
    """A valid ``$queue/...`` filter, alone or in a share group. Only one that looks like it is
    validated: a subscription asks twice, and most are not."""
    if not subscription_filter(topic_filter).startswith(QUEUE_PREFIX):
        return False
    try:
        split_shared(topic_filter)
    except TopicError:
        return False
    return True


def _property(message: Message, name: str) -> str | None:
    for key, value in message.user_properties:
        if key == name:
            return value
    return None


class PendingAck:
    """One PUBLISH waiting for its commit (or refused), acknowledged in arrival order: its own
    ``committed`` is the manager's ``done`` callback, so a publish makes no closure."""

    __slots__ = ("bindings", "client", "conn", "done", "packet_id", "reason", "reason_code", "topic")

    def __init__(
        self,
        conn: QueueConn,
        bindings: ConnQueues,
        packet_id: int | None,
        topic: str,
        client: str,
        reason_code: int = 0,
        reason: str | None = None,
    ) -> None:
        self.conn = conn
        self.bindings = bindings  # conn's, which it keeps for life: no property call per settle
        self.packet_id = packet_id
        self.topic = topic
        self.client = client  # for the log line of a refusal
        self.done = False
        self.reason_code = reason_code
        self.reason = reason

    def committed(self, _result: PublishResult | None, error: QueueError | None) -> None:
        """The publish is committed (``error``: the write failed)."""
        if error is not None:
            self.refuse(error)
        self.settle()

    def refuse(self, exc: QueueError) -> None:
        who, where = describe(self.client, "client"), split_key(self.topic)[1]
        # The storage's outage is logged once by the storage, not once per publish it refuses.
        say = log.debug if exc.reason == "storage" else log.info
        say("mqtt: queue publish from %s to %r refused: %s", who, where, exc)
        self.reason_code = _refusal_code(exc)
        vhost_prefix = prefix(split_key(self.topic)[0])
        self.reason = str(exc).replace(vhost_prefix, "") if vhost_prefix else str(exc)  # the client's names

    def settle(self) -> None:
        """Settled: the PUBACK/PUBREC goes out before the connection's next write, with every other
        one settled by then (:func:`send_acks`), not one wake-up each. A closed connection's are
        sent at once: no write follows, and a QoS 2 packet id must then be known as a duplicate."""
        self.done = True
        conn = self.conn
        bindings = self.bindings
        if conn.mqtt.closed:
            send_acks(conn)
        elif not bindings.acks_due:
            bindings.acks_due = True
            conn.wake()


@dataclass(slots=True, eq=False, init=False)
class Delivery:
    """One QoS 1/2 delivery awaiting its PUBACK/PUBCOMP."""

    subscription: QueueSubscription
    offset: int
    live: bool  # still this delivery's to settle (not settled by a control topic, not superseded)
    credited: bool  # its credit went back already

    def __init__(self, subscription: QueueSubscription, offset: int) -> None:  # compiled: one a delivery
        self.subscription = subscription
        self.offset = offset
        self.live = True
        self.credited = False


class QueueSubscription:
    """A consumer of one queue for one MQTT subscription (the queue manager's QueueConsumer)."""

    __slots__ = ("_topics", "bindings", "conn", "cut", "handle", "held", "id", "qos", "topic_filter")

    def __init__(self, conn: QueueConn, topic_filter: str, qos: int) -> None:
        assert conn.endpoint is not None
        self.id = conn.endpoint.client_id
        self.cut = conn.endpoint.cut  # the vhost prefix its deliveries lose (trimaran/vhosts.py)
        self.conn = conn
        self.bindings = conn.queue_bindings  # which the connection keeps for life
        self.topic_filter = topic_filter
        self.qos = qos
        self.handle: ConsumerHandle | None = None
        self.held: dict[int, Delivery] = {}  # offset -> its latest delivery not yet settled
        # delivered_topic per message topic (a subscription reads one queue), the last 64: a queue's
        # publishers repeat theirs.
        self._topics: dict[str, str] = {}

    def deliver(self, delivery: QueueDelivery) -> None:
        message = delivery.message
        conn = self.conn
        mqtt = conn.mqtt
        if mqtt.protocol_level == MQTT_5:
            props = publish_properties(message)
            props.user_properties = [*message.user_properties, *delivery.headers(self.cut)]
        else:  # 3.1.1 sends no properties (the connection copies them before it changes them)
            props = NO_PROPERTIES
        bindings = self.bindings
        qos = self.qos
        offset = delivery.offset
        tag: int | None = None
        if qos:
            # An int: never a "share:..." tag. Unique on this connection, as it must be: a resumed
            # session forgets the queue deliveries of its earlier connections (handler).
            tag = bindings.next_tag = bindings.next_tag + 1
            record = Delivery(self, offset)
            held = self.held
            previous = held.get(offset)
            if previous is not None:  # redelivered to us before the earlier copy was PUBACKed
                previous.live = False
            held[offset] = bindings.deliveries[tag] = record
        topics = self._topics
        topic = topics.get(message.topic)
        if topic is None:
            if len(topics) >= 64:
                topics.clear()
            topic = topics[message.topic] = delivered_topic(delivery)[self.cut :]
        expires_at = message.expires_at_ms
        out = OutboundMessage(
            topic, message.payload, qos, False, props, tag,
            None if expires_at is None else expires_at / 1000, delivery.redelivered,
        )  # fmt: skip
        if mqtt.publish(out):
            conn.wake()
            if not qos:
                bindings.qos0_sent.append(self)
        elif tag is not None:
            # Too large for this client or the session is full: let another consumer have it.
            record = bindings.deliveries.pop(tag)
            if self.held.get(offset) is record:
                del self.held[offset]
            if self.handle is not None:
                self.handle.settle_nowait(offset, RETRY_NOW)

    def stalled(self, idle_s: float) -> None:
        """Its queue held publishers and nothing was settled for ``idle_s`` seconds: the client is
        disconnected (0x97 on 5.0), as a subscriber that takes nothing is (``MqttConn.stalled``);
        what it held goes back to the queue."""
        conn = self.conn
        if conn.mqtt.closed:
            return
        log.warning(
            "mqtt: %s took no message of %s for %.0f s (%d unacknowledged) while the queue held its "
            "publishers; disconnected so that they go on (limits.stalled_consumer_timeout_s)",
            self.id,
            describe(self.handle.queue_name if self.handle is not None else self.topic_filter),
            idle_s,
            len(self.held),
        )
        conn.close(ReasonCode.QUOTA_EXCEEDED, "took no message while its queue held publishers")


def delivered_topic(delivery: QueueDelivery) -> str:
    """The topic a queue delivery carries: the queue it came from (MQTT 5 4.7: the topic sent matches
    the subscriber's filter). A dead letter from ``$queue/orders/eu`` read from ``$dlq/orders`` goes
    out as ``$queue/$dlq/orders/eu``; its original topic stays in ``x-dead-letter-topic``."""
    topic = delivery.message.topic
    parsed = parse_queue_topic(topic)
    if parsed is not None and parsed[0] == delivery.queue:
        return topic
    return queue_topic(delivery.queue, parsed[1] if parsed is not None else "")


@dataclass(slots=True)
class ConnQueues:
    """Per connection: queue subscriptions, deliveries awaiting PUBACK, publishes awaiting commit."""

    subscriptions: dict[str, QueueSubscription] = field(default_factory=dict)
    deliveries: dict[int, Delivery] = field(default_factory=dict)  # by OutboundMessage.tag
    next_tag: int = 0
    qos0_sent: list[QueueSubscription] = field(default_factory=list)
    tickets: InOrder[PendingAck] | None = None  # made on the first queue publish
    acks_due: bool = False  # a publish was settled since the last write: send_acks
    credit_due: dict[ConsumerHandle, int] = field(default_factory=dict)  # see MqttQueues.after_events
    settle_due: list[tuple[ConsumerHandle, int, Outcome]] = field(default_factory=list)  # likewise

    def pending_ack(self, ticket: PendingAck) -> PendingAck:
        """Queue ``ticket`` behind the publishes before it: acknowledgements leave in arrival order."""
        if self.tickets is None:
            self.tickets = InOrder()
        return self.tickets.add(ticket)


class MqttQueues:
    def __init__(self, manager: QueueManager) -> None:
        self.manager = manager

    # -- publishing -------------------------------------------------------------------------------

    def publish(self, conn: QueueConn, message: Message, packet_id: int | None) -> None:
        """Start a queue publish; its ack goes out (in order) once committed.

        No task per message: the manager calls back after the group commit. A control topic
        (``$ack``, ``$nack``, ``$reject``, ``$commit``) is applied here, before the next packet of the
        connection is read; only the wait for its commit runs in a task.
        """
        endpoint = conn.endpoint
        bindings = conn.queue_bindings
        ticket = bindings.pending_ack(
            PendingAck(conn, bindings, packet_id, message.topic, endpoint.client_id if endpoint else "?")
        )
        parsed = parse_queue_topic(message.topic)
        try:
            if parsed is None:
                raise QueueError("bad-topic", f"{message.topic!r} is not a valid queue topic")
            queue, routing_key, control = parsed
            if control is None:
                try:
                    self.manager.publish_nowait(queue, message, routing_key, ticket.committed)
                except QueueError as exc:
                    if exc.reason != "shared":
                        raise
                    conn.spawn(lambda: self._append(queue, routing_key, message, ticket))
                return
            commit = self._control(conn, queue, control, message, ticket.client)
        except QueueError as exc:
            ticket.refuse(exc)
            ticket.settle()
            return
        if commit is None:
            ticket.settle()
        else:
            conn.spawn(lambda: self._committed(commit, ticket))

    async def _append(self, queue: str, routing_key: str, message: Message, ticket: PendingAck) -> None:
        """A shared node's publish (its offset comes from an awaited reservation)."""
        try:
            await self.manager.publish(queue, message, routing_key)
        except QueueError as exc:
            ticket.refuse(exc)
        ticket.settle()

    @staticmethod
    async def _committed(commit: Receipt, ticket: PendingAck) -> None:
        try:
            await committed(commit)
        except QueueError as exc:
            ticket.refuse(exc)
        ticket.settle()

    def acknowledge_in_order(self, conn: QueueConn, packet_id: int, code: int, reason: str) -> None:
        """Acknowledge a publish that never reached a queue (the rules refused it) after the queue
        publishes before it, in arrival order."""
        endpoint = conn.endpoint
        client = endpoint.client_id if endpoint else "?"
        bindings = conn.queue_bindings
        ticket = PendingAck(conn, bindings, packet_id, "", client, code, reason if code else None)
        bindings.pending_ack(ticket).settle()

    def _check_holder(self, conn: QueueConn, control: str, message_id: str, group: str | None) -> None:
        """Settlement belongs to its holder: a work-queue delivery only by the session it was delivered
        to; a stream's ``$commit`` / ``$reject`` only in a group this connection consumes in, and never
        past the last offset."""
        queue, offset = parse_message_id(message_id)
        state = self.manager.queues.get(queue)
        if state is None:
            raise QueueError("not-found", f"no queue {queue}")
        if state.mode == "stream":
            name = group or DEFAULT_GROUP
            mine = any(
                s.handle is not None and s.handle.queue_name == queue and s.handle.group_name == name
                for s in conn.queue_bindings.subscriptions.values()
            )
            if not mine:
                raise QueueError("not-authorized", f"group {name} of {queue} is not consumed here")
            if offset >= state.high:
                raise QueueError("not-authorized", f"offset {offset} is past the end of {queue}")
            return
        holder = holder_by_id(self.manager, message_id, group)
        if holder is None:
            return  # nobody holds it: nothing to settle ("not-found" below)
        consumer = holder.consumer
        client = conn.endpoint.client_id if conn.endpoint is not None else None
        if not isinstance(consumer, QueueSubscription) or consumer.id != client:
            raise QueueError("not-authorized", f"delivery {message_id} is not held by this session")

    def _control(
        self, conn: QueueConn, queue: str, control: str, message: Message, client: str
    ) -> Receipt | None:
        """Settle by message id now; returns the commit to wait for (None: nothing to write)."""
        message_id = _property(message, "message-id") or message.payload.decode(errors="replace").strip()
        if not message_id:
            raise QueueError("bad-request", f"${control} needs a message-id user property")
        group = _property(message, "consumer-group")
        own = split_key(queue)[1]  # the client names its queue without the vhost prefix
        if message_id.startswith(f"{own}:"):
            message_id = message_id[len(own) + 1 :]
        if not message_id.startswith(f"{queue}:"):
            message_id = f"{queue}:{message_id}"
        reason = (_property(message, "reason") or f"rejected by {client}") if control == "reject" else ""
        try:
            self._check_holder(conn, control, message_id, group)
            _queue, offset = parse_message_id(message_id)
            holder = holder_by_id(self.manager, message_id, group)
            held = holder.consumer if holder is not None else None
            record = held.held.get(offset) if isinstance(held, QueueSubscription) else None
            outcome = control_outcome(control, offset, reason or "rejected")
            done, commit = settle_by_id_now(self.manager, outcome, message_id, group)
        except (KeyError, ValueError) as exc:
            raise QueueError("not-found", f"no delivery {message_id}: {exc}") from None
        if not done:
            raise QueueError("not-found", f"no pending delivery {message_id}")
        if record is not None and record.live and holder is not None:
            # Settled here rather than by its PUBACK: its credit goes back now, once.
            record.live = False
            subscription = record.subscription
            if subscription.held.get(offset) is record:
                del subscription.held[offset]
            if not record.credited:
                record.credited = True
                holder.add_credit(1)
        return commit

    # -- consuming --------------------------------------------------------------------------------

    def subscribe(
        self,
        conn: QueueConn,
        topic_filter: str,
        options: SubscriptionOptions,
        user_properties: list[tuple[str, str]],
    ) -> int:
        """Attach a consumer for ``[$share/<g>/]$queue/<q>[/<filter>]``; returns the SUBACK code."""
        group, plain = split_shared(topic_filter)
        assert conn.endpoint is not None
        parsed = parse_queue_topic(conn.endpoint.vhost_prefix + plain)  # the queue's key in the vhost
        if parsed is None or parsed[2] is not None:
            return ReasonCode.TOPIC_FILTER_INVALID
        queue, key_filter, _ = parsed
        props = dict(user_properties)
        group = props.get("consumer-group", group)
        start: str | int | None = props.get("stream-offset")
        bindings = conn.queue_bindings
        old = bindings.subscriptions.pop(topic_filter, None)
        if old is not None and old.handle is not None:
            conn.spawn(old.handle.cancel)
        subscription = QueueSubscription(conn, topic_filter, options.qos)
        try:
            subscription.handle = self.manager.consume(
                queue,
                subscription,
                group=group,
                routing_filter=key_filter or None,
                start=start,
                auto_ack=options.qos == 0,
                owner=conn,
            )
        except QueueError as exc:
            who = describe(conn.endpoint.client_id, "client")
            log.info("mqtt: subscription %r of %s to %s refused: %s", topic_filter, who, describe(queue), exc)
            if exc.reason == "queue-limit":
                return ReasonCode.QUOTA_EXCEEDED  # the vhost's queue limit (3.1.1: 0x80)
            refused = exc.reason in ("no-queue", "locked")
            return ReasonCode.NOT_AUTHORIZED if refused else ReasonCode.UNSPECIFIED_ERROR
        bindings.subscriptions[topic_filter] = subscription
        return options.qos

    def grant_initial_credit(self, conn: QueueConn, subscription: QueueSubscription) -> None:
        if subscription.handle is None:
            return
        window = QOS0_CREDIT if not subscription.qos else max(1, conn.mqtt.client_limits.receive_maximum)
        subscription.handle.add_credit(window)

    def unsubscribe(self, conn: QueueConn, topic_filter: str) -> None:
        subscription = conn.queue_bindings.subscriptions.pop(topic_filter, None)
        if subscription is not None and subscription.handle is not None:
            conn.spawn(subscription.handle.cancel)

    def settled(self, conn: QueueConn, messages: Iterable[OutboundMessage], reason_code: int) -> None:
        """PUBACKs/PUBCOMPs (or failed PUBRECs), all with ``reason_code``, of deliveries to ``conn``:
        the queue deliveries among them are settled after the read (:meth:`after_events`)."""
        if not conn.uses_queues:
            return
        bindings = conn.queue_bindings
        deliveries = bindings.deliveries
        credit_due = bindings.credit_due  # given back once per batch of packets: after_events
        outcome: Outcome | None = None
        for message in messages:
            tag = message.tag
            # Only a QueueSubscription's tags are ints; a session saved before they were holds
            # string tags, whose deliveries its earlier connection took with it.
            record = deliveries.pop(tag, None) if type(tag) is int else None
            if record is None:
                continue
            subscription, offset = record.subscription, record.offset
            held = subscription.held
            if held.get(offset) is record:
                del held[offset]
            handle = subscription.handle
            if handle is None or handle.closed:
                continue
            if record.live:  # not already settled by a control topic, nor superseded by a redelivery
                if outcome is None:
                    outcome = puback_outcome(reason_code)
                bindings.settle_due.append((handle, offset, outcome))
            if not record.credited:
                record.credited = True
                credit_due[handle] = credit_due.get(handle, 0) + 1

    def after_events(self, conn: QueueConn) -> None:
        """After the events of one read: what its PUBACKs settled, in one change per consumer and
        outcome, then the credit they gave back, in one dispatch per consumer (not one per PUBACK)."""
        bindings = conn.queue_bindings
        settle = bindings.settle_due
        if settle:
            bindings.settle_due = []
            settle_many_nowait(settle)
        due = bindings.credit_due
        if due:
            bindings.credit_due = {}
            for handle, n in due.items():
                handle.add_credit(n)

    def after_write(self, conn: QueueConn) -> None:
        """QoS 0 deliveries are settled once written: give their credit back."""
        sent = conn.queue_bindings.qos0_sent
        if sent:
            conn.queue_bindings.qos0_sent = []
            for subscription in sent:
                if subscription.handle is not None:
                    subscription.handle.add_credit(1)

    async def detach(self, conn: QueueConn) -> None:
        """The connection is gone: its held deliveries become available to other consumers at once."""
        self.after_events(conn)  # whatever the last read settled goes first, however the connection ended
        send_acks(conn)  # settled since the last write: a QoS 2 packet id is then known as a duplicate
        bindings = conn.queue_bindings
        subscriptions = list(bindings.subscriptions.values())
        bindings.subscriptions.clear()
        bindings.deliveries.clear()
        with anyio.CancelScope(shield=True):
            for subscription in subscriptions:
                if subscription.handle is not None:
                    await subscription.handle.cancel()


def send_acks(conn: QueueConn) -> None:
    """Send the PUBACK/PUBREC of every settled publish at the head, in arrival order."""
    bindings = conn.queue_bindings
    bindings.acks_due = False
    tickets = bindings.tickets
    if tickets is None:
        return
    mqtt = conn.mqtt
    for head in tickets.ready():
        packet_id = head.packet_id
        if packet_id is None:
            continue
        _refused_by_closing(conn, head)
        props = _reason_props(head.reason) if head.reason_code else None
        # Also once the connection is gone (as after a 3.1.1 refusal): a committed QoS 2 packet id
        # must then be known as a duplicate, and a resend the session's next connection holds is
        # answered.
        mqtt.ack_publish(packet_id, head.reason_code, props)
        if mqtt.closed:
            _answer_resend(conn, head, packet_id, props)


def _refused_by_closing(conn: QueueConn, ticket: PendingAck) -> bool:
    """3.1.1 cannot refuse a PUBLISH: closing the connection is how it says no (and nothing after it
    is answered on that connection). True when ``ticket`` is such a refusal."""
    if not ticket.reason_code or conn.mqtt.protocol_level >= MQTT_5:
        return False
    if not conn.mqtt.closed:
        conn.close(ReasonCode.IMPLEMENTATION_SPECIFIC_ERROR, ticket.reason or "refused")
    return True


def _answer_resend(conn: QueueConn, ticket: PendingAck, packet_id: int, props: Properties | None) -> None:
    """A publish of a connection that is gone is acknowledged: the session's live connection answers
    the client's resend of it, if it holds one."""
    endpoint = conn.front.endpoints.get(ticket.client)
    live = endpoint.conn if endpoint is not None else None
    if live is None or live is conn or not live.mqtt.settle_resend(packet_id, ticket.reason_code, props):
        return
    if not _refused_by_closing(live, ticket):
        live.wake()


def puback_outcome(reason_code: int) -> Outcome:
    """MQTT's settlement of a queue delivery (the PUBACK's, PUBCOMP's or failed PUBREC's reason
    code) as a typed outcome: 0x80 retries after the queue's backoff, 0x83 and 0x99 dead-letter,
    anything else acknowledges."""
    if reason_code in NACK_CODES:
        return Retry()
    if reason_code in REJECT_CODES:
        return DeadLetter(f"client reason code 0x{reason_code:02X}")
    return ACK


def control_outcome(control: str, offset: int, reason: str) -> Outcome:
    """A control topic (``$ack``, ``$nack``, ``$reject``, ``$commit``) as a typed outcome: ``$nack``
    retries after the queue's backoff, ``$reject`` dead-letters with ``reason``, ``$commit`` moves a
    stream group past ``offset``."""
    if control == "nack":
        return Retry()
    if control == "reject":
        return DeadLetter(reason)
    if control == "commit":
        return Commit(offset)
    return ACK


def _refusal_code(exc: QueueError) -> int:
    if exc.reason in ("full", "overflow", "disk-full", "queue-limit"):
        return ReasonCode.QUOTA_EXCEEDED
    if exc.reason in ("bad-topic", "bad-name"):
        return ReasonCode.TOPIC_NAME_INVALID
    if exc.reason in ("no-queue", "not-authorized", "locked"):
        return ReasonCode.NOT_AUTHORIZED
    return ReasonCode.IMPLEMENTATION_SPECIFIC_ERROR


def _reason_props(reason: str | None) -> Properties:
    return Properties(reason_string=reason)
