"""The broker's event bus: what happened in the broker, told to whoever listens (webhooks today).

Synchronous and cheap on purpose. ``emit`` runs each listener inline on the event loop and returns:
a listener must only take the event into a bounded buffer of its own (never await, never block),
and an exception in a listener is logged and counted, never raised into the broker. Emitters ask
``wants(type)`` first so that nothing is built when nobody listens; the per-message event
(``message.published``) is guarded by one attribute, ``publishing``.

The ``data`` of an event is plain JSON-ready data, the same shape whatever protocol caused it:
client events carry ``client_id``, ``protocol``, ``address``, ``user``, ``vhost`` (a connected
client's) and, where it applies, ``reason``; message events carry ``topic``, ``qos``, ``retain``,
``size``, ``client_id`` and ``protocol`` (the payload travels beside ``data`` in
``BusEvent.payload``, so that each listener decides whether and how to include it); queue events
carry ``queue``, ``group``, ``offset`` and what the event needs besides. Topics, MQTT client ids and
queues are keys (trimaran/vhosts.py): a tenant's carry its ``$vhost/<v>/`` prefix, which listeners
that speak to people strip. An emitted ``data`` dict is shared by every listener: do not change it
afterwards.

Call ``emit`` from the event loop's thread only.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any, Final

from trimaran.broker.clients import Client
from trimaran.broker.message import Message, now_ms

log = logging.getLogger(__name__)

CLIENT_CONNECTED: Final = "client.connected"
CLIENT_DISCONNECTED: Final = "client.disconnected"
CLIENT_AUTH_FAILED: Final = "client.auth_failed"
SESSION_CREATED: Final = "session.created"
SESSION_EXPIRED: Final = "session.expired"
SESSION_TAKEN_OVER: Final = "session.taken_over"
SUBSCRIPTION_CREATED: Final = "subscription.created"
SUBSCRIPTION_REMOVED: Final = "subscription.removed"
MESSAGE_PUBLISHED: Final = "message.published"
MESSAGE_DROPPED: Final = "message.dropped"
QUEUE_ACKED: Final = "queue.acked"
QUEUE_NACKED: Final = "queue.nacked"
QUEUE_REJECTED: Final = "queue.rejected"
QUEUE_DEAD_LETTERED: Final = "queue.dead_lettered"
QUEUE_EXPIRED: Final = "queue.expired"

EVENT_TYPES: Final = (
    CLIENT_CONNECTED,
    CLIENT_DISCONNECTED,
    CLIENT_AUTH_FAILED,
    SESSION_CREATED,
    SESSION_EXPIRED,
    SESSION_TAKEN_OVER,
    SUBSCRIPTION_CREATED,
    SUBSCRIPTION_REMOVED,
    MESSAGE_PUBLISHED,
    MESSAGE_DROPPED,
    QUEUE_ACKED,
    QUEUE_NACKED,
    QUEUE_REJECTED,
    QUEUE_DEAD_LETTERED,
    QUEUE_EXPIRED,
)
MESSAGE_EVENTS: Final = frozenset({MESSAGE_PUBLISHED, MESSAGE_DROPPED})


def expand_patterns(patterns: Iterable[str]) -> frozenset[str]:
    """Event type patterns -> event types: ``*`` is every type, ``client.*`` every client event.

    Raises ``ValueError`` naming a pattern that matches no known type.
    """
    chosen: set[str] = set()
    for pattern in patterns:
        if pattern == "*":
            matched = set(EVENT_TYPES)
        elif pattern.endswith(".*"):
            prefix = pattern[:-1]
            matched = {t for t in EVENT_TYPES if t.startswith(prefix)}
        else:
            matched = {pattern} & set(EVENT_TYPES)
        if not matched:
            raise ValueError(f"unknown event type {pattern!r} (known: {', '.join(EVENT_TYPES)})")
        chosen |= matched
    return frozenset(chosen)


class BusEvent:
    """One thing that happened. Treat as read-only: every listener gets the same object."""

    __slots__ = ("data", "payload", "seq", "time_ms", "topic", "type")

    def __init__(
        self,
        type: str,
        data: dict[str, Any],
        time_ms: int,
        seq: int,
        topic: str | None = None,
        payload: bytes | None = None,
    ) -> None:
        self.type = type
        self.data = data
        self.time_ms = time_ms
        self.seq = seq  # unique within this bus: an event id is the bus's boot id and this number
        self.topic = topic  # message events: the topic, for topic filters
        self.payload = payload  # message events: the payload, included only where configured

    def __repr__(self) -> str:
        return f"BusEvent({self.type!r}, {self.data!r})"


Listener = Callable[[BusEvent], None]


class EventBus:
    """Listeners per event type. ``publishing`` is True while someone wants ``message.published``."""

    def __init__(self) -> None:
        self._listeners: dict[str, tuple[Listener, ...]] = {}
        self._seq = 0
        self.publishing = False
        self.emitted = 0
        self.listener_errors = 0

    def subscribe(self, listener: Listener, types: Iterable[str]) -> Callable[[], None]:
        """Call ``listener`` for each event of ``types``; returns a function that unsubscribes."""
        wanted = tuple(dict.fromkeys(types))
        unknown = [t for t in wanted if t not in EVENT_TYPES]
        if unknown:
            raise ValueError(f"unknown event types: {', '.join(unknown)}")
        for event_type in wanted:
            self._listeners[event_type] = (*self._listeners.get(event_type, ()), listener)
        self._refresh()

        def unsubscribe() -> None:
            for event_type in wanted:
                kept = tuple(x for x in self._listeners.get(event_type, ()) if x is not listener)
                if kept:
                    self._listeners[event_type] = kept
                else:
                    self._listeners.pop(event_type, None)
            self._refresh()

        return unsubscribe

    def _refresh(self) -> None:
        self.publishing = MESSAGE_PUBLISHED in self._listeners

    def wants(self, event_type: str) -> bool:
        return event_type in self._listeners

    def emit(
        self,
        event_type: str,
        data: dict[str, Any],
        *,
        topic: str | None = None,
        payload: bytes | None = None,
    ) -> None:
        """Hand an event to its listeners now; never blocks, never raises."""
        listeners = self._listeners.get(event_type)
        if not listeners:
            return
        self._seq += 1
        event = BusEvent(event_type, data, now_ms(), self._seq, topic, payload)
        self.emitted += 1
        for listener in listeners:
            try:
                listener(event)
            except Exception:
                self.listener_errors += 1
                log.exception("event listener %r failed on %s", listener, event_type)

    # -- helpers that keep the emit sites one line and the data shape the same everywhere ---------

    def client(
        self,
        event_type: str,
        client_id: str | None,
        protocol: str,
        address: str | None,
        user: str | None,
        **extra: Any,
    ) -> None:
        """A client, session or subscription event (callers check ``wants`` first)."""
        data: dict[str, Any] = {"client_id": client_id, "protocol": protocol, "address": address}
        data["user"] = user
        data.update(extra)
        self.emit(event_type, data)

    def client_info(self, event_type: str, client: Client, **extra: Any) -> None:
        """The same, for a client in the broker's registry (any protocol), with its vhost."""
        extra.setdefault("vhost", client.vhost)
        self.client(event_type, client.client_id, client.protocol, client.peer, client.user, **extra)

    def message(self, event_type: str, message: Message, **extra: Any) -> None:
        """``message.published`` or ``message.dropped`` for a message (callers check first)."""
        data: dict[str, Any] = {
            "topic": message.topic,
            "qos": message.qos,
            "retain": message.retain,
            "size": len(message.payload),
            "client_id": message.publisher_id,
            "protocol": message.protocol,
        }
        if message.content_type is not None:
            data["content_type"] = message.content_type
        data.update(extra)
        self.emit(event_type, data, topic=message.topic, payload=message.payload)

    def queue(self, event_type: str, queue: str, **fields: Any) -> None:
        """A queue event: ``queue`` plus ``group``, ``offset``, ``consumer``, ``reason`` ... as given."""
        if event_type in self._listeners:
            self.emit(event_type, {"queue": queue, **fields})
