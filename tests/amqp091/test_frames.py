import struct
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.amqp091.test_fields import field_tables
from trimaran.amqp091 import frames, spec
from trimaran.amqp091.frames import (
    HEARTBEAT_FRAME,
    NEED_DATA,
    BodyFrame,
    Frame,
    FrameDecoder,
    HeaderFrame,
    HeartbeatFrame,
    MethodFrame,
    ProtocolHeader,
    classify_protocol_header,
    encode_content,
    encode_frame,
    encode_method,
    write_content,
    write_delivery,
)
from trimaran.amqp091.properties import PROPERTY_TABLE, BasicProperties, encode_properties

FRAME_END = b"\xce"


def frame(ftype: int, channel: int, payload: bytes) -> bytes:
    return struct.pack(">BHI", ftype, channel, len(payload)) + payload + FRAME_END


# (annotated wire bytes, frame). The payload of each is spelled out field by field.
VECTORS: list[tuple[str, bytes, Frame]] = [
    ("heartbeat", b"\x08" + b"\x00\x00" + b"\x00\x00\x00\x00" + FRAME_END, HeartbeatFrame()),
    (
        "channel.open",
        b"\x01\x00\x01\x00\x00\x00\x05"  # method frame, channel 1, size 5
        + b"\x00\x14\x00\x0a"  # class 20, method 10
        + b"\x00"  # reserved-1: empty shortstr
        + FRAME_END,
        MethodFrame(1, spec.ChannelOpen()),
    ),
    (
        "connection.tune",
        frame(
            1,
            0,
            b"\x00\x0a\x00\x1e"  # class 10, method 30
            + b"\x07\xff"  # channel-max 2047
            + b"\x00\x02\x00\x00"  # frame-max 131072
            + b"\x00\x3c",  # heartbeat 60
        ),
        MethodFrame(0, spec.ConnectionTune(2047, 131072, 60)),
    ),
    (
        "connection.close",
        frame(1, 0, b"\x00\x0a\x00\x32" + b"\x01\x40" + b"\x03bye" + b"\x00\x00" + b"\x00\x00"),
        MethodFrame(0, spec.ConnectionClose(320, "bye", 0, 0)),
    ),
    (
        "exchange.declare",
        frame(
            1,
            1,
            b"\x00\x28\x00\x0a"  # class 40, method 10
            + b"\x00\x00"  # reserved-1 (ticket)
            + b"\x01x"  # exchange "x"
            + b"\x05topic"  # type
            + b"\x06"  # bits, LSB first: passive 0, durable 1, auto-delete 1, internal 0, no-wait 0
            + b"\x00\x00\x00\x00",  # arguments: empty table
        ),
        MethodFrame(1, spec.ExchangeDeclare(exchange="x", type="topic", durable=True, auto_delete=True)),
    ),
    (
        "queue.declare-ok",
        frame(1, 3, b"\x00\x32\x00\x0b" + b"\x01q" + b"\x00\x00\x00\x03" + b"\x00\x00\x00\x01"),
        MethodFrame(3, spec.QueueDeclareOk("q", 3, 1)),
    ),
    (
        "basic.qos",
        frame(1, 1, b"\x00\x3c\x00\x0a" + b"\x00\x00\x00\x00" + b"\x00\x0a" + b"\x01"),
        MethodFrame(1, spec.BasicQos(prefetch_count=10, global_=True)),
    ),
    (
        "basic.publish",
        frame(
            1,
            1,
            b"\x00\x3c\x00\x28"  # class 60, method 40
            + b"\x00\x00"  # reserved-1
            + b"\x00"  # exchange ""
            + b"\x02rk"  # routing-key
            + b"\x01",  # mandatory 1, immediate 0
        ),
        MethodFrame(1, spec.BasicPublish(routing_key="rk", mandatory=True)),
    ),
    (
        "basic.deliver",
        frame(
            1,
            2,
            b"\x00\x3c\x00\x3c"
            + b"\x04ctag"
            + b"\x00\x00\x00\x00\x00\x00\x00\x07"  # delivery-tag 7
            + b"\x01"  # redelivered
            + b"\x02ex"
            + b"\x01k",
        ),
        MethodFrame(2, spec.BasicDeliver("ctag", 7, True, "ex", "k")),
    ),
    (
        "basic.ack",
        frame(1, 2, b"\x00\x3c\x00\x50" + b"\x00\x00\x00\x00\x00\x00\x00\x01" + b"\x01"),
        MethodFrame(2, spec.BasicAck(delivery_tag=1, multiple=True)),
    ),
    (
        "basic.nack",
        frame(1, 2, b"\x00\x3c\x00\x78" + b"\x00\x00\x00\x00\x00\x00\x00\x05" + b"\x02"),
        MethodFrame(2, spec.BasicNack(delivery_tag=5, multiple=False, requeue=True)),
    ),
    (
        "confirm.select",
        frame(1, 1, b"\x00\x55\x00\x0a" + b"\x00"),
        MethodFrame(1, spec.ConfirmSelect()),
    ),
    (
        "content header",
        frame(
            2,
            1,
            b"\x00\x3c"  # class 60
            + b"\x00\x00"  # weight
            + b"\x00\x00\x00\x00\x00\x00\x00\x05"  # body size 5
            + b"\x90\x00"  # flags: content-type (bit 15), delivery-mode (bit 12)
            + b"\x0atext/plain"
            + b"\x02",
        ),
        HeaderFrame(1, 60, 5, BasicProperties(content_type="text/plain", delivery_mode=2)),
    ),
    ("content body", frame(3, 1, b"hello"), BodyFrame(1, b"hello")),
]
IDS = [v[0] for v in VECTORS]


def decode_all(data: bytes, frame_max: int = 0) -> list[Frame]:
    dec = FrameDecoder(frame_max)
    dec.feed(data)
    out = []
    while (f := dec.next_frame()) is not NEED_DATA:
        out.append(f)
    assert dec.buffered == 0
    return out


@pytest.mark.parametrize(("name", "wire", "expected"), VECTORS, ids=IDS)
def test_vector_decodes(name: str, wire: bytes, expected: Frame) -> None:
    assert decode_all(wire) == [expected]


@pytest.mark.parametrize(("name", "wire", "expected"), VECTORS, ids=IDS)
def test_vector_encodes(name: str, wire: bytes, expected: Frame) -> None:
    assert encode_frame(expected) == wire


@pytest.mark.parametrize(("name", "wire", "expected"), VECTORS, ids=IDS)
def test_every_strict_prefix_needs_data(name: str, wire: bytes, expected: Frame) -> None:
    for n in range(len(wire)):
        dec = FrameDecoder(0)
        dec.feed(wire[:n])
        assert dec.next_frame() is NEED_DATA
        assert dec.buffered == n


@pytest.mark.parametrize(("name", "wire", "expected"), VECTORS, ids=IDS)
def test_trailing_bytes_untouched(name: str, wire: bytes, expected: Frame) -> None:
    dec = FrameDecoder(0)
    dec.feed(wire + b"\x01\x00\x01tail")
    assert dec.next_frame() == expected
    assert dec.next_frame() is NEED_DATA
    assert dec.unconsumed() == b"\x01\x00\x01tail"


def test_byte_by_byte_feed_gives_the_same_frames() -> None:
    wire = b"".join(v[1] for v in VECTORS)
    dec = FrameDecoder(0)
    got = []
    for i in range(len(wire)):
        dec.feed(wire[i : i + 1])
        while (f := dec.next_frame()) is not NEED_DATA:
            got.append(f)
    assert got == [v[2] for v in VECTORS]


@settings(max_examples=50, deadline=None)
@given(
    st.integers(frames.SPLIT_FROM + 1, 3 * frames.SPLIT_FROM),
    st.lists(st.integers(1, frames.SPLIT_FROM), min_size=1, max_size=12),
)
def test_a_large_frame_over_many_reads_is_gathered_whole(size: int, reads: list[int]) -> None:
    """A frame larger than SPLIT_FROM that takes many reads is gathered until it is whole, with the
    frames before and after it in the same reads, and counted as buffered meanwhile."""
    sent = [HeartbeatFrame(0), BodyFrame(1, bytes(size)), BodyFrame(2, b"after")]
    wire = HEARTBEAT_FRAME + frame(3, 1, bytes(size)) + frame(3, 2, b"after")
    dec = FrameDecoder(0)
    got: list[Frame] = []
    start = 0
    for length in [*reads, len(wire)]:
        chunk = wire[start : start + length]
        start += len(chunk)
        dec.feed(chunk)
        while (f := dec.next_frame()) is not NEED_DATA:
            got.append(f)
        assert dec.buffered + sum(8 + len(f.payload) if isinstance(f, BodyFrame) else 8 for f in got) == start
        if start == len(wire):
            break
    assert got == sent
    assert dec.buffered == 0


def test_a_read_decoded_whole_is_not_copied_into_a_buffer() -> None:
    dec = FrameDecoder(0)
    wire = frame(3, 1, b"payload")
    dec.feed(wire)
    assert dec._buf is wire
    assert dec.next_frame() == BodyFrame(1, b"payload")
    assert dec.buffered == 0


def test_heartbeat_constant() -> None:
    assert VECTORS[0][1] == HEARTBEAT_FRAME


# --------------------------------------------------------------------------------------------
# Errors


def _error(data: bytes, frame_max: int = 0) -> spec.ProtocolError:
    dec = FrameDecoder(frame_max)
    dec.feed(data)
    with pytest.raises(spec.ProtocolError) as info:
        while dec.next_frame() is not NEED_DATA:
            pass
    return info.value


def test_frame_max_checked_before_the_payload_is_buffered() -> None:
    # Only the 7-byte header of a 5000-byte frame: refused at once against frame_max 4096.
    err = _error(struct.pack(">BHI", 3, 1, 5000 - 8 + 1), frame_max=4096)
    assert err.reply_code == spec.FRAME_ERROR
    assert err.connection_exception
    # A frame of exactly frame_max is fine.
    assert decode_all(frame(3, 1, b"x" * (4096 - 8)), frame_max=4096) == [BodyFrame(1, b"x" * 4088)]


def test_bad_frame_end() -> None:
    assert _error(frame(3, 1, b"ab")[:-1] + b"\x00").reply_code == spec.FRAME_ERROR


def test_unknown_frame_type() -> None:
    assert _error(frame(9, 0, b"")).reply_code == spec.FRAME_ERROR


def test_heartbeat_on_a_channel_is_a_frame_error() -> None:
    assert _error(frame(8, 1, b"")).reply_code == spec.FRAME_ERROR


def test_unknown_method_is_command_invalid() -> None:
    err = _error(frame(1, 1, b"\x00\x3c\x03\xe7"))
    assert (err.reply_code, err.class_id, err.method_id) == (spec.COMMAND_INVALID, 60, 999)


def test_truncated_and_overlong_arguments_are_syntax_errors() -> None:
    payload = encode_method(1, spec.BasicAck(1, True))[7:-1]
    for bad in (payload[:-1], payload + b"\x00"):
        err = _error(frame(1, 1, bad))
        assert (err.reply_code, err.class_id, err.method_id, err.channel) == (spec.SYNTAX_ERROR, 60, 80, 1)


def test_short_method_and_header_payloads() -> None:
    assert _error(frame(1, 1, b"\x00\x3c")).reply_code == spec.FRAME_ERROR
    assert _error(frame(2, 1, b"\x00\x3c\x00")).reply_code == spec.FRAME_ERROR


def test_header_flag_continuation_words() -> None:
    head = b"\x00\x3c\x00\x00" + b"\x00" * 7 + b"\x01"
    # First word: content-type + continuation; a second word flagging nothing is accepted.
    ok = frame(2, 1, head + b"\x80\x01" + b"\x00\x00" + b"\x01a")
    assert decode_all(ok) == [HeaderFrame(1, 60, 1, BasicProperties(content_type="a"))]
    # A continuation word that flags a (non-existent) 16th+ property is refused.
    assert _error(frame(2, 1, head + b"\x00\x01" + b"\x80\x00")).reply_code == spec.SYNTAX_ERROR
    # Bit 1 of the first word (a 15th basic property) does not exist either.
    assert _error(frame(2, 1, head + b"\x00\x02")).reply_code == spec.SYNTAX_ERROR


# --------------------------------------------------------------------------------------------
# Protocol header


@pytest.mark.parametrize(
    ("data", "kind"),
    [
        (b"AMQP\x00\x00\x09\x01", ProtocolHeader.AMQP_0_9_1),
        (b"AMQP\x00\x00\x09\x01\x01\x00", ProtocolHeader.AMQP_0_9_1),
        (b"AMQP\x01\x01\x00\x09", ProtocolHeader.AMQP_0_9),
        (b"AMQP\x01\x01\x08\x00", ProtocolHeader.AMQP_0_8),
        (b"AMQP\x00\x01\x00\x00", ProtocolHeader.AMQP_1_0),
        (b"AMQP\x03\x01\x00\x00", ProtocolHeader.AMQP_1_0_SASL),
        (b"AMQP\x02\x01\x00\x00", ProtocolHeader.AMQP_1_0_TLS),
        (b"AMQP\x00\x00\x0a\x00", ProtocolHeader.OTHER_AMQP),
        (b"GET / HTTP/1.1", ProtocolHeader.NOT_AMQP),
        (b"AMX", ProtocolHeader.NOT_AMQP),
        (b"\x16\x03\x01", ProtocolHeader.NOT_AMQP),
        (b"", NEED_DATA),
        (b"AM", NEED_DATA),
        (b"AMQP\x00\x00\x09", NEED_DATA),
    ],
)
def test_classify_protocol_header(data: bytes, kind: Any) -> None:
    assert classify_protocol_header(data) is kind


# --------------------------------------------------------------------------------------------
# Content


def test_content_split_by_frame_max() -> None:
    body = bytes(range(256)) * 40  # 10240 bytes
    data = encode_content(5, spec.BasicDeliver("c", 1), BasicProperties(), body, frame_max=4096)
    frames = decode_all(data)
    assert isinstance(frames[0], MethodFrame) and isinstance(frames[1], HeaderFrame)
    bodies = frames[2:]
    assert [len(f.payload) for f in bodies if isinstance(f, BodyFrame)] == [4088, 4088, 2064]
    assert b"".join(f.payload for f in bodies if isinstance(f, BodyFrame)) == body
    assert all(len(encode_frame(f)) <= 4096 for f in frames)


def test_empty_body_has_no_body_frames() -> None:
    frames = decode_all(encode_content(1, spec.BasicPublish(), None, b"", frame_max=4096))
    assert [type(f) for f in frames] == [MethodFrame, HeaderFrame]
    assert frames[1] == HeaderFrame(1, 60, 0, BasicProperties())


def test_encode_errors_leave_nothing_behind() -> None:
    from trimaran.amqp091.frames import write_content, write_method

    out = bytearray(b"keep")
    with pytest.raises(spec.EncodeError):
        write_method(out, 1, spec.BasicPublish(exchange="x" * 256))
    with pytest.raises(spec.EncodeError):
        write_method(out, 70000, spec.BasicAck())
    with pytest.raises(spec.EncodeError):
        write_content(out, 1, spec.BasicDeliver(), BasicProperties(priority=300), b"x", 4096)
    with pytest.raises(spec.EncodeError):
        write_method(out, 1, spec.ExchangeDeclare(arguments={"x": object()}))  # type: ignore[dict-item]
    with pytest.raises(spec.EncodeError):  # the header frame alone would exceed frame_max
        write_content(out, 1, spec.BasicDeliver(), BasicProperties(headers={"h": "v" * 5000}), b"x", 4096)
    assert out == b"keep"


@settings(max_examples=200, deadline=None)
@given(
    consumer_tag=st.text(max_size=300),
    delivery_tag=st.integers(min_value=0, max_value=(1 << 64) - 1),
    redelivered=st.booleans(),
    exchange=st.text(max_size=20),
    routing_key=st.text(max_size=300),
    body=st.binary(max_size=9000),
    frame_max=st.sampled_from([0, 4096, 131072]),
    encoded=st.booleans(),
    header=st.sampled_from(
        [0, 4040, 4055, 4070, 5000]
    ),  # a header frame just in, or past, a frame_max of 4096
)
def test_write_delivery_writes_what_write_content_writes(
    consumer_tag: str,
    delivery_tag: int,
    redelivered: bool,
    exchange: str,
    routing_key: str,
    body: bytes,
    frame_max: int,
    encoded: bool,
    header: int,
) -> None:
    """The basic.deliver fast path: the same bytes, and the same refusal (a key past 255 bytes)."""
    props = BasicProperties(
        content_type="text/plain", delivery_mode=2, headers={"h": "v" * header} if header else None
    )
    properties: BasicProperties | bytes = props
    if encoded:
        raw = bytearray()
        encode_properties(props, raw)
        properties = bytes(raw)
    method = spec.BasicDeliver(consumer_tag, delivery_tag, redelivered, exchange, routing_key)
    expected, got = bytearray(b"keep"), bytearray(b"keep")
    try:
        write_content(expected, 3, method, properties, body, frame_max)
    except spec.EncodeError:
        with pytest.raises(spec.EncodeError):
            write_delivery(got, 3, consumer_tag, delivery_tag, redelivered, exchange, routing_key, properties,
                           body, frame_max)  # fmt: skip
        assert got == b"keep"
        return
    write_delivery(got, 3, consumer_tag, delivery_tag, redelivered, exchange, routing_key, properties, body,
                   frame_max)  # fmt: skip
    assert got == expected


# --------------------------------------------------------------------------------------------
# Hypothesis: every method of the spec table, properties, splits, mutations

_shortstr = st.text(st.characters(exclude_categories=["Cs"]), max_size=40)
DOMAIN_STRATEGIES: dict[str, st.SearchStrategy[Any]] = {
    "octet": st.integers(0, 255),
    "short": st.integers(0, 2**16 - 1),
    "long": st.integers(0, 2**32 - 1),
    "longlong": st.integers(0, 2**64 - 1),
    "timestamp": st.integers(0, 2**64 - 1),
    "shortstr": _shortstr,
    "longstr": st.binary(max_size=60),
    "bit": st.booleans(),
    "table": field_tables,
}
methods = st.sampled_from(sorted(spec.METHODS.values(), key=lambda c: c.INDEX)).flatmap(
    lambda cls: st.builds(cls, **{attr: DOMAIN_STRATEGIES[dom] for attr, _w, dom in cls.FIELDS})
)
properties = st.builds(
    BasicProperties, **{attr: st.none() | DOMAIN_STRATEGIES[dom] for attr, dom, _bit in PROPERTY_TABLE}
)
channels = st.integers(0, 65535)


@settings(max_examples=150, deadline=None)
@given(methods, channels)
def test_every_method_round_trips(method: spec.Method, channel: int) -> None:
    wire = encode_method(channel, method)
    assert decode_all(wire) == [MethodFrame(channel, method)]
    assert encode_method(channel, decode_all(wire)[0].method) == wire  # type: ignore[union-attr]


def test_every_method_class_is_covered_by_the_strategy() -> None:
    # The strategy samples from the same table the codec is generated from.
    assert len(spec.METHODS) == 64


@settings(max_examples=80, deadline=None)
@given(properties, st.integers(0, 2**64 - 1), channels)
def test_header_round_trips(props: BasicProperties, size: int, channel: int) -> None:
    f = HeaderFrame(channel, 60, size, props)
    wire = encode_frame(f)
    assert decode_all(wire) == [f]


@settings(max_examples=50, deadline=None)
@given(st.lists(methods, min_size=1, max_size=4), st.binary(max_size=300), st.data())
def test_split_anywhere_gives_the_same_frames(
    ms: list[spec.Method], body: bytes, data: st.DataObject
) -> None:
    wire = b"".join(encode_method(1, m) for m in ms)
    wire += encode_content(2, spec.BasicPublish(), BasicProperties(), body, frame_max=4096)
    wire += HEARTBEAT_FRAME
    expected = decode_all(wire)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(wire)), max_size=5)))
    dec = FrameDecoder(0)
    got = []
    prev = 0
    for cut in [*cuts, len(wire)]:
        dec.feed(wire[prev:cut])
        prev = cut
        while (f := dec.next_frame()) is not NEED_DATA:
            got.append(f)
    assert got == expected


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_random_bytes_raise_only_protocol_error(data: bytes) -> None:
    dec = FrameDecoder(4096)
    dec.feed(data)
    try:
        while dec.next_frame() is not NEED_DATA:
            pass
    except spec.ProtocolError as exc:
        assert exc.reply_code in (spec.FRAME_ERROR, spec.SYNTAX_ERROR, spec.COMMAND_INVALID)


@settings(max_examples=150, deadline=None)
@given(methods, st.data())
def test_mutated_frames_raise_only_protocol_error(method: spec.Method, data: st.DataObject) -> None:
    wire = bytearray(encode_method(1, method))
    for _ in range(data.draw(st.integers(1, 3))):
        i = data.draw(st.integers(0, len(wire) - 1))
        wire[i] = data.draw(st.integers(0, 255))
    if data.draw(st.booleans()):
        # Keep the frame structure valid so that the argument decoder is what gets exercised.
        wire[0], wire[-1] = 1, 0xCE
        struct.pack_into(">I", wire, 3, len(wire) - 8)
    dec = FrameDecoder(0)
    dec.feed(bytes(wire))
    try:
        while (f := dec.next_frame()) is not NEED_DATA:
            encode_frame(f)  # whatever decodes must encode again
    except spec.ProtocolError:
        pass


# --------------------------------------------------------------------------------------------
# A whole publish in one step


PUBLISH = spec.BasicPublish(exchange="x", routing_key="k")
PROPS = BasicProperties(content_type="text/plain", headers={"n": 1})


def test_a_whole_publish_decodes_in_one_step_as_its_three_frames_do() -> None:
    data = encode_content(3, PUBLISH, PROPS, b"body", frame_max=4096) + HEARTBEAT_FRAME
    decoder = FrameDecoder(4096)
    decoder.feed(data)
    assert decoder.publish_channel() == 3
    encoded = bytearray()
    encode_properties(PROPS, encoded)
    assert decoder.next_publish(1 << 20) == (PUBLISH, PROPS, b"body", bytes(encoded))
    assert decoder.next_frame() == HeartbeatFrame(0)  # what follows is left where it was
    empty = encode_content(2, PUBLISH, None, b"", frame_max=4096)
    decoder.feed(empty)
    assert decoder.next_publish(1 << 20) == (PUBLISH, BasicProperties(), b"", b"\x00\x00")
    assert decoder.buffered == 0


def test_encoded_properties_are_written_as_they_are() -> None:
    """A content header given the property bytes a publisher sent is the header it sent."""
    sent = encode_content(3, PUBLISH, PROPS, b"body", frame_max=4096)
    decoder = FrameDecoder(4096)
    decoder.feed(sent)
    _, _, body, encoded = decoder.next_publish(1 << 20) or ((), (), b"", b"")
    out = bytearray()
    write_content(out, 3, PUBLISH, encoded, body, 4096)
    assert bytes(out) == sent


def test_repeated_property_bytes_are_decoded_once_per_connection() -> None:
    decoder = FrameDecoder(4096)
    seen = []
    for props in (PROPS, PROPS, BasicProperties(delivery_mode=2), PROPS):
        decoder.feed(encode_content(1, PUBLISH, props, b"b", frame_max=4096))
        _, decoded, _, _ = decoder.next_publish(1 << 20) or ((), None, b"", b"")
        assert decoded == props
        seen.append(decoded)
    assert seen[0] is seen[1] is seen[3] and seen[2] is not seen[0]
    for priority in range(200):  # the memory of them is bounded
        decoder.feed(encode_content(1, PUBLISH, BasicProperties(priority=priority), b"b", frame_max=4096))
        assert decoder.next_publish(1 << 20) is not None
    assert len(decoder._properties) <= 64


def test_trailing_bytes_after_the_properties_are_left_to_next_frame() -> None:
    data = bytearray(encode_content(1, PUBLISH, BasicProperties(), b"b", frame_max=4096))
    method_len = len(encode_method(1, PUBLISH))
    header_size = struct.unpack_from(">I", data, method_len + 3)[0]
    struct.pack_into(">I", data, method_len + 3, header_size + 1)
    data[method_len + 7 + header_size : method_len + 7 + header_size] = b"\x00"  # one byte too many
    decoder = FrameDecoder(4096)
    decoder.feed(bytes(data))
    assert decoder.publish_channel() == 1
    assert decoder.next_publish(1 << 20) is None
    with pytest.raises(spec.ProtocolError):
        decoder.next_frame()
        decoder.next_frame()


@pytest.mark.parametrize(
    "why",
    ["cut", "split body", "other channel", "too large", "bad method", "not a publish"],
)
def test_anything_but_a_whole_plain_publish_is_left_to_next_frame(why: str) -> None:
    body = b"x" * 100
    data = encode_content(1, PUBLISH, PROPS, body, frame_max=4096)
    max_body = 1 << 20
    if why == "cut":
        data = data[:-1]
    elif why == "split body":
        data = encode_content(1, PUBLISH, PROPS, body, frame_max=64)
    elif why == "other channel":
        method = encode_method(1, PUBLISH)
        data = method + encode_content(2, PUBLISH, PROPS, body, frame_max=4096)[len(method) :]
    elif why == "too large":
        max_body = 99
    elif why == "bad method":
        data = data[:13] + b"\xff" + data[14:]  # the exchange name's length overruns the frame
    else:
        data = encode_method(1, spec.BasicQos(prefetch_count=1)) + data
    decoder = FrameDecoder(4096)
    decoder.feed(data)
    if decoder.publish_channel():
        assert decoder.next_publish(max_body) is None
    assert decoder.buffered == len(data)  # nothing consumed


def test_next_ack_reads_what_next_frame_reads() -> None:
    for method in (spec.BasicAck(7, False), spec.BasicAck((1 << 64) - 1, True)):
        data = encode_method(3, method) + encode_method(3, spec.BasicQos(prefetch_count=1))
        decoder = FrameDecoder(4096)
        decoder.feed(data)
        assert decoder.next_ack() == (3, method)
        assert decoder.next_ack() is None  # the qos after it is left to next_frame
        assert decoder.next_frame() == MethodFrame(3, spec.BasicQos(prefetch_count=1))
        assert decoder.buffered == 0


@pytest.mark.parametrize("why", ["cut", "bad end", "long", "a nack", "a body"])
def test_anything_but_a_whole_plain_ack_is_left_to_next_frame(why: str) -> None:
    data = encode_method(1, spec.BasicAck(5, True))
    if why == "cut":
        data = data[:-1]
    elif why == "bad end":
        data = data[:-1] + b"\x00"
    elif why == "long":  # a size that is not an ack's: next_frame says what is wrong with it
        data = data[:3] + struct.pack(">I", 14) + data[7:-1] + b"\x00" + FRAME_END
    elif why == "a nack":
        data = encode_method(1, spec.BasicNack(5, True, True))
    else:
        data = frame(3, 1, b"x")
    decoder = FrameDecoder(4096)
    decoder.feed(data)
    assert decoder.next_ack() is None
    assert decoder.buffered == len(data)  # nothing consumed
