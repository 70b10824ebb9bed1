"""Crash safety: kill -9 a publishing process; every publish that returned is in the database."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

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
