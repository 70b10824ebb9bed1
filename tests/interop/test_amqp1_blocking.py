"""AMQP 1.0 with python-qpid-proton's blocking API (proton.utils) against a real server process."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

proton = pytest.importorskip("proton")

from proton import ConnectionException, Delivery, LinkException, Message, symbol  # noqa: E402
from proton.reactor import AtMostOnce, LinkOption  # noqa: E402
from proton.utils import (  # noqa: E402
    BlockingConnection,
    BlockingReceiver,
    LinkDetached,
    SendException,
    SyncRequestResponse,
)

from tests.interop.conftest import BOTH_STORAGES  # noqa: E402
from tests.support.amqp1 import body_bytes, body_str, close_link  # noqa: E402
from tests.support.names import unique  # noqa: E402

# A shared node's queue is in the database: a drain waits for a claim made for its credit (issue 46).
pytestmark = BOTH_STORAGES

if TYPE_CHECKING:
    from proton._utils import Fetcher  # not re-exported by proton.utils


class Properties(LinkOption):
    """Attach properties (consumer-group, stream-offset)."""

    def __init__(self, **props: Any) -> None:
        self.props = {symbol(k.replace("_", "-")): v for k, v in props.items()}

    def apply(self, link: Any) -> None:
        link.properties = self.props


@pytest.fixture
def conn(amqp1_url: str) -> Iterator[BlockingConnection]:
    c = BlockingConnection(amqp1_url, timeout=10)
    try:
        yield c
    finally:
        c.close()


def capabilities(terminus: Any) -> list[str]:
    data = terminus.capabilities
    data.rewind()
    if not data.next():
        return []
    value = data.get_object()
    return [str(v) for v in getattr(value, "elements", [value])]


def receive(receiver: BlockingReceiver, timeout: float = 5) -> Message:
    return receiver.receive(timeout=timeout)


def fetcher(receiver: BlockingReceiver) -> Fetcher:
    """The receiver's prefetch buffer (present whenever no handler was given to create_receiver)."""
    assert receiver.fetcher is not None
    return receiver.fetcher


def expect_nothing(receiver: BlockingReceiver, wait: float = 0.3) -> None:
    with pytest.raises(proton.Timeout):
        receiver.receive(timeout=wait)


# -- queues -------------------------------------------------------------------------------------------


def test_queue_round_trip_keeps_the_message(conn: BlockingConnection) -> None:
    q = unique("orders")
    sender = conn.create_sender(q)
    sent = Message(
        body={"id": 7, "items": ["a", "b"]},
        id="m-1",
        subject="order",
        content_type="application/x-order",
        correlation_id="c-9",
        reply_to="$queue/replies",
        properties={"region": "eu", "n": 3},
        ttl=60,
        durable=True,
    )
    sender.send(sent)
    receiver = conn.create_receiver(q)
    got = receive(receiver)
    receiver.accept()
    assert got.body == sent.body
    assert got.id == "m-1"
    assert got.subject == "order"
    assert got.content_type == "application/x-order"
    assert got.correlation_id == "c-9"
    assert got.reply_to == "$queue/replies"
    assert got.properties == {"region": "eu", "n": 3}
    assert got.durable
    assert 0 < got.ttl <= 60
    expect_nothing(receiver)


def test_queue_address_forms_and_answered_capability(conn: BlockingConnection) -> None:
    q = unique("forms")
    for address in (q, f"queue://{q}", f"$queue/{q}"):
        conn.create_sender(address).send(Message(body=address))
    receiver = conn.create_receiver(f"queue://{q}")
    assert capabilities(receiver.link.remote_source) == ["queue"]
    got = [receive(receiver).body for _ in range(3)]
    receiver.accept()
    assert got == [q, f"queue://{q}", f"$queue/{q}"]


def test_messages_stay_in_order_and_are_acked(conn: BlockingConnection, amqp1_url: str) -> None:
    q = unique("ordered")
    sender = conn.create_sender(q)
    for i in range(20):
        sender.send(Message(body=i))
    receiver = conn.create_receiver(q, credit=5)
    got = []
    for _ in range(20):
        got.append(receive(receiver).body)
        receiver.accept()
    assert got == list(range(20))
    close_link(receiver)
    # Accepted means acked: a new consumer finds the queue empty.
    again = conn.create_receiver(q, credit=5)
    expect_nothing(again)


def test_a_receiver_without_credit_leaves_messages_to_others(amqp1_url: str) -> None:
    q = unique("credit")
    idle = BlockingConnection(amqp1_url, timeout=10)
    busy = BlockingConnection(amqp1_url, timeout=10)
    try:
        idle_receiver = idle.create_receiver(q, credit=0)
        busy_receiver = busy.create_receiver(q, credit=0)
        sender = busy.create_sender(q)
        for i in range(5):
            sender.send(Message(body=i))
        got = []
        for _ in range(5):
            got.append(receive(busy_receiver).body)
            busy_receiver.accept()
        assert got == list(range(5))
        assert not fetcher(idle_receiver).has_message
        expect_nothing(idle_receiver)
    finally:
        busy.close()
        idle.close()


def test_drain_delivers_what_is_there_then_uses_up_the_credit(conn: BlockingConnection) -> None:
    q = unique("drain")
    sender = conn.create_sender(q)
    for i in range(3):
        sender.send(Message(body=i))
    receiver = conn.create_receiver(q, credit=0)
    receiver.link.drain(10)
    conn.wait(lambda: not receiver.link.draining() and receiver.link.credit == 0, timeout=5)
    assert fetcher(receiver).has_message == 3
    assert [fetcher(receiver).pop().body for _ in range(3)] == [0, 1, 2]
    receiver.accept()


def test_drain_on_a_topic_with_nothing_to_send(conn: BlockingConnection) -> None:
    receiver = conn.create_receiver(f"topic://{unique('t')}/x", credit=0)
    receiver.link.drain(4)
    conn.wait(lambda: not receiver.link.draining() and receiver.link.credit == 0, timeout=5)
    assert not fetcher(receiver).has_message


def test_rejected_goes_to_the_dead_letter_queue(conn: BlockingConnection) -> None:
    q = unique("rej")
    conn.create_sender(q).send(Message(body="poison"))
    receiver = conn.create_receiver(q)
    assert receive(receiver).body == "poison"
    receiver.reject()
    dlq = conn.create_receiver(f"$queue/$dlq/{q}")
    assert receive(dlq).body == "poison"
    dlq.accept()
    expect_nothing(receiver)


def test_released_comes_back_at_once(conn: BlockingConnection) -> None:
    q = unique("rel")
    conn.create_sender(q).send(Message(body="again"))
    receiver = conn.create_receiver(q)
    first = receive(receiver)
    assert first.delivery_count == 0
    receiver.release(delivered=False)
    second = receive(receiver)
    assert second.body == "again"
    assert second.delivery_count == 0  # released: not a failed attempt (AMQP 1.0, 3.4.4)
    receiver.accept()


def test_modified_is_retried_then_dead_lettered(conn: BlockingConnection) -> None:
    q = unique("mod")
    conn.create_sender(q).send(Message(body="flaky"))
    receiver = conn.create_receiver(q)
    counts = []
    for _ in range(3):  # max_attempts is 3 in the test server
        got = receive(receiver)
        counts.append(got.delivery_count)
        # modified with delivery-failed (proton's release(delivered=True) leaves it false)
        assert receiver.fetcher is not None
        delivery = receiver.fetcher.unsettled.popleft()
        delivery.local.failed = True
        delivery.update(Delivery.MODIFIED)
        delivery.settle()
    assert counts == [0, 1, 2]
    dlq = conn.create_receiver(f"$queue/$dlq/{q}")
    assert receive(dlq).body == "flaky"
    dlq.accept()


def test_at_most_once_receiver_gets_settled_messages(conn: BlockingConnection) -> None:
    q = unique("amo")
    conn.create_sender(q, options=AtMostOnce()).send(Message(body="once"))
    receiver = conn.create_receiver(q, options=AtMostOnce())
    assert receive(receiver).body == "once"
    close_link(receiver)
    expect_nothing(conn.create_receiver(q))


def test_consumer_groups_each_see_every_message(conn: BlockingConnection) -> None:
    q = unique("groups")
    a = conn.create_receiver(q, credit=10, name="a", options=Properties(consumer_group="a"))
    b = conn.create_receiver(q, credit=10, name="b", options=Properties(consumer_group="b"))
    sender = conn.create_sender(q)
    for i in range(3):
        sender.send(Message(body=i))
    assert [receive(a).body for _ in range(3)] == [0, 1, 2]
    assert [receive(b).body for _ in range(3)] == [0, 1, 2]
    a.accept()
    b.accept()


def test_stream_start_positions(conn: BlockingConnection) -> None:
    sender = conn.create_sender("events")  # declared as a stream in the test server
    tag = unique("e")
    for i in range(3):
        sender.send(Message(body=f"{tag}-{i}"))
    first = conn.create_receiver(
        "events", credit=100, name="first", options=Properties(stream_offset="first")
    )
    seen = []
    while True:
        try:
            seen.append(receive(first, 1).body)
        except proton.Timeout:
            break
    assert seen[-3:] == [f"{tag}-{i}" for i in range(3)]
    last = conn.create_receiver(
        "events", credit=10, name="last", options=Properties(consumer_group=tag, stream_offset="last")
    )
    assert receive(last).body == f"{tag}-2"
    expect_nothing(last)


def test_messages_larger_than_the_frame_size(conn: BlockingConnection) -> None:
    q = unique("big")
    body = bytes(range(256)) * 400  # 100 KiB; the server's max-frame-size is 4096
    conn.create_sender(q).send(Message(body=body))
    receiver = conn.create_receiver(q)
    got = receive(receiver)
    receiver.accept()
    assert body_bytes(got) == body  # got is still alive here


def test_message_over_the_size_limit_detaches_the_link(conn: BlockingConnection) -> None:
    sender = conn.create_sender(unique("huge"))
    with pytest.raises(LinkDetached) as info:
        sender.send(Message(body=b"x" * 1_100_000))
    assert info.value.condition == "amqp:link:message-size-exceeded"


def test_dynamic_receiver_request_reply(conn: BlockingConnection, amqp1_url: str) -> None:
    service = unique("service")
    server = BlockingConnection(amqp1_url, timeout=10)
    try:
        requests = server.create_receiver(service, credit=1)
        replies = server.create_sender(None)  # anonymous relay: each reply goes to its 'to'
        client = SyncRequestResponse(conn, service)
        assert client.reply_to.startswith("$queue/tmp-")

        import threading

        def respond() -> None:
            request = requests.receive(timeout=10)
            requests.accept()
            replies.send(
                Message(
                    address=request.reply_to,
                    correlation_id=request.correlation_id,
                    body=body_str(request).upper(),
                )
            )

        worker = threading.Thread(target=respond)
        worker.start()
        try:
            response = client.call(Message(body="ping"))
        finally:
            worker.join(10)
        assert response.body == "PING"
    finally:
        server.close()


# -- topics -------------------------------------------------------------------------------------------


def test_topic_fan_out_with_wildcards(conn: BlockingConnection) -> None:
    root = unique("sensors")
    plus = conn.create_receiver(f"topic://{root}/+/temp", credit=10)
    hash_ = conn.create_receiver(f"topic://{root}/#", credit=10)
    assert capabilities(plus.link.remote_source) == ["topic"]
    sender = conn.create_sender(f"topic://{root}/kitchen/temp")
    sender.send(Message(body="21.5"))
    assert receive(plus).body == "21.5"
    assert receive(hash_).body == "21.5"
    plus.accept()
    hash_.accept()


def test_topic_messages_without_subscribers_are_dropped(conn: BlockingConnection) -> None:
    topic = f"topic://{unique('nobody')}"
    conn.create_sender(topic).send(Message(body="lost"))
    receiver = conn.create_receiver(topic, credit=1)
    expect_nothing(receiver)


# -- refusals -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "address",
    ["bad/name", "queue://", "topic://a/#/b", "$queue/q/$ack"],
)
def test_garbage_receiver_address_is_refused(conn: BlockingConnection, address: str) -> None:
    with pytest.raises(LinkDetached) as info:
        conn.create_receiver(address).receive(timeout=2)
    assert info.value.condition == "amqp:invalid-field"


def test_publish_to_a_wildcard_topic_is_refused(conn: BlockingConnection) -> None:
    with pytest.raises(LinkException):
        conn.create_sender("topic://a/+").send(Message(body="x"))


def test_anonymous_relay_refuses_a_bad_to(conn: BlockingConnection) -> None:
    sender = conn.create_sender(None)
    with pytest.raises(SendException) as info:
        sender.send(Message(address="no/such+", body="x"))
    assert info.value.state == Delivery.REJECTED


# -- SASL ---------------------------------------------------------------------------------------------


def test_sasl_plain_accepted(amqp1_url: str) -> None:
    c = BlockingConnection(amqp1_url, timeout=10, user="alice", password="wonderland", allowed_mechs="PLAIN")
    try:
        q = unique("plain")
        c.create_sender(q).send(Message(body="hi"))
        r = c.create_receiver(q)
        assert receive(r).body == "hi"
        r.accept()
    finally:
        c.close()


def test_sasl_plain_wrong_password_refused(amqp1_url: str) -> None:
    with pytest.raises(ConnectionException):
        BlockingConnection(amqp1_url, timeout=10, user="alice", password="nope", allowed_mechs="PLAIN")


def test_unsettled_deliveries_return_when_the_link_closes(conn: BlockingConnection) -> None:
    q = unique("back")
    conn.create_sender(q).send(Message(body="held"))
    first = conn.create_receiver(q, name="first")
    assert receive(first).body == "held"
    close_link(first)  # neither accepted nor released
    second = conn.create_receiver(q, name="second")
    got = receive(second)
    assert got.body == "held"
    assert got.delivery_count == 1
    second.accept()


class MaxMessageSize(LinkOption):
    def __init__(self, size: int) -> None:
        self.size = size

    def apply(self, link: Any) -> None:
        link.max_message_size = self.size


def test_receiver_max_message_size_is_respected(conn: BlockingConnection) -> None:
    topic = f"topic://{unique('small')}"
    small_topic = conn.create_receiver(topic, credit=5, name="t", options=MaxMessageSize(600))
    q = unique("small")
    small_queue = conn.create_receiver(q, credit=5, name="q", options=MaxMessageSize(600))
    for address in (topic, q):
        sender = conn.create_sender(address)
        sender.send(Message(body=b"x" * 2000))
        sender.send(Message(body=b"ok"))
    # (proton's data bodies live only as long as their Message: keep the messages)
    from_topic, from_queue = receive(small_topic), receive(small_queue)
    assert body_bytes(from_topic) == b"ok"
    assert body_bytes(from_queue) == b"ok"
    small_queue.accept()
    # The queue message nobody could take went to the dead-letter queue.
    dlq = conn.create_receiver(f"$queue/$dlq/{q}")
    dead = receive(dlq)
    assert len(body_bytes(dead)) == 2000
    dlq.accept()


def test_stream_start_by_timestamp_and_a_bad_start(conn: BlockingConnection) -> None:
    import time

    sender = conn.create_sender("events")
    sender.send(Message(body="before"))
    time.sleep(0.05)
    since = int(time.time() * 1000)
    tag = unique("ts")
    for i in range(2):
        sender.send(Message(body=f"{tag}-{i}"))
    by_time = conn.create_receiver(
        "events",
        credit=5,
        name="by-time",
        options=Properties(consumer_group=tag, stream_offset=f"timestamp:{since}"),
    )
    assert [receive(by_time).body for _ in range(2)] == [f"{tag}-0", f"{tag}-1"]
    expect_nothing(by_time)
    with pytest.raises(LinkDetached) as info:
        conn.create_receiver(
            "events",
            credit=1,
            name="bad",
            options=Properties(consumer_group=unique("b"), stream_offset=[1, 2]),
        )
    assert info.value.condition == "amqp:invalid-field"
