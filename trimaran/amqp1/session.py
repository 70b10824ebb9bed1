"""Sessions and their links, which refer to each other (one module: no import circle).

Session state (part 2, section 2.5): channels, transfer windows, delivery ids, handles.

Transfer ids count transfer *frames*; delivery ids count deliveries. The peer may send us
``incoming_window`` frames past ``next_incoming_id``; we may send it
``remote_incoming_window`` frames. Frames that do not fit the peer's window wait in
``pending`` until its next flow opens the window again.

Link state (part 2, section 2.6): handles, terminus, settle modes, credit, partial deliveries.

A :class:`Link` is seen from the server: ``role`` is *our* role. When the peer attaches as
a receiver we are the ``sender`` (``role is ROLE_SENDER``) and push messages while we have
credit; when the peer attaches as a sender we are the receiver and grant credit.

Flow-control arithmetic follows section 2.6.7: the receiver's credit limit is
``delivery_count + link_credit``; the sender recomputes its credit from every flow as
``flow.delivery_count + flow.link_credit - delivery_count``. Counts are RFC 1982 serial
numbers modulo 2**32. The per-message steps (a transfer in or out takes one frame of the
session window and one delivery of the link credit) are done inline in
:mod:`.connection`'s transfer paths, not by a call here per message.
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from .performatives import RCV_FIRST, ROLE_RECEIVER, ROLE_SENDER, SND_MIXED, Attach, Begin, Transfer

SERIAL_MASK = 0xFFFF_FFFF


def serial_add(a: int, b: int) -> int:
    return (a + b) & SERIAL_MASK


def serial_diff(a: int, b: int) -> int:
    """``a - b`` as a signed distance in serial number space."""
    d = (a - b) & SERIAL_MASK
    return d - (1 << 32) if d & 0x8000_0000 else d


class LinkState(enum.Enum):
    ATTACH_RECEIVED = "attach-received"  # peer attached; waiting for accept_link / reject_link
    ATTACHED = "attached"
    DETACH_SENT = "detach-sent"  # we detached; waiting for the peer's detach
    DETACHED = "detached"


@dataclass(slots=True)
class PartialDelivery:
    """An incoming delivery whose transfer frames have not all arrived."""

    delivery_id: int
    tag: bytes
    settled: bool
    message_format: int
    chunks: list[Any] = field(default_factory=list)
    size: int = 0
    state: Any = None  # the transfer's delivery state (a transactional-state names the transaction)


@dataclass(eq=False, slots=True)
class Link:
    session: Session
    name: str
    role: bool  # our role: ROLE_SENDER (False) or ROLE_RECEIVER (True)
    remote_handle: int
    remote_attach: Attach
    handle: int = -1  # our handle, allocated on accept
    state: LinkState = LinkState.ATTACH_RECEIVED
    source: Any = None
    target: Any = None
    snd_settle_mode: int = SND_MIXED
    rcv_settle_mode: int = RCV_FIRST
    # The largest message we accept (receiver) / the peer accepts (sender); None = no limit.
    max_message_size: int | None = None
    initial_delivery_count: int = 0
    delivery_count: int = 0
    link_credit: int = 0
    available: int = 0
    drain: bool = False
    partial: PartialDelivery | None = None
    next_tag: int = 0

    @property
    def is_sender(self) -> bool:
        return self.role is ROLE_SENDER

    @property
    def is_receiver(self) -> bool:
        return self.role is ROLE_RECEIVER

    @property
    def is_open(self) -> bool:
        return self.state is LinkState.ATTACHED

    @property
    def credit(self) -> int:
        """Deliveries we may send (sender) or that the peer may still send us (receiver)."""
        return self.link_credit

    @property
    def address(self) -> Any:
        """The peer's address of interest: the source we send from, or the target we receive to."""
        terminus = self.remote_attach.source if self.is_sender else self.remote_attach.target
        return getattr(terminus, "address", None)

    @property
    def channel(self) -> int:
        return self.session.channel

    # ---- sender side -------------------------------------------------------------------

    def on_peer_flow_as_sender(
        self, delivery_count: int | None, link_credit: int | None, drain: bool
    ) -> None:
        if link_credit is None:
            return
        if delivery_count is None:
            # The receiver has not seen our attach yet: it counts from our initial count.
            delivery_count = self.initial_delivery_count
        credit = serial_diff(serial_add(delivery_count, link_credit), self.delivery_count)
        self.link_credit = max(credit, 0)
        self.drain = drain

    def drain_credit(self) -> None:
        """Use up all credit without sending (the sender's answer to drain)."""
        self.delivery_count = serial_add(self.delivery_count, self.link_credit)
        self.link_credit = 0

    # ---- receiver side -----------------------------------------------------------------

    def on_peer_flow_as_receiver(self, delivery_count: int | None, available: int | None) -> None:
        if delivery_count is not None:
            limit = serial_add(self.delivery_count, self.link_credit)
            self.delivery_count = delivery_count
            self.link_credit = max(serial_diff(limit, delivery_count), 0)
        if available is not None:
            self.available = available


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

    def take_outgoing_frame(self) -> None:
        self.next_outgoing_id = serial_add(self.next_outgoing_id, 1)
        self.remote_incoming_window -= 1

    def ids_in_range(self, table: dict[int, Any], first: int, last: int) -> list[int]:
        """Keys of ``table`` within the serial range first..last inclusive."""
        span = serial_diff(last, first)
        if span < 0:
            return []
        if span < len(table):
            end = first + span + 1
            if end <= SERIAL_MASK + 1:
                return [i for i in range(first, end) if i in table]
            return [i & SERIAL_MASK for i in range(first, end) if i & SERIAL_MASK in table]
        return [i for i in table if 0 <= serial_diff(i, first) <= span]
