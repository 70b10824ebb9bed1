"""What idle sessions cost the MQTT front end (issue 47): offline sessions expire from a heap of
their deadlines (MqttFrontEnd._expiring), so the housekeeping looks at the due ones only and the heap
stays bounded however often sessions come and go; subscriptions alike share their options."""

from __future__ import annotations

from trimaran.broker.core import Broker
from trimaran.config import Settings
from trimaran.mqtt import handler
from trimaran.mqtt.handler import MqttEndpoint, MqttFrontEnd
from trimaran.mqtt.packets import SubscriptionOptions, granted_options


def _offline(front: MqttFrontEnd, client_id: str) -> MqttEndpoint:
    endpoint = front.endpoints[client_id] = MqttEndpoint(front, client_id, 5)
    endpoint.expiry_interval = 10
    return endpoint


def test_only_the_last_deadline_of_a_session_counts_and_the_heap_stays_bounded() -> None:
    front = MqttFrontEnd(Broker(), Settings())
    sessions = [_offline(front, f"c{i}") for i in range(100)]
    for round_ in range(100):  # each session goes offline again and again, later each time
        for endpoint in sessions:
            front._expire_at(endpoint, 1000.0 + round_)
    assert len(front._expiring) <= 2 * len(front.endpoints) + 1024 + 1
    front._housekeeping(1050.0)  # past the first deadlines, not the last
    assert len(front.endpoints) == 100
    front._expire_at(sessions[0], 1000.0)  # offline once more, with an early expiry
    front._housekeeping(1050.0)
    assert "c0" not in front.endpoints and len(front.endpoints) == 99
    front._housekeeping(1100.0)
    assert front.endpoints == {}
    assert front._expiring == []


def test_subscriptions_alike_share_their_options_up_to_a_bound() -> None:
    assert granted_options(1, True, False, 2) is granted_options(1, True, False, 2)
    assert granted_options(1) == SubscriptionOptions(1) and granted_options(1) is not granted_options(2)
    assert granted_options(7) is not granted_options(7)  # not a valid set: made, not kept
    packet = SubscriptionOptions(1)
    first = handler._route_options(packet, None, None, None)
    assert handler._route_options(packet, None, None, None) is first
    assert handler._route_options(packet, 5, "g", None) == handler._route_options(packet, 5, "g", None)
    checked = handler._route_options(packet, None, None, lambda topic: True)
    assert checked is not first and checked.reads is not None
    kept = len(handler._ROUTE_OPTIONS)
    try:
        for identifier in range(handler.ROUTE_OPTIONS_KEPT + 10):  # a client's own identifiers
            handler._route_options(packet, identifier + 1000, None, None)
        assert kept <= len(handler._ROUTE_OPTIONS) == handler.ROUTE_OPTIONS_KEPT
    finally:
        handler._ROUTE_OPTIONS.clear()  # the rest of the run shares options again
