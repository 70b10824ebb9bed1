"""The journal: state changes become rows and events, committed together, with one Receipt."""

from __future__ import annotations

import pytest

from tests.queue.conftest import Collector, Factory, Rooms, Taker, wait_until
from trimaran.broker.message import Message
from trimaran.queue import QueueError, Receipt, committed
from trimaran.queue.changes import Changes
from trimaran.queue.groups import HELD, Entry
from trimaran.queue.journal import Journal, MemoryJournal
from trimaran.queue.outcomes import ACK, Retry
from trimaran.queue.work import WorkGroup
from trimaran.storage import queue_store, rows
from trimaran.storage.rows import WriteBatch
from trimaran.storage.store import Storage
from trimaran.storage.writer import GroupCommitWriter

pytestmark = pytest.mark.anyio


def test_rows_of_a_delivery() -> None:
    rooms = Rooms()
    state = rooms.queue()
    rooms.append(state, b"x")
    group = WorkGroup(state, "g", rooms)
    journal = rooms.journal
    ch = Changes()
    entry = Entry(HELD, attempts=1, consumer_id="c", delivered_at=5)
    journal.pending(ch, state, group, 0, entry)
    journal.event(ch, state, 5, "delivered", group=group, offset=0, consumer="c", attempt=1, reason="first")
    journal.submit(ch)
    assert journal.pending_rows[("q", "g", 0)] == {
        "queue": "q", "group": "g", "offset": 0, "state": HELD, "consumer": "c", "node": "local",
        "delivered_at": 5, "attempts": 1, "available_at": None, "lease_until": None, "reason": None,
        "unsent": 0, "returned": 0,
    }  # fmt: skip
    row = rows.event_row(
        5, "q", "delivered", group="g", offset=0, consumer="c", node="local", attempt=1, reason="first"
    )
    assert row["span"] == 1
    assert journal.events[-1] == {key: value for key, value in row.items() if key != "span"}
    ch = Changes()
    journal.pending_gone(ch, state, group, 0, entry)
    journal.submit(ch)
    assert ("q", "g", 0) not in journal.pending_rows


def test_a_changes_neighbouring_events_share_one_spanning_event() -> None:
    """A dispatch's deliveries (and a multiple ack's acks) to one consumer at one moment are one
    event spanning their offsets; anything that differs starts a new one. Read back, there is one
    event per offset, in order."""
    rooms = Rooms()
    state = rooms.queue()
    group = WorkGroup(state, "g", rooms)
    journal = rooms.journal
    ch = Changes()
    for offset in range(3, 8):
        journal.event(ch, state, 5, "delivered", group=group, offset=offset, consumer="c", attempt=1,
                      reason="first")  # fmt: skip
    journal.event(ch, state, 5, "delivered", group=group, offset=8, consumer="c", attempt=2, reason="nack")
    journal.event(ch, state, 6, "delivered", group=group, offset=9, consumer="c", attempt=1, reason="first")
    journal.event(ch, state, 6, "delivered", group=group, offset=11, consumer="c", attempt=1, reason="first")
    assert [(e["offset"], e.get("span", 1)) for e in ch.events] == [(3, 5), (8, 1), (9, 1), (11, 1)]
    journal.submit(ch)
    assert [(e["offset"], e["attempt"]) for e in journal.events] == [
        (3, 1), (4, 1), (5, 1), (6, 1), (7, 1), (8, 2), (9, 1), (11, 1),
    ]  # fmt: skip
    assert all("span" not in e for e in journal.events)


def test_an_in_memory_queue_writes_nothing_and_after_runs_at_once() -> None:
    rooms = Rooms()
    state = rooms.queue(durable=False)
    group = WorkGroup(state, "g", rooms)
    ch = Changes()
    rooms.journal.event(ch, state, 0, "published", offset=0)
    rooms.journal.cursor(ch, state, group)
    ran: list[str] = []
    ch.then(lambda: ran.append("after"))
    assert ch.empty()
    commits = rooms.journal.commits
    assert rooms.journal.submit(ch) is None  # nothing to wait for
    assert ran == ["after"] and rooms.journal.commits == commits


def test_shared_journal_leases_held_entries_and_leaves_cursors_to_claims() -> None:
    journal = MemoryJournal("node-a", shared=True)
    rooms = Rooms()
    rooms.journal = journal
    state = rooms.queue()
    group = WorkGroup(state, "g", rooms, shared=True)
    ch = Changes()
    journal.pending(ch, state, group, 0, Entry(HELD, attempts=1, consumer_id="c"))
    journal.cursor(ch, state, group)
    journal.submit(ch)
    row = journal.pending_rows[("q", "g", 0)]
    assert row["node"] == "node-a" and row["lease_until"] is not None
    assert journal.group_rows == {}


async def test_committed_waits_and_turns_a_failed_write_into_a_queue_error() -> None:
    await committed(None)
    done = Receipt(WriteBatch(), None, None)
    done.done = True
    await committed(done)
    done.error = RuntimeError("disk on fire")
    with pytest.raises(QueueError) as refused:
        await committed(done)
    assert refused.value.reason == "storage"


async def test_a_work_group_over_the_real_journal(storage_url: str) -> None:
    """The same changes through the group-commit writer land as the rows the audit replays."""
    storage = Storage.from_url(storage_url, sqlite_synchronous="normal")
    storage.migrate()
    writer = GroupCommitWriter(storage.engine)
    writer.start()
    try:
        rooms = Rooms()
        journal = rooms.journal = Journal(writer, "local")
        state = rooms.queue("jq", max_attempts=5, backoff_initial_s=1.0)
        declared = Changes()
        journal.declared(declared, state)
        await journal.write(declared)
        for payload in (b"a", b"b"):
            stored = rooms.append(state, payload)
            assert stored is not None
        await journal.write(WriteBatch())  # the appends' commits are in
        group = state.groups["$default"] = WorkGroup(state, "$default", rooms)
        c = Taker("c")
        ch = Changes()
        for _ in range(2):
            taken = group.take(None, 0, ch)
            assert taken is not None
            group.deliver(c, taken[0], taken[1], 0, ch)
        await committed(journal.submit(ch, wait=True))
        ch = Changes()
        assert group.settle(0, ACK, c, None, 10, ch)
        assert group.settle(1, Retry(), c, None, 10, ch)
        await committed(journal.submit(ch, wait=True))
        engine = storage.engine
        assert queue_store.stored_offsets(engine, "jq") == [1]
        assert [e["kind"] for e in queue_store.events_for(engine, "jq", 0)] == ["delivered", "acked"]
        nacked = [e for e in queue_store.events_for(engine, "jq", 1) if e["kind"] == "nacked"]
        assert nacked[0]["reason"] == "delay_ms=1000"
        (pending,) = queue_store.pending_rows(engine, "jq")
        assert (pending["offset"], pending["state"], pending["available_at"]) == (1, "wait", 1010)
    finally:
        await writer.stop()
        storage.close()


async def test_a_turn_refused_while_the_database_is_away_still_writes_its_acks(make_manager: Factory) -> None:
    """While the database is away a turn's publishes are refused at once (each publisher hears
    it, no consumer gets them, none of their rows is written), and the holders' acks the same turn
    carried are written all the same: the consumer's ack was taken, and the table must say so."""
    manager = make_manager()
    async with manager.running():
        c = Collector("c")
        handle = manager.consume("q", c)
        handle.add_credit(10)
        await manager.publish("q", Message(topic="$queue/q", payload=b"a", qos=1))
        await wait_until(lambda: len(c.deliveries) == 1)
        writer = manager.writer
        heard: list[QueueError | None] = []
        writer.availability.reason, writer.away = "connection refused", True  # as failed writes find it
        try:
            assert handle.settle_all_nowait([0], ACK) == 1  # a holder's ack: into the turn
            manager.publish_nowait("q", Message(topic="$queue/q", payload=b"b", qos=1),
                                   done=lambda _result, error: heard.append(error))  # fmt: skip
            await wait_until(lambda: bool(heard))
        finally:
            writer.away = False
        assert heard[0] is not None and heard[0].reason == "storage" and "connection refused" in str(heard[0])
        await manager.publish("q", Message(topic="$queue/q", payload=b"c", qos=1))
        await wait_until(lambda: len(c.deliveries) == 2)
        assert [d.message.payload for d in c.deliveries] == [b"a", b"c"]
        engine = manager.storage.engine
        assert [e["kind"] for e in queue_store.events_for(engine, "q", 0)] == [
            "published",
            "delivered",
            "acked",
        ]
        assert queue_store.events_for(engine, "q", 1) == []
        assert queue_store.stored_offsets(engine, "q") == [2]
