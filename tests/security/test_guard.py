"""The permission model over real MQTT sockets (3.1.1 and 5): logins from a mosquitto_passwd file,
the rule file's allow and deny, ``%u``/``%c`` patterns, ``$SYS``, queues, settlement by its holder,
client-id takeover, each refusal with the protocol's code. Every attack of issue 14 is here."""

from __future__ import annotations

import socket
import time
from typing import Any

from paho.mqtt.packettypes import PacketTypes

from tests.security.conftest import PASSWORDS
from tests.support.paho import (
    V5,
    V311,
    Client,
    Endpoints,
    close_all,
    connect,
    props,
    user_props,
    watch_pubacks,
)
from trimaran.mqtt.codec import encode
from trimaran.mqtt.packets import Connect

NOT_AUTHORIZED = 0x87
BAD_CREDENTIALS = 0x86


def login(endpoints: Endpoints, user: str, *, version: Any = V5, client_id: str = "", **kw: Any) -> Client:
    return connect(endpoints, client_id, version=version, username=user, password=PASSWORDS[user], **kw)


def code(value: Any) -> int:
    return int(getattr(value, "value", value))


def wire_connack_311(
    endpoints: Endpoints, client_id: str = "", user: str | None = None, password: str = ""
) -> int:
    """The 3.1.1 CONNACK return code as sent (paho reports it as a 5.0 reason code)."""
    packet = Connect(
        client_id=client_id or "raw-311",
        username=user,
        password=password.encode() if user is not None else None,
    )
    with socket.create_connection((endpoints.host, endpoints.tcp), timeout=10) as sock:
        sock.sendall(encode(packet, 4))
        answer = b""
        while len(answer) < 4:
            chunk = sock.recv(4 - len(answer))
            if not chunk:
                break
            answer += chunk
    assert answer[:2] == b"\x20\x02", answer
    return answer[3]


def connack(endpoints: Endpoints, version: Any, **kw: Any) -> int:
    client = connect(endpoints, version=version, expect_success=False, **kw)
    try:
        _flags, reason, _props = client.connack.get(timeout=10)
        return code(reason)
    finally:
        client.client.loop_stop()


def puback(client: Client, topic: str, payload: bytes = b"x", **kw: Any) -> int:
    codes = watch_pubacks(client)
    info = client.publish(topic, payload, qos=1, wait=False, **kw)
    info.wait_for_publish(10)
    deadline = time.monotonic() + 5
    while info.mid not in codes and time.monotonic() < deadline:
        time.sleep(0.01)
    return codes[info.mid]


def test_password_file_written_by_mosquitto_passwd(smqtt: Endpoints) -> None:
    alice = login(smqtt, "alice")
    alice.disconnect()
    assert connack(smqtt, V5, username="alice", password="wrong") == BAD_CREDENTIALS
    assert wire_connack_311(smqtt, user="alice", password="wrong") == 4  # bad user name or password
    assert connack(smqtt, V5, username="mallory", password="x") == BAD_CREDENTIALS
    assert connack(smqtt, V5) == NOT_AUTHORIZED  # anonymous access is off
    assert wire_connack_311(smqtt) == 5  # not authorized


def test_subscription_denied_v5_0x87_and_the_connection_stays_usable(smqtt: Endpoints) -> None:
    alice = login(smqtt, "alice")
    bob = login(smqtt, "bob")
    try:
        assert [code(c) for c in alice.subscribe("bob/#", qos=1)] == [NOT_AUTHORIZED]
        assert [code(c) for c in alice.subscribe("bob/private/inbox", qos=1)] == [NOT_AUTHORIZED]
        assert [code(c) for c in alice.subscribe("$share/g/bob/#", qos=1)] == [NOT_AUTHORIZED]
        # A share group is read whole or not at all; a plain '#' as Mosquitto grants it (some topics
        # under it are hers), each delivery checked against her rules.
        assert [code(c) for c in alice.subscribe("$share/g/#", qos=1)] == [NOT_AUTHORIZED]
        assert [code(c) for c in alice.subscribe("#", qos=1)] == [1]
        bob.publish("bob/private/inbox", b"secret", qos=1)
        bob.publish("public/news", b"hello", qos=1)
        got = alice.expect()
        assert (got.topic, got.payload) == ("public/news", b"hello")
        alice.expect_none()
    finally:
        close_all(alice, bob)


def test_subscription_denied_v311_0x80(smqtt: Endpoints) -> None:
    alice = login(smqtt, "alice", version=V311)
    try:
        assert [code(c) for c in alice.subscribe("bob/#", qos=1)] == [0x80]
        assert [code(c) for c in alice.subscribe("alice/inbox", qos=1)] == [1]
        assert puback(alice, "alice/inbox") == 0
        assert alice.expect().topic == "alice/inbox"
    finally:
        alice.disconnect()


def test_publish_denied_v5_puback_0x87_v311_dropped(smqtt: Endpoints) -> None:
    bob = login(smqtt, "bob")
    alice5 = login(smqtt, "alice")
    alice3 = login(smqtt, "alice", version=V311)
    try:
        bob.subscribe("bob/#", qos=1)
        assert puback(alice5, "bob/private/inbox") == NOT_AUTHORIZED
        assert puback(alice3, "bob/private/inbox") == 0  # 3.1.1 cannot refuse: acked and dropped
        alice5.publish("bob/private/inbox", b"qos0")  # QoS 0: dropped
        bob.expect_none()
        assert puback(alice5, "alice/ok") == 0  # the connections stay usable
        assert puback(alice3, "alice/ok") == 0
    finally:
        close_all(bob, alice5, alice3)


def test_sys_is_never_writable_even_when_a_rule_allows_it(smqtt: Endpoints) -> None:
    alice = login(smqtt, "alice")
    try:
        assert puback(alice, "$SYS/broker/version", b"pwned 6.6.6", retain=True) == NOT_AUTHORIZED
        assert [code(c) for c in alice.subscribe("$SYS/broker/version", qos=0)] == [0]
        got = alice.expect(timeout=5)
        assert got.payload != b"pwned 6.6.6"
    finally:
        alice.disconnect()


def test_patterns_name_the_user_and_the_client_id(smqtt: Endpoints) -> None:
    alice = login(smqtt, "alice", client_id="c-7")
    try:
        assert puback(alice, "users/alice/x") == 0
        assert puback(alice, "users/bob/x") == NOT_AUTHORIZED
        assert puback(alice, "clients/c-7/x") == 0
        assert puback(alice, "clients/c-8/x") == NOT_AUTHORIZED
        assert [code(c) for c in alice.subscribe("users/bob/#", qos=1)] == [NOT_AUTHORIZED]
        assert [code(c) for c in alice.subscribe("users/+/x", qos=1)] == [1]  # users/alice/x is hers
        assert [code(c) for c in alice.subscribe("users/alice/#", qos=1)] == [1]
    finally:
        alice.disconnect()


def test_queues_read_write_by_rule(smqtt: Endpoints) -> None:
    bob = login(smqtt, "bob")
    alice = login(smqtt, "alice")
    try:
        assert puback(bob, "$queue/invoices", b"invoice 1") == 0
        # Her own group on his queue, from the first offset: refused.
        group = props(
            PacketTypes.SUBSCRIBE, UserProperty=[("consumer-group", "mine"), ("stream-offset", "first")]
        )
        assert [code(c) for c in alice.subscribe("$queue/invoices", qos=1, properties=group)] == [
            NOT_AUTHORIZED
        ]
        assert [code(c) for c in alice.subscribe("$share/g/$queue/invoices", qos=1)] == [NOT_AUTHORIZED]
        assert puback(alice, "$queue/invoices", b"fake invoice") == NOT_AUTHORIZED
        alice.expect_none()
        assert [code(c) for c in alice.subscribe("$queue/alice-work", qos=1)] == [1]
        assert puback(alice, "$queue/alice-work", b"job") == 0
        assert alice.expect().payload == b"job"
    finally:
        close_all(bob, alice)


def test_settlement_belongs_to_the_holder(smqtt: Endpoints) -> None:
    q = "$queue/payroll"
    holder = login(smqtt, "bob", manual_ack=True)
    other_bob = login(smqtt, "bob")
    alice = login(smqtt, "alice")
    try:
        holder.subscribe(q, qos=1)
        assert puback(other_bob, q, b"salary 1") == 0
        got = holder.expect()
        message_id = user_props(got)["x-queue-message-id"]
        by_id = props(UserProperty=[("message-id", message_id)])
        guessed = props(UserProperty=[("message-id", "payroll:1")])
        assert puback(alice, f"{q}/$ack", properties=by_id) == NOT_AUTHORIZED  # no read on payroll
        assert puback(alice, f"{q}/$reject", properties=guessed) == NOT_AUTHORIZED
        # The same user on another connection does not hold the delivery either.
        assert puback(other_bob, f"{q}/$reject", properties=by_id) == NOT_AUTHORIZED
        assert puback(other_bob, f"{q}/$ack", properties=by_id) == NOT_AUTHORIZED
        # Nothing reached the dead-letter queue, and alice may not read it anyway.
        assert [code(c) for c in alice.subscribe("$queue/$dlq/payroll", qos=1)] == [NOT_AUTHORIZED]
        # The holder settles it.
        assert puback(holder, f"{q}/$ack", properties=by_id) == 0
        holder.client.ack(got.mid, 1)
    finally:
        close_all(holder, other_bob, alice)


def test_commit_only_in_the_own_group_and_never_past_the_tail(smqtt: Endpoints) -> None:
    q = "$queue/events"
    consumer = login(smqtt, "bob")
    stranger = login(smqtt, "bob")
    try:
        group = props(PacketTypes.SUBSCRIBE, UserProperty=[("consumer-group", "audit")])
        consumer.subscribe(q, qos=1, properties=group)
        assert puback(stranger, q, b"event") == 0
        got = consumer.expect()
        message_id = user_props(got)["x-queue-message-id"]
        offset = int(message_id.rpartition(":")[2])
        in_group = [("consumer-group", "audit")]
        far = props(UserProperty=[("message-id", f"events:{offset + 1000}"), *in_group])
        mine = props(UserProperty=[("message-id", message_id), *in_group])
        assert puback(stranger, f"{q}/$commit", properties=mine) == NOT_AUTHORIZED  # not its group
        assert puback(consumer, f"{q}/$commit", properties=far) == NOT_AUTHORIZED  # past the tail
        assert puback(consumer, f"{q}/$commit", properties=mine) == 0
        # The group still gets what is published next (its offset was not moved past the tail).
        assert puback(stranger, q, b"next") == 0
        assert consumer.expect().payload == b"next"
    finally:
        close_all(consumer, stranger)


def test_client_id_takeover_only_by_the_same_user(smqtt: Endpoints) -> None:
    bob = login(smqtt, "bob", client_id="bob-phone")
    try:
        assert (
            connack(smqtt, V5, client_id="bob-phone", username="alice", password=PASSWORDS["alice"])
            == NOT_AUTHORIZED
        )
        assert wire_connack_311(smqtt, "bob-phone", "alice", PASSWORDS["alice"]) == 5
        assert bob.disconnects.empty()
        assert puback(bob, "bob/still-here") == 0
        again = login(smqtt, "bob", client_id="bob-phone")  # the same user may take it over
        again.disconnect()
    finally:
        bob.client.loop_stop()


def test_will_on_a_topic_the_client_may_not_write_refuses_the_connect(smqtt: Endpoints) -> None:
    refused = connack(
        smqtt, V5, username="alice", password=PASSWORDS["alice"], will=("bob/alarm", b"x", 0, False)
    )
    assert refused == NOT_AUTHORIZED
