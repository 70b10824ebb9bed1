"""Session arithmetic: delivery-id ranges in serial-number space."""

from __future__ import annotations

import pytest

from trimaran.amqp1.performatives import Begin
from trimaran.amqp1.session import SERIAL_MASK, Session


def _session() -> Session:
    return Session(
        channel=0,
        remote_channel=0,
        remote_begin=Begin(next_outgoing_id=0, incoming_window=10, outgoing_window=10),
        incoming_window_size=10,
        handle_max=7,
    )


@pytest.mark.parametrize(
    ("ids", "first", "last", "expected"),
    [
        ([1, 2, 3, 9], 2, 3, [2, 3]),
        ([1, 2, 3, 9], 0, 1000, [1, 2, 3, 9]),  # wider than the table: the table is walked
        ([SERIAL_MASK - 1, SERIAL_MASK, 0, 1, 5], SERIAL_MASK - 1, 1, [SERIAL_MASK - 1, SERIAL_MASK, 0, 1]),
        ([SERIAL_MASK, 0, 1], SERIAL_MASK, SERIAL_MASK, [SERIAL_MASK]),
        ([1, 2], 5, 1, []),  # last before first
        ([], 0, 0, []),
    ],
)
def test_ids_in_range(ids: list[int], first: int, last: int, expected: list[int]) -> None:
    table = dict.fromkeys(ids)
    assert sorted(_session().ids_in_range(table, first, last)) == sorted(expected)
