"""AMQP 1.0 edge cases over a raw socket (frames built with our codec), and SASL refusals / idle
time-outs with proton, against a server that refuses anonymous clients and has a short idle time-out."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

proton = pytest.importorskip("proton")

from proton import ConnectionException, Message  # noqa: E402
from proton.utils import BlockingConnection  # noqa: E402

from tests.interop.conftest import amqp1_server_args  # noqa: E402
from tests.support.server import ALICE, ALICE_PERMISSIONS, RunningServer, serving  # noqa: E402
from trimaran.amqp1.frames import (  # noqa: E402
    AMQP_HEADER,
    FRAME_AMQP,
    FRAME_SASL,
    SASL_HEADER,
    Frame,
    FrameDecoder,
    encode_frame,
)
from trimaran.amqp1.messages import Message as A1Message  # noqa: E402
from trimaran.amqp1.messages import encode_message  # noqa: E402
from trimaran.amqp1.performatives import (  # noqa: E402
    ROLE_SENDER,
    Attach,
    Begin,
    Close,
    Composite,
    Detach,
    Disposition,
    Flow,
    Open,
    Rejected,
    SaslInit,
    SaslMechanisms,
    SaslOutcome,
    Source,
    Target,
    Transfer,
)

IDLE_S = 1.0

P = TypeVar("P")


@pytest.fixture(scope="module")
def strict_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    env = {
        "TRIMARAN_AUTH__ALLOW_ANONYMOUS": "false",
        "TRIMARAN_AUTH__USERS": ALICE,
        "TRIMARAN_AUTH__PERMISSIONS": ALICE_PERMISSIONS,
        "TRIMARAN_LIMITS__SYS_INTERVAL": "0",
        "TRIMARAN_AMQP1__IDLE_TIMEOUT_S": str(IDLE_S),
    }
    workdir: Path = tmp_path_factory.mktemp("amqp1-strict")
    with serving(RunningServer(amqp1_server_args(), cwd=workdir, env=env).start()) as server:
        yield server


@pytest.fixture
def port(strict_server: RunningServer) -> int:
    return strict_server.ports["amqp"]


class Wire:
    """A raw AMQP 1.0 client: send performatives, read frames."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        self.decoder = FrameDecoder()

    def close(self) -> None:
        self.sock.close()

    def raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send(self, perf: Composite, channel: int = 0, payload: bytes = b"", ftype: int = FRAME_AMQP) -> None:
        self.sock.sendall(bytes(encode_frame(ftype, channel, perf, payload)))

    def _fill(self) -> bool:
        data = self.sock.recv(65536)
        if not data:
            return False
        self.decoder.feed(data)
        return True

    def header(self) -> bytes:
        while True:
            hdr = self.decoder.next_header()
            if isinstance(hdr, bytes):
                return hdr
            assert self._fill(), "closed before a header"

    def frame(self) -> Frame | None:
        """The next frame, or None once the server has closed the socket."""
        while True:
            f = self.decoder.next_frame()
            if isinstance(f, Frame):
                return f
            if not self._fill():
                return None

    def perf(self, skip_empty: bool = True) -> Any:
        while True:
            f = self.frame()
            if f is None:
                return None
            if f.is_empty and skip_empty:
                continue
            return None if f.is_empty else f.performative()[0]

    def expect(self, kind: type[P]) -> P:
        got = self.perf()
        assert isinstance(got, kind), got
        return got

    def login(self, user: str = "alice", password: str = "wonderland") -> None:
        self.raw(SASL_HEADER)
        assert self.header() == SASL_HEADER
        self.expect(SaslMechanisms)
        self.send(
            SaslInit(mechanism="PLAIN", initial_response=f"\0{user}\0{password}".encode()), ftype=FRAME_SASL
        )
        assert self.expect(SaslOutcome).code == 0
        self.raw(AMQP_HEADER)
        assert self.header() == AMQP_HEADER

    def open_session(self, idle_ms: int | None = None) -> Open:
        self.send(Open(container_id="wire", idle_time_out=idle_ms))
        opened = self.expect(Open)
        self.send(Begin(next_outgoing_id=0, incoming_window=100, outgoing_window=100))
        self.expect(Begin)
        return opened


@pytest.fixture
def wire(port: int) -> Iterator[Wire]:
    w = Wire(port)
    try:
        yield w
    finally:
        w.close()


def test_anonymous_refused_when_not_allowed(wire: Wire) -> None:
    wire.raw(SASL_HEADER)
    assert wire.header() == SASL_HEADER
    mechanisms = wire.expect(SaslMechanisms)
    assert list(mechanisms.sasl_server_mechanisms) == ["PLAIN"]
    wire.send(SaslInit(mechanism="ANONYMOUS"), ftype=FRAME_SASL)
    assert wire.expect(SaslOutcome).code != 0
    assert wire.frame() is None  # and closed


def test_plain_amqp_header_without_sasl_is_answered_with_sasl(wire: Wire) -> None:
    wire.raw(AMQP_HEADER)
    assert wire.header() == SASL_HEADER
    assert wire.frame() is None


def test_proton_anonymous_refused(port: int) -> None:
    with pytest.raises(ConnectionException):
        BlockingConnection(f"127.0.0.1:{port}", timeout=5, allowed_mechs="ANONYMOUS")


def test_server_sends_heartbeats_and_closes_a_silent_peer(wire: Wire) -> None:
    wire.login()
    opened = wire.open_session(idle_ms=400)
    assert opened.idle_time_out == int(IDLE_S * 500)  # half of ours, as the spec recommends
    started = time.monotonic()
    heartbeats = 0
    while True:
        f = wire.frame()
        assert f is not None, "closed without a close frame"
        if f.is_empty:
            heartbeats += 1
            continue
        close = f.performative()[0]
        break
    assert isinstance(close, Close)
    assert close.error is not None and close.error.condition == "amqp:resource-limit-exceeded"
    assert time.monotonic() - started >= IDLE_S * 0.8
    assert heartbeats >= 2  # we asked for one every 200 ms


def test_proton_idle_connection_stays_up(port: int) -> None:
    c = BlockingConnection(f"127.0.0.1:{port}", timeout=10, user="alice", password="wonderland", heartbeat=1)
    try:
        # Let proton's loop run (a plain sleep would starve its own heartbeats): both sides'
        # heartbeats keep the connection open although no frame carries anything.
        with pytest.raises(proton.Timeout):
            c.wait(lambda: False, timeout=IDLE_S * 2.5)
        sender = c.create_sender("idle-q")
        sender.send(Message(body="still here"))
        receiver = c.create_receiver("idle-q")
        assert receiver.receive(timeout=5).body == "still here"
        receiver.accept()
    finally:
        c.close()


def _attach_sender(wire: Wire, address: str) -> None:
    wire.send(
        Attach(
            name="s",
            handle=0,
            role=ROLE_SENDER,
            source=Source(address="wire"),
            target=Target(address=address),
            initial_delivery_count=0,
        )
    )
    wire.expect(Attach)
    flow = wire.expect(Flow)
    assert flow.link_credit and flow.link_credit > 0


def test_undecodable_message_is_rejected_with_decode_error(wire: Wire) -> None:
    wire.login()
    wire.open_session()
    _attach_sender(wire, "wire-q")
    wire.send(
        Transfer(handle=0, delivery_id=0, delivery_tag=b"1", message_format=0), payload=b"\x00\x53\x75\xa0"
    )
    disposition = wire.expect(Disposition)
    assert isinstance(disposition.state, Rejected)
    assert disposition.state.error is not None
    assert disposition.state.error.condition == "amqp:decode-error"
    # The link is still usable.
    good = encode_message(A1Message.from_value("fine"))
    wire.send(Transfer(handle=0, delivery_id=1, delivery_tag=b"2", message_format=0), payload=good)
    got = wire.perf()
    while isinstance(got, Flow):
        got = wire.perf()
    assert isinstance(got, Disposition) and got.first == 1
    assert type(got.state).__name__ == "Accepted"


def test_undecodable_presettled_message_detaches_the_link(wire: Wire) -> None:
    wire.login()
    wire.open_session()
    _attach_sender(wire, "topic://wire/t")
    wire.send(
        Transfer(handle=0, delivery_id=0, delivery_tag=b"1", message_format=0, settled=True),
        payload=b"\xff\xff",
    )
    detach = wire.expect(Detach)
    assert detach.error is not None and detach.error.condition == "amqp:decode-error"


def test_garbage_frame_closes_with_a_decode_error(wire: Wire) -> None:
    wire.login()
    wire.open_session()
    wire.raw(b"\x00\x00\x00\x0c\x02\x00\x00\x00\x00\x53\x99\x45")  # an unknown performative
    close = wire.expect(Close)
    assert close.error is not None and close.error.condition == "amqp:decode-error"


def test_unknown_protocol_header_is_answered_and_closed(wire: Wire) -> None:
    wire.raw(b"AMQP\x02\x01\x00\x00")  # AMQP 1.0 over TLS, not offered on this port
    hdr = wire.header()
    assert hdr in (SASL_HEADER, AMQP_HEADER)
    assert wire.frame() is None


def test_aborted_transfer_is_dropped_and_the_next_one_delivered(wire: Wire, port: int) -> None:
    wire.login()
    wire.open_session()
    _attach_sender(wire, "topic://wire/aborted")
    c = BlockingConnection(f"127.0.0.1:{port}", timeout=10, user="alice", password="wonderland")
    try:
        receiver = c.create_receiver("topic://wire/aborted", credit=5)
        part = encode_message(A1Message.from_value("never" * 100))
        wire.send(
            Transfer(handle=0, delivery_id=0, delivery_tag=b"1", message_format=0, more=True),
            payload=part[:50],
        )
        wire.send(Transfer(handle=0, aborted=True))
        good = encode_message(A1Message.from_value("whole"))
        wire.send(
            Transfer(handle=0, delivery_id=1, delivery_tag=b"2", message_format=0, settled=True), payload=good
        )
        assert receiver.receive(timeout=5).body == "whole"
        with pytest.raises(proton.Timeout):
            receiver.receive(timeout=0.3)
    finally:
        c.close()
