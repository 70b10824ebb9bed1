"""A queue whose consumers are behind holds its publishers (trimaran/queue/flow.py), with the real
manager and a recording stand-in for the runtime's gate."""

from __future__ import annotations

from typing import Any

import pytest

from tests.queue.conftest import Collector, Factory, wait_until
from tests.support.gates import FakeGate, Publisher
from trimaran.broker.message import Message
from trimaran.config import QueuePolicySettings
from trimaran.queue import QueueManager
from trimaran.queue.flow import QueueFlow, Stalled
from trimaran.queue.outcomes import ACK

pytestmark = pytest.mark.anyio

HIGH = 10  # messages not yet delivered above which publishers are held (below 5: they go on)


def gated(manager: QueueManager, *, high_bytes: int = 1 << 30, timeout_s: float = 5.0) -> list[FakeGate]:
    gates: list[FakeGate] = []

    def make(stalled: Stalled) -> FakeGate:
        gates.append(FakeGate(stalled))
        return gates[-1]

    manager.flow = QueueFlow(make, high_messages=HIGH, high_bytes=high_bytes, timeout_s=timeout_s)
    return gates


def msg(payload: bytes = b"x", queue: str = "t") -> Message:
    return Message(topic=f"$queue/{queue}", payload=payload, qos=1)


def publish(manager: QueueManager, publisher: Publisher, n: int, queue: str = "t", size: int = 1) -> None:
    for _ in range(n):
        manager.publish_nowait(queue, msg(b"x" * size, queue), held=publisher)


async def declare(manager: QueueManager, name: str = "t", *, durable: bool = False, **policy: Any) -> None:
    await manager.declare(name, QueuePolicySettings(**policy), durable=durable)


async def test_a_consumer_behind_holds_its_publishers_until_below_half(make_manager: Factory) -> None:
    manager = make_manager()
    async with manager.running():
        gates = gated(manager)
        await declare(manager)
        consumer = Collector("c")
        handle = manager.consume("t", consumer)
        handle.add_credit(2)
        publisher, bystander = Publisher(), Publisher()
        publish(manager, publisher, 2 + HIGH)  # two delivered, ten waiting: at the mark, not past it
        assert not manager.queues["t"].behind and publisher.holds == 0
        publish(manager, publisher, 1)  # past it: the queue is behind, its publisher held from here on
        assert manager.queues["t"].behind and publisher.holds == 1
        publish(manager, publisher, 1)
        assert publisher.holds == 1  # held by the queue's gate once, however many it publishes
        publish(manager, publisher, 3)
        assert publisher.holds == 1 and manager.info("t").depth == 2 + HIGH + 5  # nothing refused
        manager.publish_nowait("other", msg(queue="other"), held=bystander)  # another queue: not held
        assert bystander.holds == 0
        # The consumer takes and acks: still above half, still held; at half, they go on.
        taken = 2
        while publisher.holds:
            handle.settle_all_nowait([d.offset for d in consumer.deliveries[taken - 2 : taken]], ACK)
            handle.add_credit(2)
            taken += 2
            waiting = manager.ready_count("t")
            assert publisher.holds == (1 if waiting > HIGH // 2 else 0), waiting
        assert not manager.queues["t"].behind
        assert len(gates) == 1 and manager.flow.times_held == 1


async def test_a_queue_nobody_reads_holds_nobody(make_manager: Factory) -> None:
    """Without a consumer (or with one that filters, or a max-length, or a stream) a queue is
    bounded otherwise: its publishers are never held by it."""
    manager = make_manager()
    async with manager.running():
        gates = gated(manager)
        await declare(manager, "alone")
        await declare(manager, "limited", max_length=1000)
        await declare(manager, "stream", durable=True, mode="stream")
        await declare(manager, "picky")
        manager.consume("limited", Collector("l"))
        manager.consume("stream", Collector("s"))
        manager.consume("picky", Collector("p"), routing_filter="only.this")
        publisher = Publisher()
        for queue in ("alone", "limited", "stream", "picky"):
            publish(manager, publisher, 3 * HIGH, queue)
            assert not manager.queues[queue].behind, queue
        await wait_until(lambda: manager.info("stream").depth == 3 * HIGH)
        publish(manager, publisher, 1, "stream")
        assert publisher.holds == 0 and gates == []


async def test_the_last_consumer_leaving_lets_the_publishers_go(make_manager: Factory) -> None:
    manager = make_manager()
    async with manager.running():
        gated(manager)
        await declare(manager)
        handle = manager.consume("t", Collector("c"))
        publisher = Publisher()
        publish(manager, publisher, HIGH + 2)
        assert publisher.holds == 1
        await handle.cancel()
        assert publisher.holds == 0 and not manager.queues["t"].behind
        publish(manager, publisher, HIGH)  # nobody reads it now
        assert publisher.holds == 0


async def test_purge_and_delete_let_the_publishers_go(make_manager: Factory) -> None:
    manager = make_manager()
    async with manager.running():
        gated(manager)
        await declare(manager)
        manager.consume("t", Collector("c"))
        publisher = Publisher()
        publish(manager, publisher, HIGH + 2)
        assert publisher.holds == 1
        await manager.purge("t")
        assert publisher.holds == 0
        publish(manager, publisher, HIGH + 2)
        assert publisher.holds == 1
        await manager.delete("t")
        assert publisher.holds == 0


async def test_the_byte_mark_holds_too(make_manager: Factory) -> None:
    manager = make_manager()
    async with manager.running():
        gated(manager, high_bytes=1000)
        await declare(manager)
        manager.consume("t", Collector("c"))
        publisher = Publisher()
        publish(manager, publisher, 3, size=400)  # 1200 bytes waiting in three messages
        publish(manager, publisher, 1, size=400)
        assert publisher.holds == 1


async def test_a_durable_queue_holds_from_its_next_publish_after_the_turn(make_manager: Factory) -> None:
    """A durable work queue's consumers get its messages at the end of the turn: that is where it
    finds itself behind, and the publishes after it hold."""
    manager = make_manager()
    async with manager.running():
        gated(manager)
        await declare(manager, "d", durable=True)
        manager.consume("d", Collector("c")).add_credit(1)
        publisher = Publisher()
        publish(manager, publisher, HIGH + 2, "d")
        await wait_until(lambda: manager.queues["d"].behind)
        publish(manager, publisher, 1, "d")
        assert publisher.holds == 1


async def test_consumers_settling_nothing_are_closed_and_the_publishers_go_on(make_manager: Factory) -> None:
    manager = make_manager()
    async with manager.running():
        gates = gated(manager, timeout_s=5.0)
        await declare(manager)
        slow, other = Collector("slow"), Collector("other")
        handle = manager.consume("t", slow)
        handle.add_credit(2)
        manager.consume("t", other)  # no credit: it takes nothing either
        publisher = Publisher()
        publish(manager, publisher, HIGH + 4)
        assert publisher.holds == 1
        (gate,) = gates
        assert gate.check(3.0)  # 3 s without a settlement: keep holding
        handle.settle_all_nowait([slow.deliveries[0].offset], ACK)
        assert gate.check(3.0)  # it acked one: progress, the wait starts again
        assert gate.check(3.0)  # 3 s since
        assert slow.stalls == []
        assert not gate.check(3.0)  # 6 s since: stalled
        assert slow.stalls == [6.0] and other.stalls == [6.0]
        assert publisher.holds == 0 and gate.stuck
        publish(manager, publisher, 1)  # the consumers are closing: nobody is held meanwhile
        assert publisher.holds == 0
        assert manager.flow.stalls == 1 and manager.flow.closed == 2  # one queue, its two consumers
        # A consumer that comes while the queue is still behind gets its chance: held again for it.
        manager.consume("t", Collector("newcomer"))
        publish(manager, publisher, 1)
        assert publisher.holds == 1
