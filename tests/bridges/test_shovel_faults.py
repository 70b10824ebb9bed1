"""Shovels under faults (trimaran/bridges/shovel.py): the network cut, the remote killed and started
again, this server killed mid-stream. Every message one side confirmed arrives on the other;
duplicates, which AMQP's at-least-once allows, are counted."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pika
import pika.exceptions
import pytest

from tests.bridges.test_shovel import broker, start
from tests.support.proxy import proxy_to
from tests.support.server import RunningServer, unused_port

COUNT = 400  # each way
FAILURES = (pika.exceptions.AMQPError, OSError)


def publish_steadily(port: Callable[[], int], queue: str, prefix: str, confirmed: list[str]) -> None:
    """COUNT persistent messages to ``queue`` with publisher confirms, each confirmed one noted;
    through a broker going away and coming back (the unconfirmed one is sent again)."""
    channel = None
    i = 0
    deadline = time.monotonic() + 120
    while i < COUNT and time.monotonic() < deadline:
        body = f"{prefix}{i}"
        try:
            if channel is None:
                params = pika.ConnectionParameters("127.0.0.1", port(), blocked_connection_timeout=10)
                channel = pika.BlockingConnection(params).channel()
                channel.confirm_delivery()
                channel.queue_declare(queue, durable=True)
            channel.basic_publish("", queue, body.encode(), pika.BasicProperties(delivery_mode=2))
        except FAILURES:
            channel = None
            time.sleep(0.1)
            continue
        confirmed.append(body)
        i += 1
        time.sleep(0.002)


def collect(port: int, queue: str, expected: set[str], timeout: float = 60) -> Counter[str]:
    """What ``queue`` holds (acknowledged), until ``expected`` is all in or ``timeout``."""
    seen: Counter[str] = Counter()
    deadline = time.monotonic() + timeout
    while not expected <= set(seen) and time.monotonic() < deadline:
        try:
            channel = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port)).channel()
            channel.queue_declare(queue, durable=True)
            for method, _props, body in channel.consume(queue, inactivity_timeout=1):
                if body is None:
                    if expected <= set(seen) or time.monotonic() > deadline:
                        break
                    continue
                seen[body.decode()] += 1
                channel.basic_ack(method.delivery_tag)
            channel.connection.close()
        except FAILURES:
            time.sleep(0.2)
    return seen


def shovels(remote: int) -> tuple[dict[str, str], dict[str, str]]:
    """``up``: this server's queue ``orders`` to the remote's ``orders-in``; ``down``: the remote's
    ``commands`` to this server's ``commands-in``."""
    uri = f"amqp://guest:guest@127.0.0.1:{remote}?heartbeat=2"
    up = {
        "name": "up",
        "src_uri": "amqp://",
        "src_queue": "orders",
        "dest_uri": uri,
        "dest_queue": "orders-in",
    }
    down = {
        "name": "down",
        "src_uri": uri,
        "src_queue": "commands",
        "dest_uri": "amqp://",
        "dest_queue": "commands-in",
    }
    return up, down


def both_ways(edge: Callable[[], int], cloud: Callable[[], int], fault: Callable[[], None]) -> None:
    """COUNT messages each way while ``fault()`` runs; every confirmed one arrives."""
    up: list[str] = []
    down: list[str] = []
    publishers = [
        threading.Thread(target=publish_steadily, args=(edge, "orders", "up-", up)),
        threading.Thread(target=publish_steadily, args=(cloud, "commands", "down-", down)),
    ]
    for thread in publishers:
        thread.start()
    fault()
    for thread in publishers:
        thread.join(150)
    assert len(up) == len(down) == COUNT
    arrived_up = collect(cloud(), "orders-in", set(up))
    arrived_down = collect(edge(), "commands-in", set(down))
    assert set(up) - set(arrived_up) == set(), "confirmed here, never arrived there"
    assert set(down) - set(arrived_down) == set(), "confirmed there, never arrived here"
    duplicates = sum(arrived_up.values()) - len(arrived_up) + sum(arrived_down.values()) - len(arrived_down)
    print(f"duplicates (at-least-once allows them): {duplicates}")


def test_a_network_reset_ten_times_loses_nothing_either_way(tmp_path: Path) -> None:
    with (
        broker(tmp_path / "cloud") as cloud,
        proxy_to(cloud.ports["amqp"]) as proxy,
        broker(tmp_path / "edge", *shovels(proxy.port)) as edge,
    ):

        def cut_ten_times() -> None:
            for _ in range(10):
                time.sleep(0.15)
                proxy.reset()

        both_ways(lambda: edge.ports["amqp"], lambda: cloud.ports["amqp"], cut_ten_times)
        assert edge.output().count("shovel up: connected") >= 2


@pytest.mark.slow
def test_the_remote_killed_ten_times_loses_nothing_either_way(tmp_path: Path) -> None:
    port = unused_port()
    address = f"127.0.0.1:{port}"
    remote: list[RunningServer] = [start(tmp_path / "cloud", amqp=address)]
    with broker(tmp_path / "edge", *shovels(port)) as edge:

        def kill_ten_times() -> None:
            for _ in range(10):
                time.sleep(0.3)
                remote[0].kill()  # SIGKILL: what it confirmed is committed, nothing else
                time.sleep(0.2)
                remote[0] = start(tmp_path / "cloud", amqp=address)

        try:
            both_ways(lambda: edge.ports["amqp"], lambda: port, kill_ten_times)
        finally:
            remote[0].kill()
        assert edge.output().count("shovel down: connected") >= 11


@pytest.mark.slow
def test_this_server_killed_mid_stream_loses_nothing_either_way(tmp_path: Path) -> None:
    port = unused_port()
    address = f"127.0.0.1:{port}"
    with broker(tmp_path / "cloud") as cloud:
        edge: list[RunningServer] = [start(tmp_path / "edge", *shovels(cloud.ports["amqp"]), amqp=address)]

        def kill_twice() -> None:
            for _ in range(2):
                time.sleep(0.5)
                edge[0].kill()
                time.sleep(0.2)
                edge[0] = start(tmp_path / "edge", *shovels(cloud.ports["amqp"]), amqp=address)

        try:
            both_ways(lambda: port, lambda: cloud.ports["amqp"], kill_twice)
        finally:
            edge[0].kill()
