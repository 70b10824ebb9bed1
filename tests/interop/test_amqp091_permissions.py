"""RabbitMQ's configure / write / read patterns over AMQP 0.9.1 (pika), next to RabbitMQ 3.10.

One vhost ``perms`` where alice may configure, write and read only names matching ``^alice-`` and bob
everything; bob makes ``bob-q`` and ``bob-x``. Each operation RabbitMQ's access-control page lists is
tried by alice on hers and on bob's: allowed, or closed with 403 ACCESS_REFUSED in RabbitMQ's words.
A vhost alice has no permission for (``perms-closed``) refuses her at connection.open, 530.
carol may do everything, but her topic permission on ``amq.topic`` (``^{username}\\.``, RabbitMQ's
set_topic_permissions) limits the routing keys she publishes and binds with to ``carol.``.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.interop.conftest import amqp_server_args
from tests.support import rabbitmq
from tests.support.permissions import store_topic_permission
from tests.support.server import RunningServer, serving
from trimaran.vhosts import TopicPermission

pika = pytest.importorskip("pika")
from pika.exceptions import ChannelClosedByBroker, ProbableAccessDeniedError  # noqa: E402

VHOST, CLOSED = "perms", "perms-closed"
MINE = "^alice-"
USERS = [
    {"name": "alice", "password": "wonderland"},
    {"name": "bob", "password": "b"},
    {"name": "carol", "password": "c"},
    {"name": "dave", "password": "d"},
]
GRANTS = [
    {"user": "alice", "vhost": VHOST, "configure": MINE, "write": MINE, "read": MINE},
    {"user": "bob", "vhost": VHOST},
    {"user": "carol", "vhost": VHOST},
    {"user": "dave", "vhost": VHOST, "configure": "alice", "write": "", "read": ""},
]
OWN_KEYS = r"^{username}\."  # carol's topic permission on amq.topic, write and read


@pytest.fixture(scope="module")
def trimaran_port(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    directory: Path = tmp_path_factory.mktemp("permissions")
    url = f"sqlite:///{directory / 'trimaran.db'}"
    store_topic_permission(url, TopicPermission("carol", VHOST, "amq.topic", OWN_KEYS, OWN_KEYS))
    env = {
        "TRIMARAN_STORAGE__URL": url,
        "TRIMARAN_AUTH__USERS": json.dumps(USERS),
        "TRIMARAN_AUTH__PERMISSIONS": json.dumps(GRANTS),
        "TRIMARAN_VHOSTS": json.dumps(["/", VHOST, CLOSED]),
    }
    with serving(RunningServer(amqp_server_args(), cwd=directory, env=env).start()) as server:
        yield server.ports["amqp"]
        assert "Traceback" not in server.output()


@pytest.fixture(scope="module")
def rabbitmq_perms(rabbitmq_port: int) -> int:
    """The private RabbitMQ node with the same users, vhosts and permissions."""
    rabbitmq.define(  # (dave's empty write and read patterns: RabbitMQ takes "")
        rabbitmq_port,
        {user["name"]: user["password"] for user in USERS},
        vhosts=(VHOST, CLOSED),
        permissions=[
            ("alice", VHOST, MINE, MINE, MINE),
            ("bob", VHOST, ".*", ".*", ".*"),
            ("carol", VHOST, ".*", ".*", ".*"),
            ("dave", VHOST, "alice", "", ""),
        ],
        topic_permissions=[("carol", VHOST, "amq.topic", OWN_KEYS, OWN_KEYS)],
    )
    return rabbitmq_port


@pytest.fixture(scope="module", params=["trimaran", "rabbitmq"])
def port(request: pytest.FixtureRequest) -> Iterator[int]:
    """Trimaran's AMQP port, then RabbitMQ's, with bob's queue and exchange made in ``perms``."""
    name = "trimaran_port" if request.param == "trimaran" else "rabbitmq_perms"
    amqp = int(request.getfixturevalue(name))
    bob = _connect(amqp, "bob", "b")
    channel = bob.channel()
    channel.queue_declare("bob-q")
    channel.exchange_declare("bob-x", "direct")
    channel.exchange_declare("alice-x", "direct")
    yield amqp
    channel.queue_delete("bob-q")
    channel.exchange_delete("bob-x")
    channel.exchange_delete("alice-x")
    bob.close()


def _connect(port: int, user: str, password: str, vhost: str = VHOST) -> Any:
    credentials = pika.PlainCredentials(user, password)
    params = pika.ConnectionParameters("127.0.0.1", port, vhost, credentials, connection_attempts=1)
    return pika.BlockingConnection(params)


@pytest.fixture
def alice(port: int) -> Iterator[Any]:
    connection = _connect(port, "alice", "wonderland")
    yield connection
    if connection.is_open:
        connection.close()


def refusal(connection: Any, call: Callable[[Any], object]) -> str:
    """The reply text of the channel error ``call`` ends in (403 asserted)."""
    channel = connection.channel()
    channel.confirm_delivery()  # a refused publish closes the channel before its confirm
    with pytest.raises(ChannelClosedByBroker) as caught:
        call(channel)
    assert caught.value.reply_code == 403, caught.value.reply_text
    return str(caught.value.reply_text)


def refused(what: str, user: str = "alice") -> str:
    return f"ACCESS_REFUSED - access to {what} in vhost '{VHOST}' refused for user '{user}'"


def test_configure_declares_and_deletes_queues_and_exchanges(alice: Any) -> None:
    assert refusal(alice, lambda ch: ch.queue_declare("bob-q2")) == refused("queue 'bob-q2'")
    assert refusal(alice, lambda ch: ch.queue_delete("bob-q")) == refused("queue 'bob-q'")
    assert refusal(alice, lambda ch: ch.exchange_declare("bob-x2", "fanout")) == refused("exchange 'bob-x2'")
    assert refusal(alice, lambda ch: ch.exchange_delete("bob-x")) == refused("exchange 'bob-x'")
    # The default exchange and amq.* queue names are refused for what they are, before permissions.
    default = "ACCESS_REFUSED - operation not permitted on the default exchange"
    assert refusal(alice, lambda ch: ch.exchange_declare("", "direct")) == default
    assert refusal(alice, lambda ch: ch.queue_declare("amq.q")) == (
        "ACCESS_REFUSED - queue name 'amq.q' contains reserved prefix 'amq.*'"
    )
    # A dead-letter exchange is written by the queue's messages; the queue is read for them.
    dlx = {"x-dead-letter-exchange": "bob-x"}
    text = refusal(alice, lambda ch: ch.queue_declare("alice-dl", arguments=dlx))
    assert text == refused("exchange 'bob-x'")
    # A server-named queue is checked by its made name, which ^alice- does not match.
    text = refusal(alice, lambda ch: ch.queue_declare("", exclusive=True))
    assert re.fullmatch(
        refused("queue 'amq.gen-TOKEN'").replace("TOKEN", "[^']+").replace(".", r"\."), text
    ), text
    channel = alice.channel()
    channel.queue_declare("alice-q", auto_delete=False)
    channel.queue_declare("bob-q", passive=True)  # passive: only whether it exists, no permission
    channel.exchange_declare("bob-x", passive=True)
    channel.exchange_declare("alice-x2", "fanout")
    channel.exchange_delete("alice-x2")
    channel.queue_delete("alice-q")


def test_write_publishes_to_an_exchange_and_binds_to_a_queue(alice: Any) -> None:
    channel = alice.channel()
    channel.queue_declare("alice-w")
    try:
        assert refusal(alice, lambda ch: ch.basic_publish("amq.topic", "a.b", b"x")) == refused(
            "exchange 'amq.topic'"
        )
        assert refusal(alice, lambda ch: ch.basic_publish("", "alice-w", b"x")) == refused(
            "exchange 'amq.default'"
        )
        # queue.bind writes the queue and reads the exchange; exchange.bind writes the destination.
        assert refusal(alice, lambda ch: ch.queue_bind("bob-q", "alice-x", "k")) == refused("queue 'bob-q'")
        assert refusal(alice, lambda ch: ch.queue_bind("alice-w", "bob-x", "k")) == refused(
            "exchange 'bob-x'"
        )
        assert refusal(alice, lambda ch: ch.exchange_bind("bob-x", "alice-x", "k")) == refused(
            "exchange 'bob-x'"
        )
        assert refusal(alice, lambda ch: ch.exchange_bind("alice-x", "bob-x", "k")) == refused(
            "exchange 'bob-x'"
        )
        channel = alice.channel()
        channel.confirm_delivery()
        channel.queue_bind("alice-w", "alice-x", "k")
        channel.basic_publish("alice-x", "k", b"mine")  # confirmed
        method, _, body = channel.basic_get("alice-w", auto_ack=True)
        assert method is not None and body == b"mine"
        channel.queue_unbind("alice-w", "alice-x", "k")
    finally:
        alice.channel().queue_delete("alice-w")


def test_the_other_methods_rabbitmq_lists(alice: Any) -> None:
    assert refusal(alice, lambda ch: ch.basic_publish("bob-x", "k", b"x")) == refused("exchange 'bob-x'")
    assert refusal(alice, lambda ch: ch.queue_unbind("bob-q", "alice-x", "k")) == refused("queue 'bob-q'")
    assert refusal(alice, lambda ch: ch.exchange_unbind("bob-x", "alice-x", "k")) == refused(
        "exchange 'bob-x'"
    )
    # An alternate exchange is written by the messages the exchange cannot route; it is read for them.
    ae = {"alternate-exchange": "bob-x"}
    text = refusal(alice, lambda ch: ch.exchange_declare("alice-ae", "direct", arguments=ae))
    assert text == refused("exchange 'bob-x'")


def test_patterns_are_searched_for_and_an_empty_one_matches_nothing(port: int) -> None:
    """dave: configure 'alice' (no anchor: anywhere in the name), write '' and read '' (nothing)."""
    dave = _connect(port, "dave", "d")
    try:
        channel = dave.channel()
        channel.queue_declare("bob-alice-q")  # 'alice' is found inside the name
        text = refusal(dave, lambda ch: ch.queue_declare("bob-q3"))
        assert text == refused("queue 'bob-q3'", "dave")
        text = refusal(dave, lambda ch: ch.basic_get("bob-alice-q"))
        assert text == refused("queue 'bob-alice-q'", "dave")
        text = refusal(dave, lambda ch: ch.basic_publish("", "bob-alice-q", b"x"))
        assert text == refused("exchange 'amq.default'", "dave")
        dave.channel().queue_delete("bob-alice-q")
    finally:
        dave.close()


def test_read_consumes_gets_and_purges_a_queue(alice: Any) -> None:
    assert refusal(alice, lambda ch: ch.basic_consume("bob-q", lambda *a: None)) == refused("queue 'bob-q'")
    assert refusal(alice, lambda ch: ch.basic_get("bob-q")) == refused("queue 'bob-q'")
    assert refusal(alice, lambda ch: ch.queue_purge("bob-q")) == refused("queue 'bob-q'")
    channel = alice.channel()
    channel.queue_declare("alice-r")
    try:
        assert channel.basic_get("alice-r")[0] is None
        channel.queue_purge("alice-r")
        tag = channel.basic_consume("alice-r", lambda *a: None)
        channel.basic_cancel(tag)
    finally:
        channel.queue_delete("alice-r")


def test_no_permission_no_entry(port: int) -> None:
    with pytest.raises(ProbableAccessDeniedError) as caught:
        _connect(port, "alice", "wonderland", CLOSED)
    assert f"NOT_ALLOWED - access to vhost '{CLOSED}' refused for user 'alice'" in str(caught.value)


def test_topic_permissions_limit_the_routing_keys(port: int) -> None:
    carol = _connect(port, "carol", "c")
    try:

        def topic_refused(key: str) -> str:
            where = f"in exchange 'amq.topic' in vhost '{VHOST}'"
            return f"ACCESS_REFUSED - access to topic '{key}' {where} refused for user 'carol'"

        assert refusal(carol, lambda ch: ch.basic_publish("amq.topic", "bob.x", b"x")) == topic_refused(
            "bob.x"
        )
        queue = carol.channel().queue_declare("", exclusive=True).method.queue
        assert refusal(carol, lambda ch: ch.queue_bind(queue, "amq.topic", "bob.#")) == topic_refused("bob.#")
        assert refusal(carol, lambda ch: ch.queue_bind(queue, "amq.topic", "#")) == topic_refused("#")
        channel = carol.channel()
        channel.confirm_delivery()
        channel.queue_bind(queue, "amq.topic", "carol.#")
        channel.basic_publish("amq.topic", "carol.news", b"mine")
        method, _, body = channel.basic_get(queue, auto_ack=True)
        assert method is not None and body == b"mine"
        # Only topic exchanges: a direct exchange takes any key.
        channel.exchange_declare("carol-direct", "direct")
        channel.basic_publish("carol-direct", "bob.x", b"x")
        channel.exchange_delete("carol-direct")
    finally:
        carol.close()


def test_aio_pika_and_kombu_get_the_same_refusals(port: int) -> None:
    aio_pika = pytest.importorskip("aio_pika")
    kombu = pytest.importorskip("kombu")
    amqp_exceptions = pytest.importorskip("amqp.exceptions")
    aiormq_exceptions = pytest.importorskip("aiormq.exceptions")
    url = f"amqp://alice:wonderland@127.0.0.1:{port}/{VHOST}"

    async def with_aio_pika() -> None:
        connection = await aio_pika.connect(url)
        async with connection:
            channel = await connection.channel()
            with pytest.raises(aiormq_exceptions.ChannelAccessRefused) as caught:
                await channel.declare_queue("bob-aio")
            assert refused("queue 'bob-aio'") in str(caught.value)
            channel = await connection.channel()
            queue = await channel.declare_queue("alice-aio", auto_delete=True)
            await queue.delete()

    asyncio.run(with_aio_pika())
    with kombu.Connection(url) as connection:
        with pytest.raises(amqp_exceptions.AccessRefused) as caught:
            kombu.Queue("bob-kombu", channel=connection.channel()).declare()
        assert caught.value.reply_text == refused("queue 'bob-kombu'")
        mine = kombu.Queue("alice-kombu", channel=connection.channel(), auto_delete=True)
        mine.declare()
        mine.delete()
