"""The AMQP 0.9.1 front end in-process: broker, queue manager on SQLite and the exchange store, on
the connection runtime (a ``Runner``), for tests that drive it through ``Wire`` or a real socket."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path

import anyio

from trimaran.amqp091.conn import Amqp091Conn
from trimaran.amqp091.handler import Amqp091FrontEnd
from trimaran.broker.core import Broker
from trimaran.config import Settings, StorageSettings
from trimaran.queue.manager import QueueManager
from trimaran.runtime.runner import Runner
from trimaran.runtime.transport import Conn
from trimaran.storage.amqp_store import AmqpStore
from trimaran.storage.store import Storage


@dataclass
class Deck:
    front: Amqp091FrontEnd
    manager: QueueManager
    runner: Runner

    def open(self, io: Conn, first: bytes) -> Amqp091Conn:
        return self.front.open(io)

    def contents(self, queue: str) -> list[bytes]:
        state = self.manager.queues.get(queue)
        return [] if state is None else [m.message.payload for m in state.messages.values()]


@asynccontextmanager
async def running(tmp_path: Path, settings: Settings | None = None) -> AsyncIterator[Deck]:
    storage = Storage.from_url(f"sqlite:///{tmp_path / 'trimaran.db'}", sqlite_synchronous="normal")
    storage.migrate()
    settings = settings or Settings()
    manager = QueueManager(storage, settings.queues, StorageSettings(commit_interval_ms=1.0))
    front = Amqp091FrontEnd(Broker(), settings, manager, AmqpStore(storage.engine))
    runner = Runner()
    try:
        async with anyio.create_task_group() as tasks:
            await manager.start(tasks)
            await tasks.start(runner.run)
            await tasks.start(front.run)
            yield Deck(front, manager, runner)
            tasks.cancel_scope.cancel()
    finally:
        await manager.stop()
        storage.close()


@contextmanager
def serving(tmp_path: Path, settings: Settings | None = None) -> Iterator[int]:
    """The front end on a real socket (127.0.0.1, a free port) in a thread of its own, for
    blocking clients such as pika; yields the port."""
    ready = threading.Event()
    stop = threading.Event()
    port: list[int] = []
    errors: list[BaseException] = []

    async def main() -> None:
        async with running(tmp_path, settings) as deck:
            bound = await deck.runner.serve("amqp", "127.0.0.1", 0, deck.open)
            port.append(bound[0][1])
            ready.set()
            while not stop.is_set():
                await anyio.sleep(0.02)
            with anyio.move_on_after(5):
                await deck.runner.shutdown()

    def thread_main() -> None:
        try:
            anyio.run(main)
        except BaseException as exc:  # reported to the test
            errors.append(exc)
            ready.set()

    thread = threading.Thread(target=thread_main, daemon=True)
    thread.start()
    ready.wait(10)
    if errors:
        raise errors[0]
    try:
        yield port[0]
    finally:
        stop.set()
        thread.join(10)
    if errors:
        raise errors[0]
