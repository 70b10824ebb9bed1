"""AMQP 1.0 (python-qpid-proton) in the one permission model: ``amqp:unauthorized-access`` on the
attach of a link the rules refuse, and on each message an anonymous-relay link sends where its
sender may not write."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.security.conftest import PASSWORDS
from tests.support.server import RunningServer

proton = pytest.importorskip("proton")
from proton import Message  # noqa: E402
from proton.utils import BlockingConnection, LinkDetached, SendException  # noqa: E402

UNAUTHORIZED = "amqp:unauthorized-access"


def open_as(server: RunningServer, user: str, password: str | None = None) -> BlockingConnection:
    secret = PASSWORDS[user] if password is None else password
    url = f"amqp://{user}:{secret}@127.0.0.1:{server.ports['amqp']}"
    return BlockingConnection(url, timeout=10, allowed_mechs="PLAIN")


@pytest.fixture
def alice(secure_server: RunningServer) -> Iterator[BlockingConnection]:
    connection = open_as(secure_server, "alice")
    yield connection
    connection.close()


def condition_of_refused(attach: Any) -> str:
    with pytest.raises(LinkDetached) as caught:
        attach()
    return str(caught.value.condition)


def test_bad_password_is_refused(secure_server: RunningServer) -> None:
    with pytest.raises(proton.ConnectionException):
        open_as(secure_server, "alice", "wrong").create_receiver("topic://alice/x")


def test_receivers_and_senders_the_rules_refuse(alice: BlockingConnection) -> None:
    assert condition_of_refused(lambda: alice.create_receiver("topic://bob/private/inbox")) == UNAUTHORIZED
    assert condition_of_refused(lambda: alice.create_receiver("topic://bob/#")) == UNAUTHORIZED
    assert condition_of_refused(lambda: alice.create_receiver("queue://invoices")) == UNAUTHORIZED
    assert condition_of_refused(lambda: alice.create_sender("topic://bob/private/inbox")) == UNAUTHORIZED
    assert condition_of_refused(lambda: alice.create_sender("topic://$SYS/broker/version")) == UNAUTHORIZED
    assert condition_of_refused(lambda: alice.create_sender("queue://payroll")) == UNAUTHORIZED


def test_allowed_links_carry_messages(alice: BlockingConnection) -> None:
    receiver = alice.create_receiver("topic://alice/#")
    sender = alice.create_sender("topic://alice/notes")
    sender.send(Message(body="hello"))
    got = receiver.receive(timeout=5)
    assert got.body == "hello"
    receiver.accept()


def test_anonymous_relay_refuses_each_message_it_may_not_send(alice: BlockingConnection) -> None:
    relay = alice.create_sender(None)
    receiver = alice.create_receiver("topic://alice/relay")
    with pytest.raises(SendException) as caught:
        relay.send(Message(address="topic://bob/private/inbox", body="forged"))
    assert caught.value.state == proton.Delivery.REJECTED
    relay.send(Message(address="topic://alice/relay", body="mine"))  # the link stays usable
    assert receiver.receive(timeout=5).body == "mine"
    receiver.accept()


def test_a_wildcard_receiver_gets_only_the_topics_its_user_may_read(
    alice: BlockingConnection, secure_server: RunningServer
) -> None:
    """Mosquitto's rule through the one rule set: ``topic://#`` is attached (some topics under it
    are alice's) and each delivery is checked against her rules."""
    receiver = alice.create_receiver("topic://#")
    bob = open_as(secure_server, "bob")
    try:
        sender = bob.create_sender(None)
        for topic in ("bob/private/inbox", "public/news", "bob/other"):
            sender.send(Message(address=f"topic://{topic}", body=topic))
        got = receiver.receive(timeout=5)
        assert got.body == "public/news"
        receiver.accept()
        with pytest.raises(proton.Timeout):
            receiver.receive(timeout=1)
    finally:
        bob.close()
