"""Crash safety: kill -9 a publishing process; every publish that returned is in the database; after
an unclean stop, redeliveries are flagged."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import anyio
import pytest

from tests.queue.conftest import Collector, Factory, wait_until
from trimaran.broker.message import Message
from trimaran.queue import QueueDelivery, QueueManager
from trimaran.storage import queue_store
from trimaran.storage.store import Storage

PUBLISHER = textwrap.dedent(
    """
    import sys, anyio
    from trimaran.broker.message import Message
    from trimaran.config import QueueSettings, StorageSettings
    from trimaran.queue import QueueManager
    from trimaran.storage.store import Storage

    async def publisher(manager, n):
        i = 0
        while True:
            result = await manager.publish("crash", Message(topic="$queue/crash", payload=b"%d" % i, qos=1))
            print(result.offset, flush=True)
            i += 1

    async def main():
        storage = Storage.from_url(sys.argv[1])
        storage.migrate()
        manager = QueueManager(storage, QueueSettings(), StorageSettings(commit_interval_ms=1))
        async with manager.running(), anyio.create_task_group() as tg:
            for n in range(4):
                tg.start_soon(publisher, manager, n)

    anyio.run(main)
    """
)


def test_every_returned_publish_survives_kill_9(storage_url: str) -> None:
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    proc = subprocess.Popen(
        [sys.executable, "-c", PUBLISHER, storage_url],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    confirmed: list[int] = []
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 30
        while len(confirmed) < 300 and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            confirmed.append(int(line))
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert len(confirmed) >= 300, proc.stderr.read() if proc.stderr else ""
    storage = Storage.from_url(storage_url)
    try:
        stored = set(queue_store.stored_offsets(storage.engine, "crash"))
        events = queue_store.count_events(storage.engine, "crash")
    finally:
        storage.close()
    assert set(confirmed) <= stored
    assert events["published"] >= len(confirmed)


async def _first_deliveries(manager: QueueManager, count: int) -> list[QueueDelivery]:
    async with manager.running():
        consumer = Collector("c")
        manager.consume("q", consumer).add_credit(count)
        await wait_until(lambda: len(consumer.deliveries) == count)
        return consumer.deliveries


@pytest.mark.anyio
async def test_after_an_unclean_stop_first_deliveries_are_flagged(make_manager: Factory) -> None:
    """A dead process may have sent messages whose delivery it never committed (deliveries are
    recorded without waiting): after it, a first delivery is flagged redelivered, since a false flag
    promises the message was never seen. After a clean stop SQL is exact and nothing is flagged."""
    crashed = make_manager()
    async with anyio.create_task_group() as tg:
        await crashed.start(tg)
        for i in range(3):
            await crashed.publish("q", Message(topic="$queue/q", payload=b"%d" % i, qos=1))
        tg.cancel_scope.cancel()  # gone without stop(): what kill -9 leaves behind
    try:
        after_crash = await _first_deliveries(make_manager(), 3)
    finally:
        await crashed.writer.stop()
    assert [(d.attempt, d.redelivered) for d in after_crash] == [(1, True)] * 3

    clean = make_manager()
    async with clean.running():
        await clean.publish("q", Message(topic="$queue/q", payload=b"new", qos=1))
    after_clean = await _first_deliveries(make_manager(), 4)  # the three come back: none was acked
    assert [(d.attempt, d.redelivered) for d in after_clean] == [(2, True)] * 3 + [(1, False)]
