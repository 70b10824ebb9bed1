"""``$queue/`` through the default exchange with ``queues.auto_create`` off (issue 18): refused
the protocol's way, a nack and (when mandatory) a basic.return, never confirmed and dropped; a
queue that exists takes the publish, with the key after its name as routing key."""

from __future__ import annotations

from pathlib import Path

import pika
import pytest

from tests.support.amqp091 import serving
from trimaran.config import QueueSettings, Settings


def test_queue_namespace_with_auto_create_off(tmp_path: Path) -> None:
    settings = Settings(queues=QueueSettings(auto_create=False))
    with serving(tmp_path, settings) as port:
        conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
        try:
            channel = conn.channel()
            channel.confirm_delivery()
            with pytest.raises(pika.exceptions.NackError):
                channel.basic_publish("", "$queue/absent", b"x")
            with pytest.raises(pika.exceptions.NackError):  # returned too; the nack decides
                channel.basic_publish("", "$queue/absent", b"x", mandatory=True)
            channel.queue_declare("present", durable=True)
            channel.basic_publish("", "$queue/present/eu/paris", b"kept", mandatory=True)
            method, _props, body = channel.basic_get("present", auto_ack=True)
            assert body == b"kept" and method.routing_key == "$queue/present/eu/paris"
            with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
                channel.queue_declare("absent", passive=True)
            assert err.value.reply_code == 404  # the refused publishes made no queue
        finally:
            if conn.is_open:
                conn.close()
