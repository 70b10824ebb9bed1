"""One AMQP 1.0 connection on the connection runtime: its machine, its links, and the queue
publishes waiting for their commit.

This is the runtime's ``Hull`` for AMQP 1.0. The runtime feeds the machine and hands each event to
``handle`` (the front end's "events <-> deck" code) before the machine reads the next frame; what
the machine queues for the peer is written once per loop iteration. Calls on the machine made
outside an event (a delivery from a queue or the router, a commit completing, a kick) end with
``io.wake()`` (bytes only) or ``io.pump()`` (the call may have produced events).

Dispositions of queue publishes leave in arrival order after the commit: each publish is a
:class:`PendingSettle`; the commit callback marks it done and, once per batch of callbacks, the
done ones at the head are settled (consecutive accepted deliveries of a link as one range). A
pre-settled publish has no disposition to wait for its turn: its link's one
:class:`SettledPublishes` callback only gives its unit of credit back.
While publishes wait, the machine holds back a detach, end or close read behind them, so their
dispositions reach the peer before the link, session or connection goes, however the bytes were
cut.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from functools import partial
from typing import TYPE_CHECKING, Any

from trimaran.amqp1.connection import ServerConnection
from trimaran.amqp1.events import MessageReceived
from trimaran.amqp1.performatives import CONNECTION_FORCED, ROLE_RECEIVER, Accepted, Error, Rejected
from trimaran.amqp1.session import Link, LinkState
from trimaran.runtime.confirms import InOrder
from trimaran.runtime.transport import Conn, Hull

ATTACHED = LinkState.ATTACHED
ACCEPTED = Accepted()  # it has no fields: one serves every disposition

if TYPE_CHECKING:
    from trimaran.amqp1.links import InLink, OutLink
    from trimaran.amqp1.ports import FrontEnd
    from trimaran.broker.clients import ClientInfo
    from trimaran.queue.policy import QueueError
    from trimaran.security.guard import Principal


class PendingSettle:
    """One queue publish waiting for its commit; its disposition leaves in arrival order. Made as
    the publish is handed on, and the queue's commit callback for it (called with the publish's
    result and its error, on the loop)."""

    __slots__ = ("conn", "delivery_id", "done", "error", "inlink", "queue", "settled")

    def __init__(self, conn: Amqp1Conn, inlink: InLink, delivery_id: int, settled: bool, queue: str) -> None:
        self.conn = conn
        self.inlink = inlink
        self.delivery_id = delivery_id
        self.settled = settled  # pre-settled: no disposition, but the credit comes back
        self.queue = queue
        self.done = False
        self.error: Error | None = None
        inlink.inflight += 1
        conn.pending.add(self)
        # A detach, end or close read behind this publish waits for its disposition.
        conn.amqp.hold_closing = True

    def __call__(self, _result: object, error: QueueError | None) -> None:
        """The publish is committed, or failed with ``error``. Commit callbacks of one batch run
        back to back: the dispositions go once, after the last of them."""
        conn = self.conn
        if error is not None:
            self.error = conn.front.publish_failed(conn, self.queue, error)
        self.done = True
        if not conn._ack_scheduled and conn.pending.head_done():
            conn._ack_scheduled = True
            asyncio.get_running_loop().call_soon(conn._acknowledge)


class SettledPublishes:
    """The commit callback of one sending link's pre-settled queue publishes (made at attach, one
    for all of them). Nobody hears their outcome, so nothing waits for them in arrival order and
    nothing holds a detach back for them: a publish only holds a unit of the link's window until
    it is committed (at once for an in-memory queue), and a failed one is logged."""

    __slots__ = ("conn", "inlink", "queue")

    def __init__(self, conn: Amqp1Conn, inlink: InLink, queue: str) -> None:
        self.conn = conn
        self.inlink = inlink
        self.queue = queue

    def __call__(self, _result: object, error: QueueError | None) -> None:
        conn = self.conn
        inlink = self.inlink
        inlink.inflight -= 1
        if error is not None:
            conn.front.publish_failed(conn, self.queue, error)
        conn.refill(inlink)


class Amqp1Conn(Hull):
    """The per-connection state the front end acts on; implements the runtime's ``Hull``."""

    __slots__ = (
        "_ack_scheduled",
        "amqp",
        "client",
        "container_id",
        "front",
        "inlinks",
        "io",
        "link_credit",
        "outlinks",
        "peer",
        "pending",
        "principal",
        "publishing_blocked",
        "user",
        "vhost_prefix",
    )

    def __init__(self, front: FrontEnd, io: Conn, machine: ServerConnection, link_credit: int) -> None:
        self.front = front
        self.io = io
        self.machine = machine  # the runtime drives it as a Machine; the front end, as itself:
        self.amqp = machine
        self.peer = io.peer
        self.link_credit = link_credit  # the window of publishes a sending link may have open
        self.container_id = "?"
        self.user: str | None = None
        self.principal: Principal | None = None  # who logged in: what the rules let it do
        self.client: ClientInfo | None = None
        self.outlinks: dict[Link, OutLink] = {}
        self.inlinks: dict[Link, InLink] = {}
        self.pending: InOrder[PendingSettle] = InOrder()  # dispositions, in arrival order
        self.publishing_blocked = False  # memory above the high-water mark: no new link credit
        self._ack_scheduled = False
        self.vhost_prefix = ""  # its vhost's key prefix (trimaran/vhosts.py), set at open

    # -- the runtime's Hull ---------------------------------------------------------------------

    def handle(self, event: object) -> Awaitable[None] | None:
        if event.__class__ is MessageReceived:  # most events are: one call less each
            self.front.message(self, event)
            return None
        return self.front.dispatch(self, event)

    def before_write(self) -> None:
        """Dispositions are queued as their commits complete: nothing gathers."""

    def written(self) -> None:
        """Nothing to do after a write: bytes are counted by the runtime."""

    def shutdown(self) -> None:
        self.amqp.close(Error(condition=CONNECTION_FORCED, description="server shutting down"))

    def behind(self) -> int | None:
        """Nothing waits for the peer beyond its socket: a queue's backlog is the queue's."""
        return None

    def stalled(self, idle_s: float) -> None:
        """Never asked: ``behind`` is always None."""

    def blocked(self, on: bool, why: str) -> None:
        """No new link credit while an alarm is raised (what the peer was granted still comes)."""
        self.publishing_blocked = on
        if not on:
            for inlink in list(self.inlinks.values()):
                self.refill(inlink)

    def finish(self) -> Callable[[], Coroutine[Any, Any, None]]:
        return partial(self.front.finished, self)

    # -- calls from outside an event ----------------------------------------------------------

    def close(self, error: Error) -> None:
        """Server-initiated close (a kick): close frame after what is queued, then the socket."""
        self.amqp.close(error)
        self.io.pump()

    # -- publishes waiting for their commit ---------------------------------------------------

    def _acknowledge(self) -> None:
        self._ack_scheduled = False
        try:
            self.acknowledge_in_order()
        except Exception as exc:
            self.io.crash(exc)
            return
        if self.pending:
            self.io.wake()
        else:
            self.amqp.hold_closing = False
            self.io.pump()  # a detach, end or close that waited for these dispositions

    def acknowledge_in_order(self) -> None:
        """Dispositions for the committed publishes at the head, in arrival order: a run of
        consecutive accepted deliveries of one link goes as one ranged disposition."""
        pending = self.pending
        amqp = self.amqp
        run_link: Link | None = None
        run_first = run_last = 0
        refill: dict[InLink, None] = {}
        closed = amqp.closed  # settling does not close: asked once, not per publish
        for item in pending.ready():
            inlink = item.inlink
            inlink.inflight -= 1
            link = inlink.link
            if closed or link.state is not ATTACHED:
                continue
            refill[inlink] = None
            if item.settled:
                continue
            did = item.delivery_id
            if item.error is None:
                if run_link is link and did == run_last + 1:
                    run_last = did
                    continue
                if run_link is not None and run_link.state is ATTACHED:
                    amqp.settle_range(run_link.session, ROLE_RECEIVER, run_first, run_last, ACCEPTED)
                run_link, run_first, run_last = link, did, did
            else:
                if run_link is not None and run_link.state is ATTACHED:
                    amqp.settle_range(run_link.session, ROLE_RECEIVER, run_first, run_last, ACCEPTED)
                run_link = None
                amqp.settle(link, did, Rejected(error=item.error))
        if run_link is not None and run_link.state is ATTACHED and not closed:
            amqp.settle_range(run_link.session, ROLE_RECEIVER, run_first, run_last, ACCEPTED)
        if closed:
            return
        for inlink in refill:
            self.refill(inlink)

    def refill(self, inlink: InLink) -> None:
        """Top the sending peer's credit up to the window less the publishes still in flight,
        in steps of half the window; none while memory is above the high-water mark, or while a
        queue the link feeds is behind (``InLink.held``)."""
        link = inlink.link
        if link.state is not ATTACHED or self.publishing_blocked or inlink.holds:
            return
        window = self.link_credit
        room = window - inlink.inflight
        credit = link.link_credit
        if room > 0 and (room - credit >= window // 2 or credit == 0):
            self.amqp.grant_credit(link, room)
            self.io.wake()
