"""Session state: packet identifiers, the outbound inflight window, and serialization."""

from __future__ import annotations

import base64
import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.mqtt.mqtt_client import Client, answer, connected, eof, props, start
from tests.mqtt.mqtt_strategies import properties
from trimaran.mqtt.packets import PubAck, Publish, SubscriptionOptions, granted_options
from trimaran.mqtt.properties import PacketType
from trimaran.mqtt.session import (
    AWAITING_PUBACK,
    AWAITING_PUBCOMP,
    AWAITING_PUBREC,
    NO_BACKLOG,
    NO_SUBSCRIPTIONS,
    Backlog,
    OutboundMessage,
    Session,
    Subscription,
    _message_to_dict,
    message_json,
)


def test_packet_ids_skip_ids_in_use_and_wrap() -> None:
    session = Session("c")
    assert [session.allocate_packet_id() for _ in range(3)] == [1, 2, 3]
    session.next_packet_id = 0xFFFF
    session.enqueue(OutboundMessage("t", b"", 1))
    entry = session.next_to_send(10)
    assert entry is not None and entry.packet_id == 0xFFFF
    assert session.allocate_packet_id() == 1  # wraps past 65535, never 0
    session.inflight[2] = session.inflight.pop(0xFFFF)
    assert session.allocate_packet_id() == 3  # 2 is in use


def test_all_ids_in_use() -> None:
    session = Session("c")
    session.inflight = dict.fromkeys(range(1, 0x10000))  # type: ignore[assignment]
    with pytest.raises(RuntimeError):
        session.allocate_packet_id()


def test_window_and_queue() -> None:
    session = Session("c", max_queued=3)
    for i in range(4):
        assert session.enqueue(OutboundMessage("t", bytes([i]), 1 + i % 2)) == (i < 3)
    assert session.dropped == 1
    first = session.next_to_send(2)
    second = session.next_to_send(2)
    assert first is not None and second is not None
    assert session.next_to_send(2) is None  # window full
    assert first.state == AWAITING_PUBACK and second.state == AWAITING_PUBREC
    assert session.on_pubcomp(second.packet_id) is None  # wrong step
    assert session.on_pubrec(first.packet_id) is None  # QoS 1 has no PUBREC
    assert session.on_pubrec(second.packet_id) is second and second.state == AWAITING_PUBCOMP
    assert session.on_pubrec(second.packet_id) is second  # repeated PUBREC: PUBREL again
    assert session.on_puback(first.packet_id) is first
    assert session.on_puback(first.packet_id) is None
    assert session.on_pubcomp(second.packet_id) is second
    assert not session.inflight
    with pytest.raises(ValueError):
        session.enqueue(OutboundMessage("t", b"", 0))


def test_the_queue_is_bounded_in_bytes_as_well_as_messages() -> None:
    session = Session("c", max_queued=100, max_queued_bytes=1000)
    big = OutboundMessage("t/1", b"x" * 400, 1)  # 403 bytes with its topic
    assert session.enqueue(big) and session.enqueue(big)
    assert not session.enqueue(big)  # 1,209 > 1,000: refused and counted
    assert session.dropped == 1 and session.queue.bytes == 806
    assert session.enqueue(OutboundMessage("t", b"y" * 100, 1))  # small ones still fit
    session.next_to_send(window=1)  # one leaves for the window: its bytes no longer count
    assert session.queue.bytes == 806 - 403 + 101
    assert Session.from_dict(session.to_dict()).queue.bytes == session.queue.bytes
    session.queue.clear()
    assert session.queue.bytes == 0 and session.enqueue(big)


def test_an_idle_session_shares_the_empty_backlog_until_a_message_waits() -> None:
    """No backlog object per idle session (issue #47); the first queued message makes its own, and
    one drained keeps it (its numbers go on); the shared one is never written."""
    idle, busy = Session("idle"), Session("busy")
    assert idle.queue is NO_BACKLOG and busy.queue is NO_BACKLOG and not idle.queue
    assert busy.enqueue(OutboundMessage("t", b"x", 1))
    assert busy.queue is not NO_BACKLOG and len(busy.queue) == 1 and idle.queue is NO_BACKLOG
    assert busy.next_to_send(1) is not None and not busy.queue and busy.queue.first_seq == 1
    assert Session.from_dict(idle.to_dict()).queue is NO_BACKLOG
    again = Session.from_dict(busy.to_dict())  # renumbered: its own, empty
    assert again.queue is not NO_BACKLOG and again.queue.first_seq == 1 and not again.queue
    assert NO_BACKLOG.items is None and NO_BACKLOG.first_seq == 0 and NO_BACKLOG.bytes == 0


@given(st.lists(st.tuples(st.booleans(), st.sampled_from(["a", "b", "c"]), st.integers(0, 2)), max_size=12))
def test_a_sessions_subscriptions_read_as_the_dict_of_them(steps: list[tuple[bool, str, int]]) -> None:
    """None: the shared empty mapping; one: held alone (the Subscription itself, not a dict of one:
    issue #47); several: a dict. Read alike whichever, in the order they came."""
    session = Session("c")
    model: dict[str, Subscription] = {}
    for add, topic_filter, qos in steps:
        if add:
            sub = Subscription(topic_filter, granted_options(qos), qos or None)
            assert session.add_subscription(sub) == (topic_filter not in model)
            model[topic_filter] = sub
        else:
            assert session.remove_subscription(topic_filter) == (model.pop(topic_filter, None) is not None)
        held = session.subscriptions
        assert (held is NO_SUBSCRIPTIONS) == (not model)
        assert isinstance(held, Subscription) == (len(model) == 1)
        assert held == model and model == held and held != {**model, "x": None}
        with pytest.raises(TypeError):
            hash(held)
        assert len(held) == len(model) and bool(held) == bool(model) and list(held) == list(model)
        assert list(held.keys()) == list(model) and list(held.values()) == list(model.values())
        assert list(held.items()) == list(model.items())
        for name in ("a", "b", "c"):
            assert (name in held) == (name in model) and held.get(name) is model.get(name)
            if name in model:
                assert held[name] is model[name]
            else:
                with pytest.raises(KeyError):
                    held[name]
        assert Session.from_json(session.to_json()).subscriptions == model


def test_pubrec_error_ends_flow() -> None:
    session = Session("c")
    session.enqueue(OutboundMessage("t", b"", 2))
    entry = session.next_to_send(1)
    assert entry is not None
    assert session.on_pubrec(entry.packet_id, 0x80) is entry
    assert entry.packet_id not in session.inflight


def _populated() -> Session:
    session = Session("client-1", expiry_interval=300, max_queued=50)
    session.add_subscription(Subscription("a/#", SubscriptionOptions(1, True, False, 2), 9))
    session.add_subscription(Subscription("$share/g/b", SubscriptionOptions(2)))
    for i, qos in enumerate((1, 2, 2, 1)):
        session.enqueue(
            OutboundMessage(
                f"t/{i}",
                bytes([i, 0, 255]),
                qos,
                retain=bool(i % 2),
                properties=props(content_type="x", user_properties=[("k", "v"), ("k", "v")]),
                tag=i if i % 2 else f"tag-{i}",
            )
        )
    a = session.next_to_send(3)
    b = session.next_to_send(3)
    assert a is not None and b is not None
    a.sent = True
    session.on_pubrec(b.packet_id)
    session.inbound_qos2 = dict.fromkeys((5, 77))
    return session


def test_to_dict_round_trip() -> None:
    session = _populated()
    again = Session.from_dict(session.to_dict())
    assert again.to_dict() == session.to_dict()
    assert again.client_id == "client-1" and again.expiry_interval == 300
    assert list(again.inflight) == list(session.inflight)
    assert [e.state for e in again.inflight.values()] == [AWAITING_PUBACK, AWAITING_PUBCOMP]
    assert again.inflight_entries()[0].sent
    assert again.queue == session.queue
    assert again.subscriptions == session.subscriptions
    assert set(again.inbound_qos2) == {5, 77}
    assert again.allocate_packet_id() == session.allocate_packet_id()


def test_the_owner_is_kept_and_an_old_session_has_none() -> None:
    session = _populated()
    assert Session.from_dict(session.to_dict()).owner is None
    for owner in (("alice",), (None,)):  # a user, anonymous
        session.owner = owner
        assert Session.from_json(session.to_json()).owner == owner
    older = session.to_dict()
    del older["owner"]
    assert Session.from_dict(older).owner is None


def test_json_round_trip_is_plain_json() -> None:
    session = _populated()
    data = session.to_json()
    json.loads(data)  # plain JSON, bytes base64-encoded
    assert Session.from_json(data).to_dict() == session.to_dict()


def _b64(value: object) -> str:
    """The encoder's rule for bytes in a saved session (``to_dict``'s payloads and properties)."""
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    raise TypeError(f"cannot serialize {type(value).__name__}")


_NAMES = st.text(max_size=12)  # any text: quotes, backslashes, control and non-ASCII characters


@st.composite
def _messages(draw: st.DrawFn) -> OutboundMessage:
    p = draw(properties(PacketType.PUBLISH))
    p.topic_alias = None  # per connection, never stored
    p.subscription_identifiers = p.subscription_identifiers[:1]
    return OutboundMessage(
        draw(_NAMES),
        draw(st.binary(max_size=12)),
        draw(st.integers(1, 2)),
        draw(st.booleans()),
        p,
        draw(st.none() | _NAMES | st.integers(-(2**63), 2**63)),
        draw(st.none() | st.floats(allow_nan=False) | st.sampled_from([math.inf, -math.inf])),
    )


@settings(max_examples=300, deadline=None)
@given(
    client_id=_NAMES,
    numbers=st.tuples(*[st.integers(0, 2**32)] * 6),
    owner=st.none() | st.tuples(st.none() | _NAMES),
    subscriptions=st.lists(
        st.tuples(
            _NAMES,
            st.integers(0, 2),
            st.booleans(),
            st.booleans(),
            st.integers(0, 2),
            st.none() | st.integers(1, 268_435_455),
        ),
        max_size=4,
    ),
    qos2=st.none() | st.sets(st.integers(1, 0xFFFF), max_size=4),
    inflight=st.lists(
        st.tuples(
            _messages(), st.sampled_from([AWAITING_PUBACK, AWAITING_PUBREC, AWAITING_PUBCOMP]), st.booleans()
        ),
        max_size=3,
    ),
    queued=st.lists(_messages(), max_size=3),
    with_queue=st.booleans(),
)
def test_a_saved_sessions_text_is_the_encoders(
    client_id: str,
    numbers: tuple[int, ...],
    owner: tuple[str | None, ...] | None,
    subscriptions: list[tuple[str, int, bool, bool, int, int | None]],
    qos2: set[int] | None,
    inflight: list[tuple[OutboundMessage, str, bool]],
    queued: list[OutboundMessage],
    with_queue: bool,
) -> None:
    """``state_json`` writes a session out itself: the same text as the encoder makes of
    ``to_dict``, whatever its names, messages and numbers hold, and read back the same."""
    expiry, max_queued, max_bytes, next_id, dropped, first_seq = numbers
    session = Session(client_id, expiry_interval=expiry, max_queued=max_queued + 10)
    session.next_packet_id, session.dropped, session.owner = next_id, dropped, owner
    session.backlog().first_seq = first_seq
    for topic_filter, qos, no_local, rap, handling, sid in subscriptions:
        session.add_subscription(
            Subscription(topic_filter, SubscriptionOptions(qos, no_local, rap, handling), sid)
        )
    if qos2 is not None:
        session.inbound_qos2 = dict.fromkeys(qos2)
    if inflight:
        session.inflight = {}
        for n, (m, state, sent) in enumerate(inflight, 1):
            m.packet_id, m.state, m.sent = n, state, sent
            session.inflight[n] = m
    for message in queued:
        session.enqueue(message)
    session.max_queued_bytes = max_bytes
    text = session.state_json(with_queue=with_queue)
    assert text == json.dumps(session.to_dict(with_queue=with_queue), separators=(",", ":"), default=_b64)
    assert Session.from_json(text).to_dict(with_queue=with_queue) == session.to_dict(with_queue=with_queue)
    for message in queued:
        assert message_json(message) == json.dumps(
            _message_to_dict(message), separators=(",", ":"), default=_b64
        )


def test_unknown_version_is_refused() -> None:
    data = _populated().to_dict()
    data["version"] = 99
    with pytest.raises(ValueError):
        Session.from_dict(data)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.binary(max_size=20), properties(PacketType.PUBLISH)), max_size=5))
def test_message_properties_survive_storage(messages: list) -> None:  # type: ignore[type-arg]
    session = Session("c")
    for payload, p in messages:
        p.topic_alias = None  # per connection, never stored
        p.subscription_identifiers = p.subscription_identifiers[:1]
        session.enqueue(OutboundMessage("t", payload, 1, properties=p))
    again = Session.from_json(session.to_json())
    assert list(again.queue) == list(session.queue)


def test_session_resumed_by_a_new_connection_keeps_subscriptions() -> None:
    server, client, _ = connected(clean_start=False)
    client.send(Publish("x", b"", 1, packet_id=1))
    server.ack_publish(1)
    assert client.received() == [PubAck(1)]
    assert server.session is not None
    server.session.add_subscription(Subscription("a", SubscriptionOptions(1)))
    stored = server.session.to_json()
    eof(server)
    server2, _, _ = start(clean_start=False)
    answer(server2, server2.accept, Session.from_json(stored), session_present=True)
    assert server2.session is not None and "a" in server2.session.subscriptions


def test_qos2_ack_after_connection_loss_is_remembered() -> None:
    server, client, _ = connected(clean_start=False)
    client.send(Publish("x", b"", 2, packet_id=4))
    eof(server)
    server.ack_publish(4)  # the handler committed it after the socket died
    assert server.session is not None and 4 in server.session.inbound_qos2
    server2, _, _ = start(clean_start=False)
    answer(server2, server2.accept, server.session, session_present=True)
    client2 = Client(server2)
    client2.received()
    assert client2.send(Publish("x", b"", 2, dup=True, packet_id=4)) == []


@given(st.lists(st.sampled_from(["append", "popleft", "clear"]), max_size=300))
def test_a_backlogs_list_is_empty_exactly_when_the_backlog_is(steps: list[str]) -> None:
    """The connection looks at ``Backlog.items`` for "anything waiting?" without a call."""
    backlog = Backlog()
    for step in steps:
        if step == "append":
            backlog.append(OutboundMessage("t", b"p", 1))
        elif step == "popleft" and len(backlog):
            backlog.popleft()
        elif step == "clear":
            backlog.clear()
        assert (not backlog.items) == (len(backlog) == 0)


@given(st.lists(st.one_of(st.just(-1), st.integers(min_value=-2, max_value=80)), max_size=60))
def test_a_backlog_taken_several_at_once_is_each_popleft(steps: list[int]) -> None:
    """``take(n)``: what ``n`` calls of ``popleft`` give (fewer if fewer wait), the same count,
    bytes and sequence numbers after; -1 appends a message of its own."""
    one, many = Backlog(), Backlog()
    made = 0
    for step in steps:
        if step == -1:
            for backlog in (one, many):
                backlog.append(OutboundMessage(f"t/{made}", b"p" * made, 1))
            made += 1
            continue
        each = [one.popleft() for _ in range(min(step, len(one)))]
        assert many.take(step) == each
        assert (list(many), many.bytes, many.first_seq, many.next_seq) == (
            list(one),
            one.bytes,
            one.first_seq,
            one.next_seq,
        )
        assert (not many.items) == (len(many) == 0)
