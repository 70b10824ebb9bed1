"""ServerConnection against a real client (pika) over a real socket on port 0.

The "broker" here is a few lines of test code answering the methods pika waits for; the point is
that the protocol layer (handshake, tune, heartbeats negotiated, multi-frame content both ways,
confirms, close) is what a real client expects.
"""

import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.amqp091.amqp091_client import one_by_one
from trimaran.amqp091 import spec
from trimaran.amqp091.connection import ConnectionState, ServerConnection
from trimaran.amqp091.events import (
    AuthenticationRequested,
    ConnectionClosed,
    ContentReceived,
    Event,
    MethodReceived,
)
from trimaran.amqp091.properties import BasicProperties

pika = pytest.importorskip("pika")


def _serve(listener: socket.socket, events: list[Event], errors: list[BaseException]) -> None:
    try:
        sock, _ = listener.accept()
        sock.settimeout(10)
        conn = ServerConnection(now=time.monotonic())
        stored: list[tuple[BasicProperties, bytes]] = []
        with sock:
            while conn.state is not ConnectionState.CLOSED:
                data = sock.recv(65536)
                if data:
                    conn.receive_data(data, time.monotonic())
                else:
                    conn.receive_eof()
                while (read := conn.next_event()) is not None:
                    for ev in one_by_one(read):
                        events.append(ev)
                        _act(conn, ev, stored)
                sock.sendall(conn.data_to_send())
    except BaseException as exc:  # reported to the test thread
        errors.append(exc)


def _act(conn: ServerConnection, ev: Event, stored: list[tuple[BasicProperties, bytes]]) -> None:
    """What a broker would do with ``ev``: publishes stored and confirmed, the rest answered."""
    if isinstance(ev, AuthenticationRequested):
        if ev.password == "pw":
            conn.accept_authentication()
        else:
            conn.reject_authentication("bad password")
    elif isinstance(ev, ContentReceived):
        stored.append((ev.properties, ev.body))
        conn.send_method(ev.channel, spec.BasicAck(len(stored)))
    elif isinstance(ev, MethodReceived):
        m, ch = ev.method, ev.channel
        if isinstance(m, spec.QueueDeclare):
            conn.send_method(ch, spec.QueueDeclareOk(m.queue, len(stored), 0))
        elif isinstance(m, spec.ConfirmSelect):
            conn.send_method(ch, spec.ConfirmSelectOk())
        elif isinstance(m, spec.BasicConsume):
            conn.send_method(ch, spec.BasicConsumeOk(m.consumer_tag))
            for tag, (props, body) in enumerate(stored, 1):
                deliver = spec.BasicDeliver(m.consumer_tag, tag, False, "", m.queue)
                conn.send_content(ch, deliver, props, body)
        elif isinstance(m, spec.BasicCancel):
            conn.send_method(ch, spec.BasicCancelOk(m.consumer_tag))
        elif isinstance(m, spec.QueueDelete):
            conn.close_channel(ch, spec.NOT_FOUND, "NOT_FOUND - no queue 'nope'", 50, 40)


@pytest.fixture
def server() -> Iterator[tuple[int, list[Event], list[BaseException]]]:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    events: list[Event] = []
    errors: list[BaseException] = []
    thread = threading.Thread(target=_serve, args=(listener, events, errors), daemon=True)
    thread.start()
    yield listener.getsockname()[1], events, errors
    thread.join(10)
    listener.close()
    assert not errors, errors


def _params(port: int, password: str = "pw") -> Any:
    return pika.ConnectionParameters(
        "127.0.0.1",
        port,
        credentials=pika.PlainCredentials("guest", password),
        heartbeat=30,
        connection_attempts=1,
        socket_timeout=5,
        blocked_connection_timeout=5,
    )


def test_pika_publish_confirm_consume_close(server: tuple[int, list[Event], list[BaseException]]) -> None:
    port, events, _errors = server
    conn = pika.BlockingConnection(_params(port))
    ch = conn.channel()
    ch.queue_declare("q")
    ch.confirm_delivery()
    body = bytes(range(256)) * 1200  # 307200 bytes: three body frames at frame_max 131072
    props = pika.BasicProperties(content_type="text/plain", delivery_mode=2, headers={"a": 1, "b": ["x", 2]})
    ch.basic_publish("", "q", body, props)  # waits for our basic.ack (confirm)
    received = []

    def on_message(chan: object, method: object, properties: Any, data: bytes) -> None:
        received.append((properties, data))
        ch.stop_consuming()

    ch.basic_consume("q", on_message, auto_ack=True)
    ch.start_consuming()
    # A channel exception raised by the server reaches pika as such.
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        ch.queue_delete("nope")
    assert info.value.reply_code == spec.NOT_FOUND
    conn.close()

    ((got_props, got_body),) = received
    assert got_body == body
    assert got_props.content_type == "text/plain" and got_props.headers == {"a": 1, "b": ["x", 2]}
    (auth,) = [e for e in events if isinstance(e, AuthenticationRequested)]
    assert (auth.username, auth.password) == ("guest", "pw")
    (pub,) = [e for e in events if isinstance(e, ContentReceived)]
    assert pub.body == body and pub.properties.delivery_mode == 2
    assert isinstance(events[-1], ConnectionClosed) and events[-1].by_peer


def test_pika_sees_authentication_failure(server: tuple[int, list[Event], list[BaseException]]) -> None:
    port, _events, _errors = server
    with pytest.raises(pika.exceptions.ProbableAuthenticationError):
        pika.BlockingConnection(_params(port, password="wrong"))
