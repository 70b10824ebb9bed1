"""Offline sessions expire from a heap of their deadlines (MqttFrontEnd._expiring): the housekeeping
looks at the due ones only, and the heap stays bounded however often sessions come and go."""

from __future__ import annotations

from trimaran.broker.core import Broker
from trimaran.config import Settings
from trimaran.mqtt.handler import MqttEndpoint, MqttFrontEnd
from trimaran.mqtt.session import Session


def _offline(front: MqttFrontEnd, client_id: str) -> MqttEndpoint:
    endpoint = front.endpoints[client_id] = MqttEndpoint(front, Session(client_id, expiry_interval=10), 5)
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
