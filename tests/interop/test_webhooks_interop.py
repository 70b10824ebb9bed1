"""Webhooks from the real server (``trimaran serve``) to a real HTTP receiver, driven by paho-mqtt."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pika
import pytest

from tests.support.paho import V5, Endpoints, PacketTypes, connect, props
from tests.support.server import ALICE, ALICE_PERMISSIONS, RunningServer
from tests.support.webhook_receiver import Receiver, verify

SECRET = "topsecret"


def serve(workdir: Path, webhooks: dict[str, Any], endpoint: dict[str, Any], **extra: str) -> RunningServer:
    env = {
        "TRIMARAN_AUTH__USERS": ALICE,
        "TRIMARAN_AUTH__PERMISSIONS": ALICE_PERMISSIONS,
        "TRIMARAN_LIMITS__SYS_INTERVAL": "0",
        "TRIMARAN_WEBHOOKS__ENDPOINTS": json.dumps([endpoint]),
        **{f"TRIMARAN_WEBHOOKS__{key.upper()}": str(value) for key, value in webhooks.items()},
        **extra,
    }
    args = ["--mqtt", "127.0.0.1:0", "--mqtt-ws", "off", "--amqp", "off", "--http", "off"]
    return RunningServer(args, cwd=workdir, env=env).start()


def test_client_session_subscription_message_and_queue_events(tmp_path: Path) -> None:
    with Receiver() as receiver:
        endpoint = {
            "url": receiver.url,
            "secret": SECRET,
            "events": ["client.*", "session.*", "subscription.*", "message.*", "queue.*"],
            "topics": ["t/#", "$queue/#"],
            "include_payload": True,
        }
        server = serve(tmp_path, {"batch_wait_ms": 20}, endpoint)
        try:
            mqtt = Endpoints("127.0.0.1", server.ports["mqtt"])
            refused = connect(mqtt, "intruder", username="alice", password="nope", expect_success=False)
            refused.disconnect()
            brief = connect(mqtt, "brief", version=V5, clean=False, username="alice", password="wonderland",
                            properties=props(PacketTypes.CONNECT, SessionExpiryInterval=1))  # fmt: skip
            brief.disconnect()
            tiny = connect(mqtt, "tiny", version=V5, username="alice", password="wonderland",
                           properties=props(PacketTypes.CONNECT, MaximumPacketSize=64))  # fmt: skip
            tiny.subscribe("t/#", qos=0)
            sub = connect(mqtt, "sub", version=V5, username="alice", password="wonderland")
            pub = connect(mqtt, "pub", username="alice", password="wonderland")
            sub.subscribe("t/+", qos=1)
            pub.publish("t/1", b"hello", qos=1)
            assert sub.expect().payload == b"hello"
            pub.publish("other/1", b"filtered out", qos=1)
            pub.publish("t/big", b"x" * 200, qos=1)  # sub gets it; tiny cannot: message.dropped
            assert sub.expect().payload == b"x" * 200
            pub.publish("$queue/orders", b"order-1", qos=1)
            sub.subscribe("$queue/orders", qos=1)
            assert sub.expect().payload == b"order-1"  # paho acks it: queue.acked
            sub.unsubscribe("t/+")
            receiver.wait_for_events(lambda ev: any(e["type"] == "subscription.removed" for e in ev))
            thief = connect(mqtt, "sub", version=V5, username="alice", password="wonderland")
            thief.disconnect()
            pub.disconnect()
            tiny.disconnect()

            def complete(events: list[dict[str, Any]]) -> bool:
                types = [e["type"] for e in events]
                return types.count("client.disconnected") >= 5 and {"queue.acked", "session.expired"} <= set(
                    types
                )

            events = receiver.wait_for_events(complete)
        finally:
            assert server.stop() == 0, server.output()
        for request in receiver.requests:
            assert verify(SECRET.encode(), request.headers, request.body)
    by_type: dict[str, list[dict[str, Any]]] = {}
    for event in events:
        assert event["node"] == "trimaran"
        by_type.setdefault(event["type"], []).append(event["data"])
    assert by_type["client.auth_failed"] == [
        {
            "client_id": "intruder",
            "protocol": "mqtt",
            "address": by_type["client.auth_failed"][0]["address"],
            "user": "alice",
            "reason": "bad user name or password",
            "vhost": "/",
        }
    ]
    first = next(d for d in by_type["client.connected"] if d["client_id"] == "sub")
    assert first["user"] == "alice" and first["protocol_version"] == 5 and not first["session_present"]
    assert first["address"].startswith("127.0.0.1:")
    assert [d["client_id"] for d in by_type["session.created"]] == ["brief", "tiny", "sub", "pub", "sub"]
    assert [d["client_id"] for d in by_type["session.expired"]] == ["brief"]
    dropped = by_type["message.dropped"]
    assert [(d["topic"], d["subscriber"], d["client_id"]) for d in dropped] == [("t/big", "tiny", "pub")]
    assert dropped[0]["reason"] == "too_large"  # broker/drops.py's names
    assert by_type["session.taken_over"][0]["client_id"] == "sub"
    assert [d["topic_filter"] for d in by_type["subscription.created"]] == ["t/#", "t/+", "$queue/orders"]
    assert [d["topic_filter"] for d in by_type["subscription.removed"]] == ["t/+"]
    published = {d["topic"]: d for d in by_type["message.published"]}
    assert set(published) == {"t/1", "t/big", "$queue/orders"}  # other/1 is outside the endpoint's filters
    assert published["t/1"]["payload_text"] == "hello" and published["t/1"]["client_id"] == "pub"
    assert published["$queue/orders"]["queue"] == "orders"
    acked = by_type["queue.acked"][0]
    assert acked["queue"] == "orders" and acked["offset"] == 0 and acked["consumer"]
    gone = [(d["client_id"], d["initiator"]) for d in by_type["client.disconnected"]]
    assert [who for cid, who in gone if cid == "sub"] == ["server", "client"]  # taken over; the thief left
    assert ("pub", "client") in gone
    assert [d["reason"] for d in by_type["client.disconnected"] if d["initiator"] == "server"] == [
        "session taken over"
    ]


def test_a_tenants_events_name_what_its_clients_named_and_its_vhost(tmp_path: Path) -> None:
    """Inside a vhost the keys carry ``$vhost/t1/``: the receiver sees the client's names, the vhost
    in ``vhost``, and an endpoint's filters match the tenant's topics as its clients name them."""
    with Receiver() as receiver:
        types = ["client.connected", "message.*", "queue.*"]
        endpoint = {"url": receiver.url, "events": types, "topics": ["#", "$queue/#"]}
        server = serve(
            tmp_path,
            {"batch_wait_ms": 20},
            endpoint,
            TRIMARAN_VHOSTS='["/", "t1"]',
            TRIMARAN_AUTH__PERMISSIONS='[{"user": "alice", "vhost": "t1"}]',
        )
        try:
            mqtt = Endpoints("127.0.0.1", server.ports["mqtt"])
            client = connect(mqtt, "dev", version=V5, username="t1:alice", password="wonderland")
            client.subscribe("t/+", qos=1)
            client.publish("t/1", b"hi", qos=1)
            assert client.expect().payload == b"hi"
            client.publish("$queue/orders", b"order", qos=1)
            client.subscribe("$queue/orders", qos=1)
            assert client.expect().payload == b"order"
            events = receiver.wait_for_events(lambda ev: any(e["type"] == "queue.acked" for e in ev))
            client.disconnect()
        finally:
            assert server.stop() == 0, server.output()
    text = json.dumps(events)
    assert "$vhost" not in text  # no key reaches the receiver
    by_type: dict[str, list[dict[str, Any]]] = {}
    for event in events:
        by_type.setdefault(event["type"], []).append(event["data"])
    connected = by_type["client.connected"][0]
    assert (connected["client_id"], connected["vhost"], connected["user"]) == ("dev", "t1", "alice")
    published = {d["topic"]: d for d in by_type["message.published"]}
    assert {"t/1", "$queue/orders"} <= set(published)
    assert all(d["vhost"] == "t1" and d["client_id"] == "dev" for d in published.values())
    acked = by_type["queue.acked"][0]
    assert (acked["queue"], acked["vhost"]) == ("orders", "t1")


def test_a_receiver_that_never_answers_does_not_slow_the_broker(tmp_path: Path) -> None:
    with Receiver() as receiver:
        receiver.hang = True
        endpoint = {"url": receiver.url, "events": ["*"]}
        webhooks = {"timeout_s": 30, "queue_size": 50, "batch_max": 10, "flush_timeout_s": 0.3}
        server = serve(tmp_path, webhooks, endpoint)
        try:
            mqtt = Endpoints("127.0.0.1", server.ports["mqtt"])
            sub = connect(mqtt, "sub")
            pub = connect(mqtt, "pub")
            sub.subscribe("load/#", qos=1)
            receiver.wait_for(1)  # the first batch is stuck in the receiver from now on
            worst = 0.0
            started = time.monotonic()
            for i in range(300):  # one at a time: each publish -> deliver round trip is timed
                sent = time.monotonic()
                pub.publish(f"load/{i}", b"x" * 100, qos=1)
                assert sub.expect(5).payload == b"x" * 100
                worst = max(worst, time.monotonic() - sent)
            total = time.monotonic() - started
            sub.disconnect()
            pub.disconnect()
            assert len(receiver.requests) == 1  # still waiting on its one request
            # 300 events went past a 50-event queue: the oldest were dropped, the broker never waited.
            assert worst < 1.0 and total < 10.0, (worst, total)
            stopping = time.monotonic()
        finally:
            code = server.stop()
        assert code == 0, server.output()
        assert time.monotonic() - stopping < 5.0  # the final flush is bounded
        assert "events not sent at shutdown" in server.output()


def test_amqp091_client_events(tmp_path: Path) -> None:
    """The AMQP 0.9.1 front end reports its clients through the same bus."""
    with Receiver() as receiver:
        endpoint = {"url": receiver.url, "events": ["client.*"]}
        env = {
            "TRIMARAN_AUTH__USERS": ALICE,
            "TRIMARAN_AUTH__PERMISSIONS": ALICE_PERMISSIONS,
            "TRIMARAN_WEBHOOKS__ENDPOINTS": json.dumps([endpoint]),
            "TRIMARAN_WEBHOOKS__BATCH_WAIT_MS": "20",
        }
        args = ["--mqtt", "off", "--mqtt-ws", "off", "--amqp", "127.0.0.1:0", "--http", "off"]
        server = RunningServer(args, cwd=tmp_path, env=env).start()
        try:
            port = server.ports["amqp"]

            def login(password: str) -> None:
                credentials = pika.PlainCredentials("alice", password)
                pika.BlockingConnection(
                    pika.ConnectionParameters("127.0.0.1", port, credentials=credentials)
                ).close()

            login("wonderland")
            with pytest.raises(pika.exceptions.ProbableAuthenticationError):
                login("x")
            events = receiver.wait_for_events(lambda ev: len(ev) >= 3)
        finally:
            assert server.stop() == 0, server.output()
    got = [(e["type"], e["data"]["protocol"], e["data"]["user"]) for e in events]
    assert got == [
        ("client.connected", "amqp091", "alice"),
        ("client.disconnected", "amqp091", "alice"),
        ("client.auth_failed", "amqp091", "alice"),
    ]
