"""AMQP 1.0 framing (part 2 "transport", section 2.3) and protocol headers.

A frame is ``size:uint32 doff:uint8 type:uint8 channel:uint16``, an extended header of
``doff*4 - 8`` bytes (ignored) and a body. An empty body is a heartbeat. Type 0 frames
carry a performative plus (for transfer) the payload; type 1 frames carry a SASL frame.

:class:`FrameDecoder` owns a bytearray buffer: ``feed(data)`` appends, ``next_frame()``
returns the next whole :class:`Frame` or :data:`NEED_DATA`. The size field is checked
against ``max_frame_size`` as soon as the 8-byte header is complete, before any of the body
is waited for, so an oversized frame is refused without buffering it.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any, Final

from .codec import encode_into
from .performatives import Composite, decode_composite
from .types import DecodeError

__all__ = [
    "AMQP_HEADER",
    "FRAME_AMQP",
    "FRAME_SASL",
    "NEED_DATA",
    "SASL_HEADER",
    "Frame",
    "FrameDecoder",
    "FramingError",
    "encode_frame",
]

AMQP_HEADER: Final = b"AMQP\x00\x01\x00\x00"
SASL_HEADER: Final = b"AMQP\x03\x01\x00\x00"
HEADER_SIZE: Final = 8
FRAME_AMQP: Final = 0
FRAME_SASL: Final = 1
MIN_MAX_FRAME_SIZE: Final = 512
EMPTY_FRAME: Final = b"\x00\x00\x00\x08\x02\x00\x00\x00"

_HDR = struct.Struct(">IBBH")


class _NeedData:
    __slots__ = ()

    def __repr__(self) -> str:
        return "NEED_DATA"


NEED_DATA: Final = _NeedData()


class FramingError(DecodeError):
    """A frame header that cannot be valid (``amqp:connection:framing-error``)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, "amqp:connection:framing-error")


@dataclass(frozen=True, slots=True)
class Frame:
    type: int
    channel: int
    body: bytes

    @property
    def is_empty(self) -> bool:
        return not self.body

    def performative(self) -> tuple[Composite, memoryview]:
        """Decode the body's performative; returns it and the rest of the body (payload)."""
        view = memoryview(self.body)
        perf, end = decode_composite(view, 0)
        return perf, view[end:]


class FrameDecoder:
    """Incremental frame parser over an internal buffer."""

    __slots__ = ("_buf", "_pos", "max_frame_size")

    def __init__(self, max_frame_size: int = 0xFFFF_FFFF) -> None:
        self._buf = bytearray()
        self._pos = 0
        self.max_frame_size = max_frame_size

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        if self._pos and self._pos == len(self._buf):
            self._buf.clear()
            self._pos = 0
        self._buf += data

    @property
    def buffered(self) -> int:
        return len(self._buf) - self._pos

    def _compact_all(self) -> None:
        # Waiting for more input: keep only the unparsed tail, so that an idle connection
        # does not hold on to the big chunk its last frames came in.
        if self._pos:
            del self._buf[: self._pos]
            self._pos = 0

    def _compact(self) -> None:
        if self._pos > 65536 or self._pos == len(self._buf):
            del self._buf[: self._pos]
            self._pos = 0

    def next_header(self) -> bytes | _NeedData:
        """The next 8 bytes, for protocol header negotiation."""
        if len(self._buf) - self._pos < HEADER_SIZE:
            return NEED_DATA
        hdr = bytes(self._buf[self._pos : self._pos + HEADER_SIZE])
        self._pos += HEADER_SIZE
        self._compact()
        return hdr

    def next_frame(self) -> Frame | _NeedData:
        buf = self._buf
        pos = self._pos
        have = len(buf) - pos
        if have < HEADER_SIZE:
            self._compact_all()
            return NEED_DATA
        size, doff, ftype, channel = _HDR.unpack_from(buf, pos)
        if size < HEADER_SIZE:
            raise FramingError(f"frame size {size} is smaller than the frame header")
        if size > self.max_frame_size:
            raise FramingError(f"frame size {size} exceeds max-frame-size {self.max_frame_size}")
        if doff < 2 or doff * 4 > size:
            raise FramingError(f"invalid data offset {doff}")
        if have < size:
            self._compact_all()
            return NEED_DATA
        body = bytes(buf[pos + doff * 4 : pos + size])
        pos += size
        if pos > 65536 or size == have:  # as _compact, without a call per frame
            del buf[:pos]
            pos = 0
        self._pos = pos
        return Frame(ftype, channel, body)

    def next_body_if(self, ftype: int, channel: int, head: bytes) -> bytes | None:
        """The next frame's body when the whole frame is buffered, is of ``ftype`` on ``channel`` and
        its body starts with ``head`` (a performative's three descriptor bytes); else None and
        nothing is consumed (next_frame then reads it, and says what is wrong with it)."""
        buf = self._buf
        pos = self._pos
        have = len(buf) - pos
        if have < HEADER_SIZE:
            return None
        size, doff, got_type, got_channel = _HDR.unpack_from(buf, pos)
        if (
            got_type != ftype
            or got_channel != channel
            or size > have
            or size > self.max_frame_size
            or doff < 2
            or doff * 4 + 3 > size
        ):
            return None
        start = pos + doff * 4
        if buf[start : start + 3] != head:
            return None
        body = bytes(buf[start : pos + size])
        pos += size
        if pos > 65536 or size == have:
            del buf[:pos]
            pos = 0
        self._pos = pos
        return body

    def frames(self) -> list[Frame]:
        """Every whole frame currently buffered."""
        out: list[Frame] = []
        while True:
            f = self.next_frame()
            if isinstance(f, _NeedData):
                return out
            out.append(f)

    def take_rest(self) -> bytes:
        rest = bytes(self._buf[self._pos :])
        self._buf.clear()
        self._pos = 0
        return rest


def encode_frame(
    ftype: int,
    channel: int,
    performative: Composite | None,
    payload: bytes | bytearray | memoryview = b"",
    out: bytearray | None = None,
) -> bytearray:
    """Append one frame to ``out`` (a new bytearray if not given) and return ``out``."""
    if out is None:
        out = bytearray()
    start = len(out)
    out += EMPTY_FRAME
    if performative is not None:
        encode_into(out, performative)
    if payload:
        out += payload
    size = len(out) - start
    _HDR.pack_into(out, start, size, 2, ftype, channel)
    return out


def performative_size(performative: Composite) -> int:
    out = bytearray()
    encode_into(out, performative)
    return len(out)


def describe(frame: Frame) -> Any:  # pragma: no cover - debugging aid
    if frame.is_empty:
        return "<heartbeat>"
    return frame.performative()[0]
