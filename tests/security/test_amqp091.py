"""AMQP 0.9.1 (pika) in the one permission model: configure/read/write on ``$queue/<name>``, topics
through ``amq.topic``, ``403 ACCESS_REFUSED`` closing the channel, exclusive queues owned by their
connection whatever protocol asks."""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.security.conftest import PASSWORDS
from tests.security.test_guard import NOT_AUTHORIZED, code, login
from tests.support.paho import Endpoints
from tests.support.server import RunningServer

pika = pytest.importorskip("pika")
from pika.exceptions import ChannelClosedByBroker  # noqa: E402


def amqp(server: RunningServer, user: str, password: str | None = None) -> Any:
    credentials = pika.PlainCredentials(user, PASSWORDS[user] if password is None else password)
    params = pika.ConnectionParameters(
        "127.0.0.1", server.ports["amqp"], credentials=credentials, connection_attempts=1
    )
    return pika.BlockingConnection(params)


@pytest.fixture
def open_as(secure_server: RunningServer) -> Iterator[Callable[[str], Any]]:
    opened: list[Any] = []

    def make(user: str) -> Any:
        connection = amqp(secure_server, user)
        opened.append(connection)
        return connection

    yield make
    for connection in opened:
        if connection.is_open:
            connection.close()


def refused(call: Callable[[], object]) -> tuple[int, str]:
    with pytest.raises(ChannelClosedByBroker) as caught:
        call()
    return caught.value.reply_code, caught.value.reply_text


def test_wrong_password_and_unknown_user_are_refused(secure_server: RunningServer) -> None:
    with pytest.raises(pika.exceptions.ProbableAuthenticationError):
        amqp(secure_server, "alice", "wrong")
    with pytest.raises(pika.exceptions.ProbableAuthenticationError):
        amqp(secure_server, "bob", "")


def test_configure_read_and_write_on_other_users_queues_refused(open_as: Callable[[str], Any]) -> None:
    bob = open_as("bob").channel()
    bob.queue_declare("invoices", durable=True)
    bob.queue_declare("payroll", durable=True)
    alice = open_as("alice")
    attacks: list[Callable[[Any], object]] = [
        lambda ch: ch.queue_purge("invoices"),
        lambda ch: ch.queue_delete("invoices"),
        lambda ch: ch.queue_delete("$dlq/payroll"),
        lambda ch: ch.queue_declare("invoices", durable=True),
        lambda ch: ch.queue_bind("invoices", "amq.topic", "alice.#"),
        lambda ch: ch.basic_get("invoices"),
        lambda ch: ch.basic_consume("payroll", lambda *a: None),
        lambda ch: ch.queue_declare("invoices", passive=True),
    ]
    for attack in attacks:
        channel = alice.channel()
        reply_code, text = refused(lambda ch=channel, a=attack: a(ch))
        assert reply_code == 403 and "ACCESS_REFUSED" in text
    assert alice.is_open  # a channel error: the connection stays
    assert bob.queue_declare("invoices", passive=True).method.queue == "invoices"


def test_refusals_read_as_rabbitmqs(open_as: Callable[[str], Any]) -> None:
    """RabbitMQ's words, as RabbitMQ 3.10 sends them for a queue, an exchange and a topic (its topic
    authorisation) the user may not touch: the resource, the vhost and the user."""
    alice = open_as("alice")
    mine = alice.channel().queue_declare("", exclusive=True).method.queue
    attacks: list[tuple[Callable[[Any], object], str]] = [
        (lambda ch: ch.queue_declare("invoices", durable=True), "queue 'invoices'"),
        (lambda ch: ch.exchange_declare("bob-x", "fanout"), "exchange 'bob-x'"),
        (
            lambda ch: ch.queue_bind(mine, "amq.topic", "bob.*.inbox"),
            "topic 'bob.*.inbox' in exchange 'amq.topic'",
        ),
        (lambda ch: ch.basic_publish("amq.topic", "bob.x", b"x"), "topic 'bob.x' in exchange 'amq.topic'"),
    ]
    for attack, what in attacks:
        channel = alice.channel()
        channel.confirm_delivery()
        assert refused(lambda ch=channel, a=attack: a(ch)) == (
            403,
            f"ACCESS_REFUSED - access to {what} in vhost '/' refused for user 'alice'",
        )


def test_publishes_map_to_queue_and_topic_writes(open_as: Callable[[str], Any]) -> None:
    alice = open_as("alice")
    for exchange, key in (
        ("", "invoices"),
        ("", "$queue/invoices"),  # the cross-protocol name through the default exchange
        ("", "$queue/invoices/some-key"),
        ("amq.topic", "bob.private.inbox"),
        ("amq.topic", "$SYS.broker.x"),
    ):
        channel = alice.channel()
        channel.confirm_delivery()
        reply_code, _ = refused(lambda ch=channel, e=exchange, k=key: ch.basic_publish(e, k, b"x"))
        assert reply_code == 403
    # Allowed: her own queue, her own topics.
    channel = alice.channel()
    channel.confirm_delivery()
    channel.queue_declare("alice-work", durable=True)
    channel.queue_bind("alice-work", "amq.topic", "alice.#")
    channel.basic_publish("amq.topic", "alice.note", b"via topic")
    channel.basic_publish("", "alice-work", b"direct")
    channel.basic_publish("", "$queue/alice-work", b"cross")
    got = [channel.basic_get("alice-work", auto_ack=True)[2] for _ in range(3)]
    assert sorted(got) == [b"cross", b"direct", b"via topic"]


def test_binding_to_other_users_topics_is_reading_them(open_as: Callable[[str], Any]) -> None:
    """A server-named exclusive queue is the connection's own, but binding it to ``bob.#`` would
    read bob's topics: refused."""
    channel = open_as("alice").channel()
    mine = channel.queue_declare("", exclusive=True).method.queue
    channel.queue_bind(mine, "amq.topic", "public.#")  # she may read public/#
    reply_code, _ = refused(lambda: channel.queue_bind(mine, "amq.topic", "bob.#"))
    assert reply_code == 403


def test_a_wildcard_binding_of_ones_own_queue_reads_only_ones_topics(open_as: Callable[[str], Any]) -> None:
    """Mosquitto's rule for an exclusive queue (it lives no longer than its binder): '#' is bound,
    and each message is checked against her rules. A queue that outlives its binder (here a durable
    shared one) must be readable whole: '#' is refused there."""
    alice = open_as("alice").channel()
    mine = alice.queue_declare("", exclusive=True).method.queue
    alice.queue_bind(mine, "amq.topic", "#")
    bob = open_as("bob").channel()
    bob.confirm_delivery()
    for key in ("bob.private.inbox", "public.news", "bob.other"):
        bob.basic_publish("amq.topic", key, key.encode())
    time.sleep(0.3)
    got = []
    while (message := alice.basic_get(mine, auto_ack=True))[0] is not None:
        got.append(message[2])
    assert got == [b"public.news"]
    shared = open_as("alice").channel()
    shared.queue_declare("alice-work", durable=True)
    reply_code, _ = refused(lambda: shared.queue_bind("alice-work", "amq.topic", "#"))
    assert reply_code == 403


def test_custom_exchanges_need_configure_and_leave_out_unwritable_queues(
    open_as: Callable[[str], Any],
) -> None:
    bob = open_as("bob").channel()
    bob.exchange_declare("bob-x", "fanout")
    bob.queue_declare("invoices", durable=True)
    bob.queue_purge("invoices")
    bob.queue_bind("invoices", "bob-x")
    alice = open_as("alice")
    channel = alice.channel()
    reply_code, _ = refused(lambda: channel.exchange_declare("alice-x", "fanout"))
    assert reply_code == 403
    channel = alice.channel()
    channel.confirm_delivery()
    channel.basic_publish("bob-x", "", b"forged")  # routed to a queue she may not write: left out
    assert bob.queue_declare("invoices", passive=True).method.message_count == 0


def test_a_dead_letter_exchange_needs_write_on_it(open_as: Callable[[str], Any]) -> None:
    bob = open_as("bob").channel()
    bob.queue_declare("invoices", durable=True)
    bob.queue_purge("invoices")
    alice = open_as("alice")
    # Her own queue, dead-lettering into bob's through the default exchange: refused at declare,
    # before any message of hers could be posted there by the server.
    channel = alice.channel()
    forged = {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "invoices"}
    reply_code, reply_text = refused(lambda: channel.queue_declare("alice-work", arguments=forged))
    assert reply_code == 403 and "access to exchange 'amq.default'" in reply_text
    # bob may write bob-x: his queue dead-letters through it.
    bob.exchange_declare("bob-x", "fanout")
    bob.queue_declare("bob-dl", arguments={"x-dead-letter-exchange": "bob-x"})
    assert bob.queue_declare("invoices", passive=True).method.message_count == 0


def test_exclusive_queue_is_locked_for_every_other_connection(
    open_as: Callable[[str], Any], smqtt: Endpoints, secure_server: RunningServer
) -> None:
    owner = open_as("carol").channel()
    name = owner.queue_declare("", exclusive=True).method.queue
    assert name.startswith("amq.gen-")
    owner.basic_publish("", name, b"reply")
    other = open_as("carol").channel()  # the same user, another connection
    reply_code, _ = refused(lambda: other.basic_consume(name, lambda *a: None))
    assert reply_code == 405  # RESOURCE_LOCKED
    mqtt = login(smqtt, "carol")  # carol may read every $queue/: only the ownership refuses
    try:
        assert [code(c) for c in mqtt.subscribe(f"$queue/{name}", qos=1)] == [NOT_AUTHORIZED]
        mqtt.expect_none()
    finally:
        mqtt.disconnect()
    amqp1_refusal = _amqp1_receive_condition(secure_server, "carol", name)
    if amqp1_refusal is not None:
        assert amqp1_refusal == "amqp:resource-locked"
    # A browser (distribution-mode copy) reads without taking: still another connection's queue.
    assert _amqp1_receive_condition(secure_server, "carol", name, browse=True) in (
        None,
        "amqp:resource-locked",
    )
    assert owner.basic_get(name, auto_ack=True)[2] == b"reply"
    # Its name is not listed on the unauthenticated /metrics (per-queue series are opt-in).
    metrics_url = f"http://127.0.0.1:{secure_server.ports['http']}/metrics"
    with urllib.request.urlopen(metrics_url, timeout=10) as answer:
        metrics = answer.read().decode()
    assert name not in metrics and "invoices" not in metrics
    assert 'trimaran_auth_refusals_total{protocol="mqtt"}' in metrics


def _amqp1_receive_condition(
    server: RunningServer, user: str, queue: str, *, browse: bool = False
) -> str | None:
    """The condition of the refused attach of an AMQP 1.0 receiver, a browser with ``browse``
    (None: proton is missing)."""
    try:
        from proton.reactor import Copy
        from proton.utils import BlockingConnection, LinkDetached
    except ImportError:
        return None
    url = f"amqp://{user}:{PASSWORDS[user]}@127.0.0.1:{server.ports['amqp']}"
    connection = BlockingConnection(url, timeout=10, allowed_mechs="PLAIN")
    try:
        with pytest.raises(LinkDetached) as caught:
            connection.create_receiver(f"queue://{queue}", options=Copy() if browse else None)
        return str(caught.value.condition)
    finally:
        connection.close()
