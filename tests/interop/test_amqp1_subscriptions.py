"""Durable and shared topic subscriptions as JMS clients make them (a receiver on a topic with a
link name, ``durable``, ``expiry-policy never``, the ``shared`` / ``global`` capabilities), with
python-qpid-proton over real sockets: the subscription outlives the link and the connection, a
receiver that attaches again with the same container id and link name gets what was published
while it was away and nothing twice, a detach with ``closed`` (or Qpid JMS's sourceless attach and
close) removes it, shared receivers compete for its messages, and MQTT and AMQP 0.9.1 publishers
feed it too."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

proton = pytest.importorskip("proton")
pika = pytest.importorskip("pika")

from proton import Data, Message, symbol  # noqa: E402
from proton.reactor import Container, DurableSubscription, LinkOption, Selector  # noqa: E402
from proton.utils import BlockingConnection, BlockingReceiver, LinkDetached  # noqa: E402

from tests.interop.conftest import AMQP1_ENV, amqp1_server_args  # noqa: E402
from tests.support.amqp1 import body_bytes, body_str, close_link  # noqa: E402
from tests.support.names import unique  # noqa: E402
from tests.support.paho import V5, Endpoints, connect  # noqa: E402
from tests.support.server import RunningServer  # noqa: E402


class Capabilities(LinkOption):
    """Source capabilities as Qpid JMS sends them for a shared subscription."""

    def __init__(self, *names: str) -> None:
        self.names = names

    def apply(self, link: Any) -> None:
        caps = link.source.capabilities
        caps.put_array(False, Data.SYMBOL)
        caps.enter()
        for name in self.names:
            caps.put_symbol(symbol(name))
        caps.exit()


class Connections:
    """Connections with a chosen container id (the JMS client id), all closed at the end."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.opened: list[BlockingConnection] = []

    def open(self, container_id: str | None = None) -> BlockingConnection:
        container = Container()
        if container_id is not None:
            container.container_id = container_id
        conn = BlockingConnection(self.url, timeout=10, container=container)
        self.opened.append(conn)
        return conn

    def close(self, conn: BlockingConnection) -> None:
        self.opened.remove(conn)
        conn.close()


@pytest.fixture
def connections(amqp1_url: str) -> Iterator[Connections]:
    c = Connections(amqp1_url)
    try:
        yield c
    finally:
        for conn in list(c.opened):
            conn.close()


def detach(conn: BlockingConnection, receiver: BlockingReceiver) -> None:
    """Detach without closing (a JMS consumer's close on a durable subscription); proton marks
    no state for the answer, so the connection is pumped a moment."""
    receiver.link.detach()
    with contextlib.suppress(proton.Timeout):
        conn.wait(lambda: False, timeout=0.3)


def publish(conn: BlockingConnection, address: str, bodies: list[str]) -> None:
    sender = conn.create_sender(address, name=unique("pub"))
    for body in bodies:
        sender.send(Message(body=body, properties={"n": int(body[-1]) if body[-1].isdigit() else 0}))
    close_link(sender)


def drain(receiver: BlockingReceiver, wait: float = 0.5) -> list[str]:
    got = []
    while True:
        try:
            message = receiver.receive(timeout=wait)
        except proton.Timeout:
            return got
        body: object = message.body
        got.append(body_str(message) if isinstance(body, str) else body_bytes(message).decode())
        receiver.accept()


def durable(conn: BlockingConnection, topic: str, name: str, *options: LinkOption) -> BlockingReceiver:
    return conn.create_receiver(topic, credit=20, name=name, options=[DurableSubscription(), *options])


def test_a_durable_subscription_outlives_its_connection(connections: Connections) -> None:
    topic = f"topic://{unique('dur')}"
    client = unique("client")
    other = connections.open()
    first = connections.open(client)
    rx = durable(first, topic, "sub1")
    source = rx.link.remote_source
    assert (
        source.durability == proton.Terminus.DELIVERIES
        and source.expiry_policy == proton.Terminus.EXPIRE_NEVER
    )
    publish(other, topic, ["m1"])
    assert drain(rx) == ["m1"]
    connections.close(first)  # no unsubscribe: the subscription stays
    publish(other, topic, ["m2", "m3"])
    again = connections.open(client)
    rx = durable(again, topic, "sub1")
    assert drain(rx) == ["m2", "m3"]  # what came while it was away, and not m1 again
    close_link(rx)  # detach with closed: JMS unsubscribe
    publish(other, topic, ["m4"])
    rx = durable(again, topic, "sub1")
    assert drain(rx, 0.3) == []  # a new subscription: m4 came when there was none


def test_a_detached_link_resumes_and_another_client_id_is_another_subscription(
    connections: Connections,
) -> None:
    topic = f"topic://{unique('det')}"
    client = unique("client")
    conn = connections.open(client)
    other = connections.open(unique("other"))
    rx = durable(conn, topic, "sub")
    theirs = durable(other, topic, "sub")  # same link name, another container id
    detach(conn, rx)
    publish(other, topic, ["a1", "a2"])
    assert drain(theirs) == ["a1", "a2"]
    rx = durable(conn, topic, "sub")
    assert drain(rx) == ["a1", "a2"]
    with pytest.raises(LinkDetached) as caught:  # one receiver on a subscription that is not shared
        durable(connections.open(client), topic, "sub", Capabilities("topic"))
    assert caught.value.link.remote_condition.name == "amqp:resource-locked"


def test_a_sourceless_attach_names_the_subscription_to_unsubscribe(connections: Connections) -> None:
    topic = f"topic://{unique('unsub')}"
    conn = connections.open(unique("client"))
    rx = durable(conn, topic, "gone")
    detach(conn, rx)
    existing = conn.create_receiver(None, name="gone")  # Qpid JMS: session.unsubscribe("gone")
    assert existing.link.remote_source.address == topic
    close_link(existing)
    with pytest.raises(LinkDetached) as caught:
        conn.create_receiver(None, name="gone")
    assert caught.value.link.remote_condition.name == "amqp:not-found"


def test_shared_global_receivers_compete_and_the_subscription_stays(connections: Connections) -> None:
    topic = f"topic://{unique('shared')}"
    one, two = connections.open(unique("c1")), connections.open(unique("c2"))
    shared = Capabilities("topic", "shared", "global")
    rx1 = durable(one, topic, "shsub|global", shared)
    rx2 = durable(two, topic, "shsub|global", shared)
    caps = rx1.link.remote_source.capabilities
    caps.rewind()
    caps.next()
    assert {"shared", "global"} <= {str(c) for c in caps.get_object().elements}
    publisher = connections.open()
    publish(publisher, topic, [f"s{i}" for i in range(6)])
    got1, got2 = drain(rx1), drain(rx2)
    assert sorted(got1 + got2) == [f"s{i}" for i in range(6)]  # each message once, to one of them
    detach(one, rx1)
    detach(two, rx2)
    publish(publisher, topic, ["late"])
    rx3 = durable(connections.open(unique("c3")), topic, "shsub|global2", shared)
    assert drain(rx3) == ["late"]


def test_a_shared_non_durable_subscription_ends_with_its_last_receiver(connections: Connections) -> None:
    topic = f"topic://{unique('volatile')}"
    conn = connections.open(unique("client"))
    shared = Capabilities("topic", "shared")
    rx1 = conn.create_receiver(topic, credit=10, name="vol|volatile1", options=shared)
    rx2 = conn.create_receiver(topic, credit=10, name="vol|volatile2", options=shared)
    publish(conn, topic, ["v1", "v2"])
    assert sorted(drain(rx1) + drain(rx2)) == ["v1", "v2"]
    close_link(rx1)
    close_link(rx2)
    publish(conn, topic, ["v3"])
    rx = conn.create_receiver(topic, credit=10, name="vol|volatile1", options=shared)
    assert drain(rx, 0.3) == []


def test_a_selector_on_a_durable_subscription_picks_what_it_keeps(connections: Connections) -> None:
    topic = f"topic://{unique('dsel')}"
    client = unique("client")
    conn = connections.open(client)
    rx = durable(conn, topic, "picky", Selector("n > 1"))
    detach(conn, rx)
    publish(conn, topic, ["x1", "x2", "x3"])
    rx = durable(conn, topic, "picky", Selector("n > 1"))
    assert drain(rx) == ["x2", "x3"]
    detach(conn, rx)
    rx = durable(conn, topic, "picky", Selector("n = 1"))  # another selector: a new subscription
    publish(conn, topic, ["y1", "y2"])
    assert drain(rx) == ["y1"]


def test_mqtt_and_amqp091_publishers_feed_a_durable_subscription(
    connections: Connections, amqp1_server: RunningServer
) -> None:
    root = unique("xp")
    conn = connections.open(unique("client"))
    rx = durable(conn, f"topic://{root}/+", "cross")
    detach(conn, rx)
    mqtt = connect(Endpoints("127.0.0.1", amqp1_server.ports["mqtt"]), version=V5)
    try:
        mqtt.publish(f"{root}/mqtt", b"from-mqtt", qos=1).wait_for_publish(5)
    finally:
        mqtt.disconnect()
    amqp091 = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", amqp1_server.ports["amqp"]))
    try:
        amqp091.channel().basic_publish("amq.topic", f"{root}.amqp091", b"from-amqp091")
    finally:
        amqp091.close()
    rx = durable(conn, f"topic://{root}/+", "cross")
    assert sorted(drain(rx)) == ["from-amqp091", "from-mqtt"]


def test_a_durable_subscription_is_fed_again_after_a_restart(tmp_path: Path) -> None:
    """Kept in the database: a restarted server feeds the subscription before its receiver comes
    back, and what was in its queue is still there."""
    env = dict(AMQP1_ENV)
    topic = f"topic://{unique('restart')}"
    client = unique("client")
    first = RunningServer(amqp1_server_args(), cwd=tmp_path, env=env).start()
    try:
        url = f"127.0.0.1:{first.ports['amqp']}"
        conns = Connections(url)
        conn = conns.open(client)
        rx = durable(conn, topic, "kept", Selector("n > 0"))
        detach(conn, rx)
        publish(conn, topic, ["before1"])
        conn.close()
    finally:
        assert first.stop() == 0, first.output()
    second = RunningServer(amqp1_server_args(), cwd=tmp_path, env=env).start()
    try:
        url = f"127.0.0.1:{second.ports['amqp']}"
        conns = Connections(url)
        publisher = conns.open()
        publish(publisher, topic, ["after0", "after2"])  # before the receiver is back
        conn = conns.open(client)
        rx = durable(conn, topic, "kept", Selector("n > 0"))
        assert drain(rx) == ["before1", "after2"]
        close_link(rx)  # unsubscribe: not restored by the next start
        conn.close()
        publisher.close()
    finally:
        assert second.stop() == 0, second.output()
    assert "restored 1 durable subscriptions" in second.output()
