"""MQTT session state, sans-IO: subscriptions, outbound QoS 1/2 inflight window and queue, inbound QoS 2.

A `Session` outlives connections (Clean Start 0 / Clean Session 0). It is plain data: `to_dict()` gives
a dict of str/int/bool/bytes/None/list/dict values (properties are stored as their MQTT 5.0 wire
encoding), `to_json()` a JSON document (bytes base64-encoded), and `from_dict()` / `from_json()`
rebuild it (`load_dict()` / `load_json()` fill a new one: the handler's endpoint is a session), so
the handler can keep it in SQL.

Outbound delivery (server -> client):

- `enqueue(message)` puts a QoS 1/2 message at the back of the queue (bounded by `max_queued`);
- `next_to_send(window)` moves the head of the queue into the inflight window when there is room,
  allocating a packet identifier; the connection sends it;
- `on_puback` / `on_pubrec` / `on_pubcomp` advance or finish an inflight message;
- `inflight_entries()` lists what must be resent on reconnect (PUBLISH with DUP, or PUBREL).

An inflight message is its own entry in the window: its packet id, where its flow stands and
whether it was sent are fields of the `OutboundMessage` (one object a delivery, not two).

Inbound QoS 2 (client -> server): `inbound_qos2` holds the packet identifiers for which PUBREC was
sent and PUBREL not yet received; a PUBLISH that reuses one of them is a resend, not a new message.
`inbound_pending` holds those received and not yet acknowledged (a queue publish waits for its
commit), in memory only: a resend on the session's next connection is held, not taken again.

Standard library only.
"""

from __future__ import annotations

import base64
import itertools
import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from json.encoder import encode_basestring_ascii
from types import MappingProxyType
from typing import Any, Final, Protocol

from trimaran.mqtt.codec import decode_properties, encode_properties
from trimaran.mqtt.packets import SubscriptionOptions, granted_options
from trimaran.mqtt.properties import PacketType, Properties

__all__ = [
    "AWAITING_PUBACK",
    "AWAITING_PUBCOMP",
    "AWAITING_PUBREC",
    "OutboundMessage",
    "Session",
    "Subscription",
    "Subscriptions",
]

# Inflight states of an outbound message.
AWAITING_PUBACK: Final = "awaiting_puback"  # QoS 1 PUBLISH sent
AWAITING_PUBREC: Final = "awaiting_pubrec"  # QoS 2 PUBLISH sent
AWAITING_PUBCOMP: Final = "awaiting_pubcomp"  # QoS 2 PUBREC received, PUBREL sent

Tag = str | int | None

# An idle session's subscriptions: one empty, read-only mapping shared by every session until its
# first subscription (an empty dict is 64 bytes a session; issue #47).
NO_SUBSCRIPTIONS: Final[Mapping[str, Subscription]] = MappingProxyType({})


@dataclass(slots=True, init=False)
class OutboundMessage:
    """A message for the client. `tag` is the handler's own reference (e.g. a queue delivery id)."""

    # The fields in this order, the flags last and together: compiled, a dataclass is laid out in
    # the order of these lines, and a lone bool between wider fields takes a word.
    topic: str
    payload: bytes
    qos: int = 0
    properties: Properties = field(default_factory=Properties)
    tag: Tag = None
    # Wall-clock (epoch seconds) end of the Message Expiry Interval; None: never expires. The
    # connection drops it if it expires before it is first sent and sends the time left.
    expires_at: float | None = None
    # The PUBLISH as this connection's level encodes it with this QoS, retain flag and properties,
    # cut around its packet identifier (shared by every subscriber it fits: the fan-out's bytes,
    # encoded once); the connection puts the id between the two. Only for a message without an
    # expiry, handed to `ServerConnection.publish`, which uses it for a send at once and forgets it
    # (a queued message may go out on the session's next connection, of another level). One kind
    # of queued message keeps one: a run's, cut before its id with its payload alone after
    # (`publish_qos1_run`; `_pump` adds the id and at 5.0 the empty properties' byte, and accept()
    # forgets these). Never stored, never compared.
    wire: tuple[bytes, bytes] | None = field(default=None, compare=False, repr=False)
    # In the session's inflight window (Session.inflight, by packet id): its id there, where its
    # QoS flow stands (AWAITING_PUBACK, AWAITING_PUBREC or AWAITING_PUBCOMP; "" until it first
    # enters, and left as it was when it leaves) and whether it was sent at least once (a resend
    # carries DUP). Set by whoever puts it there; read only while it is there.
    packet_id: int = field(default=0, compare=False)
    state: str = field(default="", compare=False)
    sent: bool = field(default=False, compare=False)
    retain: bool = False
    # A durable queue's redelivery (delivered before, or maybe before a crash): even its first
    # PUBLISH carries DUP, MQTT's only redelivery flag (3.1.1 has no user properties), as RabbitMQ's
    # MQTT plugin sets DUP from the queue's redelivered flag.
    redelivered: bool = False

    # Written out, as one per delivery: mypyc compiles it, the generated one runs interpreted.
    # ``properties`` None stands for the default, a new empty Properties.
    def __init__(
        self,
        topic: str,
        payload: bytes,
        qos: int = 0,
        retain: bool = False,
        properties: Properties | None = None,
        tag: Tag = None,
        expires_at: float | None = None,
        redelivered: bool = False,
        wire: tuple[bytes, bytes] | None = None,
        packet_id: int = 0,
        state: str = "",
        sent: bool = False,
    ) -> None:
        self.topic = topic
        self.payload = payload
        self.qos = qos
        self.properties = Properties() if properties is None else properties
        self.tag = tag
        self.expires_at = expires_at
        self.wire = wire
        self.packet_id = packet_id
        self.state = state
        self.sent = sent
        self.retain = retain
        self.redelivered = redelivered


def weight(message: OutboundMessage) -> int:
    """What a queued message counts against a session's byte bound: its payload and topic. The
    per-message paths (append, popleft, enqueue) write it out, sparing a call per message each."""
    return len(message.payload) + len(message.topic)


class Backlog:
    """A session's queue of messages waiting for the inflight window: first in, first out.

    A list read from a head index, compacted as it is consumed: an idle session's empty backlog is a
    small object and no list, where a deque would be 600 bytes per session."""

    __slots__ = ("_head", "bytes", "dropped", "first_seq", "items")

    def __init__(self, items: Iterable[OutboundMessage] = (), first_seq: int = 0) -> None:
        # The messages, read from _head on; None until the first (an idle session's backlog holds
        # no list: 56 bytes). A list consumed to its end is cleared and kept (a backlog that fills
        # and drains would make one a message), so it is falsy exactly when the backlog is empty (a
        # connection's per-delivery look, without __len__).
        self.items: list[OutboundMessage] | None = list(items) or None
        self._head = 0
        self.bytes = sum(map(weight, self.items or ()))  # payloads and topics queued
        # Each message has a sequence number: first_seq for the head, then one more each. Storage
        # writes a message once, by its number, and deletes the numbers below first_seq.
        self.first_seq = first_seq
        # Messages its session refused because it was full: counted here, as a session that refuses
        # one has a backlog of its own (an idle session's field was 8 bytes; issue 47).
        self.dropped = 0

    @property
    def next_seq(self) -> int:
        """The number the next appended message gets."""
        items = self.items
        return self.first_seq + (0 if items is None else len(items) - self._head)

    def since(self, seq: int) -> list[tuple[int, OutboundMessage]]:
        """The messages numbered ``seq`` and after, with their numbers."""
        start = max(seq, self.first_seq)
        skip = self._head + start - self.first_seq
        return list(enumerate(itertools.islice(self.items or (), skip, None), start))

    def append(self, message: OutboundMessage) -> None:
        if self.items is None:
            self.items = [message]
        else:
            self.items.append(message)
        self.bytes += len(message.payload) + len(message.topic)  # weight()

    def extend(self, messages: Iterable[OutboundMessage]) -> None:
        for message in messages:
            self.append(message)

    def popleft(self) -> OutboundMessage:
        items, head = self.items, self._head
        if not items:
            raise IndexError("pop from an empty backlog")
        size = len(items)
        message = items[head]
        head += 1
        self.first_seq += 1
        self.bytes -= len(message.payload) + len(message.topic)  # weight()
        if head == size:
            items.clear()
            head = 0
        elif head > 64 and head * 2 > size:
            del items[:head]
            head = 0
        self._head = head
        return message

    def over(self, messages: int, size: int) -> bool:
        """More than ``messages`` queued, or more than ``size`` bytes (payloads and topics): past a
        flow-control mark (the handler's high one, the hull's low one)."""
        items = self.items
        return (items is not None and len(items) - self._head > messages) or self.bytes > size

    def take(self, count: int) -> list[OutboundMessage]:
        """The first ``count`` messages (at most as many as there are), removed: `popleft` for each,
        in one call (a window that opens takes several)."""
        items, head = self.items, self._head
        if count <= 0 or not items:
            return []
        size = len(items)
        stop = min(head + count, size)
        taken = items[head:stop]
        for message in taken:
            self.bytes -= len(message.payload) + len(message.topic)  # weight()
        self.first_seq += stop - head
        head = stop
        if head == size:
            items.clear()
            head = 0
        elif head > 64 and head * 2 > size:
            del items[:head]
            head = 0
        self._head = head
        return taken

    def clear(self) -> None:
        self.first_seq = self.next_seq  # the numbers are never reused: the cleared rows go
        if self.items is not None:
            self.items.clear()
        self._head = 0
        self.bytes = 0

    def __len__(self) -> int:
        items = self.items
        return 0 if items is None else len(items) - self._head

    def __iter__(self) -> Iterator[OutboundMessage]:
        return itertools.islice(self.items or (), self._head, None)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Backlog) and list(self) == list(other)

    __hash__ = None  # type: ignore[assignment]


# Every session's queue until its first message waits (``Session.backlog`` makes its own): never
# written, so that an idle session holds no backlog object (96 bytes compiled; issue #47).
NO_BACKLOG: Final = Backlog()


class QueueBounds:
    """How much a session may queue: as many messages as ``messages``, and as many payload and
    topic bytes as ``size`` (0: no bound). One object for every session of the same bounds (the
    settings', mostly): two fields of every session were 16 bytes (issue 47)."""

    __slots__ = ("messages", "size")

    def __init__(self, messages: int, size: int) -> None:
        self.messages = messages
        self.size = size


# The bounds in use, by value (one entry a setting, or a session stored under an older one).
_BOUNDS: Final[dict[tuple[int, int], QueueBounds]] = {}


def queue_bounds(messages: int, size: int) -> QueueBounds:
    known = _BOUNDS.get((messages, size))
    if known is None:
        known = _BOUNDS[(messages, size)] = QueueBounds(messages, size)
    return known


@dataclass(slots=True, eq=False)
class Subscription:
    """One subscription of a session, and the mapping of its filter to it: a session's
    ``subscriptions`` while it holds only this one (a fleet's sessions mostly hold one, a device's
    own commands). A dict of one entry was 184 bytes, a holder of the one 48 (issue 47). A native
    class, not a Mapping subclass: a subscribed client's QoS 1 publish reads its session's
    ``subscriptions`` (mqtt.handler), and compiled, its truth and values() then run no Python."""

    topic_filter: str  # as the client sent it, "$share/<group>/<filter>" included
    options: SubscriptionOptions
    subscription_identifier: int | None = None

    # -- the mapping of its one filter (Subscriptions) ---------------------------------------------

    def __len__(self) -> int:
        return 1

    def __contains__(self, topic_filter: object) -> bool:
        return topic_filter == self.topic_filter

    def __getitem__(self, topic_filter: str) -> Subscription:
        if topic_filter != self.topic_filter:
            raise KeyError(topic_filter)
        return self

    def __iter__(self) -> Iterator[str]:
        return iter((self.topic_filter,))

    def get(self, topic_filter: str) -> Subscription | None:
        return self if topic_filter == self.topic_filter else None

    def keys(self) -> tuple[str]:
        return (self.topic_filter,)

    def values(self) -> tuple[Subscription]:
        return (self,)

    def items(self) -> tuple[tuple[str, Subscription]]:
        return ((self.topic_filter, self),)

    def __eq__(self, other: object) -> bool:
        """As a subscription's fields compare, and so as the dict of its one entry compares."""
        if isinstance(other, Subscription):
            return (
                self.topic_filter == other.topic_filter
                and self.options == other.options
                and self.subscription_identifier == other.subscription_identifier
            )
        return isinstance(other, Mapping) and len(other) == 1 and other.get(self.topic_filter) == self

    # Unhashable, as a dict, by its __eq__ alone: compiled, ``__hash__ = None`` would be a field.


class Subscriptions(Protocol):
    """A session's subscriptions by filter, read as a mapping (written only by the session): none
    (:data:`NO_SUBSCRIPTIONS`), one (the :class:`Subscription` itself) or a dict of several."""

    def __len__(self) -> int: ...

    def __contains__(self, topic_filter: object, /) -> bool: ...

    def __getitem__(self, topic_filter: str, /) -> Subscription: ...

    def __iter__(self) -> Iterator[str]: ...

    def get(self, topic_filter: str, /) -> Subscription | None: ...

    def keys(self) -> Iterable[str]: ...

    def values(self) -> Iterable[Subscription]: ...

    def items(self) -> Iterable[tuple[str, Subscription]]: ...


def _props_to_bytes(props: Properties) -> bytes:
    return encode_properties(props, PacketType.PUBLISH)


def _props_from_bytes(data: bytes) -> Properties:
    mv = memoryview(data)
    try:
        props, _ = decode_properties(mv, 0, len(data), PacketType.PUBLISH)
    finally:
        mv.release()
    return props


class Session:
    """Per-client state that survives reconnects."""

    __slots__ = (
        "bounds",
        "client_id",
        "expiry_interval",
        "inbound_pending",
        "inbound_qos2",
        "inflight",
        "next_packet_id",
        "owner",
        "queue",
        "saved_seq",
        "subscriptions",
    )

    def __init__(
        self, client_id: str, *, expiry_interval: int = 0, max_queued: int = 1000, max_queued_bytes: int = 0
    ) -> None:
        self.client_id = client_id
        self.expiry_interval = expiry_interval  # seconds; 0xFFFFFFFF means never
        self.bounds = queue_bounds(max_queued, max_queued_bytes)
        # Written only by add_subscription and remove_subscription: NO_SUBSCRIPTIONS while there
        # are none, the Subscription itself while there is one.
        self.subscriptions: Subscriptions = NO_SUBSCRIPTIONS
        # In send order; made by the first QoS 1/2 delivery (an idle session holds none) and kept
        # when drained, or a subscriber would make one a message.
        self.inflight: dict[int, OutboundMessage] | None = None
        # NO_BACKLOG, read-only, until the first message waits: written only through backlog().
        self.queue: Backlog = NO_BACKLOG
        # Packet ids as dict keys: an empty dict is a quarter of an empty set. Most sessions never
        # see QoS 2: both are made by the first QoS 2 PUBLISH.
        self.inbound_qos2: dict[int, None] | None = None
        self.inbound_pending: dict[int, None] | None = None
        self.next_packet_id = 1  # the id the next delivery tries first (a connection's run too)
        # (user,) whose session this is (None inside: anonymous); None: not known (a session saved
        # before owners were). Kept with the session, so a restart still knows whose rules its
        # subscriptions read by and who may take its client id over.
        self.owner: tuple[str | None, ...] | None = None  # (of one; see mqtt.handler.ANONYMOUS)
        # Storage holds this session's queued messages numbered below saved_seq; None: never saved
        # (its first save replaces whatever an earlier session of the same client id left).
        self.saved_seq: int | None = None

    @property
    def max_queued(self) -> int:
        return self.bounds.messages

    @max_queued.setter
    def max_queued(self, messages: int) -> None:
        self.bounds = queue_bounds(messages, self.bounds.size)

    @property
    def max_queued_bytes(self) -> int:
        """Payload and topic bytes; 0 = no bound."""
        return self.bounds.size

    @max_queued_bytes.setter
    def max_queued_bytes(self, size: int) -> None:
        self.bounds = queue_bounds(self.bounds.messages, size)

    @property
    def dropped(self) -> int:
        """Messages refused because the queue was full (the backlog's count)."""
        return self.queue.dropped

    @dropped.setter
    def dropped(self, count: int) -> None:
        if count or self.queue is not NO_BACKLOG:
            self.backlog().dropped = count

    # ------------------------------------------------------------------------------------ outbound

    def allocate_packet_id(self) -> int:
        """A packet identifier not used by any outbound inflight message."""
        inflight = self.inflight
        pid = self.next_packet_id
        if inflight is not None:
            if len(inflight) >= 0xFFFF:
                raise RuntimeError("all 65535 packet identifiers are in use")
            while pid in inflight:
                pid = pid % 0xFFFF + 1
        self.next_packet_id = pid % 0xFFFF + 1
        return pid

    def backlog(self) -> Backlog:
        """The queue, to add to or renumber: the session's own, made at the first use."""
        queue = self.queue
        if queue is NO_BACKLOG:
            queue = self.queue = Backlog()
        return queue

    def enqueue(self, message: OutboundMessage) -> bool:
        """Queue a QoS 1/2 message. False (and counted in `dropped`) when the queue is full: as
        many messages as ``max_queued``, or as many bytes as ``max_queued_bytes``."""
        if message.qos == 0:
            raise ValueError("only QoS 1 and 2 messages are queued in the session")
        # len(queue) and queue.append() written out: once per message queued behind the window.
        queue = self.backlog()
        items = queue.items
        size = len(message.payload) + len(message.topic)  # weight()
        bounds = self.bounds
        if (items is not None and len(items) - queue._head >= bounds.messages) or (
            bounds.size and queue.bytes + size > bounds.size
        ):
            queue.dropped += 1
            return False
        if items is None:
            queue.items = [message]
        else:
            items.append(message)
        queue.bytes += size
        return True

    def next_to_send(self, window: int) -> OutboundMessage | None:
        """Move the head of the queue into the inflight window if there is room."""
        if not self.queue or (self.inflight is not None and len(self.inflight) >= window):
            return None
        return self.start_inflight(self.queue.popleft())

    def start_inflight(self, message: OutboundMessage) -> OutboundMessage:
        """Give a QoS 1/2 message a packet id in the inflight window (the caller checked for room
        and for an empty queue, which goes first)."""
        inflight = self.inflight
        if inflight is None:
            inflight = self.inflight = {}
        elif len(inflight) >= 0xFFFF:
            raise RuntimeError("all 65535 packet identifiers are in use")
        pid = self.next_packet_id  # allocate_packet_id() written out: once per delivery
        while pid in inflight:
            pid = pid % 0xFFFF + 1
        self.next_packet_id = pid % 0xFFFF + 1
        message.packet_id = pid
        message.state = AWAITING_PUBACK if message.qos == 1 else AWAITING_PUBREC
        message.sent = False
        inflight[pid] = message
        return message

    def on_puback(self, packet_id: int) -> OutboundMessage | None:
        """PUBACK received: the finished message, or None if the id is not awaiting a PUBACK."""
        inflight = self.inflight
        if inflight is None:
            return None
        entry = inflight.get(packet_id)
        if entry is None or entry.state != AWAITING_PUBACK:
            return None
        del inflight[packet_id]
        return entry

    def on_pubrec(self, packet_id: int, reason_code: int = 0) -> OutboundMessage | None:
        """PUBREC received. The message moves to AWAITING_PUBCOMP (send PUBREL), or is removed when the
        reason code is an error (>= 0x80; the flow ends there). None if the id is unknown or QoS 1."""
        inflight = self.inflight
        if inflight is None:
            return None
        entry = inflight.get(packet_id)
        if entry is None or entry.state == AWAITING_PUBACK:
            return None
        if reason_code >= 0x80:
            del inflight[packet_id]
        else:
            entry.state = AWAITING_PUBCOMP
        return entry

    def on_pubcomp(self, packet_id: int) -> OutboundMessage | None:
        inflight = self.inflight
        if inflight is None:
            return None
        entry = inflight.get(packet_id)
        if entry is None or entry.state != AWAITING_PUBCOMP:
            return None
        del inflight[packet_id]
        return entry

    def drop_inflight(self, packet_id: int) -> OutboundMessage | None:
        return None if self.inflight is None else self.inflight.pop(packet_id, None)

    def inflight_entries(self) -> list[OutboundMessage]:
        """Everything to resend on reconnect, oldest first."""
        return [] if self.inflight is None else list(self.inflight.values())

    # ------------------------------------------------------------------------------- subscriptions

    def add_subscription(self, subscription: Subscription) -> bool:
        """Add or replace; True if the filter was new."""
        subscriptions = self.subscriptions
        topic_filter = subscription.topic_filter
        if isinstance(subscriptions, dict):
            new = topic_filter not in subscriptions
            subscriptions[topic_filter] = subscription
            return new
        if isinstance(subscriptions, Subscription):
            if subscriptions.topic_filter != topic_filter:  # a second: the dict
                self.subscriptions = {subscriptions.topic_filter: subscriptions, topic_filter: subscription}
                return True
            self.subscriptions = subscription
            return False
        self.subscriptions = subscription  # NO_SUBSCRIPTIONS: the first
        return True

    def remove_subscription(self, topic_filter: str) -> bool:
        subscriptions = self.subscriptions
        if isinstance(subscriptions, Subscription):
            if topic_filter != subscriptions.topic_filter:
                return False
            self.subscriptions = NO_SUBSCRIPTIONS
            return True
        if not isinstance(subscriptions, dict) or subscriptions.pop(topic_filter, None) is None:
            return False
        if len(subscriptions) == 1:  # one left: held alone, the dict goes
            (last,) = subscriptions.values()
            self.subscriptions = last
        return True

    # ------------------------------------------------------------------------------- serialization

    def to_dict(self, *, with_queue: bool = True) -> dict[str, Any]:
        """The session as plain data; ``with_queue=False`` leaves the queued messages out (stored a
        row each, see :func:`message_json`) and records the first queued number instead."""
        return {
            "version": 1,
            "client_id": self.client_id,
            "expiry_interval": self.expiry_interval,
            "max_queued": self.max_queued,
            "max_queued_bytes": self.max_queued_bytes,
            "next_packet_id": self.next_packet_id,
            "dropped": self.dropped,
            "owner": None if self.owner is None else list(self.owner),
            "subscriptions": [
                {
                    "topic_filter": s.topic_filter,
                    "qos": s.options.qos,
                    "no_local": s.options.no_local,
                    "retain_as_published": s.options.retain_as_published,
                    "retain_handling": s.options.retain_handling,
                    "subscription_identifier": s.subscription_identifier,
                }
                for s in self.subscriptions.values()
            ],
            "inflight": [
                {
                    "packet_id": e.packet_id,
                    "state": e.state,
                    "sent": e.sent,
                    "message": _message_to_dict(e),
                }
                for e in self.inflight_entries()
            ],
            "queue": [_message_to_dict(m) for m in self.queue] if with_queue else [],
            "queue_first_seq": self.queue.first_seq,
            "inbound_qos2": sorted(self.inbound_qos2 or ()),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Session:
        session = cls(data["client_id"])
        session.load_dict(data)
        return session

    def load_dict(self, data: dict[str, Any]) -> None:
        """What :meth:`to_dict` wrote, into this new session of the same client id (a subclass's
        constructor may take more than the id: the handler's endpoint is made first, then filled)."""
        if data.get("version") != 1:
            raise ValueError(f"unknown session format version {data.get('version')!r}")
        if data["client_id"] != self.client_id:
            raise ValueError(f"stored for client id {data['client_id']!r}, not {self.client_id!r}")
        self.expiry_interval = data["expiry_interval"]
        # (sessions saved before the bytes' bound have none)
        self.bounds = queue_bounds(data["max_queued"], data.get("max_queued_bytes", 0))
        self.next_packet_id = data["next_packet_id"]
        owner = data.get("owner")
        self.owner = None if owner is None else (owner[0],)
        for s in data["subscriptions"]:
            options = granted_options(s["qos"], s["no_local"], s["retain_as_published"], s["retain_handling"])
            self.add_subscription(Subscription(s["topic_filter"], options, s["subscription_identifier"]))
        if data["inflight"]:
            inflight = self.inflight = {}
            for e in data["inflight"]:
                message = _message_from_dict(e["message"])
                message.packet_id = e["packet_id"]
                message.state = e["state"]
                message.sent = e["sent"]
                inflight[message.packet_id] = message
        first_seq = data.get("queue_first_seq", 0)
        if first_seq or data["queue"]:
            self.queue = Backlog([_message_from_dict(m) for m in data["queue"]], first_seq)
        self.dropped = data["dropped"]  # (after the backlog: its count)
        if data["inbound_qos2"]:
            self.inbound_qos2 = dict.fromkeys(data["inbound_qos2"])

    def to_json(self, *, with_queue: bool = True) -> bytes:
        return self.state_json(with_queue=with_queue).encode()

    def state_json(self, *, with_queue: bool = True) -> str:
        """:meth:`to_json` as text, as storage writes it (a save of every changed session).

        Written out here rather than by the encoder from :meth:`to_dict`: the same text (the tests
        hold them equal for any session), without the dicts and the encoder's calls, which were
        two thirds of a save on the loop and most of a reconnect storm's work there."""
        queue = self.queue
        subscriptions = ",".join([_subscription_json(s) for s in self.subscriptions.values()])
        inflight = "" if not self.inflight else ",".join([_inflight_json(e) for e in self.inflight.values()])
        queued = ",".join([message_json(m) for m in queue]) if with_queue and queue.items else ""
        qos2 = self.inbound_qos2
        return (
            f'{{"version":1,"client_id":{_quote(self.client_id)},"expiry_interval":{self.expiry_interval},'
            f'"max_queued":{self.max_queued},"max_queued_bytes":{self.max_queued_bytes},'
            f'"next_packet_id":{self.next_packet_id},"dropped":{self.dropped},'
            f'"owner":{_owner_json(self.owner)},"subscriptions":[{subscriptions}],'
            f'"inflight":[{inflight}],"queue":[{queued}],"queue_first_seq":{queue.first_seq},'
            f'"inbound_qos2":[{"" if not qos2 else ",".join(map(str, sorted(qos2)))}]}}'
        )

    @classmethod
    def from_json(cls, data: bytes | str, queued: Iterable[tuple[int, str]] = ()) -> Session:
        """From :meth:`to_json`; ``queued``: the (number, message) rows stored apart, in number order."""
        raw, whole = _parsed(data, queued)
        session = cls(raw["client_id"])
        session._load(raw, whole)
        return session

    def load_json(self, data: bytes | str, queued: Iterable[tuple[int, str]] = ()) -> None:
        """:meth:`from_json` into this new session of the same client id (as :meth:`load_dict`)."""
        raw, whole = _parsed(data, queued)
        self._load(raw, whole)

    def _load(self, raw: dict[str, Any], whole: bool) -> None:
        # A session stored whole (its queue inside the JSON, as before rows) is not marked saved:
        # its next save writes its queue as rows.
        self.load_dict(raw)
        self.saved_seq = None if whole else self.queue.next_seq


def _parsed(data: bytes | str, queued: Iterable[tuple[int, str]]) -> tuple[dict[str, Any], bool]:
    """:meth:`Session.to_json`'s document as :meth:`Session.to_dict`'s data, the rows stored apart
    added to its queue; and whether its queue was stored inside it (whole)."""
    raw: dict[str, Any] = json.loads(data)
    for e in raw["inflight"]:
        _unb64_message(e["message"])
    for m in raw["queue"]:
        _unb64_message(m)
    whole = "queue_first_seq" not in raw or bool(raw["queue"])
    first = raw.get("queue_first_seq", 0)
    for seq, text in queued:
        if seq >= first:
            m = json.loads(text)
            _unb64_message(m)
            raw["queue"].append(m)
    return raw, whole


def _message_to_dict(m: OutboundMessage) -> dict[str, Any]:
    return {
        "topic": m.topic,
        "payload": m.payload,
        "qos": m.qos,
        "retain": m.retain,
        "properties": _props_to_bytes(m.properties),
        "tag": m.tag,
        "expires_at": m.expires_at,
    }


def _message_from_dict(d: dict[str, Any]) -> OutboundMessage:
    return OutboundMessage(
        d["topic"],
        d["payload"],
        d["qos"],
        d["retain"],
        _props_from_bytes(d["properties"]),
        d["tag"],
        d.get("expires_at"),
    )


# What the saves leave to the encoder: a message's tag (text or a number) and expiry (a float, which
# json spells as the encoder does, infinity included). One encoder: json.dumps with options makes one
# a call.
_encode: Final = json.JSONEncoder(separators=(",", ":")).encode
_ascii: Final = encode_basestring_ascii


# The texts below write numbers as ``{n}``, not ``{n:d}``, and strings typed str: compiled, a format
# spec (or a value not typed str) makes a call of str.format by name, a tenth of a session's save.
def _quote(text: str) -> str:
    """A JSON string, as the encoder writes it (ensure_ascii)."""
    result: str = _ascii(text)
    return result


def message_json(m: OutboundMessage) -> str:
    """A message as :func:`_message_to_dict` has it, as JSON (its bytes in base64: no escapes), as
    stored: a queued one in a row of its own, an inflight one inside its session's text."""
    payload = base64.b64encode(m.payload).decode("ascii")
    properties = base64.b64encode(_props_to_bytes(m.properties)).decode("ascii")
    return (
        f'{{"topic":{_quote(m.topic)},"payload":"{payload}","qos":{m.qos},'
        f'"retain":{"true" if m.retain else "false"},"properties":"{properties}",'
        f'"tag":{"null" if m.tag is None else _encode(m.tag)},'
        f'"expires_at":{"null" if m.expires_at is None else _encode(m.expires_at)}}}'
    )


def _inflight_json(e: OutboundMessage) -> str:
    return (
        f'{{"packet_id":{e.packet_id},"state":{_quote(e.state)},"sent":{"true" if e.sent else "false"},'
        f'"message":{message_json(e)}}}'
    )


def _owner_json(owner: tuple[str | None, ...] | None) -> str:
    if owner is None:
        return "null"
    return "[" + ",".join(["null" if user is None else _quote(user) for user in owner]) + "]"


def _subscription_json(s: Subscription) -> str:
    """A subscription as :meth:`Session.to_dict` has it, as JSON."""
    o = s.options
    sid = "null" if s.subscription_identifier is None else str(s.subscription_identifier)
    return (
        f'{{"topic_filter":{_quote(s.topic_filter)},"qos":{o.qos},'
        f'"no_local":{"true" if o.no_local else "false"},'
        f'"retain_as_published":{"true" if o.retain_as_published else "false"},'
        f'"retain_handling":{o.retain_handling},"subscription_identifier":{sid}}}'
    )


def _unb64_message(d: dict[str, Any]) -> None:
    d["payload"] = base64.b64decode(d["payload"])
    d["properties"] = base64.b64decode(d["properties"])
