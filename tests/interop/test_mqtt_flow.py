"""Flow control over MQTT with paho against the real server (issue 44): a QoS 1 subscriber that stops
reading slows the publishers that feed it instead of losing what they were acknowledged; one that
takes nothing for ``limits.stalled_consumer_timeout_s`` is disconnected, its persistent session keeps
its messages, and the publishers go on; subscribers that keep reading are not held by it.

The tests wait on events (a count reached, a disconnect seen), never on a time that a busy host
could overrun; the one time-based look (``plateau``) only asks that a held publisher does not get
everything acknowledged, which a slower host makes more certain, not less.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest

from tests.interop.conftest import endpoints_of, mqtt_server_args, start_server
from tests.support.paho import V311, Client, Endpoints, connect
from tests.support.server import RunningServer, serving
from tests.support.waiting import plateau, wait_until

HIGH = 100  # limits.backpressure_messages here: the session queue past which publishers are held
COUNT = 3000  # far more than the window (64), the high-water mark and the publisher's window (20)
PAYLOAD = 512


@pytest.fixture
def server(tmp_path: Path, tls_files: dict[str, str]) -> Iterator[RunningServer]:
    env = {
        "TRIMARAN_LIMITS__BACKPRESSURE_MESSAGES": str(HIGH),
        "TRIMARAN_LIMITS__STALLED_CONSUMER_TIMEOUT_S": "2",
        "TRIMARAN_LIMITS__HOLD_PUBLISHERS_S": "0.2",
    }
    with serving(start_server(tmp_path, tls_files, env, mqtt_server_args())) as running:
        yield running


class Blocked:
    """A subscriber whose application stops taking messages: paho's network thread waits in the
    callback, so the socket is not read and no PUBACK goes out, as when an app is stuck."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.go = threading.Event()
        self.first = threading.Event()
        self.got: list[int] = []
        self.lock = threading.Lock()
        client.client.on_message = self._on_message

    def _on_message(self, _c: Any, _u: Any, msg: mqtt.MQTTMessage) -> None:
        with self.lock:
            self.got.append(int(msg.payload[:8]))
        self.first.set()
        self.go.wait(60)


def publisher(endpoints: Endpoints, client_id: str) -> tuple[Client, list[int]]:
    """A publisher keeping up to 20 QoS 1 PUBLISHes unacknowledged (paho's default); the list
    counts its PUBACKs."""
    client = connect(endpoints, client_id, version=V311)
    acked = [0]

    def on_publish(_c: Any, _u: Any, _mid: int, _rc: Any, _p: Any) -> None:
        acked[0] += 1

    client.client.on_publish = on_publish
    return client, acked


def publish_all(client: Client, topic: str) -> None:
    for i in range(COUNT):
        client.client.publish(topic, f"{i:08d}".encode() + b"x" * (PAYLOAD - 8), qos=1)


def test_a_subscriber_that_stops_reading_holds_its_publisher_and_loses_nothing(
    server: RunningServer, tls_files: dict[str, str]
) -> None:
    endpoints = endpoints_of(server, tls_files)
    sub = connect(endpoints, "flow-slow", version=V311)
    sub.subscribe("flow/#", qos=1)
    slow = Blocked(sub)
    pub, acked = publisher(endpoints, "flow-pub")
    try:
        publish_all(pub, "flow/a")
        assert slow.first.wait(10)
        # Held: what the broker took is what it can give (the window, the queue to its mark, what
        # was read before the hold), far from everything.
        held_at = plateau(lambda: acked[0])
        assert held_at < COUNT // 2, held_at
        slow.go.set()  # it reads again: everything arrives, once, in order; the publisher goes on
        wait_until(lambda: len(slow.got) >= COUNT and acked[0] == COUNT)
        assert slow.got == list(range(COUNT))
    finally:
        slow.go.set()
        for client in (sub, pub):
            client.disconnect()


def test_a_stalled_subscriber_is_disconnected_keeps_its_messages_and_lets_the_others_go_on(
    server: RunningServer, tls_files: dict[str, str]
) -> None:
    endpoints = endpoints_of(server, tls_files)
    fast = connect(endpoints, "flow-fast", version=V311)
    fast.subscribe("flow/#", qos=1)
    stuck_client = connect(endpoints, "flow-stuck", version=V311, clean=False)
    stuck_client.subscribe("flow/#", qos=1)
    stuck = Blocked(stuck_client)
    pub, acked = publisher(endpoints, "flow-pub2")
    try:
        publish_all(pub, "flow/b")
        assert stuck.first.wait(10)
        # Held by the stalled one until the timeout (2 s) closes it; then everything is acknowledged
        # and the subscriber that reads gets all of it.
        assert server.wait_for_log("took no message for", timeout=30), server.output()
        wait_until(lambda: acked[0] == COUNT)
        got = {int(m.payload[:8]) for m in fast.drain(COUNT, timeout=30)}
        assert got == set(range(COUNT))
        # Its persistent session kept what it had not taken: it gets the rest when it comes back.
        stuck.go.set()
        stuck_client.drop()
        again = connect(endpoints, "flow-stuck", version=V311, clean=False)
        try:
            seen = set(stuck.got)
            while len(seen) < COUNT:
                seen.add(int(again.expect(timeout=10).payload[:8]))
            assert seen == set(range(COUNT))
        finally:
            again.disconnect()
    finally:
        stuck.go.set()
        for client in (fast, pub):
            client.disconnect()
