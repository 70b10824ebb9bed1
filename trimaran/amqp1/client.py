"""A sans-IO AMQP 1.0 client: what a bridge speaks to another broker, over one session.

Bytes and ``now`` (the caller's monotonic clock, in seconds) in, events and bytes out, as the server's
machine (``connection.py``) and the MQTT client (``mqtt/client.py``); the codec is the server's. No
sockets, no clocks::

    conn = ClientConnection(ClientParams("bridge-1", username="alice", password="secret"), now)
    sock.sendall(conn.data_to_send())
    conn.receive_data(chunk, now)  # or conn.receive_eof() at the end of the stream
    while (event := conn.next_event()) is not None:
        ...react: conn.attach_receiver(...), conn.send(...), conn.settle(...) ...
    sock.sendall(conn.data_to_send())
    ...at conn.next_deadline(): conn.tick(now), then take the events again

What it owns: the protocol headers, SASL (PLAIN with a username, else ANONYMOUS), the open, one
session on channel 0 (its transfer windows and delivery ids) and the links the caller attaches on it
(credit, delivery counts, multi-frame deliveries both ways, unsettled deliveries both ways). The open
and the begin are pipelined behind the AMQP header as soon as SASL allows.

What it promises:

- Events come one frame at a time: ``next_event`` parses the next frame only once the events of the
  previous one are taken, so the caller acts on each before the next changes the state. End of stream
  is one more input: frames buffered before ``receive_eof`` come out first, then :class:`Closed`; a
  second ``receive_eof`` is harmless.
- :class:`Closed` comes exactly once, and last. Peer errors never raise: a protocol violation sends
  close with the standard condition and comes out as ``Closed(by_peer=False)``. Misuse by the caller
  (sending without credit, a handle that is not a link of this kind, a link call before
  :attr:`~ClientConnection.opened`) raises ``ValueError``.
- ``credit(handle) > 0`` is all ``send`` needs: transfer frames beyond the peer's session window wait
  here until its next flow opens it (at most one link credit's worth of deliveries).
- A sender link that the peer drains gets a :class:`Credit` event (even with the number unchanged):
  whatever the caller sends before taking its next event uses the credit, and the rest is given back
  then (a flow with drain, ``Credit(handle, 0)``), as the spec lets a sender with nothing to send.
- Settles of the same outcome for consecutive deliveries before the next ``data_to_send`` go out as
  one disposition range.

Deadlines: the peer's open and begin within ``connect_timeout`` of construction (SASL included); once
open, the peer may stay silent at most ``idle_timeout_s`` (which is what our open says), and an empty
frame goes out when we have been silent for half the peer's idle time-out; after our close, the peer
has ``connect_timeout`` again to answer it.

Links the peer begins are not served: an attach that answers none of ours closes the connection with
``amqp:not-allowed``. Transfers past the credit we gave are taken, not refused (the credit stays at 0).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field, replace
from typing import Any, Final

from .frames import (
    AMQP_HEADER,
    EMPTY_FRAME,
    FRAME_AMQP,
    FRAME_SASL,
    MIN_MAX_FRAME_SIZE,
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
    ILLEGAL_STATE,
    INTERNAL_ERROR,
    INVALID_FIELD,
    NOT_ALLOWED,
    RCV_FIRST,
    RESOURCE_LIMIT_EXCEEDED,
    ROLE_RECEIVER,
    ROLE_SENDER,
    SND_UNSETTLED,
    UNATTACHED_HANDLE,
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
    Modified,
    Open,
    Rejected,
    Released,
    SaslChallenge,
    SaslInit,
    SaslMechanisms,
    SaslOutcome,
    Source,
    Target,
    Transfer,
)
from .sasl import ANONYMOUS, PLAIN, SaslCode
from .session import SERIAL_MASK, serial_add, serial_diff
from .transfers import ACCEPTED, read_disposition, read_transfer, write_disposition, write_transfer
from .types import DecodeError, Symbol

__all__ = [
    "OUTCOMES",
    "Attached",
    "ClientConnection",
    "ClientParams",
    "Closed",
    "Credit",
    "Detached",
    "Event",
    "Opened",
    "Outcome",
    "Received",
]

# Transfer frames the peer may send us past next-incoming-id; a session flow opens the window again
# once half of it is used (once per batch of input, not per frame).
INCOMING_WINDOW: Final = 2048
OUTGOING_WINDOW: Final = 0x7FFF_FFFF
# Bytes a first transfer (handle, delivery-id, tag, message-format, settled) takes beyond its tag: a
# copy of connection.TRANSFER_OVERHEAD_MAX (which the test holds to it), the bound under which
# transfers.write_transfer writes a one-frame delivery without a trial encoding.
TRANSFER_OVERHEAD_MAX: Final = 38
# How a transfer's and a disposition's body begin in the usual encoding (read by .transfers).
_TRANSFER_HEAD: Final = b"\x00\x53\x14"
_DISPOSITION_HEAD: Final = b"\x00\x53\x15"
#: The outcomes ``settle`` takes and ``Outcome`` reports.
OUTCOMES: Final = ("accepted", "rejected", "released", "modified")
_REJECTED_CONDITION: Final = "amqp:internal-error"


@dataclass(frozen=True, slots=True)
class ClientParams:
    container_id: str
    hostname: str | None = None  # the open's hostname (the remote's virtual host where brokers use it)
    username: str | None = None  # SASL PLAIN with username / password; None: SASL ANONYMOUS
    password: str | None = None
    sasl: bool = True  # False: no SASL layer, straight to the AMQP header
    idle_timeout_s: float = 60.0  # ours, sent in the open (as ms); 0: none
    max_frame_size: int = 65536
    connect_timeout: float = 10.0  # from construction until Opened, else Closed


# -- events -----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Opened:
    """The peer's open and its begin (answering ours) have come: links may be attached."""

    container_id: str
    properties: dict[object, object] | None
    max_frame_size: int  # the peer's: what our transfers are cut to


@dataclass(frozen=True, slots=True)
class Attached:
    """The peer's attach answered ours; ``role`` is ours ("sender" / "receiver"). When the peer's
    attach has no terminus (it refuses the link), a :class:`Detached` with its error follows."""

    handle: int
    name: str
    role: str


@dataclass(frozen=True, slots=True)
class Credit:
    """Our sender link's credit changed (a flow from the peer, or a drain given back)."""

    handle: int
    credit: int


@dataclass(frozen=True, slots=True)
class Received:
    """A whole message on our receiver link (its transfer frames joined); unless ``settled`` (the
    sender sent it pre-settled), ``settle(delivery_id, ...)`` it. The link's credit is one less."""

    handle: int
    delivery_id: int
    message: bytes
    settled: bool


@dataclass(frozen=True, slots=True)
class Outcome:
    """The peer's outcome for a delivery we sent unsettled; it is settled on our side now."""

    delivery_id: int
    outcome: str  # one of OUTCOMES
    description: str | None


@dataclass(frozen=True, slots=True)
class Detached:
    """The peer detached the link (answered here); its unsettled deliveries are forgotten."""

    handle: int
    condition: str | None
    description: str | None


@dataclass(frozen=True, slots=True)
class Closed:
    """The connection is over (write out ``data_to_send()`` and close the socket); ``reason`` in
    words for the log, ``condition`` the AMQP error's, if one was sent or received."""

    reason: str
    condition: str | None
    by_peer: bool


Event = Opened | Attached | Credit | Received | Outcome | Detached | Closed


# -- the links --------------------------------------------------------------------------------------


@dataclass(slots=True)
class _Partial:
    """An incoming delivery whose transfer frames have not all come."""

    delivery_id: int
    settled: bool
    chunks: list[bytes] = field(default_factory=list)


@dataclass(eq=False, slots=True)
class _Link:
    handle: int
    name: str
    is_sender: bool
    remote_handle: int | None = None  # the peer's, from its attach
    # Sender: ours, counted from the initial 0 our attach says. Receiver: the sender's as we know it
    # (None until its attach says its initial count).
    delivery_count: int | None = 0
    credit: int = 0
    drain: bool = False  # sender: the peer drains; the rest of the credit is given back
    next_tag: int = 0
    partial: _Partial | None = None


# Delivery states of our dispositions, by outcome (accepted as the bytes transfers writes).
_STATES: dict[str, object] = {
    "accepted": ACCEPTED,
    "released": Released(),
    "modified": Modified(delivery_failed=True),
}

# SASL: its exchange; OPENING: our open and begin sent, the peer's awaited.
_SASL, _OPENING, _OPENED, _CLOSE_SENT, _CLOSED = range(5)


class ClientConnection:
    """One client connection to an AMQP 1.0 peer, with one session (see the module's docstring)."""

    def __init__(self, params: ClientParams, now: float) -> None:
        if params.max_frame_size < MIN_MAX_FRAME_SIZE:
            raise ValueError(f"max_frame_size must be at least {MIN_MAX_FRAME_SIZE}")
        self.params = params
        self._decoder = FrameDecoder(params.max_frame_size)
        self._out = bytearray()
        self._events: deque[Event] = deque()
        self._now = now
        self._started = now
        self._last_recv = now
        self._last_sent = now
        self._close_sent = now
        self._close_error: Error | None = None
        self._eof: str | None = None  # receive_eof's words, once it came ("" for none)
        # The peer's open and begin.
        self._peer_open: Open | None = None
        self._peer_channel: int | None = None
        self.remote_max_frame_size = MIN_MAX_FRAME_SIZE
        self.remote_idle_timeout: float | None = None  # seconds
        # The session (part 2, section 2.5.6): transfer ids count frames, delivery ids deliveries.
        self._next_outgoing_id = 0
        self._remote_incoming_window = 0
        self._next_incoming_id = 0
        self._incoming_window = INCOMING_WINDOW
        self._window_due = False
        self._next_delivery_id = 0
        self._pending: deque[tuple[Transfer, bytes | memoryview]] = deque()  # past the peer's window
        # The links, by our handle and by the peer's.
        self._links: dict[int, _Link] = {}
        self._by_remote: dict[int, _Link] = {}
        self._draining: list[_Link] = []
        # Unsettled deliveries: delivery id -> our link's handle.
        self._unsettled_in: dict[int, int] = {}
        self._unsettled_out: dict[int, int] = {}
        # Dispositions not written yet, coalesced: [role, first, last, key, state].
        self._dispositions: list[list[Any]] = []
        self._header: bytes | None = None  # the protocol header the peer owes us
        if params.sasl:
            self._state = _SASL
            self._header = SASL_HEADER
            self._out += SASL_HEADER
        else:
            self._start_amqp()

    # -- the machine surface ----------------------------------------------------------------------

    @property
    def opened(self) -> bool:
        """The peer's open and begin have come and nobody is closing: links may be attached."""
        return self._state == _OPENED

    @property
    def closed(self) -> bool:
        return self._state == _CLOSED

    def receive_data(self, data: bytes, now: float) -> None:
        """Buffer bytes from the transport; ``next_event()`` parses them."""
        self._now = now
        if self._state == _CLOSED or self._eof is not None or not data:
            return
        self._last_recv = now
        self._decoder.feed(data)

    def receive_eof(self, why: str | None = None) -> None:
        """The stream ended (``why``: the socket's words for it). What was buffered before comes out
        of ``next_event()`` first, then :class:`Closed`."""
        if self._state != _CLOSED and self._eof is None:
            self._eof = why or ""

    def next_event(self) -> Event | None:
        """The next event, parsing one more frame only when none is waiting; None when no whole frame
        is buffered (or once :class:`Closed` has been taken)."""
        events = self._events
        while not events:
            if self._state == _CLOSED:
                return None
            if self._draining:
                self._give_back_drained()
                continue
            if not self._step():
                if self._eof is not None:
                    self._on_eof()
                    continue
                if self._window_due and self._state == _OPENED:
                    self._send_flow()
                return None
        return events.popleft()

    def data_to_send(self) -> bytes:
        """Everything queued for the transport since the last call (may be empty)."""
        if self._dispositions:
            self._write_dispositions()
        if not self._out:
            return b""
        out = bytes(self._out)
        self._out.clear()
        return out

    def next_deadline(self) -> float | None:
        """When ``tick`` must next be called (the caller's clock), or None."""
        state = self._state
        if state == _CLOSED:
            return None
        if state == _CLOSE_SENT:
            return self._close_sent + self.params.connect_timeout
        if state != _OPENED:
            return self._started + self.params.connect_timeout
        deadlines = []
        if self.params.idle_timeout_s:
            deadlines.append(self._last_recv + self.params.idle_timeout_s)
        if self.remote_idle_timeout:
            deadlines.append(self._last_sent + self.remote_idle_timeout / 2)
        return min(deadlines) if deadlines else None

    def tick(self, now: float) -> None:
        """The deadlines: the peer's open, the answer to our close, its silence, our empty frames."""
        self._now = now
        state = self._state
        timeout = self.params.connect_timeout
        if state == _CLOSED:
            return
        if state == _CLOSE_SENT:
            if now >= self._close_sent + timeout:
                self._finish(f"the peer did not answer our close within {timeout:g} s", False)
            return
        if state != _OPENED:
            if now >= self._started + timeout:
                self._finish(f"no open from the peer within {timeout:g} s", False)
            return
        idle = self.params.idle_timeout_s
        if idle and now - self._last_recv >= idle:
            self._fail(RESOURCE_LIMIT_EXCEEDED, f"idle time-out: nothing from the peer for {idle:g} s")
        elif self.remote_idle_timeout and now - self._last_sent >= self.remote_idle_timeout / 2:
            if not self._out and not self._dispositions:
                self._out += EMPTY_FRAME
            self._last_sent = now

    def close(self, now: float, condition: str | None = None, description: str | None = None) -> None:
        """Close the connection (with an error when ``condition`` is given); :class:`Closed` follows
        the peer's close (or the end of the stream, or the deadline)."""
        self._now = now
        state = self._state
        if state in (_CLOSED, _CLOSE_SENT):
            return
        error = None if condition is None else Error(condition=Symbol(condition), description=description)
        if state == _SASL:  # nothing of AMQP said yet: nothing to close
            self._close_error = error
            self._finish("closed", False)
            return
        self._send_close(error)

    # -- links ------------------------------------------------------------------------------------

    def attach_receiver(self, name: str, address: str, *, credit: int) -> int:
        """Attach a link that receives from ``address`` (the peer's source) and give it ``credit``;
        returns our handle. :class:`Attached` follows the peer's answer."""
        link = self._attach(name, False, Source(address=address), Target())
        link.delivery_count = None
        link.credit = credit
        if credit:
            self._send_flow(link)
        return link.handle

    def attach_sender(self, name: str, address: str) -> int:
        """Attach a link that sends to ``address`` (the peer's target); returns our handle. The
        peer's flow gives it credit (:class:`Credit`)."""
        return self._attach(name, True, Source(), Target(address=address)).handle

    def credit(self, handle: int) -> int:
        """Our sender link's credit left: the peer's flows, less what we sent since."""
        return self._link(handle, True).credit

    def flow(self, handle: int, credit: int) -> None:
        """Set our receiver link's credit to ``credit`` (not added to what is left) and say so."""
        if credit < 0 or credit > SERIAL_MASK:
            raise ValueError(f"credit {credit} is not a uint")
        link = self._link(handle, False)
        link.credit = credit
        self._send_flow(link)

    def send(self, handle: int, message: bytes, *, settled: bool = False) -> int:
        """Send one delivery (``message``: the encoded message sections) on our sender link, cut into
        frames of the peer's max-frame-size; returns its delivery id. Unsettled, its
        :class:`Outcome` follows. Needs ``credit(handle) > 0``."""
        link = self._link(handle, True)
        if link.credit <= 0:
            raise ValueError(f"link {link.name!r} has no credit")
        delivery_id = self._next_delivery_id
        self._next_delivery_id = (delivery_id + 1) & SERIAL_MASK
        n = link.next_tag
        link.next_tag = (n + 1) & SERIAL_MASK
        tag = n.to_bytes(max(1, (n.bit_length() + 7) // 8), "big")
        assert link.delivery_count is not None  # a sender's is ours, from 0
        link.delivery_count = (link.delivery_count + 1) & SERIAL_MASK
        link.credit -= 1
        if not settled:
            self._unsettled_out[delivery_id] = handle
        payload = bytes(message)
        size = len(payload)
        limit = self.remote_max_frame_size - 8
        if (
            not self._pending
            and self._remote_incoming_window > 0
            and size + len(tag) + TRANSFER_OVERHEAD_MAX <= limit
        ):
            # One frame, and the peer's window is open: written now, without a Transfer.
            if self._dispositions:
                self._write_dispositions()
            write_transfer(self._out, 0, handle, delivery_id, tag, 0, settled, payload, len(tag), size)
            self._next_outgoing_id = (self._next_outgoing_id + 1) & SERIAL_MASK
            self._remote_incoming_window -= 1
            self._last_sent = self._now
            return delivery_id
        first = Transfer(
            handle=handle, delivery_id=delivery_id, delivery_tag=tag, message_format=0, settled=settled
        )
        if performative_size(first) + size <= limit:
            self._pending.append((first, payload))
        else:
            view = memoryview(payload)
            first = replace(first, more=True)
            step = limit - performative_size(first)
            self._pending.append((first, view[:step]))
            pos = step
            more = Transfer(handle=handle, more=True)
            step = limit - performative_size(more)
            while pos < size:
                chunk = view[pos : pos + step]
                pos += step
                self._pending.append((more if pos < size else Transfer(handle=handle), chunk))
        self._flush_pending()
        return delivery_id

    def settle(
        self,
        delivery_id: int,
        outcome: str = "accepted",
        *,
        description: str | None = None,
        condition: str | None = None,
    ) -> None:
        """Settle a delivery received unsettled with ``outcome`` (one of :data:`OUTCOMES`; rejected
        carries an error: ``condition``, by default amqp:internal-error, and ``description``;
        modified says delivery-failed). A delivery already settled (pre-settled by the sender, or
        its link gone) needs nothing. Consecutive deliveries of one outcome share a disposition."""
        if outcome not in OUTCOMES:
            raise ValueError(f"outcome {outcome!r} is not one of {OUTCOMES}")
        if self._unsettled_in.pop(delivery_id, None) is None or self._state != _OPENED:
            return
        if outcome == "rejected":
            key: object = ("rejected", condition, description)
            error = Error(condition=Symbol(condition or _REJECTED_CONDITION), description=description)
            state: object = Rejected(error=error)
        else:
            key = outcome
            state = _STATES[outcome]
        self._dispose(ROLE_RECEIVER, delivery_id, key, state)

    # -- inside: input ----------------------------------------------------------------------------

    def _step(self) -> bool:
        """Parse one header or frame and act on it; False when nothing whole is buffered."""
        decoder = self._decoder
        state = self._state
        try:
            if self._header is not None:  # (also after our close: the peer's header comes first)
                header = decoder.next_header()
                if isinstance(header, _NeedData):
                    return False
                self._on_header(header)
                return True
            frame = decoder.next_frame()
            if isinstance(frame, _NeedData):
                return False
            if state == _SASL:
                self._on_sasl(frame)
            else:
                self._on_frame(frame)
        except FramingError as exc:
            self._fail(FRAMING_ERROR, str(exc))
        except DecodeError as bad:
            self._fail(Symbol(bad.condition), str(bad))
        except Exception as bug:  # a bug of ours must not escape into the caller's I/O loop
            self._fail(INTERNAL_ERROR, f"{type(bug).__name__}: {bug}")
        return True

    def _on_header(self, header: bytes) -> None:
        expected = self._header
        self._header = None
        if header != expected:
            self._finish(f"the peer answered protocol header {expected!r} with {header!r}", True)

    def _on_sasl(self, frame: Frame) -> None:
        if frame.type != FRAME_SASL or frame.is_empty:
            self._finish("the peer sent an AMQP frame during SASL", False)
            return
        perf, _ = frame.performative()
        params = self.params
        if isinstance(perf, SaslMechanisms):
            offered = [str(m) for m in perf.sasl_server_mechanisms]
            mechanism = ANONYMOUS if params.username is None else PLAIN
            if mechanism not in offered:
                self._finish(f"the peer offers SASL {', '.join(offered)}, not {mechanism}", False)
                return
            if mechanism == PLAIN:
                username = (params.username or "").encode()
                response = b"\x00" + username + b"\x00" + (params.password or "").encode()
            else:
                response = b""
            init = SaslInit(mechanism=Symbol(mechanism), initial_response=response, hostname=params.hostname)
            encode_frame(FRAME_SASL, 0, init, out=self._out)
            self._last_sent = self._now
        elif isinstance(perf, SaslOutcome):
            if perf.code != SaslCode.OK:
                self._finish(f"authentication failed (code {perf.code})", True)
                return
            self._start_amqp()
        elif isinstance(perf, SaslChallenge):
            self._finish("the peer sent a SASL challenge, which PLAIN and ANONYMOUS never need", False)
        else:
            self._finish(f"the peer sent {perf.NAME}, which a SASL server never sends", False)

    def _on_frame(self, frame: Frame) -> None:
        if frame.type != FRAME_AMQP:
            self._fail(FRAMING_ERROR, f"unexpected frame type {frame.type}")
            return
        body = frame.body
        if not body:
            return  # an empty frame: the peer is alive
        state = self._state
        channel = frame.channel
        if state == _OPENED and channel == self._peer_channel:
            # The frames that carry messages, read without the generic codec when they can be.
            head = body[:3]
            if head == _TRANSFER_HEAD:
                fields = read_transfer(body)
                if fields is not None:
                    handle, did, _tag, _fmt, settled, more, aborted, start = fields
                    self._on_transfer(handle, did, settled, more, aborted, body[start:])
                    return
            elif head == _DISPOSITION_HEAD:
                d = read_disposition(body)
                if d is not None:
                    role, first, last, settled, accepted = d
                    self._on_disposition(role, first, last, settled, Accepted() if accepted else None)
                    return
        perf, payload = frame.performative()
        if state == _CLOSE_SENT:
            if isinstance(perf, Close):
                self._finish("closed", False)
            return  # after our close, nothing else matters
        if isinstance(perf, Close):
            if state in (_OPENING, _OPENED):
                self._send(Close())
            error = perf.error
            self._close_error = error
            words = "" if error is None else f": {error.condition} {error.description or ''}".rstrip()
            self._finish(f"the peer closed the connection{words}", True)
            return
        if isinstance(perf, Open):
            if self._peer_open is not None:
                self._fail(ILLEGAL_STATE, "a second open")
            else:
                self._on_open(perf)
            return
        if self._peer_open is None:
            self._fail(ILLEGAL_STATE, f"expected open, got {perf.NAME}")
            return
        if isinstance(perf, Begin):
            self._on_begin(channel, perf)
            return
        if self._peer_channel is None or channel != self._peer_channel:
            self._fail(FRAMING_ERROR, f"{perf.NAME} on channel {channel}, where no session is")
            return
        if isinstance(perf, End):
            self._send(End())
            self._send(Close())
            error = perf.error
            self._close_error = error
            words = "" if error is None else f": {error.condition} {error.description or ''}".rstrip()
            self._finish(f"the peer ended the session{words}", True)
        elif isinstance(perf, Transfer):
            self._on_transfer(perf.handle, perf.delivery_id, perf.settled, perf.more, perf.aborted, payload)
        elif isinstance(perf, Disposition):
            self._on_disposition(perf.role, perf.first, perf.last, perf.settled, perf.state)
        elif isinstance(perf, Flow):
            self._on_flow(perf)
        elif isinstance(perf, Attach):
            self._on_attach(perf)
        elif isinstance(perf, Detach):
            self._on_detach(perf)
        else:
            self._fail(FRAMING_ERROR, f"{perf.NAME} is not a frame body")

    def _on_open(self, o: Open) -> None:
        if o.max_frame_size < MIN_MAX_FRAME_SIZE:
            self._fail(INVALID_FIELD, f"max-frame-size {o.max_frame_size} is below {MIN_MAX_FRAME_SIZE}")
            return
        self._peer_open = o
        self.remote_max_frame_size = o.max_frame_size
        self.remote_idle_timeout = o.idle_time_out / 1000 if o.idle_time_out else None

    def _on_begin(self, channel: int, b: Begin) -> None:
        if self._peer_channel is not None:
            self._fail(ILLEGAL_STATE, "a second begin")
            return
        if b.remote_channel != 0:
            self._fail(NOT_ALLOWED, "a begin that answers no session of ours")
            return
        self._peer_channel = channel
        self._next_incoming_id = b.next_outgoing_id
        self._remote_incoming_window = b.incoming_window
        self._state = _OPENED
        self._last_recv = self._now
        peer = self._peer_open
        assert peer is not None
        self._events.append(Opened(peer.container_id, peer.properties, peer.max_frame_size))

    def _on_attach(self, a: Attach) -> None:
        link = None
        for candidate in self._links.values():
            if candidate.name == a.name and candidate.remote_handle is None:
                link = candidate
                break
        if link is None or a.role is (ROLE_SENDER if link.is_sender else ROLE_RECEIVER):
            self._fail(NOT_ALLOWED, f"the peer attached link {a.name!r}, which this client did not ask for")
            return
        if a.handle in self._by_remote:
            self._fail(NOT_ALLOWED, f"handle {a.handle} is in use")  # (one session: end means close)
            return
        link.remote_handle = a.handle
        self._by_remote[a.handle] = link
        if not link.is_sender:
            link.delivery_count = a.initial_delivery_count or 0
        self._events.append(Attached(link.handle, link.name, "sender" if link.is_sender else "receiver"))
        # A refusal (a null terminus where ours named an address) is followed by the peer's detach.

    def _on_detach(self, d: Detach) -> None:
        link = self._by_remote.pop(d.handle, None)
        if link is None:
            self._fail(UNATTACHED_HANDLE, f"detach of handle {d.handle}, which is not attached")
            return
        self._send(Detach(handle=link.handle, closed=d.closed))
        del self._links[link.handle]
        if link in self._draining:
            self._draining.remove(link)
        handle = link.handle
        if self._pending:
            kept = [(t, chunk) for t, chunk in self._pending if t.handle != handle]
            self._pending.clear()
            self._pending.extend(kept)
        for table in (self._unsettled_in, self._unsettled_out):
            for i in [i for i, h in table.items() if h == handle]:
                del table[i]
        error = d.error
        if error is None:
            self._events.append(Detached(handle, None, None))
        else:
            self._events.append(Detached(handle, str(error.condition), error.description))

    def _on_flow(self, f: Flow) -> None:
        # The peer's window (section 2.5.6): it takes frames up to its next-incoming-id (or our
        # initial next-outgoing-id, 0, before it saw our begin) plus its incoming-window.
        next_in = 0 if f.next_incoming_id is None else f.next_incoming_id
        window = serial_diff(serial_add(next_in, f.incoming_window), self._next_outgoing_id)
        self._remote_incoming_window = max(window, 0)
        if f.handle is not None:
            link = self._by_remote.get(f.handle)
            if link is None:
                self._fail(UNATTACHED_HANDLE, f"flow for handle {f.handle}, which is not attached")
                return
            if link.is_sender:
                if f.link_credit is not None:
                    # Section 2.6.7: credit = the receiver's delivery-count + link-credit - ours.
                    theirs = 0 if f.delivery_count is None else f.delivery_count
                    assert link.delivery_count is not None
                    credit = max(serial_diff(serial_add(theirs, f.link_credit), link.delivery_count), 0)
                    link.drain = f.drain and credit > 0
                    if link.drain and link not in self._draining:
                        self._draining.append(link)
                    if credit != link.credit or link.drain:  # a drain: the caller's turn to send
                        link.credit = credit
                        self._events.append(Credit(link.handle, credit))
            elif f.delivery_count is not None:
                # The sender's count moved (a drain): the credit limit stays where we set it.
                known = f.delivery_count if link.delivery_count is None else link.delivery_count
                limit = serial_add(known, link.credit)
                link.delivery_count = f.delivery_count
                link.credit = max(serial_diff(limit, f.delivery_count), 0)
            if f.echo:
                self._send_flow(link)
        elif f.echo:
            self._send_flow()
        self._flush_pending()

    def _on_transfer(
        self,
        handle: int,
        delivery_id: int | None,
        settled: bool | None,
        more: bool,
        aborted: bool,
        payload: bytes | memoryview,
    ) -> None:
        # The session window, counted per frame; opened again once half is used.
        self._next_incoming_id = (self._next_incoming_id + 1) & SERIAL_MASK
        if self._incoming_window > 0:
            self._incoming_window -= 1
        if self._incoming_window <= INCOMING_WINDOW // 2:
            self._window_due = True
        link = self._by_remote.get(handle)
        if link is None:
            self._fail(UNATTACHED_HANDLE, f"transfer on handle {handle}, which is not attached")
            return
        if link.is_sender:
            self._fail(NOT_ALLOWED, f"transfer to our sending end of link {link.name!r}")
            return
        partial = link.partial
        if partial is None:
            if delivery_id is None:
                self._fail(INVALID_FIELD, "the first transfer of a delivery has no delivery-id")
                return
            # The link's credit (section 2.6.7): one delivery taken.
            if link.credit > 0:
                link.credit -= 1
            if link.delivery_count is not None:
                link.delivery_count = (link.delivery_count + 1) & SERIAL_MASK
            if not more and not aborted:  # the usual: a delivery in one frame
                if not settled:
                    self._unsettled_in[delivery_id] = link.handle
                self._events.append(Received(link.handle, delivery_id, bytes(payload), bool(settled)))
                return
            partial = link.partial = _Partial(delivery_id, bool(settled))
        if settled:
            partial.settled = True
        if aborted:  # the sender gave it up: nothing of it is handed out
            link.partial = None
            return
        if payload:
            partial.chunks.append(bytes(payload))
        if more:
            return
        link.partial = None
        if not partial.settled:
            self._unsettled_in[partial.delivery_id] = link.handle
        message = b"".join(partial.chunks)
        self._events.append(Received(link.handle, partial.delivery_id, message, partial.settled))

    def _on_disposition(
        self, role: bool, first: int, last: int | None, settled: bool, state: Composite | None
    ) -> None:
        if role is not ROLE_RECEIVER:
            return  # the peer as a sender: we settle what we receive at once, nothing to learn
        outcome, description = _outcome(state, settled)
        if outcome is None:
            return  # no outcome yet (received, or unsettled without a state)
        if last is None:
            last = first
        table = self._unsettled_out
        span = (last - first) & SERIAL_MASK
        if span < len(table):
            ids = [i for i in (serial_add(first, k) for k in range(span + 1)) if i in table]
        else:  # a range wider than what is unsettled: walk the table instead
            offsets = sorted((i - first) & SERIAL_MASK for i in table)
            ids = [serial_add(first, k) for k in offsets if k <= span]
        events = self._events
        for i in ids:
            del table[i]
            events.append(Outcome(i, outcome, description))
        if not settled and ids:
            # Settle on our side too (the peer's rcv-settle-mode second): the same range, settled.
            self._dispose(ROLE_SENDER, first, None, None, last)

    def _on_eof(self) -> None:
        why = self._eof
        if self._state == _CLOSE_SENT:
            self._finish("closed", False)
        else:
            self._finish(why or "the peer closed the connection without a close frame", True)

    # -- inside: output ---------------------------------------------------------------------------

    def _start_amqp(self) -> None:
        """The AMQP header, our open and our begin, pipelined."""
        params = self.params
        self._out += AMQP_HEADER
        idle_ms = round(params.idle_timeout_s * 1000) if params.idle_timeout_s else None
        self._send(
            Open(
                container_id=params.container_id,
                hostname=params.hostname,
                max_frame_size=params.max_frame_size,
                channel_max=0,
                idle_time_out=idle_ms,
            )
        )
        self._send(
            Begin(
                next_outgoing_id=self._next_outgoing_id,
                incoming_window=INCOMING_WINDOW,
                outgoing_window=OUTGOING_WINDOW,
            )
        )
        self._header = AMQP_HEADER
        self._state = _OPENING

    def _send(self, perf: Composite, payload: bytes | memoryview = b"") -> None:
        if self._dispositions:
            self._write_dispositions()
        encode_frame(FRAME_AMQP, 0, perf, payload, out=self._out)
        self._last_sent = self._now

    def _send_close(self, error: Error | None) -> None:
        self._send(Close(error=error))
        self._close_error = error
        self._state = _CLOSE_SENT
        self._close_sent = self._now
        self._pending.clear()

    def _send_flow(self, link: _Link | None = None) -> None:
        self._incoming_window = INCOMING_WINDOW
        self._window_due = False
        flow = Flow(
            next_incoming_id=self._next_incoming_id,
            incoming_window=INCOMING_WINDOW,
            next_outgoing_id=self._next_outgoing_id,
            outgoing_window=OUTGOING_WINDOW,
        )
        if link is not None:
            flow = replace(
                flow,
                handle=link.handle,
                delivery_count=link.delivery_count,  # a receiver's None before the sender's attach
                link_credit=link.credit,
                drain=link.drain,
            )
        self._send(flow)

    def _attach(self, name: str, is_sender: bool, source: Source, target: Target) -> _Link:
        if self._state != _OPENED:
            raise ValueError("the connection is not open")
        if any(link.name == name for link in self._links.values()):
            raise ValueError(f"a link named {name!r} is attached already")
        handle = 0
        while handle in self._links:
            handle += 1
        link = _Link(handle, name, is_sender)
        self._links[handle] = link
        self._send(
            Attach(
                name=name,
                handle=handle,
                role=ROLE_SENDER if is_sender else ROLE_RECEIVER,
                snd_settle_mode=SND_UNSETTLED,
                rcv_settle_mode=RCV_FIRST,
                source=source,
                target=target,
                initial_delivery_count=0 if is_sender else None,
            )
        )
        return link

    def _link(self, handle: int, is_sender: bool) -> _Link:
        link = self._links.get(handle)
        if link is None or link.is_sender is not is_sender:
            kind = "sender" if is_sender else "receiver"
            raise ValueError(f"handle {handle} is not an attached {kind} link")
        if self._state != _OPENED:
            raise ValueError("the connection is not open")
        return link

    def _flush_pending(self) -> None:
        """Transfer frames that waited for the peer's window, as far as it is open now."""
        pending = self._pending
        while pending and self._remote_incoming_window > 0:
            transfer, chunk = pending.popleft()
            self._send(transfer, chunk)
            self._next_outgoing_id = (self._next_outgoing_id + 1) & SERIAL_MASK
            self._remote_incoming_window -= 1

    def _give_back_drained(self) -> None:
        """The peer drains our sender links and the caller has sent what it had: the credit left
        is used up (delivery-count advanced), and the peer told."""
        draining = self._draining
        self._draining = []
        for link in draining:
            if not link.drain or self._state != _OPENED:
                continue
            assert link.delivery_count is not None
            link.delivery_count = serial_add(link.delivery_count, link.credit)
            had = link.credit
            link.credit = 0
            self._send_flow(link)
            link.drain = False
            if had:
                self._events.append(Credit(link.handle, 0))

    def _dispose(self, role: bool, first: int, key: object, state: object, last: int | None = None) -> None:
        """A disposition (settled) for ``first`` (to ``last``), joined to the one before when it
        continues it with the same outcome."""
        if last is None:
            last = first
            pending = self._dispositions
            if pending:
                prev = pending[-1]
                if prev[0] is role and prev[3] == key:
                    if first == serial_add(prev[2], 1):
                        prev[2] = first
                        return
                    if last == (prev[1] - 1) & SERIAL_MASK:
                        prev[1] = first
                        return
        self._dispositions.append([role, first, last, key, state])

    def _write_dispositions(self) -> None:
        out = self._out
        for role, first, last, _key, state in self._dispositions:
            write_disposition(out, 0, role, first, last, True, state)
        self._dispositions.clear()
        self._last_sent = self._now

    # -- inside: endings --------------------------------------------------------------------------

    def _fail(self, condition: Symbol, description: str) -> None:
        """Close because of the peer: say why in our close, when an open of ours is out."""
        if self._state == _CLOSED:
            return
        error = Error(condition=condition, description=description)
        if self._state in (_OPENING, _OPENED):
            self._send(Close(error=error))
        self._close_error = error
        self._finish(description, False)

    def _finish(self, reason: str, by_peer: bool) -> None:
        if self._state == _CLOSED:
            return
        self._state = _CLOSED
        self._pending.clear()
        self._draining = []
        error = self._close_error
        self._events.append(Closed(reason, None if error is None else str(error.condition), by_peer))


def _outcome(state: Composite | None, settled: bool) -> tuple[str | None, str | None]:
    """Our outcome's name and words for a delivery state of the peer's disposition; None when it is
    none yet."""
    if isinstance(state, Accepted):
        return "accepted", None
    if isinstance(state, Rejected):
        error = state.error
        if error is None:
            return "rejected", None
        if error.description:
            return "rejected", f"{error.condition}: {error.description}"
        return "rejected", str(error.condition)
    if isinstance(state, Released):
        return "released", None
    if isinstance(state, Modified):
        return "modified", None
    if settled:  # settled without an outcome: not taken, as far as we know
        return "released", "settled without an outcome"
    return None, None
