"""Frame header, empty frames, protocol headers and the incremental FrameDecoder."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trimaran.amqp1.connection import TRANSFER_OVERHEAD_MAX
from trimaran.amqp1.frames import (
    AMQP_HEADER,
    EMPTY_FRAME,
    FRAME_AMQP,
    FRAME_SASL,
    NEED_DATA,
    SASL_HEADER,
    Frame,
    FrameDecoder,
    FramingError,
    encode_frame,
    performative_size,
)
from trimaran.amqp1.performatives import Close, Disposition, Open, SaslInit, Transfer

# size 0x11, doff 2, type 0, channel 1, then open(container-id "c") and nothing else
OPEN_FRAME = bytes.fromhex("0000001102000001005310c00401a10163")


def test_frame_vector_both_ways() -> None:
    assert bytes(encode_frame(FRAME_AMQP, 1, Open(container_id="c"))) == OPEN_FRAME
    dec = FrameDecoder()
    dec.feed(OPEN_FRAME)
    f = dec.next_frame()
    assert isinstance(f, Frame) and (f.type, f.channel) == (FRAME_AMQP, 1)
    perf, payload = f.performative()
    assert perf == Open(container_id="c") and bytes(payload) == b""


def test_headers_and_empty_frame() -> None:
    assert AMQP_HEADER == b"AMQP\x00\x01\x00\x00"
    assert SASL_HEADER == b"AMQP\x03\x01\x00\x00"
    assert bytes(encode_frame(FRAME_AMQP, 0, None)) == EMPTY_FRAME
    dec = FrameDecoder()
    dec.feed(SASL_HEADER + EMPTY_FRAME)
    assert dec.next_header() == SASL_HEADER
    f = dec.next_frame()
    assert isinstance(f, Frame) and f.is_empty


def test_transfer_payload_follows_performative() -> None:
    raw = bytes(encode_frame(FRAME_AMQP, 3, Transfer(handle=0), b"payload"))
    dec = FrameDecoder()
    dec.feed(raw)
    f = dec.next_frame()
    assert isinstance(f, Frame)
    perf, payload = f.performative()
    assert perf == Transfer(handle=0) and bytes(payload) == b"payload"


def test_every_strict_prefix_needs_data() -> None:
    raw = bytes(encode_frame(FRAME_SASL, 0, SaslInit(mechanism="PLAIN", initial_response=b"\0u\0p")))
    for i in range(len(raw)):
        dec = FrameDecoder()
        dec.feed(raw[:i])
        assert dec.next_frame() is NEED_DATA
        assert dec.buffered == i
    for i in range(8):
        dec = FrameDecoder()
        dec.feed(AMQP_HEADER[:i])
        assert dec.next_header() is NEED_DATA


def test_trailing_bytes_untouched() -> None:
    dec = FrameDecoder()
    dec.feed(OPEN_FRAME + b"\x00\x00\x01")
    assert isinstance(dec.next_frame(), Frame)
    assert dec.next_frame() is NEED_DATA
    assert dec.take_rest() == b"\x00\x00\x01"


def test_extended_header_is_skipped() -> None:
    body = bytes.fromhex("00531845")
    raw = (8 + 4 + len(body)).to_bytes(4, "big") + b"\x03\x00\x00\x00" + b"EXTD" + body
    dec = FrameDecoder()
    dec.feed(raw)
    f = dec.next_frame()
    assert isinstance(f, Frame) and f.performative()[0] == Close()


@pytest.mark.parametrize(
    "header",
    [
        "0000000702000000",  # size below the header
        "0000001001000000",  # doff 1
        "0000000803000000",  # doff beyond the frame
        "0001000102000000",  # bigger than max-frame-size (checked before the body arrives)
    ],
)
def test_bad_headers(header: str) -> None:
    dec = FrameDecoder(max_frame_size=1024)
    dec.feed(bytes.fromhex(header))
    with pytest.raises(FramingError) as info:
        dec.next_frame()
    assert info.value.condition == "amqp:connection:framing-error"


frames_st = st.lists(
    st.tuples(st.integers(0, 1), st.integers(0, 0xFFFF), st.binary(max_size=300)),
    min_size=1,
    max_size=6,
)


@given(frames_st, st.lists(st.integers(1, 400), max_size=20))
@settings(max_examples=100)
def test_any_split_gives_the_same_frames(frames: list[tuple[int, int, bytes]], cuts: list[int]) -> None:
    stream = b"".join(bytes(encode_frame(t, ch, Transfer(handle=ch), p)) for t, ch, p in frames)
    dec = FrameDecoder()
    got: list[Frame] = []
    pos = 0
    for n in [*cuts, len(stream)]:
        dec.feed(stream[pos : pos + n])
        pos += n
        got.extend(dec.frames())
    assert [(f.type, f.channel, bytes(f.performative()[1])) for f in got] == frames
    assert dec.buffered == 0


@given(st.binary(max_size=200))
@settings(max_examples=300)
def test_random_bytes_only_raise_framing_error(data: bytes) -> None:
    dec = FrameDecoder(max_frame_size=512)
    dec.feed(data)
    with contextlib.suppress(FramingError):
        dec.frames()


def test_first_transfer_fits_the_overhead_bound_send_relies_on() -> None:
    """ServerConnection.send skips the trial encoding when size + tag + this bound fits a frame."""
    for tag in (b"", b"t" * 32, b"x" * 300, b"y" * 70000):
        for settled in (True, False):
            transfer = Transfer(
                handle=2**32 - 1,
                delivery_id=2**32 - 1,
                delivery_tag=tag,
                message_format=2**32 - 1,
                settled=settled,
            )
            assert performative_size(transfer) <= len(tag) + TRANSFER_OVERHEAD_MAX


def test_next_body_if_takes_only_a_whole_matching_frame() -> None:
    d = FrameDecoder()
    wanted = bytes(encode_frame(FRAME_AMQP, 1, Disposition(role=True, first=7, settled=True)))
    d.feed(wanted[:-1])
    assert d.next_body_if(FRAME_AMQP, 1, b"\x00\x53\x15") is None  # not whole yet
    d.feed(wanted[-1:])
    assert d.next_body_if(FRAME_AMQP, 0, b"\x00\x53\x15") is None  # another channel
    assert d.next_body_if(FRAME_AMQP, 1, b"\x00\x53\x14") is None  # another performative
    body = d.next_body_if(FRAME_AMQP, 1, b"\x00\x53\x15")
    assert body == wanted[8:] and d.buffered == 0
    d.feed(wanted)
    frame = d.next_frame()  # nothing was consumed by the misses
    assert isinstance(frame, Frame) and frame.channel == 1 and frame.body == body
