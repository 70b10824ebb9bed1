"""A minimal client side for pairing with ServerConnection in tests, without sockets."""

from __future__ import annotations

from trimaran.amqp091 import spec
from trimaran.amqp091.connection import ServerConnection
from trimaran.amqp091.events import ContentRun, Event
from trimaran.amqp091.fields import FieldTable, encode_table_contents
from trimaran.amqp091.frames import (
    NEED_DATA,
    Frame,
    FrameDecoder,
    MethodFrame,
    encode_content,
    encode_method,
)
from trimaran.amqp091.properties import BasicProperties
from trimaran.runtime.machine import drain


class Client:
    def __init__(self, server: ServerConnection | None = None, now: float = 1000.0) -> None:
        self.now = now
        self.server = server if server is not None else ServerConnection(now=now)
        self.decoder = FrameDecoder(0)
        self.frame_max = 0

    # -- sending ---------------------------------------------------------------------------------

    def send(self, data: bytes) -> list[Event]:
        """Feed ``data`` and take every event it completes."""
        self.server.receive_data(data, self.now)
        return self.events()

    def events(self) -> list[Event]:
        """Every event the server has ready (also those its own calls caused)."""
        return drain(self.server)  # type: ignore[return-value]

    def tick(self, now: float) -> list[Event]:
        self.server.tick(now)
        return self.events()

    def method(self, channel: int, method: spec.Method) -> list[Event]:
        return self.send(encode_method(channel, method))

    def publish(
        self,
        channel: int,
        body: bytes,
        properties: BasicProperties | None = None,
        exchange: str = "",
        routing_key: str = "rk",
        frame_max: int | None = None,
    ) -> list[Event]:
        fm = self.frame_max if frame_max is None else frame_max
        method = spec.BasicPublish(exchange=exchange, routing_key=routing_key)
        return self.send(encode_content(channel, method, properties or BasicProperties(), body, fm))

    # -- receiving -------------------------------------------------------------------------------

    def frames(self) -> list[Frame]:
        self.decoder.feed(self.server.data_to_send(self.now))
        out = []
        while (frame := self.decoder.next_frame()) is not NEED_DATA:
            out.append(frame)
        return out

    def methods(self) -> list[tuple[int, spec.Method]]:
        return [(f.channel, f.method) for f in self.frames() if isinstance(f, MethodFrame)]

    # -- scripted handshake ----------------------------------------------------------------------

    def start(
        self,
        mechanism: str = "PLAIN",
        response: bytes = b"\x00guest\x00guest",
        client_properties: FieldTable | None = None,
    ) -> list[Event]:
        events = self.send(spec.PROTOCOL_HEADER)
        assert events == []
        ((ch, start),) = self.methods()
        assert ch == 0 and isinstance(start, spec.ConnectionStart)
        props: FieldTable = {"product": "test"} if client_properties is None else client_properties
        return self.method(0, spec.ConnectionStartOk(props, mechanism, response, "en_US"))

    def handshake(
        self,
        vhost: str = "/",
        channel_max: int = 0,
        frame_max: int = 4096,
        heartbeat: int = 0,
    ) -> list[Event]:
        events = self.start()
        self.server.accept_authentication()
        ((_, tune),) = self.methods()
        assert isinstance(tune, spec.ConnectionTune)
        events += self.method(0, spec.ConnectionTuneOk(channel_max, frame_max, heartbeat))
        self.frame_max = self.server.frame_max
        events += self.method(0, spec.ConnectionOpen(virtual_host=vhost))
        assert self.methods() == [(0, spec.ConnectionOpenOk())]
        return events

    def open_channel(self, channel: int) -> list[Event]:
        events = self.method(channel, spec.ChannelOpen())
        assert self.methods() == [(channel, spec.ChannelOpenOk())]
        return events


def amqplain(login: str, password: str) -> bytes:
    return encode_table_contents({"LOGIN": login, "PASSWORD": password})


def one_by_one(event: Event) -> list[Event]:
    """``event``, or a run of publishes as one event a publish: for test brokers that take
    publishes one at a time."""
    return list(event.each()) if isinstance(event, ContentRun) else [event]
