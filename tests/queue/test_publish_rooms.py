"""One durable publish enters each room once on its way queue -> journal -> storage (issue 35).

The rooms a publish passes through on the event loop's thread are traced (tests/support/rooms.py)
in legs: the call itself; for a work queue, the end of the loop's turn that hands the turn's rows
to the writer; and the commit's callback that tells the publisher. In each leg no room (module) is
entered twice: the manager hands the journal a finished row, and only the journal talks to
storage/. A stream delivers only what is committed: after the commit the writer enters the manager
once more, per batch and not per publish, to deliver what the batch made deliverable.
"""

from __future__ import annotations

import anyio
import pytest

from tests.queue.conftest import Factory
from tests.support.rooms import RoomTrace
from trimaran.broker.message import Message
from trimaran.compiled import ENV, compiled_modules
from trimaran.queue.manager import PublishResult, QueueManager
from trimaran.queue.policy import QueueError

# The rooms are traced through sys.setprofile, which sees no call inside a module compiled by mypyc.
pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(
        "trimaran.queue.manager" in compiled_modules(),
        reason=f"the queue rooms run compiled (make compile); {ENV}=1 traces them",
    ),
]


async def trace_one_publish(manager: QueueManager) -> RoomTrace:
    """The rooms one publish_nowait enters on this thread, until its publisher is told."""
    await manager.publish("q", Message(topic="$queue/q", payload=b"warm", qos=1))  # the queue exists
    await anyio.sleep(0.05)  # and its commit is in
    committed = anyio.Event()

    def done(result: PublishResult, error: QueueError | None) -> None:
        assert error is None and result.offset == 1
        committed.set()

    message = Message(topic="$queue/q", payload=b"x", qos=1)
    trace = RoomTrace()
    with trace.running():
        manager.publish_nowait("q", message, done=done)
        with anyio.fail_after(5):
            await committed.wait()
    return trace


def storage_only_through_the_journal(trace: RoomTrace) -> bool:
    """storage/ is entered from the journal only (the writer's commit callback begins a leg)."""
    into = [e for e in trace.entries if e.room.startswith("storage/") and not e.from_outside]
    return bool(into) and {e.came_from for e in into} == {"queue/journal"}


async def test_a_work_queue_publish_enters_each_room_once(make_manager: Factory) -> None:
    manager = make_manager(mode="work")
    async with manager.running():
        trace = await trace_one_publish(manager)
    legs = trace.legs()
    queue_legs = [
        leg for leg in legs if any(e.room.startswith("queue/") for e in leg)
    ]  # not the writer's wake
    assert [str(leg[0]) for leg in queue_legs] == [
        "queue/manager(publish_nowait)",
        "queue/manager(_flush_now)",
        "storage/writer(_completed)",
    ], trace.describe()
    for leg in legs:
        assert not trace.rooms_entered_twice(leg), trace.describe()
    assert storage_only_through_the_journal(trace), trace.describe()


async def test_a_stream_publish_enters_each_room_once_until_its_commit(make_manager: Factory) -> None:
    manager = make_manager(mode="stream")
    async with manager.running():
        trace = await trace_one_publish(manager)
    publish, *after_commit = [leg for leg in trace.legs() if any(e.room.startswith("queue/") for e in leg)]
    assert str(publish[0]) == "queue/manager(publish_nowait)", trace.describe()
    assert not trace.rooms_entered_twice(publish), trace.describe()
    assert storage_only_through_the_journal(trace), trace.describe()
    assert [[str(e) for e in leg if e.room == "queue/manager"] for leg in after_commit] == [
        ["queue/manager(finished)", "queue/manager(_flush_dirty)"]
    ], trace.describe()
