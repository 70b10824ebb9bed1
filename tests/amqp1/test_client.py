"""ClientConnection (trimaran/amqp1/client.py): paired in memory with our own server machine, fed
scripted peer frames built with the codec, and over sockets against the Qpid Proton C broker example,
a real Trimaran and RabbitMQ 3.10's AMQP 1.0 plugin (those three skipped with a reason where absent)."""

from __future__ import annotations

import itertools
import select
import socket
import time
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support import rabbitmq
from tests.support.server import ALICE, ALICE_PERMISSIONS, RunningServer, serving
from trimaran.amqp1 import connection as server_connection
from trimaran.amqp1.client import (
    TRANSFER_OVERHEAD_MAX,
    Attached,
    ClientConnection,
    ClientParams,
    Closed,
    Credit,
    Detached,
    Event,
    Opened,
    Outcome,
    Received,
)
from trimaran.amqp1.connection import ServerConnection
from trimaran.amqp1.events import (
    ConnectionClosed,
    DispositionReceived,
    LinkAttached,
    MessageReceived,
    SaslAuthRequested,
)
from trimaran.amqp1.frames import AMQP_HEADER, EMPTY_FRAME, FRAME_AMQP, FRAME_SASL, FrameDecoder, encode_frame
from trimaran.amqp1.messages import Data, Message, decode_message, encode_message
from trimaran.amqp1.performatives import (
    ROLE_RECEIVER,
    ROLE_SENDER,
    Accepted,
    Attach,
    Begin,
    Close,
    Composite,
    Detach,
    Disposition,
    End,
    Error,
    Flow,
    Modified,
    Open,
    Rejected,
    Released,
    SaslMechanisms,
    Source,
    Target,
    Transfer,
)
from trimaran.amqp1.session import Link

# -- our server machine as the peer, in memory ------------------------------------------------------


class Broker:
    """ServerConnection with a tiny broker on top: a queue of payloads per address; the client's
    senders get ``grant`` credit and their messages ``outcome`` (None: left unsettled)."""

    def __init__(self, *, password: str = "secret", grant: int = 100, **kw: Any) -> None:
        kw.setdefault("now", 0.0)
        self.server = ServerConnection("trimaran-test", **kw)
        self.password = password
        self.grant = grant
        self.outcome: Composite | None = Accepted()
        self.queues: dict[str, deque[bytes]] = {}
        self.refuse: set[str] = set()
        self.senders: list[Link] = []
        self.received: list[MessageReceived] = []
        self.dispositions: list[DispositionReceived] = []
        self.events: list[Any] = []

    def handle(self) -> None:
        server = self.server
        while (ev := server.next_event()) is not None:
            self.events.append(ev)
            if isinstance(ev, SaslAuthRequested):
                creds = ev.credentials
                server.sasl_complete(
                    creds.username in (None, "alice") and creds.password in (None, self.password)
                )
            elif isinstance(ev, LinkAttached):
                link = ev.link
                if link.address in self.refuse:
                    server.reject_link(link, Error(condition="amqp:not-found", description="no such node"))
                elif link.is_receiver:
                    server.accept_link(link, initial_credit=self.grant)
                else:
                    server.accept_link(link)
                    self.senders.append(link)
            elif isinstance(ev, MessageReceived):
                self.received.append(ev)
                self.queues.setdefault(ev.link.address, deque()).append(ev.payload)
                if self.outcome is not None:
                    server.settle(ev.link, ev.delivery_id, self.outcome)
            elif isinstance(ev, DispositionReceived):
                self.dispositions.append(ev)
        for link in self.senders:
            queue = self.queues.get(link.address)
            while queue and link.is_open and link.credit > 0:
                server.send(link, queue.popleft())


def pump(
    client: ClientConnection, broker: Broker, now: float = 0.0, react: Callable[[Event], None] | None = None
) -> list[Event]:
    """Move bytes both ways until both sides are quiet; the client's events, each acted on as it
    comes when ``react`` is given."""
    events: list[Event] = []
    for _ in range(1000):
        moved = False
        out = client.data_to_send()
        if out:
            broker.server.receive_data(out, now)
            moved = True
        broker.handle()
        back = broker.server.data_to_send()
        if back:
            client.receive_data(back, now)
            moved = True
        while (ev := client.next_event()) is not None:
            events.append(ev)
            if react is not None:
                react(ev)
            moved = True
        if not moved:
            return events
    raise AssertionError("the machines never settled down")


def params(**kw: Any) -> ClientParams:
    kw.setdefault("container_id", "bridge")
    return ClientParams(**kw)


def connected(broker: Broker | None = None, **kw: Any) -> tuple[ClientConnection, Broker, list[Event]]:
    broker = broker or Broker()
    client = ClientConnection(params(**kw), 0.0)
    events = pump(client, broker)
    return client, broker, events


def payload(i: int, size: int = 0) -> bytes:
    return encode_message(Message(body=[Data(b"m%d:" % i + b"x" * size)]))


def body(message: bytes) -> bytes:
    data = decode_message(message).data
    assert data is not None
    return data


def test_sasl_plain_opens_the_session() -> None:
    client, broker, events = connected(username="alice", password="secret", hostname="vhost:/")
    assert events == [Opened("trimaran-test", events[0].properties, 65536)]  # type: ignore[union-attr]
    assert client.opened and not client.closed
    sasl = [e for e in broker.events if isinstance(e, SaslAuthRequested)]
    assert sasl[0].credentials.mechanism == "PLAIN" and sasl[0].credentials.username == "alice"
    assert sasl[0].hostname == "vhost:/"
    assert broker.server.remote_open is not None and broker.server.remote_open.hostname == "vhost:/"
    assert len(broker.server.sessions) == 1


def test_sasl_anonymous_and_no_sasl() -> None:
    client, broker, events = connected()
    assert isinstance(events[0], Opened) and client.opened
    sasl = [e for e in broker.events if isinstance(e, SaslAuthRequested)]
    assert sasl[0].credentials.mechanism == "ANONYMOUS"

    client, broker, events = connected(Broker(require_sasl=False), sasl=False)
    assert isinstance(events[0], Opened) and client.opened
    assert not any(isinstance(e, SaslAuthRequested) for e in broker.events)


def test_a_wrong_password_closes_with_the_sasl_code() -> None:
    client, _broker, events = connected(username="alice", password="wrong")
    assert events == [Closed("authentication failed (code 1)", None, True)]
    assert client.closed and not client.opened
    assert client.next_event() is None and client.next_deadline() is None
    with pytest.raises(ValueError, match="not open"):
        client.attach_sender("s", "q")


def test_a_mechanism_the_peer_does_not_offer_closes() -> None:
    client = ClientConnection(params(username="alice", password="x"), 0.0)
    client.receive_data(
        b"AMQP\x03\x01\x00\x00"
        + bytes(encode_frame(FRAME_SASL, 0, SaslMechanisms(sasl_server_mechanisms=["EXTERNAL"]))),
        0.0,
    )
    event = client.next_event()
    assert isinstance(event, Closed) and "not PLAIN" in event.reason and not event.by_peer


def test_round_trip_with_credit_and_coalesced_settles() -> None:
    client, broker, _ = connected(Broker(grant=5))
    out = client.attach_sender("out", "q")
    events = pump(client, broker)
    assert events == [Attached(out, "out", "sender"), Credit(out, 5)]
    assert client.credit(out) == 5
    ids = [client.send(out, payload(i)) for i in range(5)]
    assert ids == [0, 1, 2, 3, 4] and client.credit(out) == 0
    with pytest.raises(ValueError, match="no credit"):
        client.send(out, payload(5))
    events = pump(client, broker)
    assert [e for e in events if isinstance(e, Outcome)] == [Outcome(i, "accepted", None) for i in ids]
    assert [m.tag for m in broker.received] == [b"\x00", b"\x01", b"\x02", b"\x03", b"\x04"]
    assert not any(m.settled for m in broker.received)
    # The broker grants more: a Credit event, and the sender goes on.
    broker.server.grant_credit(broker.received[0].link, 3)
    assert pump(client, broker) == [Credit(out, 3)]
    client.send(out, payload(5))
    assert client.credit(out) == 2
    assert pump(client, broker) == [Outcome(5, "accepted", None)]

    got: list[Received] = []
    rcv = client.attach_receiver("in", "q", credit=4)
    events = pump(client, broker, react=lambda e: got.append(e) if isinstance(e, Received) else None)
    assert events[0] == Attached(rcv, "in", "receiver")
    assert [body(r.message) for r in got] == [b"m0:", b"m1:", b"m2:", b"m3:"]  # the credit given
    assert [r.delivery_id for r in got] == [0, 1, 2, 3] and not any(r.settled for r in got)
    for r in got[:3]:
        client.settle(r.delivery_id)
    client.settle(got[3].delivery_id, "released")
    client.flow(rcv, 4)
    pump(client, broker, react=lambda e: got.append(e) if isinstance(e, Received) else None)
    settled = [
        (d.first, d.last, type(d.state).__name__) for d in broker.dispositions if d.role is ROLE_RECEIVER
    ]
    assert settled == [(0, 2, "Accepted"), (3, 3, "Released")]  # three settles, one disposition
    # The released message went back to the queue (our tiny broker forgets it) and the rest came.
    assert [body(r.message) for r in got[4:]] == [b"m4:", b"m5:"]
    client.settle(got[4].delivery_id, "rejected", description="not for us")
    client.settle(got[5].delivery_id, "modified")
    client.settle(got[5].delivery_id, "accepted")  # settled already: nothing more
    pump(client, broker)
    states = [d.state for d in broker.dispositions[2:]]
    assert states == [
        Rejected(error=Error(condition="amqp:internal-error", description="not for us")),
        Modified(delivery_failed=True),
    ]
    with pytest.raises(ValueError, match="outcome"):
        client.settle(0, "nacked")
    with pytest.raises(ValueError, match="receiver"):
        client.flow(out, 1)
    with pytest.raises(ValueError, match="sender"):
        client.send(rcv, b"")


def test_a_big_message_is_cut_at_the_peers_max_frame_size() -> None:
    client, broker, events = connected(Broker(max_frame_size=512), max_frame_size=600)
    assert events[0] == Opened("trimaran-test", events[0].properties, 512)  # type: ignore[union-attr]
    out = client.attach_sender("out", "q")
    pump(client, broker)
    message = payload(0, 5000)
    did = client.send(out, message)
    wire = client.data_to_send()
    decoder = FrameDecoder(max_frame_size=512)  # raises on any frame larger
    decoder.feed(wire)
    frames = decoder.frames()
    assert len(frames) >= 10 and all(f.type == FRAME_AMQP for f in frames)
    broker.server.receive_data(wire, 0.0)
    events = pump(client, broker)
    assert broker.received[0].payload == message
    assert events == [Outcome(did, "accepted", None)]
    # And the other way: the server cuts at our 600 bytes, and we join the frames.
    got: list[Received] = []
    client.attach_receiver("in", "q", credit=1)
    pump(client, broker, react=lambda e: got.append(e) if isinstance(e, Received) else None)
    assert [r.message for r in got] == [message]


def test_a_refused_link_is_attached_then_detached() -> None:
    broker = Broker()
    broker.refuse.add("nowhere")
    client, broker, _ = connected(broker)
    handle = client.attach_receiver("r", "nowhere", credit=10)
    events = pump(client, broker)
    assert events == [
        Attached(handle, "r", "receiver"),
        Detached(handle, "amqp:not-found", "no such node"),
    ]
    with pytest.raises(ValueError):
        client.flow(handle, 1)
    # The handle and the name are free again.
    assert client.attach_receiver("r", "q", credit=1) == handle


def test_idle_time_out_and_empty_frames() -> None:
    broker = Broker(idle_timeout=4.0)  # says 2 s in its open: we send an empty frame each second
    client, broker, _ = connected(broker, idle_timeout_s=10.0)
    assert broker.server.remote_open is not None and broker.server.remote_open.idle_time_out == 10_000
    assert client.data_to_send() == b""
    assert client.next_deadline() == 1.0
    client.tick(1.0)
    assert client.data_to_send() == EMPTY_FRAME
    assert client.next_deadline() == 2.0
    client.tick(1.5)  # not yet due
    assert client.data_to_send() == b""
    now = 2.0
    while now < 10.0:
        client.tick(now)
        assert client.data_to_send() == EMPTY_FRAME and client.next_event() is None
        now += 1.0
    client.tick(10.0)  # ten seconds without a byte from the peer
    event = client.next_event()
    assert event == Closed(
        "idle time-out: nothing from the peer for 10 s", "amqp:resource-limit-exceeded", False
    )
    wire = client.data_to_send()
    broker.server.receive_data(wire, 10.0)
    broker.handle()
    closed = [e for e in broker.events if isinstance(e, ConnectionClosed)]
    assert closed[0].error is not None and closed[0].error.condition == "amqp:resource-limit-exceeded"


def test_anything_from_the_peer_keeps_it_alive() -> None:
    client, _broker, _ = connected(Broker(idle_timeout=None), idle_timeout_s=3.0)
    assert client.next_deadline() == 3.0  # the server says no idle time-out: no empty frames of ours
    client.receive_data(EMPTY_FRAME, 2.5)
    assert client.next_event() is None
    assert client.next_deadline() == 5.5
    client.tick(5.0)
    assert client.next_event() is None and client.opened


def test_no_open_in_time() -> None:
    client = ClientConnection(params(connect_timeout=5.0), 100.0)
    assert client.data_to_send() == b"AMQP\x03\x01\x00\x00"
    assert client.next_deadline() == 105.0
    client.tick(104.9)
    assert client.next_event() is None
    client.tick(105.0)
    assert client.next_event() == Closed("no open from the peer within 5 s", None, False)
    assert client.closed and client.next_event() is None


def test_closing_ourselves() -> None:
    client, broker, _ = connected()
    client.close(1.0, "amqp:connection:forced", "bridge stopped")
    assert not client.opened and not client.closed
    assert client.next_deadline() == 11.0  # the peer has connect_timeout to answer
    events = pump(client, broker, now=1.0)
    assert events == [Closed("closed", "amqp:connection:forced", False)]
    closed = [e for e in broker.events if isinstance(e, ConnectionClosed)]
    assert closed[0].error == Error(condition="amqp:connection:forced", description="bridge stopped")

    # Closed before the peer's header came: its header, open and close answer ours.
    client = ClientConnection(params(sasl=False), 0.0)
    client.close(0.5, "amqp:connection:forced")
    wire = client.data_to_send()
    assert wire.startswith(AMQP_HEADER) and wire.endswith(
        frame(Close(error=Error(condition="amqp:connection:forced")), channel=0)
    )
    client.receive_data(
        AMQP_HEADER + frame(Open(container_id="peer"), channel=0) + frame(Close(), channel=0), 0.6
    )
    assert client.next_event() == Closed("closed", "amqp:connection:forced", False)
    assert client.data_to_send() == b""

    client, broker, _ = connected()
    client.close(1.0)
    client.data_to_send()
    client.tick(11.0)  # no answer
    assert client.next_event() == Closed("the peer did not answer our close within 10 s", None, False)


# -- scripted peer frames ---------------------------------------------------------------------------


def frame(perf: Composite, payload: bytes = b"", channel: int = 3) -> bytes:
    return bytes(encode_frame(FRAME_AMQP, channel, perf, payload))


class Peer:
    """Reads what the client writes (after its AMQP header) as performatives."""

    def __init__(self, client: ClientConnection) -> None:
        self.client = client
        self.decoder = FrameDecoder()
        self.decoder.feed(client.data_to_send())
        assert self.decoder.next_header() == AMQP_HEADER

    def frames(self) -> list[tuple[Composite | None, bytes]]:
        self.decoder.feed(self.client.data_to_send())
        out: list[tuple[Composite | None, bytes]] = []
        for f in self.decoder.frames():
            if f.is_empty:
                out.append((None, b""))
            else:
                perf, rest = f.performative()
                out.append((perf, bytes(rest)))
        return out

    def perfs(self) -> list[Composite | None]:
        return [p for p, _ in self.frames()]


def scripted(**kw: Any) -> tuple[ClientConnection, Peer]:
    """A client without SASL, opened by a scripted peer whose session is on channel 3."""
    client = ClientConnection(params(sasl=False, **kw), 0.0)
    peer = Peer(client)
    opening = peer.perfs()
    assert isinstance(opening[0], Open) and opening[0].container_id == "bridge"
    assert opening[0].channel_max == 0 and opening[0].idle_time_out == 60_000
    begin = opening[1]
    assert isinstance(begin, Begin) and begin.next_outgoing_id == 0 and begin.remote_channel is None
    client.receive_data(
        AMQP_HEADER
        + frame(Open(container_id="peer", properties={"product": "script"}), channel=0)
        + frame(Begin(remote_channel=0, next_outgoing_id=10, incoming_window=100, outgoing_window=100)),
        0.0,
    )
    assert client.next_event() == Opened("peer", {"product": "script"}, 0xFFFF_FFFF)
    return client, peer


def scripted_receiver(credit: int = 10) -> tuple[ClientConnection, Peer, int]:
    client, peer = scripted()
    handle = client.attach_receiver("in", "q", credit=credit)
    attach, flow = peer.perfs()
    assert isinstance(attach, Attach) and attach.role is ROLE_RECEIVER and attach.handle == handle
    assert (
        attach.source == Source(address="q") and attach.snd_settle_mode == 0 and attach.rcv_settle_mode == 0
    )
    assert isinstance(flow, Flow) and flow.link_credit == credit and flow.delivery_count is None
    assert flow.next_incoming_id == 10
    client.receive_data(
        frame(
            Attach(
                name="in", handle=7, role=ROLE_SENDER, source=Source(address="q"), initial_delivery_count=0
            )
        ),
        0.0,
    )
    assert client.next_event() == Attached(handle, "in", "receiver")
    return client, peer, handle


def scripted_sender(credit: int = 10) -> tuple[ClientConnection, Peer, int]:
    client, peer = scripted()
    handle = client.attach_sender("out", "q")
    (attach,) = peer.perfs()
    assert isinstance(attach, Attach) and attach.role is ROLE_SENDER and attach.target == Target(address="q")
    assert attach.initial_delivery_count == 0 and attach.snd_settle_mode == 0
    client.receive_data(
        frame(Attach(name="out", handle=5, role=ROLE_RECEIVER, target=Target(address="q")))
        + frame(
            Flow(
                next_incoming_id=0,
                incoming_window=100,
                next_outgoing_id=10,
                outgoing_window=100,
                handle=5,
                delivery_count=0,
                link_credit=credit,
            )
        ),
        0.0,
    )
    assert client.next_event() == Attached(handle, "out", "sender")
    assert client.next_event() == Credit(handle, credit)
    return client, peer, handle


def transfers(message: bytes, cuts: list[int], delivery_id: int = 0, handle: int = 7) -> bytes:
    """One delivery as transfer frames, its payload cut at ``cuts``."""
    points = sorted({c % (len(message) + 1) for c in cuts} | {0, len(message)})
    pieces = [message[a:b] for a, b in itertools.pairwise(points)] or [b""]
    out = b""
    for i, piece in enumerate(pieces):
        more = i < len(pieces) - 1
        if i == 0:
            t = Transfer(
                handle=handle, delivery_id=delivery_id, delivery_tag=b"t", message_format=0, more=more
            )
        else:
            t = Transfer(handle=handle, more=more)
        out += frame(t, piece)
    return out


@settings(max_examples=60, deadline=None)
@given(
    message=st.binary(max_size=600),
    cuts=st.lists(st.integers(min_value=0, max_value=600), max_size=6),
    feed=st.lists(st.integers(min_value=1, max_value=97), min_size=1, max_size=8),
)
def test_a_delivery_cut_anywhere_comes_out_whole(message: bytes, cuts: list[int], feed: list[int]) -> None:
    client, peer, handle = scripted_receiver()
    wire = transfers(message, cuts) + transfers(b"second", [], delivery_id=1)
    events: list[Event] = []
    pos = 0
    k = 0
    while pos < len(wire):  # the bytes cut at any boundary too
        step = feed[k % len(feed)]
        client.receive_data(wire[pos : pos + step], 1.0)
        pos += step
        k += 1
        while (ev := client.next_event()) is not None:
            events.append(ev)
    assert events == [Received(handle, 0, message, False), Received(handle, 1, b"second", False)]
    client.settle(0)
    client.settle(1)
    (disposition,) = peer.perfs()[-1:]
    assert disposition == Disposition(role=ROLE_RECEIVER, first=0, last=1, settled=True, state=Accepted())


def test_aborted_and_pre_settled_transfers() -> None:
    client, peer, handle = scripted_receiver(credit=3)
    client.receive_data(
        frame(Transfer(handle=7, delivery_id=0, delivery_tag=b"a", more=True), b"half")
        + frame(Transfer(handle=7, aborted=True))
        + frame(Transfer(handle=7, delivery_id=1, delivery_tag=b"b", more=True), b"one ")
        + frame(Transfer(handle=7, settled=True), b"piece"),
        0.0,
    )
    assert client.next_event() == Received(handle, 1, b"one piece", True)
    assert client.next_event() is None
    client.settle(1)  # pre-settled: nothing to say
    client.settle(0)  # aborted: nothing either
    assert peer.perfs() == []
    # Each delivery took one credit, the aborted one too: the third fits, a flow sets it again.
    client.flow(handle, 5)
    (flow,) = peer.perfs()
    assert isinstance(flow, Flow) and flow.delivery_count == 2 and flow.link_credit == 5
    assert flow.next_incoming_id == 14  # four transfer frames after the peer's next-outgoing-id 10


def test_the_incoming_window_is_opened_again() -> None:
    client, peer, _handle = scripted_receiver(credit=5000)
    wire = b"".join(
        frame(Transfer(handle=7, delivery_id=i, delivery_tag=b"t", settled=True), b"x") for i in range(1100)
    )
    client.receive_data(wire, 0.0)
    got = 0
    while (ev := client.next_event()) is not None:
        assert isinstance(ev, Received)
        got += 1
    assert got == 1100
    flows = [p for p in peer.perfs() if isinstance(p, Flow)]
    assert len(flows) == 1 and flows[0].handle is None  # once for the batch, not per frame
    assert flows[0].next_incoming_id == 1110 and flows[0].incoming_window == 2048


def test_dispositions_in_ranges_from_the_peer() -> None:
    client, peer, handle = scripted_sender(credit=10)
    ids = [client.send(handle, b"m%d" % i) for i in range(6)]
    assert ids == list(range(6))
    sent = [p for p in peer.frames() if isinstance(p[0], Transfer)]
    assert [t.delivery_tag for t, _ in sent] == [bytes([i]) for i in range(6)]  # type: ignore[union-attr]
    assert [payload for _, payload in sent] == [b"m%d" % i for i in range(6)]
    client.receive_data(
        frame(Disposition(role=ROLE_RECEIVER, first=0, last=2, settled=True, state=Accepted()))
        + frame(
            Disposition(
                role=ROLE_RECEIVER,
                first=3,
                settled=True,
                state=Rejected(error=Error(condition="amqp:not-allowed", description="full")),
            )
        )
        + frame(Disposition(role=ROLE_RECEIVER, first=4, last=5, settled=False, state=Released()))
        + frame(Disposition(role=ROLE_RECEIVER, first=0, last=5, settled=True, state=Accepted())),  # again
        0.0,
    )
    events = []
    while (ev := client.next_event()) is not None:
        events.append(ev)
    assert events == [
        Outcome(0, "accepted", None),
        Outcome(1, "accepted", None),
        Outcome(2, "accepted", None),
        Outcome(3, "rejected", "amqp:not-allowed: full"),
        Outcome(4, "released", None),
        Outcome(5, "released", None),
    ]
    # The peer left 4..5 unsettled (rcv-settle-mode second): we settle them, as one range.
    assert peer.perfs() == [Disposition(role=ROLE_SENDER, first=4, last=5, settled=True)]
    client.send(handle, b"settled", settled=True)
    (t,) = peer.perfs()
    assert isinstance(t, Transfer) and t.settled is True and t.delivery_id == 6
    client.receive_data(frame(Disposition(role=ROLE_RECEIVER, first=6, settled=True, state=Accepted())), 0.0)
    assert client.next_event() is None  # not ours to hear about


def test_sender_credit_follows_the_spec() -> None:
    client, peer, handle = scripted_sender(credit=3)
    for i in range(3):
        client.send(handle, b"%d" % i)
    peer.perfs()
    assert client.credit(handle) == 0

    def flow(delivery_count: int | None, link_credit: int, **kw: Any) -> bytes:
        return frame(
            Flow(
                next_incoming_id=3,
                incoming_window=100,
                next_outgoing_id=10,
                outgoing_window=100,
                handle=5,
                delivery_count=delivery_count,
                link_credit=link_credit,
                **kw,
            )
        )

    # A flow the peer wrote before it saw our last transfers: credit = 1 + 4 - 3.
    client.receive_data(flow(1, 4), 0.0)
    assert client.next_event() == Credit(handle, 2)
    client.receive_data(flow(3, 4), 0.0)
    assert client.next_event() == Credit(handle, 4)
    client.receive_data(flow(3, 4), 0.0)
    assert client.next_event() is None  # no change, no event
    # Drain: the caller sends what it has on the Credit event, the rest is given back.
    client.receive_data(flow(3, 4, drain=True), 0.0)
    assert client.next_event() == Credit(handle, 4)  # unchanged, but the caller's turn to send
    client.send(handle, b"last")
    assert client.next_event() == Credit(handle, 0)
    given_back = peer.perfs()[-1]
    assert isinstance(given_back, Flow) and given_back.delivery_count == 7 and given_back.link_credit == 0
    assert given_back.drain and given_back.handle == 0
    with pytest.raises(ValueError, match="no credit"):
        client.send(handle, b"more")


def test_transfers_wait_for_the_peers_session_window() -> None:
    client, peer, handle = scripted_sender(credit=5)
    client.receive_data(
        frame(Flow(next_incoming_id=0, incoming_window=2, next_outgoing_id=10, outgoing_window=100)), 0.0
    )
    assert client.next_event() is None
    for i in range(4):
        client.send(handle, b"%d" % i)
    assert [type(p).__name__ for p in peer.perfs()] == ["Transfer", "Transfer"]
    client.receive_data(
        frame(Flow(next_incoming_id=2, incoming_window=5, next_outgoing_id=10, outgoing_window=100)), 0.0
    )
    assert client.next_event() is None
    sent = peer.frames()
    assert [bytes(p) for _, p in sent] == [b"2", b"3"]


def test_the_peer_detaches_with_an_error() -> None:
    client, peer, handle = scripted_sender()
    did = client.send(handle, b"unanswered")
    peer.perfs()
    client.receive_data(
        frame(
            Detach(handle=5, closed=True, error=Error(condition="amqp:resource-deleted", description="gone"))
        ),
        0.0,
    )
    assert client.next_event() == Detached(handle, "amqp:resource-deleted", "gone")
    assert peer.perfs() == [Detach(handle=handle, closed=True)]
    with pytest.raises(ValueError):
        client.credit(handle)
    client.receive_data(
        frame(Disposition(role=ROLE_RECEIVER, first=did, settled=True, state=Accepted())), 0.0
    )
    assert client.next_event() is None  # forgotten with its link
    assert client.opened


def test_the_peer_closes_or_ends() -> None:
    client, peer = scripted()
    client.receive_data(
        frame(Close(error=Error(condition="amqp:connection:forced", description="bye")), channel=0), 0.0
    )
    assert client.next_event() == Closed(
        "the peer closed the connection: amqp:connection:forced bye", "amqp:connection:forced", True
    )
    assert peer.perfs() == [Close()]
    assert client.closed and client.next_event() is None
    client.receive_data(frame(Close(), channel=0), 0.0)
    client.receive_eof()
    assert client.next_event() is None and client.data_to_send() == b""

    client, peer = scripted()
    client.receive_data(frame(End()), 0.0)
    assert client.next_event() == Closed("the peer ended the session", None, True)
    assert peer.perfs() == [End(), Close()]


def test_eof_comes_after_what_was_buffered() -> None:
    client, _peer, handle = scripted_receiver()
    client.receive_data(frame(Transfer(handle=7, delivery_id=0, delivery_tag=b"a"), b"last words"), 0.0)
    client.receive_eof()
    client.receive_eof("again")  # harmless
    assert client.next_event() == Received(handle, 0, b"last words", False)
    assert client.next_event() == Closed("the peer closed the connection without a close frame", None, True)
    assert client.next_event() is None and client.closed

    client, _peer = scripted()
    client.receive_eof("connection reset by peer")
    assert client.next_event() == Closed("connection reset by peer", None, True)


def test_protocol_errors_close_with_the_condition() -> None:
    client, peer = scripted()
    client.receive_data(b"\x00\x00\x00\x0c\x02\x00\x00\x03\x00\x53\x14\xff", 0.0)  # a transfer's garbage
    event = client.next_event()
    assert isinstance(event, Closed) and event.condition == "amqp:decode-error" and not event.by_peer
    (close,) = peer.perfs()
    assert (
        isinstance(close, Close) and close.error is not None and close.error.condition == "amqp:decode-error"
    )

    client, peer = scripted(max_frame_size=1024)
    client.receive_data(frame(Transfer(handle=0), b"x" * 2000), 0.0)
    event = client.next_event()
    assert isinstance(event, Closed) and event.condition == "amqp:connection:framing-error"

    client, peer = scripted()
    client.receive_data(frame(Transfer(handle=9, delivery_id=0, delivery_tag=b"t")), 0.0)
    event = client.next_event()
    assert isinstance(event, Closed) and event.condition == "amqp:session:unattached-handle"

    client, peer = scripted()  # a link this client never asked for
    client.receive_data(frame(Attach(name="theirs", handle=0, role=ROLE_SENDER, source=Source())), 0.0)
    event = client.next_event()
    assert isinstance(event, Closed) and event.condition == "amqp:not-allowed" and "theirs" in event.reason

    client = ClientConnection(params(sasl=False), 0.0)
    client.receive_data(b"AMQP\x03\x01\x00\x00", 0.0)
    event = client.next_event()
    assert isinstance(event, Closed) and "protocol header" in event.reason


def test_the_transfer_overhead_is_the_servers() -> None:
    assert TRANSFER_OVERHEAD_MAX == server_connection.TRANSFER_OVERHEAD_MAX


# -- real peers over sockets ------------------------------------------------------------------------


class Driver:
    """A blocking loop around the client, as a bridge's would be."""

    def __init__(self, port: int, client_params: ClientParams) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.sock.setblocking(False)
        self.client = ClientConnection(client_params, time.monotonic())
        self.events: list[Event] = []

    def run(
        self, until: Callable[[], bool], react: Callable[[Event], None] | None = None, timeout: float = 30
    ) -> None:
        client = self.client
        deadline = time.monotonic() + timeout
        while not until():
            self.flush()
            now = time.monotonic()
            assert now < deadline, f"timed out; last events {self.events[-3:]}"
            wait = 0.2
            due = client.next_deadline()
            if due is not None:
                wait = max(0.0, min(wait, due - now))
            readable, _, _ = select.select([self.sock], [], [], wait)
            now = time.monotonic()
            if readable:
                try:
                    data = self.sock.recv(262144)
                except ConnectionResetError:
                    data = b""
                if data:
                    client.receive_data(data, now)
                else:
                    client.receive_eof()
            client.tick(now)
            while (ev := client.next_event()) is not None:
                self.events.append(ev)
                if react is not None:
                    react(ev)
        self.flush()

    def flush(self) -> None:
        out = self.client.data_to_send()
        if out:
            self.sock.setblocking(True)
            try:
                self.sock.sendall(out)
            except OSError:
                pass  # the peer is gone: its eof tells the client
            finally:
                self.sock.setblocking(False)

    def close(self) -> None:
        self.sock.close()


def round_trip(
    port: int, client_params: ClientParams, address: str, *, presettled: bool, count: int = 500
) -> None:
    """Send ``count`` messages to ``address`` unsettled, all accepted; receive them with credit 50,
    each settled accepted: in order, bodies intact. ``presettled``: the peer sends them so (the proton
    broker); otherwise our settles must have taken them: a second connection finds the queue empty."""
    d = Driver(port, client_params)
    client = d.client
    try:
        d.run(lambda: client.opened or client.closed)
        assert client.opened, d.events
        out = client.attach_sender("bridge-out", address)
        outcomes: list[Outcome] = []
        sent = 0

        def sending(ev: Event) -> None:
            nonlocal sent
            if isinstance(ev, Outcome):
                outcomes.append(ev)
            elif isinstance(ev, Detached | Closed):
                raise AssertionError(ev)
            while sent < count and client.opened and client.credit(out) > 0:
                client.send(out, payload(sent, 100))
                sent += 1

        d.run(lambda: len(outcomes) >= count, sending)
        assert [o.delivery_id for o in outcomes] == list(range(count))
        assert {o.outcome for o in outcomes} == {"accepted"}
        assert Attached(out, "bridge-out", "sender") in d.events

        rcv = client.attach_receiver("bridge-in", address, credit=50)
        got: list[bytes] = []
        since_flow = 0

        def receiving(ev: Event) -> None:
            nonlocal since_flow
            if isinstance(ev, Received):
                assert ev.settled is presettled
                got.append(body(ev.message))
                client.settle(ev.delivery_id)
                since_flow += 1
                if since_flow == 25:
                    client.flow(rcv, 50)
                    since_flow = 0
            elif isinstance(ev, Detached | Closed):
                raise AssertionError(ev)

        d.run(lambda: len(got) >= count, receiving)
        assert got == [b"m%d:" % i + b"x" * 100 for i in range(count)]
        client.close(time.monotonic())
        d.run(lambda: client.closed)
        assert d.events[-1] == Closed("closed", None, False)
    finally:
        d.close()
    if presettled:
        return
    d = Driver(port, client_params)
    try:
        d.run(lambda: d.client.opened)
        d.client.attach_receiver("bridge-check", address, credit=10)
        d.run(lambda: any(isinstance(e, Attached) for e in d.events))
        quiet_until = time.monotonic() + 0.3
        d.run(lambda: time.monotonic() > quiet_until)
        assert not any(isinstance(e, Received | Detached | Closed) for e in d.events), d.events
    finally:
        d.close()


def test_proton_c_broker_round_trip(proton_c_broker_port: int) -> None:
    round_trip(proton_c_broker_port, params(hostname="localhost"), "bridge-queue", presettled=True)


@pytest.fixture(scope="module")
def trimaran_port(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    args = ["--mqtt", "off", "--mqtt-ws", "off", "--amqp", "127.0.0.1:0", "--http", "off"]
    env = {"TRIMARAN_AUTH__USERS": ALICE, "TRIMARAN_AUTH__PERMISSIONS": ALICE_PERMISSIONS}
    with serving(RunningServer(args, cwd=tmp_path_factory.mktemp("amqp1-client"), env=env).start()) as server:
        yield server.ports["amqp"]


def test_trimaran_round_trip_with_sasl_plain(trimaran_port: int) -> None:
    round_trip(
        trimaran_port, params(username="alice", password="wonderland"), "bridge-queue", presettled=False
    )


def test_trimaran_refuses_a_wrong_password(trimaran_port: int) -> None:
    d = Driver(trimaran_port, params(username="alice", password="rabbit"))
    try:
        d.run(lambda: d.client.closed)
        assert d.events == [Closed("authentication failed (code 1)", None, True)]
    finally:
        d.close()


@pytest.fixture(scope="module")
def rabbitmq_amqp1_port(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    why = rabbitmq.available()
    if why is not None:
        pytest.skip(why)
    try:
        base: Path = tmp_path_factory.mktemp("rabbitmq-amqp1-client")
        with rabbitmq.rabbitmq_node(base, ("rabbitmq_amqp1_0",)) as port:
            rabbitmq.define(port, {"alice": "a"}, permissions=[("alice", "/", ".*", ".*", ".*")])
            yield port
    except RuntimeError as exc:
        pytest.skip(str(exc))


@pytest.mark.slow  # RabbitMQ takes about 7 s to start
def test_rabbitmq_round_trip(rabbitmq_amqp1_port: int) -> None:
    round_trip(
        rabbitmq_amqp1_port, params(username="alice", password="a"), "/queue/bridge-queue", presettled=False
    )
