"""One ``permissions set`` means the same on MQTT (paho) and AMQP 1.0 (python-qpid-proton) as on
AMQP 0.9.1 (tests/interop/test_amqp091_permissions.py), mapped as RabbitMQ's plugins map them:

- a publish to a topic writes ``amq.topic``; to ``$queue/<q>`` writes ``amq.default``;
- an MQTT topic subscription configures, writes and reads its queue ``mqtt-subscription-<id>qos<n>``
  and reads ``amq.topic``; an AMQP 1.0 topic receiver reads ``amq.topic``;
- consuming ``$queue/<q>`` (MQTT) or ``queue://q`` (AMQP 1.0) reads queue ``q``; a queue the attach
  creates (``queues.auto_create``, a dynamic node) is configured.

Topic permissions (RabbitMQ's set_topic_permissions on ``amq.topic``) limit the routing keys: an MQTT
or AMQP 1.0 topic ``a/b`` is the key ``a.b``, a filter ``a/+/#`` the binding key ``a.*.#``; carol's
``^{username}\\.`` and ``^{client_id}\\.`` stand for her name and her MQTT client id.

Refusals: MQTT 3.1.1 SUBACK 0x80, 5.0 SUBACK 0x87 and PUBACK 0x87 (3.1.1 has no publish refusal:
the message is dropped), CONNACK 5 / 0x87 for a vhost without a permission; AMQP 1.0
``amqp:unauthorized-access`` on the attach.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from paho.mqtt.enums import MQTTProtocolVersion as Version

from tests.interop.conftest import amqp_server_args
from tests.support.paho import V5, V311, Endpoints, close_all, connect, watch_pubacks
from tests.support.permissions import store_topic_permission
from tests.support.server import RunningServer, serving
from trimaran.vhosts import TopicPermission

proton = pytest.importorskip("proton")
from proton.utils import BlockingConnection, LinkDetached  # noqa: E402

VHOST = "perms"
UNAUTHORIZED = "amqp:unauthorized-access"
# Each user lacks one thing; boss has everything and makes the queues.
PATTERNS = {
    "boss": (".*", ".*", ".*"),
    "nowrite": (".*", "^mqtt-subscription-", ".*"),
    "noread": (".*", ".*", "^(mqtt-subscription-|mine-)"),
    "noconf": ("", ".*", ".*"),
    "carol": (".*", ".*", ".*"),
}
# carol publishes under her name, subscribes under her client id's.
CAROL_WRITE, CAROL_READ = r"^{username}\.", r"^{client_id}\."
USERS = [{"name": name, "password": "pw"} for name in [*PATTERNS, "norow"]]
GRANTS = [
    {"user": user, "vhost": VHOST, "configure": c, "write": w, "read": r}
    for user, (c, w, r) in PATTERNS.items()
]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    directory: Path = tmp_path_factory.mktemp("protocol-permissions")
    url = f"sqlite:///{directory / 'trimaran.db'}"
    store_topic_permission(url, TopicPermission("carol", VHOST, "amq.topic", CAROL_WRITE, CAROL_READ))
    env = {
        "TRIMARAN_STORAGE__URL": url,
        "TRIMARAN_AUTH__USERS": json.dumps(USERS),
        "TRIMARAN_AUTH__PERMISSIONS": json.dumps(GRANTS),
        "TRIMARAN_AUTH__LOGIN_DELAY_INITIAL_S": "0",
        "TRIMARAN_VHOSTS": json.dumps(["/", VHOST]),
    }
    with serving(RunningServer(amqp_server_args(), cwd=directory, env=env).start()) as running:
        boss = connect(
            Endpoints("127.0.0.1", running.ports["mqtt"]), version=V5, username=f"{VHOST}:boss", password="pw"
        )
        for queue in ("mine-jobs", "other-jobs"):
            boss.publish(f"$queue/{queue}", b"job", qos=1)
        boss.disconnect()
        yield running
        assert "Traceback" not in running.output()


@pytest.fixture(scope="module")
def mqtt(server: RunningServer) -> Endpoints:
    return Endpoints("127.0.0.1", server.ports["mqtt"])


def _mqtt(endpoints: Endpoints, user: str, version: Version) -> Any:
    return connect(
        endpoints,
        f"{user}-{uuid.uuid4().hex[:6]}",
        version=version,
        username=f"{VHOST}:{user}",
        password="pw",
    )


def _refused_code(version: Version) -> int:
    return 0x87 if version == V5 else 0x80


def _codes(client: Any, topic: str, qos: int = 1) -> list[int]:
    return [getattr(code, "value", code) for code in client.subscribe(topic, qos)]


@pytest.mark.parametrize("version", [V311, V5])
def test_mqtt_publish_needs_write_on_the_exchange(mqtt: Endpoints, version: Version) -> None:
    topic = f"news/{uuid.uuid4().hex[:6]}"
    watcher = _mqtt(mqtt, "boss", V5)
    nowrite = _mqtt(mqtt, "nowrite", version)
    noread = _mqtt(mqtt, "noread", version)
    try:
        assert _codes(watcher, f"{topic}/#") == [1]
        assert _codes(nowrite, f"{topic}/#") == [1]  # its subscription queue: written, not amq.topic
        acks = watch_pubacks(nowrite)
        info = nowrite.publish(f"{topic}/a", b"refused", qos=1)
        assert acks[info.mid] == (0x87 if version == V5 else 0)  # 3.1.1: dropped, acknowledged
        queued = nowrite.publish(f"$queue/mine-jobs/{topic}", b"refused", qos=1)  # amq.default
        assert acks[queued.mid] == (0x87 if version == V5 else 0)
        watcher.expect_none()
        nowrite.expect_none(0.1)
        noread.publish(f"{topic}/b", b"allowed", qos=1)  # may write amq.topic
        assert watcher.expect().payload == b"allowed"
        assert nowrite.expect().payload == b"allowed"
    finally:
        for client in (watcher, nowrite, noread):
            client.disconnect()


@pytest.mark.parametrize("version", [V311, V5])
def test_mqtt_a_refusal_is_logged_once_a_connection(
    server: RunningServer, mqtt: Endpoints, version: Version
) -> None:
    """A device that keeps publishing or subscribing where it may not is refused every time and
    logged once a connection and resource (the log does not fill); its next connection is logged
    again."""
    topic = f"news/{uuid.uuid4().hex[:6]}"
    writer, reader = (f"{user}-{uuid.uuid4().hex[:6]}" for user in ("nowrite", "noread"))
    for _ in range(2):
        nowrite = connect(mqtt, writer, version=version, username=f"{VHOST}:nowrite", password="pw")
        noread = connect(mqtt, reader, version=version, username=f"{VHOST}:noread", password="pw")
        try:
            acks = watch_pubacks(nowrite)
            for n in range(5):
                info = nowrite.publish(f"{topic}/{n}", b"refused", qos=1)
                assert acks[info.mid] == (0x87 if version == V5 else 0)
            for _ in range(3):
                assert _codes(noread, f"{topic}/#") == [_refused_code(version)]
        finally:
            close_all(nowrite, noread)

    def logged(client_id: str) -> int:
        return sum(
            1
            for line in server.output().splitlines()
            if "may not" in line and repr(client_id) in line and "exchange amq.topic" in line
        )

    deadline = time.monotonic() + 5
    while (logged(writer) < 2 or logged(reader) < 2) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert logged(writer) == 2  # once for each connection's five publishes
    assert logged(reader) == 2  # once for each connection's three subscriptions


@pytest.mark.parametrize("version", [V311, V5])
def test_mqtt_subscriptions_need_read_and_their_queue(mqtt: Endpoints, version: Version) -> None:
    noread = _mqtt(mqtt, "noread", version)
    noconf = _mqtt(mqtt, "noconf", version)
    try:
        refused = _refused_code(version)
        assert _codes(noread, "news/#") == [refused]  # amq.topic is not readable
        assert _codes(noread, "$queue/other-jobs") == [refused]
        assert _codes(noread, "$queue/mine-jobs") == [1]
        assert _codes(noconf, "news/#") == [refused]  # its subscription queue cannot be configured
        assert _codes(noconf, "$queue/other-jobs") == [1]  # consuming reads, configures nothing
        assert _codes(noconf, f"$queue/new-{uuid.uuid4().hex[:6]}") == [refused]  # it would create it
        acks = watch_pubacks(noconf)
        info = noconf.publish(f"$queue/new-{uuid.uuid4().hex[:6]}", b"x", qos=1)
        assert acks[info.mid] == (0x87 if version == V5 else 0)
    finally:
        noread.disconnect()
        noconf.disconnect()


@pytest.mark.parametrize("version", [V311, V5])
def test_mqtt_a_will_needs_write_on_the_exchange(mqtt: Endpoints, version: Version) -> None:
    will = ("news/last-words", b"bye", 1, False)
    refused = connect(
        mqtt, version=version, username=f"{VHOST}:nowrite", password="pw", will=will, expect_success=False
    )
    try:
        assert refused.connack.get(timeout=5)[1].value == 0x87  # not authorized
    finally:
        refused.drop()
    connect(mqtt, version=version, username=f"{VHOST}:noread", password="pw", will=will).disconnect()


@pytest.mark.parametrize("version", [V311, V5])
def test_mqtt_no_permission_no_entry(mqtt: Endpoints, version: Version) -> None:
    client = connect(mqtt, version=version, username=f"{VHOST}:norow", password="pw", expect_success=False)
    try:
        reason = client.connack.get(timeout=5)[1]
        assert reason.value == 0x87  # not authorized (paho reports 3.1.1's return code 5 as 0x87)
    finally:
        client.drop()


def _proton(server: RunningServer, user: str) -> BlockingConnection:
    url = f"amqp://{user}:pw@127.0.0.1:{server.ports['amqp']}"
    return BlockingConnection(url, timeout=10, allowed_mechs="PLAIN", virtual_host=f"vhost:{VHOST}")


def _refusal(attach: Any) -> str:
    with pytest.raises(LinkDetached) as caught:
        attach()
    return str(caught.value.condition)


def test_amqp1_senders_write_the_exchange_they_go_through(server: RunningServer) -> None:
    nowrite, noread = _proton(server, "nowrite"), _proton(server, "noread")
    try:
        assert _refusal(lambda: nowrite.create_sender("topic://news/x")) == UNAUTHORIZED
        assert _refusal(lambda: nowrite.create_sender("queue://mine-jobs")) == UNAUTHORIZED
        receiver = nowrite.create_receiver("topic://news/#", credit=10)  # reading is allowed
        sender = noread.create_sender("topic://news/x")
        sender.send(proton.Message(body="allowed"))
        assert receiver.receive(timeout=5).body == "allowed"
        noread.create_sender("queue://other-jobs").send(proton.Message(body="job"))
    finally:
        nowrite.close()
        noread.close()


def test_amqp1_receivers_read_their_queue_or_the_topic_exchange(server: RunningServer) -> None:
    noread, noconf = _proton(server, "noread"), _proton(server, "noconf")
    try:
        assert _refusal(lambda: noread.create_receiver("topic://news/#")) == UNAUTHORIZED
        assert _refusal(lambda: noread.create_receiver("queue://other-jobs")) == UNAUTHORIZED
        noread.create_sender("queue://mine-jobs").send(proton.Message(body="mine"))
        assert noread.create_receiver("queue://mine-jobs", credit=10).receive(timeout=5).body is not None
        # A queue the attach would create, and a dynamic node, are configured: noconf may not.
        assert _refusal(lambda: noconf.create_receiver(f"queue://new-{uuid.uuid4().hex[:6]}")) == UNAUTHORIZED
        assert _refusal(lambda: noconf.create_receiver(None, dynamic=True)) == UNAUTHORIZED
        noconf.create_receiver("queue://other-jobs", credit=1).close()  # an existing one is only read
    finally:
        noread.close()
        noconf.close()


def test_amqp1_no_permission_no_entry(server: RunningServer) -> None:
    with pytest.raises(proton.ConnectionException) as caught:
        _proton(server, "norow").create_receiver("topic://news/#")
    assert "access to vhost 'perms' refused for user 'norow'" in str(caught.value)


@pytest.mark.parametrize("version", [V311, V5])
def test_mqtt_topic_permissions_limit_keys_with_the_clients_name_and_id(
    mqtt: Endpoints, version: Version
) -> None:
    carol = connect(mqtt, "dev7", version=version, username=f"{VHOST}:carol", password="pw")
    watcher = _mqtt(mqtt, "boss", V5)
    try:
        refused = _refused_code(version)
        assert _codes(carol, "carol/#") == [refused]  # the read pattern names her client id
        assert _codes(carol, "#") == [refused]
        assert _codes(carol, "dev7/+/x") == [1]
        assert _codes(watcher, "#") == [1]
        acks = watch_pubacks(carol)
        info = carol.publish("dev7/a/x", b"refused", qos=1)  # the write pattern names her user
        assert acks[info.mid] == (0x87 if version == V5 else 0)
        watcher.expect_none()
        carol.publish("carol/a", b"allowed", qos=1)
        assert watcher.expect().payload == b"allowed"
    finally:
        carol.disconnect()
        watcher.disconnect()


def test_amqp1_topic_permissions_limit_keys(server: RunningServer) -> None:
    carol = _proton(server, "carol")
    try:
        assert _refusal(lambda: carol.create_sender("topic://bob/x")) == UNAUTHORIZED
        assert _refusal(lambda: carol.create_receiver("topic://#")) == UNAUTHORIZED  # its id is no name
        carol.create_sender("topic://carol/x").close()
    finally:
        carol.close()


def test_amqp091_a_queue_publish_that_creates_the_queue_configures_it(server: RunningServer) -> None:
    pika = pytest.importorskip("pika")
    from pika.exceptions import ChannelClosedByBroker

    credentials = pika.PlainCredentials("noconf", "pw")
    params = pika.ConnectionParameters("127.0.0.1", server.ports["amqp"], VHOST, credentials)
    connection = pika.BlockingConnection(params)
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        channel.basic_publish("", "$queue/other-jobs", b"existing")  # exists: only written
        new = f"new-{uuid.uuid4().hex[:6]}"
        with pytest.raises(ChannelClosedByBroker) as caught:
            channel.basic_publish("", f"$queue/{new}", b"would create")
        assert caught.value.reply_code == 403
        assert caught.value.reply_text == (
            f"ACCESS_REFUSED - access to queue '{new}' in vhost '{VHOST}' refused for user 'noconf'"
        )
    finally:
        connection.close()
