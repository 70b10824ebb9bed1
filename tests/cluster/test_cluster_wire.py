"""Forward records and their packing into NOTIFY payloads (sans-IO)."""

from __future__ import annotations

import base64

import pytest

from trimaran.broker.message import PROTOCOL_AMQP091, Message
from trimaran.cluster.wire import (
    BODY_LIMIT,
    FORWARD,
    decode_batch,
    encode_forward,
    notice_text,
    pack,
    pack_lines,
    parse_notice,
    unpack_inline,
)


def test_a_record_keeps_the_message_and_its_share_groups() -> None:
    message = Message(
        "a/b",
        b"\x00\xffpayload",
        qos=1,
        retain=True,
        content_type="text/plain",
        correlation_data=b"\x01\x02",
        user_properties=[("k", "v"), ("k", "w")],
        publisher_id="pub",
        protocol=PROTOCOL_AMQP091,
        extra={"priority": 3},
    )
    record = encode_forward(message, [("g", "a/+")])
    [(back, shares)] = list(decode_batch(record))
    assert back == message
    assert shares == frozenset({("g", "a/+")})


def test_records_back_to_back_decode_in_order() -> None:
    messages = [Message(f"t/{i}", bytes([i]) * i) for i in range(5)]
    batch = b"".join(encode_forward(m) for m in messages)
    assert [m for m, _ in decode_batch(batch)] == messages


def test_a_cut_batch_is_refused_after_the_whole_records() -> None:
    batch = encode_forward(Message("a", b"1")) + encode_forward(Message("b", b"22"))[:-1]
    decoded = decode_batch(batch)
    assert next(decoded)[0].topic == "a"
    with pytest.raises(ValueError, match="cut"):
        next(decoded)


def test_small_records_share_a_notice_under_the_limit() -> None:
    records = [encode_forward(Message(f"t/{i}", b"x" * 100)) for i in range(200)]
    notices = pack(records)
    assert all(n.spill is None and n.body is not None for n in notices)
    assert all(len(n.body or "") <= BODY_LIMIT for n in notices)
    assert 1 < len(notices) < len(records)
    joined = b"".join(unpack_inline(n.body or "") for n in notices)
    assert joined == b"".join(records)


def test_a_record_past_the_limit_spills_alone_and_order_is_kept() -> None:
    small = encode_forward(Message("s", b"x"))
    big = encode_forward(Message("b", b"y" * 10_000))
    notices = pack([small, big, small])
    assert [n.spill is not None for n in notices] == [False, True, False]
    assert notices[1].spill == big
    assert base64.b64decode(notices[0].body or "") == small


def test_a_record_exactly_at_the_limit_stays_inline() -> None:
    # base64 of n bytes takes 4 * ceil(n / 3) characters
    fits = BODY_LIMIT // 4 * 3
    assert [n.spill is None for n in pack([b"z" * fits])] == [True]
    assert [n.spill is None for n in pack([b"z" * (fits + 1)])] == [False]


def test_notice_texts_carry_kind_and_sequence() -> None:
    text = notice_text(FORWARD, 255, "QUJD")
    assert text == "bff:QUJD"
    assert parse_notice(text) == (FORWARD, 255, "QUJD")
    with pytest.raises(ValueError):
        parse_notice("garbage")


def test_control_lines_split_between_notices_never_inside_a_line() -> None:
    lines = [f"+filter/{i}/" + "x" * 50 for i in range(400)]
    bodies = pack_lines("node\n", lines, limit=2000)
    assert all(len(b.encode()) <= 2000 for b in bodies)
    assert [line for b in bodies for line in b.removeprefix("node\n").split("\n")] == lines
    assert pack_lines("n\n", ["x" * 3000], limit=2000) == []
