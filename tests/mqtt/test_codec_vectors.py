"""Annotated MQTT codec vectors: hex bytes <-> packet, for protocol levels 3 (3.1), 4 (3.1.1) and 5.

Every valid vector is checked both ways (decode and encode), every strict prefix of it must give
NEED_DATA, and bytes after it stay buffered. The hex was written by hand from the OASIS specs, not
produced by our encoder. Invalid vectors must raise ProtocolError with the given reason code.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from trimaran.mqtt.codec import NEED_DATA, Decoder, ProtocolError, encode
from trimaran.mqtt.packets import (
    Auth,
    ConnAck,
    Connect,
    Disconnect,
    Packet,
    PingReq,
    PingResp,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    SubAck,
    Subscribe,
    SubscriptionOptions,
    UnsubAck,
    Unsubscribe,
    Will,
)
from trimaran.mqtt.properties import Properties


@dataclass
class Vector:
    level: int
    hex: str
    packet: Packet
    comment: str

    @property
    def data(self) -> bytes:
        return bytes.fromhex(self.hex)


V = Vector
BIG_PAYLOAD = bytes(200)

VECTORS: list[Vector] = [
    # ------------------------------------------------------------------------------------ MQTT 3.1.1
    V(4, "10 0e 0004 4d515454 04 02 003c 0002 6331",
      Connect(client_id="c1"),
      "3.1.1 CONNECT: name MQTT, level 4, clean session, keep alive 60, client id 'c1'"),
    V(4, "10 1a 0004 4d515454 04 ee 0000 0002 6964 0001 77 0001 78 0001 75 0001 70",
      Connect(keep_alive=0, client_id="id", will=Will("w", b"x", 1, True), username="u", password=b"p"),
      "3.1.1 CONNECT flags 0xEE: user, password, will retain, will QoS 1, will, clean session"),
    V(4, "10 0c 0004 4d515454 04 00 ffff 0000",
      Connect(clean_start=False, keep_alive=0xFFFF, client_id=""),
      "3.1.1 CONNECT: persistent session, empty client id (the decoder accepts, the server decides)"),
    V(4, "20 02 01 00", ConnAck(session_present=True), "3.1.1 CONNACK: session present, accepted"),
    V(4, "20 02 00 05", ConnAck(reason_code=5), "3.1.1 CONNACK: return code 5, not authorized"),
    V(4, "30 07 0003 612f62 6869", Publish("a/b", b"hi"), "3.1.1 PUBLISH QoS 0, topic 'a/b', payload 'hi'"),
    V(4, "3b 05 0001 74 000a", Publish("t", b"", 1, retain=True, dup=True, packet_id=10),
      "3.1.1 PUBLISH flags 0xB: DUP, QoS 1, RETAIN; packet id 10; empty payload"),
    V(4, "34 06 0001 74 ffff 7a", Publish("t", b"z", 2, packet_id=0xFFFF), "3.1.1 PUBLISH QoS 2, id 65535"),
    V(4, "30 cb01 0001 74" + BIG_PAYLOAD.hex(), Publish("t", BIG_PAYLOAD),
      "3.1.1 PUBLISH with a two byte remaining length (203 = 0xCB 0x01)"),
    V(4, "40 02 0001", PubAck(1), "3.1.1 PUBACK id 1"),
    V(4, "50 02 0002", PubRec(2), "3.1.1 PUBREC id 2"),
    V(4, "62 02 0003", PubRel(3), "3.1.1 PUBREL id 3, fixed header flags 0b0010"),
    V(4, "70 02 0004", PubComp(4), "3.1.1 PUBCOMP id 4"),
    V(4, "82 0c 0001 0003 612f2b 01 0001 23 02",
      Subscribe(1, [("a/+", SubscriptionOptions(1)), ("#", SubscriptionOptions(2))]),
      "3.1.1 SUBSCRIBE id 1: 'a/+' QoS 1 and '#' QoS 2, flags 0b0010"),
    V(4, "90 04 0001 01 80", SubAck(1, [1, 0x80]), "3.1.1 SUBACK id 1: granted QoS 1, failure 0x80"),
    V(4, "a2 07 0002 0003 612f2b", Unsubscribe(2, ["a/+"]), "3.1.1 UNSUBSCRIBE id 2 'a/+'"),
    V(4, "b0 02 0002", UnsubAck(2), "3.1.1 UNSUBACK id 2 (no reason codes before 5.0)"),
    V(4, "c0 00", PingReq(), "PINGREQ"),
    V(4, "d0 00", PingResp(), "PINGRESP"),
    V(4, "e0 00", Disconnect(), "3.1.1 DISCONNECT"),
    # ------------------------------------------------------------------------------------ MQTT 3.1
    V(3, "10 10 0006 4d5149736470 03 02 000a 0002 6331",
      Connect(protocol_name="MQIsdp", protocol_level=3, keep_alive=10, client_id="c1"),
      "3.1 CONNECT: name MQIsdp, level 3"),
    V(3, "20 02 00 02", ConnAck(reason_code=2), "3.1 CONNACK: identifier rejected"),
    V(3, "32 08 0003 612f62 0007 ff", Publish("a/b", b"\xff", 1, packet_id=7), "3.1 PUBLISH QoS 1"),
    V(3, "82 06 0009 0001 78 00", Subscribe(9, [("x", SubscriptionOptions(0))]), "3.1 SUBSCRIBE"),
    V(3, "90 03 0009 00", SubAck(9, [0]), "3.1 SUBACK"),
    V(3, "e0 00", Disconnect(), "3.1 DISCONNECT"),
    # ------------------------------------------------------------------------------------ MQTT 5.0
    V(5, "10 0f 0004 4d515454 05 02 003c 00 0002 6331",
      Connect(protocol_level=5, client_id="c1"), "5.0 CONNECT, empty properties (length 0)"),
    V(5, "10 1c 0004 4d515454 05 00 001e 0f 11 00000078 21 0014 26 0001 6b 0001 76 0000",
      Connect(protocol_level=5, clean_start=False, keep_alive=30, client_id="",
              properties=Properties(session_expiry_interval=120, receive_maximum=20,
                                    user_properties=[("k", "v")])),
      "5.0 CONNECT: session expiry 120, receive maximum 20, user property k=v, empty client id"),
    V(5, "10 1d 0004 4d515454 05 46 000a 00 0001 63 05 18 00000005 0001 77 0000 0002 7077",
      Connect(protocol_level=5, keep_alive=10, client_id="c",
              will=Will("w", b"", 0, False, Properties(will_delay_interval=5)), password=b"pw"),
      "5.0 CONNECT: will with will delay 5, password without user name (allowed in 5.0)"),
    V(5, "10 17 0004 4d515454 05 02 0000 0a 15 0001 6d 16 0003 010203 0000",
      Connect(protocol_level=5, keep_alive=0,
              properties=Properties(authentication_method="m", authentication_data=b"\x01\x02\x03")),
      "5.0 CONNECT with authentication method 'm' and data 010203"),
    V(5, "20 0e 00 00 0b 12 0002 6964 21 000a 22 0005",
      ConnAck(properties=Properties(assigned_client_identifier="id", receive_maximum=10,
                                    topic_alias_maximum=5)),
      "5.0 CONNACK: assigned client id 'id', receive maximum 10, topic alias maximum 5"),
    V(5, "20 0e 01 00 0b 13 001e 24 01 25 00 28 00 2a 00",
      ConnAck(session_present=True, properties=Properties(
          server_keep_alive=30, maximum_qos=1, retain_available=0, wildcard_subscription_available=0,
          shared_subscription_available=0)),
      "5.0 CONNACK: session present, server keep alive 30, max QoS 1, no retain, wildcard or shared subs"),
    V(5, "20 03 00 87 00", ConnAck(reason_code=0x87), "5.0 CONNACK refused: 0x87 not authorized"),
    V(5, "30 05 0001 61 00 70", Publish("a", b"p"), "5.0 PUBLISH QoS 0, no properties"),
    V(5, "32 20 0001 61 0001 19 01 01 02 0000003c 03 0001 74 0b 01 0b 8001 23 0002 26 0001 6b 0000 78",
      Publish("a", b"x", 1, packet_id=1, properties=Properties(
          payload_format_indicator=1, message_expiry_interval=60, content_type="t",
          subscription_identifiers=[1, 128], topic_alias=2, user_properties=[("k", "")])),
      "5.0 PUBLISH QoS 1 with payload format, expiry 60, content type, two subscription ids "
      "(1 and 128 as a two byte varint), topic alias 2, user property k=''"),
    V(5, "30 07 0000 03 23 0001 70", Publish("", b"p", properties=Properties(topic_alias=1)),
      "5.0 PUBLISH with an empty topic name and topic alias 1"),
    V(5, "35 0d 0001 61 0002 07 08 0001 72 09 0000",
      Publish("a", b"", 2, retain=True, packet_id=2,
              properties=Properties(response_topic="r", correlation_data=b"")),
      "5.0 PUBLISH QoS 2 retained, response topic 'r', empty correlation data"),
    V(5, "40 02 0001", PubAck(1), "5.0 PUBACK success: reason code and properties omitted"),
    V(5, "40 03 0001 10", PubAck(1, 0x10), "5.0 PUBACK 0x10 no matching subscribers, no properties"),
    V(5, "40 09 0001 80 05 1f 0002 6e6f", PubAck(1, 0x80, Properties(reason_string="no")),
      "5.0 PUBACK 0x80 unspecified error with reason string 'no'"),
    V(5, "50 03 0003 97", PubRec(3, 0x97), "5.0 PUBREC 0x97 quota exceeded"),
    V(5, "62 03 0005 92", PubRel(5, 0x92), "5.0 PUBREL 0x92 packet identifier not found"),
    V(5, "70 02 0005", PubComp(5), "5.0 PUBCOMP success"),
    V(5, "82 0b 000a 02 0b 05 0003 612f23 2d",
      Subscribe(10, [("a/#", SubscriptionOptions(1, True, True, 2))],
                Properties(subscription_identifiers=[5])),
      "5.0 SUBSCRIBE id 10, subscription id 5, 'a/#' QoS 1 + no local + retain as published + RH 2"),
    V(5, "90 05 000a 00 01 a2", SubAck(10, [1, 0xA2]),
      "5.0 SUBACK: granted QoS 1, 0xA2 wildcard subscriptions not supported"),
    V(5, "a2 06 000b 00 0001 61", Unsubscribe(11, ["a"]), "5.0 UNSUBSCRIBE 'a'"),
    V(5, "b0 05 000b 00 00 11", UnsubAck(11, [0, 0x11]), "5.0 UNSUBACK: success, no subscription existed"),
    V(5, "c0 00", PingReq(), "5.0 PINGREQ"),
    V(5, "e0 00", Disconnect(), "5.0 DISCONNECT normal, reason code omitted"),
    V(5, "e0 01 04", Disconnect(4), "5.0 DISCONNECT 0x04 with will message"),
    V(5, "e0 0c 00 0a 11 0000000a 1f 0002 6162",
      Disconnect(0, Properties(session_expiry_interval=10, reason_string="ab")),
      "5.0 DISCONNECT with session expiry 10 and reason string 'ab'"),
    V(5, "e0 01 8e", Disconnect(0x8E), "5.0 DISCONNECT 0x8E session taken over, no properties"),
    V(5, "f0 00", Auth(), "5.0 AUTH success, all omitted"),
    V(5, "f0 0a 18 08 15 0001 6d 16 0001 64",
      Auth(0x18, Properties(authentication_method="m", authentication_data=b"d")),
      "5.0 AUTH 0x18 continue authentication, method 'm', data 'd'"),
]  # fmt: skip


def _decoder_for(vector: Vector) -> Decoder:
    if isinstance(vector.packet, Connect):
        return Decoder()  # server side: the CONNECT sets the level
    return Decoder(protocol_level=vector.level)


def _ids(vector: Vector) -> str:
    return vector.comment


@pytest.mark.parametrize("vector", VECTORS, ids=_ids)
def test_decode(vector: Vector) -> None:
    decoder = _decoder_for(vector)
    decoder.feed(vector.data)
    assert decoder.next_packet() == vector.packet
    assert decoder.buffered == 0
    assert decoder.next_packet() is NEED_DATA
    if isinstance(vector.packet, Connect):
        assert decoder.protocol_level == vector.level


@pytest.mark.parametrize("vector", VECTORS, ids=_ids)
def test_encode(vector: Vector) -> None:
    assert encode(vector.packet, vector.level).hex() == vector.data.hex()


@pytest.mark.parametrize("vector", VECTORS, ids=_ids)
def test_every_prefix_needs_data(vector: Vector) -> None:
    data = vector.data
    for cut in range(len(data)):
        decoder = _decoder_for(vector)
        decoder.feed(data[:cut])
        assert decoder.next_packet() is NEED_DATA, cut
        assert decoder.buffered == cut


@pytest.mark.parametrize("vector", VECTORS, ids=_ids)
def test_byte_at_a_time(vector: Vector) -> None:
    decoder = _decoder_for(vector)
    data = vector.data
    for i, byte in enumerate(data):
        decoder.feed(bytes((byte,)))
        result = decoder.next_packet()
        if i < len(data) - 1:
            assert result is NEED_DATA
        else:
            assert result == vector.packet


@pytest.mark.parametrize("trailing", [b"\xc0", b"\x30\x05\x00", b"\xc0\x00\xd0"])
@pytest.mark.parametrize("vector", VECTORS, ids=_ids)
def test_trailing_bytes_stay_buffered(vector: Vector, trailing: bytes) -> None:
    decoder = _decoder_for(vector)
    decoder.feed(vector.data + trailing)
    assert decoder.next_packet() == vector.packet
    assert decoder.buffered == len(trailing)
    if trailing.startswith(b"\xc0\x00"):
        assert decoder.next_packet() == PingReq()
        assert decoder.buffered == len(trailing) - 2
    assert decoder.next_packet() is NEED_DATA


def test_vectors_cover_every_packet_type_and_level() -> None:
    seen = {(v.level, type(v.packet)) for v in VECTORS}
    for level in (4, 5):
        for cls in (Connect, ConnAck, Publish, PubAck, PubRec, PubRel, PubComp, Subscribe, SubAck,
                    Unsubscribe, UnsubAck, PingReq, Disconnect):  # fmt: skip
            assert (level, cls) in seen, (level, cls)
    assert (4, PingResp) in seen
    assert (5, Auth) in seen
    for cls in (Connect, ConnAck, Publish, Subscribe, SubAck, Disconnect):
        assert (3, cls) in seen


# ------------------------------------------------------------------------------------------ invalid input

CONNECT_311 = "10 0e 0004 4d515454 04 02 003c 0002 6331"


@dataclass
class Bad:
    level: int | None  # None: a fresh server-side decoder
    hex: str
    reason_code: int
    comment: str


B = Bad
INVALID: list[Bad] = [
    B(None, "c0 00", 0x82, "first packet is not CONNECT"),
    B(None, "10 0e 0004 4d515454 04 03 003c 0002 6331", 0x81, "CONNECT reserved flag (bit 0) set"),
    B(None, "10 0e 0004 4d515454 06 02 003c 0002 6331", 0x84, "CONNECT protocol level 6 is unknown"),
    B(None, "10 0e 0004 4d515454 03 02 003c 0002 6331", 0x84, "CONNECT name MQTT with level 3"),
    B(None, "10 0e 0004 4d515158 04 02 003c 0002 6331", 0x84, "CONNECT protocol name MQQX"),
    B(None, "10 11 0004 4d515454 04 42 003c 0002 6331 0001 70", 0x81,
      "3.1.1 CONNECT password flag without user name flag"),
    B(None, "10 0e 0004 4d515454 04 0a 003c 0002 6331", 0x81, "CONNECT will QoS 1 without will flag"),
    B(None, "10 0e 0004 4d515454 04 1e 003c 0002 6331", 0x81, "CONNECT will QoS 3"),
    B(None, "10 0f 0004 4d515454 04 02 003c 0002 6331 00", 0x81, "CONNECT trailing byte"),
    B(None, "10 0e 0004 4d515454 04 02 003c 0003 6331", 0x81, "CONNECT client id longer than packet"),
    B(None, "10 16 0004 4d515454 05 02 003c 07 16 0004 01020304 0002 6331", 0x82,
      "5.0 CONNECT authentication data without authentication method"),
    B(None, "10 12 0004 4d515454 05 02 003c 03 21 0000 0002 6331", 0x82, "5.0 CONNECT receive maximum 0"),
    B(None, "10 14 0004 4d515454 05 02 003c 05 27 00000000 0002 6331", 0x82,
      "5.0 CONNECT maximum packet size 0"),
    B(None, "10 11 0004 4d515454 05 02 003c 02 17 02 0002 6331", 0x82,
      "5.0 CONNECT request problem information 2"),
    B(None, "10 11 0004 4d515454 05 02 003c 02 24 01 0002 6331", 0x81,
      "5.0 CONNECT carries maximum QoS (a CONNACK-only property)"),
    B(None, "10 11 0004 4d515454 05 02 003c 02 7f 00 0002 6331", 0x81, "5.0 CONNECT unknown property 0x7F"),
    B(4, "00 00", 0x81, "reserved packet type 0"),
    B(4, "f0 00", 0x81, "AUTH is reserved before 5.0"),
    B(4, "36 05 0001 74 0001", 0x81, "PUBLISH QoS 3"),
    B(4, "38 05 0003 612f62", 0x81, "DUP set on a QoS 0 PUBLISH"),
    B(4, "32 05 0001 74 0000", 0x81, "PUBLISH packet identifier 0"),
    B(4, "32 03 0001 74", 0x81, "QoS 1 PUBLISH without packet identifier"),
    B(4, "30 04 0002 c328", 0x81, "topic is not well-formed UTF-8"),
    B(4, "30 04 0002 6100", 0x81, "topic contains U+0000"),
    B(4, "30 05 0003 eda080", 0x81, "topic contains an encoded surrogate U+D800"),
    B(4, "30 06 0004 c0af6161", 0x81, "topic contains an overlong encoding"),
    B(4, "60 02 0001", 0x81, "PUBREL with flags 0 (must be 0b0010)"),
    B(4, "41 02 0001", 0x81, "PUBACK with a reserved flag set"),
    B(4, "40 03 0001 00", 0x81, "3.1.1 PUBACK with a reason code byte"),
    B(4, "40 02 0000", 0x81, "PUBACK packet identifier 0"),
    B(4, "80 06 0001 0001 61 00", 0x81, "SUBSCRIBE with flags 0"),
    B(4, "82 02 0001", 0x82, "SUBSCRIBE without any topic filter"),
    B(4, "82 06 0001 0001 61 04", 0x81, "3.1.1 SUBSCRIBE options with reserved bits"),
    B(4, "82 06 0001 0001 61 03", 0x81, "SUBSCRIBE QoS 3"),
    B(4, "82 05 0001 0001 61", 0x81, "SUBSCRIBE filter without options byte"),
    B(4, "a2 02 0001", 0x82, "UNSUBSCRIBE without any topic filter"),
    B(4, "a0 05 0001 0001 61", 0x81, "UNSUBSCRIBE with flags 0"),
    B(4, "90 02 0001", 0x82, "SUBACK without return codes"),
    B(4, "90 03 0001 03", 0x82, "3.1.1 SUBACK return code 3"),
    B(4, "c0 01 00", 0x81, "PINGREQ with a body"),
    B(4, "e0 01 00", 0x81, "3.1.1 DISCONNECT with a body"),
    B(4, "20 02 02 00", 0x81, "CONNACK reserved flag set"),
    B(4, "20 02 01 05", 0x82, "CONNACK refused with session present"),
    B(4, "30 ff ff ff ff 01", 0x81, "remaining length of five bytes"),
    B(4, "30 80 00", 0x81, "remaining length not in its shortest form"),
    B(5, "30 09 0001 61 05 11 00000001", 0x81, "5.0 PUBLISH carrying session expiry (not allowed there)"),
    B(5, "30 0a 0001 61 06 03 0000 03 0000", 0x82, "5.0 PUBLISH with content type twice"),
    B(5, "30 06 0001 61 02 01 02", 0x82, "5.0 PUBLISH payload format indicator 2"),
    B(5, "30 07 0001 61 03 23 0000", 0x94, "5.0 PUBLISH topic alias 0"),
    B(5, "30 06 0001 61 02 0b 00", 0x82, "5.0 PUBLISH subscription identifier 0"),
    B(5, "30 05 0001 61 05 11", 0x81, "5.0 PUBLISH property length beyond the packet"),
    B(5, "30 03 0001 61", 0x81, "5.0 PUBLISH without property length"),
    B(5, "20 06 00 00 03 21 0000", 0x82, "5.0 CONNACK receive maximum 0"),
    B(5, "20 05 00 00 02 24 02", 0x82, "5.0 CONNACK maximum QoS 2"),
    B(5, "20 05 00 00 02 25 05", 0x82, "5.0 CONNACK retain available 5"),
    B(5, "20 02 00 01", 0x82, "5.0 CONNACK reason code 0x01 is not a CONNACK code"),
    B(5, "40 03 0001 01", 0x82, "5.0 PUBACK reason code 0x01 is not a PUBACK code"),
    B(5, "62 03 0001 10", 0x82, "5.0 PUBREL reason code 0x10"),
    B(5, "82 07 0001 00 0001 61 30", 0x82, "5.0 SUBSCRIBE retain handling 3"),
    B(5, "82 07 0001 00 0001 61 40", 0x81, "5.0 SUBSCRIBE options reserved bit 6"),
    B(5, "82 0b 0001 04 0b 01 0b 02 0001 61 00", 0x82, "5.0 SUBSCRIBE with two subscription identifiers"),
    B(5, "82 09 0001 02 0b 00 0001 61 00", 0x82, "5.0 SUBSCRIBE subscription identifier 0"),
    B(5, "b0 03 0001 00", 0x82, "5.0 UNSUBACK without reason codes"),
    B(5, "e0 01 01", 0x82, "5.0 DISCONNECT reason code 0x01"),
    B(5, "e0 02 00 05", 0x81, "5.0 DISCONNECT property length beyond the packet"),
    B(5, "f0 01 01", 0x82, "5.0 AUTH reason code 0x01"),
    B(5, "f0 04 18 02 21 00", 0x81, "5.0 AUTH carrying receive maximum"),
]  # fmt: skip


@pytest.mark.parametrize("bad", INVALID, ids=lambda b: b.comment)
def test_invalid(bad: Bad) -> None:
    data = bytes.fromhex(bad.hex)
    if len(data) >= 2 and data[1] < 0x80:  # the vector itself must be whole
        assert data[1] == len(data) - 2, "vector remaining length does not match its size"
    decoder = Decoder(protocol_level=bad.level)
    decoder.feed(data)
    with pytest.raises(ProtocolError) as info:
        decoder.next_packet()
    assert info.value.reason_code == bad.reason_code, info.value.message
    # A failed decoder stays failed.
    with pytest.raises(ProtocolError):
        decoder.next_packet()


def test_packet_too_large_is_checked_before_the_body_arrives() -> None:
    decoder = Decoder(max_packet_size=100)
    decoder.feed(bytes.fromhex(CONNECT_311))
    assert isinstance(decoder.next_packet(), Connect)
    decoder.feed(b"\x30\xe8\x07")  # PUBLISH announcing 1000 bytes; none of them sent yet
    with pytest.raises(ProtocolError) as info:
        decoder.next_packet()
    assert info.value.reason_code == 0x95


def test_packet_exactly_at_the_maximum_is_accepted() -> None:
    decoder = Decoder(max_packet_size=9, protocol_level=4)
    decoder.feed(bytes.fromhex("30 07 0003 612f62 6869"))  # 9 bytes in all
    assert decoder.next_packet() == Publish("a/b", b"hi")


def test_remaining_length_boundaries() -> None:
    # 127 -> one byte, 128 -> two bytes, 16383 -> two, 16384 -> three.
    for payload_size, header in ((124, "7f"), (125, "8001"), (16380, "ff7f"), (16381, "808001")):
        packet = Publish("t", bytes(payload_size))
        data = encode(packet, 4)
        assert data[1 : 1 + len(header) // 2].hex() == header
        decoder = Decoder(protocol_level=4)
        decoder.feed(data)
        assert decoder.next_packet() == packet
