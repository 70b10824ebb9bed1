"""A minimal AMQP 1.0 client for pairing with ServerConnection, built from the same codec.

It speaks in performatives: ``send(perf)`` feeds the server and returns every event the server
then has ready, ``frames()`` parses what the server wrote since the last call.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trimaran.amqp1.connection import ServerConnection
from trimaran.amqp1.frames import (
    AMQP_HEADER,
    FRAME_AMQP,
    FRAME_SASL,
    SASL_HEADER,
    Frame,
    FrameDecoder,
    encode_frame,
)
from trimaran.amqp1.performatives import (
    Attach,
    Begin,
    Composite,
    Flow,
    Open,
    SaslInit,
    SaslMechanisms,
    SaslOutcome,
    Source,
    Target,
)
from trimaran.runtime.machine import drain


@dataclass
class Received:
    channel: int
    perf: Composite | None  # None: heartbeat
    payload: bytes
    type: int = FRAME_AMQP


class Client:
    def __init__(self, server: ServerConnection, now: float = 0.0) -> None:
        self.server = server
        self.decoder = FrameDecoder()
        self.header_seen = 0
        self.now = now
        self.next_outgoing_id = 0
        self.delivery_id = 0

    # ---- raw I/O -----------------------------------------------------------------------

    def feed(self, data: bytes) -> list[Any]:
        self.server.receive_data(data, self.now)
        return drain(self.server)

    def send(
        self, perf: Composite, channel: int = 0, payload: bytes = b"", ftype: int = FRAME_AMQP
    ) -> list[Any]:
        return self.feed(bytes(encode_frame(ftype, channel, perf, payload)))

    def read_header(self) -> bytes:
        self.decoder.feed(self.server.data_to_send())
        hdr = self.decoder.next_header()
        assert isinstance(hdr, bytes), "server sent no protocol header"
        return hdr

    def frames(self) -> list[Received]:
        self.decoder.feed(self.server.data_to_send())
        out = []
        for f in self.decoder.frames():
            out.append(self._parse(f))
        return out

    @staticmethod
    def _parse(f: Frame) -> Received:
        if f.is_empty:
            return Received(f.channel, None, b"", f.type)
        perf, payload = f.performative()
        return Received(f.channel, perf, bytes(payload), f.type)

    def perfs(self) -> list[Composite]:
        return [r.perf for r in self.frames() if r.perf is not None]

    def one(self, kind: type[Any]) -> Any:
        got = self.perfs()
        assert len(got) == 1 and isinstance(got[0], kind), got
        return got[0]

    # ---- handshakes --------------------------------------------------------------------

    def sasl(self, mechanism: str = "ANONYMOUS", response: bytes | None = None) -> list[Any]:
        assert self.feed(SASL_HEADER) == []
        assert self.read_header() == SASL_HEADER
        mechs = self.one(SaslMechanisms)
        assert mechanism in mechs.sasl_server_mechanisms
        return self.send(SaslInit(mechanism=mechanism, initial_response=response), ftype=FRAME_SASL)

    def sasl_outcome(self) -> SaslOutcome:
        r = self.frames()
        assert len(r) == 1 and r[0].type == FRAME_SASL
        assert isinstance(r[0].perf, SaslOutcome)
        return r[0].perf

    def open(self, **kw: Any) -> list[Any]:
        assert self.feed(AMQP_HEADER) == []
        assert self.read_header() == AMQP_HEADER
        kw.setdefault("container_id", "client")
        return self.send(Open(**kw))

    def connect(self, **open_kw: Any) -> Open:
        """SASL ANONYMOUS, headers and open; returns the server's open."""
        ev = self.sasl("ANONYMOUS")
        assert len(ev) == 1
        self.server.sasl_complete(True)
        assert drain(self.server) == []
        assert self.sasl_outcome().code == 0
        ev = self.open(**open_kw)
        assert len(ev) == 1
        opened: Open = self.one(Open)
        return opened

    def begin(
        self, channel: int = 0, incoming_window: int = 1000, outgoing_window: int = 1000
    ) -> tuple[Any, Begin]:
        ev = self.send(
            Begin(next_outgoing_id=0, incoming_window=incoming_window, outgoing_window=outgoing_window),
            channel,
        )
        assert len(ev) == 1
        return ev[0].session, self.one(Begin)

    def attach(
        self, name: str, handle: int, role: bool, address: str = "q", channel: int = 0, **kw: Any
    ) -> Any:
        """Attach; returns the server's Link from the LinkAttached event."""
        if not role:
            kw.setdefault("initial_delivery_count", 0)
        ev = self.send(
            Attach(
                name=name,
                handle=handle,
                role=role,
                source=Source(address=address),
                target=Target(address=address),
                **kw,
            ),
            channel,
        )
        assert len(ev) == 1, ev
        return ev[0].link

    def flow(self, handle: int | None = None, channel: int = 0, **kw: Any) -> list[Any]:
        kw.setdefault("next_incoming_id", 0)
        kw.setdefault("incoming_window", 1000)
        kw.setdefault("next_outgoing_id", self.next_outgoing_id)
        kw.setdefault("outgoing_window", 1000)
        return self.send(Flow(handle=handle, **kw), channel)
