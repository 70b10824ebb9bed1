"""StreamGroup in-process, with the memory journal: start positions, take, commit, settlement,
resume, retention."""

from __future__ import annotations

from typing import Any

import pytest

from tests.queue.conftest import Rooms, Taker
from trimaran.queue.changes import Changes
from trimaran.queue.outcomes import ACK, RELEASED, Commit, DeadLetter, Retry
from trimaran.queue.policy import QueueError
from trimaran.queue.stream import StreamGroup, position, retention


def setup(n: int = 5, **policy: Any) -> tuple[Rooms, StreamGroup, Taker]:
    rooms = Rooms()
    state = rooms.queue("s", mode="stream", **policy)
    for i in range(n):
        rooms.append(state, f"m{i}".encode(), at=1000 + 100 * i)
    group = state.groups["g"] = StreamGroup(state, "g", rooms)
    return rooms, group, Taker("c")


def read(group: StreamGroup, taker: Taker, now: int = 0) -> list[int]:
    """Everything the group hands ``taker`` now, committed."""
    ch = Changes()
    offsets = []
    while taker.credit > 0 and (stored := group.take(taker.routing_filter, now, ch)) is not None:
        offsets.append(group.deliver(taker, stored, now, ch).offset)
    group.journal.submit(ch)
    return offsets


def settle(group: StreamGroup, offset: int, outcome: Any) -> bool:
    ch = Changes()
    ok = group.settle(offset, outcome, None, "c", 0, ch)
    group.journal.submit(ch)
    return ok


def test_positions() -> None:
    _rooms, group, _c = setup()
    state = group.state
    assert position(state, "first") == 0
    assert position(state, "last") == 4
    assert position(state, "next") == 5
    assert position(state, "3") == position(state, 3) == 3
    assert position(state, -2) == 0
    assert position(state, "timestamp:1250") == 3  # the first published at or after
    assert position(state, "@1000") == 0
    assert position(state, "timestamp:9999") == 5
    with pytest.raises(QueueError):
        position(state, "middle")


def test_groups_read_the_whole_stream_independently() -> None:
    rooms, group, c = setup()
    other = StreamGroup(group.state, "h", rooms, cursor=3, committed=3)
    group.state.groups["h"] = other
    assert read(group, c) == [0, 1, 2, 3, 4]
    assert read(other, Taker("d")) == [3, 4]
    assert len(group.state.messages) == 5  # reading removes nothing
    assert read(group, c) == []


def test_credit_limits_a_read() -> None:
    _rooms, group, _c = setup()
    assert read(group, Taker("c", credit=2)) == [0, 1]
    assert group.cursor == 2 and group.committed == 0


def test_commit_moves_forward_only() -> None:
    rooms, group, c = setup()
    read(group, c)
    assert settle(group, 0, Commit(2))
    assert group.committed == 3
    assert rooms.journal.group_rows[("s", "g")]["committed"] == 3
    assert settle(group, 0, Commit(1))  # behind: nothing changes
    assert group.committed == 3
    committed = [e for e in rooms.journal.events if e["kind"] == "committed"]
    assert [(e["offset"], e["consumer"]) for e in committed] == [(2, "c")]


def test_ack_commits_past_the_delivery_and_a_failed_retry_is_refused() -> None:
    rooms, group, c = setup()
    read(group, c)
    assert settle(group, 1, ACK)
    assert group.committed == 2
    assert not settle(group, 2, Retry())
    assert group.cursor == 5
    assert settle(group, 2, RELEASED)  # handed back unprocessed: read again, nothing committed
    assert group.committed == 2 and group.cursor == 2
    assert read(group, Taker("c", credit=1)) == [2]
    assert settle(group, 2, ACK)
    assert group.committed == 3
    assert settle(group, 3, DeadLetter("bad"))
    assert group.committed == 4 and group.state.stats["rejected"] == 1
    assert rooms.letters == []  # a stream does not dead-letter
    assert rooms.journal.kinds(3) == ["delivered", "rejected", "committed"]


def test_auto_ack_commits_each_delivery() -> None:
    _rooms, group, _c = setup(3)
    read(group, Taker("a", auto_ack=True))
    assert group.committed == 3


def test_resume_reads_again_what_was_not_committed() -> None:
    _rooms, group, c = setup()
    read(group, c)
    settle(group, 1, Commit(1))
    group.resume(None)
    assert group.cursor == 2
    assert read(group, c) == [2, 3, 4]
    group.resume("first")
    assert read(group, c) == [0, 1, 2, 3, 4]
    assert group.lag() == 3


def test_retention_by_count_bytes_and_age() -> None:
    rooms, group, _c = setup(5, retention_count=3)
    state = group.state
    ch = Changes()
    retention(state, rooms, 0, ch)
    group.journal.submit(ch)
    assert list(state.messages) == [2, 3, 4] and state.stats["dropped"] == 2
    assert [e["reason"] for e in rooms.journal.events if e["kind"] == "dropped"] == ["retention_count"] * 2
    assert ("s", 0) not in rooms.journal.messages

    state.policy = state.policy.model_copy(update={"retention_count": None, "retention_bytes": 4})
    retention(state, rooms, 0, Changes())
    assert list(state.messages) == [3, 4]  # 2 bytes each

    state.policy = state.policy.model_copy(update={"retention_bytes": None, "retention_age_s": 1.0})
    retention(state, rooms, 2350, Changes())  # offset 3 was published at 1300, offset 4 at 1400
    assert list(state.messages) == [4]
    assert read(group, Taker("late")) == [4]  # a reader behind the retention starts at the head


def test_retention_without_limits_keeps_everything() -> None:
    rooms, group, _c = setup(3)
    retention(group.state, rooms, 10**12, Changes())
    assert len(group.state.messages) == 3
