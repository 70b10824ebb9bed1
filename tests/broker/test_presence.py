"""broker.presence: the registry, the $SYS client counters and the client.* events move together."""

from __future__ import annotations

from types import SimpleNamespace

from trimaran.broker.clients import ClientInfo
from trimaran.broker.core import Broker
from trimaran.broker.events import CLIENT_CONNECTED, CLIENT_DISCONNECTED, BusEvent


def test_arrived_and_left_keep_registry_counters_and_events_in_step() -> None:
    broker = Broker()
    events: list[BusEvent] = []
    broker.events.subscribe(events.append, [CLIENT_CONNECTED, CLIENT_DISCONNECTED])
    one = ClientInfo("c1", "mqtt", "alice", lambda _: None, SimpleNamespace(peer="1.2.3.4:5"))
    broker.presence.arrived(one, session_present=False)
    two = ClientInfo("c1", "mqtt", "alice", lambda _: None, SimpleNamespace(peer="1.2.3.4:6"))
    broker.presence.arrived(two)  # a takeover
    assert (
        len(broker.clients) == 2 and broker.stats.clients_connected == 2 and broker.stats.clients_maximum == 2
    )
    broker.presence.left(one, reason="session taken over")
    broker.presence.left(one)  # twice: counted once
    broker.presence.left(None)  # never arrived (a refused login)
    assert len(broker.clients) == 1 and broker.stats.clients_connected == 1
    broker.presence.left(two)
    assert broker.stats.clients_connected == 0 and broker.stats.clients_total == 2
    seen = [(e.type, e.data) for e in events]
    assert [kind for kind, _ in seen] == [
        CLIENT_CONNECTED,
        CLIENT_CONNECTED,
        CLIENT_DISCONNECTED,
        CLIENT_DISCONNECTED,
    ]
    assert seen[0][1]["session_present"] is False and seen[2][1]["reason"] == "session taken over"
    assert seen[0][1]["client_id"] == "c1" and seen[0][1]["user"] == "alice"
