"""Below storage.min_free_bytes new durable publishes are refused with each protocol's quota error."""

from __future__ import annotations

import pytest

from tests.queue.conftest import Collector, Factory, wait_until
from trimaran.admin.telemetry import Telemetry
from trimaran.amqp1.handler import refusal_condition
from trimaran.amqp1.performatives import RESOURCE_LIMIT_EXCEEDED
from trimaran.broker.message import Message
from trimaran.config import TelemetrySettings
from trimaran.mqtt.queues import _refusal_code
from trimaran.mqtt.reason_codes import ReasonCode
from trimaran.queue import QueueError
from trimaran.storage.disk import FILL_BYTES_PER_S, LONGEST_INTERVAL_S, DiskWatch

pytestmark = pytest.mark.anyio


def msg(payload: bytes) -> Message:
    return Message(topic="$queue/q", payload=payload, qos=1)


async def test_low_disk_refuses_durable_publishes_and_recovers(make_manager: Factory) -> None:
    manager = make_manager()
    if not manager.disk.enabled:
        pytest.skip("the watermark watches the SQLite data directory only")
    free = [10**12]
    manager.disk.measure = lambda _path: free[0]
    async with manager.running():
        await manager.publish("q", msg(b"before"))
        await manager.declare("mem", durable=False)
        free[0] = manager.disk.min_free_bytes - 1
        assert manager.disk.check()
        with pytest.raises(QueueError) as refused:
            await manager.publish("q", msg(b"refused"))
        assert refused.value.reason == "disk-full"
        with pytest.raises(QueueError):
            manager.publish_nowait("q", msg(b"refused too"))
        await manager.publish("mem", Message(topic="$queue/mem", payload=b"memory", qos=1))
        # consumers drain as before
        inbox = Collector("c")
        manager.consume("q", inbox, auto_ack=True).add_credit(10)
        await wait_until(lambda: inbox.payloads == [b"before"])
        telemetry = Telemetry(TelemetrySettings())
        telemetry.bind(None, manager)
        metrics = telemetry.prometheus_text()
        assert "trimaran_storage_disk_low 1" in metrics
        assert "trimaran_queue_refused_disk_total 2" in metrics
        free[0] = 10**12
        assert not manager.disk.check()
        await manager.publish("q", msg(b"after"))
        await wait_until(lambda: inbox.payloads == [b"before", b"after"])
        assert manager.disk.refused == 2


def test_every_protocol_says_quota() -> None:
    full = QueueError("disk-full", "disk free is below storage.min_free_bytes")
    assert _refusal_code(full) == ReasonCode.QUOTA_EXCEEDED  # MQTT PUBACK 0x97
    assert refusal_condition(full) == RESOURCE_LIMIT_EXCEEDED  # AMQP 1.0 rejected


def test_poll_measures_once_an_interval(tmp_path: object) -> None:
    calls: list[int] = []

    def measure(_path: object) -> int:
        calls.append(1)
        return 10

    watch = DiskWatch(tmp_path, 100, measure=measure, interval_s=1.0)  # type: ignore[arg-type]
    watch.poll(now=100.0)
    watch.poll(now=100.5)
    assert watch.low and len(calls) == 1
    watch.poll(now=101.1)
    assert len(calls) == 2
    assert not DiskWatch(None, 100).enabled


def test_the_further_from_the_watermark_the_longer_between_measurements(tmp_path: object) -> None:
    """RabbitMQ's disk monitor's rule: the next measurement when the disk could have filled to the
    watermark at 250 MB/s, from once a second (near or below it) to every ten seconds."""
    free = [100 + 2 * FILL_BYTES_PER_S]  # two seconds' worth above the watermark
    watch = DiskWatch(tmp_path, 100, measure=lambda _path: free[0])  # type: ignore[arg-type]
    watch.poll(now=0.0)
    assert watch.wait_s(0.0) == pytest.approx(2.0)
    free[0] = 10**15  # far above: the longest interval
    watch.poll(now=2.0)
    assert watch.wait_s(2.0) == LONGEST_INTERVAL_S
    free[0] = 10  # below: every second
    watch.poll(now=12.0)
    assert watch.low and watch.wait_s(12.0) == 1.0
    assert DiskWatch(None, 100).wait_s(0.0) is None  # no watermark: never measured


def test_crossing_the_watermark_either_way_is_told_once(tmp_path: object) -> None:
    """``on_change`` (the app raises and clears the runtime's disk alarm with it) hears each crossing,
    not each measurement."""
    free = [10]
    watch = DiskWatch(tmp_path, 100, measure=lambda _path: free[0])  # type: ignore[arg-type]
    told: list[bool] = []
    watch.on_change = told.append
    watch.check()
    watch.check()
    free[0] = 1000
    watch.check()
    watch.check()
    assert told == [True, False]
