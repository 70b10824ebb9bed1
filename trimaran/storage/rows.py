"""A durable queue's hot rows: the batch that commits together (message rows, pending entries,
cursors, events), as the journal fills it and the writer turns it into statement parameters.

Touched once or more per durable message on the loop (the journal) and on the writer thread, so the
module is compiled with the hot modules (``trimaran/compiled.py``); the writer's thread, locks and
statements stay in ``writer.py``. The tables' column orders these rows follow are checked against
the schema in ``queue_store.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from operator import attrgetter, itemgetter
from typing import Any, Final, NamedTuple, TypeVar

from sqlalchemy import Connection

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

PendingKey = tuple[str, str, int]
GroupKey = tuple[str, str]


#: Shared mode: a group's messages a node claimed as it published them, held under one lease:
#: (queue, group, node, lease_until). The writer stores their runs of consecutive offsets as spans.
HeldKey = tuple[str, str, str, int]
K = TypeVar("K", GroupKey, HeldKey)

#: A key's new pending row, or None: it goes.
PendingRow = dict[str, Any] | None


def held_spans(held: dict[HeldKey, list[int]], skip: dict[GroupKey, set[int]]) -> list[tuple[Any, ...]]:
    """``queue_spans`` rows for ``held``, in column order: one per run of consecutive offsets, but
    none for a run whose every message ``skip`` names (written and finished in the same commit:
    never stored). A span over such a message among others is harmless: it has no row to claim."""
    rows: list[tuple[Any, ...]] = []
    for (queue, group, node, lease_until), offsets in held.items():
        gone = skip.get((queue, group), _NOTHING)
        offsets.sort()
        first = offsets[0]
        for at in range(1, len(offsets) + 1):
            if at < len(offsets) and offsets[at] == offsets[at - 1] + 1:
                continue
            last = offsets[at - 1]
            if not gone or any(o not in gone for o in range(first, last + 1)):
                rows.append((queue, group, first, last, node, lease_until))
            if at < len(offsets):
                first = offsets[at]
    return rows


_NOTHING: Final[set[int]] = set()


class MessageRow:
    """A message's row, built when the writer writes it. A message published and settled within one
    commit is never written (:func:`without_transients`), so its row, the properties JSON above
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


@dataclass(slots=True, init=False)
class WriteBatch:
    """Changes that commit together. Rows are plain dicts keyed by column name; a message's row is
    built by the writer (:class:`MessageRow`), only if it is written."""

    messages: list[MessageRow]
    message_deletes: list[tuple[str, int]]
    pending: dict[PendingKey, PendingRow]
    # Shared mode: what a group that believed itself the queue's only one finished. In the commit,
    # under a share lock on the queue row (a node making a group takes it for update), each message
    # and its row go if no other group exists, else the row says 'done' for the compaction.
    finished_alone: dict[GroupKey, list[int]]
    # Shared mode: offsets claimed as they were published, per group and lease (``queue_spans``).
    held: dict[HeldKey, list[int]]
    groups: dict[GroupKey, dict[str, Any] | None]
    queue_next: dict[str, int]
    events: list[dict[str, Any]]
    # Anything else, run first in the same transaction (declare, delete, purge, claims); results are
    # returned in order in Receipt.results.
    calls: list[Callable[[Connection], Any]]

    # Written out (each field's empty default is here), as one is built for each publish and
    # dispatch: mypyc compiles it, where the dataclass's generated one runs interpreted.
    def __init__(
        self,
        messages: list[MessageRow] | None = None,
        message_deletes: list[tuple[str, int]] | None = None,
        pending: dict[PendingKey, PendingRow] | None = None,
        finished_alone: dict[GroupKey, list[int]] | None = None,
        held: dict[HeldKey, list[int]] | None = None,
        groups: dict[GroupKey, dict[str, Any] | None] | None = None,
        queue_next: dict[str, int] | None = None,
        events: list[dict[str, Any]] | None = None,
        calls: list[Callable[[Connection], Any]] | None = None,
    ) -> None:
        self.messages = [] if messages is None else messages
        self.message_deletes = [] if message_deletes is None else message_deletes
        self.pending = {} if pending is None else pending
        self.finished_alone = {} if finished_alone is None else finished_alone
        self.held = {} if held is None else held
        self.groups = {} if groups is None else groups
        self.queue_next = {} if queue_next is None else queue_next
        self.events = [] if events is None else events
        self.calls = [] if calls is None else calls

    def empty(self) -> bool:
        return not (
            self.messages
            or self.message_deletes
            or self.pending
            or self.finished_alone
            or self.held
            or self.groups
            or self.queue_next
            or self.events
            or self.calls
        )

    def without(self, refused: dict[str, set[int]]) -> WriteBatch:
        """A copy without the rows about the ``refused`` messages (queue -> offsets): what else a
        refused publish's submission carried (a turn's acks, the drops it made) still has to be
        written. The queues' next offsets stay: an offset handed out is never handed out again."""

        def kept(queue: str, offset: int) -> bool:
            gone = refused.get(queue)
            return gone is None or offset not in gone

        def kept_event(event: dict[str, Any]) -> bool:
            first = event["offset"]
            return first is None or all(kept(event["queue"], o) for o in range(first, first + event["span"]))

        def lists(rows: dict[K, list[int]]) -> dict[K, list[int]]:
            out = {key: [o for o in offsets if kept(key[0], o)] for key, offsets in rows.items()}
            return {key: offsets for key, offsets in out.items() if offsets}

        return WriteBatch(
            messages=[m for m in self.messages if kept(m.queue, m.offset)],
            message_deletes=[key for key in self.message_deletes if kept(*key)],
            pending={key: row for key, row in self.pending.items() if kept(key[0], key[2])},
            finished_alone=lists(self.finished_alone),
            held=lists(self.held),
            groups=dict(self.groups),
            queue_next=dict(self.queue_next),
            events=[event for event in self.events if kept_event(event)],
            calls=list(self.calls),
        )

    @classmethod
    def joined(cls, batches: list[WriteBatch]) -> WriteBatch:
        """The batches as one, in order (a later state of a key wins): one pass per kind of row."""
        joined = cls(
            messages=[m for b in batches for m in b.messages],
            message_deletes=[key for b in batches for key in b.message_deletes],
            pending={key: row for b in batches for key, row in b.pending.items()},
            finished_alone=_lists_joined([b.finished_alone for b in batches]),
            held=_lists_joined([b.held for b in batches]),
            groups={key: row for b in batches for key, row in b.groups.items()},
            events=[event for b in batches for event in b.events],
            calls=[call for b in batches for call in b.calls],
        )
        queue_next = joined.queue_next
        for b in batches:
            for name, value in b.queue_next.items():
                if value > queue_next.get(name, -1):
                    queue_next[name] = value
        return joined


def _lists_joined(parts: list[dict[K, list[int]]]) -> dict[K, list[int]]:
    joined: dict[K, list[int]] = {}
    for part in parts:
        for key, items in part.items():
            joined.setdefault(key, []).extend(items)
    return joined


_second = itemgetter(1)
_offset_of = attrgetter("offset")


def without_transients(batch: WriteBatch) -> WriteBatch:
    """Drop the messages appended and deleted in the same transaction (published, delivered and
    settled within one commit): their insert and delete would cancel out. A delete of a message
    written by an earlier transaction stays. So does the delete of its pending entries: a delivery's
    rows are submitted after its message's, so a message first written here has no pending row
    before this transaction, and a pending entry it ends with none needs no statement. Calls run
    before rows, so none can see the dropped rows; the events of those messages are kept, for the
    audit."""
    if not (batch.messages and batch.message_deletes):
        return batch
    # map with C getters: no Python frame per message (a generator's is one per item)
    if max(map(_second, batch.message_deletes)) < min(map(_offset_of, batch.messages)):
        return batch  # every delete is older than every append (the usual batch): none is transient
    deleted = set(batch.message_deletes)
    transient = {key for m in batch.messages if (key := (m.queue, m.offset)) in deleted}
    if not transient:
        return batch
    return WriteBatch(
        messages=[m for m in batch.messages if (m.queue, m.offset) not in transient],
        message_deletes=[key for key in batch.message_deletes if key not in transient],
        pending={
            key: row
            for key, row in batch.pending.items()
            if row is not None or (key[0], key[2]) not in transient
        },
        finished_alone=batch.finished_alone,
        held=batch.held,
        groups=batch.groups,
        queue_next=batch.queue_next,
        events=batch.events,
        calls=batch.calls,
    )


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


class Claimed(NamedTuple):
    """A message a claim took for its group: its attempts so far, of them the ones that were not
    failures (``unsent``, ``returned``: see ``queue_pending``), and why it is delivered again.
    ``stored``: held by a pending row, not by a span (``queue_spans``)."""

    attempts: int
    unsent: int
    returned: int
    reason: str
    stored: bool = True


FIRST = Claimed(0, 0, 0, "first")  # a new message, held by a 'held' row (a filtered claim's)
SPANNED = FIRST._replace(stored=False)  # a new message, held by a span
