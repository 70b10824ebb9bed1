"""ServerConnection paired with the minimal client of amqp1_client.py, without sockets."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.amqp1.amqp1_client import Client
from trimaran.amqp1.connection import AMQPStateError, ServerConnection
from trimaran.amqp1.events import (
    ConnectionClosed,
    ConnectionOpened,
    DispositionReceived,
    FlowReceived,
    LinkAttached,
    LinkDetached,
    MessageReceived,
    SaslAuthRequested,
    SessionBegun,
    SessionEnded,
    TransferAborted,
)
from trimaran.amqp1.frames import (
    AMQP_HEADER,
    EMPTY_FRAME,
    FRAME_AMQP,
    FRAME_SASL,
    SASL_HEADER,
    Frame,
    encode_frame,
)
from trimaran.amqp1.messages import Data, Message, decode_message, encode_message
from trimaran.amqp1.performatives import (
    ROLE_RECEIVER,
    ROLE_SENDER,
    SND_SETTLED,
    Accepted,
    Attach,
    Begin,
    Close,
    Detach,
    Disposition,
    End,
    Error,
    Flow,
    Modified,
    Open,
    Rejected,
    Released,
    SaslInit,
    SaslMechanisms,
    SaslOutcome,
    Source,
    Target,
    Transfer,
)
from trimaran.amqp1.session import LinkState
from trimaran.amqp1.types import Symbol
from trimaran.runtime.machine import drain


def server(**kw: object) -> ServerConnection:
    kw.setdefault("now", 0.0)
    return ServerConnection("trimaran", **kw)  # type: ignore[arg-type]


def connected(**kw: object) -> tuple[ServerConnection, Client]:
    conn = server(**kw)
    c = Client(conn)
    c.connect()
    return conn, c


def closed_error(c: Client) -> Error | None:
    close = [p for p in c.perfs() if isinstance(p, Close)]
    assert close, "server did not close"
    return close[-1].error


# ---- headers and SASL -----------------------------------------------------------------


def test_sasl_plain_credentials_go_to_the_caller() -> None:
    conn = server()
    c = Client(conn)
    ev = c.sasl("PLAIN", b"\x00alice\x00secret")
    assert len(ev) == 1 and isinstance(ev[0], SaslAuthRequested)
    creds = ev[0].credentials
    assert (creds.mechanism, creds.username, creds.password, creds.authzid) == (
        "PLAIN",
        "alice",
        "secret",
        None,
    )
    conn.sasl_complete(True)
    assert drain(conn) == []
    assert c.sasl_outcome().code == 0
    ev = c.open(hostname="h")
    assert isinstance(ev[0], ConnectionOpened) and ev[0].open.hostname == "h"
    o = c.one(Open)
    assert o.container_id == "trimaran" and o.max_frame_size == 65536


def test_sasl_anonymous_with_trace() -> None:
    conn = server()
    c = Client(conn)
    ev = c.sasl("ANONYMOUS", b"me@example")
    assert isinstance(ev[0], SaslAuthRequested)
    assert ev[0].credentials.username is None and ev[0].credentials.trace == "me@example"


def test_sasl_rejected_by_caller_closes() -> None:
    conn = server()
    c = Client(conn)
    c.sasl("PLAIN", b"\x00alice\x00wrong")
    conn.sasl_complete(False)
    ev = drain(conn)
    assert isinstance(ev[0], ConnectionClosed) and ev[0].error is not None
    assert ev[0].error.condition == "amqp:unauthorized-access"
    assert c.sasl_outcome().code == 1
    assert conn.closed


def test_sasl_unoffered_mechanism_and_bad_plain() -> None:
    conn = server(sasl_mechanisms=("PLAIN",))
    c = Client(conn)
    c.feed(SASL_HEADER)
    c.read_header()
    assert c.one(SaslMechanisms).sasl_server_mechanisms == ["PLAIN"]
    ev = c.send(SaslInit(mechanism="ANONYMOUS"), ftype=FRAME_SASL)
    assert isinstance(ev[0], ConnectionClosed)
    assert c.sasl_outcome().code == 1
    conn = server()
    c = Client(conn)
    ev = c.sasl("PLAIN", b"no-nuls")
    assert isinstance(ev[0], ConnectionClosed)
    assert c.sasl_outcome().code == 1


def test_sasl_pipelined_header_and_open_are_processed_after_outcome() -> None:
    conn = server()
    c = Client(conn)
    c.feed(SASL_HEADER)
    c.read_header()
    c.one(SaslMechanisms)
    data = bytes(encode_frame(FRAME_SASL, 0, SaslInit(mechanism="ANONYMOUS"))) + AMQP_HEADER
    data += bytes(encode_frame(0, 0, Open(container_id="c")))
    ev = c.feed(data)
    assert [type(e) for e in ev] == [SaslAuthRequested]
    conn.sasl_complete(True)
    assert [type(e) for e in drain(conn)] == [ConnectionOpened]
    c.decoder.feed(conn.data_to_send())
    outcome = c.decoder.next_frame()
    assert isinstance(outcome, Frame) and outcome.type == FRAME_SASL
    assert outcome.performative()[0] == SaslOutcome(code=0)
    assert c.decoder.next_header() == AMQP_HEADER
    c.one(Open)


def test_amqp_header_without_sasl_is_answered_with_sasl_header_and_closed() -> None:
    conn = server()
    c = Client(conn)
    ev = c.feed(AMQP_HEADER)
    assert isinstance(ev[0], ConnectionClosed)
    assert c.read_header() == SASL_HEADER
    assert conn.closed


def test_unsupported_header_answered_with_ours() -> None:
    conn = server(require_sasl=False)
    c = Client(conn)
    ev = c.feed(b"AMQP\x00\x00\x09\x01")
    assert isinstance(ev[0], ConnectionClosed)
    assert c.read_header() == AMQP_HEADER
    assert conn.closed
    conn.receive_data(b"more", 0.0)
    assert drain(conn) == []


def test_no_sasl_when_not_required() -> None:
    conn = server(require_sasl=False)
    c = Client(conn)
    ev = c.open()
    assert isinstance(ev[0], ConnectionOpened)


def test_header_fed_one_byte_at_a_time() -> None:
    conn = server(require_sasl=False)
    for b in AMQP_HEADER:
        conn.receive_data(bytes([b]), 0.0)
        assert drain(conn) == []
    assert conn.data_to_send() == AMQP_HEADER


# ---- open / close ---------------------------------------------------------------------


def test_open_negotiates_limits() -> None:
    conn = server(max_frame_size=4096, channel_max=7, idle_timeout=10)
    c = Client(conn)
    o = c.connect(max_frame_size=1024, channel_max=3, idle_time_out=2000)
    assert (o.max_frame_size, o.channel_max, o.idle_time_out) == (4096, 7, 5000)
    assert conn.remote_max_frame_size == 1024 and conn.remote_idle_timeout == 2.0


def test_peer_close_is_answered() -> None:
    conn, c = connected()
    ev = c.send(Close(error=Error(condition="amqp:internal-error", description="bye")))
    assert isinstance(ev[0], ConnectionClosed) and ev[0].by_peer
    assert ev[0].error is not None and ev[0].error.description == "bye"
    assert c.one(Close).error is None
    assert conn.closed


def test_caller_close_waits_for_peer() -> None:
    conn, c = connected()
    conn.close(Error(condition="amqp:connection:forced"))
    assert c.one(Close).error.condition == "amqp:connection:forced"
    assert not conn.closed
    assert c.send(Close()) == []
    assert conn.closed


def test_frame_before_open_and_second_open() -> None:
    conn = server(require_sasl=False)
    c = Client(conn)
    c.feed(AMQP_HEADER)
    c.read_header()
    ev = c.send(Begin(next_outgoing_id=0, incoming_window=1, outgoing_window=1))
    assert isinstance(ev[0], ConnectionClosed)
    perfs = c.perfs()
    assert isinstance(perfs[0], Open) and isinstance(perfs[1], Close)
    conn, c = connected()
    ev = c.send(Open(container_id="again"))
    assert isinstance(ev[0], ConnectionClosed)
    assert closed_error(c).condition == "amqp:illegal-state"  # type: ignore[union-attr]


def test_garbage_after_open_is_decode_error() -> None:
    _conn, c = connected()
    ev = c.feed(b"\x00\x00\x00\x0c\x02\x00\x00\x00\x00\x53\x10\xff")
    assert isinstance(ev[0], ConnectionClosed)
    assert closed_error(c).condition == "amqp:decode-error"  # type: ignore[union-attr]


def test_oversized_frame_is_framing_error_before_body_arrives() -> None:
    conn, c = connected(max_frame_size=1024)
    ev = c.feed(b"\x00\x01\x00\x00\x02\x00\x00\x00")
    assert isinstance(ev[0], ConnectionClosed)
    assert closed_error(c).condition == "amqp:connection:framing-error"  # type: ignore[union-attr]
    assert conn.closed


def test_missing_mandatory_field_is_invalid_field() -> None:
    _conn, c = connected()
    # begin with only remote-channel: next-outgoing-id etc. missing
    ev = c.feed(b"\x00\x00\x00\x0e\x02\x00\x00\x00\x00\x53\x11\xc0\x01\x00")
    assert isinstance(ev[0], ConnectionClosed)
    assert closed_error(c).condition == "amqp:invalid-field"  # type: ignore[union-attr]


def test_channel_above_channel_max() -> None:
    _conn, c = connected(channel_max=1)
    ev = c.send(Begin(next_outgoing_id=0, incoming_window=1, outgoing_window=1), channel=5)
    assert isinstance(ev[0], ConnectionClosed)
    assert closed_error(c).condition == "amqp:connection:framing-error"  # type: ignore[union-attr]


def test_frame_on_unmapped_channel() -> None:
    _conn, c = connected()
    ev = c.send(End(), channel=3)
    assert isinstance(ev[0], ConnectionClosed)


# ---- idle time-out --------------------------------------------------------------------


def test_heartbeats_and_idle_timeout() -> None:
    conn = server(idle_timeout=10.0)
    c = Client(conn)
    c.connect(idle_time_out=4000)
    assert conn.next_deadline() == 2.0
    conn.tick(1.0)
    assert drain(conn) == []
    assert conn.data_to_send() == b""
    conn.tick(2.0)
    assert drain(conn) == []
    assert conn.data_to_send() == EMPTY_FRAME
    assert conn.next_deadline() == 4.0
    # the peer's heartbeat keeps us alive
    conn.receive_data(EMPTY_FRAME, 9.0)
    assert drain(conn) == []
    conn.tick(12.0)
    assert drain(conn) == []
    c.now = 12.0
    c.frames()
    conn.tick(19.0)
    ev = drain(conn)
    assert isinstance(ev[0], ConnectionClosed)
    assert ev[0].error is not None and ev[0].error.condition == "amqp:resource-limit-exceeded"
    c.now = 19.0
    assert closed_error(c).condition == "amqp:resource-limit-exceeded"  # type: ignore[union-attr]


def test_a_pause_of_the_runtimes_restarts_the_idle_timeout() -> None:
    """The runtime did not read the peer (flow control) until ``paused``: our idle time-out on it
    starts again there."""
    conn = server(idle_timeout=10.0)
    c = Client(conn)
    c.connect(idle_time_out=4000)
    conn.paused(9.0)
    conn.tick(12.0)
    assert drain(conn) == []
    conn.tick(19.0)
    assert isinstance(drain(conn)[0], ConnectionClosed)


def test_no_idle_timeout() -> None:
    conn, _c = connected(idle_timeout=None)
    assert conn.next_deadline() is None
    conn.tick(1e9)
    assert drain(conn) == []


# ---- sessions -------------------------------------------------------------------------


def test_begin_and_end() -> None:
    _conn, c = connected()
    s, b = c.begin(channel=4)
    assert b.remote_channel == 4 and s.remote_channel == 4
    s2, _b2 = c.begin(channel=9)
    assert {s.channel, s2.channel} == {0, 1}
    ev = c.send(End(), channel=4)
    assert isinstance(ev[0], SessionEnded) and ev[0].by_peer and ev[0].session is s
    assert c.one(End).error is None
    # channel 4 is free again
    s3, _ = c.begin(channel=4)
    assert s3 is not s


def test_begin_on_channel_in_use() -> None:
    _conn, c = connected()
    c.begin()
    ev = c.send(Begin(next_outgoing_id=0, incoming_window=1, outgoing_window=1))
    assert isinstance(ev[0], ConnectionClosed)


def test_caller_end_session() -> None:
    conn, c = connected()
    s, _ = c.begin()
    link = c.attach("l", 0, ROLE_RECEIVER)
    conn.accept_link(link)
    c.frames()
    conn.end_session(s, Error(condition="amqp:internal-error"))
    assert c.one(End).error.condition == "amqp:internal-error"
    assert not link.is_open
    # frames racing with the end are ignored, the peer's end unmaps
    assert c.flow(handle=0, link_credit=5, delivery_count=0) == []
    assert c.send(End()) == []
    assert 0 not in conn.sessions


# ---- links ----------------------------------------------------------------------------


def test_attach_accept_echoes_termini_and_settle_modes() -> None:
    conn, c = connected()
    _s, _ = c.begin()
    link = c.attach("recv-from-q", 3, ROLE_RECEIVER, address="orders", snd_settle_mode=SND_SETTLED)
    assert link.is_sender and link.address == "orders" and link.remote_handle == 3
    conn.accept_link(link)
    a = c.one(Attach)
    assert a.role is ROLE_SENDER and a.handle == 0 and a.name == "recv-from-q"
    assert a.source.address == "orders" and a.snd_settle_mode == SND_SETTLED
    assert a.initial_delivery_count == 0
    assert link.is_open


def test_attach_dynamic_source_gets_address() -> None:
    conn, c = connected()
    c.begin()
    ev = c.send(Attach(name="d", handle=0, role=ROLE_RECEIVER, source=Source(dynamic=True), target=Target()))
    link = ev[0].link
    assert link.remote_attach.source.dynamic
    conn.accept_link(link, source=Source(address="tmp-1", dynamic=True))
    assert c.one(Attach).source.address == "tmp-1"


def test_reject_link_attaches_null_terminus_then_detaches() -> None:
    conn, c = connected()
    c.begin()
    link = c.attach("x", 0, ROLE_SENDER, address="nope")
    conn.reject_link(link, Error(condition="amqp:not-found", description="no such node"))
    a, d = c.perfs()
    assert isinstance(a, Attach) and a.target is None and a.role is ROLE_RECEIVER
    assert (
        isinstance(d, Detach) and d.closed and d.error is not None and d.error.condition == "amqp:not-found"
    )
    assert c.send(Detach(handle=0, closed=True)) == []
    # the handle can be reused
    assert isinstance(c.attach("x", 0, ROLE_SENDER), object)


def test_peer_detach_is_answered() -> None:
    conn, c = connected()
    c.begin()
    link = c.attach("l", 7, ROLE_RECEIVER)
    conn.accept_link(link)
    c.frames()
    ev = c.send(Detach(handle=7, closed=True))
    assert isinstance(ev[0], LinkDetached) and ev[0].by_peer and ev[0].closed and ev[0].link is link
    d = c.one(Detach)
    assert d.closed and d.handle == 0
    with pytest.raises(AMQPStateError):
        conn.send(link, b"x")


def test_attach_handle_errors() -> None:
    _conn, c = connected(handle_max=3)
    c.begin()
    c.attach("a", 1, ROLE_RECEIVER)
    ev = c.send(Attach(name="b", handle=1, role=ROLE_RECEIVER))
    assert [type(e) for e in ev] == [LinkDetached, SessionEnded]
    assert c.one(End).error.condition == "amqp:session:handle-in-use"
    _conn, c = connected(handle_max=3)
    c.begin()
    ev = c.send(Attach(name="b", handle=4, role=ROLE_RECEIVER))
    assert isinstance(ev[0], ConnectionClosed)
    assert closed_error(c).condition == "amqp:connection:framing-error"  # type: ignore[union-attr]


def test_unattached_handle_ends_session() -> None:
    _conn, c = connected()
    c.begin()
    ev = c.flow(handle=9, link_credit=1, delivery_count=0)
    assert isinstance(ev[0], SessionEnded)
    assert c.one(End).error.condition == "amqp:session:unattached-handle"


# ---- sending to the client (server sender) --------------------------------------------


def sender_link(conn: ServerConnection, c: Client, **attach_kw: object):  # type: ignore[no-untyped-def]
    c.begin()
    link = c.attach("out", 0, ROLE_RECEIVER, **attach_kw)
    conn.accept_link(link)
    c.frames()
    return link


def test_credit_and_send() -> None:
    conn, c = connected()
    link = sender_link(conn, c)
    with pytest.raises(AMQPStateError):
        conn.send(link, b"x")
    ev = c.flow(handle=0, link_credit=2, delivery_count=0)
    assert isinstance(ev[0], FlowReceived) and ev[0].credit == 2 and link.credit == 2
    payload = encode_message(Message(body=[Data(b"hello")]))
    d0 = conn.send(link, payload)
    d1 = conn.send(link, payload, tag=b"t")
    assert (d0, d1) == (0, 1) and link.credit == 0
    frames = c.frames()
    t0, t1 = frames[0].perf, frames[1].perf
    assert isinstance(t0, Transfer) and isinstance(t1, Transfer)
    assert t0.delivery_id == 0 and t1.delivery_tag == b"t" and not t0.settled and not t0.more
    assert decode_message(frames[0].payload).data == b"hello"
    with pytest.raises(AMQPStateError):
        conn.send(link, payload)
    # more credit from the receiver: delivery-count 2 + credit 3
    c.flow(handle=0, link_credit=3, delivery_count=2)
    assert link.credit == 3
    # a stale flow (delivery-count 0, credit 3) leaves 1
    c.flow(handle=0, link_credit=3, delivery_count=0)
    assert link.credit == 1


def test_disposition_from_receiver() -> None:
    conn, c = connected()
    link = sender_link(conn, c)
    c.flow(handle=0, link_credit=10, delivery_count=0)
    ids = [conn.send(link, b"m%d" % i) for i in range(4)]
    c.frames()
    ev = c.send(Disposition(role=ROLE_RECEIVER, first=0, last=2, settled=True, state=Accepted()))
    d = ev[0]
    assert isinstance(d, DispositionReceived)
    assert d.role is ROLE_RECEIVER and (d.first, d.last) == (0, 2) and d.settled
    assert isinstance(d.state, Accepted)
    assert [(lk, i) for lk, i, _ in d.deliveries] == [(link, 0), (link, 1), (link, 2)]
    ev = c.send(Disposition(role=ROLE_RECEIVER, first=3, settled=False, state=Rejected(error=None)))
    assert ev[0].deliveries[0][1] == ids[3] and not ev[0].settled
    # the caller settles the remaining one (receiver in rcv-settle-mode second)
    conn.settle(link, 3, Released())
    disp = c.one(Disposition)
    assert disp.role is ROLE_SENDER and disp.first == 3 and disp.settled and isinstance(disp.state, Released)
    ev = c.send(
        Disposition(role=ROLE_RECEIVER, first=0, last=3, settled=True, state=Modified(delivery_failed=True))
    )
    assert ev[0].deliveries == []


def test_runs_of_single_accepted_dispositions_settle_as_ranges() -> None:
    """A receiver settling each delivery with its own disposition (proton's C receive): the buffered
    run of consecutive ones is one range; a gap, another outcome or an unsettled one ends the run."""
    conn, c = connected()
    link = sender_link(conn, c)
    c.flow(handle=0, link_credit=20, delivery_count=0)
    for i in range(12):
        conn.send(link, b"m%d" % i)
    c.frames()

    def one(first: int, **kw: object) -> bytes:
        kw.setdefault("settled", True)
        kw.setdefault("state", Accepted())
        return bytes(encode_frame(FRAME_AMQP, 0, Disposition(role=ROLE_RECEIVER, first=first, **kw)))

    wire = b"".join(one(i) for i in (0, 1, 2, 4, 5))  # a gap after 2
    wire += one(6, state=Rejected(error=None)) + one(7) + one(8, settled=False) + one(9) + one(10)
    ev = c.feed(wire)
    assert [(d.first, d.last, d.settled, type(d.state).__name__) for d in ev] == [
        (0, 2, True, "Accepted"),
        (4, 5, True, "Accepted"),
        (6, 6, True, "Rejected"),
        (7, 7, True, "Accepted"),
        (8, 8, False, "Accepted"),
        (9, 10, True, "Accepted"),
    ]
    assert [i for d in ev for _, i, _ in d.deliveries] == [0, 1, 2, 4, 5, 6, 7, 8, 9, 10]
    # the deliveries settled by the peer are gone; 3 (skipped), 8 (left unsettled) and 11 are not
    assert [i for _, i, _ in c.feed(one(0, last=11))[0].deliveries] == [3, 8, 11]


def test_settled_mode_sends_settled() -> None:
    conn, c = connected()
    link = sender_link(conn, c, snd_settle_mode=SND_SETTLED)
    c.flow(handle=0, link_credit=1, delivery_count=0)
    conn.send(link, b"x", settled=False)
    t = c.one(Transfer)
    assert t.settled is True
    assert link.session.unsettled_out == {}


def test_large_message_split_by_peer_max_frame_size() -> None:
    conn = server()
    c = Client(conn)
    c.connect(max_frame_size=512)
    link = sender_link(conn, c)
    c.flow(handle=0, link_credit=1, delivery_count=0)
    payload = bytes(range(256)) * 20
    conn.send(link, payload)
    data = conn.data_to_send()
    frames = []
    from trimaran.amqp1.frames import FrameDecoder

    dec = FrameDecoder(max_frame_size=512)
    dec.feed(data)
    frames = dec.frames()
    assert len(frames) > 10
    body = b""
    for i, f in enumerate(frames):
        t, rest = f.performative()
        assert isinstance(t, Transfer)
        assert t.more == (i < len(frames) - 1)
        body += bytes(rest)
    assert body == payload
    assert all(len(f.body) + 8 <= 512 for f in frames)


def test_session_window_holds_frames_until_flow() -> None:
    conn, c = connected()
    c.begin(incoming_window=2)
    link = c.attach("out", 0, ROLE_RECEIVER)
    conn.accept_link(link)
    c.frames()
    c.flow(handle=0, link_credit=5, delivery_count=0, incoming_window=2)
    for _ in range(5):
        conn.send(link, b"x")
    assert len([p for p in c.perfs() if isinstance(p, Transfer)]) == 2
    c.flow(next_incoming_id=2, incoming_window=10)
    assert len([p for p in c.perfs() if isinstance(p, Transfer)]) == 3


def test_drain_and_echo() -> None:
    conn, c = connected()
    link = sender_link(conn, c)
    ev = c.flow(handle=0, link_credit=5, delivery_count=0, drain=True, echo=True)
    assert ev[0].drain and link.drain
    f = c.one(Flow)
    assert f.handle == 0 and f.link_credit == 5 and f.delivery_count == 0
    conn.send(link, b"one")
    conn.complete_drain(link)
    perfs = c.perfs()
    assert isinstance(perfs[0], Transfer)
    f = perfs[1]
    assert isinstance(f, Flow) and f.delivery_count == 5 and f.link_credit == 0 and f.drain
    assert link.credit == 0


def test_session_echo() -> None:
    _conn, c = connected()
    c.begin()
    c.flow(echo=True)
    f = c.one(Flow)
    assert f.handle is None and f.next_incoming_id == 0


# ---- receiving from the client (server receiver) --------------------------------------


def receiver_link(conn: ServerConnection, c: Client, credit: int = 10, **kw: object):  # type: ignore[no-untyped-def]
    c.begin()
    link = c.attach("in", 0, ROLE_SENDER)
    conn.accept_link(link, initial_credit=credit, **kw)  # type: ignore[arg-type]
    a, f = c.perfs()
    assert isinstance(a, Attach) and a.role is ROLE_RECEIVER
    assert isinstance(f, Flow) and f.link_credit == credit and f.handle == 0
    return link


def transfer(c: Client, delivery_id: int, payload: bytes, **kw: Any) -> list[Any]:
    kw.setdefault("delivery_tag", b"tag%d" % delivery_id)
    events: list[Any] = c.send(Transfer(handle=0, delivery_id=delivery_id, **kw), payload=payload)
    return events


def test_receive_message_and_accept() -> None:
    conn, c = connected()
    link = receiver_link(conn, c)
    payload = encode_message(Message(body=[Data(b"hi")]))
    ev = transfer(c, 0, payload)
    m = ev[0]
    assert isinstance(m, MessageReceived)
    assert (m.link, m.delivery_id, m.tag, m.settled, m.payload) == (link, 0, b"tag0", False, payload)
    assert link.credit == 9 and link.delivery_count == 1
    conn.settle(link, 0, Accepted())
    d = c.one(Disposition)
    assert d.role is ROLE_RECEIVER and d.first == 0 and d.last is None and d.settled
    assert link.session.unsettled_in == {}


def test_receive_settled_and_settle_range() -> None:
    conn, c = connected()
    link = receiver_link(conn, c)
    ev = transfer(c, 0, b"a", settled=True)
    assert ev[0].settled
    for i in (1, 2, 3):
        transfer(c, i, b"x")
    ev = c.send(Disposition(role=ROLE_SENDER, first=1, last=3, settled=True))
    assert [i for _, i, _ in ev[0].deliveries] == [1, 2, 3]
    conn.settle_range(link.session, ROLE_RECEIVER, 1, 3, Accepted())
    d = c.one(Disposition)
    assert (d.first, d.last) == (1, 3)


def test_multi_frame_transfer_reassembled() -> None:
    conn, c = connected()
    receiver_link(conn, c)
    assert transfer(c, 0, b"abc", more=True) == []
    assert c.send(Transfer(handle=0, more=True), payload=b"def") == []
    ev = c.send(Transfer(handle=0, delivery_id=0), payload=b"gh")
    assert ev[0].payload == b"abcdefgh"


def test_aborted_transfer() -> None:
    conn, c = connected()
    link = receiver_link(conn, c)
    transfer(c, 0, b"abc", more=True)
    ev = c.send(Transfer(handle=0, aborted=True))
    assert isinstance(ev[0], TransferAborted) and ev[0].delivery_id == 0
    ev = transfer(c, 1, b"next")
    assert ev[0].payload == b"next" and link.credit == 8


def test_transfer_without_credit() -> None:
    conn, c = connected()
    receiver_link(conn, c, credit=1)
    transfer(c, 0, b"a")
    ev = transfer(c, 1, b"b")
    assert isinstance(ev[0], LinkDetached) and not ev[0].by_peer
    d = c.one(Detach)
    assert d.closed and d.error.condition == "amqp:link:transfer-limit-exceeded"


def test_transfers_read_in_one_step_keep_their_order_and_limits() -> None:
    """Transfers buffered together are read in one step: their events in order, the one beyond the
    credit ends the link and what follows it on the detached link is not delivered."""
    conn, c = connected()
    link = receiver_link(conn, c, credit=2)
    wire = b"".join(
        bytes(encode_frame(FRAME_AMQP, 0, Transfer(handle=0, delivery_id=i, delivery_tag=b"t"), b"m%d" % i))
        for i in range(4)
    )
    conn.receive_data(wire, 0.0)
    first = conn.next_event()
    assert isinstance(first, MessageReceived) and first.payload == b"m0"
    rest = drain(conn)
    assert [type(e).__name__ for e in rest] == ["MessageReceived", "LinkDetached"]
    assert rest[1].link is link and link.state is not LinkState.ATTACHED
    assert c.one(Detach).error.condition == "amqp:link:transfer-limit-exceeded"


def test_transfers_parsed_ahead_of_a_close_are_of_detached_links() -> None:
    """The front end drops a message whose link is not attached: those read in the same step as
    one whose handling closed the connection are."""
    conn, c = connected()
    link = receiver_link(conn, c)
    wire = b"".join(
        bytes(encode_frame(FRAME_AMQP, 0, Transfer(handle=0, delivery_id=i, delivery_tag=b"t%d" % i), b"m"))
        for i in range(3)
    )
    conn.receive_data(wire, 0.0)
    assert isinstance(conn.next_event(), MessageReceived)
    conn.close(Error(condition=Symbol("amqp:internal-error")))
    later = drain(conn)
    assert later and all(isinstance(e, MessageReceived) and e.link is link for e in later)
    assert link.state is LinkState.DETACHED


def test_message_size_exceeded() -> None:
    conn, c = connected(max_message_size=10)
    c.begin()
    link = c.attach("in", 0, ROLE_SENDER)
    conn.accept_link(link, initial_credit=5)
    a = c.perfs()[0]
    assert isinstance(a, Attach) and a.max_message_size == 10
    transfer(c, 0, b"12345", more=True)
    ev = c.send(Transfer(handle=0, more=True), payload=b"678901")
    assert isinstance(ev[0], LinkDetached)
    assert c.one(Detach).error.condition == "amqp:link:message-size-exceeded"


def test_session_window_violation() -> None:
    conn, c = connected(incoming_window=2)
    receiver_link(conn, c, credit=100)
    burst = b"".join(
        bytes(encode_frame(0, 0, Transfer(handle=0, delivery_id=i, delivery_tag=b"t"), b"x"))
        for i in range(3)
    )
    ev = c.feed(burst)[2:]
    assert [type(e) for e in ev] == [LinkDetached, SessionEnded]
    assert c.one(End).error.condition == "amqp:session:window-violation"


def test_incoming_window_is_replenished() -> None:
    conn, c = connected(incoming_window=4)
    receiver_link(conn, c, credit=100)
    for i in range(20):
        ev = transfer(c, i, b"x")
        assert isinstance(ev[0], MessageReceived)
    flows = [p for p in c.perfs() if isinstance(p, Flow)]
    assert flows and flows[-1].incoming_window == 4


def test_transfer_on_sender_link_is_not_allowed() -> None:
    conn, c = connected()
    sender_link(conn, c)
    ev = transfer(c, 0, b"a")
    assert isinstance(ev[0], LinkDetached)
    assert c.one(Detach).error.condition == "amqp:not-allowed"


def test_transfer_before_accept() -> None:
    _conn, c = connected()
    c.begin()
    c.attach("in", 0, ROLE_SENDER)
    ev = transfer(c, 0, b"a")
    assert isinstance(ev[0], LinkDetached)
    a, d = c.perfs()
    assert isinstance(a, Attach) and isinstance(d, Detach) and d.error is not None
    assert d.error.condition == "amqp:link:transfer-limit-exceeded"


def test_sender_flow_updates_receiver_state() -> None:
    conn, c = connected()
    link = receiver_link(conn, c, credit=10)
    ev = c.flow(handle=0, delivery_count=10, link_credit=0, available=0, drain=True)
    assert isinstance(ev[0], FlowReceived)
    assert link.delivery_count == 10 and link.credit == 0


def test_full_round_trip_with_every_event_type() -> None:
    conn = server()
    c = Client(conn)
    c.connect()
    ev = c.send(Begin(next_outgoing_id=0, incoming_window=100, outgoing_window=100))
    assert isinstance(ev[0], SessionBegun)
    ev = c.send(
        Attach(name="p", handle=0, role=ROLE_SENDER, initial_delivery_count=0, target=Target(address="a"))
    )
    assert isinstance(ev[0], LinkAttached)


def test_detach_not_closed_is_echoed() -> None:
    conn, c = connected()
    c.begin()
    link = c.attach("l", 0, ROLE_RECEIVER)
    conn.accept_link(link)
    c.frames()
    ev = c.send(Detach(handle=0, closed=False))
    assert isinstance(ev[0], LinkDetached) and not ev[0].closed
    assert c.one(Detach).closed is False


def test_detach_drops_frames_waiting_for_the_window() -> None:
    conn, c = connected()
    c.begin(incoming_window=1)
    link = c.attach("out", 0, ROLE_RECEIVER)
    conn.accept_link(link)
    c.frames()
    c.flow(handle=0, link_credit=5, delivery_count=0, incoming_window=1)
    conn.send(link, b"a")
    conn.send(link, b"b")
    assert len(link.session.pending) == 1
    conn.detach_link(link, Error(condition="amqp:internal-error"))
    assert not link.session.pending
    perfs = c.perfs()
    assert [type(p) for p in perfs] == [Transfer, Detach]
    # the peer's window opens later: nothing more is sent for the detached link
    c.flow(next_incoming_id=1, incoming_window=10)
    assert c.perfs() == []


def test_close_before_open() -> None:
    conn = server(require_sasl=False)
    c = Client(conn)
    c.feed(AMQP_HEADER)
    c.read_header()
    ev = c.send(Close(error=Error(condition="amqp:internal-error")))
    assert isinstance(ev[0], ConnectionClosed) and ev[0].by_peer
    assert [type(p) for p in c.perfs()] == [Open, Close]
    assert conn.closed


def _conversation() -> bytes:
    frames = [
        Open(container_id="c", idle_time_out=1000),
        Begin(next_outgoing_id=0, incoming_window=100, outgoing_window=100),
        Attach(name="r", handle=0, role=ROLE_RECEIVER, source=Source(address="q")),
        Flow(
            next_incoming_id=0,
            incoming_window=100,
            next_outgoing_id=0,
            outgoing_window=100,
            handle=0,
            delivery_count=0,
            link_credit=3,
            drain=True,
        ),
        None,
        Detach(handle=0, closed=True),
        End(),
        Close(),
    ]
    out = bytearray(AMQP_HEADER)
    for perf in frames:
        encode_frame(0, 0, perf, out=out)
    return bytes(out)


def _summary(events: list[Any]) -> list[tuple[Any, ...]]:
    return [(type(e).__name__, getattr(e, "by_peer", None), getattr(e, "credit", None)) for e in events]


@given(st.lists(st.integers(1, 60), max_size=30))
@settings(max_examples=60)
def test_any_split_of_the_input_gives_the_same_events(cuts: list[int]) -> None:
    data = _conversation()
    whole = server(require_sasl=False)
    whole.receive_data(data, 0.0)
    expected = _summary(drain(whole))
    assert [e[0] for e in expected] == [
        "ConnectionOpened",
        "SessionBegun",
        "LinkAttached",
        "FlowReceived",
        "LinkDetached",
        "SessionEnded",
        "ConnectionClosed",
    ]
    split = server(require_sasl=False)
    got: list[Any] = []
    pos = 0
    for n in [*cuts, len(data)]:
        split.receive_data(data[pos : pos + n], 0.0)
        got += drain(split)
        pos += n
    assert _summary(got) == expected
    assert split.data_to_send() == whole.data_to_send()


# ---- one frame at a time, deadlines of the handshake and the close ---------------------


def test_transfer_read_with_its_detach_is_handed_out_while_the_link_is_open() -> None:
    conn, c = connected()
    link = receiver_link(conn, c)
    data = bytes(encode_frame(0, 0, Transfer(handle=0, delivery_id=0, delivery_tag=b"t", settled=True), b"m"))
    data += bytes(encode_frame(0, 0, Detach(handle=0, closed=True)))
    data += bytes(encode_frame(0, 0, End()))
    conn.receive_data(data, 0.0)
    assert conn.data_to_send() == b""  # nothing parsed yet
    first = conn.next_event()
    assert isinstance(first, MessageReceived) and first.payload == b"m"
    assert link.is_open, "the detach behind the transfer must not be read yet"
    conn.settle(link, 0, Accepted())  # the caller can still act on the link
    rest = drain(conn)
    assert [type(e) for e in rest] == [LinkDetached, SessionEnded]
    assert not link.is_open
    assert [type(p) for p in c.perfs()] == [Disposition, Detach, End]


def test_silent_socket_is_closed_at_the_handshake_deadline() -> None:
    conn = server(handshake_timeout=5.0, now=100.0)
    assert conn.next_deadline() == 105.0
    conn.tick(104.0)
    assert drain(conn) == [] and not conn.closed
    conn.tick(105.0)
    [ev] = drain(conn)
    assert isinstance(ev, ConnectionClosed) and ev.error is not None
    assert ev.error.condition == "amqp:resource-limit-exceeded"
    assert conn.closed and conn.next_deadline() is None


def test_sasl_not_finished_in_time_is_closed_and_open_stops_the_clock() -> None:
    conn = server(handshake_timeout=5.0)
    c = Client(conn)
    c.feed(SASL_HEADER)  # and then nothing
    conn.tick(5.0)
    assert isinstance(drain(conn)[0], ConnectionClosed) and conn.closed
    conn, c = connected(handshake_timeout=5.0, idle_timeout=None)
    assert conn.next_deadline() is None
    conn.tick(50.0)
    assert not conn.closed


def test_open_not_sent_in_time_gets_open_and_close_with_the_reason() -> None:
    conn = server(handshake_timeout=5.0, require_sasl=False)
    c = Client(conn)
    c.feed(AMQP_HEADER)
    c.read_header()
    conn.tick(6.0)
    assert isinstance(drain(conn)[0], ConnectionClosed)
    perfs = c.perfs()
    assert [type(p) for p in perfs] == [Open, Close]
    assert conn.closed


def test_our_close_waits_for_the_peer_at_most_close_timeout() -> None:
    conn, c = connected(close_timeout=2.0, idle_timeout=None)
    conn.receive_data(b"", 10.0)
    conn.close(Error(condition="amqp:connection:forced"))
    assert drain(conn) == []
    assert not conn.closed and conn.next_deadline() == 12.0
    conn.tick(12.0)
    assert conn.closed
    assert closed_error(c).condition == "amqp:connection:forced"  # type: ignore[union-attr]


def test_eof_ends_the_connection() -> None:
    conn, _c = connected()
    conn.receive_eof()
    [ev] = drain(conn)
    assert isinstance(ev, ConnectionClosed) and ev.by_peer and ev.error is None
    assert conn.closed
