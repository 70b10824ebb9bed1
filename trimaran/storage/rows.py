"""A durable queue's hot rows: message rows and events, as the journal adds them to a change and
the writer turns them into statement parameters.

Once or more per durable message on the loop (the journal) and on the writer thread, so the module
is compiled with the hot modules (``trimaran/compiled.py``): it imports no SQLAlchemy, and the
tables' column orders these follow are checked against the schema in ``queue_store.py``.
"""

from __future__ import annotations

from operator import itemgetter
from typing import Any, Final

from trimaran.broker.message import Message
from trimaran.storage.serialize import properties_json

# The longest span an event row may have (``schema.SPAN_MAX``, checked in queue_store.py): a lookup
# by offset reads the index from ``offset - SPAN_MAX``.
SPAN_MAX: Final = 1024

# A message row's columns, in the table's order: MessageRow.values() gives them so.
MESSAGE_COLUMNS: Final = (
    "queue", "offset", "topic", "routing_key", "payload", "qos", "properties", "published_at",
    "expires_at", "publisher", "protocol",
)  # fmt: skip

# Events on consecutive offsets are one run, one row, when every other column (``span`` aside) is
# alike: these, in the table's order. The journal widens a change's last event by this key
# (add_event) and the writer joins a batch's neighbours by it (event_rows).
RUN_COLUMNS: Final = ("time", "queue", "group", "consumer", "node", "kind", "attempt", "reason")
run_key = itemgetter(*RUN_COLUMNS)


class MessageRow:
    """A message's row, built when the writer writes it. A message published and settled within one
    commit is never written (``writer._without_transients``), so its row, the properties JSON above
    all, is never built either, and the event loop never builds any: the writer thread does."""

    __slots__ = ("expires_at", "message", "offset", "published_at", "queue", "routing_key")

    def __init__(
        self,
        queue: str,
        offset: int,
        message: Message,
        routing_key: str,
        published_at: int,
        expires_at: int | None,
    ) -> None:
        self.queue = queue
        self.offset = offset
        self.message = message  # never changed once published (copies are made with copy_with)
        self.routing_key = routing_key
        self.published_at = published_at
        self.expires_at = expires_at

    def values(self) -> tuple[Any, ...]:
        """The row in ``MESSAGE_COLUMNS`` order, for the writer's statements."""
        message = self.message
        return (
            self.queue, self.offset, message.topic, self.routing_key, message.payload, message.qos,
            properties_json(message), self.published_at, self.expires_at, message.publisher_id,
            message.protocol,
        )  # fmt: skip

    def row(self) -> dict[str, Any]:
        return dict(zip(MESSAGE_COLUMNS, self.values(), strict=True))


def event_row(
    time_ms: int,
    queue: str,
    kind: str,
    *,
    group: str | None = None,
    offset: int | None = None,
    consumer: str | None = None,
    node: str | None = None,
    attempt: int | None = None,
    reason: str | None = None,
) -> dict[str, Any]:
    return {
        "time": time_ms,
        "queue": queue,
        "group": group,
        "offset": offset,
        "consumer": consumer,
        "node": node,
        "kind": kind,
        "attempt": attempt,
        "reason": reason,
        "span": 1,  # always there: widening a run reads it without a dict.get
    }


def add_event(
    events: list[dict[str, Any]],
    time_ms: int,
    queue: str,
    kind: str,
    group: str | None,
    offset: int | None,
    consumer: str | None,
    node: str | None,
    attempt: int | None,
    reason: str | None,
) -> None:
    """Append an event to a change's ``events``, or widen the last one's span when this is the
    next offset of its run (a dispatch's deliveries, a multiple ack): no dict for it. Positional:
    once per event of every message."""
    if events and offset is not None:
        last = events[-1]
        first = last["offset"]
        span = last["span"]
        if (
            first is not None
            and first + span == offset
            and span < SPAN_MAX
            and run_key(last) == (time_ms, queue, group, consumer, node, kind, attempt, reason)
        ):
            last["span"] = span + 1
            return
    events.append(
        event_row(
            time_ms, queue, kind, group=group, offset=offset, consumer=consumer, node=node,
            attempt=attempt, reason=reason,
        )
    )  # fmt: skip


def add_published(
    messages: list[MessageRow],
    events: list[dict[str, Any]],
    queue: str,
    offset: int,
    message: Message,
    routing_key: str,
    published_at: int,
    expires_at: int | None,
    node: str | None,
) -> None:
    """A publish's rows in a change: its message row and its ``published`` event (widening the
    last one's span when it follows it). One call for both: the hot path of every durable publish."""
    messages.append(MessageRow(queue, offset, message, routing_key, published_at, expires_at))
    add_event(events, published_at, queue, "published", None, offset, message.publisher_id, node, None, None)


def message_tuples(messages: list[MessageRow]) -> list[tuple[Any, ...]]:
    """The messages' rows as statement parameters, in ``MESSAGE_COLUMNS`` order."""
    return [m.values() for m in messages]


def event_rows(events: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """The events as rows in column order, adjacent events that differ only in a consecutive offset
    made one row spanning them (at most ``SPAN_MAX``). Lossless: readers expand a span, and since
    only neighbours join, the expanded rows are the events in their order."""
    rows: list[tuple[Any, ...]] = []
    key: tuple[Any, ...] | None = None  # the open run: its other columns, first offset, span
    first = span = 0
    for event in events:
        offset = event["offset"]
        width = event["span"]  # the journal joins a change's own neighbours already
        this = run_key(event)
        if offset is not None and offset == first + span and span + width <= SPAN_MAX and this == key:
            span += width
            continue
        if key is not None:
            rows.append((*key[:3], first, *key[3:], span))
        if offset is None:
            rows.append((*this[:3], None, *this[3:], 1))
            key = None
        else:
            key, first, span = this, offset, width
    if key is not None:
        rows.append((*key[:3], first, *key[3:], span))
    return rows
