"""Work queues: competing consumers, groups, ack/nack/reject, timeouts, DLQ, limits, restart."""

from __future__ import annotations

import gc
import threading
from collections.abc import Callable

import anyio
import pytest
from sqlalchemy import select

from tests.queue.conftest import Collector, Factory, wait_until
from trimaran.broker.message import Message
from trimaran.config import QueuePolicySettings
from trimaran.queue import QueueDelivery, QueueError, ack_by_id
from trimaran.queue.outcomes import ACK, RELEASED, UNSENT, Outcome, Retry
from trimaran.storage import queue_store
from trimaran.storage import writer as writer_module
from trimaran.storage.rows import WriteBatch
from trimaran.storage.schema import queue_events, queue_pending
from trimaran.storage.writer import Receipt

pytestmark = pytest.mark.anyio


def msg(payload: bytes, topic: str = "$queue/q", **kw: object) -> Message:
    return Message(topic=topic, payload=payload, qos=1, **kw)  # type: ignore[arg-type]


async def test_competing_consumers_share_and_ack(make_manager: Factory) -> None:
    manager = make_manager()
    async with manager.running():
        a, b = Collector("a"), Collector("b")
        ha = manager.consume("q", a)
        hb = manager.consume("q", b)
        ha.add_credit(100)
        hb.add_credit(100)
        for i in range(10):
            result = await manager.publish("q", msg(b"%d" % i))
            assert result.message_id == f"q:{i}"
        await wait_until(lambda: len(a.deliveries) + len(b.deliveries) == 10)
        assert a.deliveries and b.deliveries
        got = sorted(d.offset for d in a.deliveries + b.deliveries)
        assert got == list(range(10))
        first = a.deliveries[0]
        assert (first.queue, first.group, first.attempt, first.redelivered) == ("q", "$default", 1, False)
        assert first.message.topic == "$queue/q"
        for d in a.deliveries:
            assert await ha.ack(d.offset)
        for d in b.deliveries:
            assert await hb.ack(d.offset)
        assert not await ha.ack(0)  # already settled
        info = manager.info("q")
        assert info.depth == 0 and info.pending == 0
    assert queue_store.stored_offsets(manager.storage.engine, "q") == []
    assert queue_store.pending_rows(manager.storage.engine, "q") == []
    counts = queue_store.count_events(manager.storage.engine, "q")
    assert counts["published"] == 10 and counts["delivered"] == 10 and counts["acked"] == 10


async def test_two_groups_each_receive_everything(make_manager: Factory) -> None:
    manager = make_manager()
    async with manager.running():
        a, b = Collector("a"), Collector("b")
        ha = manager.consume("q", a, group="g1")
        hb = manager.consume("q", b, group="g2")
        ha.add_credit(10)
        hb.add_credit(10)
        for i in range(5):
            await manager.publish("q", msg(b"%d" % i))
        await wait_until(lambda: len(a.deliveries) == 5 and len(b.deliveries) == 5)
        assert [d.group for d in b.deliveries] == ["g2"] * 5
        for d in a.deliveries:
            await ha.ack(d.offset)
        assert manager.info("q").depth == 5  # g2 has not finished them
        for d in b.deliveries:
            await hb.ack(d.offset)
        assert manager.info("q").depth == 0


async def test_credit_is_respected(make_manager: Factory) -> None:
    manager = make_manager()
    async with manager.running():
        for i in range(5):
            await manager.publish("q", msg(b"%d" % i))
        slow, fast = Collector("slow"), Collector("fast")
        hs = manager.consume("q", slow)
        hf = manager.consume("q", fast)
        hs.add_credit(1)
        await wait_until(lambda: len(slow.deliveries) == 1)
        await anyio.sleep(0.05)
        assert len(slow.deliveries) == 1 and not fast.deliveries
        hf.add_credit(10)  # a consumer without credit holds nothing back from the others
        await wait_until(lambda: len(fast.deliveries) == 4)
        await hs.ack(slow.deliveries[0].offset)
        await manager.publish("q", msg(b"5"))
        await wait_until(lambda: len(fast.deliveries) == 5)
        assert len(slow.deliveries) == 1


async def test_nack_redelivers_after_backoff(make_manager: Factory) -> None:
    manager = make_manager(backoff_initial_s=0.1, backoff_multiplier=2)
    async with manager.running():
        c = Collector("c")
        h = manager.consume("q", c)
        h.add_credit(10)
        await manager.publish("q", msg(b"x"))
        await wait_until(lambda: len(c.deliveries) == 1)
        started = anyio.current_time()
        assert await h.nack(0)
        await anyio.sleep(0.03)
        assert len(c.deliveries) == 1
        await wait_until(lambda: len(c.deliveries) == 2)
        assert anyio.current_time() - started >= 0.09
        d = c.deliveries[1]
        assert d.redelivered and d.attempt == 2
        assert await h.nack(0, delay_s=0)
        await wait_until(lambda: len(c.deliveries) == 3)
        assert c.deliveries[2].attempt == 3
        await h.ack(0)
    events = queue_store.events_for(manager.storage.engine, "q", 0)
    delivered = [e for e in events if e["kind"] == "delivered"]
    assert [e["reason"] for e in delivered] == ["first", "nack", "nack"]


async def test_visibility_timeout_redelivers(make_manager: Factory) -> None:
    manager = make_manager(visibility_timeout_s=0.1)
    async with manager.running():
        c = Collector("c")
        h = manager.consume("q", c)
        h.add_credit(10)
        await manager.publish("q", msg(b"x"))
        await wait_until(lambda: len(c.deliveries) == 2)
        assert c.deliveries[1].redelivered and c.deliveries[1].attempt == 2
        assert not await h.ack(0) or True  # the latest delivery is held: acking it works
        assert manager.info("q").depth == 0
    events = queue_store.events_for(manager.storage.engine, "q", 0)
    assert [e["reason"] for e in events if e["kind"] == "delivered"] == ["first", "timeout"]


async def test_disconnect_redelivers_to_another_consumer(make_manager: Factory) -> None:
    manager = make_manager()
    async with manager.running():
        a, b = Collector("a"), Collector("b")
        ha = manager.consume("q", a)
        ha.add_credit(10)
        await manager.publish("q", msg(b"x"))
        await wait_until(lambda: len(a.deliveries) == 1)
        hb = manager.consume("q", b)
        hb.add_credit(10)
        await ha.cancel()
        await wait_until(lambda: len(b.deliveries) == 1)
        assert b.deliveries[0].redelivered and b.deliveries[0].attempt == 2
        assert await hb.ack(0)


async def test_reject_and_max_attempts_go_to_dlq_with_history(make_manager: Factory) -> None:
    manager = make_manager(max_attempts=2, backoff_initial_s=0)
    async with manager.running():
        c = Collector("c")
        h = manager.consume("q", c)
        h.add_credit(10)
        await manager.publish("q", msg(b"bad", user_properties=[("x-dead-letter-reason", "forged")]))
        await manager.publish("q", msg(b"poison"))
        await wait_until(lambda: len(c.deliveries) == 2)
        assert await h.reject(0, "invalid order")
        assert await h.nack(1)
        await wait_until(lambda: len(c.deliveries) == 3)
        assert await h.nack(1)  # attempt 2 of 2: dead-lettered
        info = manager.info("q")
        assert info.depth == 0 and info.dlq == "$dlq/q" and info.dlq_depth == 2
        d = Collector("d")
        hd = manager.consume("$dlq/q", d)
        hd.add_credit(10)
        await wait_until(lambda: len(d.deliveries) == 2)
        first = dict(d.deliveries[0].message.user_properties)
        assert first["x-dead-letter-reason"] == "invalid order"
        assert first["x-dead-letter-queue"] == "q"
        assert first["x-dead-letter-topic"] == "$queue/q"
        assert [v for k, v in d.deliveries[0].message.user_properties if k == "x-dead-letter-reason"] == [
            "invalid order"
        ]
        second = d.deliveries[1].message
        assert dict(second.user_properties)["x-dead-letter-reason"] == "max_attempts"
        history = second.extra["dead_letter_history"]
        assert isinstance(history, list) and history[0]["attempts"] == 2
    counts = queue_store.count_events(manager.storage.engine, "q")
    assert counts["dead_lettered"] == 2 and counts["rejected"] == 1


async def test_ttl_expiry(make_manager: Factory) -> None:
    manager = make_manager()
    async with manager.running():
        await manager.declare("t", QueuePolicySettings(ttl_s=0.05))
        await manager.publish("t", msg(b"old"))
        await manager.publish("t", msg(b"own", expires_at_ms=1))  # the message's own expiry
        await anyio.sleep(0.1)
        await manager.publish("t", msg(b"new"))
        c = Collector("c")
        manager.consume("t", c).add_credit(10)
        await wait_until(lambda: len(c.deliveries) == 1)
        assert c.payloads == [b"new"]
        assert manager.info("t").stats["expired"] == 2
    assert queue_store.count_events(manager.storage.engine, "t")["expired"] == 2


async def test_max_length_reject_and_drop_oldest(make_manager: Factory) -> None:
    manager = make_manager()
    async with manager.running():
        await manager.declare("r", QueuePolicySettings(max_length=2))
        await manager.declare("d", QueuePolicySettings(max_length=2, overflow="drop-oldest"))
        for name in ("r", "d"):
            await manager.publish(name, msg(b"1"))
            await manager.publish(name, msg(b"2"))
        with pytest.raises(QueueError) as refused:
            await manager.publish("r", msg(b"3"))
        assert refused.value.reason == "full"
        await manager.publish("d", msg(b"3"))
        assert manager.info("r").stats["refused"] == 1
        assert manager.info("d").stats["dropped"] == 1
        c = Collector("c")
        manager.consume("d", c).add_credit(10)
        await wait_until(lambda: len(c.deliveries) == 2)
        assert c.payloads == [b"2", b"3"]
    assert queue_store.count_events(manager.storage.engine, "d")["dropped"] == 1


async def test_refusals(make_manager: Factory) -> None:
    manager = make_manager(auto_create=False)
    async with manager.running():
        with pytest.raises(QueueError) as no_queue:
            await manager.publish("nope", msg(b"x"))
        assert no_queue.value.reason == "no-queue"
        await manager.declare("q")
        with pytest.raises(QueueError) as retained:
            await manager.publish("q", msg(b"x", retain=True))
        assert retained.value.reason == "retain"


async def test_routing_key_filters(make_manager: Factory) -> None:
    manager = make_manager()
    async with manager.running():
        eu, us = Collector("eu"), Collector("us")
        manager.consume("q", eu, routing_filter="eu/#").add_credit(10)
        manager.consume("q", us, routing_filter="us/+").add_credit(10)
        await manager.publish("q", msg(b"1", topic="$queue/q/eu/de"), "eu/de")
        await manager.publish("q", msg(b"2", topic="$queue/q/us/ny"), "us/ny")
        await manager.publish("q", msg(b"3", topic="$queue/q/eu"), "eu")
        await wait_until(lambda: len(eu.deliveries) == 2 and len(us.deliveries) == 1)
        assert eu.payloads == [b"1", b"3"] and us.payloads == [b"2"]
        assert eu.deliveries[0].message.topic == "$queue/q/eu/de"


async def test_ack_by_message_id(make_manager: Factory) -> None:
    manager = make_manager()
    async with manager.running():
        c = Collector("c")
        manager.consume("q", c).add_credit(1)
        await manager.publish("q", msg(b"x"))
        await wait_until(lambda: len(c.deliveries) == 1)
        assert not await ack_by_id(manager, "q:0", consumer_id="someone-else")
        assert await ack_by_id(manager, c.deliveries[0].message_id)
        assert manager.info("q").depth == 0


async def test_non_durable_queue_lives_in_memory(make_manager: Factory) -> None:
    manager = make_manager()
    async with manager.running():
        await manager.declare("tmp", durable=False)
        c = Collector("c")
        h = manager.consume("tmp", c)
        h.add_credit(5)
        await manager.publish("tmp", msg(b"x"))
        await wait_until(lambda: len(c.deliveries) == 1)
        assert await h.ack(0)
    assert queue_store.count_events(manager.storage.engine, "tmp") == {}


async def test_restart_keeps_pending_entries_and_cursors(make_manager: Factory) -> None:
    first = make_manager(backoff_initial_s=30)
    async with first.running():
        c = Collector("c")
        h = first.consume("q", c)
        h.add_credit(3)
        for i in range(6):
            await first.publish("q", msg(b"%d" % i))
        await wait_until(lambda: len(c.deliveries) == 3)
        await h.ack(0)  # 1 stays held, 2 is nacked (waiting 30 s)
        await h.nack(2)
        g = Collector("g")
        hg = first.consume("q", g, group="audit")
        hg.add_credit(2)
        await wait_until(lambda: len(g.deliveries) == 2)
        await hg.ack(0)
        await hg.ack(1)
    second = make_manager(backoff_initial_s=30)
    async with second.running():
        info = second.info("q")
        assert info.depth == 5  # offset 0 was acked by both groups
        assert info.groups["$default"].waiting == 2  # held 1 (restart) and nacked 2
        c2 = Collector("c2")
        h2 = second.consume("q", c2)
        h2.add_credit(10)
        await wait_until(lambda: len(c2.deliveries) == 4)
        assert [d.offset for d in c2.deliveries] == [1, 3, 4, 5]
        assert c2.deliveries[0].redelivered and c2.deliveries[0].attempt == 2
        g2 = Collector("g2")
        second.consume("q", g2, group="audit").add_credit(10)
        await wait_until(lambda: len(g2.deliveries) == 4)
        assert [d.offset for d in g2.deliveries] == [2, 3, 4, 5]
        assert (await second.publish("q", msg(b"6"))).offset == 6


async def test_restart_keeps_the_cursor_past_an_out_of_order_ack(make_manager: Factory) -> None:
    first = make_manager()
    async with first.running():
        await first.publish("q", msg(b"0", topic="$queue/q/a"), "a")
        await first.publish("q", msg(b"1", topic="$queue/q/b"), "b")
        first.consume("q", Collector("idle"), group="other")  # keeps both messages stored
        b = Collector("b")
        hb = first.consume("q", b, routing_filter="b")
        hb.add_credit(1)
        await wait_until(lambda: len(b.deliveries) == 1)
        assert await hb.ack(1)  # done ahead of the cursor
        a = Collector("a")
        ha = first.consume("q", a, routing_filter="a")
        ha.add_credit(1)
        await wait_until(lambda: len(a.deliveries) == 1)
        assert await ha.ack(0)
        assert first.info("q").groups["$default"].cursor == 2
    second = make_manager()
    async with second.running():
        assert second.info("q").groups["$default"].cursor == 2
        c = Collector("c")
        second.consume("q", c).add_credit(5)
        await second.publish("q", msg(b"2"))
        await wait_until(lambda: len(c.deliveries) == 1)
        assert [d.offset for d in c.deliveries] == [2]  # 0 and 1 were acked: not again


async def test_attempts_survive_restart_and_lead_to_the_dlq(make_manager: Factory) -> None:
    first = make_manager(max_attempts=2, visibility_timeout_s=60)
    async with first.running():
        c = Collector("c")
        first.consume("q", c).add_credit(1)
        await first.publish("q", msg(b"x", user_properties=[("x-queue-attempt", "99"), ("k", "v")]))
        await wait_until(lambda: len(c.deliveries) == 1)
        assert c.deliveries[0].message.user_properties == [("k", "v")]  # reserved names stripped
    second = make_manager(max_attempts=2, visibility_timeout_s=60)
    async with second.running():
        c2 = Collector("c2")
        h2 = second.consume("q", c2)
        h2.add_credit(1)
        await wait_until(lambda: len(c2.deliveries) == 1)
        d = c2.deliveries[0]
        assert (d.attempt, d.redelivered) == (2, True)
        assert ("x-queue-attempt", "2") in d.headers()
        assert await h2.nack(0)  # second failed attempt of two: dead-lettered
        assert second.info("q").dlq_depth == 1
    events = queue_store.events_for(second.storage.engine, "q", 0)
    kinds = [(e["kind"], e["reason"]) for e in events]
    assert kinds[0] == ("published", None)
    assert ("delivered", "restart") in kinds and kinds[-1][0] == "dead_lettered"


async def test_publish_nowait_delivers_before_the_commit_and_confirms_after_it(make_manager: Factory) -> None:
    """A durable work queue hands a message to its consumers at the end of the loop's turn, as
    RabbitMQ does, while the publisher's receipt waits for the commit; what was committed survives a
    restart."""
    manager = make_manager()
    async with manager.running():
        await manager.declare("nw")
        await manager.declare("mem", durable=False)
        c = Collector("c")
        manager.consume("nw", c).add_credit(10)
        gate = threading.Event()
        manager.journal.send(WriteBatch(calls=[lambda _connection: gate.wait(10)]))  # the disk stalls
        tickets = [manager.publish_nowait("nw", msg(b"%d" % i, topic="$queue/nw")) for i in range(3)]
        assert c.deliveries == []  # not inside the publish: at the end of the turn
        await wait_until(lambda: len(c.deliveries) == 3)
        assert c.payloads == [b"0", b"1", b"2"]
        assert not any(t is None or t.done for t in tickets)  # delivered, not committed
        gate.set()
        for t in tickets:
            assert t is not None
            await t.wait()
        m = Collector("m")
        manager.consume("mem", m).add_credit(1)
        assert manager.publish_nowait("mem", msg(b"x", topic="$queue/mem")) is None
        assert m.payloads == [b"x"]  # in memory: delivered at once
    again = make_manager()
    async with again.running():
        assert again.info("nw").depth == 3
        assert not again.exists("mem")


async def test_an_early_message_whose_write_fails_is_withdrawn(
    make_manager: Factory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The publisher hears of the failure and no consumer that comes later gets the message."""
    manager = make_manager()
    async with manager.running():
        await manager.declare("w")
        real = writer_module._message_tuples  # a row without its offset: the insert fails
        monkeypatch.setattr(
            writer_module, "_message_tuples", lambda b: [(q, None, *r) for q, _, *r in real(b)]
        )
        errors: list[QueueError | None] = []
        manager.publish_nowait("w", msg(b"lost", topic="$queue/w"), "", lambda _r, e: errors.append(e))
        await wait_until(lambda: bool(errors))
        assert isinstance(errors[0], QueueError) and errors[0].reason == "storage"
        monkeypatch.undo()
        c = Collector("c")
        manager.consume("w", c).add_credit(10)
        await manager.publish("w", msg(b"kept", topic="$queue/w"))
        await wait_until(lambda: bool(c.deliveries))
        await anyio.sleep(0.05)
        assert c.payloads == [b"kept"]
        assert manager.info("w").depth == 1


async def test_settle_all_nowait_is_one_submission_for_many(make_manager: Factory) -> None:
    """basic.ack with multiple: every delivery the handle holds is settled in one change; one it does
    not hold is skipped and not counted. The change is the turn's, submitted at the turn's end."""
    manager = make_manager()
    async with manager.running():
        c, other = Collector("c"), Collector("other")
        handle = manager.consume("q", c)
        handle.add_credit(5)
        for i in range(5):
            await manager.publish("q", msg(b"%d" % i))
        await wait_until(lambda: len(c.deliveries) == 5)
        manager.consume("q", other)
        before = manager.writer.submissions
        assert handle.settle_all_nowait([0, 1, 2, 3, 99], ACK) == 4
        assert manager.writer.submissions == before  # not yet: at the end of the loop's turn
        await wait_until(lambda: manager.writer.submissions > before)
        assert manager.writer.submissions == before + 1
        await wait_until(lambda: manager.info("q").depth == 1)
        assert handle.settle_all_nowait([0], ACK) == 0  # settled already
    counts = queue_store.count_events(manager.storage.engine, "q")
    assert counts["acked"] == 4


async def test_durable_messages_leave_no_reference_cycles(make_manager: Factory) -> None:
    """Publish, commit, deliver and ack free everything by reference counting. A cycle per message
    (a commit callback holding its own receipt did) made the collector's passes a fifth of the
    broker's time under load."""
    manager = make_manager()
    async with manager.running():
        c = Collector("c")
        handle = manager.consume("q", c)
        handle.add_credit(1000)
        await manager.publish("q", msg(b"warm-up"))  # first-use objects (the queue, its group)
        await wait_until(lambda: len(c.deliveries) == 1)
        handle.settle_all_nowait([0], ACK)
        await wait_until(lambda: manager.info("q").depth == 0)
        gc.collect()
        gc.disable()
        try:
            done: list[QueueError | None] = []
            for i in range(200):
                manager.publish_nowait("q", msg(b"%d" % i), "", lambda _r, e: done.append(e))
            await wait_until(lambda: len(done) == 200 and len(c.deliveries) == 201)
            assert done == [None] * 200
            handle.settle_all_nowait([d.offset for d in c.deliveries[1:]], ACK)
            await wait_until(lambda: manager.info("q").depth == 0)
            c.deliveries.clear()
            done.clear()
            for _ in range(2):  # the writer's thread holds its last batch until the next one
                await manager.journal.write(WriteBatch(calls=[lambda _connection: None]))
            # The collector is off: whatever is still alive was not freed by reference counting.
            assert sum(isinstance(o, Receipt) for o in gc.get_objects()) < 10
        finally:
            gc.enable()


async def test_publish_nowait_refuses_a_full_queue(make_manager: Factory) -> None:
    manager = make_manager()
    async with manager.running():
        await manager.declare("small", QueuePolicySettings(max_length=1))
        ticket = manager.publish_nowait("small", msg(b"a", topic="$queue/small"))
        assert ticket is not None
        await ticket.wait()
        with pytest.raises(QueueError):
            manager.publish_nowait("small", msg(b"b", topic="$queue/small"))


async def test_publish_nowait_calls_back_after_the_commit_in_order(make_manager: Factory) -> None:
    manager = make_manager(max_length=3)
    async with manager.running():
        done: list[tuple[str, QueueError | None]] = []
        for i in range(3):
            record = lambda r, e: done.append((r.message_id, e))  # noqa: E731
            assert manager.publish_nowait("q", msg(b"%d" % i), "", record) is not None
        assert done == []  # nothing before the commit
        with pytest.raises(QueueError) as refused:  # max_length 3 counts the ones in flight
            manager.publish_nowait("q", msg(b"3"), "", lambda r, e: done.append((r.message_id, e)))
        assert refused.value.reason == "full"
        await wait_until(lambda: len(done) == 3)
        assert done == [("q:0", None), ("q:1", None), ("q:2", None)]
        c = Collector("c")
        manager.consume("q", c).add_credit(10)
        await wait_until(lambda: len(c.deliveries) == 3)
        assert c.payloads == [b"0", b"1", b"2"]
    restarted = make_manager()
    async with restarted.running():
        assert restarted.info("q").depth == 3  # committed, not only in memory


async def test_ack_inside_deliver_is_not_overwritten_by_the_delivery_rows(make_manager: Factory) -> None:
    """A consumer that acks from within deliver() (in-process, or a front end settling at once):
    the delivery's pending row must not reach the database after the ack that removed it."""
    from trimaran.queue import ConsumerHandle

    class AckAtOnce:
        id = "quick"
        handle: ConsumerHandle | None = None
        seen = 0

        def deliver(self, delivery: QueueDelivery) -> None:
            self.seen += 1
            assert self.handle is not None
            self.handle.ack_nowait(delivery.offset)
            self.handle.add_credit(1)

    first = make_manager()
    async with first.running():
        quick = AckAtOnce()
        quick.handle = first.consume("q", quick)
        quick.handle.add_credit(5)
        for i in range(20):
            await first.publish("q", msg(b"%d" % i))
        await wait_until(lambda: quick.seen == 20)
        await wait_until(lambda: first.info("q").depth == 0)
    pending = first.storage.engine.connect()
    try:
        rows = pending.execute(queue_pending.select()).fetchall()
    finally:
        pending.close()
    assert rows == []
    second = make_manager()
    async with second.running():
        again = Collector("again")
        second.consume("q", again).add_credit(100)
        await anyio.sleep(0.3)
        assert again.deliveries == []  # acked once means never redelivered


async def test_a_delivery_released_unsent_is_not_a_redelivery(make_manager: Factory) -> None:
    manager = make_manager()
    async with manager.running():
        await manager.declare("un", durable=False)
        first = Collector("first")
        handle = manager.consume("un", first)
        handle.add_credit(1)
        manager.publish_nowait("un", msg(b"x", topic="$queue/un"))
        (delivery,) = first.deliveries
        handle.set_credit(0)
        assert handle.release_nowait(delivery.offset)
        second = Collector("second")
        manager.consume("un", second).add_credit(1)
        (again,) = second.deliveries
        assert again.message.payload == b"x" and not again.redelivered
        assert again.attempt == 2  # the journal still counts it


async def test_a_lone_groups_first_delivery_keeps_no_row_and_comes_back_after_a_restart(
    make_manager: Factory,
) -> None:
    """The queue's only group writes no pending row for a first delivery (its 'delivered' event
    says it): held, acked or restarted, the rows are right. After a restart, a message below the
    cursor with no row is one that was held: it comes back as a redelivery, as a held row would."""
    first = make_manager()
    async with first.running():
        c = Collector("c")
        h = first.consume("q", c)
        h.add_credit(3)
        for i in range(4):
            await first.publish("q", msg(b"%d" % i))
        await wait_until(lambda: len(c.deliveries) == 3)
        await h.ack(0)
        assert await h.nack(1, delay_s=0.0)
        h.add_credit(1)
        await wait_until(lambda: len(c.deliveries) == 4)  # 1 again: a second attempt has a row
        engine = first.storage.engine

        def rows() -> set[tuple[int, str, int]]:
            return {(r["offset"], r["state"], r["attempts"]) for r in queue_store.pending_rows(engine, "q")}

        await wait_until(lambda: rows() == {(1, "held", 2)})  # 2 is held without a row; 0 was acked
    second = make_manager()
    async with second.running():
        assert second.info("q").groups["$default"].waiting == 2  # 1 and 2, held when it stopped
        c2 = Collector("c2")
        second.consume("q", c2).add_credit(10)
        await wait_until(lambda: len(c2.deliveries) == 3)
        got = {d.offset: (d.attempt, d.redelivered) for d in c2.deliveries}
        assert got == {1: (3, True), 2: (2, True), 3: (1, False)}
    events = queue_store.events_for(second.storage.engine, "q", 2)
    assert [(e["kind"], e["reason"]) for e in events] == [
        ("published", None), ("delivered", "first"), ("released", "restart"), ("delivered", "restart"),
    ]  # fmt: skip


async def test_a_turns_publishes_are_one_submission_confirmed_in_order(make_manager: Factory) -> None:
    """Publishes to an early queue within one turn of the loop share one change: one submission,
    one receipt, one event row for their run of offsets; each publisher is told in publish order
    once it is committed."""
    manager = make_manager()
    async with manager.running():
        await manager.declare("t")
        told: list[tuple[int, QueueError | None]] = []
        before = manager.writer.submissions
        tickets = [
            manager.publish_nowait(
                "t", msg(b"%d" % i, topic="$queue/t"), "", lambda r, e: told.append((r.offset, e))
            )
            for i in range(5)
        ]
        assert len({id(t) for t in tickets}) == 1 and told == []
        ticket = tickets[0]
        assert ticket is not None
        await ticket.wait()
        assert told == [(i, None) for i in range(5)]
        assert manager.writer.submissions == before + 1
    with manager.storage.engine.connect() as connection:
        columns = (queue_events.c.time, queue_events.c.offset, queue_events.c.span)
        rows = connection.execute(select(*columns).where(queue_events.c.queue == "t")).all()
    # one row for each millisecond the five publishes took (they rarely cross one)
    assert len(rows) == len({time for time, _, _ in rows})
    assert [o for _, first, span in rows for o in range(first, first + span)] == list(range(5))


async def test_a_turn_ends_with_the_read_when_the_runtime_says_when(make_manager: Factory) -> None:
    """With ``at_turn_end`` (the runtime's end of a read), an early queue's turn is handed there
    once, not scheduled on the loop: its rows are submitted and its consumers get the messages when
    the read ends, before the read's writes leave."""
    manager = make_manager()
    async with manager.running():
        await manager.declare("t")
        c = Collector("c")
        manager.consume("t", c).add_credit(10)
        ends: list[Callable[[], None]] = []
        manager.at_turn_end = ends.append
        before = manager.writer.submissions
        tickets = [manager.publish_nowait("t", msg(b"%d" % i, topic="$queue/t"), "", None) for i in range(3)]
        assert len(ends) == 1 and c.payloads == [] and manager.writer.submissions == before
        ends.pop()()  # the read ends
        assert c.payloads == [b"0", b"1", b"2"] and manager.writer.submissions > before
        ticket = tickets[0]
        assert ticket is not None
        await ticket.wait()
        manager.publish_nowait("t", msg(b"3", topic="$queue/t"), "", None)
        assert len(ends) == 1  # the next turn asks again
        ends.pop()()
        assert c.payloads[-1] == b"3"


async def test_a_submission_later_in_the_turn_follows_the_turns_publishes(make_manager: Factory) -> None:
    """A purge in the same turn as publishes is handed to the writer after their rows, so it
    removes them; were it first, the rows would outlive it."""
    manager = make_manager()
    async with manager.running():
        await manager.declare("p")
        for i in range(3):
            manager.publish_nowait("p", msg(b"%d" % i, topic="$queue/p"))
        assert await manager.purge("p") == 3
    assert queue_store.stored_offsets(manager.storage.engine, "p") == []


async def test_acks_wait_for_the_turns_end_and_a_stop_still_writes_them(make_manager: Factory) -> None:
    """A holder's acks go into the turn's change: nothing reaches the writer while the turn runs,
    and a stop in the same turn still commits them, so the next start delivers only what was not
    acked."""
    first = make_manager()
    async with first.running():
        c = Collector("c")
        handle = first.consume("q", c)
        handle.add_credit(3)
        for i in range(3):
            await first.publish("q", msg(b"%d" % i))
        await wait_until(lambda: len(c.deliveries) == 3)
        before = first.writer.submissions
        assert handle.settle_all_nowait([0, 1], ACK) == 2
        assert first.writer.submissions == before
        # no await between the acks and the stop: the turn is still open when the stop comes
    second = make_manager()
    async with second.running():
        again = Collector("again")
        second.consume("q", again).add_credit(5)
        await wait_until(lambda: len(again.deliveries) == 1)
        assert [d.offset for d in again.deliveries] == [2]


async def test_a_turns_publishes_fail_together_and_are_withdrawn(
    make_manager: Factory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One change, one fate: every publisher of the turn hears of the failed write, and no
    consumer gets the messages."""
    manager = make_manager()
    async with manager.running():
        await manager.declare("f")
        real = writer_module._message_tuples  # a row without its offset: the insert fails
        monkeypatch.setattr(
            writer_module, "_message_tuples", lambda b: [(q, None, *r) for q, _, *r in real(b)]
        )
        errors: list[QueueError | None] = []
        for i in range(3):
            manager.publish_nowait("f", msg(b"%d" % i, topic="$queue/f"), "", lambda _r, e: errors.append(e))
        await wait_until(lambda: len(errors) == 3)
        assert all(isinstance(e, QueueError) and e.reason == "storage" for e in errors)
        monkeypatch.undo()
        assert manager.info("f").depth == 0


@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_without_an_asyncio_loop_a_publish_is_submitted_at_once(make_manager: Factory) -> None:
    """Under trio there is no end of the turn to wait for: the publish is its own change."""
    manager = make_manager()
    async with manager.running():
        await manager.declare("t")
        ticket = manager.publish_nowait("t", msg(b"x", topic="$queue/t"))
        assert ticket is not None
        await ticket.wait()
        assert manager.info("t").depth == 1


async def test_a_restart_keeps_the_deliveries_that_were_not_failed_attempts(make_manager: Factory) -> None:
    """A pending row keeps, beside its attempts, the deliveries handed back released (AMQP 1.0) or
    unsent (migration 0012): after a restart the message comes back with the failed-attempt count
    and the redelivered flag it had before, and only its failed attempts count towards
    ``max_attempts``."""
    policy = QueuePolicySettings(max_attempts=3, backoff_initial_s=0)
    first = make_manager()
    async with first.running():
        await first.declare("q", policy)
        await first.declare("u", policy)
        c = Collector("c")
        h = first.consume("q", c)
        await first.publish("q", msg(b"x"))

        async def again(outcome: Outcome) -> QueueDelivery:
            """Settle the last delivery with ``outcome`` and take the next one."""
            count = len(c.deliveries)
            assert await h.settle(c.deliveries[-1].offset, outcome)
            h.add_credit(1)
            await wait_until(lambda: len(c.deliveries) == count + 1)
            return c.deliveries[-1]

        h.add_credit(1)
        await wait_until(lambda: len(c.deliveries) == 1)
        await again(Retry(0.0))  # one failed attempt
        await again(RELEASED)
        await again(RELEASED)
        last = await again(UNSENT)
        assert (last.attempt, last.failed, last.redelivered) == (5, 1, True)
        assert await h.settle(last.offset, RELEASED)  # no credit: it waits in the queue

        # One delivered once and given back unsent: never seen, so not a redelivery.
        u = Collector("u")
        hu = first.consume("u", u)
        hu.add_credit(1)
        await first.publish("u", msg(b"y", topic="$queue/u"))
        await wait_until(lambda: len(u.deliveries) == 1)
        hu.set_credit(0)
        assert await hu.settle(u.deliveries[0].offset, UNSENT)

    second = make_manager()
    async with second.running():
        c2 = Collector("c2")
        h2 = second.consume("q", c2)
        h2.add_credit(1)
        await wait_until(lambda: len(c2.deliveries) == 1)
        back = c2.deliveries[0]
        assert back.message.payload == b"x"
        assert (back.attempt, back.failed, back.redelivered) == (6, 1, True)
        assert second.info("q").dlq_depth == 0
        # Two more failures make the three max_attempts allows: the released ones never counted.
        assert await h2.nack(back.offset)
        h2.add_credit(1)
        await wait_until(lambda: len(c2.deliveries) == 2)
        assert (c2.deliveries[1].attempt, c2.deliveries[1].failed) == (7, 2)
        assert await h2.nack(back.offset)
        await wait_until(lambda: second.info("q").dlq_depth == 1)
        letter = second.peek("$dlq/q")[0].message
        assert dict(letter.user_properties)["x-dead-letter-reason"] == "max_attempts"

        u2 = Collector("u2")
        second.consume("u", u2).add_credit(1)
        await wait_until(lambda: len(u2.deliveries) == 1)
        fresh = u2.deliveries[0]
        assert (fresh.attempt, fresh.failed, fresh.redelivered) == (2, 0, False)
