"""The AMQP 0.9.1 front end on the connection runtime, with a real client (pika) over a socket."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.amqp091 import serving

pika = pytest.importorskip("pika")


@pytest.fixture
def port(tmp_path: Path) -> Iterator[int]:
    with serving(tmp_path) as bound:
        yield bound


def connect(port: int) -> Any:
    params = pika.ConnectionParameters("127.0.0.1", port, heartbeat=0, blocked_connection_timeout=5)
    return pika.BlockingConnection(params)


def test_publish_with_confirms_then_consume_and_ack(port: int) -> None:
    with connect(port) as connection:
        channel = connection.channel()
        channel.queue_declare("work", durable=True)
        channel.confirm_delivery()
        for i in range(20):
            channel.basic_publish("", "work", f"m{i}".encode(), mandatory=True)
        channel.basic_qos(prefetch_count=5)
        got: list[bytes] = []
        for method, _props, body in channel.consume("work", inactivity_timeout=2):
            if method is None:
                break
            got.append(body)
            channel.basic_ack(method.delivery_tag)
            if len(got) == 20:
                break
        channel.cancel()
        assert got == [f"m{i}".encode() for i in range(20)]
        assert channel.queue_declare("work", passive=True).method.message_count == 0


def test_channel_error_leaves_the_connection_usable(port: int) -> None:
    with connect(port) as connection:
        bad = connection.channel()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as caught:
            bad.queue_declare("missing", passive=True)
        assert caught.value.reply_code == 404
        good = connection.channel()
        good.queue_declare("here")
        good.basic_publish("", "here", b"x")
        _method, _props, body = good.basic_get("here", auto_ack=True)
        assert body == b"x"


def test_a_second_connection_sees_what_the_first_published(port: int) -> None:
    with connect(port) as first:
        channel = first.channel()
        channel.queue_declare("shared")
        channel.confirm_delivery()
        channel.basic_publish("", "shared", b"hello")
    with connect(port) as second:
        channel = second.channel()
        method, _props, body = channel.basic_get("shared", auto_ack=False)
        assert body == b"hello" and not method.redelivered
        channel.basic_ack(method.delivery_tag)


def test_a_publishers_kept_routes_follow_binds_unbinds_and_deletes(port: int) -> None:
    """A connection keeps where its keys went (Amqp091Conn.routes); another connection's binds,
    unbinds and exchange delete take effect on its very next publish."""
    with connect(port) as admin, connect(port) as publisher:
        setup = admin.channel()
        setup.exchange_declare("fleet", "topic")
        for queue in ("q1", "q2"):
            setup.queue_declare(queue)
        setup.queue_bind("q1", "fleet", "k.*")
        out = publisher.channel()
        out.confirm_delivery()

        def publish_and_count(body: bytes) -> tuple[int, int]:
            out.basic_publish("fleet", "k.1", body)
            return tuple(setup.queue_declare(q, passive=True).method.message_count for q in ("q1", "q2"))  # type: ignore[return-value]

        assert publish_and_count(b"1") == (1, 0)
        setup.queue_bind("q2", "fleet", "k.#")
        assert publish_and_count(b"2") == (2, 1)
        setup.queue_unbind("q1", "fleet", "k.*")
        assert publish_and_count(b"3") == (2, 2)
        setup.queue_delete("q2")
        setup.queue_declare("q2")  # the same name again, not bound
        assert publish_and_count(b"4") == (2, 0)
        # A headers exchange routes by the headers: the same key goes where each message's say.
        setup.exchange_declare("by-headers", "headers")
        setup.queue_bind("q2", "by-headers", "", arguments={"x-match": "all", "to": "q2"})
        for headers in ({"to": "q2"}, {"to": "elsewhere"}, None, {"to": "q2"}):
            out.basic_publish("by-headers", "k.1", b"h", pika.BasicProperties(headers=headers))
        assert setup.queue_declare("q2", passive=True).method.message_count == 2
        setup.exchange_delete("fleet")
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as caught:
            out.basic_publish("fleet", "k.1", b"5")
        assert caught.value.reply_code == 404


# -- RabbitMQ's rules (issue 22) ------------------------------------------------------------------


def test_unbind_of_a_missing_queue_or_exchange_is_unbind_ok(port: int) -> None:
    with connect(port) as connection:
        channel = connection.channel()
        channel.queue_unbind("gone-queue", "amq.direct", "k")
        channel.exchange_declare("src", "direct")
        channel.exchange_unbind("gone-exchange", "src", "k")
        channel.exchange_unbind("src", "gone-exchange", "k")
        channel.queue_declare("still-here")  # the channel is still open
        assert channel.is_open


def test_immediate_publish_closes_the_channel_with_540(port: int) -> None:
    with connect(port) as connection:
        channel = connection.channel()
        channel.queue_declare("imm")
        # pika's API has no immediate flag any more: the frames it would send.
        publish = pika.spec.Basic.Publish(exchange="", routing_key="imm", immediate=True)
        channel._impl._send_method(publish, (pika.spec.BasicProperties(), b"x"))
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as caught:
            channel.queue_declare("imm", passive=True)
        assert caught.value.reply_code == 540
        assert "immediate=true" in caught.value.reply_text
        assert connection.channel().queue_declare("imm", passive=True).method.message_count == 0


def test_a_consumer_without_qos_has_no_hidden_window(port: int) -> None:
    with connect(port) as connection:
        channel = connection.channel()
        channel.queue_declare("many")
        for i in range(1500):
            channel.basic_publish("", "many", b"%d" % i)
        tags = []
        for method, _props, _body in channel.consume("many", inactivity_timeout=2):
            if method is None:
                break
            tags.append(method.delivery_tag)  # none acknowledged
            if len(tags) == 1500:
                break
        assert len(tags) == 1500
        channel.basic_ack(tags[-1], multiple=True)


def test_properties_are_delivered_as_published(port: int) -> None:
    with connect(port) as connection:
        channel = connection.channel()
        channel.queue_declare("props")
        channel.basic_publish("", "props", b"a", pika.BasicProperties(expiration="60000"))
        channel.basic_publish("", "props", b"b", pika.BasicProperties(content_type="text/plain"))
        _m, first, _b = channel.basic_get("props", auto_ack=True)
        _m, second, _b = channel.basic_get("props", auto_ack=True)
        assert first.expiration == "60000"  # not the time left
        assert second.delivery_mode is None and second.content_type == "text/plain"


def test_queue_declare_equivalence(port: int) -> None:
    with connect(port) as connection:
        channel = connection.channel()
        channel.queue_declare("eq", arguments={"x-max-length": 10})
        channel.queue_declare("eq", arguments={"x-max-length": 10})  # the same: fine
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as caught:
            channel.queue_declare("eq", arguments={"x-max-length": 20})
        assert caught.value.reply_code == 406 and "'x-max-length'" in caught.value.reply_text
        channel = connection.channel()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as caught:
            channel.queue_declare("eq", auto_delete=True, arguments={"x-max-length": 10})
        assert caught.value.reply_code == 406 and "'auto_delete'" in caught.value.reply_text
        channel = connection.channel()
        channel.queue_declare("mine", exclusive=True)
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as caught:
            channel.queue_declare("mine")  # its own connection, another exclusive flag
        assert caught.value.reply_code == 405
        assert connection.channel().queue_declare("mine", exclusive=True).method.queue == "mine"


def test_direct_reply_to(port: int) -> None:
    """RPC over amq.rabbitmq.reply-to: the requester consumes the pseudo-queue (no-ack), publishes
    with reply_to set to it; the server's reply reaches the requester's channel without a queue."""
    with connect(port) as client, connect(port) as server:
        requests = server.channel()
        requests.queue_declare("rpc")
        caller = client.channel()
        assert caller.queue_declare("amq.rabbitmq.reply-to", passive=True).method.message_count == 0
        replies: list[tuple[bytes, str | None]] = []
        caller.basic_consume(
            "amq.rabbitmq.reply-to",
            lambda _ch, _m, props, body: replies.append((body, props.correlation_id)),
            auto_ack=True,
        )
        caller.basic_publish(
            "", "rpc", b"2+2", pika.BasicProperties(reply_to="amq.rabbitmq.reply-to", correlation_id="c1")
        )
        method, props, body = None, None, b""
        for _ in range(50):
            method, props, body = requests.basic_get("rpc", auto_ack=True)
            if method is not None:
                break
            server.sleep(0.02)
        assert body == b"2+2" and props.reply_to.startswith("amq.rabbitmq.reply-to.")
        requests.basic_publish(
            "", props.reply_to, b"4", pika.BasicProperties(correlation_id=props.correlation_id)
        )
        for _ in range(50):
            client.process_data_events(time_limit=0.05)
            if replies:
                break
        assert replies == [(b"4", "c1")]


def test_reply_to_without_a_reply_consumer_is_refused(port: int) -> None:
    with connect(port) as connection:
        channel = connection.channel()
        channel.queue_declare("rpc2")
        channel.basic_publish("", "rpc2", b"x", pika.BasicProperties(reply_to="amq.rabbitmq.reply-to"))
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as caught:
            channel.queue_declare("rpc2", passive=True)
        assert caught.value.reply_code == 406


def test_an_in_memory_queue_that_goes_writes_nothing_and_a_durable_one_forgets_its_bindings(
    port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only bindings between durable ends are stored, so only theirs are deleted from SQL: a client's
    exclusive reply queue costs no transaction when its connection closes."""
    from trimaran.storage.amqp_store import AmqpStore

    forgotten: list[list[str]] = []
    real = AmqpStore.forget

    def spy(self: AmqpStore, bindings: Any = (), exchanges: Any = (), *, vhost: str = "/") -> None:
        bindings = list(bindings)
        forgotten.append([b.destination for b in bindings])
        real(self, bindings, exchanges, vhost=vhost)

    monkeypatch.setattr(AmqpStore, "forget", spy)
    with connect(port) as connection:
        channel = connection.channel()
        channel.exchange_declare("logs", "fanout", durable=True)
        reply = channel.queue_declare("", exclusive=True).method.queue
        channel.queue_bind(reply, "logs")
        channel.queue_declare("kept", durable=True)
        channel.queue_bind("kept", "logs")
    with connect(port) as connection:  # the exclusive queue went with the first connection
        channel = connection.channel()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker):
            channel.queue_declare(reply, passive=True)
    assert forgotten == []
    with connect(port) as connection:
        connection.channel().queue_delete("kept")
    assert forgotten == [["kept"]]
