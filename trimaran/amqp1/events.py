"""What the AMQP 1.0 machine (:class:`~trimaran.amqp1.connection.ServerConnection`) reports.

Each comes out of ``ServerConnection.next_event()``, one frame's worth at a time, in the order the
frames arrived; events caused by the caller's own calls (a refused login, an error close) join the
same queue.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .performatives import Error, Flow, Open
from .sasl import Credentials
from .session import Link, Session

__all__ = [
    "ConnectionClosed",
    "ConnectionOpened",
    "DispositionReceived",
    "Event",
    "FlowReceived",
    "LinkAttached",
    "LinkDetached",
    "MessageReceived",
    "SaslAuthRequested",
    "SessionBegun",
    "SessionEnded",
    "TransferAborted",
]


class Event:
    __slots__ = ()


@dataclass(frozen=True, slots=True)
class SaslAuthRequested(Event):
    """The client chose a mechanism; answer with ``sasl_complete(ok)``."""

    credentials: Credentials
    hostname: str | None


@dataclass(frozen=True, slots=True)
class ConnectionOpened(Event):
    """The peer's open arrived; ours has been sent in reply."""

    open: Open


@dataclass(frozen=True, slots=True)
class ConnectionClosed(Event):
    """The connection is over: write out ``data_to_send()`` and close the transport."""

    error: Error | None
    by_peer: bool


@dataclass(frozen=True, slots=True)
class SessionBegun(Event):
    session: Session


@dataclass(frozen=True, slots=True)
class SessionEnded(Event):
    """The session is gone (its links are reported detached just before)."""

    session: Session
    error: Error | None
    by_peer: bool


@dataclass(frozen=True, slots=True)
class LinkAttached(Event):
    """The peer attached; answer with ``accept_link(link, ...)`` or ``reject_link(link, error)``."""

    link: Link


@dataclass(frozen=True, slots=True)
class LinkDetached(Event):
    link: Link
    closed: bool
    error: Error | None
    by_peer: bool


@dataclass(frozen=True, slots=True)
class FlowReceived(Event):
    """Link flow state from the peer. For our sender links ``link.credit`` is what we may send;
    with ``drain`` set, send what is available and then call ``complete_drain(link)``."""

    link: Link
    credit: int
    drain: bool
    available: int | None
    flow: Flow


# Not frozen, unlike the others: its __init__ is written out, as it is built per message (mypyc
# compiles it, the generated one runs interpreted), and a frozen class refuses the assignments.
@dataclass(slots=True, init=False)
class MessageReceived(Event):
    """A whole delivery on one of our receiver links (frames already reassembled)."""

    link: Link
    delivery_id: int
    tag: bytes
    settled: bool
    payload: bytes
    message_format: int
    state: Any = None  # the transfer's state: a TransactionalState for a transactional transfer

    def __init__(
        self,
        link: Link,
        delivery_id: int,
        tag: bytes,
        settled: bool,
        payload: bytes,
        message_format: int,
        state: Any = None,
    ) -> None:
        self.link = link
        self.delivery_id = delivery_id
        self.tag = tag
        self.settled = settled
        self.payload = payload
        self.message_format = message_format
        self.state = state


@dataclass(frozen=True, slots=True)
class TransferAborted(Event):
    link: Link
    delivery_id: int
    tag: bytes


@dataclass(frozen=True, slots=True)
class DispositionReceived(Event):
    """``role`` is the peer's role: ROLE_RECEIVER means it concerns deliveries we sent.
    ``deliveries`` lists the (link, delivery_id, tag) we still knew as unsettled in first..last."""

    session: Session
    role: bool
    first: int
    last: int
    settled: bool
    state: Any
    deliveries: list[tuple[Link, int, bytes]]
