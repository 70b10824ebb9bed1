"""RabbitMQ's reply codes for what a client gets wrong, with pika over a real socket."""

from __future__ import annotations

from collections.abc import Iterator

import pika
import pytest
from pika.adapters.blocking_connection import BlockingChannel

from tests.support.server import RunningServer


@pytest.fixture
def params(amqp_server: RunningServer) -> pika.ConnectionParameters:
    return pika.ConnectionParameters("127.0.0.1", amqp_server.ports["amqp"])


@pytest.fixture
def conn(params: pika.ConnectionParameters) -> Iterator[pika.BlockingConnection]:
    c = pika.BlockingConnection(params)
    yield c
    if c.is_open:
        c.close()


def channel_error(conn: pika.BlockingConnection, action) -> int:  # type: ignore[no-untyped-def]
    ch = conn.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
        action(ch)
    return int(err.value.reply_code)


def test_bad_password_is_403(amqp_server: RunningServer) -> None:
    creds = pika.PlainCredentials("alice", "wrong")
    with pytest.raises(pika.exceptions.ProbableAuthenticationError) as err:
        pika.BlockingConnection(
            pika.ConnectionParameters("127.0.0.1", amqp_server.ports["amqp"], credentials=creds)
        )
    assert "403" in str(err.value)
    good = pika.PlainCredentials("alice", "wonderland")
    pika.BlockingConnection(
        pika.ConnectionParameters("127.0.0.1", amqp_server.ports["amqp"], credentials=good)
    ).close()


def test_unknown_vhost_is_530(amqp_server: RunningServer) -> None:
    with pytest.raises(pika.exceptions.ProbableAccessDeniedError) as err:
        pika.BlockingConnection(
            pika.ConnectionParameters("127.0.0.1", amqp_server.ports["amqp"], virtual_host="elsewhere")
        )
    assert "(530)" in str(err.value)


def test_channel_errors(conn: pika.BlockingConnection) -> None:
    assert channel_error(conn, lambda ch: ch.queue_declare("missing", passive=True)) == 404
    assert (
        channel_error(
            conn, lambda ch: ch.basic_publish("no-such-exchange", "k", b"x") or ch.queue_declare("")
        )
        == 404
    )
    assert channel_error(conn, lambda ch: ch.queue_declare("amq.mine")) == 403
    ch = conn.channel()
    ch.queue_declare("transient-q", durable=False)
    assert channel_error(conn, lambda c: c.queue_declare("transient-q", durable=True)) == 406
    assert channel_error(conn, lambda c: c.basic_ack(99) or c.queue_declare("")) == 406
    ch.exchange_declare("typed", "direct")
    assert channel_error(conn, lambda c: c.exchange_declare("typed", "fanout")) == 406
    assert channel_error(conn, lambda c: c.queue_bind("transient-q", "missing-exchange")) == 404
    assert conn.is_open  # channel exceptions leave the connection alone


def test_unknown_exchange_type_is_a_connection_error_503(conn: pika.BlockingConnection) -> None:
    ch = conn.channel()
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as err:
        ch.exchange_declare("x1", "nonsense-type")
    assert err.value.reply_code == 503


def test_delete_if_unused_and_if_empty(conn: pika.BlockingConnection) -> None:
    ch = conn.channel()
    ch.queue_declare("busy")
    ch.basic_publish("", "busy", b"x")
    assert channel_error(conn, lambda c: c.queue_delete("busy", if_empty=True)) == 406
    consumer = conn.channel()
    consumer.basic_consume("busy", lambda *a: None)
    assert channel_error(conn, lambda c: c.queue_delete("busy", if_unused=True)) == 406
    assert ch.queue_purge("busy").method.message_count >= 0
    assert ch.queue_delete("busy").method.message_count == 0


def test_mandatory_unroutable_is_returned_312(conn: pika.BlockingConnection) -> None:
    ch = conn.channel()
    ch.confirm_delivery()
    with pytest.raises(pika.exceptions.UnroutableError) as err:
        ch.basic_publish("amq.direct", "nobody-bound", b"lost", mandatory=True)
    returned = err.value.messages[0]
    assert returned.method.reply_code == 312 and returned.method.reply_text == "NO_ROUTE"


def test_server_cancels_consumer_when_queue_deleted(conn: pika.BlockingConnection) -> None:
    ch = conn.channel()
    ch.queue_declare("doomed")
    cancelled: list[object] = []
    ch.add_on_cancel_callback(lambda frame: cancelled.append(frame))
    ch.basic_consume("doomed", lambda *a: None)
    conn.channel().queue_delete("doomed")
    conn.process_data_events(0.5)
    assert cancelled


def test_get_nack_reject_recover(conn: pika.BlockingConnection) -> None:
    ch: BlockingChannel = conn.channel()
    ch.queue_declare("g")
    assert ch.basic_get("g") == (None, None, None)
    for body in (b"a", b"b"):
        ch.basic_publish("", "$queue/g", body)  # the queue-topic spelling of the key works too
    method, _, body = ch.basic_get("g")
    assert body == b"a" and not method.redelivered
    ch.basic_nack(method.delivery_tag, requeue=True)
    method, _, body = ch.basic_get("g")
    assert body == b"a" and method.redelivered
    ch.basic_reject(method.delivery_tag, requeue=False)  # no dead-letter exchange: dropped
    method, _, body = ch.basic_get("g")
    assert body == b"b"
    ch.basic_recover(requeue=True)
    method, _, body = ch.basic_get("g")
    assert body == b"b" and method.redelivered
    ch.basic_ack(method.delivery_tag)
    assert ch.queue_declare("g", passive=True).method.message_count == 0


def test_dead_letter_and_ttl_arguments(conn: pika.BlockingConnection) -> None:
    ch = conn.channel()
    ch.queue_declare("dlq")
    ch.queue_declare("work", arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dlq"})
    ch.basic_publish("", "work", b"bad")
    method, _, _ = ch.basic_get("work")
    ch.basic_reject(method.delivery_tag, requeue=False)
    _, _, body = ch.basic_get("dlq", auto_ack=True)
    assert body == b"bad"
    ch.queue_declare(
        "short", arguments={"x-message-ttl": 50, "x-max-length": 2, "x-overflow": "reject-publish"}
    )
    ch.confirm_delivery()
    ch.basic_publish("", "short", b"1")
    ch.basic_publish("", "short", b"2")
    with pytest.raises(pika.exceptions.NackError):
        ch.basic_publish("", "short", b"3")  # full: the confirm is a nack


def test_transactions(conn: pika.BlockingConnection) -> None:
    ch = conn.channel()
    ch.queue_declare("txq")
    ch.tx_select()
    ch.basic_publish("", "txq", b"kept")
    ch.tx_commit()
    ch.basic_publish("", "txq", b"dropped")
    ch.tx_rollback()
    assert ch.queue_declare("txq", passive=True).method.message_count == 1
