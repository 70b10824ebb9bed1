"""What idle sessions cost the MQTT front end (issue 47): offline sessions expire from a heap of
their deadlines (MqttFrontEnd._expiring), so the housekeeping looks at the due ones only and the heap
stays bounded however often sessions come and go; subscriptions alike share their options; a
connection's Principal is made at its first check that remembers something (MqttFrontEnd._who)."""

from __future__ import annotations

import socket
from pathlib import Path

from tests.support.budget import InProcessServer
from trimaran.broker.core import Broker
from trimaran.config import Settings
from trimaran.mqtt import handler
from trimaran.mqtt.codec import encode
from trimaran.mqtt.conn import MqttConn
from trimaran.mqtt.handler import MqttEndpoint, MqttFrontEnd
from trimaran.mqtt.packets import (
    MQTT_3_1_1,
    Connect,
    Packet,
    Publish,
    Subscribe,
    SubscriptionOptions,
    granted_options,
)


def _offline(front: MqttFrontEnd, client_id: str) -> MqttEndpoint:
    endpoint = front.endpoints[client_id] = MqttEndpoint(front, client_id, 5)
    endpoint.expiry_interval = 10
    return endpoint


def test_only_the_last_deadline_of_a_session_counts_and_the_heap_stays_bounded() -> None:
    front = MqttFrontEnd(Broker(), Settings())
    sessions = [_offline(front, f"c{i}") for i in range(100)]
    for round_ in range(100):  # each session goes offline again and again, later each time
        for endpoint in sessions:
            front._expire_at(endpoint, 1000.0 + round_)
    assert len(front._expiring) <= 2 * len(front.endpoints) + 1024 + 1
    front._housekeeping(1050.0)  # past the first deadlines, not the last
    assert len(front.endpoints) == 100
    front._expire_at(sessions[0], 1000.0)  # offline once more, with an early expiry
    front._housekeeping(1050.0)
    assert "c0" not in front.endpoints and len(front.endpoints) == 99
    front._housekeeping(1100.0)
    assert front.endpoints == {}
    assert front._expiring == []


def test_subscriptions_alike_share_their_options_up_to_a_bound() -> None:
    assert granted_options(1, True, False, 2) is granted_options(1, True, False, 2)
    assert granted_options(1) == SubscriptionOptions(1) and granted_options(1) is not granted_options(2)
    assert granted_options(7) is not granted_options(7)  # not a valid set: made, not kept
    packet = SubscriptionOptions(1)
    first = handler._route_options(packet, None, None, None)
    assert handler._route_options(packet, None, None, None) is first
    assert handler._route_options(packet, 5, "g", None) == handler._route_options(packet, 5, "g", None)
    checked = handler._route_options(packet, None, None, lambda topic: True)
    assert checked is not first and checked.reads is not None
    kept = len(handler._ROUTE_OPTIONS)
    try:
        for identifier in range(handler.ROUTE_OPTIONS_KEPT + 10):  # a client's own identifiers
            handler._route_options(packet, identifier + 1000, None, None)
        assert kept <= len(handler._ROUTE_OPTIONS) == handler.ROUTE_OPTIONS_KEPT
    finally:
        handler._ROUTE_OPTIONS.clear()  # the rest of the run shares options again


def _client(port: int, client_id: str, *packets: Packet) -> socket.socket:
    """A raw MQTT 3.1.1 client, logged in, each packet's answer (if any) read before the next."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    sock.sendall(encode(Connect(keep_alive=600, client_id=client_id), MQTT_3_1_1))
    assert sock.recv(4)[:1] == b"\x20"  # CONNACK
    for packet in packets:
        sock.sendall(encode(packet, MQTT_3_1_1))
        if not isinstance(packet, Publish) or packet.qos:
            assert sock.recv(5)  # SUBACK, PUBACK
    return sock


def _hull(server: InProcessServer, client_id: str) -> MqttConn:
    front = server.app.mqtt
    assert front is not None
    conn = front.endpoints[client_id].conn
    assert conn is not None
    return conn


def test_a_connection_makes_its_principal_at_the_first_check_that_remembers(tmp_path: Path) -> None:
    """An idle connection, and one subscribed with no rules to read by, hold no Principal (88 bytes
    compiled); a publisher keeps the one its first publish made, with the topic it was allowed."""
    server = InProcessServer(tmp_path).start()
    socks: list[socket.socket] = []
    try:
        port = server.port("mqtt")
        socks.append(_client(port, "idle"))
        socks.append(
            _client(port, "subscribed", Subscribe(1, [("devices/subscribed/+", SubscriptionOptions(1))]))
        )
        socks.append(_client(port, "publisher", Publish("devices/publisher/up", b"1", qos=1, packet_id=1)))
        assert _hull(server, "idle").principal is None
        assert _hull(server, "subscribed").principal is None
        publisher = _hull(server, "publisher")
        assert publisher.user is None and publisher.vhost == publisher.io.vhost  # the login's, as before
        kept = publisher.principal
        assert kept is not None and kept.memo is not None
        assert (kept.client_id, kept.host, kept.vhost) == ("publisher", "127.0.0.1", publisher.io.vhost)
        assert kept.memo.last_write == "devices/publisher/up"
        socks[2].sendall(encode(Publish("devices/publisher/up", b"2", qos=1, packet_id=2), MQTT_3_1_1))
        assert socks[2].recv(4)[:1] == b"\x40"  # PUBACK
        assert publisher.principal is kept  # made once
    finally:
        for sock in socks:
            sock.close()
        server.stop()
