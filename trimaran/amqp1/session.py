"""Session state (part 2, section 2.5): channels, transfer windows, delivery ids, handles.

Transfer ids count transfer *frames*; delivery ids count deliveries. The peer may send us
``incoming_window`` frames past ``next_incoming_id``; we may send it
``remote_incoming_window`` frames. Frames that do not fit the peer's window wait in
``pending`` until its next flow opens the window again.
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from .link import Link, serial_add, serial_diff
from .performatives import Begin, Transfer


class SessionState(enum.Enum):
    MAPPED = "mapped"
    END_SENT = "end-sent"  # we ended; waiting for the peer's end
    UNMAPPED = "unmapped"


@dataclass(eq=False, slots=True)
class Session:
    channel: int  # ours (outgoing frames)
    remote_channel: int  # the peer's (incoming frames)
    remote_begin: Begin
    incoming_window_size: int
    handle_max: int
    state: SessionState = SessionState.MAPPED
    # Outgoing side.
    next_outgoing_id: int = 0
    outgoing_window: int = 0x7FFF_FFFF
    remote_incoming_window: int = 0
    next_delivery_id: int = 0
    # Incoming side.
    next_incoming_id: int = 0
    incoming_window: int = 0
    remote_outgoing_window: int = 0
    # Links by the peer's handle (incoming frames) and by ours.
    links_by_remote_handle: dict[int, Link] = field(default_factory=dict)
    links_by_handle: dict[int, Link] = field(default_factory=dict)
    # Unsettled deliveries: ours (we sent them) and the peer's (we received them).
    unsettled_out: dict[int, tuple[Link, bytes]] = field(default_factory=dict)
    unsettled_in: dict[int, tuple[Link, bytes]] = field(default_factory=dict)
    pending: deque[tuple[Transfer, Any]] = field(default_factory=deque)

    @property
    def is_open(self) -> bool:
        return self.state is SessionState.MAPPED

    @property
    def links(self) -> list[Link]:
        return list(self.links_by_remote_handle.values())

    def allocate_handle(self) -> int:
        h = 0
        while h in self.links_by_handle:
            h += 1
        return h

    # ---- windows -----------------------------------------------------------------------

    def on_peer_window(
        self, next_incoming_id: int | None, incoming_window: int, outgoing_window: int
    ) -> None:
        if next_incoming_id is None:
            next_incoming_id = 0  # the peer has not seen our begin: our initial next-outgoing-id
        self.remote_incoming_window = max(
            serial_diff(serial_add(next_incoming_id, incoming_window), self.next_outgoing_id), 0
        )
        self.remote_outgoing_window = outgoing_window

    def take_incoming_frame(self) -> bool:
        """Account one incoming transfer frame; False when it violates our window."""
        if self.incoming_window <= 0:
            return False
        self.incoming_window -= 1
        self.next_incoming_id = serial_add(self.next_incoming_id, 1)
        self.remote_outgoing_window = max(self.remote_outgoing_window - 1, 0)
        return True

    def incoming_window_low(self) -> bool:
        return self.incoming_window <= self.incoming_window_size // 2

    def take_outgoing_frame(self) -> None:
        self.next_outgoing_id = serial_add(self.next_outgoing_id, 1)
        self.remote_incoming_window -= 1

    def new_delivery_id(self) -> int:
        d = self.next_delivery_id
        self.next_delivery_id = serial_add(d, 1)
        return d

    def ids_in_range(self, table: dict[int, Any], first: int, last: int) -> list[int]:
        """Keys of ``table`` within the serial range first..last inclusive."""
        span = serial_diff(last, first)
        if span < 0:
            return []
        if span < len(table):
            return [i for i in (serial_add(first, k) for k in range(span + 1)) if i in table]
        return [i for i in table if 0 <= serial_diff(i, first) <= span]
