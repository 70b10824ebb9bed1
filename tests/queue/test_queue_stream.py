"""Streams: start positions, commits (ack, auto, explicit), retention, resume after restart."""

from __future__ import annotations

import anyio
import pytest

from tests.queue.conftest import Collector, Factory, wait_until
from trimaran.broker.message import Message, now_ms
from trimaran.config import QueuePolicySettings
from trimaran.queue import commit_by_id
from trimaran.storage import queue_store

pytestmark = pytest.mark.anyio

STREAM = QueuePolicySettings(mode="stream")


def msg(payload: bytes) -> Message:
    return Message(topic="$queue/s", payload=payload, qos=1)


async def fill(manager: object, n: int) -> None:
    for i in range(n):
        await manager.publish("s", msg(b"%d" % i))  # type: ignore[attr-defined]


async def test_start_positions(make_manager: Factory) -> None:
    manager = make_manager()
    async with manager.running():
        await manager.declare("s", STREAM)
        await fill(manager, 3)
        await anyio.sleep(0.01)
        middle = now_ms()
        await anyio.sleep(0.01)
        await fill(manager, 2)  # offsets 3, 4
        expected: dict[str | int, list[int]] = {
            "first": [0, 1, 2, 3, 4],
            "last": [4],
            "next": [],
            2: [2, 3, 4],
            "3": [3, 4],
        }
        expected[f"timestamp:{middle}"] = [3, 4]
        collectors = {}
        for i, (start, _) in enumerate(expected.items()):
            c = collectors[start] = Collector(f"c{i}")
            manager.consume("s", c, group=f"g{i}", start=start).add_credit(10)
        await wait_until(lambda: all(len(collectors[s].deliveries) == len(v) for s, v in expected.items()))
        for start, offsets in expected.items():
            assert [d.offset for d in collectors[start].deliveries] == offsets, start
        await manager.publish("s", msg(b"5"))
        await wait_until(lambda: [d.offset for d in collectors["next"].deliveries] == [5])
        assert manager.info("s").depth == 6  # streams keep messages after delivery


async def test_commits_and_resume_after_restart(make_manager: Factory) -> None:
    first = make_manager()
    async with first.running():
        await first.declare("s", STREAM)
        await fill(first, 6)
        a, b, c = Collector("a"), Collector("b"), Collector("c")
        ha = first.consume("s", a, group="acks", start="first")
        first.consume("s", b, group="auto", start="first", auto_ack=True).add_credit(4)
        first.consume("s", c, group="explicit", start="first").add_credit(6)
        ha.add_credit(6)
        await wait_until(lambda: len(a.deliveries) == 6 and len(b.deliveries) == 4 and len(c.deliveries) == 6)
        assert await ha.ack(1)  # commits up to and including offset 1
        assert await commit_by_id(first, "s:4", group="explicit")
        info = first.info("s")
        assert info.groups["acks"].committed == 2
        assert info.groups["auto"].committed == 4
        assert info.groups["explicit"].committed == 5
    second = make_manager()
    async with second.running():
        got = {}
        for group in ("acks", "auto", "explicit"):
            got[group] = Collector(group)
            second.consume("s", got[group], group=group).add_credit(10)
        await wait_until(lambda: sum(len(c.deliveries) for c in got.values()) == 4 + 2 + 1)
        assert [d.offset for d in got["acks"].deliveries] == [2, 3, 4, 5]
        assert [d.offset for d in got["auto"].deliveries] == [4, 5]
        assert [d.offset for d in got["explicit"].deliveries] == [5]
    counts = queue_store.count_events(second.storage.engine, "s")
    assert counts["committed"] >= 6


async def test_retention_by_count(make_manager: Factory) -> None:
    manager = make_manager()
    async with manager.running():
        await manager.declare("s", QueuePolicySettings(mode="stream", retention_count=3))
        await fill(manager, 5)
        await wait_until(lambda: manager.info("s").depth == 3, timeout=3)
        c = Collector("c")
        manager.consume("s", c, start="first").add_credit(10)
        await wait_until(lambda: len(c.deliveries) == 3)
        assert [d.offset for d in c.deliveries] == [2, 3, 4]
    assert queue_store.stored_offsets(manager.storage.engine, "s") == [2, 3, 4]


async def test_uncommitted_deliveries_are_read_again_by_the_next_consumer(make_manager: Factory) -> None:
    """Without a restart too: a group's new first consumer resumes at the committed offset."""
    manager = make_manager()
    async with manager.running():
        await manager.declare("s", STREAM)
        await fill(manager, 4)
        first = Collector("first")
        handle = manager.consume("s", first, group="g", start="first")
        handle.add_credit(10)
        await wait_until(lambda: len(first.deliveries) == 4)
        assert await handle.ack(1)  # committed through offset 1; 2 and 3 only delivered
        await handle.cancel()
        second = Collector("second")
        manager.consume("s", second, group="g").add_credit(10)
        await wait_until(lambda: len(second.deliveries) == 2)
        assert [d.offset for d in second.deliveries] == [2, 3]
        other = Collector("other")  # a second consumer joining a live group does not rewind it
        manager.consume("s", other, group="g").add_credit(10)
        await fill(manager, 1)
        await wait_until(lambda: len(second.deliveries) + len(other.deliveries) == 3)
        assert sorted(d.offset for d in second.deliveries + other.deliveries) == [2, 3, 4]
