"""AMQP 1.0 distribution modes and released deliveries against a real server (issue 22).

- A ``distribution-mode copy`` receiver on a queue browses: it sees what the queue holds, removes
  nothing, and its settlements change nothing (the next browser and a consumer see it all).
- A queue receiver that asks for ``move`` or for no mode is answered ``move``.
- ``released`` is not a failed attempt: the message comes back with the same delivery-count and
  can be released any number of times without reaching max_attempts (3 on this server);
  ``modified`` with delivery-failed counts.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

proton = pytest.importorskip("proton")

from proton import Delivery, Message, Terminus  # noqa: E402
from proton.reactor import Copy, LinkOption, Move  # noqa: E402
from proton.utils import BlockingConnection, BlockingReceiver  # noqa: E402

from tests.interop.conftest import BOTH_STORAGES  # noqa: E402
from tests.support.amqp1 import (  # noqa: E402
    body_str,
    close_link,
)
from tests.support.names import unique  # noqa: E402

pytestmark = BOTH_STORAGES  # a shared node's browser reads the database (issue 46)


@pytest.fixture
def conn(amqp1_url: str) -> Iterator[BlockingConnection]:
    c = BlockingConnection(amqp1_url, timeout=10)
    try:
        yield c
    finally:
        c.close()


def send(conn: BlockingConnection, address: str, bodies: list[str]) -> None:
    sender = conn.create_sender(address)
    for body in bodies:
        sender.send(Message(body=body))
    close_link(sender)


def drain(receiver: BlockingReceiver, wait: float = 0.5) -> list[str]:
    got = []
    while True:
        try:
            got.append(body_str(receiver.receive(timeout=wait)))
        except proton.Timeout:
            return got
        receiver.accept()


def test_copy_receiver_browses_and_changes_nothing(conn: BlockingConnection) -> None:
    address = f"$queue/{unique('browse')}"
    send(conn, address, ["a", "b", "c"])
    first = conn.create_receiver(address, credit=10, options=Copy())
    assert first.link.remote_source.distribution_mode == Terminus.DIST_MODE_COPY
    assert drain(first) == ["a", "b", "c"]  # accepted: a browser's settlement changes nothing
    send(conn, address, ["d"])
    assert drain(first) == ["d"]  # a browser sees what arrives too
    close_link(first)
    second = conn.create_receiver(address, credit=10, options=Copy())
    assert drain(second) == ["a", "b", "c", "d"]
    close_link(second)
    consumer = conn.create_receiver(address, credit=10)
    assert consumer.link.remote_source.distribution_mode == Terminus.DIST_MODE_MOVE
    assert drain(consumer) == ["a", "b", "c", "d"]
    close_link(consumer)
    third = conn.create_receiver(address, credit=10, options=Copy())
    assert drain(third, 0.3) == []  # the consumer's accepts did take them


def test_modes_not_done_are_answered_move(conn: BlockingConnection) -> None:
    address = f"$queue/{unique('modes')}"
    asked: list[LinkOption | None] = [Move(), None]
    for option in asked:
        receiver = conn.create_receiver(address, credit=1, options=option)
        assert receiver.link.remote_source.distribution_mode == Terminus.DIST_MODE_MOVE
        close_link(receiver)


def fail(receiver: BlockingReceiver) -> None:
    """Settle the next received message as ``modified`` with ``delivery-failed``."""
    assert receiver.fetcher is not None
    delivery = receiver.fetcher.unsettled.popleft()
    delivery.local.failed = True
    delivery.update(Delivery.MODIFIED)
    delivery.settle()


def test_released_is_not_a_failed_attempt(conn: BlockingConnection) -> None:
    """In the shared mode too, where a message handed back is claimed again from its stored row."""
    address = f"$queue/{unique('released')}"
    send(conn, address, ["work"])
    receiver = conn.create_receiver(address, credit=1)
    seen: list[int] = []
    for _ in range(6):  # twice max_attempts: never dead-lettered, never counted
        message = receiver.receive(timeout=5)
        assert body_str(message) == "work"
        seen.append(message.delivery_count)
        # released, and modified without delivery-failed: back unchanged
        receiver.release(delivered=len(seen) % 2 == 0)
    counts = []
    for _ in range(2):
        message = receiver.receive(timeout=5)
        counts.append(message.delivery_count)
        fail(receiver)  # modified, delivery-failed: an attempt
    message = receiver.receive(timeout=5)
    counts.append(message.delivery_count)
    assert counts == [0, 1, 2]
    fail(receiver)  # the third failed attempt: max_attempts is 3
    close_link(receiver)
    assert seen == [0] * 6
    letters = conn.create_receiver(address.replace("$queue/", "$queue/$dlq/"), credit=5)
    assert drain(letters) == ["work"]
    close_link(letters)
