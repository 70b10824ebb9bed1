"""The broker's event bus: typed subscriptions, cheap guards, listener errors kept from the broker."""

from __future__ import annotations

import pytest

from trimaran.broker.core import Broker
from trimaran.broker.events import (
    CLIENT_CONNECTED,
    EVENT_TYPES,
    MESSAGE_PUBLISHED,
    QUEUE_ACKED,
    BusEvent,
    EventBus,
    expand_patterns,
)
from trimaran.broker.message import PROTOCOL_MQTT, Message


def test_wants_and_publishing_follow_subscriptions() -> None:
    bus = EventBus()
    got: list[BusEvent] = []
    assert not bus.wants(CLIENT_CONNECTED) and not bus.publishing
    off = bus.subscribe(got.append, [CLIENT_CONNECTED, MESSAGE_PUBLISHED])
    assert bus.wants(CLIENT_CONNECTED) and bus.publishing and not bus.wants(QUEUE_ACKED)
    bus.client(CLIENT_CONNECTED, "c1", PROTOCOL_MQTT, "127.0.0.1:5", "alice", session_present=False)
    bus.emit(QUEUE_ACKED, {"queue": "q"})  # nobody listens: not built, not counted
    off()
    assert not bus.wants(CLIENT_CONNECTED) and not bus.publishing
    bus.client(CLIENT_CONNECTED, "c2", PROTOCOL_MQTT, "x", None)
    assert [e.data for e in got] == [
        {
            "client_id": "c1",
            "protocol": "mqtt",
            "address": "127.0.0.1:5",
            "user": "alice",
            "session_present": False,
        }
    ]
    assert bus.emitted == 1 and got[0].seq == 1 and got[0].time_ms > 0


def test_a_failing_listener_is_counted_and_the_others_still_hear() -> None:
    bus = EventBus()
    got: list[BusEvent] = []

    def broken(_event: BusEvent) -> None:
        raise RuntimeError("boom")

    bus.subscribe(broken, [QUEUE_ACKED])
    bus.subscribe(got.append, [QUEUE_ACKED])
    bus.queue(QUEUE_ACKED, "orders", offset=3)
    assert bus.listener_errors == 1
    assert got[0].data == {"queue": "orders", "offset": 3}


def test_broker_publish_emits_message_published_with_payload_beside_data() -> None:
    broker = Broker()
    got: list[BusEvent] = []
    broker.publish(Message("a/b", b"quiet"))  # no listener yet
    broker.events.subscribe(got.append, [MESSAGE_PUBLISHED])
    broker.publish(Message("a/b", b"hi", qos=1, publisher_id="p", protocol=PROTOCOL_MQTT))
    assert len(got) == 1
    event = got[0]
    assert event.topic == "a/b" and event.payload == b"hi"
    assert event.data == {
        "topic": "a/b",
        "qos": 1,
        "retain": False,
        "size": 2,
        "client_id": "p",
        "protocol": "mqtt",
        "subscribers": 0,
    }


def test_patterns() -> None:
    assert expand_patterns(["*"]) == frozenset(EVENT_TYPES)
    assert expand_patterns(["queue.*", CLIENT_CONNECTED]) == {
        "queue.acked",
        "queue.nacked",
        "queue.rejected",
        "queue.dead_lettered",
        "queue.expired",
        CLIENT_CONNECTED,
    }
    with pytest.raises(ValueError, match="unknown event type"):
        expand_patterns(["client.kicked"])
    with pytest.raises(ValueError):
        EventBus().subscribe(lambda e: None, ["nope"])
