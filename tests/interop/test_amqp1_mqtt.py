"""AMQP 1.0 (proton) <-> MQTT (paho) through the shared router and queue manager."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

proton = pytest.importorskip("proton")

from proton import Message  # noqa: E402
from proton.utils import BlockingConnection  # noqa: E402

from tests.support.amqp1 import body_bytes  # noqa: E402
from tests.support.paho import V5, V311, Endpoints, PacketTypes, connect, props  # noqa: E402
from tests.support.server import RunningServer  # noqa: E402


@pytest.fixture(scope="module")
def mqtt_endpoints(amqp1_server: RunningServer) -> Endpoints:
    return Endpoints("127.0.0.1", amqp1_server.ports["mqtt"])


@pytest.fixture
def amqp(amqp1_url: str) -> Iterator[BlockingConnection]:
    c = BlockingConnection(amqp1_url, timeout=10)
    try:
        yield c
    finally:
        c.close()


def unique(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:8]}"


def test_mqtt_publish_reaches_an_amqp1_topic_receiver(
    amqp: BlockingConnection, mqtt_endpoints: Endpoints
) -> None:
    root = unique("m2a")
    receiver = amqp.create_receiver(f"topic://{root}/+", credit=10)
    client = connect(mqtt_endpoints, version=V5)
    try:
        properties = props(
            PacketTypes.PUBLISH,
            ContentType="text/plain",
            CorrelationData=b"corr-1",
            ResponseTopic=f"{root}/replies",
            UserProperty=[("k", "v")],
            MessageExpiryInterval=60,
        )
        client.publish(f"{root}/a", b"from mqtt", qos=1, properties=properties)
        got = receiver.receive(timeout=5)
        receiver.accept()
    finally:
        client.disconnect()
    assert body_bytes(got) == b"from mqtt"
    assert got.content_type == "text/plain"
    assert got.correlation_id == "corr-1"
    assert got.reply_to == f"topic://{root}/replies"
    assert got.properties == {"k": "v"}
    assert got.address == f"topic://{root}/a"
    assert 0 < got.ttl <= 60


def test_amqp1_send_reaches_an_mqtt_subscriber(amqp: BlockingConnection, mqtt_endpoints: Endpoints) -> None:
    root = unique("a2m")
    client = connect(mqtt_endpoints, version=V5)
    try:
        client.subscribe(f"{root}/#", qos=1)
        amqp.create_sender(f"topic://{root}/x").send(
            Message(
                body="from amqp",
                content_type="text/plain",
                correlation_id="c-2",
                reply_to=f"topic://{root}/back",
                properties={"k": "v", "n": 5},
            )
        )
        got = client.expect()
    finally:
        client.disconnect()
    assert got.topic == f"{root}/x"
    assert got.payload == b"from amqp"
    assert got.qos == 1
    p = got.properties
    assert p.ContentType == "text/plain"
    assert p.CorrelationData == b"c-2"
    assert p.ResponseTopic == f"{root}/back"
    assert sorted(p.UserProperty) == [("k", "v"), ("n", "5")]


def test_mqtt_queue_publish_consumed_over_amqp1(amqp: BlockingConnection, mqtt_endpoints: Endpoints) -> None:
    q = unique("mq")
    client = connect(mqtt_endpoints, version=V311)
    try:
        for i in range(3):
            client.publish(f"$queue/{q}", f"job {i}".encode(), qos=1)
    finally:
        client.disconnect()
    receiver = amqp.create_receiver(q, credit=10)
    # proton's data body is a memoryview that lives only as long as its Message: keep them.
    messages = [receiver.receive(timeout=5) for _ in range(3)]
    receiver.accept()
    got = [body_bytes(m) for m in messages]
    assert got == [b"job 0", b"job 1", b"job 2"]


def test_amqp1_queue_send_consumed_over_mqtt(amqp: BlockingConnection, mqtt_endpoints: Endpoints) -> None:
    q = unique("aq")
    sender = amqp.create_sender(f"$queue/{q}")
    for i in range(3):
        sender.send(Message(body=f"task {i}"))
    client = connect(mqtt_endpoints, version=V5)
    try:
        client.subscribe(f"$queue/{q}", qos=1)
        got = client.drain(3)
    finally:
        client.disconnect()
    assert [m.payload for m in got] == [b"task 0", b"task 1", b"task 2"]
    assert all(m.topic == f"$queue/{q}" for m in got)
