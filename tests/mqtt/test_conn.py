"""mqtt/conn.py: the MQTT hull is its own entry in the broker's client registry."""

from __future__ import annotations

from typing import Any

from trimaran.broker.clients import ClientRegistry, client_json, client_key
from trimaran.broker.core import Broker
from trimaran.config import Settings
from trimaran.mqtt.conn import MqttConn
from trimaran.mqtt.connection import ServerConnection
from trimaran.mqtt.handler import MqttFrontEnd
from trimaran.runtime.runner import Runner
from trimaran.runtime.transport import Conn, Listening
from trimaran.vhosts import prefix


def _conn() -> Any:
    """A real MqttConn on a real, unconnected runtime Conn: compiled, both check their types."""
    front = MqttFrontEnd(Broker(), Settings())
    io = Conn(Runner(), Listening("mqtt", factory=None))  # type: ignore[arg-type]  # never made a hull
    io.peer_host, io.peer_port = "10.0.0.7", 50123
    return MqttConn(front, ServerConnection(), io)


def test_what_the_registry_lists_is_asked_of_the_connection() -> None:
    conn = _conn()
    conn.mqtt.client_id = "sensor-7"
    conn.io.vhost = "plant"
    conn.io.user = "alice"  # what the login let in
    registry = ClientRegistry()
    registry.add(conn)
    assert conn.serial == 1 and conn.slot == 0 and conn.since_ms > 0
    assert client_key(conn) == "mqtt-1" and registry.get("mqtt-1") is conn
    shown = client_json(conn)
    assert shown["client_id"] == prefix("plant") + "sensor-7"  # the session's key, as the API strips it
    assert (shown["protocol"], shown["user"], shown["vhost"], shown["address"]) == (
        "mqtt",
        "alice",
        "plant",
        "10.0.0.7:50123",
    )
    conn.endpoint = None  # a handover leaves the session before the close's events are told
    assert conn.client_id == prefix("plant") + "sensor-7"
    assert registry.remove(conn) and conn.slot == -1 and not registry.remove(conn)


def test_a_connection_never_logged_in_is_not_in_the_registry() -> None:
    conn = _conn()
    registry = ClientRegistry()
    assert conn.user is None and conn.serial == 0
    assert not registry.remove(conn)  # what presence.left does for a refused login
    assert len(registry) == 0
