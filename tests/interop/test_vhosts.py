"""Virtual hosts with real clients: two tenants sharing every name without seeing each other.

MQTT (paho) selects a vhost with ``vhost:user`` user names or the ``auth.vhost_map`` mapping; AMQP
1.0 (python-qpid-proton) with ``open.hostname``; AMQP 0.9.1 (pika, kombu) with ``virtual_host``. Each
vhost has its own topics, retained messages, client ids, ``$queue/`` queues and exchanges; a vhost
that does not exist, or one the user has no permission for, is refused the protocol's way.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from paho.mqtt.enums import MQTTProtocolVersion as Version

from tests.interop.conftest import amqp_server_args
from tests.support.paho import V5, V311, Client, Endpoints, Received, connect
from tests.support.server import RunningServer, serving

USERS = '[{"name": "alice", "password": "a"}, {"name": "bob", "password": "b"}]'
VHOST_ENV = {
    "TRIMARAN_AUTH__USERS": USERS,
    "TRIMARAN_VHOSTS": '["/", "t1", "t2/eu"]',
    "TRIMARAN_LIMITS__SYS_INTERVAL": "0",
    "TRIMARAN_AUTH__VHOST_MAP": '{"bob": "t1"}',
}


@pytest.fixture(scope="module")
def vhost_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    workdir = tmp_path_factory.mktemp("vhosts")
    with serving(RunningServer(amqp_server_args(), cwd=workdir, env=VHOST_ENV).start()) as server:
        yield server


@pytest.fixture(scope="module")
def endpoints(vhost_server: RunningServer) -> Endpoints:
    return Endpoints("127.0.0.1", vhost_server.ports["mqtt"])


def _gather(client: Client, wait: float = 0.7) -> list[Received]:
    """Everything the client received within ``wait`` seconds."""
    time.sleep(wait)
    out: list[Received] = []
    while not client.messages.empty():
        out.append(client.messages.get())
    return out


def _unique(text: str) -> str:
    return f"{text}{uuid.uuid4().hex[:8]}"


@pytest.mark.parametrize("version", [V311, V5])
def test_two_tenants_share_topics_retained_and_client_ids(endpoints: Endpoints, version: Version) -> None:
    root = _unique("sensors")
    topic = f"{root}/temp"
    client_id = _unique("device-")
    one = connect(endpoints, client_id, version=version, username="t1:alice", password="a")
    two = connect(endpoints, client_id, version=version, username="t2/eu:alice", password="a")
    plain = connect(endpoints, _unique("root-"), version=version, username="alice", password="a")
    try:
        # The same client id in two vhosts: two sessions, neither takes the other over.
        for client in (one, two):
            client.subscribe(f"{root}/#", qos=1)
            client.subscribe(topic, qos=1)
        plain.subscribe("#", qos=1)
        plain.subscribe(topic, qos=1)
        one.publish(topic, b"from t1", qos=1, retain=True)
        two.publish(topic, b"from t2", qos=1, retain=True)
        got_one = [one.expect()]  # overlapping subscriptions: one copy
        got_two = [two.expect()]
        assert {(m.topic, m.payload) for m in got_one} == {(topic, b"from t1")}
        assert {(m.topic, m.payload) for m in got_two} == {(topic, b"from t2")}
        one.expect_none()
        two.expect_none()
        plain.expect_none()  # '/' with '#' sees nothing of either tenant
        assert one.disconnects.empty() and two.disconnects.empty()
    finally:
        for client in (one, two, plain):
            client.disconnect()
    # Retained per vhost: a new subscriber of t1 gets t1's retained message only.
    again = connect(endpoints, version=version, username="t1:alice", password="a")
    default = connect(endpoints, version=version, username="alice", password="a")
    try:
        again.subscribe("#", qos=1)
        default.subscribe("#", qos=1)
        retained = {m.topic: m for m in _gather(again)}
        assert (retained[topic].payload, retained[topic].retain) == (b"from t1", True)
        assert all(m.payload == b"from t1" for m in retained.values())  # t1's (earlier runs' too)
        default.expect_none()  # '/' holds no retained message of a tenant
    finally:
        again.disconnect()
        default.disconnect()


def test_queues_are_per_vhost(endpoints: Endpoints) -> None:
    queue = _unique("jobs")
    one = connect(endpoints, version=V5, username="t1:alice", password="a")
    two = connect(endpoints, version=V5, username="t2/eu:alice", password="a")
    try:
        one.publish(f"$queue/{queue}", b"job for t1", qos=1)
        two.publish(f"$queue/{queue}", b"job for t2", qos=1)
        one.subscribe(f"$queue/{queue}", qos=1)
        two.subscribe(f"$share/g/$queue/{queue}", qos=1)
        got_one, got_two = one.expect(), two.expect()
        assert (got_one.topic, got_one.payload) == (f"$queue/{queue}", b"job for t1")
        assert (got_two.topic, got_two.payload) == (f"$queue/{queue}", b"job for t2")
        properties = dict(got_one.properties.UserProperty)
        assert properties["x-queue"] == queue and properties["x-queue-message-id"].startswith(f"{queue}:")
        one.expect_none()
        two.expect_none()
    finally:
        one.disconnect()
        two.disconnect()


def test_the_user_mapping_and_the_dollar_rule_inside_a_tenant(endpoints: Endpoints) -> None:
    topic = _unique("mapped/")
    bob = connect(endpoints, version=V5, username="bob", password="b")  # auth.vhost_map: bob -> t1
    alice = connect(endpoints, version=V5, username="t1:alice", password="a")
    try:
        alice.subscribe("#", qos=0)
        alice.subscribe("+/x", qos=0)
        _gather(alice)  # t1's retained messages of the other tests
        bob.publish(topic, b"bob in t1", qos=1)
        assert alice.expect().payload == b"bob in t1"
        bob.publish("$app/x", b"dollar", qos=1)  # '#' and '+' at the tenant's first level skip it
        alice.expect_none()
    finally:
        bob.disconnect()
        alice.disconnect()


@pytest.mark.parametrize("version", [V311, V5])
def test_a_vhost_that_does_not_exist_is_refused(endpoints: Endpoints, version: Version) -> None:
    client = connect(endpoints, version=version, username="nowhere:alice", password="a", expect_success=False)
    try:
        _flags, reason, _props = client.connack.get(timeout=5)
        assert reason.is_failure
        assert reason.value == 0x86  # bad user name or password (3.1.1: 4, as paho reports it), as RabbitMQ
    finally:
        client.drop()


def test_a_client_of_the_default_vhost_cannot_name_a_tenants_keys(endpoints: Endpoints) -> None:
    spy = connect(endpoints, version=V5, username="alice", password="a")
    victim = connect(endpoints, version=V5, username="t1:alice", password="a")
    try:
        victim.subscribe("secret", qos=1)
        codes = spy.subscribe("$vhost/t1/#", qos=1)
        assert [int(c.value) for c in codes] == [0x87]  # not authorized
        spy.publish("$vhost/t1/secret", b"forged", qos=1)
        victim.expect_none()
        spy.expect_none()
    finally:
        spy.disconnect()
        victim.disconnect()
    forged = connect(
        endpoints, "$vhost/t1/x", version=V5, username="alice", password="a", expect_success=False
    )
    try:
        _flags, reason, _props = forged.connack.get(timeout=5)
        assert reason.value == 0x85
    finally:
        forged.drop()


# -- AMQP 1.0 (python-qpid-proton): open.hostname ------------------------------------------------


def _proton(server: RunningServer, hostname: str | None, user: str = "alice", password: str = "a") -> Any:
    from proton.utils import BlockingConnection

    kwargs: dict[str, Any] = {"user": user, "password": password, "allow_insecure_mechs": True}
    if hostname is not None:
        kwargs["virtual_host"] = hostname
    return BlockingConnection(f"127.0.0.1:{server.ports['amqp']}", timeout=10, **kwargs)


def test_amqp1_tenants_share_queue_and_topic_names_unseen(vhost_server: RunningServer) -> None:
    proton = pytest.importorskip("proton")
    from tests.support.amqp1 import body_bytes

    queue, topic = _unique("orders"), _unique("prices/")
    one = _proton(vhost_server, "vhost:t1")
    two = _proton(vhost_server, "t2/eu")  # a plain host name that names a vhost
    default = _proton(vhost_server, None)
    try:
        receivers = {c: c.create_receiver(f"topic://{topic}/#", credit=10) for c in (one, two, default)}
        for client, text in ((one, b"t1"), (two, b"t2")):
            sender = client.create_sender(f"$queue/{queue}")
            sender.send(proton.Message(body=text + b" order"))
            sender.close()
            topical = client.create_sender(f"topic://{topic}/eur")
            topical.send(proton.Message(body=text + b" price"))
            topical.close()
        for client, text in ((one, b"t1"), (two, b"t2")):
            got = receivers[client].receive(timeout=5)
            receivers[client].accept()
            assert body_bytes(got) == text + b" price"
            consumer = client.create_receiver(f"$queue/{queue}", credit=10)
            got = consumer.receive(timeout=5)
            consumer.accept()
            assert body_bytes(got) == text + b" order"
            with pytest.raises(proton.Timeout):
                consumer.receive(timeout=0.5)
        with pytest.raises(proton.Timeout):
            receivers[default].receive(timeout=0.5)  # '/' sees neither tenant
        # From MQTT in t1 to AMQP 1.0 in t1: the message's address is the tenant's own name.
        mqtt = connect(Endpoints("127.0.0.1", vhost_server.ports["mqtt"]), username="t1:alice", password="a")
        try:
            mqtt.publish(f"{topic}/usd", b"from mqtt", qos=1)
        finally:
            mqtt.disconnect()
        got = receivers[one].receive(timeout=5)
        receivers[one].accept()
        assert (body_bytes(got), got.address) == (b"from mqtt", f"topic://{topic}/usd")
        with pytest.raises(proton.Timeout):
            receivers[two].receive(timeout=0.5)
    finally:
        for client in (one, two, default):
            client.close()


def test_amqp1_a_vhost_that_does_not_exist_closes_with_not_found(vhost_server: RunningServer) -> None:
    pytest.importorskip("proton")
    from proton import ConnectionException

    with pytest.raises(ConnectionException, match="amqp:not-found"):
        connection = _proton(vhost_server, "vhost:nowhere")
        connection.create_sender("$queue/x")
