"""Flow control on a ``$queue/`` with paho against the real server (issue 44): a queue whose MQTT
consumer stops taking holds the publisher feeding it near its mark; a consumer that takes nothing
for ``limits.stalled_consumer_timeout_s`` meanwhile is disconnected, what it held goes back to the
queue, and the publisher goes on. Waits on events (a count, a log line, a disconnect)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.interop.conftest import endpoints_of, mqtt_server_args, start_server
from tests.interop.test_mqtt_flow import PAYLOAD, Blocked, publisher, wait_until
from tests.support.names import unique
from tests.support.paho import V311, connect
from tests.support.server import RunningServer, serving

HIGH = 200  # limits.queue_backpressure_messages here
COUNT = 3 * HIGH


@pytest.fixture
def server(tmp_path: Path, tls_files: dict[str, str]) -> Iterator[RunningServer]:
    env = {
        "TRIMARAN_LIMITS__QUEUE_BACKPRESSURE_MESSAGES": str(HIGH),
        "TRIMARAN_LIMITS__STALLED_CONSUMER_TIMEOUT_S": "2",
    }
    with serving(start_server(tmp_path, tls_files, env, mqtt_server_args())) as running:
        yield running


def test_a_queue_consumer_that_takes_nothing_is_disconnected_and_its_publisher_goes_on(
    server: RunningServer, tls_files: dict[str, str]
) -> None:
    endpoints = endpoints_of(server, tls_files)
    topic = f"$queue/{unique('mq')}"
    stuck_client = connect(endpoints, "queue-stuck", version=V311)
    stuck_client.subscribe(topic, qos=1)
    stuck = Blocked(stuck_client)
    pub, acked = publisher(endpoints, "queue-pub")
    try:
        for i in range(COUNT):
            pub.client.publish(topic, f"{i:08d}".encode() + b"x" * (PAYLOAD - 8), qos=1)
        assert stuck.first.wait(10)
        # Held past the mark until the consumer, which takes nothing, is closed; then everything is
        # acknowledged.
        assert server.wait_for_log("took no message of", timeout=30), server.output()
        wait_until(lambda: acked[0] == COUNT)
        stuck.go.set()
        stuck_client.drop()
        again = connect(endpoints, "queue-reader", version=V311)
        try:
            again.subscribe(topic, qos=1)
            got = {int(m.payload[:8]) for m in again.drain(COUNT, timeout=30)}
            assert got == set(range(COUNT))  # what the stuck one held came back
        finally:
            again.disconnect()
        assert server.output().count("took no message of") == 1
    finally:
        stuck.go.set()
        pub.disconnect()
