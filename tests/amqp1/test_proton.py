"""ServerConnection against qpid-proton's own protocol engine (its Transport is sans-IO too).

Bytes are pumped between the two engines in memory: no sockets, no threads. This checks
our encodings and state machine against an independent AMQP 1.0 implementation.
"""

from __future__ import annotations

from typing import Any

import pytest

from trimaran.amqp1.connection import ServerConnection
from trimaran.amqp1.events import (
    ConnectionClosed,
    DispositionReceived,
    FlowReceived,
    LinkAttached,
    LinkDetached,
    MessageReceived,
    SaslAuthRequested,
)
from trimaran.amqp1.messages import decode_message
from trimaran.amqp1.performatives import Accepted, Error, Source

proton = pytest.importorskip("proton")


class Pair:
    """A proton client and our server, with a tiny broker: echo every message to 'out' links."""

    def __init__(
        self,
        *,
        server_max_frame: int = 65536,
        client_max_frame: int = 65536,
        plain: bool = True,
        password: str = "secret",
    ) -> None:
        self.now = 0.0
        self.server = ServerConnection("trimaran", max_frame_size=server_max_frame, now=self.now)
        self.events: list[Any] = []
        self.received: list[MessageReceived] = []
        self.dispositions: list[DispositionReceived] = []
        self.out_links: list[Any] = []
        self.to_client = b""
        self.conn = proton.Connection()
        self.conn.container = "proton-client"
        self.conn.hostname = "localhost"
        self.transport = proton.Transport()
        self.transport.max_frame_size = client_max_frame
        sasl = self.transport.sasl()
        if plain:
            sasl.allowed_mechs("PLAIN")
            sasl.allow_insecure_mechs = True
            self.conn.user = "alice"
            self.conn.password = password
        else:
            sasl.allowed_mechs("ANONYMOUS")
        self.transport.bind(self.conn)
        self.conn.open()

    def pump(self) -> None:
        for _ in range(200):
            moved = False
            n = self.transport.pending()
            if n > 0:
                data = self.transport.peek(n)
                self.transport.pop(n)
                self.server.receive_data(data, self.now)
                self.handle()
                moved = True
            self.to_client += self.server.data_to_send()
            room = self.transport.capacity()
            if self.to_client and room > 0:
                self.transport.push(self.to_client[:room])
                self.to_client = self.to_client[room:]
                moved = True
            if not moved:
                return
        raise AssertionError("the engines never settled down")

    def handle(self) -> None:
        """Act on each event as it comes, as the runtime does."""
        while (ev := self.server.next_event()) is not None:
            self.react(ev)

    def react(self, ev: Any) -> None:
        self.events.append(ev)
        if isinstance(ev, SaslAuthRequested):
            ok = ev.credentials.username in (None, "alice") and ev.credentials.password in (
                None,
                "secret",
            )
            self.server.sasl_complete(ok)
        elif isinstance(ev, LinkAttached):
            link = ev.link
            if link.address == "missing":
                self.server.reject_link(link, Error(condition="amqp:not-found", description="no node"))
            elif link.is_receiver:
                self.server.accept_link(link, initial_credit=100)
            else:
                self.server.accept_link(link)
                self.out_links.append(link)
        elif isinstance(ev, MessageReceived):
            self.received.append(ev)
            self.server.settle(ev.link, ev.delivery_id, Accepted())
            for out in self.out_links:
                if out.is_open and out.credit > 0:
                    self.server.send(out, ev.payload)
        elif isinstance(ev, DispositionReceived):
            self.dispositions.append(ev)


def test_proton_sends_and_receives_through_us() -> None:
    p = Pair()
    session = p.conn.session()
    session.open()
    rcv = session.receiver("r")
    rcv.source.address = "q"
    rcv.target.address = "q"
    rcv.flow(10)
    rcv.open()
    snd = session.sender("s")
    snd.target.address = "q"
    snd.source.address = "q"
    snd.open()
    p.pump()
    assert p.conn.state & proton.Endpoint.REMOTE_ACTIVE
    assert snd.state & proton.Endpoint.REMOTE_ACTIVE and rcv.state & proton.Endpoint.REMOTE_ACTIVE
    assert snd.credit == 100
    assert any(isinstance(e, FlowReceived) and e.credit == 10 for e in p.events)
    sasl_events = [e for e in p.events if isinstance(e, SaslAuthRequested)]
    assert sasl_events[0].credentials.username == "alice"

    msg = proton.Message(
        body="hello",
        subject="greeting",
        properties={"colour": "red"},
        durable=True,
        id="m-1",
        content_type="text/plain",
    )
    dlv = snd.delivery(b"tag-1")
    snd.send(msg.encode())
    snd.advance()
    p.pump()
    assert len(p.received) == 1
    ours = decode_message(p.received[0].payload)
    assert ours.properties is not None and ours.properties.subject == "greeting"
    assert ours.application_properties == {"colour": "red"}
    assert p.received[0].tag == b"tag-1"
    # the sender learns of our accepted outcome
    assert dlv.remote_state == proton.Delivery.ACCEPTED and dlv.settled
    # and the proton receiver got the same bytes from us
    incoming = rcv.current
    assert incoming is not None and incoming.readable and not incoming.partial
    data = rcv.recv(incoming.pending)
    rcv.advance()
    got = proton.Message()
    got.decode(data)
    assert got.body == "hello" and got.properties == {"colour": "red"} and got.id == "m-1"
    assert data == p.received[0].payload
    incoming.update(proton.Delivery.ACCEPTED)
    incoming.settle()
    p.pump()
    disp = p.dispositions[-1]
    assert disp.settled and isinstance(disp.state, Accepted) and disp.deliveries[0][1] == 0

    snd.close()
    rcv.close()
    session.close()
    p.conn.close()
    p.pump()
    assert any(isinstance(e, LinkDetached) and e.by_peer for e in p.events)
    assert isinstance(p.events[-1], ConnectionClosed) and p.events[-1].by_peer
    assert p.server.closed
    assert p.conn.state & proton.Endpoint.REMOTE_CLOSED


def test_large_messages_split_both_ways() -> None:
    p = Pair(server_max_frame=512, client_max_frame=600, plain=False)
    session = p.conn.session()
    session.open()
    rcv = session.receiver("r")
    rcv.source.address = "q"
    rcv.flow(1)
    rcv.open()
    snd = session.sender("s")
    snd.target.address = "q"
    snd.open()
    p.pump()
    body = bytes(range(256)) * 40
    msg = proton.Message(body=body)
    snd.delivery(b"big")
    snd.send(msg.encode())
    snd.advance()
    p.pump()
    assert len(p.received) == 1
    assert decode_message(p.received[0].payload).data is None  # proton sends binary as amqp-value
    incoming = rcv.current
    assert incoming is not None and not incoming.partial
    got = proton.Message()
    got.decode(rcv.recv(incoming.pending))
    assert got.body == body


def test_refused_link_and_bad_password() -> None:
    p = Pair()
    session = p.conn.session()
    session.open()
    snd = session.sender("s")
    snd.target.address = "missing"
    snd.open()
    p.pump()
    assert snd.remote_condition is not None and snd.remote_condition.name == "amqp:not-found"
    assert snd.state & proton.Endpoint.REMOTE_CLOSED

    p = Pair(password="wrong")
    p.pump()
    assert isinstance(p.events[-1], ConnectionClosed)
    assert p.server.closed
    assert p.transport.sasl().outcome == proton.SASL.AUTH


def test_dynamic_source_via_proton() -> None:
    p = Pair(plain=False)
    orig = p.react

    def react(ev: Any) -> None:
        if isinstance(ev, LinkAttached) and ev.link.remote_attach.source.dynamic:
            p.server.accept_link(ev.link, source=Source(address="tmp-queue-1", dynamic=True))
        else:
            orig(ev)

    p.react = react  # type: ignore[method-assign]
    session = p.conn.session()
    session.open()
    rcv = session.receiver("dyn")
    rcv.source.dynamic = True
    rcv.open()
    p.pump()
    assert rcv.remote_source.address == "tmp-queue-1"


def test_idle_timeout_heartbeats_both_ways() -> None:
    p = Pair(plain=False)
    p.server = ServerConnection("trimaran", idle_timeout=2.0, now=0.0)
    p.transport.idle_timeout = 1.0
    now = 0.0
    p.transport.tick(now)
    p.pump()
    assert p.server.remote_idle_timeout is not None
    # ten seconds of silence at the application level: heartbeats keep both sides up
    while now < 10.0:
        now += 0.05
        p.transport.tick(now)
        p.now = now
        p.server.tick(now)
        p.handle()
        p.pump()
    assert p.conn.state & proton.Endpoint.REMOTE_ACTIVE
    assert not p.server.closed and not any(isinstance(e, ConnectionClosed) for e in p.events)
    # the client stops sending anything: we close it with resource-limit-exceeded
    while now < 13.0:
        now += 0.05
        p.server.tick(now)
        p.handle()
    closed = [e for e in p.events if isinstance(e, ConnectionClosed)]
    assert closed and closed[0].error is not None
    assert closed[0].error.condition == "amqp:resource-limit-exceeded"
    p.pump()
    assert p.conn.remote_condition is not None
    assert p.conn.remote_condition.name == "amqp:resource-limit-exceeded"


def test_drain_with_proton_receiver() -> None:
    p = Pair(plain=False)
    orig = p.react

    def react(ev: Any) -> None:
        orig(ev)
        if isinstance(ev, FlowReceived) and ev.drain and ev.link.is_sender:
            if ev.link.credit > 0:
                p.server.send(ev.link, proton.Message(body="only one").encode())
            p.server.complete_drain(ev.link)

    p.react = react  # type: ignore[method-assign]
    session = p.conn.session()
    session.open()
    rcv = session.receiver("r")
    rcv.source.address = "q"
    rcv.open()
    p.pump()
    rcv.drain(5)
    assert rcv.draining()
    p.pump()
    assert not rcv.draining()
    assert rcv.queued == 1
    # proton counts a queued delivery as credit until the application moves past it
    rcv.recv(rcv.current.pending)
    rcv.advance()
    assert rcv.credit == 0
