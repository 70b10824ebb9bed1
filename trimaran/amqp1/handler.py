"""The AMQP 1.0 front end: the machine's events <-> the router and the queues.

Each connection is an :class:`~trimaran.amqp1.conn.Amqp1Conn` on the connection runtime, which
hands the machine's events here one at a time, in the order their frames arrived (a transfer is
routed before the detach, end or close read behind it). Queue publishes are handed to the group
commit without a task or an await per message; their dispositions leave in arrival order after
the commit (see :mod:`trimaran.amqp1.conn`). The link credit of a sending peer is bounded by the
publishes still waiting, and no new credit is granted while memory is above the high-water mark.

The JMS side: a receiver's selector (:mod:`trimaran.amqp1.selection`), local transactions through
the coordinator link (:mod:`trimaran.amqp1.coordinator`, committed by ``QueueManager.transact``)
and durable and shared topic subscriptions backed by queues (:mod:`trimaran.amqp1.subscribers`):
the front end owns one of each and calls them from its attach, transfer and disposition plumbing.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any, Final

import anyio
import anyio.to_thread

from trimaran.amqp1.addresses import QUEUE, Address, AddressError, resolve
from trimaran.amqp1.conn import Amqp1Conn, PendingSettle, SettledPublishes
from trimaran.amqp1.connection import ServerConnection
from trimaran.amqp1.coordinator import TransactionCoordinator
from trimaran.amqp1.events import (
    ConnectionClosed,
    ConnectionOpened,
    DispositionReceived,
    Event,
    FlowReceived,
    LinkAttached,
    LinkDetached,
    MessageReceived,
    SaslAuthRequested,
    TransferAborted,
)
from trimaran.amqp1.links import (
    InLink,
    OutLink,
    QueueBrowse,
    QueueOut,
    SelectedTopicOut,
    TopicOut,
)
from trimaran.amqp1.mapping import from_amqp1, from_wire, to_amqp1
from trimaran.amqp1.messages import Message as A1Message
from trimaran.amqp1.messages import decode_message
from trimaran.amqp1.performatives import (
    CONNECTION_FORCED,
    DECODE_ERROR,
    INTERNAL_ERROR,
    INVALID_FIELD,
    NOT_FOUND,
    NOT_IMPLEMENTED,
    RCV_FIRST,
    RESOURCE_LIMIT_EXCEEDED,
    RESOURCE_LOCKED,
    ROLE_RECEIVER,
    ROLE_SENDER,
    SND_SETTLED,
    UNAUTHORIZED_ACCESS,
    Accepted,
    Coordinator,
    Error,
    Rejected,
    Source,
    Target,
    TransactionalState,
)
from trimaran.amqp1.selection import find_selector, parse_selector, selecting
from trimaran.amqp1.session import Link, LinkState
from trimaran.amqp1.subscribers import Subscribers
from trimaran.amqp1.subscriptions import (
    EXPIRY_NEVER,
    SHARED,
)
from trimaran.amqp1.types import DecodeError, Symbol, Timestamp
from trimaran.broker.clients import ClientInfo
from trimaran.broker.core import Broker
from trimaran.broker.events import (
    CLIENT_AUTH_FAILED,
    MESSAGE_DROPPED,
    SUBSCRIPTION_CREATED,
    SUBSCRIPTION_REMOVED,
)
from trimaran.broker.message import PROTOCOL_AMQP1, Message
from trimaran.broker.router import SubscriptionOptions
from trimaran.config import Settings
from trimaran.queue.groups import Selects
from trimaran.queue.manager import QueueManager
from trimaran.queue.policy import QueueError
from trimaran.runtime.transport import Conn
from trimaran.security.guard import (
    AMQ_TOPIC,
    CONFIGURE,
    EXCHANGE,
    READ,
    WRITE,
    Login,
    Principal,
    Security,
    on_login,
    publish_resource,
    queue_of,
)
from trimaran.security.guard import QUEUE as QUEUE_RESOURCE
from trimaran.selector import SelectorError
from trimaran.vhosts import DEFAULT_VHOST, describe, prefix

log = logging.getLogger(__name__)

START_PROPERTIES: Final = ("stream-offset", "stream-start")
COPY: Final = Symbol("copy")
SELECTOR_MEMORY: Final = 10_000  # verdicts a queue consumer's selector keeps (a take scans as many)
MOVE: Final = Symbol("move")


class Amqp1FrontEnd:
    def __init__(
        self,
        broker: Broker,
        settings: Settings,
        queues: QueueManager | None = None,
        security: Security | None = None,
    ) -> None:
        self.broker = broker
        self.settings = settings
        self.config = settings.amqp1
        self.queues = queues
        self.security = security if security is not None else Security(settings.auth)
        self.security.on_reload(self._recheck_all)
        self.container_id = self.config.container_id or settings.node_name
        self.outbox_size = self.config.outbox_size
        self.connections: set[Amqp1Conn] = set()
        self.coordinator = TransactionCoordinator(self, self.config.link_credit)
        self.subscribers = Subscribers(self)  # durable and shared topic subscriptions
        self._drained: anyio.Event | None = None
        self._encoded: tuple[Message | None, bytes] = (None, b"")

    def encode_once(self, message: Message, cut: int = 0) -> bytes:
        """A topic message is encoded once for all its AMQP 1.0 subscribers (one vhost: one ``cut``)."""
        last, payload = self._encoded
        if last is not message:
            payload = to_amqp1(message, cut=cut)
            self._encoded = (message, payload)
        return payload

    # -- lifecycle --------------------------------------------------------------------------------

    def open(self, io: Conn) -> Amqp1Conn:
        """A new connection on the AMQP port (the port feeds it the header it read and the rest)."""
        cfg = self.config
        anonymous = self.security.anonymous_allowed(io.peer_host)
        mechanisms = ["PLAIN", "ANONYMOUS"] if anonymous else ["PLAIN"]
        if io.peer_certificate() is not None:
            mechanisms.insert(0, "EXTERNAL")  # TLS with a client certificate: SASL EXTERNAL
        machine = ServerConnection(
            self.container_id,
            sasl_mechanisms=mechanisms,
            require_sasl=not anonymous,
            max_frame_size=cfg.max_frame_size,
            channel_max=cfg.channel_max,
            idle_timeout=cfg.idle_timeout_s or None,
            max_message_size=cfg.max_message_size,
            offered_capabilities=["ANONYMOUS-RELAY"],
            handshake_timeout=io.runner.limits.handshake_timeout_s,
            now=time.monotonic(),
        )
        conn = Amqp1Conn(self, io, machine, cfg.link_credit)
        self.connections.add(conn)
        return conn

    async def shutdown(self) -> None:
        """Close every connection (amqp:connection:forced) and wait until they are gone."""
        for conn in list(self.connections):
            conn.shutdown()
            conn.io.pump()
        if self.connections:
            self._drained = anyio.Event()
            await self._drained.wait()

    async def finished(self, conn: Amqp1Conn) -> None:
        """The connection is gone: unsubscribe, hand unsettled queue deliveries back, delete its
        temporary queues."""
        self._forget(conn)
        self.coordinator.finished(conn)
        try:
            with anyio.CancelScope(shield=True):
                for out in list(conn.outlinks.values()):
                    await self.release(out)
                    if isinstance(out, QueueOut) and out.subscription is not None:
                        ending = self.subscribers.leave(out, False)  # a non-durable one may end
                        if ending is not None:
                            await self.subscribers.end(out.subscription, ending)
        finally:
            conn.outlinks.clear()
            conn.inlinks.clear()
            self.connections.discard(conn)
            if self._drained is not None and not self.connections:
                self._drained.set()

    def _kick(self, conn: Amqp1Conn) -> None:
        log.info("amqp1: %r disconnected by an administrator", conn.container_id)
        conn.close(Error(condition=CONNECTION_FORCED, description="disconnected by an administrator"))

    def _forget(self, conn: Amqp1Conn) -> None:
        for out in conn.outlinks.values():
            self._unsubscribe(conn, out)
        self.broker.presence.left(conn.client)
        conn.client = None

    # -- events -----------------------------------------------------------------------------------

    def dispatch(self, conn: Amqp1Conn, event: Event) -> Awaitable[None] | None:
        """Act on one event (a bug here closes this connection only: the runtime's concern)."""
        if isinstance(event, MessageReceived):
            self.message(conn, event)
        elif isinstance(event, FlowReceived):
            out = conn.outlinks.get(event.link)
            if out is not None:
                out.on_flow(event.drain)
        elif isinstance(event, DispositionReceived):
            self._disposition(conn, event)
        elif isinstance(event, LinkAttached):
            return self._attach(conn, event.link)
        elif isinstance(event, LinkDetached):
            self.detached(conn, event)
        elif isinstance(event, TransferAborted):
            log.debug("amqp1: %s aborted delivery %d", conn.container_id, event.delivery_id)
        elif isinstance(event, SaslAuthRequested):
            return self._sasl(conn, event)
        elif isinstance(event, ConnectionOpened):
            self._opened(conn, event)
        elif isinstance(event, ConnectionClosed):
            self._closed(conn, event)
        return None

    def _sasl(self, conn: Amqp1Conn, event: SaslAuthRequested) -> Awaitable[None] | None:
        creds = event.credentials
        security, host = self.security, conn.io.peer_host
        verdict: Login | Awaitable[Login]
        if creds.mechanism == "EXTERNAL":
            user = security.certificate_identity(conn.io.peer_certificate())
            if user is None:
                verdict = security.failed_login(
                    "amqp1", None, host, "no identity in the certificate", True, (None, conn.peer)
                )
            else:
                verdict = security.login(
                    None, None, host, protocol="amqp1", certificate_user=user, peer=conn.peer
                )
        elif security.is_default_guest(creds.username, creds.password):
            verdict = security.login(  # RabbitMQ's default login: anonymous here, from loopback only
                creds.username, None, host, protocol="amqp1", anonymous_alias=True, peer=conn.peer
            )
        else:
            verdict = security.login(creds.username, creds.password, host, protocol="amqp1", peer=conn.peer)
        return on_login(
            verdict, lambda login: self._logged_in(conn, event, login), lambda: not conn.machine.closed
        )

    def _logged_in(self, conn: Amqp1Conn, event: SaslAuthRequested, login: Login) -> None:
        creds = event.credentials
        if not login.ok:
            events = self.broker.events
            if events.wants(CLIENT_AUTH_FAILED):
                events.client(
                    CLIENT_AUTH_FAILED,
                    conn.peer,
                    PROTOCOL_AMQP1,
                    conn.peer,
                    creds.username,
                    reason=login.reason,
                )
        else:
            conn.user = login.user
            conn.principal = self.security.principal("amqp1", login.user, "", conn.io.peer_host)
        conn.amqp.sasl_complete(login.ok)
        conn.io.wake()

    def _opened(self, conn: Amqp1Conn, event: ConnectionOpened) -> None:
        conn.container_id = str(event.open.container_id)
        if conn.principal is None:  # no SASL: an anonymous client (allowed from this address)
            conn.principal = self.security.principal("amqp1", None, "", conn.io.peer_host)
        vhost = self._vhost_for(conn, event.open.hostname)
        refusal = self._refuse_vhost(conn, vhost)
        if refusal is not None:
            log.warning("amqp1: %s (%s) refused: %s", conn.peer, conn.container_id, refusal.description)
            conn.amqp.close(refusal)
            conn.io.wake()
            return
        conn.vhost_prefix = prefix(vhost)
        conn.io.vhost = vhost
        conn.io.user = conn.user
        conn.principal.rename(conn.container_id)  # %c in the rules: the container id
        conn.principal.vhost = vhost  # whose permission patterns apply
        over = conn.io.enter(conn.user, vhost)
        if over is not None:
            # The spec's way to refuse a connection: our open, then a close with the error.
            log.info("amqp1: %s (%s): %s", conn.peer, conn.container_id, over)
            conn.amqp.close(Error(condition=RESOURCE_LIMIT_EXCEEDED, description=over))
            return
        client = ClientInfo(conn.container_id, PROTOCOL_AMQP1, conn.user, self._kick, conn, vhost)
        conn.client = client
        self.broker.presence.arrived(client)
        log.debug("amqp1: %r connected from %s", conn.container_id, conn.peer)

    def forget_vhost(self, vhost_prefix: str) -> None:
        """A vhost is deleted: its connections close (amqp:connection:forced), as RabbitMQ does, and
        its subscriptions stop (their queues go with the vhost's)."""
        self.subscribers.forget_vhost(vhost_prefix)
        for conn in list(self.connections):
            if vhost_prefix and conn.vhost_prefix == vhost_prefix and not conn.machine.closed:
                conn.close(Error(condition=Symbol("amqp:connection:forced"), description="vhost deleted"))

    def _vhost_for(self, conn: Amqp1Conn, hostname: str | None) -> str:
        """``open.hostname`` as RabbitMQ 3.10 reads it: ``vhost:NAME`` names a vhost; any other host
        name (clients send the host they dialled) names none, and the client goes to its user's
        mapping (``auth.vhost_map``), its listener's (``listeners.vhosts``) or ``/``. Only with
        ``amqp1.hostname_vhost`` does a plain host name that names a vhost select it."""
        if hostname is not None and hostname.startswith("vhost:"):
            return hostname[len("vhost:") :]
        if hostname and self.config.hostname_vhost and self.broker.vhosts.exists(hostname):
            return hostname
        settings = self.settings
        mapped = settings.auth.vhost_map.get(conn.user) if conn.user is not None else None
        listener = conn.io.listener.replace("-", "_")  # "amqps" is listeners.amqps
        return mapped or settings.listeners.vhosts.get(listener) or DEFAULT_VHOST

    def _refuse_vhost(self, conn: Amqp1Conn, vhost: str) -> Error | None:
        """Why ``conn`` may not enter ``vhost``, as RabbitMQ closes such a connection."""
        if not self.broker.vhosts.exists(vhost):
            return Error(condition=NOT_FOUND, description=f"vhost '{vhost}' not found")
        if not self.security.may_enter(conn.user, vhost):
            text = f"access to vhost '{vhost}' refused for user '{conn.user or 'guest'}'"
            return Error(condition=UNAUTHORIZED_ACCESS, description=text)
        return None

    def _closed(self, conn: Amqp1Conn, event: ConnectionClosed) -> None:
        error = event.error
        if error is not None:
            who = "peer" if event.by_peer else "server"
            log.info(
                "amqp1: connection %s (%s) closed by the %s: %s %s",
                conn.peer,
                conn.container_id,
                who,
                error.condition,
                error.description or "",
            )
        self._forget(conn)  # the runtime writes our last frames and closes the socket

    # -- attach / detach --------------------------------------------------------------------------

    def refuse(self, conn: Amqp1Conn, link: Link, condition: str, description: str) -> None:
        if conn.vhost_prefix:
            description = description.replace(conn.vhost_prefix, "")  # the names its client knows
        log.info("amqp1: %s: link %r refused: %s %s", conn.container_id, link.name, condition, description)
        conn.amqp.reject_link(link, Error(condition=Symbol(condition), description=description))

    def _attach(self, conn: Amqp1Conn, link: Link) -> Awaitable[None] | None:
        attach = link.remote_attach
        if link.is_receiver:
            self._attach_inlink(conn, link, attach.target)
            return None
        return self.attach_outlink(conn, link, attach.source)

    def _attach_inlink(self, conn: Amqp1Conn, link: Link, target: Any) -> None:
        if isinstance(target, Coordinator):
            self.coordinator.attach(conn, link, target)
            return
        if not isinstance(target, Target):
            self.refuse(conn, link, INVALID_FIELD, "attach without a target")
            return
        if target.dynamic:
            self.refuse(conn, link, NOT_IMPLEMENTED, "dynamic targets are not supported")
            return
        address: Address | None = None
        if target.address is not None:
            try:
                address = resolve(
                    target.address,
                    target.capabilities,
                    bare=self.config.bare_address,
                    for_receive=False,
                    vhost_prefix=conn.vhost_prefix,
                )
                self._check_queue(conn, address)
                self._check_access(conn, WRITE, address.own_topic)
            except AddressError as exc:
                self.refuse(conn, link, exc.condition, exc.description)
                return
            target = replace(target, capabilities=[Symbol(address.kind)])
        inlink = InLink(link, address, owner=conn)
        if address is not None and address.is_queue:
            inlink.presettled = SettledPublishes(conn, inlink, address.name)
        conn.inlinks[link] = inlink
        credit = 0 if conn.publishing_blocked else self.config.link_credit
        conn.amqp.accept_link(link, target=target, rcv_settle_mode=RCV_FIRST, initial_credit=credit)

    def _check_access(self, conn: Amqp1Conn, access: str, topic: str) -> None:
        """RabbitMQ's patterns, then the rules' word on ``topic``: ``amqp:unauthorized-access``
        when either refuses."""
        principal = conn.principal
        if principal is None:
            return
        refused = self._refused_by_patterns(principal, access, topic)
        if refused is not None:
            raise AddressError(UNAUTHORIZED_ACCESS, refused)
        if not self.security.authorize(principal, access, topic):
            raise AddressError(UNAUTHORIZED_ACCESS, f"{access} access to {topic!r} refused")

    def _refused_by_patterns(self, principal: Principal, access: str, topic: str) -> str | None:
        """What an AMQP 1.0 link to ``topic`` (a client's name, ``$queue/<q>`` or a topic) needs of
        RabbitMQ's patterns, as its plugin maps them: a sender writes ``amq.topic`` for a topic and
        ``amq.default`` for a queue (publish_resource); a receiver reads its queue, or ``amq.topic``
        for a topic. None when they allow it, else RabbitMQ's text (logged and counted)."""
        security = self.security
        if access == WRITE:
            access, kind, name = publish_resource(topic)
        else:
            queue = queue_of(topic)
            kind, name = (QUEUE_RESOURCE, queue) if queue is not None else (EXCHANGE, AMQ_TOPIC)
        if not security.permits(principal, access, kind, name):
            return security.refuse_resource(principal, access, kind, name)
        if name != AMQ_TOPIC or not security.has_topic_permissions(principal):
            return None
        return security.topic_refusal(principal, access, topic)  # the topic's key on amq.topic

    def _check_configure(self, conn: Amqp1Conn, queue: str) -> None:
        """A queue made by this attach (``queues.auto_create``, a dynamic node) is configured: the
        patterns must allow it (``queue`` as the client names it)."""
        principal = conn.principal
        if principal is not None and not self.security.permits(principal, CONFIGURE, QUEUE_RESOURCE, queue):
            text = self.security.refuse_resource(principal, CONFIGURE, QUEUE_RESOURCE, queue)
            raise AddressError(UNAUTHORIZED_ACCESS, text)

    def _topic_grant(self, conn: Amqp1Conn, topic_filter: str) -> Callable[[str], bool] | None:
        """A topic receiver is attached when some topic it can match may be read (Mosquitto's rule,
        :meth:`Security.reading`): None when every one may, else the check each delivery's topic
        goes through. ``amqp:unauthorized-access`` when none may."""
        principal = conn.principal
        if principal is None:
            return None
        refused = self._refused_by_patterns(principal, READ, topic_filter)
        if refused is not None:
            raise AddressError(UNAUTHORIZED_ACCESS, refused)
        grant = self.security.reading(principal, topic_filter, len(conn.vhost_prefix))
        if grant is False:
            raise AddressError(UNAUTHORIZED_ACCESS, f"read access to {topic_filter!r} refused")
        return None if grant is True else grant

    def _recheck_all(self) -> None:
        """The rules were reloaded: receiving links that may no longer read are detached
        (``amqp:unauthorized-access``); the connections stay. Topic receivers that may read only
        some of their topics are bound to the new rules."""
        self.broker.router.forget_matches()
        for conn in list(self.connections):
            principal = conn.principal
            if principal is None or conn.machine.closed:
                continue
            for out in list(conn.outlinks.values()):
                if out.temp_queue is not None or out.stopped:
                    continue
                if isinstance(out, TopicOut):
                    grant = self.security.reading(principal, out.address.own_topic, len(conn.vhost_prefix))
                    if grant is not False:
                        reads = None if grant is True else grant
                        options = SubscriptionOptions(qos=0 if out.settled else 1, reads=reads)
                        self.broker.router.subscribe(out, out.address.name, options)
                        continue
                elif self.security.authorize(principal, READ, out.address.own_topic):
                    continue
                error = Error(condition=UNAUTHORIZED_ACCESS, description="read access revoked")
                conn.amqp.detach_link(out.link, error)
                self.detached(conn, LinkDetached(out.link, True, error, False))
            conn.io.wake()

    def _check_queue(self, conn: Amqp1Conn, address: Address) -> None:
        if not address.is_queue:
            return
        if self.queues is None:
            raise AddressError(NOT_IMPLEMENTED, "durable queues are off")
        if not self.queues.exists(address.name):
            if not self.settings.queues.auto_create:
                raise AddressError(NOT_FOUND, f"queue {address.name} does not exist")
            self._check_configure(conn, address.name[len(conn.vhost_prefix) :])  # it will be made

    def attach_outlink(self, conn: Amqp1Conn, link: Link, source: Any) -> Awaitable[None] | None:
        if source is None or (isinstance(source, Source) and source.address is None and not source.dynamic):
            return self.subscribers.attach_existing(conn, link)
        if not isinstance(source, Source):
            self.refuse(conn, link, INVALID_FIELD, "attach without a source")
            return None
        settled = link.remote_attach.snd_settle_mode == SND_SETTLED
        if source.dynamic:
            if self.queues is None:
                self.refuse(conn, link, NOT_IMPLEMENTED, "durable queues are off")
                return None
            # Later frames wait until the node exists and the attach is answered.
            return self._attach_dynamic(conn, link, source, settled)
        try:
            address = resolve(
                source.address,
                source.capabilities,
                bare=self.config.bare_address,
                for_receive=True,
                vhost_prefix=conn.vhost_prefix,
            )
            self._check_queue(conn, address)
            reads = None
            if address.is_queue:
                self._check_access(conn, READ, address.own_topic)
            else:
                reads = self._topic_grant(conn, address.own_topic)
        except AddressError as wrong:
            self.refuse(conn, link, wrong.condition, wrong.description)
            return None
        # A JMS selector is parsed once, here; one that does not parse ends the link.
        selector = find_selector(source.filter)
        selects: Selects | None = None
        if selector is not None:
            try:
                queue_side = address.is_queue and source.distribution_mode != COPY
                selects = selecting(parse_selector(selector[1].value), SELECTOR_MEMORY if queue_side else 0)
            except SelectorError as unparsed:
                self.refuse(conn, link, INVALID_FIELD, f"{unparsed} in {selector[1].value!r}")
                return None
        caps = {str(c) for c in source.capabilities or ()}
        durable = source.durable in (1, 2) and source.expiry_policy == EXPIRY_NEVER
        if not address.is_queue and (durable or SHARED in caps) and self.queues is not None:
            # Later frames wait until its queue exists and the attach is answered.
            return self.subscribers.attach(conn, link, source, address, settled, selector, selects)
        out: OutLink
        mode = source.distribution_mode
        if address.is_queue and mode == COPY:
            assert self.queues is not None
            browse = QueueBrowse(conn, link, address, settled)
            try:
                browse.handle = self.queues.browse(address.name, browse, owner=conn)
            except QueueError as exc:
                condition = NOT_FOUND if exc.reason == "no-queue" else NOT_IMPLEMENTED
                if exc.reason == "locked":
                    condition = RESOURCE_LOCKED
                self.refuse(conn, link, condition, str(exc))
                return None
            out = browse
        elif address.is_queue:
            mode = MOVE  # what a queue does for any other mode asked: the peer is told so
            out = QueueOut(conn, link, address, settled)
            try:
                self.consume(out, link, selects)
            except QueueError as exc:
                condition = NOT_FOUND if exc.reason == "no-queue" else INVALID_FIELD
                if exc.reason == "locked":
                    condition = RESOURCE_LOCKED
                elif exc.reason == "queue-limit":
                    condition = RESOURCE_LIMIT_EXCEEDED  # the vhost's queue limit
                self.refuse(conn, link, condition, str(exc))
                return None
        else:
            if selects is None:
                out = TopicOut(conn, link, address, settled)
            else:
                out = SelectedTopicOut(conn, link, address, settled, selects)
            qos = 0 if settled else 1
            self.broker.router.subscribe(out, address.name, SubscriptionOptions(qos=qos, reads=reads))
            self.subscription_event(SUBSCRIPTION_CREATED, conn, address.name, qos=qos, link=link.name)
        conn.outlinks[link] = out
        # The filters we apply go back in our source: the selector (not for a queue browser), and
        # no other (beyond the address' own wildcards), which tells the peer so, as the spec asks.
        applied = None
        if selector is not None and not isinstance(out, QueueBrowse):
            applied = {selector[0]: selector[1]}
        if not address.is_queue and mode != COPY:
            mode = None  # a topic link copies; another mode asked of it is not ours to claim
        source = replace(source, capabilities=[Symbol(address.kind)], filter=applied, distribution_mode=mode)
        if not address.is_queue and source.durable:  # a topic link lasts as long as the link
            source = replace(source, durable=0, expiry_policy=Symbol("link-detach"))
        conn.amqp.accept_link(link, source=source, rcv_settle_mode=RCV_FIRST)
        out.on_flow(link.drain)  # a flow may have come before our attach
        return None

    def consume(self, out: QueueOut, link: Link, selects: Selects | None = None) -> None:
        assert self.queues is not None
        props = link.remote_attach.properties or {}
        group = props.get("consumer-group")
        start: Any = None
        for name in START_PROPERTIES:
            if props.get(name) is not None:
                start = props[name]
        if isinstance(start, Timestamp):
            start = f"timestamp:{int(start)}"
        elif start is not None and not isinstance(start, str):
            try:
                start = int(start)
            except (TypeError, ValueError):
                raise QueueError("bad-start", f"stream-offset {start!r} is not a position") from None
        out.handle = self.queues.consume(
            out.address.name,
            out,
            group=None if group is None else str(group),
            routing_filter=out.address.key or None,
            start=start,
            auto_ack=out.settled,
            owner=out.conn,
            selects=selects,
        )

    async def _attach_dynamic(self, conn: Amqp1Conn, link: Link, source: Source, settled: bool) -> None:
        """A dynamic receiver gets a temporary in-memory queue; its address goes back in the attach."""
        assert self.queues is not None
        name = f"{conn.vhost_prefix}tmp-{uuid.uuid4().hex[:16]}"
        try:  # RabbitMQ's patterns: the node is configured and read by its maker
            self._check_configure(conn, name[len(conn.vhost_prefix) :])
            self._check_access(conn, READ, "$queue/" + name[len(conn.vhost_prefix) :])
        except AddressError as refused:
            self.refuse(conn, link, refused.condition, refused.description)
            return
        await self.queues.declare(name, durable=False)
        self.queues.owners[name] = conn  # a temporary queue: this connection's alone
        if conn.principal is not None:
            conn.principal.own(name[len(conn.vhost_prefix) :])  # the rules see the client's names
        if link.state is not LinkState.ATTACH_RECEIVED or conn.machine.closed:
            await self.queues.delete(name)  # the peer gave up (detach or close) meanwhile
            return
        address = Address(QUEUE, name, "", len(conn.vhost_prefix))
        out = QueueOut(conn, link, address, settled)
        out.temp_queue = name
        conn.outlinks[link] = out  # from here on, the link's end deletes the queue
        try:
            self.consume(out, link)
        except QueueError as exc:
            limit = exc.reason == "queue-limit"  # a dynamic queue past the vhost's queue limit
            self.refuse(conn, link, RESOURCE_LIMIT_EXCEEDED if limit else INVALID_FIELD, str(exc))
            return
        source = replace(
            source,
            address=address.own_topic,
            capabilities=[Symbol(QUEUE)],
            filter=None,
            distribution_mode=MOVE,
        )
        conn.amqp.accept_link(link, source=source, rcv_settle_mode=RCV_FIRST)
        out.on_flow(link.drain)

    def detached(self, conn: Amqp1Conn, event: LinkDetached) -> None:
        link = event.link
        inlink = conn.inlinks.pop(link, None)
        if inlink is not None and inlink.coordinator:
            self.coordinator.coordinator_ended(conn, link)
        out = conn.outlinks.get(link)
        if out is None:
            return
        self._unsubscribe(conn, out)
        if isinstance(out, QueueOut):
            self.coordinator.link_ended(conn, out)
        if isinstance(out, QueueOut) and out.subscription is not None:
            # JMS unsubscribe is the peer's detach with closed, never our own detach
            ending = self.subscribers.leave(out, event.closed and event.by_peer)
            conn.io.spawn(lambda: self.subscribers.release_and_end(conn, out, ending))
            return
        conn.io.spawn(lambda: self.release_detached(conn, out))

    def _unsubscribe(self, conn: Amqp1Conn, out: OutLink) -> None:
        """Stop sending on ``out`` at once; a topic link leaves the router."""
        if out.stopped:
            return
        out.stop()
        if isinstance(out, TopicOut):
            self.broker.router.unsubscribe_all(out)
            self.subscription_event(SUBSCRIPTION_REMOVED, conn, out.address.name, link=out.link.name)

    def subscription_event(self, event_type: str, conn: Amqp1Conn, topic_filter: str, **extra: Any) -> None:
        events = self.broker.events
        if events.wants(event_type) and conn.client is not None:
            events.client_info(event_type, conn.client, topic_filter=topic_filter, **extra)

    def dropped(self, message: Message, subscriber: str, reason: str, vhost: str) -> None:
        """A receiver's copy of a topic message was not delivered (``reason``: one of
        broker/drops.py's): count it, tell the event bus."""
        self.broker.stats.drops.drop(reason, vhost, subscriber)
        events = self.broker.events
        if events.wants(MESSAGE_DROPPED):
            events.message(MESSAGE_DROPPED, message, subscriber=subscriber, reason=reason)

    async def restore(self) -> None:
        """At start: the durable subscriptions are fed again (:meth:`Subscribers.restore`)."""
        await self.subscribers.restore()

    async def release_detached(self, conn: Amqp1Conn, out: OutLink) -> None:
        await self.release(out)
        conn.outlinks.pop(out.link, None)

    async def release(self, out: OutLink) -> None:
        """The link is gone: its unsettled queue deliveries go back to the queue at once."""
        if out.released:
            return
        out.released = True
        if isinstance(out, QueueOut) and out.handle is not None:
            out.offsets.clear()
            await out.handle.cancel()
        elif isinstance(out, QueueBrowse) and out.handle is not None:
            await out.handle.cancel()
        if out.temp_queue is not None and self.queues is not None:
            name, out.temp_queue = out.temp_queue, None
            await self.queues.delete(name)

    # -- transfers --------------------------------------------------------------------------------

    def message(self, conn: Amqp1Conn, event: MessageReceived) -> None:
        """A transfer's message (the connection hands it here without ``dispatch``)."""
        link = event.link
        inlink = conn.inlinks.get(link)
        if inlink is None or link.state is not LinkState.ATTACHED:
            return
        if inlink.coordinator:
            self.coordinator.control(conn, event, inlink)
            return
        io = conn.io
        if not io.publisher:
            io.publishing()  # the alarms pause the connections that publish
        io.messages_in += 1
        self.broker.stats.messages_received += 1
        payload = event.payload
        address = inlink.address
        # The broker's message straight from the bytes: only what it maps is decoded.
        message = None
        if address is not None:
            message = from_wire(payload, address.topic, conn.container_id, settled=event.settled)
        decoded: A1Message | None = None
        if message is None:
            try:
                decoded = decode_message(payload)
            except DecodeError as bad:  # not ``exc``: compiled, one name has one type in a function
                self.refuse_message(conn, event, DECODE_ERROR, f"malformed message: {bad}")
                return
        if address is None:
            assert decoded is not None
            to = decoded.properties.to if decoded.properties is not None else None
            try:
                address = resolve(
                    to, None, bare=self.config.bare_address, for_receive=False, vhost_prefix=conn.vhost_prefix
                )
                self._check_queue(conn, address)
            except AddressError as wrong:
                self.refuse_message(conn, event, wrong.condition, f"properties.to: {wrong.description}")
                return
        principal = conn.principal
        if principal is not None:
            # A sender mostly writes to one address: the rules' blessing of the last one holds
            # until they are reloaded (as the other hulls keep it).
            topic = address.own_topic
            security = self.security
            memo = principal.memo
            if memo is None or memo.generation != security.generation:
                memo = principal.memo_for(security.generation)  # the first transfer, or the rules moved
            if topic != memo.last_write:
                refused = self._refused_by_patterns(principal, WRITE, topic)
                if refused is None and not security.authorize(principal, WRITE, topic):
                    refused = f"write access to {topic!r} refused"
                if refused is not None:
                    self.refuse_message(conn, event, UNAUTHORIZED_ACCESS, refused)
                    conn.refill(inlink)
                    return
                memo.last_write = topic
        if message is None:
            assert decoded is not None
            message = from_amqp1(
                decoded, address.topic, conn.container_id, settled=event.settled, raw=payload
            )
        if event.state is not None and self.coordinator.in_transaction(conn, event, address, message):
            conn.refill(inlink)
            return
        if address.is_queue:
            # One unit of the link's window moves from credit to in flight: refill's verdict
            # changes only when the credit runs out, and then this publish's commit refills.
            pending: Callable[[object, QueueError | None], None] | None = inlink.presettled
            if pending is not None and event.settled:
                inlink.inflight += 1  # its link's callback: no disposition waits its turn
            else:
                pending = PendingSettle(conn, inlink, event.delivery_id, event.settled, address.name)
            assert self.queues is not None
            try:
                self.queues.publish_nowait(
                    address.name, message, address.key, pending, message.created_at_ms, inlink
                )
            except QueueError as exc:
                if exc.reason == "shared":  # a shared node reserves offsets with an await
                    conn.io.spawn(lambda: self._append_async(address, message, pending))
                    return
                pending(None, exc)
            return
        self.broker.publish(message)
        if not event.settled:
            conn.amqp.settle(link, event.delivery_id, Accepted())
        conn.refill(inlink)

    def refuse_message(
        self, conn: Amqp1Conn, event: MessageReceived, condition: str, description: str
    ) -> None:
        if conn.vhost_prefix:
            description = description.replace(conn.vhost_prefix, "")  # the names its client knows
        log.info("amqp1: %s: message refused: %s %s", conn.container_id, condition, description)
        error = Error(condition=Symbol(condition), description=description)
        if event.settled:
            if condition == DECODE_ERROR:  # nobody hears a disposition: end the link instead
                conn.amqp.detach_link(event.link, error)
                self.detached(conn, LinkDetached(event.link, True, error, False))
            return
        conn.amqp.settle(event.link, event.delivery_id, Rejected(error=error))

    async def _append_async(
        self, address: Address, message: Message, pending: Callable[[object, QueueError | None], None]
    ) -> None:
        assert self.queues is not None
        try:
            await self.queues.publish(address.name, message, address.key)
        except QueueError as exc:
            pending(None, exc)
            return
        pending(None, None)

    def stalled(self, conn: Amqp1Conn, out: QueueOut, idle_s: float) -> None:
        """``out``'s queue held its publishers and nothing was settled for ``idle_s`` seconds
        (queue/flow.py): the link is closed with ``amqp:resource-limit-exceeded``, its unsettled
        deliveries go back to the queue, and the publishers go on. The link, not the connection:
        it is the consumer (as AMQP 0.9.1's channel is), and the connection's other links are not
        to blame; proton's blocking receiver raises LinkDetached with the condition, its reactor
        calls on_link_error."""
        link = out.link
        if out.stopped or link.state is not LinkState.ATTACHED or conn.machine.closed:
            return
        log.warning(
            "amqp1: %s: receiver %r of %s settled nothing for %.0f s (%d unsettled) while the queue "
            "held its publishers; link detached so that they go on (limits.stalled_consumer_timeout_s)",
            conn.container_id,
            link.name,
            describe(out.address.name),
            idle_s,
            len(out.offsets),
        )
        error = Error(
            condition=RESOURCE_LIMIT_EXCEEDED,
            description=f"nothing settled for {idle_s:.0f} s while the queue held its publishers",
        )
        conn.amqp.detach_link(link, error)
        self.detached(conn, LinkDetached(link, True, error, False))
        conn.io.pump()

    def publish_failed(self, conn: Amqp1Conn, queue: str, exc: QueueError) -> Error:
        """A queue publish refused or not written: logged, and the error its disposition says."""
        # The storage's outage is logged once by the storage, not once per publish it refuses.
        say = log.debug if exc.reason == "storage" else log.info
        say("amqp1: %s: publish to %s refused: %s", conn.container_id, describe(queue), exc)
        return Error(condition=refusal_condition(exc), description=str(exc))

    # -- dispositions -----------------------------------------------------------------------------

    def _disposition(self, conn: Amqp1Conn, event: DispositionReceived) -> None:
        if event.role is not ROLE_RECEIVER:
            return  # the sender settling deliveries we received: nothing to do in rcv-settle-mode first
        state = event.state
        if state is not None and state.__class__ is TransactionalState:
            self.coordinator.settle(conn, event, state)
            return
        deliveries = event.deliveries
        if len(deliveries) == 1:
            link, delivery_id, _tag = deliveries[0]
            out = conn.outlinks.get(link)
            if out is not None:
                out.on_outcome(delivery_id, state, event.settled)
        elif deliveries:
            # Usually all of one link: its outcomes go in one step.
            link = deliveries[0][0]
            ids = [did for lk, did, _tag in deliveries if lk is link]
            if len(ids) == len(deliveries):
                out = conn.outlinks.get(link)
                if out is not None:
                    out.on_outcomes(ids, state, event.settled)
            else:
                for link, delivery_id, _tag in deliveries:
                    out = conn.outlinks.get(link)
                    if out is not None:
                        out.on_outcome(delivery_id, state, event.settled)
        if not event.settled and event.state is not None and event.deliveries:
            # The receiver waits for us to settle (it asked for rcv-settle-mode second anyway).
            conn.amqp.settle_range(event.session, ROLE_SENDER, event.first, event.last, event.state)


def refusal_condition(exc: QueueError) -> Symbol:
    """The AMQP 1.0 error condition of a refused queue publish (the transfer is rejected with it)."""
    if exc.reason in ("full", "overflow", "disk-full", "queue-limit"):
        return RESOURCE_LIMIT_EXCEEDED
    if exc.reason == "no-queue":
        return NOT_FOUND
    return INTERNAL_ERROR
