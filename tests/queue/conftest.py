from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import anyio
import pytest

from trimaran.broker.events import EventBus
from trimaran.broker.message import Message
from trimaran.config import QueuePolicySettings, QueueSettings, StorageSettings
from trimaran.queue import QueueDelivery, QueueManager
from trimaran.queue.changes import Changes
from trimaran.queue.groups import Group, QueueState, StoredMessage
from trimaran.queue.journal import MemoryJournal
from trimaran.storage.store import Storage


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class Collector:
    """A front end's consumer: records deliveries."""

    def __init__(self, id: str) -> None:
        self.id = id
        self.deliveries: list[QueueDelivery] = []
        self.stalls: list[float] = []  # queue/flow.py closed it for taking nothing, after so long

    def deliver(self, delivery: QueueDelivery) -> None:
        self.deliveries.append(delivery)

    def stalled(self, idle_s: float) -> None:
        self.stalls.append(idle_s)

    @property
    def payloads(self) -> list[bytes]:
        return [d.message.payload for d in self.deliveries]


async def wait_until(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    with anyio.fail_after(timeout):
        while not predicate():
            await anyio.sleep(0.005)


Factory = Callable[..., QueueManager]


@pytest.fixture
def make_manager(storage_url: str) -> Iterator[Factory]:
    storages: list[Storage] = []

    def build(
        *,
        auto_create: bool = True,
        node: str = "local",
        shared: bool = False,
        claim_batch: int = 100,
        **defaults: Any,
    ) -> QueueManager:
        storage = Storage.from_url(storage_url, sqlite_synchronous="normal")
        storage.migrate()
        storages.append(storage)
        settings = QueueSettings(auto_create=auto_create, defaults=QueuePolicySettings(**defaults))
        return QueueManager(
            storage,
            settings,
            StorageSettings(commit_interval_ms=1.0),
            node=node,
            shared=shared,
            claim_batch=claim_batch,
        )

    yield build
    for storage in storages:
        storage.close()


class Taker:
    """A consumer handle as the groups see it, without a manager."""

    def __init__(
        self, id: str, *, credit: int = 100, auto_ack: bool = False, routing_filter: str | None = None
    ):
        self.consumer = Collector(id)
        self.routing_filter = routing_filter
        self.auto_ack = auto_ack
        self.credit = credit
        self.closed = False


class Rooms:
    """The groups' Host without a manager: a memory journal, a private bus, and what reaches past
    one group recorded (dead letters, timers) or done plainly (removal)."""

    def __init__(self) -> None:
        self.journal = MemoryJournal()
        self.events = EventBus()
        self.wake_at = 2**62  # the timers sleep until something is due
        self.letters: list[tuple[str, str, int, int, str]] = []  # (queue, group, offset, attempts, reason)
        self.timers: list[int] = []

    def queue(self, name: str = "q", *, durable: bool = True, **policy: Any) -> QueueState:
        return QueueState(name, QueuePolicySettings(**policy), durable, 0)

    def append(self, state: QueueState, payload: bytes, *, at: int = 0, key: str = "") -> StoredMessage:
        """A committed publish, as the manager appends it."""
        offset = state.next_offset
        state.next_offset += 1
        stored = StoredMessage(
            offset, Message(topic=f"$queue/{state.name}", payload=payload), key, at, None, len(payload)
        )
        ch = Changes()
        self.journal.appended(ch, state, stored)
        self.journal.submit(ch)
        state.add(stored)
        return stored

    def remove(self, state: QueueState, offset: int, kind: str, reason: str, now: int, ch: Changes) -> None:
        if state.remove(offset) is None:
            return
        for group in state.groups.values():
            entry = group.entries.pop(offset, None)
            if entry is not None:
                group.unready(offset)
                self.journal.pending_gone(ch, state, group, offset, entry)
        self.journal.removed(ch, state, offset)
        self.journal.event(ch, state, now, kind, offset=offset, reason=reason)

    def expire(self, state: QueueState, offset: int, now: int, ch: Changes) -> None:
        self.remove(state, offset, "expired", "ttl", now, ch)

    def dead_letter(
        self,
        state: QueueState,
        group: Group,
        stored: StoredMessage,
        attempts: int,
        reason: str,
        now: int,
        ch: Changes,
    ) -> None:
        self.letters.append((state.name, group.name, stored.offset, attempts, reason))

    def due(self, state: QueueState, group: Group, at: int) -> None:
        group.timed = True
        self.timers.append(at)
        self.wake_at = min(self.wake_at, at)
