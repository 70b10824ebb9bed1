"""The soak (issue 44, slow suite): minutes of mixed three-protocol load on one server, with fast, slow
and stalled consumers, and every acknowledged message counted end to end.

- MQTT: publishers at QoS 1 (paho) to topics a fast, a slow and a stalled persistent subscriber read;
  the stalled one stops taking messages, is disconnected by the stalled-consumer timeout and comes
  back later for what its session kept.
- AMQP 0.9.1: publishers with confirms (pika) into a queue one prefetch-10 consumer acks slowly.
- AMQP 1.0: a sender (proton) into a queue a receiver settles.

Checked at the end: each subscriber and consumer got every message its publisher was acknowledged
(QoS 1 and confirms promise at least once), the broker's RSS stayed under its bound the whole time,
and its log holds no traceback. ``SOAK_S`` sets the length (600 s by default).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest

from tests.interop.conftest import endpoints_of, start_server
from tests.support.paho import V311, Client, connect
from tests.support.server import RunningServer, serving

SOAK_S = float(os.environ.get("SOAK_S", "600"))
RSS_BOUND_KB = 300 * 1024

pytestmark = [pytest.mark.slow, pytest.mark.timeout(0)]


@pytest.fixture
def server(tmp_path: Path, tls_files: dict[str, str]) -> Iterator[RunningServer]:
    env = {
        "TRIMARAN_LIMITS__BACKPRESSURE_MESSAGES": "200",
        "TRIMARAN_LIMITS__STALLED_CONSUMER_TIMEOUT_S": "5",
    }
    args = ["--mqtt", "127.0.0.1:0", "--mqtt-ws", "off", "--amqp", "127.0.0.1:0", "--http", "127.0.0.1:0"]
    with serving(start_server(tmp_path, tls_files, env, args)) as running:
        yield running


def rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


class Ids:
    """Message numbers seen, thread-safe."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.seen: set[str] = set()

    def add(self, ident: str) -> None:
        with self.lock:
            self.seen.add(ident)


def mqtt_reader(client: Client, ids: Ids, pause: Callable[[], None]) -> None:
    def on_message(_c: Any, _u: Any, msg: mqtt.MQTTMessage) -> None:
        ids.add(msg.payload.decode())
        pause()

    client.client.on_message = on_message


def test_mixed_load_with_slow_and_stalled_consumers_loses_nothing_acknowledged(
    server: RunningServer, tls_files: dict[str, str]
) -> None:
    import pika

    proton = pytest.importorskip("proton")
    from proton.utils import BlockingConnection

    endpoints = endpoints_of(server, tls_files)
    pid = server.process.pid if server.process is not None else 0
    stop = threading.Event()
    errors: list[BaseException] = []
    threads: list[threading.Thread] = []

    def run(target: Callable[[], None]) -> None:
        def guarded() -> None:
            try:
                target()
            except BaseException as exc:  # reported at the end
                errors.append(exc)
                stop.set()

        thread = threading.Thread(target=guarded, daemon=True)
        thread.start()
        threads.append(thread)

    # -- MQTT: two publishers, a fast, a slow and a stalled subscriber ----------------------------
    fast_ids, slow_ids, stalled_ids = Ids(), Ids(), Ids()
    fast = connect(endpoints, "soak-fast", version=V311, clean=False)
    slow = connect(endpoints, "soak-slow", version=V311, clean=False)
    stalled = connect(endpoints, "soak-stalled", version=V311, clean=False)
    wake = threading.Event()
    mqtt_reader(fast, fast_ids, lambda: None)
    mqtt_reader(slow, slow_ids, lambda: time.sleep(0.0005))
    mqtt_reader(stalled, stalled_ids, lambda: None if len(stalled_ids.seen) < 500 else wake.wait(3600))
    for sub in (fast, slow, stalled):
        sub.subscribe("soak/#", qos=1)
    mqtt_acked: list[set[str]] = []

    def mqtt_publisher(n: int) -> Callable[[], None]:
        acked: set[str] = set()
        mqtt_acked.append(acked)

        def publish() -> None:
            pub = connect(endpoints, f"soak-pub-{n}", version=V311)
            pending: list[tuple[str, mqtt.MQTTMessageInfo]] = []

            def collect() -> None:
                nonlocal pending
                still = []
                for ident, info in pending:
                    if info.is_published():
                        acked.add(ident)
                    else:
                        still.append((ident, info))
                pending = still

            i = 0
            while not stop.is_set():
                ident = f"m{n}-{i}"
                pending.append((ident, pub.client.publish(f"soak/{n}/{i % 8}", ident.encode(), qos=1)))
                i += 1
                while len(pending) > 100 and not stop.is_set():
                    collect()
                    time.sleep(0.001)
            deadline = time.monotonic() + 60
            while pending and time.monotonic() < deadline:
                collect()
                time.sleep(0.05)
            pub.disconnect()

        return publish

    # -- AMQP 0.9.1: confirmed publishes into a queue read slowly ---------------------------------
    amqp_port = server.ports["amqp"]
    params = pika.ConnectionParameters("127.0.0.1", amqp_port, heartbeat=0)
    setup = pika.BlockingConnection(params)
    setup.channel().queue_declare("soak-q", durable=False)
    setup.close()
    confirmed: set[str] = set()
    delivered = Ids()

    def amqp_publisher() -> None:
        connection = pika.BlockingConnection(params)
        channel = connection.channel()
        channel.confirm_delivery()
        i = 0
        while not stop.is_set():
            ident = f"a{i}"
            channel.basic_publish("", "soak-q", ident.encode())  # returns once confirmed
            confirmed.add(ident)
            i += 1
        connection.close()

    def amqp_consumer() -> None:
        connection = pika.BlockingConnection(params)
        channel = connection.channel()
        channel.basic_qos(prefetch_count=10)
        for method, _props, body in channel.consume("soak-q", inactivity_timeout=1):
            if method is None:
                if stop.is_set() and drained.is_set():
                    break
                continue
            delivered.add(body.decode())
            time.sleep(0.001)
            channel.basic_ack(method.delivery_tag)
        connection.close()

    drained = threading.Event()

    # -- AMQP 1.0: a sender and a receiver on a queue ---------------------------------------------
    url = f"amqp://127.0.0.1:{amqp_port}"
    sent1: list[str] = []
    got1 = Ids()

    def amqp1_sender() -> None:
        connection = BlockingConnection(url, timeout=30)
        sender = connection.create_sender("queue://soak-1")
        i = 0
        while not stop.is_set():
            ident = f"p{i}"
            sender.send(proton.Message(body=ident))  # returns once accepted
            sent1.append(ident)
            i += 1
        connection.close()

    def amqp1_receiver() -> None:
        connection = BlockingConnection(url, timeout=30)
        receiver = connection.create_receiver("queue://soak-1", credit=20)
        while True:
            try:
                message = receiver.receive(timeout=1)
            except proton.Timeout:
                if stop.is_set() and drained.is_set():
                    break
                continue
            got1.add(str(message.body))
            receiver.accept()
        connection.close()

    for n in range(2):
        run(mqtt_publisher(n))
    run(amqp_publisher)
    run(amqp_consumer)
    run(amqp1_sender)
    run(amqp1_receiver)
    peak = 0
    deadline = time.monotonic() + SOAK_S
    while time.monotonic() < deadline and not stop.is_set():
        peak = max(peak, rss_kb(pid))
        time.sleep(1)
    stop.set()
    time.sleep(5)  # the publishers' last acknowledgements
    drained.set()
    for thread in threads:
        thread.join(120)
    assert not errors, errors
    assert peak < RSS_BOUND_KB, f"broker RSS reached {peak} KB"

    acked = set().union(*mqtt_acked)
    assert acked
    # The stalled subscriber was disconnected while its publishers waited; its session kept the rest.
    assert server.wait_for_log("took no message for", timeout=1), (
        f"the stalled subscriber was never closed ({len(stalled_ids.seen)} taken): {server.output()[-3000:]}"
    )
    wake.set()
    stalled.drop()
    before = len(stalled_ids.seen)
    back = connect(endpoints, "soak-stalled", version=V311, clean=False)
    mqtt_reader(back, stalled_ids, lambda: None)

    def missing(ids: Ids) -> set[str]:
        with ids.lock:
            return acked - ids.seen

    settle_by = time.monotonic() + 120
    while time.monotonic() < settle_by and (missing(fast_ids) or missing(slow_ids)):
        time.sleep(0.2)
    assert not missing(fast_ids), f"{len(missing(fast_ids))} acknowledged messages never reached the fast one"
    assert not missing(slow_ids), f"{len(missing(slow_ids))} acknowledged messages never reached the slow one"
    while time.monotonic() < settle_by and len(stalled_ids.seen) <= before:
        time.sleep(0.2)
    assert len(stalled_ids.seen) > before, "the stalled subscriber's session kept nothing for it"
    for client in (fast, slow, back):
        client.disconnect()
    assert confirmed and confirmed <= delivered.seen, (
        f"{len(confirmed - delivered.seen)} confirmed, never delivered"
    )
    assert sent1 and set(sent1) <= got1.seen, f"{len(set(sent1) - got1.seen)} accepted, never delivered"
    assert "Traceback" not in server.output(), server.output()[-5000:]
    print(  # what a long run showed, for its report (-s)
        f"soak: {SOAK_S:.0f} s, broker peak RSS {peak / 1024:.0f} MiB; MQTT QoS 1 acknowledged {len(acked)}, "
        f"AMQP 0.9.1 confirmed {len(confirmed)}, AMQP 1.0 accepted {len(sent1)}: each delivered"
    )
