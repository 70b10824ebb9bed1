"""mqtt/handler.py: the vhost of a client that names none (RabbitMQ's MQTT plugin's order)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from trimaran.broker.core import Broker
from trimaran.config import Settings
from trimaran.mqtt.conn import MqttConn
from trimaran.mqtt.connection import ServerConnection
from trimaran.mqtt.handler import MqttFrontEnd
from trimaran.runtime.runner import Runner
from trimaran.runtime.transport import Conn, Listening


def _conn(front: MqttFrontEnd, listener: str) -> Any:
    """A real MqttConn on a real, unconnected runtime Conn: compiled, both check their types."""
    io = Conn(Runner(), Listening(listener, factory=None))  # type: ignore[arg-type]  # never made a hull
    return MqttConn(front, ServerConnection(), io)


def test_the_user_mapping_wins_over_the_listener_and_the_listener_over_the_default() -> None:
    settings = Settings(
        listeners={"vhosts": {"mqtt_tls": "secure"}},
        auth={"vhost_map": {"bob": "bobs", "CN=dev1": "devices"}},
    )
    front = MqttFrontEnd(Broker(), settings)
    assert front._vhost_for(_conn(front, "mqtt-tls"), None) == "secure"
    assert front._vhost_for(_conn(front, "mqtt-tls"), "bob") == "bobs"
    assert front._vhost_for(_conn(front, "mqtt"), "CN=dev1") == "devices"
    assert front._vhost_for(_conn(front, "mqtt"), "alice") == "/"


def test_a_listener_mapping_must_name_a_listener() -> None:
    with pytest.raises(ValidationError, match="no listener named mqtt_tsl"):
        Settings(listeners={"vhosts": {"mqtt_tsl": "secure"}})
