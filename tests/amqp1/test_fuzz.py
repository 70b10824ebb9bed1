"""Random performatives thrown at an open connection: the server answers with AMQP errors,
never with an exception and never with amqp:internal-error (which would be a bug of ours)."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.amqp1.amqp1_client import Client
from tests.amqp1.test_performatives import composite_strategy
from trimaran.amqp1.connection import ServerConnection
from trimaran.amqp1.events import ConnectionClosed, LinkAttached, MessageReceived
from trimaran.amqp1.frames import encode_frame
from trimaran.amqp1.performatives import (
    FRAME_TYPES,
    ROLE_RECEIVER,
    ROLE_SENDER,
    Accepted,
    Attach,
    Begin,
    Flow,
)

frames = st.lists(
    st.tuples(
        st.integers(0, 3), st.one_of(*(composite_strategy(c) for c in FRAME_TYPES)), st.binary(max_size=20)
    ),
    max_size=8,
)


def react(conn: ServerConnection, events: list[Any]) -> None:
    """A handler that accepts everything, grants credit and settles what arrives."""
    for ev in events:
        assert not (
            isinstance(ev, ConnectionClosed)
            and ev.error is not None
            and ev.error.condition == "amqp:internal-error"
        ), ev
        if isinstance(ev, LinkAttached):
            conn.accept_link(ev.link, initial_credit=5)
        elif isinstance(ev, MessageReceived) and ev.link.is_open:
            conn.settle(ev.link, ev.delivery_id, Accepted())
            if ev.link.is_open:
                conn.grant_credit(ev.link, 5)


@given(frames)
@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow])
def test_random_performatives_after_open(script: list[tuple[int, Any, bytes]]) -> None:
    conn = ServerConnection("trimaran", handle_max=7, channel_max=3, now=0.0)
    c = Client(conn)
    c.connect()
    react(conn, c.send(Begin(next_outgoing_id=0, incoming_window=10, outgoing_window=10)))
    react(conn, c.send(Attach(name="s", handle=0, role=ROLE_SENDER, initial_delivery_count=0)))
    react(conn, c.send(Attach(name="r", handle=1, role=ROLE_RECEIVER)))
    react(
        conn,
        c.send(Flow(incoming_window=10, next_outgoing_id=0, outgoing_window=10, handle=1, link_credit=3)),
    )
    for channel, perf, payload in script:
        react(conn, c.feed(bytes(encode_frame(0, channel, perf, payload))))
        for link in [lk for s in conn.sessions.values() for lk in s.links]:
            if link.is_sender and link.is_open and link.credit > 0 and link.session.is_open:
                conn.send(link, b"out")
        conn.data_to_send()
