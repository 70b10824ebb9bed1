"""Persistent MQTT sessions move with their client between nodes; a node name is one node's."""

from __future__ import annotations

import time

import pytest

from tests.cluster.conftest import Nodes, wait_route, wait_until
from tests.support.paho import V5, V311, Endpoints, PacketTypes, connect, props

pytestmark = pytest.mark.postgres


def test_a_session_taken_over_on_another_node_keeps_subscriptions_and_queued_messages(nodes: Nodes) -> None:
    a = nodes.start("a")
    b = nodes.start("b")
    on_a, on_b = Endpoints("127.0.0.1", a.ports["mqtt"]), Endpoints("127.0.0.1", b.ports["mqtt"])
    session = props(PacketTypes.CONNECT, SessionExpiryInterval=300)

    first = connect(on_a, "device-1", version=V5, clean=False, properties=session)
    first.subscribe("orders/#", qos=1)
    first.disconnect()  # offline: a keeps the session and queues for it
    wait_route(nodes, "a", "orders/#")

    publisher = connect(on_b)
    for i in range(5):
        publisher.publish(f"orders/{i}", f"q{i}".encode(), qos=1)  # b forwards to a, a queues them
    time.sleep(0.5)

    resumed = connect(on_b, "device-1", version=V5, clean=False, properties=session)
    try:
        flags, _reason, _props = resumed.connack.get(timeout=5)
        assert flags.session_present
        got = resumed.drain(5)
        assert [m.payload for m in got] == [f"q{i}".encode() for i in range(5)]
        # The subscription came along: b holds the route now, a no longer does.
        wait_until(lambda: "orders/#" not in nodes.routes("a"), what="a to drop the route")
        assert "orders/#" in nodes.routes("b")
        publisher.publish("orders/after", b"live", qos=1)
        assert resumed.expect().payload == b"live"
    finally:
        resumed.disconnect()
        publisher.disconnect()


def test_a_connected_client_is_disconnected_with_session_taken_over(nodes: Nodes) -> None:
    a = nodes.start("a")
    b = nodes.start("b")
    session = props(PacketTypes.CONNECT, SessionExpiryInterval=300)
    old = connect(
        Endpoints("127.0.0.1", a.ports["mqtt"]), "dev-2", version=V5, clean=False, properties=session
    )
    old.subscribe("cmd/dev-2", qos=1)
    new = connect(
        Endpoints("127.0.0.1", b.ports["mqtt"]), "dev-2", version=V5, clean=False, properties=session
    )
    try:
        reason, _props = old.disconnects.get(timeout=5)
        assert reason.value == 0x8E  # session taken over
        flags, _reason, _props = new.connack.get(timeout=5)
        assert flags.session_present
        wait_route(nodes, "b", "cmd/dev-2")
        sender = connect(Endpoints("127.0.0.1", a.ports["mqtt"]))
        try:
            sender.publish("cmd/dev-2", b"go", qos=1)
            assert new.expect().payload == b"go"
        finally:
            sender.disconnect()
    finally:
        new.disconnect()
        old.client.loop_stop()


def test_a_clean_311_client_moving_nodes_closes_the_old_connection(nodes: Nodes) -> None:
    a = nodes.start("a")
    b = nodes.start("b")
    old = connect(Endpoints("127.0.0.1", a.ports["mqtt"]), "dev-3", version=V311)
    new = connect(Endpoints("127.0.0.1", b.ports["mqtt"]), "dev-3", version=V311)
    try:
        old.disconnects.get(timeout=5)  # one connection per client id in the whole cluster
    finally:
        new.disconnect()
        old.client.loop_stop()


def test_a_second_node_with_the_same_name_is_refused_in_one_line(nodes: Nodes) -> None:
    nodes.start("a")
    clash = nodes.start("a", check=False)
    with pytest.raises(RuntimeError):
        clash.start(timeout=20)
    refusal = [line for line in clash.output().splitlines() if "node_name 'a' is in use" in line]
    assert len(refusal) == 1, clash.output()
    assert clash.process is not None and clash.process.returncode not in (0, None)
