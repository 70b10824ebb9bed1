"""AMQP 1.0 local transactions against a real server, with python-qpid-proton's own transaction
API (``container.declare_transaction``, ``Transaction.send / accept / commit / abort``): a
transactional publish is seen only after the commit and never after a rollback; a transactional
accept takes the message off its queue only at the commit, and a rollback puts it back, available
at once and not counted as a failed attempt; both sides in one transaction move together; a
discharge of an unknown transaction fails with ``amqp:transaction:unknown-id``, and one whose
acknowledged delivery went back to its queue with ``amqp:transaction:rollback``."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from typing import Any, cast

import pytest

proton = pytest.importorskip("proton")

from proton import Delivery, Described, Message, Terminus, symbol  # noqa: E402
from proton.handlers import MessagingHandler, TransactionHandler  # noqa: E402
from proton.reactor import ApplicationEvent, Container, EventInjector, LinkOption  # noqa: E402
from proton.utils import BlockingConnection, SendException  # noqa: E402

from tests.support.amqp1 import (  # noqa: E402
    body_str,
    close_link,
)
from tests.support.names import unique  # noqa: E402


class Client(MessagingHandler, TransactionHandler):  # type: ignore[misc]
    """A proton client on the reactor's thread, told what to do by the test's thread (injected
    events) and telling it what happened (``said``)."""

    def __init__(self, url: str) -> None:
        super().__init__(prefetch=0, auto_accept=False)
        self.url = url
        self.said: queue.Queue[tuple[Any, ...]] = queue.Queue()
        self.txn: Any = None
        self.senders: dict[str, Any] = {}
        self.receivers: dict[str, Any] = {}
        self.held: list[Any] = []

    def on_start(self, event: Any) -> None:
        self.container = event.container
        self.conn = event.container.connect(self.url)
        self.said.put(("started",))

    # -- transaction events --
    def on_transaction_declared(self, event: Any) -> None:
        self.txn = event.transaction
        self.said.put(("declared", self.txn.id))

    def on_transaction_declare_failed(self, event: Any) -> None:
        self.said.put(("declare-failed",))

    def on_transaction_committed(self, event: Any) -> None:
        self.said.put(("committed",))

    def on_transaction_aborted(self, event: Any) -> None:
        self.said.put(("aborted",))

    def on_transaction_commit_failed(self, event: Any) -> None:
        condition = event.delivery.remote.condition
        self.said.put(
            (
                "commit-failed",
                condition.name if condition else None,
                condition.description if condition else None,
            )
        )

    # -- deliveries --
    def on_message(self, event: Any) -> None:
        self.held.append(event.delivery)
        self.said.put(("message", body_str(event.message), event.message.delivery_count))

    def on_settled(self, event: Any) -> None:
        if event.link.name in self.senders:
            self.said.put(("settled", event.link.name))

    def on_link_closed(self, event: Any) -> None:
        self.said.put(("link-closed", event.link.name))

    # -- commands (``on_<name>`` for an injected ApplicationEvent named <name>) --
    def on_declare(self, event: Any) -> None:
        self.container.declare_transaction(self.conn, handler=self)

    def on_send(self, event: Any) -> None:
        address, bodies = event.subject
        sender = self.senders.get(address)
        if sender is None:
            sender = self.senders[address] = self.container.create_sender(self.conn, address, name=address)
        for body in bodies:
            self.txn.send(sender, Message(body=body))

    def on_receive(self, event: Any) -> None:
        address, credit = event.subject
        receiver = self.receivers[address] = self.container.create_receiver(
            self.conn, address, name=f"rx-{address}"
        )
        receiver.flow(credit)

    def on_accept_held(self, event: Any) -> None:
        for delivery in self.held:
            self.txn.accept(delivery)
        self.held = []
        self.said.put(("accepted",))

    def on_close_receiver(self, event: Any) -> None:
        self.receivers.pop(event.subject).close()

    def on_commit(self, event: Any) -> None:
        self.txn.commit()

    def on_abort(self, event: Any) -> None:
        self.txn.abort()

    def on_forget_id(self, event: Any) -> None:
        self.txn.id = b"no-such-txn"

    def on_stop(self, event: Any) -> None:
        self.conn.close()
        self.container.stop()


class Driver:
    """The test's end: inject a command, wait for what the client says."""

    def __init__(self, url: str) -> None:
        self.client = Client(url)
        self.injector = EventInjector()
        self.container = Container(self.client)
        self.container.selectable(self.injector)
        self.thread = threading.Thread(target=self.container.run, daemon=True)
        self.thread.start()
        self.expect("started")

    def do(self, name: str, subject: Any = None) -> None:
        self.injector.trigger(ApplicationEvent(name, subject=subject))

    def expect(self, kind: str, timeout: float = 10) -> tuple[Any, ...]:
        while True:
            said = self.client.said.get(timeout=timeout)
            if said[0] == kind:
                return said
            if said[0] in ("commit-failed", "declare-failed") and kind != said[0]:
                raise AssertionError(f"expected {kind}, got {said}")

    def messages(self, n: int) -> list[tuple[str, int]]:
        return [self.expect("message")[1:] for _ in range(n)]  # type: ignore[misc]

    def declare(self) -> bytes:
        self.do("declare")
        return cast(bytes, self.expect("declared")[1])

    def close(self) -> None:
        self.do("stop")
        self.thread.join(10)


@pytest.fixture
def driver(amqp1_url: str) -> Iterator[Driver]:
    d = Driver(amqp1_url)
    try:
        yield d
    finally:
        d.close()


@pytest.fixture
def plain(amqp1_url: str) -> Iterator[BlockingConnection]:
    c = BlockingConnection(amqp1_url, timeout=10)
    try:
        yield c
    finally:
        c.close()


def take_all(conn: BlockingConnection, address: str, wait: float = 0.5) -> list[tuple[str, int]]:
    """Everything ``address`` holds (accepted), with each message's delivery-count."""
    receiver = conn.create_receiver(address, credit=20, name=unique("check"))
    got = []
    while True:
        try:
            message = receiver.receive(timeout=wait)
        except proton.Timeout:
            break
        got.append((body_str(message), message.delivery_count))
        receiver.accept()
    close_link(receiver)
    return got


def put(conn: BlockingConnection, address: str, bodies: list[str]) -> None:
    sender = conn.create_sender(address, name=unique("put"))
    for body in bodies:
        sender.send(Message(body=body))
    close_link(sender)


def test_transactional_publish_appears_only_at_the_commit(driver: Driver, plain: BlockingConnection) -> None:
    address = f"$queue/{unique('txq')}"
    topic = f"topic://{unique('txt')}"
    watcher = plain.create_receiver(topic, credit=10, name="watcher")
    txn_id = driver.declare()
    assert txn_id
    driver.do("send", (address, ["a", "b"]))
    driver.do("send", (topic, ["t"]))
    driver.expect("settled")
    assert take_all(plain, address, 0.3) == []  # not before the commit
    with pytest.raises(proton.Timeout):
        watcher.receive(timeout=0.3)
    driver.do("commit")
    driver.expect("committed")
    assert take_all(plain, address) == [("a", 0), ("b", 0)]
    assert body_str(watcher.receive(timeout=5)) == "t"
    watcher.accept()


def test_transactional_publish_is_gone_after_a_rollback(driver: Driver, plain: BlockingConnection) -> None:
    address = f"$queue/{unique('txr')}"
    driver.declare()
    driver.do("send", (address, ["c"]))
    driver.expect("settled")
    driver.do("abort")
    driver.expect("aborted")
    assert take_all(plain, address) == []
    driver.declare()  # the connection goes on: a second transaction commits
    driver.do("send", (address, ["d"]))
    driver.expect("settled")
    driver.do("commit")
    driver.expect("committed")
    assert take_all(plain, address) == [("d", 0)]


def test_a_rollback_restores_both_sides(driver: Driver, plain: BlockingConnection) -> None:
    source = f"$queue/{unique('src')}"
    target = f"$queue/{unique('dst')}"
    put(plain, source, ["x", "y"])
    driver.declare()
    driver.do("receive", (source, 2))
    assert driver.messages(2) == [("x", 0), ("y", 0)]
    driver.do("accept_held")
    driver.expect("accepted")
    driver.do("send", (target, ["moved-x", "moved-y"]))
    driver.expect("settled")
    driver.do("abort")
    driver.expect("aborted")
    driver.do("close_receiver", source)
    assert take_all(plain, target) == []
    # back on their queue, available at once and not counted as failed attempts
    assert take_all(plain, source) == [("x", 0), ("y", 0)]


def test_a_commit_moves_both_sides_together(driver: Driver, plain: BlockingConnection) -> None:
    source = f"$queue/{unique('src')}"
    target = f"$queue/{unique('dst')}"
    put(plain, source, ["x", "y", "z"])
    driver.declare()
    driver.do("receive", (source, 2))
    assert [body for body, _ in driver.messages(2)] == ["x", "y"]
    driver.do("accept_held")
    driver.expect("accepted")
    driver.do("send", (target, ["moved"]))
    driver.expect("settled")  # on the wire before the discharge (a new link waits for credit)
    driver.do("commit")
    driver.expect("committed")
    driver.do("close_receiver", source)
    assert take_all(plain, target) == [("moved", 0)]
    assert take_all(plain, source) == [("z", 0)]  # x and y are acknowledged


def test_discharging_an_unknown_transaction_fails(driver: Driver, plain: BlockingConnection) -> None:
    address = f"$queue/{unique('unk')}"
    driver.declare()
    driver.do("send", (address, ["lost"]))
    driver.expect("settled")
    driver.do("forget_id")
    driver.do("commit")
    _kind, condition, description = driver.expect("commit-failed")
    assert condition == "amqp:transaction:unknown-id" and "no-such-txn" in description
    assert take_all(plain, address, 0.3) == []


def test_a_commit_whose_delivery_went_back_rolls_back(driver: Driver, plain: BlockingConnection) -> None:
    source = f"$queue/{unique('src')}"
    target = f"$queue/{unique('dst')}"
    put(plain, source, ["x"])
    driver.declare()
    driver.do("receive", (source, 1))
    driver.messages(1)
    driver.do("accept_held")
    driver.expect("accepted")
    driver.do("send", (target, ["moved"]))
    driver.expect("settled")
    driver.do("close_receiver", source)  # its held delivery goes back to the queue
    driver.expect("link-closed")  # (proton writes a detach after transfers queued with it)
    driver.do("commit")
    _kind, condition, description = driver.expect("commit-failed")
    assert condition == "amqp:transaction:rollback" and "went back to the queue" in description
    assert take_all(plain, target) == []
    assert [body for body, _ in take_all(plain, source)] == ["x"]


class ToCoordinator(LinkOption):  # type: ignore[misc]
    """A plain sender link to the transaction coordinator (no proton transaction object)."""

    def apply(self, link: Any) -> None:
        link.target.type = Terminus.COORDINATOR
        link.target.capabilities.put_object(symbol("amqp:local-transactions"))


def test_the_coordinator_refuses_what_is_not_declare_or_discharge(plain: BlockingConnection) -> None:
    sender = plain.create_sender(None, name="coordinator", options=ToCoordinator())
    assert sender.link.remote_target.type == Terminus.COORDINATOR
    with pytest.raises(SendException) as caught:
        sender.send(Message(body="not a declare"))
    assert caught.value.state == Delivery.REJECTED
    with pytest.raises(SendException):  # a discharge of a transaction never declared
        sender.send(Message(body=Described(symbol("amqp:discharge:list"), [b"nope", False])))
    declared = sender.send(Message(body=Described(symbol("amqp:declare:list"), [None])))
    assert declared.remote_state == 0x33  # declared
    close_link(sender)
