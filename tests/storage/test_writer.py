"""The group-commit writer keeps submission order when it merges submissions into one transaction."""

from __future__ import annotations

import asyncio
import os
import sys
import threading
import time

import pytest
from sqlalchemy import Connection, select

from trimaran.broker.message import Message
from trimaran.storage import queue_store, rows
from trimaran.storage import writer as writer_module
from trimaran.storage.rows import WriteBatch
from trimaran.storage.schema import queue_events
from trimaran.storage.store import Storage
from trimaran.storage.writer import GroupCommitWriter, Receipt


def _rows(queue: str, offset: int) -> WriteBatch:
    """What a publish and its delivery write: the message, its pending row, the group row."""
    batch = WriteBatch()
    batch.messages.append(rows.MessageRow(queue, offset, Message("t", b"x", qos=1), "", 1, None))
    batch.pending[(queue, "$default", offset)] = {
        "queue": queue, "group": "$default", "offset": offset, "state": "held", "consumer": "c1",
        "node": "n", "delivered_at": 1, "attempts": 1, "available_at": None, "lease_until": None,
        "reason": None, "unsent": 0, "returned": 0,
    }  # fmt: skip
    batch.groups[(queue, "$default")] = {
        "queue": queue, "group": "$default", "cursor": offset + 1, "committed": 0, "updated_at": 1,
    }  # fmt: skip
    return batch


def test_delete_and_purge_merged_behind_rows_remove_those_rows(storage_url: str) -> None:
    """A queue delete (or purge) gathered into the same transaction as earlier rows of that queue
    must run after them: before the fix its call ran first and the rows outlived it."""
    storage = Storage.from_url(storage_url)
    storage.migrate()
    try:
        writer = GroupCommitWriter(storage.engine, commit_interval_ms=300)  # gathers all of them

        async def scenario() -> None:
            writer.start()
            try:
                for name in ("gone", "purged"):
                    declare = WriteBatch(calls=[queue_store.upsert_queue(name, "work", {}, 1)])
                    await writer.write(declare)
                tickets = [
                    writer.submit(_rows("gone", 0)),
                    writer.submit(WriteBatch(calls=[queue_store.delete_queue("gone")])),
                    writer.submit(_rows("purged", 0)),
                    writer.submit(WriteBatch(calls=[queue_store.purge_queue("purged")]), wait=True),
                    writer.submit(_rows("purged", 1), wait=True),
                ]
                assert await tickets[3].wait() == [1]  # the purge saw the message written before it
                await tickets[4].wait()
            finally:
                await writer.stop()

        asyncio.run(scenario())
        assert writer.transactions == 3  # the two declares, then the five submissions together
        assert queue_store.pending_rows(storage.engine, "gone") == []
        assert queue_store.stored_offsets(storage.engine, "gone") == []
        assert queue_store.stored_offsets(storage.engine, "purged") == [1]
        assert [r["offset"] for r in queue_store.pending_rows(storage.engine, "purged")] == [1]
    finally:
        storage.close()


def test_idle_writer_commits_a_lone_message_at_once(storage_url: str) -> None:
    """No fixed gather wait: a lone message's commit does not wait commit_interval_ms (300 ms here,
    which only applies between back-to-back commits)."""
    storage = Storage.from_url(storage_url)
    storage.migrate()
    try:
        writer = GroupCommitWriter(storage.engine, commit_interval_ms=300)
        spent: list[float] = []

        async def scenario() -> None:
            writer.start()
            try:
                await writer.write(WriteBatch(calls=[queue_store.upsert_queue("lone", "work", {}, 1)]))
                for offset in range(3):
                    await asyncio.sleep(0.05)  # the writer is idle again
                    started = time.perf_counter()
                    await writer.write(_rows("lone", offset))
                    spent.append(time.perf_counter() - started)
            finally:
                await writer.stop()

        asyncio.run(scenario())
        assert max(spent) < 0.15, spent
        assert queue_store.stored_offsets(storage.engine, "lone") == [0, 1, 2]
    finally:
        storage.close()


def test_batch_gathers_while_a_commit_is_in_flight(storage_url: str) -> None:
    """Submissions made while the writer is busy go out together in the next transaction."""
    storage = Storage.from_url(storage_url)
    storage.migrate()
    try:
        writer = GroupCommitWriter(storage.engine)
        gate = threading.Event()

        def slow(_connection: Connection) -> None:
            gate.wait(5)  # a commit in flight, as long as the test wants

        async def scenario() -> None:
            writer.start()
            try:
                await writer.write(WriteBatch(calls=[queue_store.upsert_queue("busy", "work", {}, 1)]))
                first = writer.submit(WriteBatch(calls=[slow]), wait=True)
                await asyncio.sleep(0.05)  # the writer has taken it and is blocked inside
                tickets = [writer.submit(_rows("busy", offset), wait=True) for offset in range(50)]
                before = writer.transactions
                gate.set()
                await first.wait()
                for ticket in tickets:
                    await ticket.wait()
                assert writer.transactions - before == 2  # the slow one, then all fifty together
            finally:
                await writer.stop()

        asyncio.run(scenario())
        assert queue_store.stored_offsets(storage.engine, "busy") == list(range(50))
    finally:
        storage.close()


def _settled_in_one_batch() -> WriteBatch:
    """Offsets 1 and 2 appended; 1 (new) and 0 (from an earlier commit) deleted, with their events."""
    batch = WriteBatch()
    for offset in (1, 2):
        batch.messages.append(rows.MessageRow("short", offset, Message("t", b"x", qos=1), "", 1, None))
        batch.events.append(rows.event_row(1, "short", "published", offset=offset))
    batch.message_deletes += [("short", 0), ("short", 1)]
    batch.pending[("short", "$default", 0)] = None
    batch.pending[("short", "$default", 1)] = None  # delivered and acked within this batch too
    batch.events.append(rows.event_row(1, "short", "acked", offset=1))
    return batch


def test_message_appended_and_deleted_in_one_transaction_writes_no_row(storage_url: str) -> None:
    """Published and settled within one commit: the message row is neither inserted nor deleted; a
    delete of a row from an earlier transaction still runs, and the events are all kept."""
    applied = writer_module._merged([Receipt(_settled_in_one_batch(), None, None)])
    assert [m.offset for m in applied.messages] == [2]
    assert applied.message_deletes == [("short", 0)]
    # offset 1 was first written here: it has no pending row to delete; offset 0's is deleted
    assert applied.pending == {("short", "$default", 0): None}
    assert len(applied.events) == 3
    storage = Storage.from_url(storage_url)
    storage.migrate()
    try:
        _written(storage, [
            WriteBatch(calls=[queue_store.upsert_queue("short", "work", {}, 1)]),
            _rows("short", 0),
            _settled_in_one_batch(),
        ])  # fmt: skip
        assert queue_store.stored_offsets(storage.engine, "short") == [2]
        events = queue_store.events_for(storage.engine, "short")
        assert [(e["kind"], e["offset"]) for e in events] == [
            ("published", 1), ("published", 2), ("acked", 1),
        ]  # fmt: skip
        with storage.engine.connect() as connection:
            written = connection.execute(
                select(queue_events.c.kind, queue_events.c.offset, queue_events.c.span)
                .where(queue_events.c.queue == "short")
                .order_by(queue_events.c.id)
            ).all()
        assert [tuple(r) for r in written] == [("published", 1, 2), ("acked", 1, 1)]  # neighbours joined
    finally:
        storage.close()


def test_a_batch_submitted_ahead_does_not_keep_a_publish_from_its_ack() -> None:
    """A batch whose calls may run ahead of earlier rows (an offset reservation) joins the run of
    the submissions around it, so a message published before it and deleted after it is never
    written; a batch with other calls still starts a run of its own, ahead or behind nothing."""

    def receipt(batch: WriteBatch, *, ahead: bool = False) -> Receipt:
        made = Receipt(batch, None, None)
        made.ahead = ahead
        return made

    published = _rows("q", 0)
    acked = WriteBatch(message_deletes=[("q", 0)], pending={("q", "$default", 0): None})
    reserve = receipt(WriteBatch(calls=[queue_store.reserve_offsets("q", 100)]), ahead=True)
    purge = receipt(WriteBatch(calls=[queue_store.purge_queue("q")]))
    later = receipt(_rows("q", 1))
    receipts = [receipt(published), reserve, receipt(acked), purge, later]
    runs = writer_module._runs(receipts)
    assert runs == [receipts[:3], receipts[3:]]
    merged = writer_module._merged(runs[0])
    assert merged.messages == [] and merged.message_deletes == []
    assert len(merged.calls) == 1  # the reservation, run first
    # without ``ahead`` the same reservation splits them, and both rows are written
    reserve.ahead = False
    assert [len(run) for run in writer_module._runs(receipts)] == [1, 2, 2]


def _written(storage: Storage, batches: list[WriteBatch]) -> None:
    """Each batch committed in turn, by a writer started before and stopped after them."""
    writer = GroupCommitWriter(storage.engine)

    async def scenario() -> None:
        writer.start()
        try:
            for batch in batches:
                await writer.write(batch)
        finally:
            await writer.stop()

    asyncio.run(scenario())


def test_batches_larger_than_one_statement_write_every_row(storage_url: str) -> None:
    """SQLite writes up to 999 parameters a statement and the rest row by row: 1,100 messages (12
    statements of 90 rows and 20 rows one by one), their pending rows and 3,300 events land whole;
    deleting 1,000 (messages: 2 statements of 499 keys and a tail of 2; pending: 3 of 333 and 1)
    removes exactly those, and deleting the last 100 (all tail) leaves nothing."""
    storage = Storage.from_url(storage_url)
    storage.migrate()
    try:
        writer = GroupCommitWriter(storage.engine)
        offsets = range(1100)

        def written() -> WriteBatch:
            batch = WriteBatch.joined([_rows("big", offset) for offset in offsets])
            for offset in offsets:
                for kind in ("published", "delivered", "acked"):
                    batch.events.append(rows.event_row(1, "big", kind, offset=offset))
            return batch

        def deleted(which: range) -> WriteBatch:
            batch = WriteBatch()
            for offset in which:
                batch.message_deletes.append(("big", offset))
                batch.pending[("big", "$default", offset)] = None
            return batch

        async def scenario() -> None:
            writer.start()
            try:
                await writer.write(WriteBatch(calls=[queue_store.upsert_queue("big", "work", {}, 1)]))
                await writer.write(written())
                assert queue_store.stored_offsets(storage.engine, "big") == list(offsets)
                assert len(queue_store.pending_rows(storage.engine, "big")) == 1100
                assert queue_store.count_events(storage.engine, "big") == {
                    "published": 1100, "delivered": 1100, "acked": 1100,
                }  # fmt: skip
                await writer.write(deleted(range(1000)))
                assert queue_store.stored_offsets(storage.engine, "big") == list(range(1000, 1100))
                left = [row["offset"] for row in queue_store.pending_rows(storage.engine, "big")]
                assert left == list(range(1000, 1100))
                await writer.write(deleted(range(1000, 1100)))
            finally:
                await writer.stop()

        asyncio.run(scenario())
        assert queue_store.stored_offsets(storage.engine, "big") == []
        assert queue_store.pending_rows(storage.engine, "big") == []
    finally:
        storage.close()


def test_deletes_of_runs_and_scattered_offsets_remove_exactly_those(storage_url: str) -> None:
    """PostgreSQL deletes a run of consecutive offsets by its bounds and the rest by arrays in
    chunks: a long run, a run one short of the threshold, one at it, 70 scattered offsets (two
    chunks) and a repeated key remove exactly those messages and pending rows, on either database."""
    storage = Storage.from_url(storage_url)
    storage.migrate()
    gone = [*range(0, 50), *range(50, 260, 3), *range(260, 267), *range(270, 278), 5, 290]
    try:
        batch = WriteBatch()
        for offset in gone:
            batch.message_deletes.append(("mixed", offset))
            batch.pending[("mixed", "$default", offset)] = None
        _written(storage, [
            WriteBatch(calls=[queue_store.upsert_queue("mixed", "work", {}, 1)]),
            WriteBatch.joined([_rows("mixed", offset) for offset in range(300)]),
            batch,
        ])  # fmt: skip
        kept = sorted(set(range(300)) - set(gone))
        assert queue_store.stored_offsets(storage.engine, "mixed") == kept
        assert [row["offset"] for row in queue_store.pending_rows(storage.engine, "mixed")] == kept
    finally:
        storage.close()


def test_what_a_group_alone_finished_goes_unless_another_group_exists(storage_url: str) -> None:
    """Shared mode: a group that believed itself the queue's only one finishes messages. With no
    other group in the database the messages and their rows go; once another node made a group,
    the same commit keeps the messages and marks the rows 'done' for the compaction."""
    storage = Storage.from_url(storage_url)
    storage.migrate()
    try:
        batches = []
        for queue in ("one", "two"):
            batches.append(WriteBatch(calls=[queue_store.upsert_queue(queue, "work", {}, 1)]))
            batches.append(WriteBatch.joined([_rows(queue, offset) for offset in range(20)]))
        other = WriteBatch()
        other.groups[("two", "elsewhere")] = {
            "queue": "two", "group": "elsewhere", "cursor": 0, "committed": 0, "updated_at": 1,
        }  # fmt: skip
        finished = WriteBatch()
        for queue in ("one", "two"):
            finished.finished_alone[(queue, "$default")] = [*range(0, 12), 15, 20]
            for offset in finished.finished_alone[(queue, "$default")]:  # their rows go (pending_gone)
                finished.pending[(queue, "$default", offset)] = None
        # written and finished in the same commit: written only where another group is
        finished = WriteBatch.joined([_rows("one", 20), _rows("two", 20), finished])
        _written(storage, [*batches, other, finished])
        kept = [*range(12, 15), *range(16, 20)]
        assert queue_store.stored_offsets(storage.engine, "one") == kept
        assert [row["offset"] for row in queue_store.pending_rows(storage.engine, "one")] == kept
        assert queue_store.stored_offsets(storage.engine, "two") == list(range(21))
        states = {row["offset"]: row["state"] for row in queue_store.pending_rows(storage.engine, "two")}
        assert {o for o, state in states.items() if state == "done"} == {*range(0, 12), 15, 20}
    finally:
        storage.close()


def test_offsets_held_as_published_are_stored_as_spans(storage_url: str) -> None:
    """Shared mode: the offsets a node claims as it publishes them go as one span a run of
    consecutive offsets and lease, and none for a run whose messages the same commit writes and
    finishes alone (never stored)."""
    storage = Storage.from_url(storage_url)
    storage.migrate()
    try:
        setup = WriteBatch(calls=[queue_store.upsert_queue("q", "work", {}, 1)])
        held = WriteBatch()
        held.held[("q", "g", "n", 100)] = [7, 3, 4, 5, 9, 10]
        held.held[("q", "g", "n", 200)] = [11]
        for offset in (3, 4, 5, 7, 9, 10, 11, 20, 21):
            held.messages.append(rows.MessageRow("q", offset, Message("t", b"x", qos=1), "", 1, None))
        alone = WriteBatch()
        alone.held[("q", "g", "n", 200)] = [20, 21]
        alone.finished_alone[("q", "g")] = [20, 21]
        _written(storage, [setup, WriteBatch.joined([held, alone])])
        spans = [
            (r["first_offset"], r["last_offset"], r["lease_until"])
            for r in queue_store.span_rows(storage.engine, "q")
        ]
        expected = [(3, 5, 100), (7, 7, 100), (9, 10, 100), (11, 11, 200)]
        if storage.engine.dialect.name == "sqlite":  # writes and deletes them: their span waits for
            expected.append((20, 21, 200))  # the renewal (shared mode runs on PostgreSQL only)
        assert spans == expected
        assert queue_store.stored_offsets(storage.engine, "q") == [3, 4, 5, 7, 9, 10, 11]
    finally:
        storage.close()


def _event(offset: int | None, kind: str = "delivered", *, time: int = 5, consumer: str = "c1") -> dict:
    return rows.event_row(time, "q", kind, group="g", offset=offset, consumer=consumer, attempt=1)


def test_spanning_rows_read_back_one_event_per_offset(storage_url: str) -> None:
    """events_for and count_events see every event a row spans, and a lookup by offset finds an
    offset inside a span."""
    storage = Storage.from_url(storage_url)
    storage.migrate()
    try:
        writer = GroupCommitWriter(storage.engine)
        batch = WriteBatch(events=[_event(o) for o in range(100, 400)] + [_event(250, "acked")])

        async def scenario() -> None:
            writer.start()
            try:
                await writer.write(batch)
            finally:
                await writer.stop()

        asyncio.run(scenario())
        with storage.engine.connect() as connection:
            assert connection.execute(select(queue_events.c.id)).all().__len__() == 2
        assert queue_store.count_events(storage.engine, "q") == {"delivered": 300, "acked": 1}
        assert [e["kind"] for e in queue_store.events_for(storage.engine, "q", 250)] == ["delivered", "acked"]
        assert [e["offset"] for e in queue_store.events_for(storage.engine, "q", 399)] == [399]
        assert queue_store.events_for(storage.engine, "q", 400) == []
        assert [e["offset"] for e in queue_store.events_for(storage.engine, "q")][:3] == [100, 101, 102]
    finally:
        storage.close()


def test_a_transient_message_row_is_never_built() -> None:
    """The message row (its properties JSON above all) is built by the writer, and only for a
    message that is written: not on the event loop, and not for one settled within its commit.
    The settled one's properties cannot be written as JSON: building its row would raise."""
    batch = _settled_in_one_batch()
    batch.messages[0].message = Message("settled", b"x", qos=1, extra={"unwritable": object()})
    batch.messages[1].message = Message("kept", b"x", qos=1)
    with pytest.raises(TypeError):
        batch.messages[0].values()
    applied = writer_module._merged([Receipt(batch, None, None)])
    tuples = writer_module._message_tuples(applied)
    assert [dict(zip(rows.MESSAGE_COLUMNS, row, strict=True)) for row in tuples] == [
        applied.messages[0].row()
    ]
    assert tuples[0][2] == "kept"


@pytest.mark.skipif(
    not hasattr(os, "getpriority") or sys.platform != "linux", reason="per-thread nice is Linux's"
)
def test_the_writer_thread_runs_nicer_than_the_loop(storage_url: str) -> None:
    """A commit must not hold up the loop on a shared core: the writer's nice value is the loop's
    plus WRITER_NICE (at most 19), the loop's own is untouched."""
    storage = Storage.from_url(storage_url)
    storage.migrate()
    loop_nice = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    try:
        writer = GroupCommitWriter(storage.engine)
        seen: list[int] = []

        async def scenario() -> None:
            writer.start()
            try:
                await writer.write(WriteBatch(calls=[queue_store.upsert_queue("nice", "work", {}, 1)]))
                thread = writer._thread
                assert thread is not None and thread.native_id is not None
                seen.append(os.getpriority(os.PRIO_PROCESS, thread.native_id))
            finally:
                await writer.stop()

        asyncio.run(scenario())
        assert seen == [min(19, loop_nice + writer_module.WRITER_NICE)]
        assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == loop_nice
    finally:
        storage.close()
