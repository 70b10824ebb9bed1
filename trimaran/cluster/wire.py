"""What nodes say to each other over NOTIFY (sans-IO): forwarded publishes, packed into payloads.

A forward record is ``u32 header length | header JSON | u32 payload length | payload``; the header
holds the topic, QoS, retain flag, the message's properties (as every table stores them) and the
share groups the receiving node serves for it. A batch is records back to back. NOTIFY takes text
under 8,000 bytes, so a notice carries base64 of a batch that fits, and a record too large for one
notice travels in a table row the notice names, read and deleted by its node.

Every notice's text is ``<kind><sequence>:<body>``. PostgreSQL folds identical notifications of one
transaction into one, so the sender's sequence number keeps two equal batches (the same message
published twice) two notices; the receiver also learns from a gap that it missed some.
"""

from __future__ import annotations

import base64
import json
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Final

from trimaran.broker.message import Message
from trimaran.storage.serialize import message_from, properties_json

NOTIFY_LIMIT: Final = 7900  # PostgreSQL's limit is 8,000 bytes
BODY_LIMIT: Final = NOTIFY_LIMIT - 24  # room for the kind and the sequence number
FORWARD: Final = "b"  # body: base64 of a batch of records
SPILLED: Final = "s"  # body: the id of the cluster_spill row holding the batch
ROUTES: Final = "r"  # body: node name, then a line per route, "+filter" or "-filter"
RETAINED: Final = "R"  # body: a line per topic whose retained message changed
TAKE: Final = "t"  # body: client id whose session the sending node takes over, tab, its name
HANDED: Final = "h"  # body: client id whose session was handed over (the reply to TAKE)
LEFT: Final = "D"  # body: a node that left or was found dead

_LEN = struct.Struct(">I")
_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)


def encode_forward(message: Message, shares: list[tuple[str, str]] | None = None) -> bytes:
    header: dict[str, object] = {
        "t": message.topic,
        "q": message.qos,
        "p": properties_json(message),
    }
    if message.retain:
        header["r"] = 1
    if shares:
        header["s"] = shares
    head = _ENCODER.encode(header).encode()
    payload = message.payload
    return b"".join((_LEN.pack(len(head)), head, _LEN.pack(len(payload)), payload))


def decode_batch(batch: bytes) -> Iterator[tuple[Message, frozenset[tuple[str, str]]]]:
    """The messages of a batch, in order, each with the share groups it is for here.

    Raises ``ValueError`` for a damaged batch (after yielding the records before the damage)."""
    view = memoryview(batch)
    at = 0
    end = len(view)
    while at < end:
        if at + 4 > end:
            raise ValueError("forward batch cut inside a record header")
        (head_len,) = _LEN.unpack_from(view, at)
        at += 4
        head = json.loads(bytes(view[at : at + head_len]))
        at += head_len
        if at + 4 > end:
            raise ValueError("forward batch cut inside a record")
        (payload_len,) = _LEN.unpack_from(view, at)
        at += 4
        if at + payload_len > end:
            raise ValueError("forward batch cut inside a payload")
        payload = bytes(view[at : at + payload_len])
        at += payload_len
        message = message_from(head["t"], payload, int(head["q"]), bool(head.get("r")), head["p"])
        shares = frozenset((str(g), str(f)) for g, f in head.get("s", ()))
        yield message, shares


@dataclass(frozen=True, slots=True)
class Notice:
    """One forward NOTIFY to a node: ``body`` (base64 of a batch), or ``spill`` bytes to store
    first in a row the notice then names."""

    body: str | None = None
    spill: bytes | None = None


def notice_text(kind: str, sequence: int, body: str) -> str:
    return f"{kind}{sequence:x}:{body}"


def parse_notice(text: str) -> tuple[str, int, str]:
    """(kind, sequence, body); raises ``ValueError`` for a text no node sent."""
    head, sep, body = text.partition(":")
    if not sep or not head:
        raise ValueError(f"not a cluster notice: {text[:40]!r}")
    return head[0], int(head[1:], 16), body


def _b64_len(n: int) -> int:
    return 4 * ((n + 2) // 3)


def pack(records: list[bytes], limit: int = BODY_LIMIT) -> list[Notice]:
    """Pack encoded records, in order, into as few notices as fit ``limit`` characters each.

    Consecutive records that fit together share one inline notice; a record whose base64 alone
    passes the limit goes into a spill row of its own (order is kept: notices are read in order)."""
    notices: list[Notice] = []
    group: list[bytes] = []
    size = 0
    room = limit
    for record in records:
        if _b64_len(len(record)) > room:
            if group:
                notices.append(_inline(group))
                group, size = [], 0
            notices.append(Notice(spill=record))
            continue
        if group and _b64_len(size + len(record)) > room:
            notices.append(_inline(group))
            group, size = [], 0
        group.append(record)
        size += len(record)
    if group:
        notices.append(_inline(group))
    return notices


def _inline(group: list[bytes]) -> Notice:
    return Notice(body=base64.b64encode(b"".join(group)).decode("ascii"))


def unpack_inline(body: str) -> bytes:
    """The batch an inline notice carries."""
    return base64.b64decode(body)


def pack_lines(prefix: str, lines: list[str], limit: int = BODY_LIMIT) -> list[str]:
    """Control bodies (routes, retained topics): ``prefix`` then newline-separated lines, as many
    per body as fit. A line is never split; one longer than the limit is left out (a filter or topic
    that long cannot travel in a NOTIFY; the reload from the tables after a reconnect covers it)."""
    out: list[str] = []
    current: list[str] = []
    size = len(prefix)
    for line in lines:
        cost = len(line.encode()) + 1
        if len(prefix) + cost > limit:
            continue
        if current and size + cost > limit:
            out.append(prefix + "\n".join(current))
            current, size = [], len(prefix)
        current.append(line)
        size += cost
    if current:
        out.append(prefix + "\n".join(current))
    return out
