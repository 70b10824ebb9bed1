"""Virtual hosts with real clients: two tenants sharing every name without seeing each other.

MQTT (paho) selects a vhost with ``vhost:user`` user names or the ``auth.vhost_map`` mapping; AMQP
1.0 (python-qpid-proton) with ``open.hostname``; AMQP 0.9.1 (pika, kombu) with ``virtual_host``. Each
vhost has its own topics, retained messages, client ids, ``$queue/`` queues and exchanges; a vhost
that does not exist, or one the user has no permission for, is refused the protocol's way.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from paho.mqtt.enums import MQTTProtocolVersion as Version

from tests.interop.conftest import amqp_server_args
from tests.support import rabbitmq
from tests.support.paho import V5, V311, Client, Endpoints, PacketTypes, Received, connect, props, user_props
from tests.support.permissions import store_permissions
from tests.support.rabbitmq import define, rabbitmqctl
from tests.support.server import RunningServer, serving

USERS = '[{"name": "alice", "password": "a"}, {"name": "bob", "password": "b"}]'
VHOST_ENV = {
    "TRIMARAN_AUTH__USERS": USERS,
    "TRIMARAN_VHOSTS": '["/", "t1", "t2/eu"]',
    "TRIMARAN_LIMITS__SYS_INTERVAL": "0",
    "TRIMARAN_AUTH__VHOST_MAP": '{"bob": "t1"}',
}


# Who may enter which vhost (RabbitMQ's set_permissions), the same on both brokers.
PERMISSIONS = [("alice", "/"), ("alice", "t1"), ("alice", "t2/eu"), ("bob", "t1")]


def _grant(url: str, permissions: list[tuple[str, str]] = PERMISSIONS) -> None:
    store_permissions(url, permissions)


@pytest.fixture(scope="module")
def vhost_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    workdir = tmp_path_factory.mktemp("vhosts")
    url = f"sqlite:///{workdir / 'vhosts.db'}"
    _grant(url)
    env = {**VHOST_ENV, "TRIMARAN_STORAGE__URL": url}
    with serving(RunningServer(amqp_server_args(), cwd=workdir, env=env).start()) as server:
        yield server


@pytest.fixture(scope="module")
def rabbitmq_vhosts(rabbitmq_port: int) -> int:
    """The private RabbitMQ node with the same users, vhosts and permissions."""
    define(
        rabbitmq_port,
        {"alice": "a", "bob": "b"},
        vhosts=("t1", "t2/eu"),
        permissions=[(user, vhost, ".*", ".*", ".*") for user, vhost in PERMISSIONS],
    )
    return rabbitmq_port


@pytest.fixture(params=["trimaran", "rabbitmq"])
def amqp091_port(request: pytest.FixtureRequest) -> int:
    """The AMQP 0.9.1 port of Trimaran, then of RabbitMQ: one vhost test, both brokers."""
    if request.param == "rabbitmq":
        return int(request.getfixturevalue("rabbitmq_vhosts"))
    server: RunningServer = request.getfixturevalue("vhost_server")
    return server.ports["amqp"]


@pytest.fixture(scope="module")
def endpoints(vhost_server: RunningServer) -> Endpoints:
    return Endpoints("127.0.0.1", vhost_server.ports["mqtt"])


def _gather(client: Client, wait: float = 0.7) -> list[Received]:
    """Everything the client received within ``wait`` seconds."""
    time.sleep(wait)
    out: list[Received] = []
    while not client.messages.empty():
        out.append(client.messages.get())
    return out


def _unique(text: str) -> str:
    return f"{text}{uuid.uuid4().hex[:8]}"


@pytest.mark.parametrize("version", [V311, V5])
def test_two_tenants_share_topics_retained_and_client_ids(endpoints: Endpoints, version: Version) -> None:
    root = _unique("sensors")
    topic = f"{root}/temp"
    client_id = _unique("device-")
    one = connect(endpoints, client_id, version=version, username="t1:alice", password="a")
    two = connect(endpoints, client_id, version=version, username="t2/eu:alice", password="a")
    plain = connect(endpoints, _unique("root-"), version=version, username="alice", password="a")
    try:
        # The same client id in two vhosts: two sessions, neither takes the other over.
        for client in (one, two):
            client.subscribe(f"{root}/#", qos=1)
            client.subscribe(topic, qos=1)
        plain.subscribe("#", qos=1)
        plain.subscribe(topic, qos=1)
        one.publish(topic, b"from t1", qos=1, retain=True)
        two.publish(topic, b"from t2", qos=1, retain=True)
        got_one = [one.expect()]  # overlapping subscriptions: one copy
        got_two = [two.expect()]
        assert {(m.topic, m.payload) for m in got_one} == {(topic, b"from t1")}
        assert {(m.topic, m.payload) for m in got_two} == {(topic, b"from t2")}
        one.expect_none()
        two.expect_none()
        plain.expect_none()  # '/' with '#' sees nothing of either tenant
        assert one.disconnects.empty() and two.disconnects.empty()
    finally:
        for client in (one, two, plain):
            client.disconnect()
    # Retained per vhost: a new subscriber of t1 gets t1's retained message only.
    again = connect(endpoints, version=version, username="t1:alice", password="a")
    default = connect(endpoints, version=version, username="alice", password="a")
    try:
        again.subscribe("#", qos=1)
        default.subscribe("#", qos=1)
        retained = {m.topic: m for m in _gather(again)}
        assert (retained[topic].payload, retained[topic].retain) == (b"from t1", True)
        assert all(m.payload == b"from t1" for m in retained.values())  # t1's (earlier runs' too)
        default.expect_none()  # '/' holds no retained message of a tenant
    finally:
        again.disconnect()
        default.disconnect()


def test_queues_are_per_vhost(endpoints: Endpoints) -> None:
    queue = _unique("jobs")
    one = connect(endpoints, version=V5, username="t1:alice", password="a")
    two = connect(endpoints, version=V5, username="t2/eu:alice", password="a")
    try:
        one.publish(f"$queue/{queue}", b"job for t1", qos=1)
        two.publish(f"$queue/{queue}", b"job for t2", qos=1)
        one.subscribe(f"$queue/{queue}", qos=1)
        two.subscribe(f"$share/g/$queue/{queue}", qos=1)
        got_one, got_two = one.expect(), two.expect()
        assert (got_one.topic, got_one.payload) == (f"$queue/{queue}", b"job for t1")
        assert (got_two.topic, got_two.payload) == (f"$queue/{queue}", b"job for t2")
        properties = dict(got_one.properties.UserProperty)
        assert properties["x-queue"] == queue and properties["x-queue-message-id"].startswith(f"{queue}:")
        one.expect_none()
        two.expect_none()
    finally:
        one.disconnect()
        two.disconnect()


def test_a_tenants_dead_letters_name_its_queue_and_topic_as_its_clients_do(endpoints: Endpoints) -> None:
    queue = _unique("poison")
    sub = connect(endpoints, version=V5, username="t1:alice", password="a", manual_ack=True)
    dlq = connect(endpoints, version=V5, username="t1:alice", password="a")
    try:
        sub.subscribe(f"$queue/{queue}", qos=1)
        sub.publish(f"$queue/{queue}", b"bad", qos=1)
        message_id = user_props(sub.expect())["x-queue-message-id"]
        control = props(PacketTypes.PUBLISH, UserProperty=[("message-id", message_id), ("reason", "no")])
        sub.publish(f"$queue/{queue}/$reject", b"", qos=1, properties=control)
        dlq.subscribe(f"$queue/$dlq/{queue}", qos=1)
        dead = dlq.expect()
        assert (dead.topic, dead.payload) == (f"$queue/$dlq/{queue}", b"bad")
        history = user_props(dead)
        assert history["x-dead-letter-queue"] == queue
        assert history["x-dead-letter-topic"] == f"$queue/{queue}"
        assert not [v for v in history.values() if "$vhost" in v]
    finally:
        sub.disconnect()
        dlq.disconnect()


def test_the_user_mapping_and_the_dollar_rule_inside_a_tenant(endpoints: Endpoints) -> None:
    topic = _unique("mapped/")
    bob = connect(endpoints, version=V5, username="bob", password="b")  # auth.vhost_map: bob -> t1
    alice = connect(endpoints, version=V5, username="t1:alice", password="a")
    try:
        alice.subscribe("#", qos=0)
        alice.subscribe("+/x", qos=0)
        _gather(alice)  # t1's retained messages of the other tests
        bob.publish(topic, b"bob in t1", qos=1)
        assert alice.expect().payload == b"bob in t1"
        bob.publish("$app/x", b"dollar", qos=1)  # '#' and '+' at the tenant's first level skip it
        alice.expect_none()
    finally:
        bob.disconnect()
        alice.disconnect()


@pytest.mark.parametrize("version", [V311, V5])
def test_a_vhost_that_does_not_exist_is_refused(endpoints: Endpoints, version: Version) -> None:
    client = connect(endpoints, version=version, username="nowhere:alice", password="a", expect_success=False)
    try:
        _flags, reason, _props = client.connack.get(timeout=5)
        assert reason.is_failure
        assert reason.value == 0x86  # bad user name or password (3.1.1: 4, as paho reports it), as RabbitMQ
    finally:
        client.drop()


def test_a_client_of_the_default_vhost_cannot_name_a_tenants_keys(endpoints: Endpoints) -> None:
    spy = connect(endpoints, version=V5, username="alice", password="a")
    victim = connect(endpoints, version=V5, username="t1:alice", password="a")
    try:
        victim.subscribe("secret", qos=1)
        codes = spy.subscribe("$vhost/t1/#", qos=1)
        assert [int(c.value) for c in codes] == [0x87]  # not authorized
        spy.publish("$vhost/t1/secret", b"forged", qos=1)
        victim.expect_none()
        spy.expect_none()
    finally:
        spy.disconnect()
        victim.disconnect()
    forged = connect(
        endpoints, "$vhost/t1/x", version=V5, username="alice", password="a", expect_success=False
    )
    try:
        _flags, reason, _props = forged.connack.get(timeout=5)
        assert reason.value == 0x85
    finally:
        forged.drop()


# -- AMQP 1.0 (python-qpid-proton): open.hostname ------------------------------------------------


def _proton(server: RunningServer, hostname: str | None, user: str = "alice", password: str = "a") -> Any:
    from proton.utils import BlockingConnection

    kwargs: dict[str, Any] = {"user": user, "password": password, "allow_insecure_mechs": True}
    if hostname is not None:
        kwargs["virtual_host"] = hostname
    return BlockingConnection(f"127.0.0.1:{server.ports['amqp']}", timeout=10, **kwargs)


def test_amqp1_tenants_share_queue_and_topic_names_unseen(vhost_server: RunningServer) -> None:
    proton = pytest.importorskip("proton")
    from tests.support.amqp1 import body_bytes

    queue, topic = _unique("orders"), _unique("prices/")
    one = _proton(vhost_server, "vhost:t1")
    two = _proton(vhost_server, "vhost:t2/eu")
    default = _proton(vhost_server, None)
    try:
        receivers = {c: c.create_receiver(f"topic://{topic}/#", credit=10) for c in (one, two, default)}
        for client, text in ((one, b"t1"), (two, b"t2")):
            sender = client.create_sender(f"$queue/{queue}")
            sender.send(proton.Message(body=text + b" order"))
            sender.close()
            topical = client.create_sender(f"topic://{topic}/eur")
            topical.send(proton.Message(body=text + b" price"))
            topical.close()
        for client, text in ((one, b"t1"), (two, b"t2")):
            got = receivers[client].receive(timeout=5)
            receivers[client].accept()
            assert body_bytes(got) == text + b" price"
            consumer = client.create_receiver(f"$queue/{queue}", credit=10)
            got = consumer.receive(timeout=5)
            consumer.accept()
            assert body_bytes(got) == text + b" order"
            with pytest.raises(proton.Timeout):
                consumer.receive(timeout=0.5)
        with pytest.raises(proton.Timeout):
            receivers[default].receive(timeout=0.5)  # '/' sees neither tenant
        # From MQTT in t1 to AMQP 1.0 in t1: the message's address is the tenant's own name.
        mqtt = connect(Endpoints("127.0.0.1", vhost_server.ports["mqtt"]), username="t1:alice", password="a")
        try:
            mqtt.publish(f"{topic}/usd", b"from mqtt", qos=1)
        finally:
            mqtt.disconnect()
        got = receivers[one].receive(timeout=5)
        receivers[one].accept()
        assert (body_bytes(got), got.address) == (b"from mqtt", f"topic://{topic}/usd")
        with pytest.raises(proton.Timeout):
            receivers[two].receive(timeout=0.5)
    finally:
        for client in (one, two, default):
            client.close()


def test_refusals_name_a_tenants_queues_as_its_clients_do(
    vhost_server: RunningServer, endpoints: Endpoints
) -> None:
    """A queue's refusal texts reach the client with its own names: an MQTT 5 PUBACK reason string
    and an AMQP 1.0 attach refusal about a queue of vhost t1 never show the internal prefix."""
    from proton.utils import LinkDetached

    queue = _unique("locked-")
    owner = _pika(vhost_server.ports["amqp"], "t1")
    mqtt = connect(endpoints, version=V5, username="t1:alice", password="a")
    proton = _proton(vhost_server, "vhost:t1")
    try:
        owner.channel().queue_declare(queue, exclusive=True)
        with pytest.raises(LinkDetached) as refused:
            proton.create_receiver(f"$queue/{queue}")
        assert "$vhost" not in str(refused.value) and f"queue {queue} is exclusive" in str(refused.value)
        reasons: dict[int, str] = {}

        def on_publish(_c: Any, _u: Any, mid: int, _reason: Any, props: Any) -> None:
            reasons[mid] = getattr(props, "ReasonString", "")

        mqtt.client.on_publish = on_publish
        control = props(PacketTypes.PUBLISH, UserProperty=[("message-id", f"{queue}:99")])
        info = mqtt.publish(f"$queue/{queue}/$ack", b"", qos=1, properties=control, wait=False)
        info.wait_for_publish(5)
        deadline = time.monotonic() + 5
        while info.mid not in reasons and time.monotonic() < deadline:
            time.sleep(0.05)
        assert f"queue {queue} " in reasons[info.mid] and "$vhost" not in reasons[info.mid]
    finally:
        proton.close()
        mqtt.disconnect()
        owner.close()


# Vhosts named like the hosts clients dial: RabbitMQ 3.10 reads only ``vhost:NAME`` from
# open.hostname, so the clients of the default vhost stay there whatever vhosts exist.
HOST_VHOSTS = ["/", "127.0.0.1", "localhost", "t1"]


def _host_vhost_server(workdir: Path, **env: str) -> RunningServer:
    url = f"sqlite:///{workdir / 'vhosts.db'}"
    _grant(url, [("alice", vhost) for vhost in HOST_VHOSTS])  # she may enter each of them
    env = {**VHOST_ENV, "TRIMARAN_STORAGE__URL": url, "TRIMARAN_VHOSTS": json.dumps(HOST_VHOSTS), **env}
    return RunningServer(amqp_server_args(), cwd=workdir, env=env).start()


@pytest.fixture(scope="module")
def host_vhost_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    with serving(_host_vhost_server(tmp_path_factory.mktemp("host-vhosts"))) as server:
        yield server


def _landed_in(server: RunningServer, address: str, hostname: str | None) -> str:
    """The vhost a proton client dialling ``address`` (``open.hostname`` from ``hostname``, else
    the dialled host) lands in: it sends to a queue, and the one vhost that holds it says."""
    import proton
    from proton.utils import BlockingConnection

    from tests.support.amqp1 import body_bytes

    queue, port = _unique("landed-"), server.ports["amqp"]
    kwargs: dict[str, Any] = {"user": "alice", "password": "a", "allow_insecure_mechs": True}
    if hostname is not None:
        kwargs["virtual_host"] = hostname
    client = BlockingConnection(f"{address}:{port}", timeout=10, **kwargs)
    try:
        sender = client.create_sender(f"$queue/{queue}")
        sender.send(proton.Message(body=b"where am I"))
        sender.close()
    finally:
        client.close()
    # A reader with credit in every vhost at once, then one wait for all of them: at least the
    # 0.5 s each vhost's reader had alone, in one wait instead of one per empty vhost.
    found = []
    readers = []
    try:
        receivers = {}
        for vhost in HOST_VHOSTS:
            readers.append(_proton(server, f"vhost:{vhost}"))
            receivers[vhost] = readers[-1].create_receiver(f"$queue/{queue}", credit=1)
        time.sleep(0.5)
        for vhost, receiver in receivers.items():
            try:
                got = receiver.receive(timeout=0.1)
            except proton.Timeout:
                continue
            receiver.accept()
            assert body_bytes(got) == b"where am I"
            found.append(vhost)
    finally:
        for reader in readers:
            reader.close()
    assert len(found) == 1, found
    return found[0]


Landing = Callable[[str, "str | None"], str]


def _rabbitmq_landing(port: int) -> Landing:
    """Where a proton client lands on RabbitMQ 3.10's AMQP 1.0 plugin: it sends to a queue of the
    same name declared in every vhost (``/amq/queue/<name>``), and the one vhost whose queue holds
    the message says."""
    import pika
    import proton
    from proton.utils import BlockingConnection

    credentials = pika.PlainCredentials("alice", "a")
    queue = _unique("landed-")
    for vhost in HOST_VHOSTS:
        declaring = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port, vhost, credentials))
        declaring.channel().queue_declare(queue)
        declaring.close()

    def landed_in(address: str, hostname: str | None) -> str:
        kwargs: dict[str, Any] = {"user": "alice", "password": "a", "allowed_mechs": "PLAIN"}
        if hostname is not None:
            kwargs["virtual_host"] = hostname
        client = BlockingConnection(f"{address}:{port}", timeout=10, allow_insecure_mechs=True, **kwargs)
        try:
            sender = client.create_sender(f"/amq/queue/{queue}")
            sender.send(proton.Message(body=b"where am I"))
        finally:
            client.close()
        found = []
        for vhost in HOST_VHOSTS:
            reader = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port, vhost, credentials))
            try:
                channel = reader.channel()
                if channel.queue_declare(queue, passive=True).method.message_count:
                    found.append(vhost)
                    channel.queue_purge(queue)
            finally:
                reader.close()
        assert len(found) == 1, found
        return found[0]

    return landed_in


@pytest.fixture(scope="module")
def rabbitmq_amqp1(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """A private RabbitMQ 3.10 node with its AMQP 1.0 plugin, alice in every vhost of HOST_VHOSTS."""
    why = rabbitmq.available()
    if why is not None:
        pytest.skip(why)
    try:
        with rabbitmq.rabbitmq_node(tmp_path_factory.mktemp("rabbitmq-amqp1"), ("rabbitmq_amqp1_0",)) as port:
            permissions = [("alice", vhost, ".*", ".*", ".*") for vhost in HOST_VHOSTS]
            define(port, {"alice": "a"}, vhosts=HOST_VHOSTS, permissions=permissions)
            yield port
    except RuntimeError as exc:
        pytest.skip(str(exc))


@pytest.fixture(params=["trimaran", "rabbitmq"])
def landing(request: pytest.FixtureRequest) -> Landing:
    """Where a proton client lands (its vhost), on Trimaran, then on RabbitMQ 3.10."""
    if request.param == "rabbitmq":
        return _rabbitmq_landing(int(request.getfixturevalue("rabbitmq_amqp1")))
    server: RunningServer = request.getfixturevalue("host_vhost_server")
    return lambda address, hostname: _landed_in(server, address, hostname)


@pytest.mark.parametrize("address", ["127.0.0.1", "localhost"])
def test_amqp1_a_vhost_named_like_the_dialled_host_does_not_capture_its_clients(
    landing: Landing, address: str
) -> None:
    """RabbitMQ 3.10 reads only ``vhost:NAME`` from open.hostname: the host the client dialled, or
    any plain name, even one a vhost has, is the default vhost."""
    pytest.importorskip("proton")
    assert landing(address, None) == "/"
    assert landing(address, "t1") == "/"
    assert landing(address, "vhost:t1") == "t1"
    assert landing(address, f"vhost:{address}") == address


def test_amqp1_hostname_vhost_keeps_the_older_mapping(tmp_path: Path) -> None:
    pytest.importorskip("proton")
    with serving(_host_vhost_server(tmp_path, TRIMARAN_AMQP1__HOSTNAME_VHOST="true")) as server:
        assert _landed_in(server, "127.0.0.1", None) == "127.0.0.1"
        assert _landed_in(server, "127.0.0.1", "t1") == "t1"
        assert _landed_in(server, "127.0.0.1", "vhost:/") == "/"
        assert _landed_in(server, "127.0.0.1", "nowhere.example") == "/"  # names no vhost


def test_amqp1_a_vhost_that_does_not_exist_closes_with_not_found(vhost_server: RunningServer) -> None:
    pytest.importorskip("proton")
    from proton import ConnectionException

    with pytest.raises(ConnectionException, match="amqp:not-found"):
        connection = _proton(vhost_server, "vhost:nowhere")
        connection.create_sender("$queue/x")


# -- AMQP 0.9.1 (pika, kombu): connection.open's virtual_host, next to RabbitMQ ---------------------


def _pika(port: int, vhost: str, user: str = "alice", password: str = "a") -> Any:
    import pika

    params = pika.ConnectionParameters(
        "127.0.0.1", port, vhost, pika.PlainCredentials(user, password), connection_attempts=1
    )
    return pika.BlockingConnection(params)


def test_amqp091_a_default_exchange_publish_to_another_vhosts_key_names_what_the_client_named(
    vhost_server: RunningServer,
) -> None:
    """A client of '/' spelling a tenant's internal key as a routing key is refused as RabbitMQ
    words a refusal, naming the queue as the client named it and the vhost the client is in (not a
    topic of amq.topic it never named). Trimaran's own: RabbitMQ has no such keys."""
    import pika.exceptions

    for key in ("$vhost/t1/orders", "$vhost/t1/$queue/orders"):
        connection = _pika(vhost_server.ports["amqp"], "/")
        try:
            channel = connection.channel()
            channel.confirm_delivery()
            with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
                channel.basic_publish("", key, b"forged")
            assert refused.value.reply_code == 403
            assert refused.value.reply_text == (
                f"ACCESS_REFUSED - access to queue '{key}' in vhost '/' refused for user 'alice'"
            )
        finally:
            connection.close()
    logged = [
        line for line in vhost_server.lines if "amqp091 client" in line and "names another vhost" in line
    ]
    assert logged and all("$queue/$vhost/t1/" in line for line in logged), logged  # the name it used


def test_amqp091_tenants_share_queue_exchange_and_binding_names_unseen(amqp091_port: int) -> None:
    pika = pytest.importorskip("pika")
    queue, exchange = _unique("jobs-"), _unique("work-")
    connections = {vhost: _pika(amqp091_port, vhost) for vhost in ("t1", "t2/eu", "/")}
    try:
        channels = {vhost: c.channel() for vhost, c in connections.items()}
        for vhost in ("t1", "t2/eu"):
            channel = channels[vhost]
            channel.confirm_delivery()
            channel.exchange_declare(exchange, "direct", durable=True)
            declared = channel.queue_declare(queue, durable=True)
            assert declared.method.queue == queue  # its own name, no prefix
            channel.queue_bind(queue, exchange, "k")
            channel.basic_publish(exchange, "k", f"via exchange in {vhost}".encode())
            channel.basic_publish("", queue, f"direct in {vhost}".encode())
            channel.basic_publish("amq.topic", "prices.eur", f"topic in {vhost}".encode())
        # '/' knows neither the exchange nor the queue.
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as missing:
            channels["/"].queue_declare(queue, passive=True)
        assert missing.value.reply_code == 404
        for vhost in ("t1", "t2/eu"):
            channel = channels[vhost]
            got = []
            for _ in range(3):
                method, _props, body = channel.basic_get(queue, auto_ack=True)
                if method is None:
                    break
                got.append(body)
            assert sorted(got) == sorted([f"via exchange in {vhost}".encode(), f"direct in {vhost}".encode()])
            assert channel.queue_declare(queue, passive=True).method.message_count == 0
            channel.queue_delete(queue)
            channel.exchange_delete(exchange)
    finally:
        for connection in connections.values():
            connection.close()


def test_amqp091_topic_bindings_stay_in_their_vhost(amqp091_port: int) -> None:
    pytest.importorskip("pika")
    connections = {vhost: _pika(amqp091_port, vhost) for vhost in ("t1", "t2/eu")}
    try:
        channels = {vhost: c.channel() for vhost, c in connections.items()}
        names = {}
        for vhost, channel in channels.items():
            names[vhost] = channel.queue_declare("", exclusive=True).method.queue
            channel.queue_bind(names[vhost], "amq.topic", "prices.#")
        for vhost, channel in channels.items():
            channel.basic_publish("amq.topic", "prices.eur", f"from {vhost}".encode())
        for vhost, channel in channels.items():
            deadline = time.monotonic() + 5
            got = []
            while time.monotonic() < deadline and not got:
                method, _props, body = channel.basic_get(names[vhost], auto_ack=True)
                if method is not None:
                    got.append((method.routing_key, body))
                else:
                    time.sleep(0.05)
            time.sleep(0.3)
            method, _props, body = channel.basic_get(names[vhost], auto_ack=True)
            assert method is None, body
            assert got == [("prices.eur", f"from {vhost}".encode())]
    finally:
        for connection in connections.values():
            connection.close()


def test_amqp091_a_vhost_that_does_not_exist_is_refused(amqp091_port: int) -> None:
    pika = pytest.importorskip("pika")
    with pytest.raises(pika.exceptions.AMQPConnectionError) as refused:
        _pika(amqp091_port, "nowhere")
    assert "NOT_ALLOWED - vhost nowhere not found" in repr(refused.value)


def test_amqp091_a_user_without_permission_is_refused(amqp091_port: int) -> None:
    pika = pytest.importorskip("pika")
    with pytest.raises(pika.exceptions.AMQPConnectionError) as refused:
        _pika(amqp091_port, "t2/eu", "bob", "b")
    text = repr(refused.value).replace("\\", "")  # pika nests the reply in reprs of tuples
    assert "530" in text and "NOT_ALLOWED - access to vhost 't2/eu' refused for user 'bob'" in text
    _pika(amqp091_port, "t1", "bob", "b").close()  # where bob has a permission


def test_amqp091_reply_texts_in_a_tenant_name_its_queues_and_exchanges_as_rabbitmq(amqp091_port: int) -> None:
    """Errors about a tenant's queues and exchanges name them as its clients do, in RabbitMQ's words."""
    pika = pytest.importorskip("pika")
    queue, exchange = _unique("q-"), _unique("x-")
    connection = _pika(amqp091_port, "t2/eu")
    try:
        texts = []
        attempts = [
            lambda ch: ch.queue_declare(queue, passive=True),
            lambda ch: ch.queue_bind(queue, "amq.direct", "k"),
            lambda ch: ch.basic_consume(queue, lambda *a: None),
            lambda ch: ch.exchange_declare(exchange, passive=True),
            lambda ch: ch.exchange_bind(exchange, "amq.direct", "k"),
        ]
        for attempt in attempts:
            channel = connection.channel()
            with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
                attempt(channel)
            texts.append((closed.value.reply_code, closed.value.reply_text))
        channel = connection.channel()
        channel.queue_declare(queue, durable=True)
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
            channel.queue_declare(queue, durable=False)  # inequivalent
        texts.append((closed.value.reply_code, closed.value.reply_text.split(" for ")[1].split(":")[0]))
        channel = connection.channel()
        channel.queue_delete(queue)
    finally:
        connection.close()
    in_vhost = "in vhost 't2/eu'"
    assert texts == [
        (404, f"NOT_FOUND - no queue '{queue}' {in_vhost}"),
        (404, f"NOT_FOUND - no queue '{queue}' {in_vhost}"),
        (404, f"NOT_FOUND - no queue '{queue}' {in_vhost}"),
        (404, f"NOT_FOUND - no exchange '{exchange}' {in_vhost}"),
        (404, f"NOT_FOUND - no exchange '{exchange}' {in_vhost}"),
        (406, f"queue '{queue}' {in_vhost}"),
    ]


def test_kombu_on_a_non_default_vhost(vhost_server: RunningServer) -> None:
    kombu = pytest.importorskip("kombu")
    port = vhost_server.ports["amqp"]
    queue_name = _unique("tasks-")
    received: dict[str, list[Any]] = {}
    for vhost in ("t1", "t2/eu"):
        with kombu.Connection(f"amqp://alice:a@127.0.0.1:{port}/{vhost.replace('/', '%2F')}") as connection:
            queue = kombu.Queue(queue_name, kombu.Exchange(queue_name, "direct"), routing_key=queue_name)
            with connection.Producer() as producer:
                producer.publish(
                    {"vhost": vhost}, exchange=queue.exchange, routing_key=queue_name, declare=[queue]
                )
    for vhost in ("t1", "t2/eu"):
        with kombu.Connection(f"amqp://alice:a@127.0.0.1:{port}/{vhost.replace('/', '%2F')}") as connection:
            queue = kombu.Queue(queue_name, kombu.Exchange(queue_name, "direct"), routing_key=queue_name)
            simple = connection.SimpleQueue(queue)
            message = simple.get(timeout=5)
            received[vhost] = [message.payload]
            message.ack()
            with pytest.raises(simple.Empty):
                simple.get(timeout=0.5)
            simple.close()
    assert received == {"t1": [{"vhost": "t1"}], "t2/eu": [{"vhost": "t2/eu"}]}


def test_mqtt_to_amqp091_inside_a_tenant_carries_its_own_names(vhost_server: RunningServer) -> None:
    pytest.importorskip("pika")
    queue, root = _unique("inbox-"), _unique("cross")
    connection = _pika(vhost_server.ports["amqp"], "t1")
    mqtt = connect(Endpoints("127.0.0.1", vhost_server.ports["mqtt"]), username="t1:alice", password="a")
    try:
        channel = connection.channel()
        bound = channel.queue_declare("", exclusive=True).method.queue
        channel.queue_bind(bound, "amq.topic", f"{root}.#")
        mqtt.publish(f"$queue/{queue}", b"to the queue", qos=1)
        mqtt.publish(f"{root}/a", b"to the topic", qos=1)
        got = {}
        deadline = time.monotonic() + 5
        while len(got) < 2 and time.monotonic() < deadline:
            for name in (queue, bound):
                method, _props, body = channel.basic_get(name, auto_ack=True)
                if method is not None:
                    got[body] = (method.exchange, method.routing_key)
            time.sleep(0.05)
        assert got == {b"to the queue": ("", queue), b"to the topic": ("amq.topic", f"{root}.a")}
    finally:
        mqtt.disconnect()
        connection.close()


def test_rabbitmq_keeps_a_connection_whose_permission_is_cleared(rabbitmq_vhosts: int) -> None:
    """What RabbitMQ (3.10) does, beside tests/test_app_vhosts.py's clearing test: the connection
    stays open and its next operation in that vhost is refused. Trimaran checks a vhost permission
    at the door only (its patterns are not checked per operation), so it closes the connection
    instead: the one way the permission is taken away at once (docs/security.md)."""
    import pika

    define(rabbitmq_vhosts, {"carol": "c"}, permissions=[("carol", v, ".*", ".*", ".*") for v in ("/", "t1")])
    in_t1 = _pika(rabbitmq_vhosts, "t1", "carol", "c")
    channel = in_t1.channel()
    rabbitmqctl(rabbitmq_vhosts, "clear_permissions", "-p", "t1", "carol")
    in_t1.process_data_events(1.0)
    assert in_t1.is_open
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
        channel.queue_declare(_unique("after-clear-"))
    assert refused.value.reply_code == 403
    assert "in vhost 't1' refused for user 'carol'" in refused.value.reply_text
    in_t1.close()
