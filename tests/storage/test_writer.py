"""The group-commit writer keeps submission order when it merges submissions into one transaction."""

from __future__ import annotations

import asyncio

from trimaran.broker.message import Message
from trimaran.storage import queue_store
from trimaran.storage.store import Storage
from trimaran.storage.writer import GroupCommitWriter, WriteBatch


def _rows(queue: str, offset: int) -> WriteBatch:
    """What a publish and its delivery write: the message, its pending row, the group row."""
    batch = WriteBatch()
    batch.messages.append(queue_store.message_row(queue, offset, Message("t", b"x", qos=1), "", 1, None))
    batch.pending[(queue, "$default", offset)] = {
        "queue": queue, "group": "$default", "offset": offset, "state": "held", "consumer": "c1",
        "node": "n", "delivered_at": 1, "attempts": 1, "available_at": None, "lease_until": None,
        "reason": None,
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
