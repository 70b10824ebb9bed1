"""Link state (part 2, section 2.6): handles, terminus, settle modes, credit, partial deliveries.

A :class:`Link` is seen from the server: ``role`` is *our* role. When the peer attaches as
a receiver we are the ``sender`` (``role is ROLE_SENDER``) and push messages while we have
credit; when the peer attaches as a sender we are the receiver and grant credit.

Flow-control arithmetic follows section 2.6.7: the receiver's credit limit is
``delivery_count + link_credit``; the sender recomputes its credit from every flow as
``flow.delivery_count + flow.link_credit - delivery_count``. Counts are RFC 1982 serial
numbers modulo 2**32.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .performatives import RCV_FIRST, ROLE_RECEIVER, ROLE_SENDER, SND_MIXED, Attach

if TYPE_CHECKING:
    from .session import Session

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

    def consume_credit_as_sender(self) -> None:
        self.delivery_count = serial_add(self.delivery_count, 1)
        self.link_credit -= 1

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

    def consume_credit_as_receiver(self) -> bool:
        """Account one incoming delivery; False when the sender had no credit for it."""
        if self.link_credit <= 0:
            return False
        self.link_credit -= 1
        self.delivery_count = serial_add(self.delivery_count, 1)
        return True

    def new_tag(self) -> bytes:
        tag = self.next_tag.to_bytes(8, "big").lstrip(b"\x00") or b"\x00"
        self.next_tag += 1
        return tag
