"""The durable queue's hot rows (trimaran/storage/rows.py): events joined into runs."""

from __future__ import annotations

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
