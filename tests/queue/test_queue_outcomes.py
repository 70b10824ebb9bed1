"""Settlement as a typed outcome: each hull's mapping, and what each outcome does to a delivery."""

from __future__ import annotations

import pytest

from tests.queue.conftest import Collector, Factory, wait_until
from trimaran.amqp091.channels import BASIC_OUTCOMES
from trimaran.amqp1.links import disposition_outcome
from trimaran.amqp1.performatives import Accepted, Error, Modified, Rejected, Released
from trimaran.amqp1.types import Symbol
from trimaran.broker.message import Message
from trimaran.config import QueuePolicySettings
from trimaran.mqtt.queues import puback_outcome
from trimaran.queue.outcomes import ACK, RELEASED, RETRY_NOW, Ack, Commit, DeadLetter, Retry

pytestmark = pytest.mark.anyio


def test_mqtt_reason_codes() -> None:
    assert puback_outcome(0x00) == Ack()
    assert puback_outcome(0x10) == Ack()  # no matching subscribers: still done
    assert puback_outcome(0x80) == Retry()
    assert puback_outcome(0x83) == DeadLetter("client reason code 0x83")
    assert puback_outcome(0x99) == DeadLetter("client reason code 0x99")


def test_amqp091_settlements() -> None:
    assert BASIC_OUTCOMES["ack"] == ACK
    assert BASIC_OUTCOMES["requeue"] == RETRY_NOW == Retry(0.0)
    assert BASIC_OUTCOMES["reject"] == DeadLetter("rejected by the AMQP 0.9.1 consumer")


def test_amqp1_delivery_states() -> None:
    assert disposition_outcome(None, "r") == ACK
    assert disposition_outcome(Accepted(), "r") == ACK
    rejected = Rejected(error=Error(condition=Symbol("app:bad"), description="cannot parse"))
    assert disposition_outcome(rejected, "r") == DeadLetter("rejected by r: cannot parse")
    assert disposition_outcome(Rejected(), "r") == DeadLetter("rejected by r: rejected")
    assert disposition_outcome(Released(), "r") == RELEASED == Retry(0.0, failed=False)
    assert disposition_outcome(Modified(delivery_failed=True), "r") == Retry(None)
    assert disposition_outcome(Modified(), "r") == RELEASED


def msg(payload: bytes, queue: str = "q") -> Message:
    return Message(topic=f"$queue/{queue}", payload=payload, qos=1)


async def test_each_outcome_settles_as_before(make_manager: Factory) -> None:
    manager = make_manager(max_attempts=5)
    async with manager.running():
        inbox = Collector("c")
        handle = manager.consume("q", inbox)
        handle.add_credit(100)
        for payload in (b"ack", b"retry", b"released", b"dead"):
            await manager.publish("q", msg(payload))
        await wait_until(lambda: len(inbox.deliveries) == 4)
        by = {d.message.payload: d for d in inbox.deliveries}
        assert handle.settle_nowait(by[b"ack"].offset, ACK)
        assert handle.settle_nowait(by[b"retry"].offset, RETRY_NOW)
        assert handle.settle_nowait(by[b"released"].offset, RELEASED)
        assert handle.settle_nowait(by[b"dead"].offset, DeadLetter("poison"))
        await wait_until(lambda: len(inbox.deliveries) == 6)
        again = {d.message.payload: d for d in inbox.deliveries[4:]}
        assert set(again) == {b"retry", b"released"}
        assert again[b"retry"].failed == 1  # a failed attempt
        assert again[b"released"].failed == 0  # handed back unprocessed
        assert not handle.settle_nowait(by[b"ack"].offset, ACK)  # settled already
        dead = Collector("d")
        manager.consume("$dlq/q", dead).add_credit(10)
        await wait_until(lambda: dead.payloads == [b"dead"])
        reasons = dict(dead.deliveries[0].message.user_properties)
        assert reasons["x-dead-letter-reason"] == "poison"


async def test_commit_moves_a_stream_group(make_manager: Factory) -> None:
    manager = make_manager()
    async with manager.running():
        await manager.declare("s", QueuePolicySettings(mode="stream"))
        for i in range(3):
            await manager.publish("s", msg(b"%d" % i, "s"))
        inbox = Collector("c")
        handle = manager.consume("s", inbox, group="g", start="first")
        handle.add_credit(10)
        await wait_until(lambda: len(inbox.deliveries) == 3)
        assert handle.settle_nowait(1, Commit(1))
        await wait_until(lambda: manager.info("s").groups["g"].committed == 2)
