"""Queue tables made by the real broker (paho over real sockets), and one SparkSession for every test."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.interop.conftest import endpoints_of, start_server, tls_files
from tests.support.paho import V5, Client, Endpoints, connect, props
from tests.support.server import ALL_OFF

pyspark = pytest.importorskip("pyspark")

from paho.mqtt.packettypes import PacketTypes  # noqa: E402
from pyspark.sql import SparkSession  # noqa: E402

from trimaran.analytics.source import DEBIAN_JARS, spark_session  # noqa: E402

__all__ = ["tls_files"]  # the interop suite's certificates fixture, shared

BROKER_ENV = {
    "TRIMARAN_QUEUES__DEFAULTS__BACKOFF_INITIAL_S": "0.05",
    "TRIMARAN_QUEUES__DEFAULTS__BACKOFF_MAX_S": "0.1",
    "TRIMARAN_QUEUES__DEFAULTS__MAX_ATTEMPTS": "3",
    "TRIMARAN_QUEUES__DEFAULTS__VISIBILITY_TIMEOUT_S": "0.6",
    "TRIMARAN_QUEUES__DECLARE": json.dumps([{"name": "ticks", "mode": "stream"}]),
}


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    missing = [j for j in DEBIAN_JARS if not Path(j).exists()]
    if missing:
        pytest.skip(f"JDBC drivers missing: {missing} (scripts/system-deps.sh installs them)")
    session = spark_session(
        "local[2]",
        list(DEBIAN_JARS),
        app_name="trimaran-audit-tests",
        shuffle_partitions=1,  # tables of a few hundred rows: one task per stage is fastest
        extra={
            "spark.ui.enabled": "false",
            "spark.ui.showConsoleProgress": "false",
            "spark.sql.adaptive.enabled": "false",
            "spark.default.parallelism": "1",
            # Compiling generated code for every stage costs more than running it on tables of a
            # few hundred rows: interpreted evaluation (what Spark's own test suites also run) makes
            # each replay about a third faster here. The benchmark still runs with code generation.
            "spark.sql.codegen.wholeStage": "false",
            "spark.sql.codegen.factoryMode": "NO_CODEGEN",
            # A JDBC table's size is unknown to Spark, which then assumes it huge and shuffles it for
            # every join; taking it as 1 MB lets these few-row tables be broadcast instead.
            "spark.sql.defaultSizeInBytes": str(1 << 20),
        },
    )
    yield session
    session.stop()


def _headers(message: Any) -> dict[str, str]:
    return dict(getattr(message.properties, "UserProperty", None) or [])


def _control(client: Client, topic: str, message_id: str, **extra: str) -> None:
    user = [("message-id", message_id), *extra.items()]
    client.publish(topic, b"", qos=1, properties=props(PacketTypes.PUBLISH, UserProperty=user))


def _first_run(mqtt: Endpoints) -> None:
    pub = connect(mqtt, version=V5)
    try:
        # Competing consumers and a second group see 20 messages; QoS 1 PUBACKs ack them.
        a, b = connect(mqtt, version=V5), connect(mqtt, version=V5)
        audit_group = connect(mqtt, version=V5)
        a.subscribe("$queue/orders", qos=1)
        b.subscribe("$queue/orders", qos=1)
        audit_group.subscribe("$share/audit/$queue/orders", qos=1)
        for i in range(20):
            pub.publish("$queue/orders", f"o{i}".encode(), qos=1)
        got = 0
        deadline = time.monotonic() + 10
        while got < 20 and time.monotonic() < deadline:
            for c in (a, b):
                while not c.messages.empty():
                    c.messages.get()
                    got += 1
            time.sleep(0.02)
        assert got == 20
        audit_group.drain(20)

        # QoS 0 consumer: auto-ack.
        q0 = connect(mqtt, version=V5)
        q0.subscribe("$queue/fire", qos=0)
        for i in range(5):
            pub.publish("$queue/fire", f"f{i}".encode(), qos=1)
        q0.drain(5)

        # Nack then ack; reject to the DLQ; nack at max attempts to the DLQ.
        manual = connect(mqtt, version=V5, manual_ack=True)
        manual.subscribe("$queue/retry", qos=1)
        pub.publish("$queue/retry", b"again", qos=1)
        first = manual.expect()
        _control(manual, "$queue/retry/$nack", _headers(first)["x-queue-message-id"])
        second = manual.expect()
        manual.client.ack(second.mid, 1)
        pub.publish("$queue/retry", b"poison", qos=1)
        poison = manual.expect()
        _control(
            manual, "$queue/retry/$reject", _headers(poison)["x-queue-message-id"], reason="cannot parse"
        )
        pub.publish("$queue/retry", b"flaky", qos=1)
        for _ in range(3):
            flaky = manual.expect()
            _control(manual, "$queue/retry/$nack", _headers(flaky)["x-queue-message-id"])

        # Visibility timeout: held past 0.6 s, redelivered, then acked.
        slow = connect(mqtt, version=V5, manual_ack=True)
        slow.subscribe("$queue/slow", qos=1)
        pub.publish("$queue/slow", b"late", qos=1)
        slow.expect()
        late = slow.expect(5)
        assert _headers(late)["x-queue-attempt"] == "2"
        slow.client.ack(late.mid, 1)

        # Disconnect: a consumer drops while holding; another gets it.
        dropper = connect(mqtt, version=V5, manual_ack=True)
        dropper.subscribe("$queue/jobs", qos=1)
        pub.publish("$queue/jobs", b"held", qos=1)
        dropper.expect()
        dropper.drop()
        taker = connect(mqtt, version=V5)
        taker.subscribe("$queue/jobs", qos=1)
        assert _headers(taker.expect(5))["x-queue-redelivered"] == "true"

        # A stream read and committed (PUBACK commits), and a backlog nobody reads.
        reader = connect(mqtt, version=V5)
        for i in range(10):
            pub.publish("$queue/ticks", f"t{i}".encode(), qos=1)
        reader.subscribe("$share/readers/$queue/ticks", qos=1)
        for i in range(10, 15):
            pub.publish("$queue/ticks", f"t{i}".encode(), qos=1)
        reader.drain(5)
        for i in range(5):
            pub.publish("$queue/backlog", f"b{i}".encode(), qos=1)

        # Held when the server stops: released at the next start (restart).
        holder = connect(mqtt, version=V5, manual_ack=True)
        holder.subscribe("$queue/restart", qos=1)
        pub.publish("$queue/restart", b"r", qos=1)
        holder.expect()
        time.sleep(0.3)  # let every PUBACK and control message land
        for c in (a, b, audit_group, q0, manual, slow, taker, reader):
            c.disconnect()
        holder.drop()
    finally:
        pub.disconnect()


def _second_run(mqtt: Endpoints) -> None:
    sub = connect(mqtt, version=V5)
    try:
        sub.subscribe("$queue/restart", qos=1)
        got = sub.expect(5)
        assert _headers(got)["x-queue-redelivered"] == "true"
        time.sleep(0.3)
    finally:
        sub.disconnect()


def write_broker_tables(workdir: Path, url: str, tls_files: dict[str, str]) -> None:
    """Two broker runs (stop, restart) on the database at ``url``, with every kind of event."""
    env = {**BROKER_ENV, "TRIMARAN_STORAGE__URL": url}
    args = [*ALL_OFF, "--mqtt", "127.0.0.1:0"]
    for run in (_first_run, _second_run):
        server = start_server(workdir, tls_files, env, args)
        try:
            run(endpoints_of(server, tls_files))
        finally:
            assert server.stop() == 0, server.output()


@pytest.fixture(scope="session")
def broker_db(tmp_path_factory: pytest.TempPathFactory, tls_files: dict[str, str]) -> str:
    """A SQLite database written by :func:`write_broker_tables`."""
    workdir = tmp_path_factory.mktemp("audit-broker")
    url = f"sqlite:///{workdir / 'trimaran.db'}"
    write_broker_tables(workdir, url, tls_files)
    return url
