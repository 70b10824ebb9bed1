"""The durable queue's hot rows (trimaran/storage/rows.py): events joined into runs."""

from __future__ import annotations

from trimaran.broker.message import Message
from trimaran.storage import rows
from trimaran.storage.schema import SPAN_MAX


def _event(offset: int | None, kind: str = "delivered", *, time: int = 5, consumer: str = "c1") -> dict:
    return rows.event_row(time, "q", kind, group="g", offset=offset, consumer=consumer, attempt=1)


def test_adjacent_events_on_consecutive_offsets_become_one_row() -> None:
    """Only neighbours that differ in nothing but the next offset join, so the expanded rows are
    the events in their order; a span stops at SPAN_MAX, and an event without an offset stands alone."""
    events = [
        *(_event(o) for o in range(10, 14)),  # one run
        _event(15),  # a gap
        _event(16, "acked"),  # another kind
        _event(17, "acked", time=6),  # another moment
        _event(18, "acked", time=6, consumer="c2"),  # another consumer
        _event(None, "declared"),
        _event(19, "acked", time=6, consumer="c2"),  # not joined across the offset-less event
        _event(20, "acked", time=6, consumer="c2"),
    ]
    joined = rows.event_rows(events)
    offset_span = [(r[3], r[6], r[9]) for r in joined]
    assert offset_span == [
        (10, "delivered", 4), (15, "delivered", 1), (16, "acked", 1), (17, "acked", 1), (18, "acked", 1),
        (None, "declared", 1), (19, "acked", 2),
    ]  # fmt: skip
    expanded = [(r[3] + i if r[3] is not None else None, r[6]) for r in joined for i in range(r[9])]
    assert expanded == [(e["offset"], e["kind"]) for e in events]
    long = rows.event_rows([_event(o) for o in range(SPAN_MAX + 5)])
    assert [(r[3], r[9]) for r in long] == [(0, SPAN_MAX), (SPAN_MAX, 5)]


def test_a_batch_without_refused_messages_keeps_every_other_row() -> None:
    """What a refused publish's submission carried besides it (a turn's acks, the drops it made)
    is still written: ``without`` takes out the refused messages' rows alone, spans included."""
    message = Message(topic="t", payload=b"x")
    batch = rows.WriteBatch(
        messages=[
            rows.MessageRow("q", 7, message, "", 1, None),
            rows.MessageRow("q", 8, message, "", 1, None),
        ],
        message_deletes=[("q", 2), ("q", 7)],
        pending={("q", "g", 3): {"state": "held"}, ("q", "g", 8): {"state": "wait"}, ("p", "g", 8): None},
        held={("q", "g", "n", 99): [7, 8, 9]},
        finished_alone={("q", "g"): [8]},
        groups={("q", "g"): {"cursor": 9}},
        queue_next={"q": 9},
        events=[
            rows.event_row(5, "q", "acked", group="g", offset=1, consumer="c", attempt=1),
            {**rows.event_row(5, "q", "published", offset=7), "span": 2},
            rows.event_row(5, "p", "published", offset=8),
            rows.event_row(5, "q", "declared"),
        ],
    )
    rest = batch.without({"q": {7, 8}})
    assert rest.messages == []
    assert rest.message_deletes == [("q", 2)]
    assert rest.pending == {("q", "g", 3): {"state": "held"}, ("p", "g", 8): None}
    assert rest.held == {("q", "g", "n", 99): [9]}
    assert rest.finished_alone == {}
    assert rest.groups == batch.groups and rest.queue_next == {"q": 9}  # offsets are never reused
    assert [(e["queue"], e["kind"], e["offset"]) for e in rest.events] == [
        ("q", "acked", 1),
        ("p", "published", 8),
        ("q", "declared", None),
    ]
    assert len(batch.messages) == 2  # the batch itself is left as it was
