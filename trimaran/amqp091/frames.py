"""AMQP 0-9-1 framing: protocol header, frame decoder, frame encoders.

A frame is ``type:octet channel:short size:long payload:size frame-end:0xCE``. ``frame_max`` counts
the whole frame, so a payload may be at most ``frame_max - 8`` bytes (``frame_max == 0``: no limit).

:class:`FrameDecoder` owns its buffer: ``feed()`` bytes as they arrive, then call ``next_frame()``
until it returns :data:`NEED_DATA`. An oversized frame is refused from its 7-byte header, before
its payload is buffered. Every problem raises :class:`~trimaran.amqp091.spec.ProtocolError` with
the reply code to close the connection with (501 FRAME_ERROR for framing, 502 SYNTAX_ERROR for
malformed arguments, 503 COMMAND_INVALID for unknown methods).
"""

import enum
import struct
from dataclasses import dataclass
from typing import Final, Literal

from trimaran.amqp091.properties import (
    BasicProperties,
    decode_header_payload,
    decode_properties,
    encode_properties,
)
from trimaran.amqp091.spec import (
    FRAME_BODY,
    FRAME_END,
    FRAME_ERROR,
    FRAME_HEADER,
    FRAME_HEARTBEAT,
    FRAME_METHOD,
    FRAME_MIN_SIZE,
    FRAME_OVERHEAD,
    PROTOCOL_HEADER,
    BasicAck,
    BasicDeliver,
    EncodeError,
    Method,
    ProtocolError,
    decode_method,
    encode_method_arguments,
)


class NeedData(enum.Enum):
    NEED_DATA = "NEED_DATA"


NEED_DATA: Literal[NeedData.NEED_DATA] = NeedData.NEED_DATA


@dataclass(slots=True)
class MethodFrame:
    channel: int
    method: Method


@dataclass(slots=True)
class HeaderFrame:
    channel: int
    class_id: int
    body_size: int
    properties: BasicProperties


@dataclass(slots=True)
class BodyFrame:
    channel: int
    payload: bytes


@dataclass(slots=True)
class HeartbeatFrame:
    channel: int = 0


Frame = MethodFrame | HeaderFrame | BodyFrame | HeartbeatFrame

# --------------------------------------------------------------------------------------------
# Protocol header


class ProtocolHeader(enum.Enum):
    AMQP_0_9_1 = "amqp-0-9-1"
    #: RabbitMQ serves 0-9 (``AMQP\x01\x01\x00\x09``) with its 0-9-1 framing; we do the same.
    AMQP_0_9 = "amqp-0-9"
    #: ``AMQP\x01\x01\x08\x00`` (0-8): not supported.
    AMQP_0_8 = "amqp-0-8"
    AMQP_1_0 = "amqp-1-0"
    AMQP_1_0_TLS = "amqp-1-0-tls"
    AMQP_1_0_SASL = "amqp-1-0-sasl"
    OTHER_AMQP = "other-amqp"
    NOT_AMQP = "not-amqp"


_HEADERS = {
    PROTOCOL_HEADER: ProtocolHeader.AMQP_0_9_1,
    b"AMQP\x01\x01\x00\x09": ProtocolHeader.AMQP_0_9,
    b"AMQP\x01\x01\x08\x00": ProtocolHeader.AMQP_0_8,
    b"AMQP\x00\x01\x00\x00": ProtocolHeader.AMQP_1_0,
    b"AMQP\x02\x01\x00\x00": ProtocolHeader.AMQP_1_0_TLS,
    b"AMQP\x03\x01\x00\x00": ProtocolHeader.AMQP_1_0_SASL,
}


def classify_protocol_header(data: bytes) -> ProtocolHeader | Literal[NeedData.NEED_DATA]:
    """Tell what the first 8 bytes of a connection announce (bytes after the 8th are ignored).

    Returns ``NEED_DATA`` while ``data`` is shorter than 8 bytes and still a prefix of ``AMQP``.
    """
    head = bytes(data[:8])
    if not b"AMQP".startswith(head[:4]):
        return ProtocolHeader.NOT_AMQP
    if len(head) < 8:
        return NEED_DATA
    return _HEADERS.get(head, ProtocolHeader.OTHER_AMQP)


# --------------------------------------------------------------------------------------------
# Decoding

_FRAME_HEAD: Final = struct.Struct(">BHI")
_METHOD_HEAD: Final = struct.Struct(">BHII")
_HEADER_HEAD: Final = struct.Struct(">BHIHHQ")
_HEADER_FIELDS: Final = struct.Struct(">HHQ")  # class id, weight, body size
_HEADER_FIELDS_SIZE: Final = 12
_PROPERTIES_KEPT: Final = 64  # distinct property encodings remembered per connection
_PUBLISHES_KEPT: Final = 64  # distinct basic.publish argument lists remembered per connection
_SIZE: Final = struct.Struct(">I")
_TAG_AND_BITS: Final = struct.Struct(">QB")  # basic.ack's delivery tag and bits
_PUBLISH_INDEX: Final = (60 << 16) | 40  # basic.publish
_ACK_INDEX: Final = BasicAck.INDEX
_ACK_SIZE: Final = 4 + 8 + 1  # method index, delivery tag, bits
_BASIC: Final = 60


# A frame still not whole after a read is joined with the next read's bytes; one larger than this is
# gathered in a bytearray instead, until it is whole.
SPLIT_FROM: Final = 64 * 1024


def _frame_size(buf: bytes | bytearray, pos: int) -> int:
    """The whole size of the frame at ``pos`` as its header says, or -1 while the header is not whole."""
    if len(buf) - pos < 7:
        return -1
    size: int = _SIZE.unpack_from(buf, pos + 3)[0]
    return 8 + size


class FrameDecoder:
    """Incremental frame decoder over its own buffer.

    The buffer is ``bytes``: compiled, a bytes object is indexed and sliced natively (a bytearray
    through the generic protocol). A read decoded whole is decoded in the read's own bytes; one that
    ends inside a frame is joined with the next, and a large frame that takes many reads is gathered
    in a bytearray until it is whole (joining each read to all before it would copy it again and
    again)."""

    __slots__ = ("_buf", "_last_publish", "_pos", "_properties", "_publishes", "_split", "frame_max")

    def __init__(self, frame_max: int = FRAME_MIN_SIZE) -> None:
        self._buf = b""
        self._pos = 0
        self._split: bytearray | None = None  # a large frame's bytes until it is whole
        # A publisher sends the same property bytes again and again: each is decoded once. The
        # objects are shared between messages; nothing changes a BasicProperties once decoded.
        self._properties: dict[bytes, BasicProperties] = {}
        # And the same basic.publish arguments (exchange, routing key, flags): decoded once too,
        # the method objects shared as the properties are (nothing changes a method once decoded).
        self._publishes: dict[bytes, Method] = {}
        self._last_publish = b""  # the method frame of the last one read whole (``repeats``)
        #: Largest frame accepted, overhead included; 0 means unlimited. May be changed any time.
        self.frame_max = frame_max

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        chunk = data if isinstance(data, bytes) else bytes(data)
        split = self._split
        if split is not None:
            split += chunk
            if len(split) >= _frame_size(split, 0):
                self._buf = bytes(split)
                self._split = None
            return
        buf = self._buf
        pos = self._pos
        self._pos = 0
        if pos == len(buf):
            self._buf = chunk  # decoded where it was read: nothing copied
            return
        size = _frame_size(buf, pos)
        if len(buf) - pos + len(chunk) < size and size > SPLIT_FROM:
            fmax = self.frame_max
            if not fmax or size <= fmax:  # (a frame too large is refused by next_frame)
                split = self._split = bytearray(buf[pos:])
                split += chunk
                self._buf = b""
                return
        self._buf = buf[pos:] + chunk

    @property
    def buffered(self) -> int:
        """Bytes fed but not yet returned as frames."""
        split = self._split
        return len(self._buf) - self._pos + (0 if split is None else len(split))

    def unconsumed(self) -> bytes:
        split = self._split
        return self._buf[self._pos :] + (b"" if split is None else bytes(split))

    def publish_channel(self) -> int:
        """The channel of the basic.publish method frame at the head of the buffer; 0 if the next
        frame is anything else (or not yet readable)."""
        buf = self._buf
        pos = self._pos
        if len(buf) - pos < 11 or buf[pos] != FRAME_METHOD:
            return 0
        _, channel, _, index = _METHOD_HEAD.unpack_from(buf, pos)
        return channel if index == _PUBLISH_INDEX else 0

    def next_ack(self) -> tuple[int, BasicAck] | None:
        """The basic.ack method frame at the head of the buffer, whole and well-formed, consumed
        and decoded in one step: (channel, method), what a consumer sends for every message. None
        consumes nothing: :meth:`next_frame` reads whatever is there, and says what is wrong."""
        buf = self._buf
        pos = self._pos
        end = pos + 7 + _ACK_SIZE
        if len(buf) <= end or buf[pos] != FRAME_METHOD:
            return None
        _, channel, size, index = _METHOD_HEAD.unpack_from(buf, pos)
        if index != _ACK_INDEX or size != _ACK_SIZE or buf[end] != FRAME_END:
            return None
        delivery_tag, bits = _TAG_AND_BITS.unpack_from(buf, pos + 11)
        if end + 1 == len(buf):
            self._buf = b""  # everything consumed, as next_frame drops it
            self._pos = 0
        else:
            self._pos = end + 1
        return channel, BasicAck(delivery_tag, bool(bits & 1))

    def next_publish(self, max_body_size: int) -> tuple[Method, BasicProperties, bytes, bytes] | None:
        """A basic.publish with its content header and its one body frame, decoded in one step
        when all three are buffered, well-formed and within the limits: what most messages are,
        three frames for one event. None leaves them to :meth:`next_frame`, which reads them one
        at a time and reports whatever is wrong exactly as it would have (call only after
        :meth:`publish_channel` found a publish). Last comes the properties' own bytes (flag word
        and list), which a consumer can be sent as they are."""
        buf = self._buf
        pos = self._pos
        have = len(buf)
        fmax = self.frame_max
        largest = fmax - FRAME_OVERHEAD if fmax else 0xFFFFFFFF
        # The unpacked fields typed: compiled, the sums below are then machine ints, not objects.
        channel: int
        size: int
        ftype: int
        head_channel: int
        class_id: int
        body_size: int
        body_channel: int
        _, channel, size, _ = _METHOD_HEAD.unpack_from(buf, pos)
        method_end = pos + 7 + size
        head = method_end + 1
        if size > largest or head + 21 > have or buf[method_end] != FRAME_END:
            return None
        ftype, head_channel, size = _FRAME_HEAD.unpack_from(buf, head)
        head_end = head + 7 + size
        if ftype != FRAME_HEADER or head_channel != channel or size > largest or head_end >= have:
            return None
        class_id, _, body_size = _HEADER_FIELDS.unpack_from(buf, head + 7)
        if buf[head_end] != FRAME_END or class_id != _BASIC or body_size > max_body_size:
            return None
        end = head_end
        body = b""
        if body_size:
            start = head_end + 1
            if start + 7 > have:
                return None
            ftype, body_channel, size = _FRAME_HEAD.unpack_from(buf, start)
            end = start + 7 + size
            if ftype != FRAME_BODY or body_channel != channel or size != body_size or size > largest:
                return None
            if end >= have or buf[end] != FRAME_END:
                return None
            body = buf[start + 7 : end]
        encoded = buf[head + 7 + _HEADER_FIELDS_SIZE : head_end]
        arguments = buf[pos + 7 : method_end]
        try:
            method = self._publishes.get(arguments)
            if method is None:
                method = decode_method(arguments, channel)
                if len(self._publishes) >= _PUBLISHES_KEPT:
                    self._publishes.clear()
                self._publishes[arguments] = method
            properties = self._properties.get(encoded)
            if properties is None:
                properties, off = decode_properties(encoded, 0)
                if off != len(encoded):
                    return None  # next_frame says what is wrong with it
                if len(self._properties) >= _PROPERTIES_KEPT:
                    self._properties.clear()
                self._properties[encoded] = properties
        except ProtocolError:
            return None
        if end + 1 == have:
            self._buf = b""
            self._pos = 0
        else:
            self._pos = end + 1
        self._last_publish = buf[pos : method_end + 1]
        return method, properties, body, encoded

    def repeats(self) -> bool:
        """The frame at the head is the method frame of the last publish :meth:`next_publish`
        read, byte for byte: a basic.publish on its channel with its exchange, key and flags."""
        pos = self._pos
        last = self._last_publish
        return self._buf[pos : pos + len(last)] == last

    def next_frame(self) -> Frame | Literal[NeedData.NEED_DATA]:
        buf = self._buf
        pos = self._pos
        if len(buf) - pos < 7:
            return NEED_DATA
        ftype, channel, size = _FRAME_HEAD.unpack_from(buf, pos)
        fmax = self.frame_max
        if fmax and size > fmax - FRAME_OVERHEAD:
            raise ProtocolError(
                FRAME_ERROR,
                f"frame of {size + FRAME_OVERHEAD} bytes exceeds frame_max {fmax}",
                channel=channel,
            )
        end = pos + 7 + size
        if len(buf) <= end:
            return NEED_DATA
        if buf[end] != FRAME_END:
            raise ProtocolError(FRAME_ERROR, f"bad frame end octet {buf[end]:#04x}", channel=channel)
        payload = buf[pos + 7 : end]
        if end + 1 == len(buf):
            # Everything consumed: drop the buffer so that an idle connection holds nothing.
            self._buf = b""
            self._pos = 0
        else:
            self._pos = end + 1
        if ftype == FRAME_METHOD:
            return MethodFrame(channel, decode_method(payload, channel))
        if ftype == FRAME_BODY:
            return BodyFrame(channel, payload)
        if ftype == FRAME_HEADER:
            try:
                class_id, body_size, props = decode_header_payload(payload)
            except ProtocolError as exc:
                exc.channel = channel
                raise
            return HeaderFrame(channel, class_id, body_size, props)
        if ftype == FRAME_HEARTBEAT:
            if channel != 0 or size != 0:
                raise ProtocolError(FRAME_ERROR, "heartbeat frame with a channel or a payload")
            return HeartbeatFrame(0)
        raise ProtocolError(FRAME_ERROR, f"unknown frame type {ftype}", channel=channel)


# --------------------------------------------------------------------------------------------
# Encoding

HEARTBEAT_FRAME: Final = b"\x08\x00\x00\x00\x00\x00\x00\xce"


def write_method(out: bytearray, channel: int, method: Method) -> None:
    """Append a method frame to ``out`` (unchanged if the method cannot be encoded)."""
    start = len(out)
    try:
        out += _METHOD_HEAD.pack(FRAME_METHOD, channel, 0, method.INDEX)
        encode_method_arguments(method, out)
    except (EncodeError, struct.error) as exc:
        del out[start:]
        raise EncodeError(f"cannot encode {method.NAME} on channel {channel}: {exc}") from exc
    _SIZE.pack_into(out, start + 3, len(out) - start - 7)
    out.append(FRAME_END)


def write_content_header(
    out: bytearray,
    channel: int,
    class_id: int,
    body_size: int,
    properties: BasicProperties | bytes | None,
) -> None:
    """``properties``: to encode, or ``bytes`` already encoded (a publisher's own, see
    ``Message.encoded_properties``)."""
    start = len(out)
    try:
        out += _HEADER_HEAD.pack(FRAME_HEADER, channel, 0, class_id, 0, body_size)
        if type(properties) is bytes:
            out += properties
        else:
            encode_properties(properties, out)  # type: ignore[arg-type]
    except (struct.error, ValueError, TypeError, AttributeError, OverflowError) as exc:
        del out[start:]
        raise EncodeError(f"cannot encode content header: {exc}") from exc
    _SIZE.pack_into(out, start + 3, len(out) - start - 7)
    out.append(FRAME_END)


def write_body(out: bytearray, channel: int, body: bytes | bytearray | memoryview, frame_max: int) -> None:
    """Append ``body`` as body frames of at most ``frame_max`` bytes each (none if it is empty)."""
    size = len(body)
    if not size:
        return
    chunk = frame_max - FRAME_OVERHEAD if frame_max else size
    if chunk <= 0:
        raise EncodeError(f"frame_max {frame_max} leaves no room for a body")
    if size <= chunk:
        out += _FRAME_HEAD.pack(FRAME_BODY, channel, size)
        out += body
        out.append(FRAME_END)
        return
    with memoryview(body) as view:
        for i in range(0, size, chunk):
            piece = view[i : i + chunk]
            out += _FRAME_HEAD.pack(FRAME_BODY, channel, len(piece))
            out += piece
            out.append(FRAME_END)


def write_content(
    out: bytearray,
    channel: int,
    method: Method,
    properties: BasicProperties | bytes | None,
    body: bytes | bytearray | memoryview,
    frame_max: int,
) -> None:
    """Append a content-carrying method, its header and its body frames to ``out``."""
    start = len(out)
    write_method(out, channel, method)
    _write_header_and_body(out, start, channel, method.CLASS_ID, properties, body, frame_max)


def _write_header_and_body(
    out: bytearray,
    start: int,
    channel: int,
    class_id: int,
    properties: BasicProperties | bytes | None,
    body: bytes | bytearray | memoryview,
    frame_max: int,
) -> None:
    """The content header and body frames after a method written from ``start``; on an error the
    whole content, method and all, is taken back out."""
    header_start = len(out)
    try:
        write_content_header(out, channel, class_id, len(body), properties)
        if frame_max and len(out) - header_start > frame_max:
            raise EncodeError(
                f"content header of {len(out) - header_start} bytes exceeds frame_max {frame_max}"
            )
        write_body(out, channel, body, frame_max)
    except EncodeError:
        del out[start:]
        raise


_DELIVER_INDEX: Final = BasicDeliver.INDEX
_BASIC_CLASS: Final = BasicDeliver.CLASS_ID
_HEADER_FRAME: Final = _HEADER_HEAD.size + 1  # a content header frame without its properties
_DELIVER_FIXED: Final = 4 + 1 + 8 + 1 + 1 + 1  # method index, three shortstr lengths, delivery tag, bits
_DELIVER_HEAD: Final = struct.Struct(">BHIIB")  # frame type, channel, size, method index, tag length
_DELIVER_MIDDLE: Final = struct.Struct(">QBB")  # delivery tag, bits, exchange length
_FRAME_END: Final = bytes([FRAME_END])
# The Struct of a delivery's three frames but the body, by the lengths of its consumer tag,
# exchange, routing key and properties: a consumer's deliveries have few shapes.
_DELIVERY_SHAPES: Final[dict[tuple[int, int, int, int], struct.Struct]] = {}
_SHAPES_KEPT: Final = 256


def _delivery_shape(n_tag: int, n_ex: int, n_key: int, n_props: int) -> struct.Struct:
    """basic.deliver's method frame (the frame head, the method index, the consumer tag, the
    delivery tag, the bits, the exchange, the routing key, the frame end), the content header
    frame with the publisher's property bytes, and the head of the body frame."""
    shape = struct.Struct(f">BHIIB{n_tag}sQBB{n_ex}sB{n_key}sBBHIHHQ{n_props}sBBHI")
    if len(_DELIVERY_SHAPES) >= _SHAPES_KEPT:
        _DELIVERY_SHAPES.clear()
    _DELIVERY_SHAPES[n_tag, n_ex, n_key, n_props] = shape
    return shape


def write_delivery(
    out: bytearray,
    channel: int,
    consumer_tag: str,
    delivery_tag: int,
    redelivered: bool,
    exchange: str,
    routing_key: str,
    properties: BasicProperties | bytes | None,
    body: bytes | bytearray | memoryview,
    frame_max: int,
) -> None:
    """``write_content`` of a basic.deliver, its arguments packed here rather than through a
    method object and the generic encoder: the frame every consumed message costs."""
    ctag = consumer_tag.encode("utf-8", "surrogateescape")
    ex = exchange.encode("utf-8", "surrogateescape") if exchange else b""
    key = routing_key.encode("utf-8", "surrogateescape")
    n_tag, n_ex, n_key, size = len(ctag), len(ex), len(key), len(body)
    if n_tag > 255 or n_ex > 255 or n_key > 255 or not 0 <= delivery_tag < 1 << 64:
        # Not a shortstr (a long MQTT topic as the key): the generic path says so as it always has.
        method = BasicDeliver(consumer_tag, delivery_tag, redelivered, exchange, routing_key)
        write_content(out, channel, method, properties, body, frame_max)
        return
    method_size = _DELIVER_FIXED + n_tag + n_ex + n_key
    if type(properties) is bytes and size:
        n_props = len(properties)
        if not frame_max or (size + FRAME_OVERHEAD <= frame_max and _HEADER_FRAME + n_props <= frame_max):
            # The usual case: the publisher's own property bytes and the body in one frame, all but
            # the body in one pack.
            shape = _DELIVERY_SHAPES.get((n_tag, n_ex, n_key, n_props))
            if shape is None:
                shape = _delivery_shape(n_tag, n_ex, n_key, n_props)
            out += shape.pack(
                FRAME_METHOD, channel, method_size, _DELIVER_INDEX, n_tag, ctag,
                delivery_tag, 1 if redelivered else 0, n_ex, ex, n_key, key, FRAME_END,
                FRAME_HEADER, channel, 12 + n_props, _BASIC_CLASS, 0, size, properties, FRAME_END,
                FRAME_BODY, channel, size,
            )  # fmt: skip
            out += body
            out += _FRAME_END
            return
    # Each fixed run of fields in one pack: the method frame's head and the tag's length, then the
    # delivery tag, bits and the exchange's length.
    start = len(out)
    out += _DELIVER_HEAD.pack(FRAME_METHOD, channel, method_size, _DELIVER_INDEX, n_tag)
    out += ctag
    out += _DELIVER_MIDDLE.pack(delivery_tag, 1 if redelivered else 0, n_ex)
    out += ex
    out.append(n_key)
    out += key
    out.append(FRAME_END)
    _write_header_and_body(out, start, channel, _BASIC_CLASS, properties, body, frame_max)


def encode_method(channel: int, method: Method) -> bytes:
    out = bytearray()
    write_method(out, channel, method)
    return bytes(out)


def encode_content(
    channel: int,
    method: Method,
    properties: BasicProperties | None,
    body: bytes,
    frame_max: int = 0,
) -> bytes:
    out = bytearray()
    write_content(out, channel, method, properties, body, frame_max)
    return bytes(out)


def encode_frame(frame: Frame) -> bytes:
    """Encode one frame object (the inverse of :meth:`FrameDecoder.next_frame`)."""
    out = bytearray()
    if isinstance(frame, MethodFrame):
        write_method(out, frame.channel, frame.method)
    elif isinstance(frame, HeaderFrame):
        write_content_header(out, frame.channel, frame.class_id, frame.body_size, frame.properties)
    elif isinstance(frame, BodyFrame):
        out += _FRAME_HEAD.pack(FRAME_BODY, frame.channel, len(frame.payload))
        out += frame.payload
        out.append(FRAME_END)
    else:
        out += HEARTBEAT_FRAME
    return bytes(out)
