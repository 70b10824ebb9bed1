"""The queue manager tells the broker's event bus about acks, nacks, rejects, dead letters, expiry."""

from __future__ import annotations

import anyio
import pytest

from tests.queue.conftest import Collector, Factory, wait_until
from trimaran.broker.events import EVENT_TYPES, BusEvent, EventBus
from trimaran.broker.message import Message
from trimaran.config import QueuePolicySettings

pytestmark = pytest.mark.anyio


def msg(payload: bytes) -> Message:
    return Message(topic="$queue/q", payload=payload, qos=1, publisher_id="p")


async def test_settlements_dead_letters_and_expiry_are_events(make_manager: Factory) -> None:
    manager = make_manager(max_attempts=2, backoff_initial_s=0)
    bus = EventBus()
    heard: list[BusEvent] = []
    bus.subscribe(heard.append, [t for t in EVENT_TYPES if t.startswith("queue.")] + ["message.published"])
    manager.events = bus
    async with manager.running():
        c = Collector("c")
        h = manager.consume("q", c)
        h.add_credit(10)
        for payload in (b"good", b"bad", b"poison"):
            await manager.publish("q", msg(payload))
        await wait_until(lambda: len(c.deliveries) == 3)
        assert await h.ack(0)
        assert await h.reject(1, "invalid order")
        assert await h.nack(2)
        await wait_until(lambda: len(c.deliveries) == 4)
        assert await h.nack(2)  # attempt 2 of 2: dead-lettered
        await manager.declare("t", QueuePolicySettings(ttl_s=0.05))
        await manager.publish("t", msg(b"old"))
        await anyio.sleep(0.1)
        manager.consume("t", Collector("t")).add_credit(1)  # finds the message expired
        await wait_until(lambda: any(e.type == "queue.expired" for e in heard))
    seen = [(e.type, e.data.get("queue"), e.data.get("offset")) for e in heard]
    assert seen == [
        ("message.published", "q", 0),
        ("message.published", "q", 1),
        ("message.published", "q", 2),
        ("queue.acked", "q", 0),
        ("queue.rejected", "q", 1),
        ("queue.dead_lettered", "q", 1),
        ("queue.nacked", "q", 2),
        ("queue.nacked", "q", 2),
        ("queue.dead_lettered", "q", 2),
        ("message.published", "t", 0),
        ("queue.expired", "t", 0),
    ]
    by_type = {e.type: e.data for e in heard}
    assert by_type["queue.acked"] == {
        "queue": "q", "group": "$default", "offset": 0, "consumer": "c", "attempt": 1, "reason": None,
    }  # fmt: skip
    assert heard[4].data["reason"] == "invalid order"
    assert by_type["queue.dead_lettered"]["reason"] == "max_attempts"
    assert by_type["queue.dead_lettered"]["dead_letter_queue"] == "$dlq/q"
    assert heard[0].payload == b"good" and heard[0].data["client_id"] == "p"
