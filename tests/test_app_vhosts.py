"""The application's vhosts: one created at run time, used by clients, then deleted with its contents.

The real App runs in-process (tests/support/budget.py's ``InProcessServer``); ``VHosts.add`` and
``VHosts.delete`` run on its event loop, as the admin API will call them.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
import uuid
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

import pytest

from tests.support.budget import InProcessServer
from tests.support.paho import V5, Endpoints, connect
from trimaran.vhosts import Permission, prefix

T = TypeVar("T")


def _on_loop(server: InProcessServer, coro: Coroutine[Any, Any, T]) -> T:
    loop = server.app.runner._loop
    assert loop is not None
    return asyncio.run_coroutine_threadsafe(coro, loop).result(10)


def test_a_vhost_added_at_run_time_is_used_and_deleted_with_everything_in_it(tmp_path: Path) -> None:
    pika = pytest.importorskip("pika")
    token = "vhost-test-token"
    server = InProcessServer(
        tmp_path,
        auth={"allow_anonymous": True},
        http={"bind": "127.0.0.1:0", "tokens": [token]},
        telemetry={"history_interval_s": 0.2, "per_object_metrics": True},
    ).start()
    try:
        vhosts = server.app.broker.vhosts  # type: ignore[union-attr]
        endpoints = Endpoints("127.0.0.1", server.port("mqtt"))
        refused = connect(endpoints, version=V5, username="late:someone", expect_success=False)
        assert refused.connack.get(timeout=5)[1].is_failure
        refused.drop()
        assert _on_loop(server, vhosts.add("late"))
        # A new vhost grants nothing, to anonymous clients (guest's permissions) neither, until granted.
        closed = connect(endpoints, version=V5, username="late:someone", expect_success=False)
        assert closed.connack.get(timeout=5)[1].value == 0x87  # not authorized
        closed.drop()
        security = server.app.security
        assert security is not None
        _on_loop(server, security.set_permission(Permission("guest", "late")))
        topic = f"news/{uuid.uuid4().hex[:6]}"
        client = connect(
            endpoints, "keeper", version=V5, username="late:someone", clean=False, properties=None
        )
        client.publish(topic, b"kept", qos=1, retain=True)
        client.publish("$queue/work", b"job", qos=1)
        params = pika.ConnectionParameters("127.0.0.1", server.port("amqp"), "late", connection_attempts=1)
        amqp = pika.BlockingConnection(params)
        channel = amqp.channel()
        channel.exchange_declare("late-ex", "fanout", durable=True)
        channel.queue_declare("late-q", durable=True)
        channel.queue_bind("late-q", "late-ex")
        key = prefix("late")
        app = server.app
        assert app.queues is not None and app.mqtt is not None
        assert {key + "work", key + "late-q"} <= set(app.queues.queues)
        assert any(m.topic == key + topic for m in app.broker.retained.messages())  # type: ignore[union-attr]
        assert key + "keeper" in app.mqtt.endpoints
        # The admin API says which vhost each client, session and queue is in (the management page's
        # vhost selector filters by it), beside the name its clients use, never the internal key.
        listed = {
            what: _api(server.port("http"), token, f"/api/v1/{what}")["items"]
            for what in ("clients", "sessions", "queues")
        }
        assert {c["protocol"] for c in listed["clients"] if c["vhost"] == "late"} == {"mqtt", "amqp091"}
        assert [s["vhost"] for s in listed["sessions"] if s["client_id"] == "keeper"] == ["late"]
        assert {q["name"]: q["vhost"] for q in listed["queues"] if q["vhost"] == "late"} == {
            "work": "late",
            "late-q": "late",
        }
        assert "$vhost" not in json.dumps(listed)
        # The charts' legends too: a tenant's queue by its name and its vhost.
        deadline = time.monotonic() + 5
        while True:
            samples = _api(server.port("http"), token, "/api/v1/history")["samples"]
            if samples and "work (vhost late)" in samples[-1]["queues"]:
                break
            assert time.monotonic() < deadline, samples[-1:] if samples else "no sample"
            time.sleep(0.1)
        assert "$vhost" not in json.dumps(samples)
        # And /metrics labels a queue with its name and its vhost, as RabbitMQ's per-object metrics.
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port('http')}/metrics", timeout=10) as answer:
            metrics = answer.read().decode()
        assert 'trimaran_queue_depth{queue="work",vhost="late"} 1.0' in metrics
        assert "$vhost" not in metrics

        assert _on_loop(server, vhosts.delete("late"))

        assert not vhosts.exists("late")
        assert not [name for name in app.queues.queues if name.startswith(key)]
        assert not [m for m in app.broker.retained.messages() if m.topic.startswith(key)]  # type: ignore[union-attr]
        assert key + "keeper" not in app.mqtt.endpoints
        assert client.disconnects.get(timeout=5)[0].value == 0x98  # administrative action
        with pytest.raises(pika.exceptions.AMQPError):
            for _ in range(50):
                amqp.process_data_events(0.1)
        again = connect(endpoints, version=V5, username="late:someone", expect_success=False)
        assert again.connack.get(timeout=5)[1].is_failure  # it no longer exists
        again.drop()
    finally:
        server.stop()


def _api(port: int, token: str, path: str) -> Any:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}", headers={"Authorization": f"Bearer {token}"}
    )
    with urllib.request.urlopen(request, timeout=10) as answer:
        return json.load(answer)


def _last_values(client: Any, wait: float = 1.0) -> dict[str, str]:
    """The last value of each topic the client got within ``wait`` seconds."""
    time.sleep(wait)
    values: dict[str, str] = {}
    while not client.messages.empty():
        message = client.messages.get()
        values[message.topic] = message.payload.decode()
    return values


def test_each_tenant_sees_its_own_sys_statistics_and_slash_the_whole_broker(tmp_path: Path) -> None:
    settings: dict[str, Any] = {"vhosts": ["/", "t1", "t2/eu"], "limits": {"sys_interval": 0.2}}
    # Anonymous clients have guest's permissions: / from the first start, the tenants from the settings.
    grants = [{"user": "guest", "vhost": v} for v in ("t1", "t2/eu")]
    server = InProcessServer(
        tmp_path, auth={"allow_anonymous": True, "permissions": grants}, **settings
    ).start()
    watchers = []
    try:
        endpoints = Endpoints("127.0.0.1", server.port("mqtt"))
        publisher = connect(endpoints, version=V5, username="t1:app")
        for i in range(3):
            publisher.publish("sensors/temp", f"{i}".encode(), qos=1, retain=i == 2)
        publisher.publish("$queue/jobs", b"job", qos=1)
        time.sleep(0.3)
        for username in ("t1:ops", "t2/eu:ops", "ops"):
            watcher = connect(endpoints, version=V5, username=username)
            watcher.subscribe("$SYS/#", qos=0)
            watchers.append(watcher)
        t1, t2, root = (_last_values(w) for w in watchers)

        # The tenants see $SYS under their own names, with their own figures only.
        assert t1 and all(topic.startswith("$SYS/broker/") for topic in t1)
        assert t1["$SYS/broker/clients/connected"] == "2"  # the publisher and the t1 watcher
        assert t1["$SYS/broker/messages/received"] == "4"
        assert t1["$SYS/broker/retained messages/count"] == "1"
        assert t1["$SYS/broker/subscriptions/count"] == "1"
        assert t1["$SYS/broker/queues/count"] == "1"
        assert int(t1["$SYS/broker/bytes/received"]) > 0
        assert t2["$SYS/broker/clients/connected"] == "1"
        assert t2["$SYS/broker/messages/received"] == "0"
        assert t2["$SYS/broker/retained messages/count"] == "0"
        assert t2["$SYS/broker/queues/count"] == "0"
        # / keeps the whole broker's $SYS, as before tenants had one of their own.
        assert all(topic.startswith("$SYS/broker/") for topic in root)
        assert "$SYS/broker/queues/count" not in root
        assert root["$SYS/broker/clients/connected"] == "4"
        assert root["$SYS/broker/messages/received"] == "4"
        # One tenant message and /'s own $SYS values, as before; the tenants' $SYS values not counted.
        assert root["$SYS/broker/retained messages/count"] == str(1 + len(root))
        assert root["$SYS/broker/subscriptions/count"] == "3"
        publisher.disconnect()
    finally:
        for watcher in watchers:
            watcher.disconnect()
        server.stop()


def test_clearing_a_permission_closes_that_users_connections_in_that_vhost(tmp_path: Path) -> None:
    pika = pytest.importorskip("pika")
    users = [{"name": "alice", "password": "a"}, {"name": "bob", "password": "b"}]
    server = InProcessServer(tmp_path, auth={"users": users}, vhosts=["/", "t1"]).start()
    try:
        security = server.app.security
        assert security is not None
        for user, vhost in (("alice", "/"), ("alice", "t1"), ("bob", "t1")):
            _on_loop(server, security.set_permission(Permission(user, vhost)))
        endpoints = Endpoints("127.0.0.1", server.port("mqtt"))
        alice_t1 = connect(endpoints, version=V5, username="t1:alice", password="a")
        bob_t1 = connect(endpoints, version=V5, username="t1:bob", password="b")

        def amqp(vhost: str) -> Any:
            credentials = pika.PlainCredentials("alice", "a")
            params = pika.ConnectionParameters(
                "127.0.0.1", server.port("amqp"), vhost, credentials, connection_attempts=1
            )
            return pika.BlockingConnection(params)

        amqp_t1, amqp_root = amqp("t1"), amqp("/")

        assert _on_loop(server, security.clear_permission("alice", "t1"))

        assert alice_t1.disconnects.get(timeout=5)[0].value == 0x98  # administrative action
        with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as closed:
            for _ in range(50):
                amqp_t1.process_data_events(0.1)
        assert closed.value.reply_code == 320  # CONNECTION_FORCED, as RabbitMQ
        # Alice's connection to /, and bob's to t1, stay.
        amqp_root.process_data_events(0.5)
        assert amqp_root.is_open
        bob_t1.publish("still/here", b"x", qos=1)
        assert bob_t1.disconnects.empty()
        again = connect(endpoints, version=V5, username="t1:alice", password="a", expect_success=False)
        assert again.connack.get(timeout=5)[1].value == 0x87  # not authorized
        again.drop()
        amqp_root.close()
        bob_t1.disconnect()
    finally:
        server.stop()
