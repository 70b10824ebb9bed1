"""The transfer and disposition fast paths read and write what the generic codec does."""

from __future__ import annotations

import pytest

from trimaran.amqp1.codec import encode
from trimaran.amqp1.frames import FrameDecoder, encode_frame
from trimaran.amqp1.performatives import (
    Accepted,
    Declared,
    Disposition,
    Error,
    Modified,
    Rejected,
    Released,
    TransactionalState,
    Transfer,
)
from trimaran.amqp1.transfers import (
    ACCEPTED,
    read_disposition,
    read_transfer,
    write_disposition,
    write_transfer,
)
from trimaran.amqp1.types import Symbol


def _frame_body(perf: object, payload: bytes = b"") -> bytes:
    decoder = FrameDecoder()
    decoder.feed(encode_frame(0, 0, perf, payload))  # type: ignore[arg-type]
    frame = decoder.next_frame()
    return frame.body  # type: ignore[union-attr]


TRANSFERS = [
    Transfer(handle=0, delivery_id=0, delivery_tag=b"", message_format=0),
    Transfer(handle=3, delivery_id=255, delivery_tag=b"t" * 32, message_format=0, settled=True),
    Transfer(handle=70000, delivery_id=0xFFFF_FFFF, delivery_tag=b"\x00", settled=False, more=True),
    Transfer(handle=1, more=True),
    Transfer(handle=1),
    Transfer(handle=1, delivery_id=9, delivery_tag=b"x", aborted=True),
    Transfer(
        handle=1,
        delivery_id=2,
        delivery_tag=b"x",
        message_format=0x1234_5678,
        settled=True,
        rcv_settle_mode=1,
        resume=True,
        batchable=True,
    ),
]


@pytest.mark.parametrize("transfer", TRANSFERS, ids=range(len(TRANSFERS)))
def test_read_transfer_agrees_with_the_codec(transfer: Transfer) -> None:
    body = _frame_body(transfer, b"payload")
    fields = read_transfer(body)
    assert fields is not None
    handle, delivery_id, tag, message_format, settled, more, aborted, start = fields
    assert (handle, delivery_id, tag, message_format, settled, more, aborted) == (
        transfer.handle,
        transfer.delivery_id,
        transfer.delivery_tag,
        transfer.message_format,
        transfer.settled,
        transfer.more,
        transfer.aborted,
    )
    assert body[start:] == b"payload"


def test_read_transfer_leaves_a_state_and_odd_encodings_to_the_codec() -> None:
    state = TransactionalState(txn_id=b"tx1", outcome=Accepted())
    assert (
        read_transfer(_frame_body(Transfer(handle=0, delivery_id=1, delivery_tag=b"a", state=state))) is None
    )
    body = _frame_body(Transfer(handle=0, delivery_id=1, delivery_tag=b"a"), b"p")
    assert read_transfer(body[:8]) is None  # truncated
    assert read_transfer(body[:3] + b"\x45") is None  # list0: no handle
    # A list whose size does not match its fields.
    assert read_transfer(body[:4] + bytes([body[4] + 1]) + body[5:]) is None


@pytest.mark.parametrize("settled", [False, True])
@pytest.mark.parametrize("message_format", [0, 0x80013700])
def test_write_transfer_decodes_with_the_codec(settled: bool, message_format: int) -> None:
    out = bytearray()
    write_transfer(out, 5, 2, 0xFFFF_FFFE, b"tag-1", message_format, settled, b"the message", 5, 11)
    decoder = FrameDecoder()
    decoder.feed(out)
    frame = decoder.next_frame()
    assert decoder.buffered == 0
    perf, payload = frame.performative()  # type: ignore[union-attr]
    assert frame.channel == 5  # type: ignore[union-attr]
    assert perf == Transfer(
        handle=2,
        delivery_id=0xFFFF_FFFE,
        delivery_tag=b"tag-1",
        message_format=message_format,
        settled=settled,
    )
    assert bytes(payload) == b"the message"


DISPOSITIONS = [
    (True, 0, 0, True, ACCEPTED, Accepted()),
    (False, 7, 90, False, None, None),
    (True, 3, 3, False, Released(), Released()),
    (True, 1, 2, True, Modified(delivery_failed=True), Modified(delivery_failed=True)),
    (
        True,
        4,
        4,
        True,
        Rejected(error=Error(condition=Symbol("amqp:x"), description="y" * 300)),
        Rejected(error=Error(condition=Symbol("amqp:x"), description="y" * 300)),
    ),
]


@pytest.mark.parametrize(("role", "first", "last", "settled", "state", "decoded"), DISPOSITIONS)
def test_write_disposition_decodes_with_the_codec(
    role: bool, first: int, last: int, settled: bool, state: object, decoded: object
) -> None:
    out = bytearray()
    write_disposition(out, 1, role, first, last, settled, state)
    decoder = FrameDecoder()
    decoder.feed(out)
    frame = decoder.next_frame()
    assert decoder.buffered == 0
    perf, _ = frame.performative()  # type: ignore[union-attr]
    assert perf == Disposition(
        role=role, first=first, last=None if last == first else last, settled=settled, state=decoded
    )
    fields = read_disposition(frame.body)  # type: ignore[union-attr]
    if state is None or state is ACCEPTED:
        assert fields == (role, first, None if last == first else last, settled, state is ACCEPTED)
    else:
        assert fields is None  # another outcome: the codec reads it


def test_read_disposition_of_the_codecs_encodings() -> None:
    d = Disposition(role=True, first=1, last=300, settled=True, state=Accepted(), batchable=True)
    assert read_disposition(_frame_body(d)) == (True, 1, 300, True, True)
    assert read_disposition(_frame_body(Disposition(role=False, first=0))) == (False, 0, None, False, False)
    declared = Disposition(role=False, first=0, state=Declared(txn_id=b"1"))
    assert read_disposition(_frame_body(declared)) is None
    assert encode(Accepted()) == ACCEPTED
