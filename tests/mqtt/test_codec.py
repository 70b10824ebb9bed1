"""Property-based tests of the MQTT codec: round trips, arbitrary splits, and hostile bytes."""

from __future__ import annotations

import contextlib
import dataclasses

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.mqtt.mqtt_strategies import connects, level_and_packets, levels, packets, publishes
from trimaran.mqtt import codec
from trimaran.mqtt.codec import (
    MAX_VARINT,
    NEED_DATA,
    NO_PROPERTIES,
    Decoder,
    ProtocolError,
    decode_varint,
    encode,
    encode_plain_publish,
    encode_run,
    encode_varint,
    run_acks,
    run_packets,
    run_stretches,
)
from trimaran.mqtt.packets import Packet, PingReq, PingResp, PubAck, Publish, PublishRun
from trimaran.mqtt.properties import (
    PROPERTY_TABLE,
    WILL,
    PacketType,
    Properties,
    properties_for,
)

SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
FEWER = settings(SETTINGS, max_examples=100)


def decode_all(decoder: Decoder) -> list[Packet]:
    out = []
    while (packet := decoder.next_packet()) is not NEED_DATA:
        out.append(packet)
    return out


@SETTINGS
@given(st.data())
def test_round_trip_every_level(data: st.DataObject) -> None:
    level = data.draw(levels)
    packet = data.draw(packets(level))
    encoded = encode(packet, level)
    decoder = Decoder(protocol_level=level)
    decoder.feed(encoded)
    assert decoder.next_packet() == packet
    assert decoder.buffered == 0


@FEWER
@given(st.data())
def test_server_decoder_takes_its_level_from_connect(data: st.DataObject) -> None:
    level = data.draw(levels)
    connect = data.draw(connects(level))
    publish = data.draw(publishes(level))
    decoder = Decoder()
    decoder.feed(encode(connect, level) + encode(publish, level))
    assert decoder.next_packet() == connect
    assert decoder.protocol_level == level
    assert decoder.next_packet() == publish


@FEWER
@given(level_and_packets(), st.lists(st.integers(0, 10_000), max_size=8))
def test_split_at_any_point(lp: tuple[int, list[Packet]], cuts: list[int]) -> None:
    level, sent = lp
    stream = b"".join(encode(p, level) for p in sent)
    points = sorted({c % (len(stream) + 1) for c in cuts})
    decoder = Decoder(protocol_level=level)
    received: list[Packet] = []
    start = 0
    for point in [*points, len(stream)]:
        decoder.feed(stream[start:point])
        start = point
        received.extend(decode_all(decoder))
    assert received == sent
    assert decoder.buffered == 0


@FEWER
@given(
    levels,
    st.integers(codec.SPLIT_FROM + 1, 3 * codec.SPLIT_FROM),
    st.lists(st.integers(1, codec.SPLIT_FROM), min_size=1, max_size=12),
)
def test_a_large_packet_over_many_reads_is_gathered_whole(level: int, size: int, reads: list[int]) -> None:
    """A packet larger than SPLIT_FROM that takes many reads is gathered until it is whole, with
    what came before and after it in the same reads, and counted as buffered meanwhile."""
    before = Publish("a/b", b"1", 0, False, False, None, NO_PROPERTIES)
    large = Publish("big", bytes(size), 1, False, False, 7, NO_PROPERTIES)
    after = PubAck(3)
    stream = b"".join(encode(p, level) for p in (before, large, after))
    decoder = Decoder(protocol_level=level)
    received: list[Packet] = []
    start = 0
    for length in [*reads, len(stream)]:
        chunk = stream[start : start + length]
        start += len(chunk)
        decoder.feed(chunk)
        received.extend(decode_all(decoder))
        assert decoder.buffered == start - sum(len(encode(p, level)) for p in received)
        if start == len(stream):
            break
    assert received == [before, large, after]
    assert decoder.buffered == 0


def test_a_packet_declared_too_large_is_refused_not_gathered() -> None:
    decoder = Decoder(max_packet_size=codec.SPLIT_FROM * 4, protocol_level=4)
    header = bytes([0x30]) + encode_varint(codec.SPLIT_FROM * 8)
    decoder.feed(header[:2])
    assert decoder.next_packet() is NEED_DATA
    decoder.feed(header[2:] + bytes(1000))
    assert decoder._split is None
    with pytest.raises(ProtocolError) as refused:
        decoder.next_packet()
    assert refused.value.reason_code == 0x95  # packet too large


def test_a_read_decoded_whole_is_not_copied() -> None:
    """A read that is one run (most reads) is handed on as the read's own bytes."""
    read = b"".join(encode(Publish("t", b"x", 0, False, False, None, NO_PROPERTIES), 4) for _ in range(3))
    decoder = Decoder(protocol_level=4)
    decoder.runs = True
    decoder.feed(read)
    run = decoder.next_packet()
    assert isinstance(run, PublishRun) and run.count == 3
    assert run.wire is read


@SETTINGS
@given(st.sampled_from([None, 3, 4, 5]), st.binary(max_size=200))
def test_random_bytes_raise_only_protocol_error(level: int | None, junk: bytes) -> None:
    decoder = Decoder(max_packet_size=10_000, protocol_level=level)
    decoder.feed(junk)
    try:
        decode_all(decoder)
    except ProtocolError as exc:
        assert 0x80 <= exc.reason_code <= 0xA2


@FEWER
@given(st.data())
def test_mutated_packets_raise_only_protocol_error(data: st.DataObject) -> None:
    level, sent = data.draw(level_and_packets(max_size=2))
    stream = bytearray(b"".join(encode(p, level) for p in sent))
    for _ in range(data.draw(st.integers(1, 4))):
        action = data.draw(st.sampled_from(["flip", "insert", "delete"]))
        pos = data.draw(st.integers(0, len(stream) - 1))
        if action == "flip":
            stream[pos] ^= data.draw(st.integers(1, 255))
        elif action == "insert":
            stream.insert(pos, data.draw(st.integers(0, 255)))
        elif len(stream) > 1:
            del stream[pos]
    decoder = Decoder(protocol_level=data.draw(st.sampled_from([None, level])))
    decoder.feed(bytes(stream))
    with contextlib.suppress(ProtocolError):
        decode_all(decoder)


@SETTINGS
@given(st.integers(0, MAX_VARINT))
def test_varint_round_trip(value: int) -> None:
    data = encode_varint(value)
    assert 1 <= len(data) <= 4
    assert decode_varint(data, 0, len(data)) == (value, len(data))


@pytest.mark.parametrize(
    ("value", "hex_"),
    [(0, "00"), (127, "7f"), (128, "8001"), (16383, "ff7f"), (16384, "808001"), (2097151, "ffff7f"),
     (2097152, "80808001"), (268435455, "ffffff7f")],
)  # fmt: skip
def test_varint_spec_table(value: int, hex_: str) -> None:
    # The boundaries of section 1.5.5, table 1-1.
    assert encode_varint(value).hex() == hex_
    assert decode_varint(bytes.fromhex(hex_), 0, len(hex_) // 2) == (value, len(hex_) // 2)


def test_varint_limits() -> None:
    with pytest.raises(ValueError):
        encode_varint(MAX_VARINT + 1)
    with pytest.raises(ValueError):
        encode_varint(-1)
    with pytest.raises(ProtocolError):
        decode_varint(b"\xff\xff\xff\xff\x01", 0, 5)
    with pytest.raises(ProtocolError):
        decode_varint(b"\x80", 0, 1)


def test_property_table_is_complete() -> None:
    ids = [p.identifier for p in PROPERTY_TABLE]
    assert ids == sorted(ids)
    assert len(ids) == 27
    assert {p.name for p in properties_for(WILL)} == {
        "payload_format_indicator", "message_expiry_interval", "content_type", "response_topic",
        "correlation_data", "will_delay_interval", "user_properties",
    }  # fmt: skip
    assert properties_for(PacketType.PINGREQ) == ()
    assert {p.name for p in PROPERTY_TABLE} <= {f.name for f in dataclasses.fields(Properties)}


def test_user_properties_keep_order_and_duplicates() -> None:
    props = Properties(user_properties=[("b", "1"), ("a", "2"), ("b", "1")])
    packet = Publish("t", b"", properties=props)
    decoder = Decoder(protocol_level=5)
    decoder.feed(encode(packet, 5))
    decoded = decoder.next_packet()
    assert isinstance(decoded, Publish)
    assert decoded.properties.user_properties == [("b", "1"), ("a", "2"), ("b", "1")]


def test_properties_are_dropped_below_level_5() -> None:
    packet = Publish("t", b"x", properties=Properties(content_type="text/plain"))
    assert encode(packet, 4) == b"\x30\x04\x00\x01tx"


def test_encode_refuses_what_cannot_be_sent() -> None:
    with pytest.raises(ValueError):
        encode(Publish("a\x00b"), 4)
    for pair in [("k\x00", "v"), ("k", "\x00"), ("k" * 0x10000, "v"), ("k", "v" * 0x10000), ("\ud800", "v")]:
        with pytest.raises(ValueError):
            encode(Publish("t", properties=Properties(user_properties=[("a", "b"), pair])), 5)
    with pytest.raises(ValueError):
        encode(Publish("\ud800"), 4)
    with pytest.raises(ValueError):
        encode(Publish("t", qos=1), 4)  # no packet id
    with pytest.raises(ValueError):
        encode(Publish("x" * 70_000), 4)


def test_decoder_releases_its_buffer() -> None:
    decoder = Decoder(protocol_level=4)
    for _ in range(3):
        decoder.feed(b"\xc0\x00" * 1000)
        assert len(decode_all(decoder)) == 1000
        assert decoder.buffered == 0
    decoder.feed(b"\xc0\x00\xc0")
    assert decode_all(decoder) == [PingReq()]
    assert decoder.buffered == 1


def test_drained_decoders_share_one_empty_buffer_and_never_write_to_it() -> None:
    """A drained decoder holds the shared empty buffer (issue #47): feeding one decoder a packet
    in pieces, and another whole, leaves it empty and each decoder's bytes its own."""
    first, second = Decoder(protocol_level=4), Decoder(protocol_level=4)
    assert first._buf is second._buf is codec._DRAINED
    first.feed(b"\xc0")
    second.feed(b"\xd0\x00")
    assert decode_all(second) == [PingResp()]
    first.feed(b"\x00\x30\x03\x00\x01t")
    assert decode_all(first) == [PingReq(), Publish("t", b"")]
    pubacks = Decoder(protocol_level=4)
    pubacks.feed(b"\x40\x02\x00\x01")
    assert pubacks.next_pubacks() == [1]
    assert first._buf is second._buf is pubacks._buf is codec._DRAINED
    assert not codec._DRAINED


@given(
    topic=st.text(st.characters(blacklist_characters="\x00", blacklist_categories=["Cs"]), max_size=40),
    payload=st.binary(max_size=300),
    qos=st.integers(0, 2),
    retain=st.booleans(),
    dup=st.booleans(),
    packet_id=st.integers(1, 0xFFFF),
    level=levels,
)
def test_plain_publish_encodes_as_a_publish_without_properties(
    topic: str, payload: bytes, qos: int, retain: bool, dup: bool, packet_id: int, level: int
) -> None:
    pid = packet_id if qos else None
    expected = encode(Publish(topic, payload, qos, retain, dup, pid, NO_PROPERTIES), level)
    assert encode_plain_publish(topic, payload, qos, retain, dup, pid, level) == expected


def test_plain_publish_refuses_what_encode_refuses() -> None:
    with pytest.raises(ValueError):
        encode_plain_publish("a\x00b", b"", 0, False, False, None, 4)
    with pytest.raises(ValueError):
        encode_plain_publish("t", b"", 1, False, False, None, 4)


def test_a_run_of_plain_pubacks_is_read_without_packet_objects() -> None:
    decoder = Decoder(protocol_level=5)
    decoder.feed(bytes((0x40, 2, 1, 2)) + bytes((0x40, 2, 0, 7)) + bytes((0x40, 3, 0, 8, 0x80)))
    assert decoder.next_pubacks() == [0x0102, 7]
    assert decoder.next_pubacks() == []  # a reason code: left to next_packet
    assert decoder.next_packet() == PubAck(8, 0x80)
    assert decoder.buffered == 0
    decoder.feed(bytes((0x40, 2, 0, 9, 0x40)))
    assert decoder.next_pubacks() == [9]  # a run ends where the buffer does
    decoder.feed(bytes((2, 0, 10)))
    assert decoder.next_pubacks() == [10]
    assert decoder.buffered == 0


def test_what_next_pubacks_leaves_is_decoded_as_before() -> None:
    for data in (bytes((0x40, 2, 0)), bytes((0x40, 2, 0, 0)), bytes((0x50, 2, 0, 1))):
        decoder = Decoder(protocol_level=5)
        decoder.feed(data)
        assert decoder.next_pubacks() == []
        assert decoder.buffered == len(data)


@pytest.mark.parametrize("level", [4, 5])
def test_a_repeated_topic_is_decoded_once(level: int) -> None:
    sent = [
        Publish("a/b", b"1"),
        Publish("a/b", b"2", qos=1, packet_id=7),
        Publish("a/c", b"3"),
        Publish("a/b"),
    ]
    decoder = Decoder(protocol_level=level)
    decoder.feed(b"".join(encode(p, level) for p in sent))
    got = decode_all(decoder)
    assert got == sent
    assert all(isinstance(p, Publish) for p in got)
    first, second, _, last = (p for p in got if isinstance(p, Publish))
    assert second.topic is first.topic and last.topic is not first.topic  # "a/c" came between
    assert first.wire == encode(sent[0], level) and first.payload == b"1"


def test_a_topic_is_checked_whenever_its_bytes_differ() -> None:
    decoder = Decoder(protocol_level=4)
    decoder.feed(encode(Publish("ab", b"x"), 4))
    assert decode_all(decoder) == [Publish("ab", b"x")]
    decoder.feed(b"\x30\x05\x00\x02a\xff" + b"x")  # as long as "ab", not UTF-8
    with pytest.raises(ProtocolError, match="UTF-8"):
        decoder.next_packet()
    decoder = Decoder(protocol_level=4)
    decoder.feed(encode(Publish("ab", b"x"), 4) + b"\x30\x05\x00\x02a\x00" + b"x")
    assert isinstance(decoder.next_packet(), Publish)
    with pytest.raises(ProtocolError, match="U\\+0000"):
        decoder.next_packet()


# -- runs of plain QoS 0 PUBLISHes (Decoder.runs) ------------------------------------------------


def _decode_all(data: bytes, level: int, runs: bool, cut: int = 0) -> list[Packet | PublishRun]:
    decoder = Decoder(protocol_level=level)
    decoder.runs = runs
    out: list[Packet | PublishRun] = []
    for chunk in (data[:cut], data[cut:]) if cut else (data,):
        decoder.feed(chunk)
        while (packet := decoder.next_packet()) is not NEED_DATA:
            out.append(packet)
    return out


def _each(packets: list[Packet | PublishRun]) -> list[tuple[Packet, bytes | None]]:
    """Every PUBLISH of the runs on its own, as the decoder gives it without runs."""
    out: list[tuple[Packet, bytes | None]] = []
    for packet in packets:
        if isinstance(packet, PublishRun):
            topics = packet.topics or [packet.topic] * packet.count
            for (wire, payload), topic in zip(run_packets(packet), topics, strict=True):
                packet_id = None
                if packet.qos:  # before the payload (and the 5.0 properties' byte)
                    at = len(wire) - len(payload) - (3 if packet.v5 else 2)
                    packet_id = wire[at] << 8 | wire[at + 1]
                publish = Publish(topic, payload, packet.qos, False, False, packet_id, NO_PROPERTIES)
                out.append((publish, wire))
        else:
            out.append((packet, packet.wire if isinstance(packet, Publish) else None))
    return out


@st.composite
def _streams(draw: st.DrawFn) -> tuple[int, list[Publish]]:
    """PUBLISHes to few topics, mostly plain QoS 0 or 1, some retained, QoS 2 or with properties."""
    level = draw(levels)
    topic = st.sampled_from(["a/b", "a/c", "", "é/x"])
    plain = st.builds(Publish, topic, st.binary(max_size=300))
    packet_id = st.integers(min_value=1, max_value=0xFFFF)
    plain_qos1 = st.builds(Publish, topic, st.binary(max_size=300), st.just(1), packet_id=packet_id)
    other = publishes(level).map(lambda p: dataclasses.replace(p, topic=p.topic[:3] or "a/b"))
    kinds = st.one_of(plain, plain, plain_qos1, plain_qos1, other)
    return level, draw(st.lists(kinds, min_size=1, max_size=30))


@given(_streams(), st.integers(min_value=0, max_value=2000))
@SETTINGS
def test_runs_hold_the_publishes_read_one_by_one(stream: tuple[int, list[Publish]], cut: int) -> None:
    level, publishes_ = stream
    data = b"".join(encode(p, level) for p in publishes_)
    cut = min(cut, len(data) - 1)
    one_by_one = _decode_all(data, level, runs=False, cut=cut)
    in_runs = _decode_all(data, level, runs=True, cut=cut)
    assert _each(in_runs) == [(p, p.wire if isinstance(p, Publish) else None) for p in one_by_one]
    for packet in in_runs:
        if isinstance(packet, PublishRun):
            sizes = [len(wire) for wire, _ in run_packets(packet)]
            assert packet.largest == max(sizes) and packet.count == len(sizes) and packet.topic
            assert packet.v5 == (level == 5) and packet.qos in (0, 1)
            if packet.qos:  # a PUBACK for each, of the packet id read
                ids = [publish.packet_id for publish, _ in _each([packet])]
                assert run_acks(packet) == b"".join(encode(PubAck(i), level) for i in ids if i)


def test_a_run_ends_at_a_packet_unlike_it() -> None:
    plain = [encode(Publish("a/b", b"%d" % i), 4) for i in range(3)]
    data = b"".join(
        [*plain, encode(Publish("a/b", b"r", retain=True), 4), *plain, encode(Publish("a/c", b"c"), 4)]
    )
    got = _decode_all(data, 4, runs=True)
    assert [type(p).__name__ for p in got] == ["PublishRun", "Publish", "PublishRun"]
    first = got[0]
    assert isinstance(first, PublishRun) and first.count == 3 and first.wire == b"".join(plain)
    assert first.topics is None  # one topic: none listed
    last = got[2]  # another topic goes on with the run, each packet's topic listed
    assert isinstance(last, PublishRun) and last.count == 4 and last.topic == "a/b"
    assert last.topics == ["a/b", "a/b", "a/b", "a/c"]


@pytest.mark.parametrize("level", [3, 4, 5])
@pytest.mark.parametrize("qos", [0, 1])
def test_a_run_that_changes_topic_is_read_split_and_acknowledged_per_packet(level: int, qos: int) -> None:
    names = ["fleet/1/temp", "fleet/1/hum", "fleet/22/temp", "fleet/1/temp", "é/x"]
    publishes_ = [
        Publish(name, b"%d" % i, qos, packet_id=i + 1 if qos else None) for i, name in enumerate(names)
    ]
    wires = [encode(p, level) for p in publishes_]
    (run,) = _decode_all(b"".join(wires), level, runs=True)
    assert isinstance(run, PublishRun) and run.count == 5 and run.topics == names
    assert [wire for wire, _ in run_packets(run)] == wires
    assert [payload for _, payload in run_packets(run)] == [p.payload for p in publishes_]
    if qos:
        assert run_acks(run) == b"".join(encode(PubAck(i + 1), level) for i in range(5))
    stretches = run_stretches(run)
    assert [(s.topic, s.count, s.topics) for s in stretches] == [(name, 1, None) for name in names]
    assert [s.wire for s in stretches] == wires
    for stretch in stretches:  # each as the decoder reads it alone
        (alone,) = _decode_all(stretch.wire, level, runs=True)
        assert isinstance(alone, PublishRun) and alone.head == stretch.head
    data, largest = encode_run(run, level == 5, ())
    assert largest == max(len(w) for w in wires) or qos or level == 5
    assert [p.topic for p in _decode_all(data, level, runs=False)] == names  # type: ignore[union-attr]


@pytest.mark.parametrize("qos", [0, 1])
@pytest.mark.parametrize("bad", [b"\xff\xfe", b"a\x00b", b"a/#"])
def test_a_run_ends_before_a_topic_the_codec_refuses(bad: bytes, qos: int) -> None:
    good = encode(Publish("a/b", b"1", qos, packet_id=1 if qos else None), 4)
    other = encode(Publish("a/c", b"2", qos, packet_id=2 if qos else None), 4)
    wrong = other.replace(b"\x00\x03a/c", len(bad).to_bytes(2, "big") + bad)
    wrong = bytes((wrong[0], len(wrong) - 2)) + wrong[2:]
    decoder = Decoder(protocol_level=4)
    decoder.runs = True
    decoder.feed(good + other + wrong)
    run = decoder.next_packet()
    assert isinstance(run, PublishRun)
    if bad == b"a/#":  # a name the codec reads: wildcards are the machine's to refuse
        assert run.topics == ["a/b", "a/c", "a/#"]
    else:
        assert run.topics == ["a/b", "a/c"]
        if qos:  # the refused packet's id is not among the run's
            assert run_acks(run) == encode(PubAck(1), 4) + encode(PubAck(2), 4)
        with pytest.raises(ProtocolError):
            decoder.next_packet()


@pytest.mark.parametrize("level", [3, 4, 5])
def test_a_qos1_run_ends_at_another_qos_or_a_packet_id_0(level: int) -> None:
    qos1 = [encode(Publish("a/b", b"%d" % i, 1, packet_id=i + 1), level) for i in range(3)]
    bad = qos1[0].replace(b"a/b\x00\x01", b"a/b\x00\x00")  # packet identifier 0
    data = b"".join([*qos1, encode(Publish("a/b", b"q0"), level), *qos1, bad])
    decoder = Decoder(protocol_level=level)
    decoder.runs = True
    decoder.feed(data)
    got = [decoder.next_packet() for _ in range(3)]
    assert [(type(p).__name__, getattr(p, "count", 1), getattr(p, "qos", 0)) for p in got] == [
        ("PublishRun", 3, 1),
        ("PublishRun", 1, 0),
        ("PublishRun", 3, 1),
    ]
    with pytest.raises(ProtocolError, match="packet identifier 0"):
        decoder.next_packet()  # refused on its own, after the runs before it
    run = got[0]
    assert isinstance(run, PublishRun) and run.wire == b"".join(qos1)
    assert run_acks(run) == b"".join(encode(PubAck(i + 1), level) for i in range(3))


def test_a_run_holds_only_whole_packets_under_the_maximum_size() -> None:
    small = encode(Publish("a/b", b"x"), 4)
    large = encode(Publish("a/b", b"y" * 100), 4)
    decoder = Decoder(50, protocol_level=4)
    decoder.runs = True
    decoder.feed(small + small + small[:4])
    run = decoder.next_packet()
    assert isinstance(run, PublishRun) and run.count == 2
    assert decoder.next_packet() is NEED_DATA
    decoder.feed(small[4:] + small + large[:10])
    run = decoder.next_packet()
    assert isinstance(run, PublishRun) and run.count == 2 and run.wire == small + small
    with pytest.raises(ProtocolError):
        decoder.next_packet()  # too large: refused on its own, after the run was handed out


@pytest.mark.parametrize("level", [3, 4, 5])
@pytest.mark.parametrize(("v5", "ids"), [(False, ()), (True, ()), (True, (7,)), (True, (1, 300))])
def test_a_run_encoded_for_another_subscriber_is_each_publish_encoded(
    level: int, v5: bool, ids: tuple[int, ...]
) -> None:
    publishes_ = [Publish("a/b", b"p" * n) for n in (0, 1, 120, 130, 20000)]
    got = _decode_all(b"".join(encode(p, level) for p in publishes_), level, runs=True)
    assert len(got) == 1 and isinstance(got[0], PublishRun)
    data, largest = encode_run(got[0], v5, ids)
    props = Properties(subscription_identifiers=list(ids))
    each = [encode(Publish(p.topic, p.payload, properties=props), 5 if v5 else 4) for p in publishes_]
    assert data == b"".join(each)
    assert largest == max(map(len, each))
