"""Sans-IO AMQP 1.0 server connection (part 2 "transport", part 5 "security").

Bytes in, events out, bytes to send out; no sockets, no clocks, no threads::

    conn = ServerConnection("trimaran", sasl_mechanisms=("PLAIN", "ANONYMOUS"), now=now)
    conn.receive_data(chunk, now)
    while (event := conn.next_event()) is not None:
        ...react: conn.sasl_complete(ok), conn.accept_link(link), conn.send(link, payload) ...
    sock.sendall(conn.data_to_send())
    ...at conn.next_deadline(): conn.tick(now), then take the events again

``next_event()`` parses the next frame only once the events of the previous one have been taken,
so the caller acts on a transfer before a detach, end or close read behind it changes the state:
however the bytes were cut, the same events come out in the same order. Events the caller's own
calls cause (``sasl_complete(False)``, an error close) come out of ``next_event()`` too.

Deadlines: the handshake (protocol header, SASL and open) must be done within
``handshake_timeout`` seconds of the connection's start, the peer may stay silent at most
``idle_timeout`` once open, and after our close the peer has ``close_timeout`` to answer.

The frames that carry messages, ``transfer`` and ``disposition``, are read and written by
:mod:`.transfers` in their usual encodings, without the generic codec; any other encoding, and
every other frame, by :mod:`.performatives`. The session window and link credit of a message are
counted inline in the transfer paths.

Peer errors never raise: a protocol violation sends close / end / detach with the standard
error condition and surfaces as a ``ConnectionClosed`` / ``SessionEnded`` / ``LinkDetached``
event with ``by_peer=False``. Misuse of the API by the caller (sending on a link without
credit, settling on a detached link ...) raises :class:`AMQPStateError`.

Who answers what: the connection answers the peer's open, begin, end, detach and close
itself; a peer's attach waits for the caller's ``accept_link`` or ``reject_link`` and a
sasl-init waits for ``sasl_complete``. Events for things the caller ended itself are not
repeated when the peer confirms.

A handler's reactions, in short:

* ``SaslAuthRequested``: check ``credentials`` (username None = ANONYMOUS), then
  ``conn.sasl_complete(ok)`` (input the client pipelined is parsed by the next ``next_event()``).
* ``LinkAttached``: ``link.role`` is ours. ``link.is_sender`` (the peer receives): route by
  ``link.address`` / ``link.remote_attach.source`` (filters, capabilities, dynamic) and
  ``accept_link(link)``; messages go out with ``conn.send(link, encode_message(msg))`` while
  ``link.credit > 0``. ``link.is_receiver`` (the peer sends): ``accept_link(link,
  initial_credit=n)`` and top up with ``grant_credit(link, n)``. Refuse with
  ``reject_link(link, Error(condition=NOT_FOUND))``.
* ``FlowReceived`` on a sender link: more credit; with ``drain`` send what is there, then
  ``complete_drain(link)``.
* ``MessageReceived``: ``decode_message(ev.payload)``; unless ``ev.settled``, answer with
  ``settle(link, ev.delivery_id, Accepted())`` (or Rejected / Released / Modified). With
  rcv-settle-mode second, send ``settled=False`` first and settle on the sender's disposition.
* ``DispositionReceived`` with ``role`` ROLE_RECEIVER: the outcome of deliveries we sent,
  listed in ``deliveries``; if not ``settled`` (the peer is in rcv-settle-mode second), settle.
* ``LinkDetached`` / ``SessionEnded`` / ``ConnectionClosed``: forget the link / session /
  connection; after ``ConnectionClosed`` (or once ``closed``) flush and close the socket.
"""

from __future__ import annotations

import enum
import logging
from collections import deque
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from trimaran import __version__
from trimaran.runtime.machine import Machine

from .errors import AMQPStateError
from .events import (
    ConnectionClosed,
    ConnectionOpened,
    DispositionReceived,
    Event,
    FlowReceived,
    LinkAttached,
    LinkDetached,
    MessageReceived,
    SaslAuthRequested,
    SessionBegun,
    SessionEnded,
    TransferAborted,
)
from .frames import (
    AMQP_HEADER,
    EMPTY_FRAME,
    FRAME_AMQP,
    FRAME_SASL,
    MIN_MAX_FRAME_SIZE,
    NEED_DATA,
    SASL_HEADER,
    Frame,
    FrameDecoder,
    FramingError,
    _NeedData,
    encode_frame,
    performative_size,
)
from .performatives import (
    FRAMING_ERROR,
    HANDLE_IN_USE,
    ILLEGAL_STATE,
    INTERNAL_ERROR,
    INVALID_FIELD,
    MESSAGE_SIZE_EXCEEDED,
    NOT_ALLOWED,
    RESOURCE_LIMIT_EXCEEDED,
    ROLE_RECEIVER,
    ROLE_SENDER,
    SND_SETTLED,
    SND_UNSETTLED,
    TRANSFER_LIMIT_EXCEEDED,
    UNATTACHED_HANDLE,
    UNAUTHORIZED_ACCESS,
    WINDOW_VIOLATION,
    Accepted,
    Attach,
    Begin,
    Close,
    Composite,
    Detach,
    Disposition,
    End,
    Error,
    Flow,
    Open,
    SaslInit,
    SaslMechanisms,
    SaslOutcome,
    Transfer,
)
from .sasl import Credentials, SaslCode, SaslParseError, parse_initial_response
from .session import SERIAL_MASK, Link, LinkState, PartialDelivery, Session, SessionState
from .transfers import ACCEPTED, read_disposition, read_transfer, write_disposition, write_transfer
from .types import DecodeError, Symbol

# The open's properties when the caller gives none: who the peer is talking to (as AMQP 0.9.1's
# server-properties say). Shared by every connection; nothing writes to it.
SERVER_PROPERTIES: dict[Any, Any] = {Symbol("product"): "Trimaran", Symbol("version"): __version__}

__all__ = ["AMQPStateError", "ConnState", "ServerConnection"]

log = logging.getLogger(__name__)
# Bytes a first Transfer (handle, delivery-id, tag, message-format, settled) takes beyond its tag.
TRANSFER_OVERHEAD_MAX = 38


# --------------------------------------------------------------------------------------
# The connection
# --------------------------------------------------------------------------------------


# Descriptor codes of detach, end and close (as ``0x00 0x53 code`` at the start of a frame body).
_ENDING_CODES = frozenset((0x16, 0x17, 0x18))
# How a transfer's and a disposition's body begin in the usual encoding (read by .transfers).
_TRANSFER_HEAD = b"\x00\x53\x14"
_DISPOSITION_HEAD = b"\x00\x53\x15"
# Accepted has no fields: every accepted disposition read can share one.
_ACCEPTED = Accepted()


def _ends_something(frame: Frame) -> bool:
    """Whether an AMQP frame carries a detach, end or close (cheaply, for the common encoding)."""
    body = frame.body
    if frame.type != FRAME_AMQP or len(body) < 3:
        return False
    if body[0] == 0x00 and body[1] == 0x53:
        return body[2] in _ENDING_CODES
    try:  # a descriptor spelled another way: decode to know
        perf, _ = frame.performative()
    except Exception:
        return False  # the frame's own processing reports the error
    return isinstance(perf, (Detach, End, Close))


class ConnState(enum.Enum):
    AWAIT_HEADER = "await-header"
    SASL_AWAIT_INIT = "sasl-await-init"
    SASL_AUTHENTICATING = "sasl-authenticating"
    AWAIT_OPEN = "await-open"
    OPENED = "opened"
    CLOSE_SENT = "close-sent"
    CLOSED = "closed"


_ECHO: Any = object()


class ServerConnection(Machine):
    """Server side of one AMQP 1.0 connection."""

    def __init__(
        self,
        container_id: str,
        *,
        now: float,  # (first: mypyc cannot write a signature with it after the defaults)
        sasl_mechanisms: Sequence[str] = ("PLAIN", "ANONYMOUS"),
        require_sasl: bool = True,
        max_frame_size: int = 65536,
        channel_max: int = 255,
        handle_max: int = 1023,
        idle_timeout: float | None = 60.0,
        incoming_window: int = 2048,
        max_message_size: int | None = None,
        properties: dict[Any, Any] | None = None,
        offered_capabilities: Sequence[str] | None = None,
        handshake_timeout: float | None = 10.0,
        close_timeout: float = 5.0,
    ) -> None:
        """``idle_timeout`` (seconds) is how long the peer may stay silent after open; we
        advertise half of it as our idle-time-out, as the spec recommends. ``max_message_size``
        is offered on our receiver links and enforced. ``handshake_timeout`` bounds the time
        from ``now`` (the caller's clock at the connection's start) to the peer's open, SASL
        included; ``close_timeout`` how long we wait for the peer's close after ours."""
        if max_frame_size < MIN_MAX_FRAME_SIZE:
            raise ValueError("max_frame_size must be at least 512")
        self.container_id = container_id
        self.sasl_mechanisms = tuple(sasl_mechanisms)
        self.require_sasl = require_sasl and bool(self.sasl_mechanisms)
        self.max_frame_size = max_frame_size
        self.channel_max = channel_max
        self.handle_max = handle_max
        self.idle_timeout = idle_timeout
        self.incoming_window = incoming_window
        self.max_message_size = max_message_size
        self.properties = SERVER_PROPERTIES if properties is None else properties
        self.offered_capabilities = list(offered_capabilities) if offered_capabilities else None
        self.handshake_timeout = handshake_timeout
        self.close_timeout = close_timeout

        self.state = ConnState.AWAIT_HEADER
        self.remote_open: Open | None = None
        self.remote_max_frame_size = MIN_MAX_FRAME_SIZE
        self.remote_channel_max = 0
        self.remote_idle_timeout: float | None = None  # seconds
        self.credentials: Credentials | None = None
        self.sessions: dict[int, Session] = {}  # by the peer's channel
        self._by_local_channel: dict[int, Session] = {}
        self._decoder = FrameDecoder(max_frame_size)
        self._out = bytearray()
        self._events: deque[Event] = deque()
        self._sasl_done = False
        self._window_due: set[Session] = set()
        self._now = now
        self._started = now
        self._last_recv = now
        self._last_sent = now
        self._close_sent = now
        # While set (by the caller), a detach, end or close from the peer is read but not acted
        # on: the caller has work that must reach the peer first (dispositions of publishes
        # waiting for their commit). Clearing it and taking the events again goes on from there.
        self.hold_closing = False
        self._held: Frame | None = None

    # ---- public I/O --------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        """Nothing more will happen: write out ``data_to_send()`` and close the transport (after the
        close performatives the server half-closes and lingers: peer_close_s stays 0)."""
        return self.state is ConnState.CLOSED

    def receive_data(self, data: bytes | bytearray | memoryview, now: float) -> None:
        """Buffer bytes from the transport; ``next_event()`` parses them."""
        self._now = now
        if self.state is ConnState.CLOSED or not data:
            return
        self._last_recv = now
        self._decoder.feed(data)

    def receive_eof(self) -> None:
        """The peer closed its side: nothing more will come, the connection is over."""
        if self.state is ConnState.CLOSED:
            return
        if self.state is not ConnState.CLOSE_SENT:
            self._events.append(ConnectionClosed(None, True))  # without a close frame
        self.state = ConnState.CLOSED
        self._teardown_if_closing()

    def next_event(self) -> Event | None:
        """The next event, parsing one more frame (or header) only when none is waiting; None
        when no whole frame is buffered or a SASL outcome is awaited."""
        events = self._events
        while not events:
            if not self._step():
                self._reopen_windows()
                return None
        return events.popleft()

    def data_to_send(self) -> bytes:
        """Everything queued for the transport since the last call (may be empty)."""
        if not self._out:
            return b""
        self._last_sent = self._now
        out = bytes(self._out)
        self._out.clear()
        return out

    def paused(self, now: float) -> None:
        """The runtime did not read the peer until ``now`` (``Machine.paused``): our idle time-out
        on it starts again."""
        if now > self._last_recv:
            self._last_recv = now

    def tick(self, now: float) -> None:
        """Deadlines: the handshake, the peer's close after ours, idle time-out and heartbeats."""
        self._now = now
        state = self.state
        if state is ConnState.CLOSED:
            return
        if state is ConnState.CLOSE_SENT:
            if now >= self._close_sent + self.close_timeout:
                self.state = ConnState.CLOSED  # the peer never answered our close
            return
        if state is not ConnState.OPENED:
            if self.handshake_timeout is not None and now >= self._started + self.handshake_timeout:
                self._fail(RESOURCE_LIMIT_EXCEEDED, f"handshake not done within {self.handshake_timeout:g}s")
                self.state = ConnState.CLOSED  # nobody we could wait for: no close is coming
            return
        if self.idle_timeout and now - self._last_recv >= self.idle_timeout:
            self._fail(RESOURCE_LIMIT_EXCEEDED, f"idle time-out: no frames for {self.idle_timeout:g}s")
        elif self.remote_idle_timeout and now - self._last_sent >= self.remote_idle_timeout / 2:
            if not self._out:
                self._out += EMPTY_FRAME
            self._last_sent = now
        self._teardown_if_closing()

    def next_deadline(self) -> float | None:
        """When ``tick`` must next be called (caller's clock), or None."""
        state = self.state
        if state is ConnState.CLOSED:
            return None
        if state is ConnState.CLOSE_SENT:
            return self._close_sent + self.close_timeout
        if state is not ConnState.OPENED:
            return None if self.handshake_timeout is None else self._started + self.handshake_timeout
        deadlines = []
        if self.idle_timeout:
            deadlines.append(self._last_recv + self.idle_timeout)
        if self.remote_idle_timeout:
            deadlines.append(self._last_sent + self.remote_idle_timeout / 2)
        return min(deadlines) if deadlines else None

    # ---- SASL --------------------------------------------------------------------------

    def sasl_complete(self, ok: bool, code: int | None = None) -> None:
        """Answer a ``SaslAuthRequested``. On success, bytes the client pipelined after its
        sasl-init are parsed by the following ``next_event()`` calls; on failure a
        ``ConnectionClosed`` comes out of ``next_event()``."""
        if self.state is not ConnState.SASL_AUTHENTICATING:
            raise AMQPStateError("no SASL exchange is waiting for an outcome")
        if code is None:
            code = SaslCode.OK if ok else SaslCode.AUTH
        if ok and code != SaslCode.OK:
            raise AMQPStateError("a successful outcome has code 0")
        encode_frame(FRAME_SASL, 0, SaslOutcome(code=int(code)), out=self._out)
        if not ok:
            self.state = ConnState.CLOSED
            err = Error(condition=UNAUTHORIZED_ACCESS, description="SASL authentication failed")
            self._events.append(ConnectionClosed(err, False))
            return
        self._sasl_done = True
        self.state = ConnState.AWAIT_HEADER

    # ---- connection --------------------------------------------------------------------

    def close(self, error: Error | None = None) -> None:
        """Close the connection (no event follows; ``closed`` turns True on the peer's reply)."""
        if self.state in (ConnState.OPENED, ConnState.AWAIT_OPEN):
            self._send_close(error)
        elif self.state is not ConnState.CLOSE_SENT:
            self.state = ConnState.CLOSED
        self._teardown_if_closing()

    # ---- sessions ----------------------------------------------------------------------

    def end_session(self, session: Session, error: Error | None = None) -> None:
        if session.state is not SessionState.MAPPED or self.state is not ConnState.OPENED:
            return
        self._send(session.channel, End(error=error))
        session.state = SessionState.END_SENT
        session.pending.clear()
        for link in session.links:
            link.state = LinkState.DETACHED

    # ---- links -------------------------------------------------------------------------

    def accept_link(
        self,
        link: Link,
        *,
        source: Any = _ECHO,
        target: Any = _ECHO,
        snd_settle_mode: int | None = None,
        rcv_settle_mode: int | None = None,
        max_message_size: int | None = None,
        initial_credit: int = 0,
        properties: dict[Any, Any] | None = None,
        offered_capabilities: Sequence[str] | None = None,
    ) -> None:
        """Answer a peer's attach. Source and target default to the peer's (so a dynamic
        terminus must be given with its address). For our receiver links, ``initial_credit``
        is granted at once and ``max_message_size`` (default: the connection's) is enforced."""
        if link.state is not LinkState.ATTACH_RECEIVED:
            raise AMQPStateError(f"link {link.name!r} is {link.state.value}, not waiting for an answer")
        ra = link.remote_attach
        link.source = ra.source if source is _ECHO else source
        link.target = ra.target if target is _ECHO else target
        if snd_settle_mode is not None:
            link.snd_settle_mode = snd_settle_mode
        if rcv_settle_mode is not None:
            link.rcv_settle_mode = rcv_settle_mode
        if link.is_receiver:
            link.max_message_size = (
                max_message_size if max_message_size is not None else self.max_message_size
            )
        self._attach_reply(link, properties, offered_capabilities)
        link.state = LinkState.ATTACHED
        if link.is_receiver and initial_credit:
            self.grant_credit(link, initial_credit)

    def reject_link(self, link: Link, error: Error | None) -> None:
        """Refuse a peer's attach: attach with a null terminus, then detach with ``error``."""
        if link.state is not LinkState.ATTACH_RECEIVED:
            raise AMQPStateError(f"link {link.name!r} is {link.state.value}, not waiting for an answer")
        self._refuse(link, error)

    def detach_link(self, link: Link, error: Error | None = None, closed: bool = True) -> None:
        """Detach (``closed=True``: close) one of our links. No event follows."""
        if link.state is LinkState.ATTACH_RECEIVED:
            self._refuse(link, error)
        elif link.state is LinkState.ATTACHED:
            self._send(link.channel, Detach(handle=link.handle, closed=closed, error=error))
            self._detach_sent(link)

    def grant_credit(self, link: Link, credit: int, drain: bool = False) -> None:
        """Set our receiver link's credit to ``credit`` (absolute, not added) and tell the peer."""
        self._check_link(link, ROLE_RECEIVER)
        link.link_credit = credit
        link.drain = drain
        self._send_flow(link.session, link)

    def complete_drain(self, link: Link) -> None:
        """Our sender has nothing more to send for a drain: use up the credit and say so."""
        self._check_link(link, ROLE_SENDER)
        link.drain_credit()
        self._send_flow(link.session, link)

    def send_flow(self, link: Link, available: int | None = None, echo: bool = False) -> None:
        """Send our current flow state for ``link`` (e.g. to report ``available``)."""
        self._check_link(link, link.role)
        if available is not None:
            link.available = available
        self._send_flow(link.session, link, echo=echo)

    def send(
        self,
        link: Link,
        payload: bytes | bytearray | memoryview,
        *,
        tag: bytes | None = None,
        settled: bool | None = None,
        message_format: int = 0,
    ) -> int:
        """Send one message (an encoded payload, e.g. from ``encode_message``) on our sender
        link, split into frames of the peer's max-frame-size. Needs ``link.credit > 0``.
        ``settled`` defaults from the link's snd-settle-mode (mixed: unsettled). Returns the
        delivery id; the outcome comes as ``DispositionReceived``."""
        session = link.session
        if (
            link.role is not ROLE_SENDER
            or link.state is not LinkState.ATTACHED
            or session.state is not SessionState.MAPPED
            or self.state is not ConnState.OPENED
        ):
            self._check_link(link, ROLE_SENDER)  # says which
        if link.link_credit <= 0:
            raise AMQPStateError(f"link {link.name!r} has no credit")
        if payload.__class__ is not bytes:
            payload = bytes(payload)  # frames may wait for the window: never keep a mutable buffer
        size = len(payload)
        if link.max_message_size and size > link.max_message_size:
            raise AMQPStateError(f"message of {size} bytes exceeds the peer's max-message-size")
        if link.snd_settle_mode == SND_SETTLED:
            settled = True
        elif link.snd_settle_mode == SND_UNSETTLED or settled is None:
            settled = False
        delivery_id = session.next_delivery_id
        session.next_delivery_id = (delivery_id + 1) & SERIAL_MASK
        if tag is None:
            tag = (link.next_tag & SERIAL_MASK).to_bytes(4, "big")
            link.next_tag += 1
            tag_size = 4
        else:
            tag_size = len(tag)
        # The link's credit (section 2.6.7): one delivery sent.
        link.delivery_count = (link.delivery_count + 1) & SERIAL_MASK
        link.link_credit -= 1
        if link.drain and link.link_credit == 0:
            link.drain = False
        if not settled:
            session.unsettled_out[delivery_id] = (link, tag)
        limit = self.remote_max_frame_size - 8
        if (
            not session.pending
            and session.remote_incoming_window > 0
            and size + tag_size + TRANSFER_OVERHEAD_MAX <= limit
            and tag_size <= 32
        ):
            # One frame, and the peer's session window is open: written now, without a Transfer.
            write_transfer(
                self._out,
                session.channel,
                link.handle,
                delivery_id,
                tag,
                message_format,
                settled,
                payload,
                tag_size,
                size,
            )
            session.next_outgoing_id = (session.next_outgoing_id + 1) & SERIAL_MASK
            session.remote_incoming_window -= 1
            return delivery_id
        first = Transfer(
            handle=link.handle,
            delivery_id=delivery_id,
            delivery_tag=tag,
            message_format=message_format,
            settled=settled,
        )
        # A first transfer encodes in at most 38 bytes plus its tag (descriptor 3, list32 header 9,
        # four uints 5 each, a bool 1, binary header 5): a message well inside one frame needs no
        # trial encoding of the performative to know it fits.
        if size + tag_size + TRANSFER_OVERHEAD_MAX <= limit or performative_size(first) + size <= limit:
            session.pending.append((first, payload))
        else:
            view = memoryview(payload).cast("B")
            first = replace(first, more=True)
            step = limit - performative_size(first)
            session.pending.append((first, view[:step]))
            pos = step
            cont = Transfer(handle=link.handle, more=True)
            step = limit - performative_size(cont)
            while pos < size:
                chunk = view[pos : pos + step]
                pos += step
                t = cont if pos < size else Transfer(handle=link.handle)
                session.pending.append((t, chunk))
        self._flush(session)
        return delivery_id

    def settle(
        self, link: Link, delivery_id: int, state: Composite | None = None, settled: bool = True
    ) -> None:
        """Send a disposition for one delivery of ``link`` (state e.g. ``Accepted()``)."""
        self.settle_range(link.session, link.role, delivery_id, delivery_id, state, settled)

    def settle_range(
        self,
        session: Session,
        role: bool,
        first: int,
        last: int,
        state: Composite | None = None,
        settled: bool = True,
    ) -> None:
        """Disposition over ``first..last``; ``role`` is ours (ROLE_RECEIVER for received messages)."""
        if session.state is not SessionState.MAPPED or self.state is not ConnState.OPENED:
            raise AMQPStateError("session is not open")
        write_disposition(
            self._out,
            session.channel,
            role,
            first,
            last,
            settled,
            ACCEPTED if state.__class__ is Accepted else state,
        )
        if settled:
            table = session.unsettled_in if role is ROLE_RECEIVER else session.unsettled_out
            if first == last:
                table.pop(first, None)
            else:
                for i in session.ids_in_range(table, first, last):
                    del table[i]

    # ---- internals: output -------------------------------------------------------------

    def _send(self, channel: int, perf: Composite, payload: bytes | memoryview = b"") -> None:
        encode_frame(FRAME_AMQP, channel, perf, payload, out=self._out)

    def _send_close(self, error: Error | None) -> None:
        """Our close (after our open if the peer's has not come yet); the peer's close ends it."""
        if self.state is ConnState.AWAIT_OPEN:
            self._send_open()
        self._send(0, Close(error=error))
        self.state = ConnState.CLOSE_SENT
        self._close_sent = self._now

    def _send_open(self) -> None:
        idle_ms = int(self.idle_timeout * 500) if self.idle_timeout else None
        self._send(
            0,
            Open(
                container_id=self.container_id,
                max_frame_size=self.max_frame_size,
                channel_max=self.channel_max,
                idle_time_out=idle_ms,
                offered_capabilities=[Symbol(c) for c in self.offered_capabilities]
                if self.offered_capabilities
                else None,
                properties=self.properties,
            ),
        )

    def _send_flow(self, session: Session, link: Link | None = None, echo: bool = False) -> None:
        session.incoming_window = session.incoming_window_size
        flow = Flow(
            next_incoming_id=session.next_incoming_id,
            incoming_window=session.incoming_window,
            next_outgoing_id=session.next_outgoing_id,
            outgoing_window=session.outgoing_window,
            echo=echo,
        )
        if link is not None:
            flow = replace(
                flow,
                handle=link.handle,
                delivery_count=link.delivery_count,
                link_credit=link.link_credit,
                available=link.available if link.is_sender else None,
                drain=link.drain,
            )
        self._send(session.channel, flow)

    def _flush(self, session: Session) -> None:
        pending = session.pending
        while pending and session.remote_incoming_window > 0:
            transfer, chunk = pending.popleft()
            self._send(session.channel, transfer, chunk)
            session.take_outgoing_frame()

    def _attach_reply(
        self,
        link: Link,
        properties: dict[Any, Any] | None = None,
        offered_capabilities: Sequence[str] | None = None,
    ) -> None:
        session = link.session
        link.handle = session.allocate_handle()
        session.links_by_handle[link.handle] = link
        self._send(
            session.channel,
            Attach(
                name=link.name,
                handle=link.handle,
                role=link.role,
                snd_settle_mode=link.snd_settle_mode,
                rcv_settle_mode=link.rcv_settle_mode,
                source=link.source,
                target=link.target,
                initial_delivery_count=link.delivery_count if link.is_sender else None,
                max_message_size=link.max_message_size if link.is_receiver else None,
                offered_capabilities=[Symbol(c) for c in offered_capabilities]
                if offered_capabilities
                else None,
                properties=properties,
            ),
        )

    def _refuse(self, link: Link, error: Error | None) -> None:
        if link.is_sender:
            link.source = None
            link.target = link.remote_attach.target
        else:
            link.target = None
            link.source = link.remote_attach.source
        self._attach_reply(link)
        self._send(link.channel, Detach(handle=link.handle, closed=True, error=error))
        self._detach_sent(link)

    def _detach_sent(self, link: Link) -> None:
        link.state = LinkState.DETACH_SENT
        link.partial = None
        self._forget_unsettled(link)
        self._drop_pending(link)

    def _drop_pending(self, link: Link) -> None:
        """Forget frames of ``link`` still waiting for the peer's session window."""
        pending = link.session.pending
        if pending and link.handle >= 0:
            kept = [(t, chunk) for t, chunk in pending if t.handle != link.handle]
            pending.clear()
            pending.extend(kept)

    def _forget_unsettled(self, link: Link) -> None:
        session = link.session
        for table in (session.unsettled_in, session.unsettled_out):
            for i in [i for i, (lk, _) in table.items() if lk is link]:
                del table[i]

    def _check_link(self, link: Link, role: bool) -> None:
        if link.role is not role:
            raise AMQPStateError(f"link {link.name!r} has the wrong role for this call")
        if link.state is not LinkState.ATTACHED:
            raise AMQPStateError(f"link {link.name!r} is {link.state.value}")
        if link.session.state is not SessionState.MAPPED or self.state is not ConnState.OPENED:
            raise AMQPStateError("session or connection is not open")

    def _teardown_if_closing(self) -> None:
        """Once close is sent or received, every session and link is over too."""
        if self.state in (ConnState.CLOSE_SENT, ConnState.CLOSED) and self.sessions:
            for session in self.sessions.values():
                session.state = SessionState.UNMAPPED
                session.pending.clear()
                for link in session.links:
                    link.state = LinkState.DETACHED
            self.sessions.clear()
            self._by_local_channel.clear()

    # ---- internals: errors -------------------------------------------------------------

    def _fail(self, condition: Symbol, description: str) -> None:
        """Close the connection because of the peer (or an internal bug)."""
        log.debug("closing AMQP connection: %s %s", condition, description)
        error = Error(condition=condition, description=description)
        if self.state in (ConnState.OPENED, ConnState.AWAIT_OPEN):
            self._send_close(error)
        elif self.state is ConnState.CLOSE_SENT:
            self.state = ConnState.CLOSED
            return
        else:
            self.state = ConnState.CLOSED
        self._events.append(ConnectionClosed(error, False))

    def _session_error(self, session: Session, condition: Symbol, description: str) -> None:
        error = Error(condition=condition, description=description)
        self._send(session.channel, End(error=error))
        session.state = SessionState.END_SENT
        session.pending.clear()
        self._links_gone(session, False)
        self._events.append(SessionEnded(session, error, False))

    def _links_gone(self, session: Session, by_peer: bool) -> None:
        for link in session.links:
            if link.state in (LinkState.ATTACHED, LinkState.ATTACH_RECEIVED):
                self._events.append(LinkDetached(link, False, None, by_peer))
            link.state = LinkState.DETACHED
            link.partial = None

    def _link_error(self, link: Link, condition: Symbol, description: str) -> None:
        error = Error(condition=condition, description=description)
        if link.state is LinkState.ATTACH_RECEIVED:
            self._refuse(link, error)
        else:
            self._send(link.channel, Detach(handle=link.handle, closed=True, error=error))
            self._detach_sent(link)
        self._events.append(LinkDetached(link, True, error, False))

    # ---- internals: input --------------------------------------------------------------

    def _step(self) -> bool:
        """Parse one header or frame and act on it; False when nothing whole is buffered (or the
        caller's SASL outcome is awaited, or the connection is over)."""
        decoder = self._decoder
        try:
            state = self.state
            if state is ConnState.AWAIT_HEADER:
                hdr = decoder.next_header()
                if hdr is NEED_DATA:
                    return False
                assert isinstance(hdr, bytes)
                self._on_header(hdr)
            elif state in (ConnState.SASL_AUTHENTICATING, ConnState.CLOSED):
                return False
            else:
                held = self._held
                if held is not None:
                    if self.hold_closing:
                        return False
                    self._held = None
                    frame = held
                else:
                    got = decoder.next_frame()
                    if type(got) is _NeedData:
                        return False
                    frame = got  # type: ignore[assignment]  # not NEED_DATA: a Frame
                    if (
                        self.hold_closing
                        and frame.body[:3] != _TRANSFER_HEAD  # the usual frame: not an ending
                        and _ends_something(frame)
                    ):
                        self._held = frame
                        return False
                if state is ConnState.SASL_AWAIT_INIT:
                    self._on_sasl_frame(frame)
                else:
                    self._on_frame(frame)
            if self.state is not ConnState.OPENED:
                self._teardown_if_closing()
        except FramingError as exc:
            # The byte stream cannot be trusted any more: say why and stop reading.
            self._fail(FRAMING_ERROR, str(exc))
            self.state = ConnState.CLOSED
            self._teardown_if_closing()
        except DecodeError as bad:  # (a name per type: mypyc gives one name one type in a function)
            self._fail(Symbol(bad.condition), str(bad))
            self._teardown_if_closing()
        except Exception as bug:  # a bug of ours must not escape into the I/O loop
            log.exception("AMQP 1.0 connection failed")
            self._fail(INTERNAL_ERROR, f"{type(bug).__name__}: {bug}")
            self._teardown_if_closing()
        return True

    def _reopen_windows(self) -> None:
        """Re-open incoming windows once per batch of input (when the buffer is used up), not
        once per frame."""
        if not self._window_due:
            return
        for session in self._window_due:
            if session.state is SessionState.MAPPED and self.state is ConnState.OPENED:
                self._send_flow(session)
        self._window_due.clear()

    def _on_header(self, hdr: bytes) -> None:
        want_sasl = self.require_sasl and not self._sasl_done
        if hdr == SASL_HEADER and self.sasl_mechanisms and not self._sasl_done:
            self._out += SASL_HEADER
            mechs: list[str] = [Symbol(m) for m in self.sasl_mechanisms]
            encode_frame(FRAME_SASL, 0, SaslMechanisms(sasl_server_mechanisms=mechs), out=self._out)
            self.state = ConnState.SASL_AWAIT_INIT
        elif hdr == AMQP_HEADER and not want_sasl:
            self._out += AMQP_HEADER
            self.state = ConnState.AWAIT_OPEN
        else:
            self._out += SASL_HEADER if want_sasl else AMQP_HEADER
            self.state = ConnState.CLOSED
            error = Error(condition=NOT_ALLOWED, description=f"unsupported protocol header {hdr!r}")
            self._events.append(ConnectionClosed(error, False))

    def _on_sasl_frame(self, frame: Frame) -> None:
        if frame.type != FRAME_SASL or frame.is_empty:
            self._fail(FRAMING_ERROR, "expected a SASL frame")
            return
        perf, _ = frame.performative()
        if not isinstance(perf, SaslInit):
            self._fail(NOT_ALLOWED, f"expected sasl-init, got {perf.NAME}")
            return
        mech = str(perf.mechanism)
        try:
            if mech not in self.sasl_mechanisms:
                raise SaslParseError(f"mechanism {mech} not offered")
            creds = parse_initial_response(mech, perf.initial_response)
        except SaslParseError as exc:
            encode_frame(FRAME_SASL, 0, SaslOutcome(code=SaslCode.AUTH), out=self._out)
            self.state = ConnState.CLOSED
            self._events.append(
                ConnectionClosed(Error(condition=UNAUTHORIZED_ACCESS, description=str(exc)), False)
            )
            return
        self.credentials = creds
        self.state = ConnState.SASL_AUTHENTICATING
        self._events.append(SaslAuthRequested(creds, perf.hostname))

    def _on_frame(self, frame: Frame) -> None:
        if frame.type != FRAME_AMQP:
            self._fail(FRAMING_ERROR, f"unexpected frame type {frame.type}")
            return
        body = frame.body
        if not body:
            return  # heartbeat
        state = self.state
        if state is ConnState.OPENED and frame.channel <= self.channel_max:
            # The frames that carry messages, read without the generic codec when they can be.
            head = body[:3]
            if head == _TRANSFER_HEAD:
                channel = frame.channel
                session = self.sessions.get(channel)
                fields = read_transfer(body)
                if fields is not None and session is not None and session.state is SessionState.MAPPED:
                    # The transfers buffered behind this one on its channel are read in the same
                    # step: their events queue in order, and the front end drops those of a link
                    # that one of them ended (it asks every message's link whether it is attached).
                    decoder = self._decoder
                    events = self._events
                    while True:
                        handle, did, tag, fmt, settled, more, aborted, start = fields
                        chunk = body[start:]
                        link = session.links_by_remote_handle.get(handle)
                        limit = 0 if link is None else link.max_message_size
                        if (
                            link is not None
                            and not more
                            and not aborted
                            and did is not None
                            and tag is not None
                            and link.partial is None
                            and link.state is LinkState.ATTACHED
                            and link.role is ROLE_RECEIVER
                            and link.link_credit > 0
                            and (not limit or len(chunk) <= limit)
                            and session.incoming_window > 0
                        ):
                            # _on_transfer's delivery in one frame, the usual one, written out: no
                            # call per message. Anything else goes the long way, which says what
                            # is wrong.
                            session.incoming_window -= 1
                            session.next_incoming_id = (session.next_incoming_id + 1) & SERIAL_MASK
                            if session.remote_outgoing_window > 0:
                                session.remote_outgoing_window -= 1
                            if session.incoming_window <= session.incoming_window_size // 2:
                                self._window_due.add(session)
                            link.link_credit -= 1
                            link.delivery_count = (link.delivery_count + 1) & SERIAL_MASK
                            if not settled:
                                session.unsettled_in[did] = (link, tag)
                            events.append(
                                MessageReceived(link, did, tag, bool(settled), chunk, fmt or 0, None)
                            )
                        else:
                            self._on_transfer(
                                session, handle, did, tag, fmt, settled, more, None, aborted, chunk
                            )
                        if self.state is not ConnState.OPENED or session.state is not SessionState.MAPPED:
                            return
                        got = decoder.next_body_if(FRAME_AMQP, channel, _TRANSFER_HEAD)
                        if got is None:
                            return
                        body = got
                        fields = read_transfer(body)
                        if fields is None:  # not readable here: the generic codec's turn
                            self._on_frame(Frame(FRAME_AMQP, channel, body))
                            return
            elif head == _DISPOSITION_HEAD:
                session = self.sessions.get(frame.channel)
                d = read_disposition(body)
                if d is not None and session is not None and session.state is SessionState.MAPPED:
                    if d[2] is None and d[3] and d[4]:
                        self._on_accepted_run(session, frame.channel, d[0], d[1])
                    else:
                        role, first, last, settled, accepted = d
                        self._on_disposition(
                            session, role, first, last, settled, _ACCEPTED if accepted else None
                        )
                    return
        perf, payload = frame.performative()
        if state is ConnState.CLOSE_SENT:
            if isinstance(perf, Close):
                self.state = ConnState.CLOSED
            return
        if state is ConnState.AWAIT_OPEN:
            if isinstance(perf, Open):
                self._on_open(perf)
            elif isinstance(perf, Close):
                # The peer gives up before opening: answer with open and close, as the spec asks.
                self._send_open()
                self._send(0, Close())
                self.state = ConnState.CLOSED
                self._events.append(ConnectionClosed(perf.error, True))
            else:
                self._fail(ILLEGAL_STATE, f"expected open, got {perf.NAME}")
            return
        if frame.channel > self.channel_max:
            self._fail(FRAMING_ERROR, f"channel {frame.channel} exceeds channel-max {self.channel_max}")
            return
        if isinstance(perf, Close):
            self._send(0, Close())
            self.state = ConnState.CLOSED
            self._events.append(ConnectionClosed(perf.error, True))
            return
        if isinstance(perf, Begin):
            self._on_begin(frame.channel, perf)
            return
        if isinstance(perf, Open):
            self._fail(ILLEGAL_STATE, "second open")
            return
        session = self.sessions.get(frame.channel)
        if session is None:
            self._fail(FRAMING_ERROR, f"{perf.NAME} on channel {frame.channel} without a session")
            return
        if isinstance(perf, End):
            self._on_end(session, perf)
            return
        if session.state is not SessionState.MAPPED:
            return  # we ended it; wait for the peer's end
        if isinstance(perf, Transfer):
            self._on_transfer(
                session,
                perf.handle,
                perf.delivery_id,
                perf.delivery_tag,
                perf.message_format,
                perf.settled,
                perf.more,
                perf.state,
                perf.aborted,
                payload,
            )
        elif isinstance(perf, Flow):
            self._on_flow(session, perf)
        elif isinstance(perf, Disposition):
            self._on_disposition(session, perf.role, perf.first, perf.last, perf.settled, perf.state)
        elif isinstance(perf, Attach):
            self._on_attach(session, perf)
        elif isinstance(perf, Detach):
            self._on_detach(session, perf)
        else:
            self._fail(FRAMING_ERROR, f"{perf.NAME} is not a frame body")

    def _on_accepted_run(self, session: Session, channel: int, role: bool, first: int) -> None:
        """A receiver that accepts and settles each delivery with its own disposition (proton's C
        receive, Qpid JMS) sends runs of them for consecutive deliveries: the buffered ones that
        follow are read here and settled as one range, which the spec makes the same outcome
        (2.7.6). The first frame that does not continue the run is handled on its own."""
        last = first
        decoder = self._decoder
        while True:
            body = decoder.next_body_if(FRAME_AMQP, channel, _DISPOSITION_HEAD)
            d = None if body is None else read_disposition(body)
            if d is not None and d[2] is None and d[3] and d[4] and d[0] is role and d[1] == last + 1:
                last += 1
                continue
            self._on_disposition(session, role, first, last, True, _ACCEPTED)
            if body is None:
                return
            if d is None:  # not readable here: the generic codec's turn
                self._on_frame(Frame(FRAME_AMQP, channel, body))
                return
            if d[2] is None and d[3] and d[4]:  # the start of another run
                role = d[0]
                first = last = d[1]
                continue
            role, first, d_last, settled, accepted = d
            self._on_disposition(session, role, first, d_last, settled, _ACCEPTED if accepted else None)
            return

    def _on_open(self, o: Open) -> None:
        if o.max_frame_size < MIN_MAX_FRAME_SIZE:
            self._fail(INVALID_FIELD, "max-frame-size below 512")
            return
        self.remote_open = o
        self.remote_max_frame_size = o.max_frame_size
        self.remote_channel_max = o.channel_max
        self.remote_idle_timeout = o.idle_time_out / 1000 if o.idle_time_out else None
        self._send_open()
        self.state = ConnState.OPENED
        self._last_recv = self._now
        self._events.append(ConnectionOpened(o))

    def _on_begin(self, channel: int, b: Begin) -> None:
        if channel in self.sessions:
            self._fail(FRAMING_ERROR, f"begin on channel {channel} which is in use")
            return
        if b.remote_channel is not None:
            self._fail(NOT_ALLOWED, "begin answers a session we never began")
            return
        local = 0
        while local in self._by_local_channel:
            local += 1
        if local > min(self.channel_max, self.remote_channel_max):
            self._fail(RESOURCE_LIMIT_EXCEEDED, "no free channel")
            return
        s = Session(
            channel=local,
            remote_channel=channel,
            remote_begin=b,
            incoming_window_size=self.incoming_window,
            handle_max=self.handle_max,
        )
        s.next_incoming_id = b.next_outgoing_id
        s.incoming_window = self.incoming_window
        s.remote_incoming_window = b.incoming_window
        s.remote_outgoing_window = b.outgoing_window
        self.sessions[channel] = s
        self._by_local_channel[local] = s
        self._send(
            local,
            Begin(
                remote_channel=channel,
                next_outgoing_id=s.next_outgoing_id,
                incoming_window=s.incoming_window,
                outgoing_window=s.outgoing_window,
                handle_max=self.handle_max,
            ),
        )
        self._events.append(SessionBegun(s))

    def _unmap(self, session: Session) -> None:
        session.state = SessionState.UNMAPPED
        self.sessions.pop(session.remote_channel, None)
        self._by_local_channel.pop(session.channel, None)

    def _on_end(self, session: Session, e: End) -> None:
        if session.state is SessionState.END_SENT:
            self._unmap(session)
            return
        self._send(session.channel, End())
        session.pending.clear()
        self._links_gone(session, True)
        self._unmap(session)
        self._events.append(SessionEnded(session, e.error, True))

    def _on_attach(self, session: Session, a: Attach) -> None:
        if a.handle > self.handle_max:
            self._fail(FRAMING_ERROR, f"handle {a.handle} exceeds handle-max {self.handle_max}")
            return
        if a.handle in session.links_by_remote_handle:
            self._session_error(session, HANDLE_IN_USE, f"handle {a.handle} is in use")
            return
        role = ROLE_SENDER if a.role is ROLE_RECEIVER else ROLE_RECEIVER
        link = Link(
            session=session,
            name=a.name,
            role=role,
            remote_handle=a.handle,
            remote_attach=a,
            snd_settle_mode=a.snd_settle_mode,
            rcv_settle_mode=a.rcv_settle_mode,
            source=a.source,
            target=a.target,
        )
        if role is ROLE_RECEIVER:
            link.delivery_count = a.initial_delivery_count or 0
        else:
            link.max_message_size = a.max_message_size or None
        session.links_by_remote_handle[a.handle] = link
        self._events.append(LinkAttached(link))

    def _link_for(self, session: Session, handle: int) -> Link | None:
        link = session.links_by_remote_handle.get(handle)
        if link is None:
            self._session_error(session, UNATTACHED_HANDLE, f"handle {handle} is not attached")
        return link

    def _on_detach(self, session: Session, d: Detach) -> None:
        link = self._link_for(session, d.handle)
        if link is None:
            return
        if link.state is LinkState.ATTACH_RECEIVED:
            self._attach_reply(link)
        self._drop_pending(link)
        if link.state in (LinkState.ATTACHED, LinkState.ATTACH_RECEIVED):
            self._send(session.channel, Detach(handle=link.handle, closed=d.closed))
            self._events.append(LinkDetached(link, d.closed, d.error, True))
        link.state = LinkState.DETACHED
        link.partial = None
        self._forget_unsettled(link)
        session.links_by_remote_handle.pop(link.remote_handle, None)
        if session.links_by_handle.get(link.handle) is link:
            del session.links_by_handle[link.handle]

    def _on_flow(self, session: Session, f: Flow) -> None:
        session.on_peer_window(f.next_incoming_id, f.incoming_window, f.outgoing_window)
        if f.handle is not None:
            link = self._link_for(session, f.handle)
            if link is None:
                return
            if link.state in (LinkState.ATTACHED, LinkState.ATTACH_RECEIVED):
                if link.is_sender:
                    link.on_peer_flow_as_sender(f.delivery_count, f.link_credit, f.drain)
                else:
                    link.on_peer_flow_as_receiver(f.delivery_count, f.available)
                self._events.append(FlowReceived(link, link.link_credit, f.drain, f.available, f))
                if f.echo and link.state is LinkState.ATTACHED:
                    self._send_flow(session, link)
        elif f.echo:
            self._send_flow(session)
        self._flush(session)

    def _on_transfer(
        self,
        session: Session,
        handle: int,
        delivery_id: int | None,
        tag: bytes | None,
        message_format: int | None,
        settled: bool | None,
        more: bool,
        state: Any,
        aborted: bool,
        payload: bytes | memoryview,
    ) -> None:
        # The session window (section 2.5.6), counted here rather than in a call per frame.
        if session.incoming_window <= 0:
            self._session_error(session, WINDOW_VIOLATION, "transfer beyond the incoming window")
            return
        session.incoming_window -= 1
        session.next_incoming_id = (session.next_incoming_id + 1) & SERIAL_MASK
        if session.remote_outgoing_window > 0:
            session.remote_outgoing_window -= 1
        link = session.links_by_remote_handle.get(handle)
        if link is None:
            self._session_error(session, UNATTACHED_HANDLE, f"handle {handle} is not attached")
            return
        if session.incoming_window <= session.incoming_window_size // 2:
            self._window_due.add(session)
        if link.state is not LinkState.ATTACHED:
            if link.state is LinkState.ATTACH_RECEIVED:
                self._link_error(link, TRANSFER_LIMIT_EXCEEDED, "transfer before the link was granted credit")
            return
        if link.role is ROLE_SENDER:
            self._link_error(link, NOT_ALLOWED, "transfer sent to the sending end of the link")
            return
        partial = link.partial
        if partial is None:
            if delivery_id is None or tag is None:
                self._link_error(
                    link, INVALID_FIELD, "first transfer of a delivery needs delivery-id and tag"
                )
                return
            # The link's credit (section 2.6.7): one delivery taken.
            if link.link_credit <= 0:
                self._link_error(link, TRANSFER_LIMIT_EXCEEDED, "transfer without link credit")
                return
            link.link_credit -= 1
            link.delivery_count = (link.delivery_count + 1) & SERIAL_MASK
            if not more and not aborted:
                # A delivery in one frame (the common case): no reassembly.
                if link.max_message_size and len(payload) > link.max_message_size:
                    self._link_error(
                        link,
                        MESSAGE_SIZE_EXCEEDED,
                        f"message exceeds max-message-size {link.max_message_size}",
                    )
                    return
                if not settled:
                    session.unsettled_in[delivery_id] = (link, tag)
                if payload.__class__ is not bytes:
                    payload = bytes(payload)
                self._events.append(
                    MessageReceived(
                        link, delivery_id, tag, bool(settled), payload, message_format or 0, state
                    )
                )
                return
            partial = PartialDelivery(delivery_id, tag, bool(settled), message_format or 0)
            link.partial = partial
        elif delivery_id is not None and delivery_id != partial.delivery_id:
            self._link_error(link, INVALID_FIELD, "delivery-id changed inside a multi-frame delivery")
            return
        if settled:
            partial.settled = True
        if state is not None:
            partial.state = state
        if aborted:
            link.partial = None
            self._events.append(TransferAborted(link, partial.delivery_id, partial.tag))
            return
        if payload:
            partial.chunks.append(payload)
            partial.size += len(payload)
        if link.max_message_size and partial.size > link.max_message_size:
            link.partial = None
            self._link_error(
                link, MESSAGE_SIZE_EXCEEDED, f"message exceeds max-message-size {link.max_message_size}"
            )
            return
        if more:
            return
        link.partial = None
        chunks = partial.chunks
        body = bytes(chunks[0]) if len(chunks) == 1 else b"".join(chunks)
        if not partial.settled:
            session.unsettled_in[partial.delivery_id] = (link, partial.tag)
        self._events.append(
            MessageReceived(
                link,
                partial.delivery_id,
                partial.tag,
                partial.settled,
                body,
                partial.message_format,
                partial.state,
            )
        )

    def _on_disposition(
        self, session: Session, role: bool, first: int, last: int | None, settled: bool, state: Any
    ) -> None:
        table = session.unsettled_out if role is ROLE_RECEIVER else session.unsettled_in
        if last is None or last == first:  # one delivery (as a receiver settling each one says)
            last = first
            entry = table.get(first)
            deliveries = [] if entry is None else [(entry[0], first, entry[1])]
            if settled and entry is not None:
                del table[first]
        else:
            ids = session.ids_in_range(table, first, last)
            deliveries = [(table[i][0], i, table[i][1]) for i in ids]
            if settled:
                for i in ids:
                    del table[i]
        self._events.append(DispositionReceived(session, role, first, last, settled, state, deliveries))
