"""The per-message replay rules (``life.py``) on hand-made rows, without Spark."""

from __future__ import annotations

import dataclasses
from typing import Any

from trimaran.analytics.life import (
    CLOCK_SLACK_MS,
    FATES,
    OUTPUT,
    Context,
    Output,
    replay_partition,
    replay_slot,
)

COLUMNS = list(OUTPUT)
CTX = Context(
    modes={"q": "work", "s": "stream"},
    max_attempts={"q": 3},
    visibility_ms={"q": 30_000},
    groups={"q": {"g": 1}},
)


class Slot:
    """Rows of one (queue, offset, epoch) slot, built in event order."""

    def __init__(self, queue: str = "q", offset: int = 0, epoch: int = 0) -> None:
        self.key = (queue, offset, epoch)
        self.rows: list[tuple[Any, ...]] = []
        self.next_id = 1

    def event(
        self, kind: str, group: str | None = "g", attempt: int | None = None, reason: str | None = None,
        time: int | None = None, consumer: str | None = "c1",
    ) -> Slot:  # fmt: skip
        queue, offset, epoch = self.key
        at = self.next_id * 10 if time is None else time
        self.rows.append(
            (queue, offset, epoch, self.next_id, "e", at, group, consumer, kind, attempt, reason, None)
        )
        self.next_id += 1
        return self

    def published(self, time: int | None = None) -> Slot:
        return self.event("published", group=None, consumer="publisher", time=time)

    def live(self) -> Slot:
        queue, offset, _ = self.key
        self.rows.insert(0, (queue, offset, 0, None, "m", None, None, None, None, None, None, None))
        return self

    def pending(self, group: str, state: str, attempts: int, consumer: str | None = "c1") -> Slot:
        queue, offset, _ = self.key
        row = (queue, offset, 0, None, "p", None, group, consumer, None, attempts, None, state)
        self.rows.insert(0, row)
        return self


def replay(slot: Slot, ctx: Context = CTX, out: Output | None = None) -> list[dict[str, Any]]:
    out = out or Output()
    replay_slot(ctx, slot.rows, out)
    return [dict(zip(COLUMNS, row, strict=True)) for row in out.rows]


def broken(records: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(r["invariant"], r["detail"]) for r in records if r["record"] == "violation"]


def flagged_in(records: list[dict[str, Any]]) -> list[tuple[str, str | None, str]]:
    return [(r["invariant"], r["group"], r["detail"]) for r in records if r["record"] == "violation"]


def test_acked_message_is_clean_and_finished() -> None:
    slot = Slot().published(time=5).event("delivered", attempt=1, reason="first")
    out = Output()
    records = replay(slot.event("acked", attempt=1), out=out)
    assert broken(records) == []
    (life,) = [r for r in records if r["record"] == "life"]
    assert (life["status"], life["deliveries"], life["acks"], life["holder"]) == ("finished", 1, 1, "c1")
    assert (life["pub_time"], life["acked_at"]) == (5, 30)
    assert (out.messages, out.live, out.removed) == (1, 0, 0)


def test_ack_without_delivery() -> None:
    records = replay(Slot().published().event("acked", attempt=1))
    assert broken(records) == [("settled_after_delivery", "acked attempt 1 with no delivery before it")]


def test_ack_twice_is_one_violation_of_acked_once() -> None:
    slot = Slot().published().event("delivered", attempt=1, reason="first")
    records = replay(slot.event("acked", attempt=1).event("acked", attempt=1))
    assert broken(records) == [("acked_once", "acked 2 times")]


def test_redelivery_after_timeout_must_wait_for_the_visibility_timeout() -> None:
    def slot(released_at: int) -> Slot:
        s = Slot().published(time=0).event("delivered", attempt=1, reason="first", time=1_000)
        s.event("released", attempt=1, reason="timeout", time=released_at)
        s.event("delivered", attempt=2, reason="timeout", time=released_at)
        return s.event("acked", attempt=2, time=released_at + 5)

    assert broken(replay(slot(31_000))) == []
    assert broken(replay(slot(5_000))) == [
        ("redelivery_explained", "attempt 2 delivered for reason timeout after released (timeout)")
    ]


def test_dead_letter_needs_a_reject_or_max_attempts() -> None:
    slot = Slot().published()
    for attempt in (1, 2, 3):
        slot.event("delivered", attempt=attempt, reason="first" if attempt == 1 else "nack")
        slot.event("nacked", attempt=attempt, reason="max_attempts" if attempt == 3 else "delay_ms=10")
    assert broken(replay(slot.event("dead_lettered", reason="max_attempts -> $dlq/q:0"))) == []

    early = Slot().published().event("delivered", attempt=1, reason="first")
    assert broken(replay(early.event("dead_lettered", reason="max_attempts"))) == [
        ("dead_letter_explained", "dead_lettered (max_attempts) after delivered, attempt 1 of max 3")
    ]


def test_a_first_delivery_a_shared_nodes_span_holds_needs_no_pending_row() -> None:
    """A shared node holds what it claimed for the first time by a span of offsets, with no pending
    row, whatever the groups (``schema.queue_spans``); another group's span, or a second delivery,
    is no excuse."""
    held = Slot(offset=7).live().published().event("delivered", attempt=1, reason="first")
    spans = {"q": {"g": [(0, 3), (5, 9)], "h": [(7, 7)]}}
    two_groups = dataclasses.replace(CTX, groups={"q": {"g": 1, "h": 0}}, spans=spans)
    assert broken(replay(held, two_groups)) == []
    elsewhere = dataclasses.replace(two_groups, spans={"q": {"g": [(0, 6), (8, 9)], "h": [(7, 7)]}})
    assert broken(replay(held, elsewhere)) == [("live_state", "replay: held attempt 1; no pending row")]
    again = Slot(offset=7).live().published().event("delivered", attempt=1, reason="first")
    again.event("nacked", attempt=1).event("delivered", attempt=2, reason="nack")
    assert broken(replay(again, two_groups)) == [("live_state", "replay: held attempt 2; no pending row")]


def test_attempts_count_deliveries() -> None:
    slot = Slot().published().event("delivered", attempt=1, reason="first").event("nacked", attempt=1)
    records = replay(slot.event("delivered", attempt=3, reason="nack").event("acked", attempt=3))
    assert broken(records) == [("attempts", "delivery numbered attempt 3 is delivery 2 of this group")]


def test_a_held_message_needs_its_pending_row() -> None:
    """Except a first delivery of the queue's only group, which the broker keeps without one."""
    held = Slot().live().published().event("delivered", attempt=1, reason="first")
    two_groups = dataclasses.replace(CTX, groups={"q": {"g": 1, "h": 0}})
    assert broken(replay(held, two_groups)) == [("live_state", "replay: held attempt 1; no pending row")]
    assert broken(replay(held)) == []
    again = Slot().live().published().event("delivered", attempt=1, reason="first").event("nacked", attempt=1)
    again.event("delivered", attempt=2, reason="nack")
    assert broken(replay(again)) == [("live_state", "replay: held attempt 2; no pending row")]
    assert broken(replay(held.pending("g", "held", 1), two_groups)) == []
    other = Slot().live().pending("g", "held", 1, consumer="c2").published()
    other.event("delivered", attempt=1, reason="first")
    assert broken(replay(other)) == [("live_state", "held by c2 but replay: c1")]


def test_a_message_gone_before_its_groups_finished_is_unaccounted() -> None:
    ctx = Context(modes={"q": "work"}, groups={"q": {"g": 1, "h": None}})
    slot = Slot().published().event("delivered", attempt=1, reason="first").event("acked", attempt=1)
    assert flagged_in(replay(slot, ctx)) == [
        ("accounted", "h", "gone from queue_messages before the group read it")
    ]
    assert broken(replay(slot.live(), ctx)) == []  # still there: h has yet to read it


def test_live_row_without_publication() -> None:
    assert broken(replay(Slot().live())) == [("live_state", "in queue_messages but never published")]


def test_an_older_incarnation_is_replayed_but_not_compared() -> None:
    records = replay(Slot(epoch=1).published().event("delivered", attempt=1, reason="first"))
    assert broken(records) == []  # held in a deleted queue: nothing live to compare with
    assert [(r["record"], r["epoch"]) for r in records] == [("life", 1)]


def test_a_window_leaves_out_messages_published_outside_it() -> None:
    ctx = Context(modes={"q": "work"}, groups={"q": {"g": 1}}, since_ms=100)
    assert replay(Slot().published(time=50).event("acked", attempt=1), ctx) == []
    assert replay(Slot().published(time=150).event("acked", attempt=1), ctx)


def test_stream_messages_have_no_group_lives() -> None:
    out = Output()
    records = replay(
        Slot(queue="s").live().published().event("delivered", attempt=1, reason="first"), out=out
    )
    assert records == []
    assert (out.messages, out.live) == (1, 1)


def test_partitions_are_cut_between_slots_never_inside_one() -> None:
    rows = []
    for offset in range(5):
        slot = Slot(offset=offset).published().event("delivered", attempt=1, reason="first")
        rows += slot.event("acked", attempt=1).rows
    outputs = list(replay_partition(CTX, rows, batch_rows=1))
    assert len(outputs) == 5
    for i, out in enumerate(outputs):
        assert {row[4] for row in out.rows if row[0] == "life"} == {i}
    (totals,) = [dict(zip(COLUMNS, r, strict=True)) for r in outputs[-1].rows if r[0] == "totals"]
    assert (totals["messages"], totals["messages_live"], totals["messages_removed"]) == (5, 0, 0)


def test_an_older_incarnation_is_not_judged_by_the_newest_policy() -> None:
    """Declared again with max_attempts 5: the old incarnation's dead letter at 3 was right."""
    ctx = Context(modes={"q": "work"}, max_attempts={"q": 5}, groups={"q": {"g": 1}})
    slot = Slot(epoch=1).published()
    for attempt in (1, 2, 3):
        slot.event("delivered", attempt=attempt, reason="first" if attempt == 1 else "nack")
        slot.event("nacked", attempt=attempt, reason="max_attempts" if attempt == 3 else "delay_ms=10")
    assert broken(replay(slot.event("dead_lettered", reason="max_attempts"), ctx)) == []


# -- faults, each as a real bug or tampering would leave the rows: exactly its invariant and message --


def flagged(records: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(r["invariant"], r["message_id"]) for r in records if r["record"] == "violation"]


def _acked(offset: int = 7) -> Slot:
    """A message delivered once and acked, its rows gone: clean."""
    slot = Slot(offset=offset).published(time=100).event("delivered", attempt=1, reason="first", time=110)
    return slot.event("acked", attempt=1, time=120)


def test_clean_messages_of_every_kind_stay_clean() -> None:
    retried = Slot(offset=8).published(time=100).event("delivered", attempt=1, reason="first", time=110)
    retried.event("nacked", attempt=1, reason="delay_ms=10", time=120)
    retried.event("delivered", attempt=2, reason="nack", time=130).event("acked", attempt=2, time=140)
    held = Slot(offset=9).live().pending("g", "held", 1).published(time=100)
    held.event("delivered", attempt=1, reason="first", time=110)
    for slot in (_acked(), retried, held):
        assert flagged(replay(slot)) == []


def test_a_published_message_that_vanishes_without_an_event() -> None:
    """Delivered, then its queue_messages and queue_pending rows deleted with no event saying why."""
    slot = Slot(offset=7).published(time=100).event("delivered", attempt=1, reason="first", time=110)
    assert flagged(replay(slot)) == [("accounted", "q:7")]
    assert flagged(replay(Slot(offset=7).live().pending("g", "held", 1).published(time=100)
                          .event("delivered", attempt=1, reason="first", time=110))) == []  # fmt: skip


def test_an_ack_of_an_attempt_that_was_not_delivered() -> None:
    slot = Slot(offset=7).published(time=100).event("delivered", attempt=1, reason="first", time=110)
    records = replay(slot.event("acked", attempt=2, time=120))
    assert flagged(records) == [("settled_after_delivery", "q:7")]
    assert broken(records)[0][1] == "acked attempt 2 but the last delivery was attempt 1"


def test_a_double_ack() -> None:
    assert flagged(replay(_acked().event("acked", attempt=1, time=130))) == [("acked_once", "q:7")]


def test_a_dead_letter_with_no_reject_below_max_attempts() -> None:
    slot = Slot(offset=7).published(time=100).event("delivered", attempt=1, reason="first", time=110)
    slot.event("nacked", attempt=1, reason="delay_ms=10", time=120)
    records = replay(slot.event("dead_lettered", reason="max_attempts -> $dlq/q:0", time=125))
    assert flagged(records) == [("dead_letter_explained", "q:7")]
    assert "attempt 1 of max 3" in broken(records)[0][1]


def test_a_delivery_after_the_ack() -> None:
    """Only ``acked_stays_acked``: the stray delivery neither counts as a redelivery nor reopens
    the message."""
    records = replay(_acked().event("delivered", attempt=2, reason="nack", time=130, consumer="c2"))
    assert flagged(records) == [("acked_stays_acked", "q:7")]
    assert broken(records)[0][1] == "attempt 2 delivered to c2 after its ack (event 3)"
    (life,) = [r for r in records if r["record"] == "life"]
    assert (life["status"], life["deliveries"]) == ("finished", 1)


def test_a_delivery_after_the_ack_with_a_restart_between() -> None:
    """Issue 42 after a restart: the ack, a release at the restart, the delivery again and a second
    ack. The release in between hides nothing; the second ack is its own fault (acked twice), and
    settling the stray delivery is no settlement without a delivery."""
    slot = _acked().event("released", attempt=1, reason="restart", time=200)
    slot.event("delivered", attempt=2, reason="restart", time=210).event("acked", attempt=2, time=220)
    records = replay(slot)
    assert flagged_in(records) == [
        ("acked_stays_acked", "g", "attempt 2 delivered to c1 after its ack (event 3)"),
        ("acked_once", "g", "acked 2 times"),
    ]
    # A delivery after a dead letter is still ``final``'s.
    dead = Slot(offset=7).published(time=100).event("delivered", attempt=1, reason="first", time=110)
    dead.event("rejected", attempt=1, reason="bad", time=120)
    dead.event("dead_lettered", reason="bad -> $dlq/q:0", time=121)
    assert flagged(replay(dead.event("delivered", attempt=2, reason="nack", time=130))) == [("final", "q:7")]


def test_attempt_counters_that_skip() -> None:
    slot = Slot(offset=7).published(time=100).event("delivered", attempt=1, reason="first", time=110)
    slot.event("nacked", attempt=1, reason="delay_ms=10", time=120)
    slot.event("delivered", attempt=3, reason="nack", time=130).event("acked", attempt=3, time=140)
    assert flagged(replay(slot)) == [("attempts", "q:7")]


def test_a_live_row_the_events_say_was_acked() -> None:
    pending = _acked().live().pending("g", "held", 1)
    records = replay(pending)
    assert flagged(records) == [("finished_removed", "q:7"), ("live_state", "q:7")]
    assert {detail for _, detail in broken(records)} == {
        "still in queue_messages though every group finished it (g acked)",
        "pending row held but replay: finished",
    }
    assert flagged(replay(_acked(offset=0).live())) == [("finished_removed", "q:0")]


def test_a_message_every_group_finished_is_no_longer_stored() -> None:
    """Issue 42 before a restart: acked by the only group (out of order, its 'done' entry retired),
    the message still stored. Not flagged: a group still owing it, one that began after it, a
    stream, or every group's 'done' marker waiting for shared mode's compaction."""
    two = dataclasses.replace(CTX, groups={"q": {"g": 8, "h": 8}})
    both = _acked().event("delivered", group="h", attempt=1, reason="first", time=130)
    both.event("rejected", group="h", attempt=1, reason="bad", time=140)
    both.event("dead_lettered", group="h", reason="bad -> $dlq/q:0", time=141)
    assert flagged_in(replay(both.live(), two)) == [
        ("finished_removed", None, "still in queue_messages though every group finished it "
                                   "(g acked, h dead_lettered)"),
    ]  # fmt: skip
    unread = dataclasses.replace(CTX, groups={"q": {"g": 8, "h": 0}})
    assert broken(replay(_acked().live(), unread)) == []  # h has yet to read it
    # h began after it was published, at offset 9 (a work group's start past it: no line of its own)
    later = dataclasses.replace(CTX, groups={"q": {"g": 8, "h": 9}}, firsts={"q": {"h": (50, 9)}})
    assert flagged(replay(_acked().live(), later)) == [("finished_removed", "q:7")]
    stream = dataclasses.replace(CTX, modes={"q": "stream"}, committed={"q": {"g": 8}})
    assert broken(replay(Slot(offset=7).published(time=100).live(), stream)) == []
    shared = _acked().live().pending("g", "done", 1)
    assert broken(replay(shared)) == []  # the compaction's marker: deleted at its next pass
    assert flagged(replay(both.live().pending("g", "done", 1), two)) == [("finished_removed", "q:7")]


def test_an_event_stamped_before_the_one_logged_ahead_of_it() -> None:
    slot = Slot(offset=7).published(time=100_000).event("delivered", attempt=1, reason="first", time=110_000)
    records = replay(slot.event("acked", attempt=1, time=50_000))
    assert flagged(records) == [("time_ordered", "q:7")]
    assert broken(records)[0][1] == "acked stamped 60000 ms before the delivered logged ahead of it (event 2)"
    # Two nodes' clocks a little apart are not a fault.
    near = Slot(offset=7).published(time=100_000).event("delivered", attempt=1, reason="first", time=110_000)
    assert flagged(replay(near.event("acked", attempt=1, time=110_000 - CLOCK_SLACK_MS))) == []


def test_a_duplicated_publish_event() -> None:
    slot = Slot(offset=7).published(time=100).published(time=100)
    slot.event("delivered", attempt=1, reason="first", time=110).event("acked", attempt=1, time=120)
    assert flagged(replay(slot)) == [("published_once", "q:7")]


# -- outcomes and samples for the report ------------------------------------------------------------


def test_outcomes_split_each_groups_messages_exactly_once() -> None:
    ctx = Context(modes={"q": "work"}, max_attempts={"q": 2}, groups={"q": {"g": 0, "h": 0}})
    out = Output()
    acked_g = Slot(offset=0).live().published(time=1).event("delivered", attempt=1, reason="first", time=2)
    acked_g.event("acked", attempt=1, time=3)  # g acked it; h has not read it yet
    replay(acked_g, ctx, out)
    dead = Slot(offset=1).published(time=1)
    for group in ("g", "h"):
        dead.event("delivered", group=group, attempt=1, reason="first", time=2)
        dead.event("nacked", group=group, attempt=1, reason="delay_ms=1", time=3)
        dead.event("delivered", group=group, attempt=2, reason="nack", time=4)
        dead.event("nacked", group=group, attempt=2, reason="max_attempts", time=5)
        dead.event("dead_lettered", group=group, reason="max_attempts -> $dlq/q:0", time=6)
    replay(dead, ctx, out)
    replay(Slot(offset=2).published(time=1).event("expired", group=None, reason="ttl", time=9), ctx, out)
    out.totals()
    counted = {(r[2], r[3], r[-2]): r[-1] for r in out.rows if r[0] == "outcome"}
    assert counted == {
        ("q", None, "published"): 3, ("q", None, "stored"): 1, ("q", None, "expired"): 1,
        ("q", None, "finished"): 1,
        ("q", "g", "published"): 3, ("q", "g", "acked"): 1, ("q", "g", "dead_lettered"): 1,
        ("q", "g", "redelivered"): 1, ("q", "g", "expired"): 1,
        ("q", "h", "published"): 3, ("q", "h", "ahead"): 1, ("q", "h", "dead_lettered"): 1,
        ("q", "h", "redelivered"): 1, ("q", "h", "expired"): 1,
    }  # fmt: skip
    sampled = {(r[6], r[-2]) for r in out.rows if r[0] == "sample"}
    assert sampled == {("q:0", "ahead"), ("q:1", "dead_lettered"), ("q:2", "expired")}


# -- the ledger: one fate per (message, group that existed while it was live) -----------------------


def ledger(records: list[dict[str, Any]]) -> dict[str | None, tuple[str, str | None]]:
    return {r["group"]: (r["fate"], r["copy"]) for r in records if r["record"] in ("life", "ledger")}


def test_each_line_has_its_fate_and_copy() -> None:
    ctx = dataclasses.replace(CTX, groups={"q": {"g": 3, "h": 3, "late": 9}}, firsts={"q": {"late": (50, 9)}})
    slot = Slot(offset=2).published(time=1).event("delivered", attempt=1, reason="first")
    slot.event("rejected", attempt=1).event("dead_lettered", reason="rejected -> $dlq/q:4")
    slot.event("delivered", group="h", attempt=1, reason="first").event("acked", group="h", attempt=1)
    records = replay(slot, ctx)
    assert broken(records) == []
    # late began after the message was gone (its first event came later): no line of its own
    assert ledger(records) == {"g": ("dead_lettered", "$dlq/q:4"), "h": ("acked", None)}


def test_a_group_whose_whole_history_of_a_message_was_deleted() -> None:
    """Its cursor is past the message, as if it had begun after it; but it had an event before the
    message was gone, so it existed while the message was live and owes it a fate."""
    ctx = dataclasses.replace(CTX, groups={"q": {"g": 8, "h": 8}}, firsts={"q": {"g": (1, 0), "h": (2, 0)}})
    slot = _acked()  # g acked it; h's delivery and ack deleted
    assert flagged_in(replay(slot, ctx)) == [
        ("accounted", "h", "the group's cursor 8 passed it with no event for it")
    ]
    began_later = dataclasses.replace(ctx, firsts={"q": {"g": (1, 0), "h": (500, 8)}})
    assert flagged_in(replay(_acked(), began_later)) == []
    # Or began while it was live, but at a start position past it ("last", an offset).
    started_past = dataclasses.replace(ctx, firsts={"q": {"g": (1, 0), "h": (2, 8)}})
    assert flagged_in(replay(_acked(), started_past)) == []
    # The only group's history deleted: no fate at all, whatever the cursor says.
    bare = Slot(offset=7).published(time=100)
    assert flagged_in(replay(bare, dataclasses.replace(CTX, groups={"q": {"g": 8}}))) == [
        ("accounted", None, "gone from queue_messages with no fate in the events")
    ]


def test_a_live_message_ahead_of_a_cursor_is_owed() -> None:
    ctx = dataclasses.replace(CTX, groups={"q": {"g": 7}})
    records = replay(Slot(offset=7).live().published(), ctx)
    assert broken(records) == [] and ledger(records) == {"g": ("ahead", None)}
    # A group there when it was published, whose cursor passed it with no event: evidence deleted.
    there = dataclasses.replace(CTX, groups={"q": {"g": 8}}, firsts={"q": {"g": (0, 0)}})
    assert flagged(replay(Slot(offset=7).live().published(), there)) == [("accounted", "q:7")]


def test_a_nack_at_the_last_attempt_needs_a_dead_letter_fate() -> None:
    slot = Slot(offset=7).published()
    for attempt in (1, 2, 3):
        slot.event("delivered", attempt=attempt, reason="first" if attempt == 1 else "nack")
        slot.event("nacked", attempt=attempt, reason="max_attempts" if attempt == 3 else "delay_ms=10")
    records = replay(slot)
    assert flagged_in(records) == [
        ("accounted", "g", "nacked at attempt 3 (max_attempts) but no dead_lettered or dropped event")
    ]
    assert ledger(records) == {"g": ("lost", None)}
    slot.event("dead_lettered", reason="max_attempts -> $dlq/q:0")
    assert flagged(replay(slot)) == [] and ledger(replay(slot)) == {"g": ("dead_lettered", "$dlq/q:0")}


def test_two_fates_in_one_group() -> None:
    slot = Slot(offset=7).published().event("delivered", attempt=1, reason="first")
    slot.event("rejected", attempt=1).event("dead_lettered", reason="rejected -> $dlq/q:0")
    records = replay(slot.event("acked", attempt=1))
    assert flagged_in(records) == [("single_fate", "g", "acked after it was already dead_lettered (event 4)")]
    twice = Slot(offset=3).published().event("expired", group=None, reason="ttl")
    assert flagged(replay(twice.event("expired", group=None, reason="ttl"))) == [("single_fate", "q:3")]


def test_a_removal_is_the_fate_of_every_group_still_owing_it() -> None:
    ctx = dataclasses.replace(CTX, groups={"q": {"g": 0, "h": 0}})
    slot = Slot(offset=0).published().event("delivered", attempt=1, reason="first")
    records = replay(slot.event("expired", group=None, reason="ttl -> $dlq/q"), ctx)
    assert broken(records) == []
    assert ledger(records) == {"g": ("expired", "$dlq/q"), "h": ("expired", "$dlq/q")}


def test_a_queue_with_no_group_has_one_line() -> None:
    ctx = Context(modes={"d": "work"})
    stored = replay(Slot(queue="d", offset=0).live().published(), ctx)
    assert broken(stored) == [] and ledger(stored) == {None: ("pending", None)}
    gone = replay(Slot(queue="d", offset=1).published(), ctx)
    assert flagged(gone) == [("accounted", "d:1")] and ledger(gone) == {None: ("lost", None)}
    moved = replay(Slot(queue="d", offset=2).published().event("redriven", group=None, reason="-> q:9"), ctx)
    assert broken(moved) == [] and ledger(moved) == {None: ("redriven", "q:9")}


def test_stream_lines_follow_the_commits() -> None:
    ctx = Context(modes={"s": "stream"}, groups={"s": {"r": 5, "t": 2}}, committed={"s": {"r": 4, "t": 0}})
    records = replay(Slot(queue="s", offset=3).live().published(), ctx)
    assert ledger(records) == {"r": ("acked", None), "t": ("ahead", None)}
    assert flagged(replay(Slot(queue="s", offset=3).published(), ctx)) == [("accounted", "s:3")]


# -- generated tables (bench/audit_bench.py) through the plain-Python audit (tests/analytics/plain.py) --


def _generated() -> dict[str, Any]:
    from bench.audit_bench import _dlq_reasons, generate

    tables = generate(3000)
    _dlq_reasons(tables["queue_events"])
    return tables


def test_generated_tables_are_clean_and_balance() -> None:
    from tests.analytics.plain import audit

    found, outcomes = audit(_generated())
    assert found == []
    fates = set(FATES)
    for (queue, group), by in outcomes.items():
        if group is not None:
            assert by["published"] == sum(by.get(f, 0) for f in fates), (queue, group, by)
            assert not by.get("lost")
    assert outcomes[("orders", "billing")]["ahead"] > 0 and outcomes[("$dlq/orders", None)]["stored"] > 0


def test_evidence_removed_altered_or_duplicated_is_flagged_with_its_rule_and_message() -> None:
    """The faults of ``conftest.inject_faults`` (the Spark test's too): each rule flags exactly the
    messages its faults broke, and the books show every message whose fate went missing."""
    from tests.analytics.conftest import inject_faults
    from tests.analytics.plain import audit

    tables = _generated()
    expected = inject_faults(tables)
    found, outcomes = audit(tables)
    by_rule: dict[str, set[str]] = {}
    for v in found:
        by_rule.setdefault(v["invariant"], set()).add(v["message_id"])
    assert by_rule == expected
    assert len(expected["accounted"]) == 5 and len(expected["copies_traced"]) == 5
    assert len(expected["single_fate"]) == 2
    lost = sum(by.get("lost", 0) for (_, group), by in outcomes.items() if group is None)
    assert lost == len(expected["accounted"])
