"""Dead letters and redrives that cross durability: an in-memory queue's dead letter in a durable
dead-letter queue is written (row, event) and survives a restart; the batches that carry it hold
rows of durable queues only."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import pytest

from tests.queue.conftest import Collector, Factory, wait_until
from trimaran.broker.message import Message
from trimaran.config import QueuePolicySettings
from trimaran.queue import QueueManager, reject_by_id
from trimaran.queue.control import settle_by_id_now
from trimaran.queue.manager import ConsumerHandle
from trimaran.queue.outcomes import DeadLetter
from trimaran.storage import queue_store
from trimaran.storage.rows import WriteBatch

pytestmark = pytest.mark.anyio

DLQ = "dead"


def msg(payload: bytes, topic: str = "$queue/tmp") -> Message:
    return Message(topic=topic, payload=payload, qos=1)


def batch_queues(batch: WriteBatch) -> set[str]:
    """Every queue a batch has rows for (``calls`` are opaque and not counted)."""
    names = {m.queue for m in batch.messages}
    names |= {queue for queue, _ in batch.message_deletes}
    names |= {key[0] for key in batch.pending}
    names |= {key[0] for key in batch.groups}
    names |= set(batch.queue_next)
    names |= {row["queue"] for row in batch.events}
    return names


def record_batches(manager: QueueManager) -> list[WriteBatch]:
    """Every batch handed to the writer from now on."""
    seen: list[WriteBatch] = []
    submit = manager.writer.submit

    def recording(batch: WriteBatch, *args: Any, **kwargs: Any) -> Any:
        seen.append(batch)
        return submit(batch, *args, **kwargs)

    manager.writer.submit = recording  # type: ignore[method-assign]
    return seen


async def setup(manager: QueueManager, **policy: Any) -> tuple[ConsumerHandle, Collector]:
    """A durable DLQ ``dead``; an in-memory queue ``tmp`` dead-lettering into it, with one delivery
    held by a consumer."""
    await manager.declare(DLQ)
    await manager.declare("tmp", QueuePolicySettings(dead_letter=DLQ, **policy), durable=False)
    c = Collector("c")
    h = manager.consume("tmp", c)
    h.add_credit(10)
    await manager.publish("tmp", msg(b"poison"))
    await wait_until(lambda: len(c.deliveries) == 1)
    return h, c


async def assert_survives_restart(make_manager: Factory, reason: str) -> None:
    """After a restart the durable DLQ still holds the dead letter, with its published event."""
    manager = make_manager()
    async with manager.running():
        assert not manager.exists("tmp")
        assert manager.info(DLQ).depth == 1
        d = Collector("d")
        hd = manager.consume(DLQ, d)
        hd.add_credit(1)
        await wait_until(lambda: len(d.deliveries) == 1)
        letter = d.deliveries[0].message
        assert letter.payload == b"poison"
        props = dict(letter.user_properties)
        assert props["x-dead-letter-queue"] == "tmp"
        assert props["x-dead-letter-reason"] == reason
        assert await hd.ack(0)
    engine = manager.storage.engine
    published = [e for e in queue_store.events_for(engine, DLQ, 0) if e["kind"] == "published"]
    assert len(published) == 1 and published[0]["reason"] == "dead_letter from tmp:0"
    assert queue_store.count_events(engine, "tmp") == {}  # an in-memory queue keeps no events
    assert queue_store.pending_rows(engine, "tmp") == []


Settle = Callable[[QueueManager, ConsumerHandle], Awaitable[None]]


async def reject_awaited(manager: QueueManager, h: ConsumerHandle) -> None:
    assert await h.reject(0, "invalid")


async def reject_nowait(manager: QueueManager, h: ConsumerHandle) -> None:
    assert h.reject_nowait(0, "invalid")
    await wait_until(lambda: manager.info(DLQ).depth == 1)  # in memory after the commit only


async def reject_by_message_id(manager: QueueManager, h: ConsumerHandle) -> None:
    assert await reject_by_id(manager, "tmp:0", reason="invalid")


async def reject_by_id_now(manager: QueueManager, h: ConsumerHandle) -> None:
    ok, ticket = settle_by_id_now(manager, DeadLetter("invalid"), "tmp:0")
    assert ok and ticket is not None  # something durable to wait for
    await ticket.wait()


@pytest.mark.parametrize("settle", [reject_awaited, reject_nowait, reject_by_message_id, reject_by_id_now])
async def test_in_memory_queue_rejects_into_a_durable_dlq(make_manager: Factory, settle: Settle) -> None:
    manager = make_manager()
    async with manager.running():
        h, _ = await setup(manager)
        batches = record_batches(manager)
        await settle(manager, h)
        assert manager.info(DLQ).depth == 1
        assert queue_store.stored_offsets(manager.storage.engine, DLQ) == [0]  # committed already
        assert manager.info("tmp").depth == 0
    assert batches and all(batch_queues(b) <= {DLQ} for b in batches)
    await assert_survives_restart(make_manager, "invalid")


async def test_nack_at_max_attempts_into_a_durable_dlq(make_manager: Factory) -> None:
    manager = make_manager()
    async with manager.running():
        h, c = await setup(manager, max_attempts=2, backoff_initial_s=0)
        assert await h.nack(0)
        await wait_until(lambda: len(c.deliveries) == 2)
        batches = record_batches(manager)
        assert await h.nack(0)  # attempt 2 of 2
        assert queue_store.stored_offsets(manager.storage.engine, DLQ) == [0]
    assert all(batch_queues(b) <= {DLQ} for b in batches)
    await assert_survives_restart(make_manager, "max_attempts")


async def test_visibility_timeout_at_max_attempts_into_a_durable_dlq(make_manager: Factory) -> None:
    manager = make_manager()
    async with manager.running():
        await setup(manager, max_attempts=1, visibility_timeout_s=0.05)
        batches = record_batches(manager)
        # The timer dead-letters it: nothing awaits this write, so look for the committed row.
        await wait_until(lambda: manager.info(DLQ).depth == 1)
        assert queue_store.stored_offsets(manager.storage.engine, DLQ) == [0]
    assert all(batch_queues(b) <= {DLQ} for b in batches)
    await assert_survives_restart(make_manager, "max_attempts")


async def test_disconnect_at_max_attempts_into_a_durable_dlq(make_manager: Factory) -> None:
    manager = make_manager()
    async with manager.running():
        h, _ = await setup(manager, max_attempts=1)
        batches = record_batches(manager)
        await h.cancel()  # returns once the dead letter is committed
        assert manager.info(DLQ).depth == 1
        assert queue_store.stored_offsets(manager.storage.engine, DLQ) == [0]
    assert all(batch_queues(b) <= {DLQ} for b in batches)
    await assert_survives_restart(make_manager, "max_attempts")


async def test_dlq_consumer_sees_the_dead_letter_only_after_its_commit(make_manager: Factory) -> None:
    manager = make_manager()
    stored_at_delivery: list[list[int]] = []

    class Checking(Collector):
        def deliver(self, delivery: Any) -> None:
            stored_at_delivery.append(queue_store.stored_offsets(manager.storage.engine, DLQ))
            super().deliver(delivery)

    async with manager.running():
        h, _ = await setup(manager)
        d = Checking("d")
        manager.consume(DLQ, d).add_credit(1)
        assert h.reject_nowait(0, "invalid")
        await wait_until(lambda: len(d.deliveries) == 1)
    assert stored_at_delivery == [[0]]


async def test_in_memory_queue_into_in_memory_dlq_writes_nothing(make_manager: Factory) -> None:
    manager = make_manager()
    async with manager.running():
        await manager.declare("tmp", durable=False)  # its DLQ $dlq/tmp is created in memory too
        c = Collector("c")
        h = manager.consume("tmp", c, group="g")
        h.add_credit(10)
        for i in range(3):
            await manager.publish("tmp", msg(b"%d" % i))
        await wait_until(lambda: len(c.deliveries) == 3)
        batches = record_batches(manager)
        assert await h.ack(0)
        assert h.reject_nowait(1, "bad")
        assert await h.reject(2, "bad")
        assert manager.info("$dlq/tmp").depth == 2 and not manager.info("$dlq/tmp").durable
        assert await manager.redrive("tmp") == 2
        assert manager.info("tmp").depth == 2
    assert batches == []  # no write at all: both queues live in memory
    assert queue_store.count_events(manager.storage.engine) == {}


async def test_redrive_from_durable_dlq_into_in_memory_queue(make_manager: Factory) -> None:
    manager = make_manager()
    async with manager.running():
        h, _ = await setup(manager)
        assert await h.reject(0, "invalid")
        d = Collector("d")
        manager.consume(DLQ, d, group="audit")  # a DLQ group with no delivery yet
        batches = record_batches(manager)
        assert await manager.redrive("tmp") == 1
        assert manager.info(DLQ).depth == 0
        assert manager.info("tmp").depth == 1
        assert queue_store.stored_offsets(manager.storage.engine, DLQ) == []  # the delete is committed
    assert batches and all(batch_queues(b) <= {DLQ} for b in batches)
    events = queue_store.events_for(manager.storage.engine, DLQ, 0)
    assert [e["kind"] for e in events][-1] == "redriven"
    again = make_manager()
    async with again.running():
        assert again.info(DLQ).depth == 0  # not resurrected by the restart


async def test_redrive_from_in_memory_dlq_into_durable_queue(make_manager: Factory) -> None:
    manager = make_manager(backoff_initial_s=0)
    async with manager.running():
        await manager.declare("q")
        await manager.declare("$dlq/q", durable=False)
        c = Collector("c")
        h = manager.consume("q", c)
        h.add_credit(10)
        await manager.publish("q", msg(b"poison", topic="$queue/q"))
        await wait_until(lambda: len(c.deliveries) == 1)
        assert await h.reject(0, "invalid")
        d = Collector("d")
        hd = manager.consume("$dlq/q", d)  # a DLQ consumer that holds nothing when the redrive runs
        batches = record_batches(manager)
        assert await manager.redrive("q") == 1
        assert hd.queue.messages == {}
        await wait_until(lambda: len(c.deliveries) == 2)
        assert queue_store.stored_offsets(manager.storage.engine, "q") == [1]
        await h.cancel()
    assert batches and all(batch_queues(b) <= {"q"} for b in batches)
    again = make_manager()
    async with again.running():
        assert again.info("q").depth == 1
        assert not again.exists("$dlq/q")


async def test_durable_queue_into_in_memory_dlq_writes_only_its_own_rows(make_manager: Factory) -> None:
    manager = make_manager()
    async with manager.running():
        await manager.declare("q", QueuePolicySettings(dead_letter="mem"))
        await manager.declare("mem", durable=False)
        c = Collector("c")
        h = manager.consume("q", c)
        h.add_credit(10)
        await manager.publish("q", msg(b"poison", topic="$queue/q"))
        await wait_until(lambda: len(c.deliveries) == 1)
        batches = record_batches(manager)
        assert await h.reject(0, "invalid")
        assert manager.info("mem").depth == 1
    assert batches and all(batch_queues(b) <= {"q"} for b in batches)
    counts = queue_store.count_events(manager.storage.engine, "q")
    assert counts["dead_lettered"] == 1


async def test_many_in_memory_rejects_keep_their_dlq_order_across_restart(make_manager: Factory) -> None:
    manager = make_manager()
    async with manager.running():
        await manager.declare(DLQ)
        await manager.declare("tmp", QueuePolicySettings(dead_letter=DLQ), durable=False)
        c = Collector("c")
        h = manager.consume("tmp", c)
        h.add_credit(100)
        for i in range(20):
            await manager.publish("tmp", msg(b"%d" % i))
        await wait_until(lambda: len(c.deliveries) == 20)
        for delivery in reversed(c.deliveries):  # nowait, newest first: the DLQ takes them in this order
            assert h.reject_nowait(delivery.offset, "bad")
        await wait_until(lambda: manager.info(DLQ).depth == 20)
        with anyio.fail_after(5):
            await manager.publish(DLQ, msg(b"after", topic=f"$queue/{DLQ}"))
    again = make_manager()
    async with again.running():
        assert again.info(DLQ).depth == 21
        d = Collector("d")
        again.consume(DLQ, d, auto_ack=True).add_credit(100)
        await wait_until(lambda: len(d.deliveries) == 21)
        assert d.payloads == [b"%d" % i for i in reversed(range(20))] + [b"after"]
        assert [x.offset for x in d.deliveries] == list(range(21))


@pytest.mark.postgres
async def test_shared_node_in_memory_queue_rejects_into_a_shared_durable_dlq(
    make_manager: Factory, storage_url: str
) -> None:
    if not storage_url.startswith("postgresql"):
        pytest.skip("shared mode needs PostgreSQL")
    a = make_manager(shared=True, node="a")
    async with a.running():
        h, _ = await setup(a)
        batches = record_batches(a)
        assert await h.reject(0, "invalid")  # the DLQ row takes its offset in the transaction
        assert len(queue_store.stored_offsets(a.storage.engine, DLQ)) == 1
    writes = [b for b in batches if not b.calls or b.events]  # leases and claims carry only calls
    assert all(batch_queues(b) <= {DLQ} for b in writes)
    assert queue_store.count_events(a.storage.engine, "tmp") == {}
    b = make_manager(shared=True, node="b")  # its first timer tick compacts the DLQ at once
    async with b.running():
        d = Collector("d")
        hd = b.consume(DLQ, d)
        hd.add_credit(1)
        await wait_until(lambda: len(d.deliveries) == 1, timeout=10)
        letter = d.deliveries[0].message
        assert letter.payload == b"poison"
        assert dict(letter.user_properties)["x-dead-letter-queue"] == "tmp"
        assert await hd.ack(d.deliveries[0].offset)


@pytest.mark.postgres
async def test_shared_compaction_keeps_messages_of_a_queue_with_no_group_yet(
    make_manager: Factory, storage_url: str
) -> None:
    """A DLQ nobody consumes yet has no group row: 'every group is done' must not hold vacuously."""
    if not storage_url.startswith("postgresql"):
        pytest.skip("shared mode needs PostgreSQL")
    a = make_manager(shared=True, node="a")
    async with a.running():
        await a.declare(DLQ)
        await a.publish(DLQ, msg(b"kept", topic=f"$queue/{DLQ}"))
        await a.journal.write(WriteBatch(calls=[queue_store.compact_shared(DLQ)]))
        assert len(queue_store.stored_offsets(a.storage.engine, DLQ)) == 1
        d = Collector("d")
        hd = a.consume(DLQ, d)
        hd.add_credit(1)
        await wait_until(lambda: len(d.deliveries) == 1)
        assert await hd.ack(d.deliveries[0].offset)
        await a.journal.write(WriteBatch(calls=[queue_store.compact_shared(DLQ)]))
        assert queue_store.stored_offsets(a.storage.engine, DLQ) == []  # done by its one group
