"""The frames that carry messages, read and written without the generic codec.

A ``transfer`` arrives and leaves once per message and a ``disposition`` once per message or
range: walking them value by value through :mod:`.codec` costs more than the rest of a
message's path. This module reads them with a reader that knows their field layout (part 2,
sections 2.7.5 and 2.7.6) and writes them whole. Everything it does not recognise (a
delivery-state other than accepted, a described type it does not know, an encoding it does not
expect, a truncated body) it leaves to the generic codec by answering ``None``, which then
decodes the frame and reports what is wrong with it. What it reads it reads exactly as
:func:`.performatives.decode_composite` would.

Writers always use the fixed-width encodings (``uint`` as 0x70 and four bytes, a list as
``list8`` or ``list32``): valid AMQP, and the same length whatever the values.
"""

from __future__ import annotations

import struct
from typing import Final

from .codec import encode

__all__ = ["ACCEPTED", "read_disposition", "read_transfer", "write_disposition", "write_transfer"]

TRANSFER_CODE: Final = 0x14
DISPOSITION_CODE: Final = 0x15
# Delivery states read here: none, or accepted (the common case); anything else goes the long way.
ACCEPTED: Final = b"\x00\x53\x24\x45"

# frame header (size, doff 2, type 0, channel), descriptor, list8 (size, count 5), handle,
# delivery-id, tag (vbin8 length); the tag, message-format and settled follow.
_TRANSFER_HEAD = struct.Struct(">IBBH3sBBBBIBIBB")
_DESCRIPTOR = b"\x00\x53\x14"
# Bytes of a transfer's list after its count and before the tag, and after the tag.
_BEFORE_TAG = 5 + 5 + 2
_FORMAT_ZERO_SETTLED = (b"\x43\x42", b"\x43\x41")  # message-format 0, settled false / true
_U32 = struct.Struct(">I")
# frame header, descriptor, list8 / list32 (size, count), role, first (uint), then for a range last
# (uint) and for one delivery a null last; settled and the state follow.
_DISPOSITION = b"\x00\x53\x15"
_ONE_HEAD = struct.Struct(">IBBH3sBBBBBIB")
_ONE_HEAD32 = struct.Struct(">IBBH3sBIIBBIB")
_RANGE_HEAD = struct.Struct(">IBBH3sBBBBBIBI")
_RANGE_HEAD32 = struct.Struct(">IBBH3sBIIBBIBI")


def _uint(body: bytes, i: int) -> tuple[int | None, int]:
    """A ``uint`` (or null) at ``i``: its value and the next position; -1 for another encoding."""
    c = body[i]
    if c == 0x70:
        return (body[i + 1] << 24) | (body[i + 2] << 16) | (body[i + 3] << 8) | body[i + 4], i + 5
    if c == 0x52:
        return body[i + 1], i + 2
    if c == 0x43:
        return 0, i + 1
    if c == 0x40:
        return None, i + 1
    return None, -1


def read_transfer(
    body: bytes,
) -> tuple[int, int | None, bytes | None, int | None, bool | None, bool, bool, int] | None:
    """The fields of a transfer frame's body (``00 53 14`` and a list) when it carries no
    delivery-state: ``(handle, delivery_id, tag, message_format, settled, more, aborted,
    payload_start)``; ``None`` when the generic codec must read it."""
    try:
        c = body[3]
        if c == 0xC0:
            end = 5 + body[4]
            count = body[5]
            i = 6
        elif c == 0xD0:
            end = 8 + ((body[4] << 24) | (body[5] << 16) | (body[6] << 8) | body[7])
            count = (body[8] << 24) | (body[9] << 16) | (body[10] << 8) | body[11]
            i = 12
        else:
            return None
        if count < 1 or count > 11 or end > len(body):
            return None
        # handle (mandatory)
        c = body[i]
        if c == 0x70:
            handle = (body[i + 1] << 24) | (body[i + 2] << 16) | (body[i + 3] << 8) | body[i + 4]
            i += 5
        elif c == 0x52:
            handle = body[i + 1]
            i += 2
        elif c == 0x43:
            handle = 0
            i += 1
        else:
            return None
        delivery_id: int | None = None
        tag: bytes | None = None
        message_format: int | None = None
        if count > 1:
            c = body[i]
            if c == 0x70:
                delivery_id = (body[i + 1] << 24) | (body[i + 2] << 16) | (body[i + 3] << 8) | body[i + 4]
                i += 5
            elif c == 0x52:
                delivery_id = body[i + 1]
                i += 2
            elif c == 0x43:
                delivery_id = 0
                i += 1
            elif c == 0x40:
                i += 1
            else:
                return None
        if count > 2:
            c = body[i]
            if c == 0xA0:
                n = body[i + 1]
                tag = body[i + 2 : i + 2 + n]
                i += 2 + n
            elif c == 0x40:
                i += 1
            else:
                return None
        if count > 3:
            if body[i] == 0x43:  # message-format 0, the usual, as the codec writes it
                message_format = 0
                i += 1
            else:
                message_format, i = _uint(body, i)
                if i < 0:
                    return None
        # settled, more, rcv-settle-mode, state, resume, aborted, batchable: null or a boolean,
        # but rcv-settle-mode (a ubyte) and state (the generic codec reads any but null)
        flags: list[bool | None] = [None, None, None, None, None, None, None]
        for k in range(count - 4):
            c = body[i]
            if c == 0x40:
                i += 1
            elif k == 2 and c == 0x50:
                i += 2
            elif k == 2 or k == 3:
                return None
            elif c == 0x41:
                flags[k] = True
                i += 1
            elif c == 0x42:
                flags[k] = False
                i += 1
            elif c == 0x56 and body[i + 1] < 2:
                flags[k] = body[i + 1] == 1
                i += 2
            else:
                return None
        if i != end:
            return None
        settled = flags[0]
        more = flags[1] is True
        aborted = flags[5] is True
        return handle, delivery_id, tag, message_format, settled, more, aborted, end
    except IndexError:
        return None


def write_transfer(
    out: bytearray,
    channel: int,
    handle: int,
    delivery_id: int,
    tag: bytes,
    message_format: int,
    settled: bool,
    payload: bytes,
    n: int,
    size: int,
) -> None:
    """Append the first (and only) transfer frame of a delivery (``tag`` at most 32 bytes, as the
    spec bounds it; a list8 holds the rest). ``n`` and ``size`` are the tag's and the payload's
    lengths, which the caller has measured already."""
    if message_format == 0:
        tail = _FORMAT_ZERO_SETTLED[settled]
        listsize = 1 + _BEFORE_TAG + n + 2
    else:
        tail = b"\x70" + _U32.pack(message_format) + (b"\x41" if settled else b"\x42")
        listsize = 1 + _BEFORE_TAG + n + 6
    out += _TRANSFER_HEAD.pack(
        8 + 3 + 2 + listsize + size,
        2,
        0,
        channel,
        _DESCRIPTOR,
        0xC0,
        listsize,
        5,
        0x70,
        handle,
        0x70,
        delivery_id,
        0xA0,
        n,
    )
    out += tag
    out += tail
    out += payload


def read_disposition(body: bytes) -> tuple[bool, int, int | None, bool, bool] | None:
    """The fields of a disposition frame's body whose state is none or accepted: ``(role, first,
    last, settled, accepted)``; ``None`` when the generic codec must read it."""
    try:
        c = body[3]
        if c == 0xC0:
            end = 5 + body[4]
            count = body[5]
            i = 6
        elif c == 0xD0:
            end = 8 + ((body[4] << 24) | (body[5] << 16) | (body[6] << 8) | body[7])
            count = (body[8] << 24) | (body[9] << 16) | (body[10] << 8) | body[11]
            i = 12
        else:
            return None
        if count < 2 or count > 6 or end != len(body):
            return None
        c = body[i]
        if c == 0x41:
            role = True
        elif c == 0x42:
            role = False
        else:
            return None
        i += 1
        c = body[i]
        if c == 0x70:
            first = (body[i + 1] << 24) | (body[i + 2] << 16) | (body[i + 3] << 8) | body[i + 4]
            i += 5
        elif c == 0x52:
            first = body[i + 1]
            i += 2
        elif c == 0x43:
            first = 0
            i += 1
        else:
            return None
        last: int | None = None
        settled = accepted = False
        if count > 2:
            if body[i] == 0x40:  # one delivery: the usual
                i += 1
            else:
                last, i = _uint(body, i)
                if i < 0:
                    return None
        if count > 3:
            c = body[i]
            if c == 0x41:
                settled = True
            elif c != 0x42 and c != 0x40:
                return None
            i += 1
        if count > 4:
            if body[i] == 0x40:
                i += 1
            elif body[i : i + 4] == ACCEPTED:
                accepted = True
                i += 4
            else:
                return None
        if count > 5:  # batchable: a hint we need not follow
            c = body[i]
            if c != 0x41 and c != 0x42 and c != 0x40:
                return None
            i += 1
        if i != end:
            return None
        return role, first, last, settled, accepted
    except IndexError:
        return None


def write_disposition(
    out: bytearray, channel: int, role: bool, first: int, last: int, settled: bool, state: object
) -> None:
    """Append a disposition frame for ``first..last`` (``last`` equal to ``first``: one delivery,
    written as a null last). ``state`` is None, :data:`ACCEPTED`, or a delivery-state composite
    to encode."""
    if state is None:
        tail = b""
    elif state is ACCEPTED:
        tail = ACCEPTED
    else:
        tail = encode(state)
    tail = (b"\x41" if settled else b"\x42") + tail if tail else (b"\x41" if settled else b"\x42")
    count = 5 if len(tail) > 1 else 4
    role_byte = 0x41 if role else 0x42
    if last == first:
        size = 7 + len(tail)  # role 1, first 5, null last 1
        if size < 255:
            out += _ONE_HEAD.pack(
                14 + size, 2, 0, channel, _DISPOSITION, 0xC0, size + 1, count, role_byte, 0x70, first, 0x40
            )
        else:
            out += _ONE_HEAD32.pack(
                20 + size, 2, 0, channel, _DISPOSITION, 0xD0, size + 4, count, role_byte, 0x70, first, 0x40
            )
    else:
        size = 11 + len(tail)  # role 1, first 5, last 5
        if size < 255:
            out += _RANGE_HEAD.pack(
                14 + size,
                2,
                0,
                channel,
                _DISPOSITION,
                0xC0,
                size + 1,
                count,
                role_byte,
                0x70,
                first,
                0x70,
                last,
            )
        else:
            out += _RANGE_HEAD32.pack(
                20 + size,
                2,
                0,
                channel,
                _DISPOSITION,
                0xD0,
                size + 4,
                count,
                role_byte,
                0x70,
                first,
                0x70,
                last,
            )
    out += tail
