"""Dead letters from in-memory queues into durable ones survive a restart, on the real server.

An AMQP 0.9.1 non-durable queue with ``x-dead-letter-exchange`` / ``x-dead-letter-routing-key`` into a
durable queue; an AMQP 1.0 dynamic (in-memory) receiver queue whose dead-letter queue, set by the
queue defaults, is durable; an MQTT 5 consumer rejecting through ``$queue/<q>/$reject`` from an
AMQP-declared in-memory queue. Each test rejects (or nacks, or drops the consumer) past the limit,
stops the server, starts it again on the same SQLite file and finds the dead letter there.
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pika
import pytest
from pika.adapters.blocking_connection import BlockingChannel

from tests.interop.conftest import amqp_server_args
from tests.support.paho import V5, Endpoints, PacketTypes, close_all, connect, props, user_props
from tests.support.server import RunningServer

DEAD = "dead-letters"


@contextmanager
def server_in(workdir: Path, env: dict[str, str] | None = None) -> Iterator[RunningServer]:
    """A server on ``workdir``'s SQLite file, stopped cleanly (exit code 0) afterwards."""
    server = RunningServer(amqp_server_args(), cwd=workdir, env=env).start()
    try:
        yield server
    finally:
        assert server.stop() == 0, server.output()


@contextmanager
def channel(server: RunningServer) -> Iterator[BlockingChannel]:
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", server.ports["amqp"]))
    try:
        yield conn.channel()
    finally:
        if conn.is_open:
            conn.close()


def declare_work_queue(ch: BlockingChannel, name: str, **arguments: Any) -> None:
    """A durable dead-letter queue and an in-memory (non-durable) queue dead-lettering into it
    through the default exchange."""
    ch.queue_declare(DEAD, durable=True)
    args = {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": DEAD, **arguments}
    ch.queue_declare(name, durable=False, arguments=args)
    ch.basic_publish("", name, b"poison", pika.BasicProperties(headers={"order": "7"}))


def depth(ch: BlockingChannel, name: str) -> int:
    count: int = ch.queue_declare(name, passive=True).method.message_count
    return count


def wait_depth(
    ch: BlockingChannel, name: str, want: int, timeout: float = 5.0, pump: Callable[[], None] | None = None
) -> None:
    """Poll the depth (a nowait settlement reaches the DLQ a commit later); ``pump`` keeps another
    blocking client's I/O going meanwhile."""
    end = time.monotonic() + timeout
    while (now := depth(ch, name)) != want:
        assert time.monotonic() < end, f"{name} holds {now}, not {want}"
        if pump is not None:
            pump()
        ch.connection.sleep(0.02)


def assert_dead_letter_after_restart(
    workdir: Path, source: str, reason: str, env: dict[str, str] | None = None
) -> None:
    with server_in(workdir, env) as again, channel(again) as ch:
        method, properties, body = ch.basic_get(DEAD, auto_ack=False)
        assert method is not None, "the dead letter was lost by the restart"
        assert body == b"poison"
        headers = properties.headers or {}
        assert headers.get("x-dead-letter-queue") == source
        assert str(headers.get("x-dead-letter-reason")).startswith(reason)
        assert headers.get("order") == "7"
        ch.basic_ack(method.delivery_tag)
        assert depth(ch, DEAD) == 0


def reject(ch: BlockingChannel, name: str) -> None:
    method, _props, _body = ch.basic_get(name, auto_ack=False)
    assert method is not None
    ch.basic_reject(method.delivery_tag, requeue=False)


def nack_past_the_delivery_limit(ch: BlockingChannel, name: str) -> None:
    for _ in range(2):  # x-delivery-limit 1: the second nack dead-letters it
        method, _props, _body = ch.basic_get(name, auto_ack=False)
        assert method is not None
        ch.basic_nack(method.delivery_tag, requeue=True)


@pytest.mark.parametrize(
    ("settle", "arguments", "reason"),
    [
        (reject, {}, "rejected"),
        (nack_past_the_delivery_limit, {"x-delivery-limit": 1}, "max_attempts"),
    ],
    ids=["reject", "nack-limit"],
)
def test_amqp091_in_memory_queue_dead_letters_into_a_durable_queue(
    tmp_path: Path,
    settle: Callable[[BlockingChannel, str], None],
    arguments: dict[str, Any],
    reason: str,
) -> None:
    with server_in(tmp_path) as server, channel(server) as ch:
        declare_work_queue(ch, "work", **arguments)
        settle(ch, "work")
        wait_depth(ch, DEAD, 1)
    assert_dead_letter_after_restart(tmp_path, "work", reason)


def test_amqp091_dead_letter_exchange_into_a_durable_queue(tmp_path: Path) -> None:
    with server_in(tmp_path) as server, channel(server) as ch:
        ch.exchange_declare("dlx", "direct", durable=True)
        ch.queue_declare(DEAD, durable=True)
        ch.queue_bind(DEAD, "dlx", "failed")
        args = {"x-dead-letter-exchange": "dlx", "x-dead-letter-routing-key": "failed"}
        ch.queue_declare("auto", durable=True, auto_delete=True, arguments=args)  # lives in memory
        ch.basic_publish("", "auto", b"poison", pika.BasicProperties(headers={"order": "7"}))
        reject(ch, "auto")
        wait_depth(ch, DEAD, 1)
    assert_dead_letter_after_restart(tmp_path, "auto", "rejected")


def test_amqp091_consumer_gone_at_the_delivery_limit(tmp_path: Path) -> None:
    with server_in(tmp_path) as server:
        with channel(server) as ch:
            declare_work_queue(ch, "work", **{"x-delivery-limit": 0})
        with channel(server) as ch:  # takes the message and goes away without settling it
            method, _props, _body = ch.basic_get("work", auto_ack=False)
            assert method is not None
        with channel(server) as ch:
            wait_depth(ch, DEAD, 1)
            assert depth(ch, "work") == 0
    assert_dead_letter_after_restart(tmp_path, "work", "max_attempts")


def test_amqp1_dynamic_receiver_rejects_into_a_durable_dead_letter_queue(tmp_path: Path) -> None:
    proton = pytest.importorskip("proton")
    from proton.utils import BlockingConnection

    env = {
        "TRIMARAN_QUEUES__DEFAULTS__DEAD_LETTER": DEAD,
        "TRIMARAN_QUEUES__DECLARE": json.dumps([{"name": DEAD}]),
    }
    with server_in(tmp_path, env) as server:
        conn = BlockingConnection(f"127.0.0.1:{server.ports['amqp']}", timeout=10)
        try:
            receiver = conn.create_receiver(None, dynamic=True)
            address = receiver.link.remote_source.address
            assert address is not None and address.startswith("$queue/tmp-")
            conn.create_sender(address).send(proton.Message(body=b"poison", properties={"order": "7"}))
            got = receiver.receive(timeout=5)
            assert got.body == b"poison"
            receiver.reject()

            def pump() -> None:  # a BlockingConnection sends the disposition only while it waits
                with contextlib.suppress(proton.Timeout):
                    conn.wait(lambda: False, timeout=0.02)

            with channel(server) as ch:
                wait_depth(ch, DEAD, 1, pump=pump)
        finally:
            conn.close()
    # Read back over AMQP 0.9.1: an AMQP 1.0 consumer gets an AMQP 1.0 message's original bytes,
    # without the x-dead-letter-* history (see the report).
    assert_dead_letter_after_restart(tmp_path, address.removeprefix("$queue/"), "rejected", env)


def test_mqtt_consumer_rejects_from_an_in_memory_queue_into_a_durable_one(tmp_path: Path) -> None:
    name = f"mem-{uuid.uuid4().hex[:6]}"
    with server_in(tmp_path) as server, channel(server) as ch:
        declare_work_queue(ch, name)
        endpoints = Endpoints("127.0.0.1", server.ports["mqtt"])
        sub = connect(endpoints, version=V5, manual_ack=True)
        try:
            sub.subscribe(f"$queue/{name}", qos=1)
            first = sub.expect(5)
            assert first.payload == b"poison"
            message_id = user_props(first)["x-queue-message-id"]
            sub.client.publish(
                f"$queue/{name}/$reject",
                b"",
                qos=1,
                properties=props(
                    PacketTypes.PUBLISH, UserProperty=[("message-id", message_id), ("reason", "bad order")]
                ),
            )
            wait_depth(ch, DEAD, 1)
        finally:
            close_all(sub)
    assert_dead_letter_after_restart(tmp_path, name, "bad order")
