"""AMQP 1.0 with python-qpid-proton's reactor API (MessagingHandler + Container) over real sockets."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

proton = pytest.importorskip("proton")

from proton import Message  # noqa: E402
from proton.handlers import MessagingHandler  # noqa: E402
from proton.reactor import AtMostOnce, Container  # noqa: E402


class SendReceive(MessagingHandler):
    """Send ``count`` messages to ``address`` and receive them on the same connection."""

    def __init__(
        self, url: str, address: str, count: int, *, settled: bool = False, prefetch: int = 50
    ) -> None:
        super().__init__(prefetch=prefetch)
        self.url = url
        self.address = address
        self.count = count
        self.settled = settled
        self.sent = 0
        self.accepted = 0
        self.received: list[Any] = []
        self.redelivered = 0
        self.errors: list[str] = []

    def on_start(self, event: Any) -> None:
        conn = event.container.connect(self.url)
        options = AtMostOnce() if self.settled else None
        event.container.create_receiver(conn, self.address, options=options)
        event.container.create_sender(conn, self.address, options=options)

    def on_sendable(self, event: Any) -> None:
        while event.sender.credit and self.sent < self.count:
            event.sender.send(Message(id=self.sent, body={"n": self.sent, "pad": "x" * 100}))
            self.sent += 1

    def on_accepted(self, event: Any) -> None:
        self.accepted += 1

    def on_message(self, event: Any) -> None:
        self.received.append(event.message.body["n"])
        if len(self.received) == self.count:
            event.connection.close()

    def on_link_error(self, event: Any) -> None:
        self.errors.append(str(event.link.remote_condition))
        event.connection.close()

    def on_transport_error(self, event: Any) -> None:
        self.errors.append(str(event.transport.condition))


def run(handler: MessagingHandler, timeout: float = 20) -> None:
    container = Container(handler)
    container.timeout = timeout
    container.run()


def test_queue_send_and_receive_unsettled(amqp1_url: str) -> None:
    handler = SendReceive(amqp1_url, f"r-{uuid.uuid4().hex[:8]}", 300)
    run(handler)
    assert not handler.errors
    assert handler.received == list(range(300))
    assert handler.accepted == 300  # every queue publish got its disposition after the commit


def test_queue_send_and_receive_presettled(amqp1_url: str) -> None:
    handler = SendReceive(amqp1_url, f"$queue/s-{uuid.uuid4().hex[:8]}", 300, settled=True)
    run(handler)
    assert not handler.errors
    assert handler.received == list(range(300))


def test_topic_send_and_receive(amqp1_url: str) -> None:
    class Topic(SendReceive):
        def on_link_opened(self, event: Any) -> None:
            # Send only once the subscription exists (topic messages are not stored).
            if event.receiver is not None:
                self.subscribed = True

        def on_sendable(self, event: Any) -> None:
            if getattr(self, "subscribed", False):
                super().on_sendable(event)

    handler = Topic(amqp1_url, f"topic://reactor/{uuid.uuid4().hex[:8]}", 200, prefetch=500)
    run(handler)
    assert not handler.errors
    assert handler.received == list(range(200))
