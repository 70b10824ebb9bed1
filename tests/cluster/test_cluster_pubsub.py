"""Pub/sub across two nodes on one PostgreSQL, with real clients of each protocol, both ways."""

from __future__ import annotations

import itertools
import json
import os
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika
import psycopg
import pytest

from tests.cluster.conftest import TOKEN, Nodes, wait_route, wait_until
from tests.support.browser import needs_browser, snap, wait
from tests.support.paho import V5, Endpoints, connect
from tests.support.postgres import PostgresCluster
from tests.support.server import RunningServer

proton = pytest.importorskip("proton")

from proton import Message  # noqa: E402
from proton.utils import BlockingConnection  # noqa: E402

from tests.support.amqp1 import body_bytes  # noqa: E402

pytestmark = pytest.mark.postgres

_databases = itertools.count()


@pytest.fixture(scope="module")
def two(postgres_cluster: PostgresCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Nodes]:
    """Nodes a and b, shared by this module's tests (each test uses its own topics)."""
    url = postgres_cluster.create_database(f"cluster{os.getpid()}_{next(_databases)}")
    nodes = Nodes(url, Path(tmp_path_factory.mktemp("nodes")))
    nodes.start("a", http=True)
    nodes.start("b")
    try:
        yield nodes
    finally:
        failures = nodes.stop_all()
    assert not failures, failures[0]


def mqtt(server: RunningServer) -> Endpoints:
    return Endpoints("127.0.0.1", server.ports["mqtt"])


def root() -> str:
    return f"c{uuid.uuid4().hex[:8]}"


@pytest.mark.parametrize(("pub", "sub"), [(0, 1), (1, 0)])
def test_mqtt_publish_on_one_node_reaches_a_subscriber_on_the_other(two: Nodes, pub: int, sub: int) -> None:
    topic = root()
    publisher_node, subscriber_node = two.started[pub], two.started[sub]
    subscriber = connect(mqtt(subscriber_node), version=V5)
    publisher = connect(mqtt(publisher_node), version=V5)
    try:
        subscriber.subscribe(f"{topic}/+", qos=1)
        wait_route(two, "ab"[sub], f"{topic}/+")
        for i in range(20):
            publisher.publish(f"{topic}/{i}", f"m{i}".encode(), qos=1)
        got = subscriber.drain(20)
        assert [m.payload for m in got] == [f"m{i}".encode() for i in range(20)]
        assert {m.qos for m in got} == {1}
        publisher.publish(f"{topic}-not-routed/x", b"no", qos=1)
        subscriber.expect_none(0.3)
    finally:
        subscriber.disconnect()
        publisher.disconnect()


def test_a_payload_past_notifys_limit_crosses_through_the_table(two: Nodes) -> None:
    topic = root()
    a, b = two.started
    subscriber = connect(mqtt(b))
    publisher = connect(mqtt(a))
    try:
        subscriber.subscribe(f"{topic}/#", qos=1)
        wait_route(two, "b", f"{topic}/#")
        sizes = [10, 200_000, 20, 9_000]
        for i, size in enumerate(sizes):
            publisher.publish(f"{topic}/{i}", bytes([65 + i]) * size, qos=1)
        got = subscriber.drain(len(sizes))
        assert [len(m.payload) for m in got] == sizes  # in order, the large ones included
        assert got[1].payload == b"B" * 200_000
    finally:
        subscriber.disconnect()
        publisher.disconnect()


def amqp091_queue(server: RunningServer, binding: str) -> tuple[pika.BlockingConnection, str]:
    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", server.ports["amqp"]))
    channel = connection.channel()
    queue = channel.queue_declare("", exclusive=True).method.queue
    channel.queue_bind(queue, "amq.topic", binding)
    return connection, queue


def amqp091_get(connection: pika.BlockingConnection, queue: str, timeout: float = 5.0) -> bytes:
    channel = connection.channel()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        method, _props, body = channel.basic_get(queue, auto_ack=True)
        if method is not None:
            return bytes(body)
        time.sleep(0.02)
    raise AssertionError(f"nothing arrived in {queue}")


@pytest.mark.parametrize(("pub", "sub"), [(0, 1), (1, 0)])
def test_amqp091_across_nodes_both_ways(two: Nodes, pub: int, sub: int) -> None:
    topic = root()
    publisher_node, subscriber_node = two.started[pub], two.started[sub]
    consumer, queue = amqp091_queue(subscriber_node, f"{topic}.*")
    producer = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", publisher_node.ports["amqp"]))
    try:
        wait_route(two, "ab"[sub], f"{topic}/+")
        channel = producer.channel()
        channel.confirm_delivery()
        # mandatory: a subscriber on another node counts as a route (no basic.return, no UnroutableError)
        channel.basic_publish("amq.topic", f"{topic}.x", b"over amqp 0.9.1", mandatory=True)
        assert amqp091_get(consumer, queue) == b"over amqp 0.9.1"
    finally:
        consumer.close()
        producer.close()


@pytest.mark.parametrize(("pub", "sub"), [(0, 1), (1, 0)])
def test_amqp1_across_nodes_both_ways(two: Nodes, pub: int, sub: int) -> None:
    topic = root()
    publisher_node, subscriber_node = two.started[pub], two.started[sub]
    receiving = BlockingConnection(f"127.0.0.1:{subscriber_node.ports['amqp']}", timeout=10)
    sending = BlockingConnection(f"127.0.0.1:{publisher_node.ports['amqp']}", timeout=10)
    try:
        receiver = receiving.create_receiver(f"topic://{topic}/+", credit=10)
        wait_route(two, "ab"[sub], f"{topic}/+")
        sending.create_sender(f"topic://{topic}/y").send(
            Message(body=b"over amqp 1.0", properties={"k": "v"})
        )
        got = receiver.receive(timeout=5)
        receiver.accept()
        assert body_bytes(got) == b"over amqp 1.0"
        assert got.properties == {"k": "v"}
    finally:
        receiving.close()
        sending.close()


def test_each_protocol_reaches_the_others_across_nodes(two: Nodes) -> None:
    """MQTT on a to AMQP 0.9.1 and AMQP 1.0 on b, and AMQP 1.0 on b to MQTT on a."""
    topic = root()
    a, b = two.started
    consumer, queue = amqp091_queue(b, f"{topic}.#")
    receiving = BlockingConnection(f"127.0.0.1:{b.ports['amqp']}", timeout=10)
    client = connect(mqtt(a))
    try:
        receiver = receiving.create_receiver(f"topic://{topic}/#", credit=10)
        client.subscribe(f"{topic}/back", qos=1)
        wait_route(two, "b", f"{topic}/#")
        wait_route(two, "a", f"{topic}/back")
        client.publish(f"{topic}/to/amqp", b"from mqtt", qos=1)
        assert amqp091_get(consumer, queue) == b"from mqtt"
        assert body_bytes(receiver.receive(timeout=5)) == b"from mqtt"
        receiver.accept()
        receiving.create_sender(f"topic://{topic}/back").send(Message(body=b"from amqp 1.0"))
        assert client.expect().payload == b"from amqp 1.0"
    finally:
        consumer.close()
        receiving.close()
        client.disconnect()


def test_routes_follow_unsubscribe_and_a_filter_is_held_once_per_node(two: Nodes) -> None:
    topic = root()
    b = two.started[1]
    first = connect(mqtt(b))
    second = connect(mqtt(b))
    try:
        first.subscribe(f"{topic}/#", qos=0)
        second.subscribe(f"{topic}/#", qos=0)
        wait_route(two, "b", f"{topic}/#")
        first.client.unsubscribe(f"{topic}/#")
        time.sleep(0.3)
        assert f"{topic}/#" in two.routes("b")  # the second subscriber still holds it
        second.client.unsubscribe(f"{topic}/#")
        wait_until(lambda: f"{topic}/#" not in two.routes("b"), what="the route to go")
    finally:
        first.disconnect()
        second.disconnect()


def test_a_retained_message_set_on_one_node_is_served_by_the_other(two: Nodes) -> None:
    topic = root()
    a, b = two.started
    publisher = connect(mqtt(a))
    try:
        publisher.publish(f"{topic}/state", b"on", qos=1, retain=True)
        late = connect(mqtt(b))

        def arrives() -> bool:
            late.subscribe(f"{topic}/state", qos=1)
            try:
                got = late.expect(timeout=0.2)
            except Exception:
                return False
            return got.payload == b"on" and got.retain

        try:
            wait_until(arrives, what="the retained message on b")
            publisher.publish(f"{topic}/state", b"", qos=1, retain=True)  # cleared on a ...
            time.sleep(0.5)
            again = connect(mqtt(b))
            try:
                again.subscribe(f"{topic}/state", qos=1)
                again.expect_none(0.5)  # ... and so on b
            finally:
                again.disconnect()
        finally:
            late.disconnect()
    finally:
        publisher.disconnect()


def test_a_share_group_over_both_nodes_gets_each_message_once(two: Nodes) -> None:
    topic = root()
    a, b = two.started
    on_a = connect(mqtt(a), version=V5)
    on_b = connect(mqtt(b), version=V5)
    publisher = connect(mqtt(a))
    try:
        on_a.subscribe(f"$share/workers/{topic}/+", qos=1)
        on_b.subscribe(f"$share/workers/{topic}/+", qos=1)
        wait_route(two, "b", f"$share/workers/{topic}/+")
        for i in range(20):
            publisher.publish(f"{topic}/{i}", str(i).encode(), qos=1)
        time.sleep(1.0)
        got_a = [m.payload for m in _all(on_a)]
        got_b = [m.payload for m in _all(on_b)]
        assert sorted(got_a + got_b, key=int) == [str(i).encode() for i in range(20)]
        assert got_a and got_b  # both nodes' members took a share
    finally:
        on_a.disconnect()
        on_b.disconnect()
        publisher.disconnect()


def _all(client):  # type: ignore[no-untyped-def]
    out = []
    while not client.messages.empty():
        out.append(client.messages.get())
    return out


def test_the_cluster_endpoint_lists_the_nodes(two: Nodes) -> None:
    a = two.started[0]
    request = urllib.request.Request(
        f"http://127.0.0.1:{a.ports['http']}/api/v1/cluster", headers={"Authorization": f"Bearer {TOKEN}"}
    )
    with urllib.request.urlopen(request, timeout=5) as reply:
        body = json.load(reply)
    assert body["node"] == "a"
    assert body["forwarded"] > 0 and body["received"] > 0
    nodes = {n["name"]: n for n in body["nodes"]}
    assert {name: n["state"] for name, n in nodes.items()} == {"a": "alive", "b": "alive"}
    assert nodes["a"]["self"] and not nodes["b"]["self"]
    assert all(n["last_heartbeat"] >= n["started_at"] for n in nodes.values())


@needs_browser
def test_the_management_page_lists_the_nodes(two: Nodes, browser: Any) -> None:
    from selenium.webdriver.common.by import By

    a = two.started[0]
    browser.get(f"http://127.0.0.1:{a.ports['http']}/ui")
    browser.find_element(By.ID, "token").send_keys(TOKEN)
    browser.find_element(By.CSS_SELECTOR, "#login button").click()
    wait(lambda: browser.find_element(By.ID, "tabs").is_displayed())
    browser.find_element(By.CSS_SELECTOR, '#tabs button[data-tab="cluster"]').click()
    for node in ("a", "b"):
        state = f'#node-rows tr[data-node="{node}"] td[data-field="state"]'
        assert wait(lambda state=state: browser.find_element(By.CSS_SELECTOR, state).text == "alive")
    assert "(this one)" in browser.find_element(By.CSS_SELECTOR, '#node-rows tr[data-node="a"]').text
    assert not browser.find_element(By.ID, "cluster-none").is_displayed()
    snap(browser, "cluster")


def test_a_node_that_lost_its_listening_connection_listens_again_and_catches_up(two: Nodes) -> None:
    topic = root()
    a, b = two.started
    publisher = connect(mqtt(a))
    try:
        with psycopg.connect(two.url, autocommit=True) as connection:
            cut = connection.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s",
                ("trimaran b listen",),
            ).fetchall()
        assert cut == [(True,)]
        publisher.publish(f"{topic}/state", b"while away", qos=1, retain=True)  # b misses the notice
        assert b.wait_for_log("listening again")
        late = connect(mqtt(b))
        try:

            def reloaded() -> bool:
                late.subscribe(f"{topic}/state", qos=1)
                try:
                    return late.expect(timeout=0.2).payload == b"while away"
                except Exception:
                    return False

            wait_until(reloaded, what="b to reload the retained messages")
            late.subscribe(f"{topic}/live", qos=1)
            wait_route(two, "b", f"{topic}/live")
            publisher.publish(f"{topic}/live", b"again", qos=1)
            got = late.expect()
            while got.retain:  # retained copies of the probes above
                got = late.expect()
            assert got.payload == b"again"
        finally:
            late.disconnect()
    finally:
        publisher.disconnect()
