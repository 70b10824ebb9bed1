"""A bridge to RabbitMQ's MQTT plugin (trimaran/bridges/mqtt.py): another broker than Mosquitto."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.bridges.test_mqtt_bridge import bridged, local_client, remote_client
from tests.support import rabbitmq
from tests.support.server import unused_port

pytestmark = pytest.mark.slow  # RabbitMQ takes about 10 s to start


@pytest.fixture(scope="module")
def rabbit_mqtt(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """RabbitMQ 3.10 with its MQTT plugin (MQTT 3.1.1); yields the MQTT port."""
    why = rabbitmq.available()
    if why is not None:
        pytest.skip(why)
    port = unused_port()
    config = f"mqtt.listeners.tcp.default = 127.0.0.1:{port}\nmqtt.allow_anonymous = true\n"
    try:
        with rabbitmq.rabbitmq_node(tmp_path_factory.mktemp("rabbitmq-mqtt"), ("rabbitmq_mqtt",), config):
            yield port
    except RuntimeError as exc:
        pytest.skip(f"RabbitMQ did not start: {str(exc)[:200]}")


def test_topics_cross_to_rabbitmq_and_back(tmp_path: Path, rabbit_mqtt: int) -> None:
    topics = ["telemetry/# out 1 plant/ site-1/", "orders/# in 1 plant/ site-1/"]
    # RabbitMQ refuses Mosquitto's bridge flag in the protocol level: try_private off, as its docs say.
    with bridged(tmp_path, rabbit_mqtt, topics, try_private=False) as server:
        local = local_client(server, "plc")
        remote = remote_client(rabbit_mqtt, "erp")
        local.subscribe("plant/orders/#", 1)
        remote.subscribe("site-1/telemetry/#", 1)
        local.publish("plant/telemetry/line-3", b"412 units", qos=1)
        got = remote.expect(10)
        assert (got.topic, got.payload) == ("site-1/telemetry/line-3", b"412 units")
        remote.publish("site-1/orders/7", b"2,000 units", qos=1)
        got = local.expect(10)
        assert (got.topic, got.payload) == ("plant/orders/7", b"2,000 units")
        local.disconnect()
        remote.disconnect()


def test_the_bridge_flag_refused_by_rabbitmq_is_said_in_the_log(tmp_path: Path, rabbit_mqtt: int) -> None:
    with bridged(tmp_path, rabbit_mqtt, ["a/#"], connected=False) as server:
        assert server.wait_for_log("try_private = false", 15), server.output()
        assert "bridge cloud: connected" not in server.output()
