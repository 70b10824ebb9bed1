from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import anyio
import pytest

from trimaran.config import QueuePolicySettings, QueueSettings, StorageSettings
from trimaran.queue import QueueDelivery, QueueManager
from trimaran.storage.store import Storage


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class Collector:
    """A front end's consumer: records deliveries."""

    def __init__(self, id: str) -> None:
        self.id = id
        self.deliveries: list[QueueDelivery] = []

    def deliver(self, delivery: QueueDelivery) -> None:
        self.deliveries.append(delivery)

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
        *, auto_create: bool = True, node: str = "local", shared: bool = False, **defaults: Any
    ) -> QueueManager:
        storage = Storage.from_url(storage_url, sqlite_synchronous="normal")
        storage.migrate()
        storages.append(storage)
        settings = QueueSettings(auto_create=auto_create, defaults=QueuePolicySettings(**defaults))
        return QueueManager(
            storage, settings, StorageSettings(commit_interval_ms=1.0), node=node, shared=shared
        )

    yield build
    for storage in storages:
        storage.close()
