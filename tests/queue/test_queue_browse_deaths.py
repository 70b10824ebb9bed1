"""The manager's browsers, returned deliveries, ready counts and dead letters routed through a
DeadLetterRouter with their death records (issue 22), on SQLite and PostgreSQL."""

from __future__ import annotations

from typing import Any

import pytest

from tests.queue.conftest import Collector, Factory, wait_until
from trimaran.broker.message import Message
from trimaran.config import QueuePolicySettings
from trimaran.queue.policy import QueueError
from trimaran.storage import queue_store

pytestmark = pytest.mark.anyio


def msg(payload: bytes, topic: str = "$queue/q", **kw: object) -> Message:
    return Message(topic=topic, payload=payload, qos=1, **kw)  # type: ignore[arg-type]


async def test_a_browser_sees_everything_and_takes_nothing(make_manager: Factory) -> None:
    manager = make_manager()
    async with manager.running():
        for i in range(3):
            await manager.publish("q", msg(b"%d" % i))
        browser = Collector("browser")
        handle = manager.browse("q", browser)
        handle.set_credit(2)
        assert browser.payloads == [b"0", b"1"]
        handle.set_credit(10)
        assert browser.payloads == [b"0", b"1", b"2"]
        await manager.publish("q", msg(b"3"))
        await wait_until(lambda: len(browser.deliveries) == 4)
        consumer = Collector("consumer")
        consumer_handle = manager.consume("q", consumer)
        consumer_handle.add_credit(10)
        await wait_until(lambda: len(consumer.deliveries) == 4)
        assert manager.info("q").pending == 4  # held by the consumer, not by the browser
        await handle.cancel()
        assert manager.queues["q"].browsers == []


async def test_another_connections_exclusive_queue_is_not_browsed(make_manager: Factory) -> None:
    manager = make_manager()
    owner, other = object(), object()
    async with manager.running():
        await manager.publish("reply", msg(b"secret", topic="$queue/reply"))
        manager.owners["reply"] = owner
        with pytest.raises(QueueError) as refused:
            manager.browse("reply", Collector("other"), owner=other)
        assert refused.value.reason == "locked"
        with pytest.raises(QueueError):
            manager.browse("reply", Collector("nobody"))  # no owner given: not the owner either
        browser = Collector("owner")
        manager.browse("reply", browser, owner=owner).set_credit(10)
        assert browser.payloads == [b"secret"]


async def test_returned_deliveries_are_not_failed_attempts(make_manager: Factory) -> None:
    manager = make_manager(max_attempts=2, backoff_initial_s=0.0)
    async with manager.running():
        await manager.publish("q", msg(b"job"))
        consumer = Collector("c")
        handle = manager.consume("q", consumer)
        handle.add_credit(100)
        for n in range(1, 6):
            await wait_until(lambda n=n: len(consumer.deliveries) == n)  # type: ignore[misc]
            last = consumer.deliveries[-1]
            assert (last.attempt, last.failed, last.redelivered) == (n, 0, n > 1)
            assert handle.return_nowait(last.offset)
        await wait_until(lambda: len(consumer.deliveries) == 6)
        assert handle.nack_nowait(consumer.deliveries[-1].offset)  # a failed attempt
        await wait_until(lambda: len(consumer.deliveries) == 7)
        assert consumer.deliveries[-1].failed == 1
        assert handle.nack_nowait(consumer.deliveries[-1].offset)  # the second: max_attempts
        await wait_until(lambda: bool(manager.queues.get("$dlq/q") and manager.queues["$dlq/q"].messages))
    counts = queue_store.count_events(manager.storage.engine, "q")
    assert counts["delivered"] == 7 and counts["released"] == 5


async def test_ready_count_leaves_out_held_and_finished(make_manager: Factory) -> None:
    manager = make_manager()
    async with manager.running():
        for i in range(5):
            await manager.publish("q", msg(b"%d" % i))
        assert manager.ready_count("q") == 5
        consumer = Collector("c")
        handle = manager.consume("q", consumer)
        handle.add_credit(2)
        await wait_until(lambda: len(consumer.deliveries) == 2)
        assert manager.ready_count("q") == 3
        await handle.ack(consumer.deliveries[1].offset)  # acked out of order: not ready either
        assert manager.ready_count("q") == 3
        await handle.nack(consumer.deliveries[0].offset, 0)
        handle.set_credit(0)
        assert manager.ready_count("q") == 4
        other = Collector("g")
        manager.consume("q", other, group="g")  # a second group: counted the slow way
        assert manager.ready_count("q") == 4
        assert manager.ready_count("q", "g") == 4  # what the new group can still see
        assert manager.ready_count("missing") == 0


class Router:
    """A DeadLetterRouter: every letter to the queues bound to ``exchange`` (fanout)."""

    def __init__(self, bound: dict[str, list[str]]) -> None:
        self.bound = bound
        self.asked: list[tuple[str, str]] = []

    def dead_letter_queues(self, exchange: str, routing_key: str, message: Message) -> list[str]:
        self.asked.append((exchange, routing_key))
        return self.bound.get(exchange, [])


async def test_expired_and_rejected_letters_go_through_the_router(make_manager: Factory) -> None:
    manager = make_manager()
    async with manager.running():
        router = Router({"dlx": ["a", "b"]})
        manager.dead_letter_router = router
        for name in ("a", "b"):
            await manager.declare(name)
        policy = QueuePolicySettings(dead_letter="none", dead_letter_exchange="dlx", ttl_s=0.05)
        await manager.declare("src", policy)
        await manager.publish("src", msg(b"late", "$queue/src"))
        await wait_until(lambda: all(manager.queues[n].messages for n in ("a", "b")))
        assert router.asked == [("dlx", "src")]
        letter = next(iter(manager.queues["a"].messages.values())).message
        deaths = letter.extra["deaths"]
        assert isinstance(deaths, list) and len(deaths) == 1
        death: dict[str, Any] = deaths[0]
        assert (death["queue"], death["reason"], death["count"], death["exchange"]) == (
            "src",
            "expired",
            1,
            "",
        )
        assert death["routing_keys"] == ["src"]
        assert letter.extra["first_death"] == {"queue": "src", "reason": "expired", "exchange": ""}
        assert (letter.extra["exchange"], letter.extra["routing_key"]) == ("dlx", "src")
        assert letter.expires_at_ms is None
        assert manager.queues["src"].messages == {}
        # Rejected with a dead-letter routing key, through an exchange nobody is bound to: dropped.
        await manager.declare(
            "src2",
            QueuePolicySettings(
                dead_letter="none", dead_letter_exchange="nowhere", dead_letter_routing_key="k"
            ),
        )
        await manager.publish("src2", msg(b"bad", "$queue/src2"))
        consumer = Collector("c")
        handle = manager.consume("src2", consumer)
        handle.add_credit(1)
        await wait_until(lambda: bool(consumer.deliveries))
        assert await handle.reject(consumer.deliveries[0].offset)
        assert router.asked[-1] == ("nowhere", "k")
        assert manager.queues["src2"].messages == {}
