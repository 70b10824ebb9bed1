"""The deck: publish fans out to endpoints of any protocol; retained changes are written behind."""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import pytest

from trimaran.admin.telemetry import Telemetry
from trimaran.broker.core import Broker
from trimaran.broker.message import Message
from trimaran.broker.router import Delivery, SubscriptionOptions
from trimaran.config import TelemetrySettings
from trimaran.storage.mqtt_store import MqttStore
from trimaran.storage.store import Storage

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@dataclass(eq=False)
class Inbox:
    id: str
    got: list[tuple[str, int]] = field(default_factory=list)

    def __hash__(self) -> int:
        return id(self)

    def deliver(self, message: Message, delivery: Delivery[Any]) -> None:
        self.got.append((message.topic, min(message.qos, delivery.qos)))


def test_publish_reaches_each_matching_endpoint_once() -> None:
    broker = Broker(sys_interval=0)
    a, b = Inbox("a"), Inbox("b")
    broker.router.subscribe(a, "s/+", SubscriptionOptions(qos=1))
    broker.router.subscribe(a, "s/#", SubscriptionOptions(qos=0))
    broker.router.subscribe(b, "other", SubscriptionOptions())
    assert broker.publish(Message("s/x", b"1", qos=1)) == 1
    assert a.got == [("s/x", 1)] and b.got == []


def test_sys_topics_are_published_to_sys_subscribers_only() -> None:
    broker = Broker(sys_interval=0)
    everything, sys = Inbox("all"), Inbox("sys")
    broker.router.subscribe(everything, "#", SubscriptionOptions())
    broker.router.subscribe(sys, "$SYS/broker/clients/+", SubscriptionOptions())
    broker.stats.client_connected()
    broker.publish_sys()
    assert everything.got == []
    assert sorted(topic for topic, _ in sys.got) == [
        "$SYS/broker/clients/connected",
        "$SYS/broker/clients/maximum",
        "$SYS/broker/clients/total",
    ]
    assert broker.retained.get("$SYS/broker/clients/connected") is not None


def test_a_sys_value_is_published_again_only_when_it_changed() -> None:
    """As Mosquitto's $SYS: each period publishes the values that changed, and one whose retained
    message went (a clear) again."""
    broker = Broker(sys_interval=0)
    sys = Inbox("sys")
    broker.router.subscribe(sys, "$SYS/broker/clients/+", SubscriptionOptions())
    broker.publish_sys()
    assert len(sys.got) == 3
    sys.got.clear()
    broker.publish_sys()
    assert sys.got == []
    broker.stats.client_connected()
    broker.publish_sys()
    assert sorted(topic for topic, _ in sys.got) == [
        "$SYS/broker/clients/connected",
        "$SYS/broker/clients/maximum",
        "$SYS/broker/clients/total",
    ]
    sys.got.clear()
    broker.retained.delete("$SYS/broker/clients/total")
    broker.publish_sys()
    assert sys.got == [("$SYS/broker/clients/total", 0)]


async def test_retained_changes_survive_a_new_broker(tmp_path: Path) -> None:
    storage = Storage.from_url(f"sqlite:///{tmp_path / 'r.db'}")
    storage.migrate()
    try:
        broker = Broker(MqttStore(storage.engine), sys_interval=0)
        async with anyio.create_task_group() as tg:
            await tg.start(broker.run)
            broker.publish(Message("keep", b"v1", retain=True))
            broker.publish(Message("gone", b"v", retain=True))
            broker.publish(Message("gone", b"", retain=True))  # an empty payload clears
            await anyio.sleep(0.2)  # written behind, without a flush
            broker.publish(Message("late", b"v", retain=True))
            await broker.flush()
            tg.cancel_scope.cancel()
        again = Broker(MqttStore(storage.engine), sys_interval=0)
        async with anyio.create_task_group() as tg:
            await tg.start(again.run)
            tg.cancel_scope.cancel()
        assert sorted(m.topic for m in again.retained.messages()) == ["keep", "late"]
    finally:
        storage.close()


class FlakyStore(MqttStore):
    """Retained writes fail (a locked SQLite file, a full disk) while ``failing`` is set."""

    failing = True
    attempts = 0

    def write_retained(self, changes: Mapping[str, Message | None]) -> None:
        self.attempts += 1
        if self.failing:
            raise sqlite3.OperationalError("database is locked")
        super().write_retained(changes)


async def test_failed_retained_write_is_kept_retried_and_shown(tmp_path: Path) -> None:
    storage = Storage.from_url(f"sqlite:///{tmp_path / 'r.db'}")
    storage.migrate()
    try:
        store = FlakyStore(storage.engine)
        broker = Broker(store, sys_interval=0)
        telemetry = Telemetry(TelemetrySettings())
        telemetry.bind(broker)
        async with anyio.create_task_group() as tg:
            await tg.start(broker.run)
            broker.publish(Message("keep", b"v1", retain=True))
            broker.publish(Message("other", b"x", retain=True))
            with anyio.fail_after(5):
                while store.attempts < 2:  # failed, then retried
                    await anyio.sleep(0.01)
            assert broker.retained_write_error == "database is locked"
            metrics = telemetry.prometheus_text()
            assert "trimaran_retained_write_failures_total" in metrics
            assert "trimaran_retained_unwritten 2" in metrics
            broker.publish(Message("keep", b"v2", retain=True))  # newer than the kept change: it wins
            store.failing = False
            with anyio.fail_after(10):
                while broker.retained_unwritten or broker.retained_write_error is not None:
                    await anyio.sleep(0.01)
            assert broker.retained_write_failures >= 2
            tg.cancel_scope.cancel()
        again = Broker(MqttStore(storage.engine), sys_interval=0)
        async with anyio.create_task_group() as tg:
            await tg.start(again.run)
            tg.cancel_scope.cancel()
        kept = again.retained.get("keep")
        assert kept is not None and kept.payload == b"v2"
        assert again.retained.get("other") is not None
    finally:
        storage.close()
