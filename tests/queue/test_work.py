"""WorkGroup in-process, with the memory journal: take, settle, retry with backoff, dead letters,
visibility time-outs and due times, without a manager, a database or an event loop."""

from __future__ import annotations

from typing import Any

from tests.queue.conftest import Rooms, Taker
from trimaran.queue.changes import Changes
from trimaran.queue.groups import DONE, HELD, WAIT, Deadlines, Entry
from trimaran.queue.outcomes import ACK, RELEASED, UNSENT, Commit, DeadLetter, Retry
from trimaran.queue.work import LEFT_MAX, WorkGroup


def setup(n: int = 3, **policy: Any) -> tuple[Rooms, WorkGroup, Taker]:
    rooms = Rooms()
    state = rooms.queue(**policy)
    for i in range(n):
        rooms.append(state, f"m{i}".encode())
    group = state.groups["g"] = WorkGroup(state, "g", rooms)
    return rooms, group, Taker("c")


def take(group: WorkGroup, taker: Taker, now: int = 0) -> Any:
    """One delivery, committed (as the manager's dispatch does)."""
    ch = Changes()
    taken = group.take(taker.routing_filter, now, ch)
    assert taken is not None
    delivery = group.deliver(taker, taken[0], taken[1], now, ch)
    group.journal.submit(ch)
    return delivery


def settle(group: WorkGroup, offset: int, outcome: Any, taker: Taker | None, now: int = 0) -> bool:
    ch = Changes()
    ok = group.settle(offset, outcome, taker, None, now, ch)
    group.journal.submit(ch)
    return ok


def test_take_in_order_and_ack_removes_the_message() -> None:
    rooms, group, c = setup()
    d0, d1 = take(group, c), take(group, c)
    assert (d0.offset, d1.offset) == (0, 1)
    assert (d0.attempt, d0.redelivered, d0.message_id) == (1, False, "q:0")
    assert group.cursor == 2 and c.credit == 98
    assert group.entries[0].state == HELD and group.held() == 2
    assert settle(group, 0, ACK, c)
    assert 0 not in group.entries and 0 not in group.state.messages
    assert ("q", 0) not in rooms.journal.messages  # its row deleted in the same commit
    assert rooms.journal.kinds(0) == ["delivered", "acked"]
    assert group.state.stats["acked"] == 1
    assert rooms.journal.group_rows[("q", "g")]["cursor"] == 2


def test_only_the_holder_settles() -> None:
    _rooms, group, c = setup()
    take(group, c)
    assert not settle(group, 0, ACK, Taker("other"))
    assert not settle(group, 1, ACK, c)  # never delivered
    assert settle(group, 0, ACK, c)
    assert not settle(group, 0, ACK, c)  # settled already


def test_commit_settles_the_delivery_at_its_offset() -> None:
    _rooms, group, c = setup()
    take(group, c)
    take(group, c)
    assert settle(group, 0, Commit(1), c)
    assert group.entries[0].state == HELD and 1 not in group.entries


def test_retry_backs_off_then_dead_letters_after_max_attempts() -> None:
    rooms, group, c = setup(
        1, max_attempts=3, backoff_initial_s=1.0, backoff_multiplier=2.0, visibility_timeout_s=60
    )
    take(group, c, now=0)
    assert settle(group, 0, Retry(), c, now=100)
    entry = group.entries[0]
    assert (entry.state, entry.available_at, entry.reason) == (WAIT, 1100, "nack")
    assert group.next_due() == 1100 and 1100 in rooms.timers
    ch = Changes()
    assert not group.run_due(1099, ch) and group.take(None, 1099, ch) is None
    assert group.run_due(1100, ch) and group.ready == [0]
    d = take(group, c, now=1100)
    assert (d.attempt, d.redelivered, d.failed) == (2, True, 1)
    assert settle(group, 0, Retry(), c, now=1200)
    assert group.entries[0].available_at == 1200 + 2000  # the backoff doubles
    group.run_due(3200, Changes())
    take(group, c, now=3200)
    assert settle(group, 0, Retry(), c, now=3300)  # attempt 3 of 3: dead-lettered
    assert rooms.letters == [("q", "g", 0, 3, "max_attempts")]
    assert 0 not in group.entries and 0 not in group.state.messages
    nacks = [e["reason"] for e in rooms.journal.events if e["kind"] == "nacked"]
    assert nacks == ["delay_ms=1000", "delay_ms=2000", "max_attempts"]
    assert group.state.stats["dead_lettered"] == 1


def test_retry_with_a_delay_of_its_own() -> None:
    _rooms, group, c = setup(1, backoff_initial_s=5.0)
    take(group, c)
    assert settle(group, 0, Retry(0.25), c, now=10)
    assert group.entries[0].available_at == 260


def test_retry_now_is_ready_at_once() -> None:
    _rooms, group, c = setup(1)
    take(group, c)
    assert settle(group, 0, Retry(0.0), c)
    assert group.ready == [0]
    assert take(group, c).redelivered


def test_dead_letter_outcome() -> None:
    rooms, group, c = setup(2)
    take(group, c)
    assert settle(group, 0, DeadLetter("invalid"), c)
    assert rooms.letters == [("q", "g", 0, 1, "invalid")]
    rejected = [e for e in rooms.journal.events if e["kind"] == "rejected"]
    assert rejected[0]["reason"] == "invalid" and rejected[0]["consumer"] == "c"
    assert group.state.stats["rejected"] == 1 and 0 not in group.state.messages


def test_released_and_unsent_are_not_failed_attempts() -> None:
    rooms, group, c = setup(1, max_attempts=1)
    take(group, c)
    assert settle(group, 0, RELEASED, c)
    d = take(group, c)
    assert (d.attempt, d.redelivered, d.failed) == (2, True, 0)  # flagged, not counted
    assert settle(group, 0, UNSENT, c)
    d = take(group, c)
    assert (d.attempt, d.redelivered, d.failed) == (3, True, 0)
    assert rooms.letters == []
    released = [e["reason"] for e in rooms.journal.events if e["kind"] == "released"]
    assert released == ["released", "unsent"]


def test_unsent_first_delivery_is_not_flagged_redelivered() -> None:
    _rooms, group, c = setup(1)
    take(group, c)
    assert settle(group, 0, UNSENT, c)
    assert not take(group, c).redelivered


def test_visibility_timeout_brings_a_delivery_back() -> None:
    rooms, group, c = setup(1, visibility_timeout_s=1.0, max_attempts=2)
    take(group, c, now=0)
    assert rooms.timers == [1000] and group.next_due() == 1000
    ch = Changes()
    assert not group.run_due(999, ch)
    assert group.run_due(1000, ch)
    group.journal.submit(ch)
    assert group.entries[0].state == WAIT and group.entries[0].reason == "timeout"
    d = take(group, c, now=1000)
    assert (d.attempt, d.redelivered) == (2, True)
    ch = Changes()
    group.run_due(3000, ch)  # its second time-out: attempts exhausted
    assert rooms.letters == [("q", "g", 0, 2, "max_attempts")]


def test_deadlines_come_out_earliest_first_whatever_order_they_went_in() -> None:
    """In order they queue (the usual case); one earlier than the last (a shortened time-out)
    still comes out in time."""
    deadlines = Deadlines()
    for deadline, offset in ((100, 0), (200, 1), (150, 2), (300, 3), (120, 4)):
        deadlines.push(deadline, offset, 1)
    assert deadlines.first() == 100 and len(deadlines) == 5
    assert sorted(deadlines.pop_due(160)) == [(0, 1), (2, 1), (4, 1)]
    assert deadlines.first() == 200
    assert deadlines.pop_due(199) == []
    assert deadlines.pop_due(1000) == [(1, 1), (3, 1)] and deadlines.first() is None


def test_settled_deliveries_do_not_pile_up_in_the_time_outs() -> None:
    """Every delivery is timed; the items of settled ones are dropped once they outnumber the
    entries, so the time-outs hold about what is held, not everything delivered in the last
    time-out. A delivery still held keeps its time-out through it."""
    _rooms, group, c = setup(5000, visibility_timeout_s=30.0)
    take(group, c, now=0)  # offset 0 stays held
    for now in range(1, 5000):
        delivery = take(group, c, now=now)
        assert settle(group, delivery.offset, ACK, c, now=now)
    assert len(group.timeouts) <= 2 * len(group.entries) + 1025
    ch = Changes()
    assert group.run_due(30_000, ch)  # offset 0's time-out, kept through the compactions
    assert group.entries[0].state == WAIT and group.entries[0].reason == "timeout"


def test_a_late_settlement_of_a_timed_out_delivery_is_refused() -> None:
    _rooms, group, c = setup(1, visibility_timeout_s=1.0)
    take(group, c, now=0)
    group.run_due(1000, Changes())
    assert not settle(group, 0, ACK, c, now=1001)  # waiting, held by nobody


def test_cancel_hands_back_what_the_consumer_held() -> None:
    rooms, group, c = setup(2)
    other = Taker("other")
    take(group, c)
    take(group, other)
    ch = Changes()
    group.cancel(c, 5, ch)
    group.journal.submit(ch)
    assert group.entries[0].state == WAIT and group.ready == [0]
    assert group.entries[1].state == HELD
    assert [e["reason"] for e in rooms.journal.events if e["kind"] == "released"] == ["disconnect"]


def test_ack_out_of_order_ahead_of_the_cursor_keeps_a_done_marker() -> None:
    rooms, group, c = setup(3)
    state = group.state
    state.groups["other"] = WorkGroup(state, "other", rooms)  # still owes offset 1: it stays
    take(group, c)
    take(group, c)
    settle(group, 1, Retry(0.0), c)  # offset 1 waits; the cursor is past it
    group.cursor = 1  # as after a restart that loaded the group row short of it
    take(group, c)  # offset 1 again, from ready
    assert settle(group, 1, ACK, c)
    assert group.entries[1].state == DONE
    assert rooms.journal.pending_rows[("q", "g", 1)]["state"] == DONE
    ch = Changes()
    group.advance(2, ch)  # the cursor passes it: retired
    group.journal.submit(ch)
    assert 1 not in group.entries and ("q", "g", 1) not in rooms.journal.pending_rows
    assert 1 in state.messages


def test_a_message_acked_ahead_of_the_cursor_by_its_last_group_goes_at_once() -> None:
    rooms, group, c = setup(3)
    take(group, c)
    take(group, c)
    settle(group, 1, Retry(0.0), c)
    group.cursor = 1  # as after a restart that loaded the group row short of it
    take(group, c)
    assert settle(group, 1, ACK, c)
    assert 1 not in group.state.messages and 1 not in group.entries  # no marker left behind
    assert ("q", 1) not in rooms.journal.messages and ("q", "g", 1) not in rooms.journal.pending_rows
    assert take(group, c).offset == 2  # the cursor steps over the gap


def test_acks_behind_a_message_nobody_took_leave_nothing_stored() -> None:
    # Issue 42: a filtered consumer acks offsets 1 and 2 ahead of the cursor, the group's last: each
    # message goes at once; then offset 0 is taken and acked, and the cursor steps over the gap.
    rooms, group, _c = setup(0)
    state = group.state
    rooms.append(state, b"grasshopper", key="green")
    rooms.append(state, b"panda", key="red")
    rooms.append(state, b"squirrel", key="red")
    red, plain = Taker("red", routing_filter="red"), Taker("plain")
    assert [take(group, red).offset, take(group, red).offset] == [1, 2]
    assert settle(group, 1, ACK, red) and settle(group, 2, ACK, red)
    assert group.cursor == 0 and sorted(state.messages) == [0]  # gone at once, no marker left
    assert not rooms.journal.pending_rows
    assert take(group, plain).offset == 0
    assert group.cursor == 1 and sorted(state.messages) == [0]  # the gap is stepped over when met
    assert settle(group, 0, ACK, plain)
    assert not state.messages and not group.entries
    assert not rooms.journal.messages and not rooms.journal.pending_rows
    assert rooms.journal.group_rows[("q", "g")]["cursor"] == 1


def test_the_cursor_passing_done_markers_drops_what_every_group_finished() -> None:
    # The other half of issue 42: markers of one group that the other group finished meanwhile
    # (here: its messages left to it, then taken by it and acked) go when the cursor passes them.
    rooms, group, _c = setup(0)
    state = group.state
    other = state.groups["other"] = WorkGroup(state, "other", rooms)
    for key in ("green", "red", "red"):
        rooms.append(state, key.encode(), key=key)
    red, plain = Taker("red", routing_filter="red"), Taker("plain")
    for offset in (1, 2):
        assert take(group, red).offset == offset and settle(group, offset, ACK, red)
    assert group.entries[1].state == DONE  # 'other' still owes them
    mover = Taker("mover")
    for offset in range(3):
        assert take(other, mover).offset == offset and settle(other, offset, ACK, mover)
    assert sorted(state.messages) == [0]  # 1 and 2 finished by both: gone with their markers
    assert take(group, plain).offset == 0 and settle(group, 0, ACK, plain)
    assert not state.messages and not group.entries and not other.entries
    assert not rooms.journal.messages and not rooms.journal.pending_rows


def test_a_take_does_not_hand_out_a_done_marker_the_cursor_just_retired() -> None:
    # Found by the model (issue 42): the cursor stands on a gap (an expired message), the next
    # offset was auto-acked ahead of it and another group still owes it. Stepping over the gap
    # retired that marker; the scan went on at the marker's offset and delivered it a second time.
    rooms, group, _c = setup(3)
    state = group.state
    state.groups["other"] = WorkGroup(state, "other", rooms)
    state.remove(0)  # expired: a gap at the cursor
    group.entries[1] = Entry(DONE, attempts=1)
    assert take(group, Taker("c")).offset == 2
    assert group.cursor == 3 and 1 not in group.entries


def test_a_first_delivery_ahead_of_the_cursor_keeps_its_row() -> None:
    # Found by the model (issue 42): a group alone writes no row for a first delivery, as the load
    # reads a message below the cursor with none as held. Ahead of the cursor (a filter passed
    # over offset 0) it would read as never delivered, and come back unflagged after a restart.
    rooms, group, _c = setup(0)
    state = group.state
    rooms.append(state, b"green", key="green")
    rooms.append(state, b"red", key="red")
    assert take(group, Taker("red", routing_filter="red")).offset == 1
    assert group.cursor == 0 and rooms.journal.pending_rows[("q", "g", 1)]["state"] == HELD


def test_auto_ack_is_done_when_delivered() -> None:
    rooms, group, _c = setup(1)
    auto = Taker("a", auto_ack=True)
    take(group, auto)
    assert not group.entries and not group.state.messages
    assert rooms.journal.kinds(0) == ["delivered", "acked"]
    assert group.next_due() is None


def test_routing_filter_and_expiry() -> None:
    rooms, group, _c = setup(0)
    state = group.state
    rooms.append(state, b"a", key="eu/fr")
    rooms.append(state, b"b", key="us/ny")
    state.messages[0].expires_at = 10
    state.expiring += 1
    us = Taker("us", routing_filter="us/+")
    assert take(group, us, now=0).offset == 1
    ch = Changes()
    assert group.take("eu/#", 20, ch) is None  # expired on the way
    assert 0 not in state.messages


def test_in_memory_queue_journals_nothing() -> None:
    rooms = Rooms()
    state = rooms.queue(durable=False)
    rooms.append(state, b"x")
    group = state.groups["g"] = WorkGroup(state, "g", rooms)
    c = Taker("c")
    take(group, c)
    settle(group, 0, ACK, c)
    assert rooms.journal.events == [] and rooms.journal.pending_rows == {}


def test_unclaimed_publishes_past_left_max_are_kept_as_one_range() -> None:
    """Shared: a group whose consumer takes nothing while publishes flow leaves every publish
    unclaimed. Past ``LEFT_MAX`` it keeps only the first and last of the rest, and what it claimed
    past them still waits until a claim has seen past the last one."""
    _rooms, group, _c = setup(0)
    n = LEFT_MAX + 1000
    for offset in range(n):
        group.left_unclaimed(offset)
    assert len(group.left) == LEFT_MAX and group.left_beyond == (LEFT_MAX, n - 1)
    assert group.barrier == 0 and group.last_left() == n - 1
    assert group.passed(LEFT_MAX + 10, set())  # a claim saw into the range: what it took goes
    assert not group.left and group.left_beyond == (LEFT_MAX + 11, n - 1)
    assert group.barrier == LEFT_MAX + 11 and group.holding_back
    assert not group.passed(LEFT_MAX + 5, {n - 1})  # one taken inside the range says nothing
    assert group.passed(n - 1, set())
    assert not group.holding_back and group.last_left() == -1 and group.left_beyond is None
    group.left_unclaimed(n)  # one by one again
    assert list(group.left) == [n] and group.barrier == n
