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
