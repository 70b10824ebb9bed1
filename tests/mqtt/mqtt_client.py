"""A tiny client side for driving `ServerConnection` without sockets: encode with the codec, feed the
server, decode what it answers."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from trimaran.mqtt.codec import NEED_DATA, Decoder, encode
from trimaran.mqtt.connection import (
    ConnectionClosed,
    ConnectRequest,
    Event,
    ServerConnection,
    ServerLimits,
)
from trimaran.mqtt.packets import ConnAck, Connect, Packet
from trimaran.mqtt.properties import Properties
from trimaran.mqtt.session import Session


class Client:
    def __init__(self, server: ServerConnection, level: int = 5) -> None:
        self.server = server
        self.level = level
        self.decoder = Decoder(protocol_level=level)
        self.now = 0.0

    def send(self, *packets: Packet) -> list[Event]:
        return self.send_bytes(b"".join(encode(p, self.level) for p in packets))

    def send_bytes(self, data: bytes) -> list[Event]:
        return feed(self.server, data, self.now)

    def received(self) -> list[Packet]:
        self.decoder.feed(self.server.data_to_send())
        out = []
        while (packet := self.decoder.next_packet()) is not NEED_DATA:
            out.append(packet)
        return out


def start(
    limits: ServerLimits | None = None, level: int = 5, **connect: Any
) -> tuple[ServerConnection, Client, list[Event]]:
    """Open a server connection and send a CONNECT; returns the events of that CONNECT."""
    server = ServerConnection(limits, now=0.0)
    client = Client(server, level)
    connect.setdefault("client_id", "c1")
    packet = Connect(protocol_name="MQIsdp" if level == 3 else "MQTT", protocol_level=level, **connect)
    events = client.send(packet)
    return server, client, events


def connected(
    limits: ServerLimits | None = None,
    level: int = 5,
    session: Session | None = None,
    session_present: bool = False,
    **connect: Any,
) -> tuple[ServerConnection, Client, ConnAck]:
    server, client, events = start(limits, level, **connect)
    assert len(events) == 1 and isinstance(events[0], ConnectRequest), events
    assert answer(server, server.accept, session, session_present=session_present) == []
    packets = client.received()
    assert isinstance(packets[0], ConnAck) and packets[0].reason_code == 0, packets
    return server, client, packets[0]


def feed(server: ServerConnection, data: bytes, now: float) -> list[Event]:
    """Bytes in, every event they complete out (the runtime takes them one at a time)."""
    server.receive_data(data, now)
    return events(server)


def tick(server: ServerConnection, now: float) -> list[Event]:
    server.tick(now)
    return events(server)


def eof(server: ServerConnection) -> list[Event]:
    server.receive_eof()
    return events(server)


def answer(server: ServerConnection, call: Callable[..., None], *args: Any, **kwargs: Any) -> list[Event]:
    """A call the hull makes (accept, reject, disconnect) and the events that follow it."""
    call(*args, **kwargs)
    return events(server)


def events(server: ServerConnection) -> list[Event]:
    found: list[Event] = []
    while (event := server.next_event()) is not None:
        found.append(event)
    return found


def props(**kwargs: Any) -> Properties:
    return Properties(**kwargs)


def closed(events: list[Event]) -> ConnectionClosed:
    assert events and isinstance(events[-1], ConnectionClosed), events
    return events[-1]
