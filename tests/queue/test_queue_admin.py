"""What the admin API needs of the manager: peek without consuming, redrive dead letters, counters."""

from __future__ import annotations

import anyio
import pytest

from tests.queue.conftest import Collector, Factory, wait_until
from trimaran.broker.message import Message, now_ms
from trimaran.config import QueuePolicySettings
from trimaran.queue import QueueError
from trimaran.queue.policy import queue_topic
from trimaran.storage import queue_store
from trimaran.vhosts import dead_letter_name, prefix

pytestmark = pytest.mark.anyio


def msg(payload: bytes, **kw: object) -> Message:
    return Message(topic="$queue/q", payload=payload, qos=1, **kw)  # type: ignore[arg-type]


async def test_peek_pages_without_consuming(make_manager: Factory) -> None:
    manager = make_manager()
    async with manager.running():
        for i in range(5):
            await manager.publish("q", msg(b"m%d" % i))
        first = manager.peek("q", limit=2)
        assert [s.offset for s in first] == [0, 1]
        rest = manager.peek("q", after=first[-1].offset, limit=10)
        assert [s.message.payload for s in rest] == [b"m2", b"m3", b"m4"]
        assert manager.peek("q", after=4) == []
        # Nothing was delivered or moved: a consumer still gets all five, first attempt.
        consumer = Collector("c")
        manager.consume("q", consumer).add_credit(10)
        await wait_until(lambda: len(consumer.deliveries) == 5)
        assert all(d.attempt == 1 for d in consumer.deliveries)
        with pytest.raises(QueueError):
            manager.peek("nope")


async def test_peek_reads_a_shared_work_queues_stored_rows(make_manager: Factory, storage_url: str) -> None:
    """A shared node holds only its claims: peek reads the stored rows instead, what some group has
    not finished, in offset order, whichever node published it, claiming and delivering nothing."""
    if not storage_url.startswith("postgresql"):
        pytest.skip("shared mode needs PostgreSQL")
    a = make_manager(shared=True, node="a")
    b = make_manager(shared=True, node="b")
    async with a.running(), b.running():
        await a.declare("q")
        await b.declare("q")
        for i in range(4):
            await a.publish("q", msg(b"a%d" % i))
        await b.publish("q", msg(b"b0"))  # an offset from b's block, past a's
        await a.publish("q", msg(b"gone", expires_at_ms=now_ms() + 50))
        with pytest.raises(QueueError):
            a.peek("q")  # memory: only the claims
        await anyio.sleep(0.1)
        first = await a.peek_stored("q", limit=2)
        assert [s.message.payload for s in first] == [b"a0", b"a1"]
        rest = await a.peek_stored("q", after=first[-1].offset, limit=10)
        assert [s.message.payload for s in rest] == [b"a2", b"a3", b"b0"]  # not the expired one
        assert await a.peek_stored("q", after=rest[-1].offset) == []
        assert await b.peek_stored("q") == first + rest
        engine = a.storage.engine
        assert queue_store.load_pending(engine, "q") == []  # nothing claimed
        assert a.info("q").stats["delivered"] == b.info("q").stats["delivered"] == 0

        consumer = Collector("c")
        handle = a.consume("q", consumer)
        handle.add_credit(2)
        await wait_until(lambda: len(consumer.deliveries) == 2)
        assert [(d.offset, d.attempt, d.redelivered) for d in consumer.deliveries] == [
            (0, 1, False),
            (1, 1, False),
        ]
        shown = [s.message.payload for s in await b.peek_stored("q")]
        assert shown == [b"a0", b"a1", b"a2", b"a3", b"b0"]  # held is not finished
        assert handle.ack_nowait(0)  # peek reads after this node's own writes
        assert [s.message.payload for s in await a.peek_stored("q")] == [b"a1", b"a2", b"a3", b"b0"]
        assert await handle.reject(1, "bad")
        assert [s.message.payload for s in await a.peek_stored("q", limit=1)] == [b"a2"]
        # A dead-letter queue nobody consumes keeps everything: its letters are shown.
        letters = await a.peek_stored("$dlq/q")  # b has not learnt of it (docs/cluster.md, Limits)
        assert [s.message.payload for s in letters] == [b"a1"]
        assert dict(letters[0].message.user_properties)["x-dead-letter-reason"] == "bad"
        assert consumer.deliveries[2:] == []  # peeking delivered nothing more
        with pytest.raises(QueueError):
            await a.peek_stored("nope")


async def test_peek_stored_of_a_queue_on_one_node_is_peek(make_manager: Factory) -> None:
    manager = make_manager()
    async with manager.running():
        for i in range(3):
            await manager.publish("q", msg(b"m%d" % i))
        assert await manager.peek_stored("q", after=0, limit=1) == manager.peek("q", after=0, limit=1)
        assert [s.offset for s in await manager.peek_stored("q")] == [0, 1, 2]


async def test_redrive_moves_dead_letters_back_and_counts(make_manager: Factory) -> None:
    manager = make_manager()
    async with manager.running():
        await manager.declare("q", QueuePolicySettings(max_attempts=1))
        consumer = Collector("c")
        handle = manager.consume("q", consumer)
        handle.add_credit(10)
        for i in range(3):
            await manager.publish("q", msg(b"m%d" % i, user_properties=[("k", "v")]))
        await wait_until(lambda: len(consumer.deliveries) == 3)
        assert await handle.ack(0)
        assert await handle.reject(1, "bad")
        assert await handle.nack(2)  # max_attempts=1: dead-lettered too
        info = manager.info("q")
        assert info.dlq == "$dlq/q" and info.dlq_depth == 2
        assert info.stats["acked"] == 1 and info.stats["rejected"] == 1 and info.stats["nacked"] == 1
        assert info.stats["dead_lettered"] == 2 and info.stats["delivered"] == 3
        letters = manager.peek("$dlq/q")
        assert dict(letters[0].message.user_properties)["x-dead-letter-reason"] == "bad"

        assert await manager.redrive("q", limit=1) == 1
        assert manager.info("q").dlq_depth == 1
        assert await manager.redrive("q") == 1
        assert await manager.redrive("q") == 0
        await wait_until(lambda: len(consumer.deliveries) == 5)
        back = consumer.deliveries[3:]
        assert [d.message.payload for d in back] == [b"m1", b"m2"]
        assert [d.offset for d in back] == [3, 4]
        # The history stays in extra; the x-dead-letter-* properties do not come back.
        assert dict(back[0].message.user_properties) == {"k": "v"}
        assert back[0].message.extra["dead_letter_history"]
        assert manager.info("$dlq/q").depth == 0
    engine = manager.storage.engine
    assert queue_store.stored_offsets(engine, "$dlq/q") == []
    assert queue_store.count_events(engine, "$dlq/q")["redriven"] == 2


async def test_redrive_survives_restart(make_manager: Factory) -> None:
    manager = make_manager()
    async with manager.running():
        await manager.declare("q", QueuePolicySettings(max_attempts=1))
        consumer = Collector("c")
        handle = manager.consume("q", consumer)
        handle.add_credit(10)
        await manager.publish("q", msg(b"x"))
        await wait_until(lambda: len(consumer.deliveries) == 1)
        assert await handle.reject(0)
        assert await manager.redrive("q") == 1
    again = make_manager()
    async with again.running():
        assert again.info("q").depth == 1 and again.info("$dlq/q").depth == 0
        assert [s.message.payload for s in again.peek("q")] == [b"x"]


async def test_redrive_inside_a_vhost_finds_the_letters_that_name_their_queue_as_clients_do(
    make_manager: Factory,
) -> None:
    """A tenant's dead letters carry ``x-dead-letter-queue`` without the vhost's prefix (they never
    leave the vhost); redrive still finds them, and those of a queue of the same name in / stay."""
    key = prefix("t1") + "q"
    manager = make_manager()
    async with manager.running():
        for name in (key, "q"):
            await manager.declare(name, QueuePolicySettings(max_attempts=1))
            handle = manager.consume(name, Collector(name))
            handle.add_credit(10)
            await manager.publish(name, Message(topic=queue_topic(name), payload=b"bad", qos=1))
            await wait_until(lambda: manager.info(name).stats["delivered"] == 1)  # noqa: B023
            assert await handle.reject(0, "bad")
            await handle.cancel()
        letter = manager.peek(dead_letter_name(key))[0].message
        assert dict(letter.user_properties)["x-dead-letter-queue"] == "q"
        assert dict(letter.user_properties)["x-dead-letter-topic"] == "$queue/q"
        assert await manager.redrive(key) == 1
        assert manager.info(key).depth == 1 and manager.info("q").dlq_depth == 1
