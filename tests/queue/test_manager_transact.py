"""QueueManager.transact: a local transaction's publishes and settlements in one change (one
writer submission, so one SQL transaction), kept across a restart; refused whole, before any
change, when a publish is refused or a settled delivery went back to its queue."""

from __future__ import annotations

from typing import Any

import pytest

from tests.queue.conftest import Collector, Factory, wait_until
from trimaran.broker.message import Message
from trimaran.queue.outcomes import ACK
from trimaran.queue.policy import QueueError

pytestmark = pytest.mark.anyio


def msg(payload: bytes, topic: str = "$queue/q") -> Message:
    return Message(topic=topic, payload=payload, qos=1)


async def test_publishes_and_acks_commit_as_one_submission(make_manager: Factory) -> None:
    manager = make_manager()
    async with manager.running():
        await manager.publish("src", msg(b"x"))
        await manager.publish("src", msg(b"y"))
        c = Collector("c")
        handle = manager.consume("src", c)
        handle.add_credit(2)
        await wait_until(lambda: len(c.deliveries) == 2)
        await manager.declare("dst")  # (an auto-created queue's row would go ahead on its own)
        writer: Any = manager.journal.writer
        submitted: list[object] = []
        submit = writer.submit
        writer.submit = lambda batch, **kw: (submitted.append(batch), submit(batch, **kw))[1]
        outcome: list[QueueError | None] = []
        manager.transact(
            [("dst", msg(b"moved"), ""), ("dst", msg(b"too"), "")], [(handle, 0, ACK)], outcome.append
        )
        await wait_until(lambda: bool(outcome))
        writer.submit = submit
        assert outcome == [None]
        assert len(submitted) == 1  # the two publishes and the ack: one batch, one commit
    again = make_manager()
    async with again.running():
        src, dst = Collector("src"), Collector("dst")
        again.consume("src", src).add_credit(5)
        again.consume("dst", dst).add_credit(5)
        await wait_until(lambda: len(src.deliveries) == 1 and len(dst.deliveries) == 2)
        assert src.payloads == [b"y"]  # x was acknowledged with the publishes
        assert dst.payloads == [b"moved", b"too"]


async def test_refused_whole_when_a_delivery_went_back(make_manager: Factory) -> None:
    manager = make_manager()
    async with manager.running():
        await manager.publish("src", msg(b"x"))
        c = Collector("c")
        handle = manager.consume("src", c)
        handle.add_credit(1)
        await wait_until(lambda: len(c.deliveries) == 1)
        await handle.cancel()  # the delivery goes back to the queue
        outcome: list[QueueError | None] = []
        with pytest.raises(QueueError, match="went back to the queue"):
            manager.transact([("dst", msg(b"moved"), "")], [(handle, 0, ACK)], outcome.append)
        assert outcome == []
        other = Collector("o")
        manager.consume("src", other).add_credit(1)
        await wait_until(lambda: len(other.deliveries) == 1)
        assert manager.ready_count("dst") == 0  # nothing of the transaction was published


async def test_refused_whole_when_a_publish_is_refused(make_manager: Factory) -> None:
    manager = make_manager(max_length=1, overflow="reject")
    async with manager.running():
        await manager.publish("full", msg(b"one"))
        outcome: list[QueueError | None] = []
        with pytest.raises(QueueError) as caught:
            manager.transact([("ok", msg(b"a"), ""), ("full", msg(b"b"), "")], [], outcome.append)
        assert caught.value.reason == "full"
        assert manager.ready_count("ok") == 0 and outcome == []
