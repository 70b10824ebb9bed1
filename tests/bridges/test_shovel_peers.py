"""Shovels (trimaran/bridges/shovel.py) to other brokers: RabbitMQ 3.10 over AMQP 0.9.1 and its
AMQP 1.0 plugin, and the Qpid Proton C broker over AMQP 1.0; skipped with the reason where one is
absent."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest

from tests.bridges.test_shovel import BODIES, broker, depth, drain, publish
from tests.bridges.test_shovel_faults import COUNT, collect, publish_steadily, shovels
from tests.support import rabbitmq
from tests.support.paho import V311, connect
from tests.support.paho import Endpoints as MqttEndpoints
from tests.support.proton_broker import build, proton_c_broker
from tests.support.server import RunningServer, unused_port


@pytest.fixture(scope="module")
def rabbit(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """RabbitMQ 3.10 with its AMQP 1.0 plugin (on the AMQP port); yields the port."""
    why = rabbitmq.available()
    if why is not None:
        pytest.skip(why)
    try:
        with rabbitmq.rabbitmq_node(tmp_path_factory.mktemp("rabbitmq"), ("rabbitmq_amqp1_0",)) as port:
            yield port
    except RuntimeError as exc:
        pytest.skip(f"RabbitMQ did not start: {str(exc)[:200]}")


@pytest.fixture(scope="module")
def proton(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """The Qpid Proton C broker example; yields its port."""
    binary = build(tmp_path_factory.mktemp("proton"))
    if isinstance(binary, str):
        pytest.skip(binary)
    with proton_c_broker(binary) as port:
        yield port


class Rabbit:
    """RabbitMQ on ``port`` as a RunningServer-like peer of the helpers of test_shovel.py."""

    def __init__(self, port: int) -> None:
        self.ports = {"amqp": port}


def rabbit_peer(port: int) -> RunningServer:
    return Rabbit(port)  # type: ignore[return-value]  # (only .ports is read)


@pytest.mark.slow  # RabbitMQ takes about 10 s to start
def test_queues_cross_to_rabbitmq_and_back_over_amqp091(tmp_path: Path, rabbit: int) -> None:
    remote = f"amqp://guest:guest@127.0.0.1:{rabbit}"
    up = {
        "name": "up",
        "src_uri": "amqp://",
        "src_queue": "orders",
        "dest_uri": remote,
        "dest_queue": "orders",
    }
    down = {
        "name": "down",
        "src_uri": remote,
        "src_queue": "replies",
        "dest_uri": "amqp://",
        "dest_queue": "replies",
    }
    peer = rabbit_peer(rabbit)
    with broker(tmp_path / "edge", up, down) as edge:
        publish(edge, "orders", BODIES)
        assert drain(peer, "orders", len(BODIES)) == BODIES
        publish(peer, "replies", BODIES[:100])
        assert drain(edge, "replies", 100) == BODIES[:100]
        assert depth(edge, "orders") == 0
        assert depth(peer, "replies") == 0


@pytest.mark.slow
def test_rabbitmq_topics_come_in_through_a_queue_of_the_shovel(tmp_path: Path, rabbit: int) -> None:
    remote = f"amqp://guest:guest@127.0.0.1:{rabbit}"
    shovel = {
        "name": "events",
        "src_uri": remote,
        "src_exchange": "amq.topic",
        "src_exchange_key": "erp.#",
        "dest_uri": "amqp://",
        "dest_exchange": "amq.topic",
        "dest_exchange_key": "plant.erp",
    }
    with broker(tmp_path / "edge", shovel) as edge:
        device = connect(MqttEndpoints("127.0.0.1", edge.ports["mqtt"]), "plc", version=V311)
        device.subscribe("plant/erp", 1)
        ch = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", rabbit)).channel()
        ch.confirm_delivery()
        for i in range(30):
            ch.basic_publish(
                "amq.topic", f"erp.order.{i}", f"{i}".encode(), pika.BasicProperties(delivery_mode=2)
            )
        ch.basic_publish("amq.topic", "other.key", b"not for the shovel")
        ch.connection.close()
        assert [device.expect(10).payload for _ in range(30)] == [f"{i}".encode() for i in range(30)]
        device.expect_none(0.5)
        device.disconnect()


@pytest.mark.slow
def test_queues_cross_to_rabbitmq_over_its_amqp1_plugin(tmp_path: Path, rabbit: int) -> None:
    remote = f"amqp://guest:guest@127.0.0.1:{rabbit}"
    peer = rabbit_peer(rabbit)
    ch = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", rabbit)).channel()
    for queue in ("orders-10", "replies-10"):
        ch.queue_declare(queue, durable=True)
    ch.connection.close()
    up = {
        "name": "up",
        "src_uri": "amqp://",
        "src_queue": "orders",
        "dest_protocol": "amqp10",
        "dest_uri": remote,
        "dest_address": "/amq/queue/orders-10",
    }
    down = {
        "name": "down",
        "src_protocol": "amqp10",
        "src_uri": remote,
        "src_address": "/amq/queue/replies-10",
        "dest_uri": "amqp://",
        "dest_queue": "replies",
    }
    with broker(tmp_path / "edge", up, down) as edge:
        publish(edge, "orders", BODIES[:100])
        assert drain(peer, "orders-10", 100) == BODIES[:100]
        publish(peer, "replies-10", BODIES[:100])
        assert drain(edge, "replies", 100) == BODIES[:100]


def test_queues_cross_the_proton_broker_and_come_back(tmp_path: Path, proton: int) -> None:
    remote = f"amqp://127.0.0.1:{proton}"
    up = {
        "name": "up",
        "src_uri": "amqp://",
        "src_queue": "orders",
        "dest_protocol": "amqp10",
        "dest_uri": remote,
        "dest_address": "orders",
    }
    back = {
        "name": "back",
        "src_protocol": "amqp10",
        "src_uri": remote,
        "src_address": "orders",
        "dest_uri": "amqp://",
        "dest_queue": "returned",
    }
    with broker(tmp_path / "edge", up, back) as edge:
        publish(edge, "orders", BODIES)
        assert drain(edge, "returned", len(BODIES)) == BODIES
        assert depth(edge, "orders") == 0


@pytest.mark.slow  # ten starts of RabbitMQ: about two minutes
def test_rabbitmq_stopped_ten_times_loses_nothing_either_way(tmp_path: Path) -> None:
    why = rabbitmq.available()
    if why is not None:
        pytest.skip(why)
    port = unused_port()
    base = tmp_path / "rabbitmq"
    commands: list[str] = []
    with rabbitmq.rabbitmq_node(base, port=port):  # confirmed there while it is up
        publish_steadily(lambda: port, "commands", "down-", commands)
    orders: list[str] = []
    with broker(tmp_path / "edge", *shovels(port), connected=False) as edge:
        edge_port = edge.ports["amqp"]
        publisher = threading.Thread(
            target=publish_steadily, args=(lambda: edge_port, "orders", "up-", orders)
        )
        publisher.start()  # confirmed here, steadily, while RabbitMQ comes and goes
        for turn in range(10):
            with rabbitmq.rabbitmq_node(base, port=port):
                assert edge.wait_for_log_count("shovel down: connected", turn + 1, 30), edge.output()
                time.sleep(0.5)  # the shovels move some
        publisher.join(150)
        with rabbitmq.rabbitmq_node(base, port=port):
            arrived_up = collect(port, "orders-in", set(orders))
            arrived_down = collect(edge_port, "commands-in", set(commands))
    assert len(orders) == len(commands) == COUNT
    assert set(orders) - set(arrived_up) == set(), "confirmed here, never arrived at RabbitMQ"
    assert set(commands) - set(arrived_down) == set(), "confirmed at RabbitMQ, never arrived here"
    duplicates = sum(arrived_up.values()) - len(arrived_up) + sum(arrived_down.values()) - len(arrived_down)
    print(f"duplicates (at-least-once allows them): {duplicates}")
