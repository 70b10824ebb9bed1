"""The AMQP 0.9.1 front end: the machine's events in, the deck (router, exchanges, queues) out.

Connections run on the connection runtime (:mod:`trimaran.runtime`): the AMQP port calls
:meth:`Amqp091FrontEnd.open` for each connection after its protocol header, and the runtime hands
the machine's events, one frame at a time, to :meth:`Amqp091FrontEnd.on_event`. Publishes, acks and
the methods that answer at once are handled inside the event; a method that must wait (a queue
declared, bound, purged or deleted, an exchange stored) returns an awaitable, and the runtime reads
no further frame of that connection until it is done, so frames take effect in arrival order.
Publisher confirms (and tx.commit-ok) leave in publish order from the commit callbacks
(:meth:`~trimaran.amqp091.conn.Amqp091Conn.confirm_ready`).

Exchanges live in :class:`~trimaran.amqp091.exchanges.ExchangeRegistry`; ``amq.topic`` is the
shared router (a binding there is a router subscription that appends to the queue), every queue
is a queue of the manager (see :mod:`trimaran.amqp091.queues`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Collection, Coroutine
from dataclasses import replace
from typing import Any, Final

import anyio

from trimaran.alarm import Alarm
from trimaran.amqp091 import spec
from trimaran.amqp091.access import (
    GUARDED,
    check_default_publish,
    check_method,
    check_queue_publish,
    publish_targets,
)
from trimaran.amqp091.channels import ChannelState, Consumer
from trimaran.amqp091.conn import Amqp091Conn, Pending, Route
from trimaran.amqp091.connection import ServerConnection
from trimaran.amqp091.events import (
    AuthenticationRequested,
    ChannelClosed,
    ChannelFlowChanged,
    ChannelOpened,
    ConnectionClosed,
    ConnectionClosing,
    ConnectionOpened,
    ContentReceived,
    ContentRun,
    Event,
    MethodReceived,
    SecureOkReceived,
)
from trimaran.amqp091.exchanges import ExchangeError, ExchangeRegistry
from trimaran.amqp091.mapping import MappingError, message_from_content, message_headers, messages_from_run
from trimaran.amqp091.operations import REPLY_PREFIX, REPLY_TO, _error
from trimaran.amqp091.properties import BasicProperties
from trimaran.amqp091.queues import QueueMeta, RouterBinding
from trimaran.amqp091.tenants import Tenant
from trimaran.broker.clients import ClientInfo
from trimaran.broker.core import Broker
from trimaran.broker.drops import QUEUE_OVERFLOW
from trimaran.broker.events import CLIENT_AUTH_FAILED
from trimaran.broker.message import PROTOCOL_AMQP091, Message, now_ms
from trimaran.config import Settings
from trimaran.queue.groups import Selects
from trimaran.queue.manager import QueueManager
from trimaran.queue.policy import QUEUE_PREFIX, QueueError, parse_queue_topic, queue_topic
from trimaran.runtime.transport import Conn
from trimaran.security.guard import READ, Login, Security, on_login
from trimaran.storage.amqp_store import AmqpStore
from trimaran.topics import TopicError, routing_key_to_topic, topic_to_routing_key
from trimaran.vhosts import DEFAULT_VHOST, describe, is_reserved, split_key, vhost_of

log = logging.getLogger(__name__)

# How often queues with x-expires are looked at, while there are any (alarm.py: none, no wake-up).
EXPIRY_CHECK_S: Final = 1.0
#: Routes a connection keeps (Amqp091Conn.routes), past which it starts again: a publisher's keys
#: are mostly few; one that sends each message to a key of its own pays the lookup it paid anyway.
ROUTES_KEPT: Final = 256


class Amqp091FrontEnd:
    def __init__(
        self,
        broker: Broker,
        settings: Settings,
        queues: QueueManager,
        store: AmqpStore | None = None,
        security: Security | None = None,
        selecting: Callable[[str], Selects] | None = None,
    ) -> None:
        self.broker = broker
        #: a consumer's ``x-selector`` text -> its predicate (SelectorError when it does not parse);
        #: given by the app, as the fields a selector reads are every protocol's (amqp1/selection.py)
        self.selecting = selecting
        self.amqp_store = store
        self.settings = settings
        self.config = settings.amqp091
        self.manager = queues
        self.security = security if security is not None else Security(settings.auth)
        self.security.on_reload(self._recheck_all)
        #: queue key -> its metadata and its consumers (every vhost, channel and connection)
        self.meta: dict[str, QueueMeta] = {}
        self.consumers: dict[str, set[Consumer]] = {}
        self.conns: set[Amqp091Conn] = set()
        #: vhost -> its exchanges, bindings and operations (trimaran/amqp091/tenants.py)
        self.tenants: dict[str, Tenant] = {}
        self.root = self.tenant(DEFAULT_VHOST)
        self.exchanges = self.root.exchanges  # the default vhost's, as before vhosts
        self.ops = self.root.ops
        self._collecting: Pending | None = None
        #: direct reply-to token -> the channel consuming its replies
        self.reply_to: dict[str, ChannelState] = {}
        self._housekeeper = Alarm()  # x-expires: run's sleep, rung by a declare that sets it
        queues.dead_letter_router = self

    # -- lifecycle --------------------------------------------------------------------------------

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Restore every vhost's exchanges and bindings, then the housekeeping (x-expires) until
        cancelled."""
        for vhost in self.broker.vhosts.names():
            await self.tenant(vhost).ops.restore()
        task_status.started()
        while True:
            watching = any(meta.expires_ms is not None for meta in self.meta.values())
            await self._housekeeper.sleep(EXPIRY_CHECK_S if watching else None)
            for tenant in list(self.tenants.values()):
                await tenant.ops.expire_queues(time.monotonic())

    def watch_expiry(self) -> None:
        self._housekeeper.ring()

    def tenant(self, vhost: str) -> Tenant:
        """The vhost's exchanges and operations, made on first use."""
        tenant = self.tenants.get(vhost)
        if tenant is None:
            tenant = self.tenants[vhost] = Tenant(self, vhost)
        return tenant

    def tenant_of(self, key: str) -> Tenant:
        """The tenant a queue key or topic key belongs to."""
        return self.tenant(vhost_of(key))

    async def forget_vhost(self, vhost: str) -> None:
        """A vhost is deleted: its connections close (320 CONNECTION_FORCED, as RabbitMQ), its
        queues go with their consumers, its exchanges and bindings from memory and storage."""
        tenant = self.tenants.pop(vhost, None)
        if tenant is None or tenant is self.root:
            return
        for conn in list(self.conns):
            if conn.tenant is tenant and not conn.machine.closed:
                conn.kick(spec.CONNECTION_FORCED, f"CONNECTION_FORCED - vhost '{vhost}' is deleted")
        for name in [n for n in list(self.manager.queues) if vhost_of(n) == vhost]:
            await tenant.ops.delete_queue(name)
        for endpoint in tenant.router_bindings.values():
            self.broker.router.unsubscribe_all(endpoint)
        if self.amqp_store is not None:
            await anyio.to_thread.run_sync(self.amqp_store.delete_vhost, vhost)

    def _admit(self, conn: Amqp091Conn, vhost: str) -> str | None:
        """connection.open: why ``conn`` may not enter ``vhost`` (530 NOT_ALLOWED), as RabbitMQ says."""
        if not self.broker.vhosts.exists(vhost):
            return f"vhost {vhost} not found"
        if not self.security.may_enter(conn.user, vhost):
            return f"access to vhost '{vhost}' refused for user '{conn.user or 'guest'}'"
        if conn.principal is not None:
            conn.principal.vhost = vhost  # whose permission patterns apply
        return conn.io.enter(conn.user, vhost)  # the vhost's and the user's connection limits

    # -- connections ------------------------------------------------------------------------------

    def open(self, io: Conn) -> Amqp091Conn:
        """The hull for a new connection (the port feeds it the protocol header and what follows)."""
        config = self.config
        # SASL EXTERNAL: offered on a TLS connection that showed a client certificate.
        external = io.peer_certificate() is not None
        machine = ServerConnection(
            mechanisms=("EXTERNAL", "PLAIN", "AMQPLAIN") if external else ("PLAIN", "AMQPLAIN"),
            virtual_hosts=None,  # which vhosts exist and who may enter: _admit
            channel_max=config.channel_max,
            frame_max=config.frame_max,
            heartbeat=config.heartbeat,
            max_body_size=config.max_message_size,
            handshake_timeout=config.handshake_timeout,
            now=time.monotonic(),
        )
        conn = Amqp091Conn(self, io, machine)
        conn.tenant = self.root
        conn.vhost_prefix = self.root.prefix
        machine.admit = lambda vhost: self._admit(conn, vhost)
        self.conns.add(conn)
        return conn

    async def finish(self, conn: Amqp091Conn) -> None:
        """The connection is gone: its channels, consumers and exclusive queues go too."""
        try:
            for number in list(conn.channels):
                await self.close_channel(conn, number)
            for name in list(conn.exclusive_queues):
                try:
                    await self.tenant_of(name).ops.delete_queue(name)
                except QueueError:
                    log.exception("amqp091: deleting exclusive %s failed", describe(name))
        finally:
            self.broker.presence.left(conn.client)
            conn.client = None
            self.conns.discard(conn)

    async def close_channel(self, conn: Amqp091Conn, number: int) -> None:
        channel = conn.channels.pop(number, None)
        if channel is not None:
            self.forget_reply_to(channel)
            await self._release_channel(conn, channel)

    def forget_reply_to(self, channel: ChannelState) -> None:
        if channel.reply_token is not None:
            self.reply_to.pop(channel.reply_token, None)
            channel.reply_token = None
            channel.reply_tag = ""

    async def _release_channel(self, conn: Amqp091Conn, channel: ChannelState) -> None:
        """What a closed channel held: its consumers, its queue-manager handles, its auto-delete queues."""
        for consumer in list(channel.consumers.values()):
            self.forget_consumer(consumer)
        for handle in channel.handles():
            await handle.cancel()
        conn.written_hooks.discard(channel)
        tenant: Tenant = conn.tenant
        await tenant.ops.auto_delete_queues({c.queue for c in channel.consumers.values()})

    def _drop_channels(self, conn: Amqp091Conn, numbers: list[int]) -> Awaitable[None] | None:
        """Forget channels now (nothing is sent on them any more); what they held is released by
        the awaitable returned, None when they held nothing."""
        held: list[ChannelState] = []
        for number in numbers:
            channel = conn.channels.pop(number, None)
            if channel is None:
                continue
            channel.closed = True
            self.forget_reply_to(channel)
            if channel.consumers or channel.getters or channel.unacked:
                held.append(channel)
            else:
                conn.written_hooks.discard(channel)
        if not held:
            return None

        async def release() -> None:
            for channel in held:
                await self._release_channel(conn, channel)

        return release()

    def _recheck_all(self) -> None:
        """The rules were reloaded: consumers of queues their user may no longer read are cancelled
        (basic.cancel where the client takes it); connections and channels stay. Bindings of
        exclusive queues read in part decide each topic by the new rules."""
        self.broker.router.forget_matches()
        for conn in list(self.conns):
            principal = conn.principal
            if principal is None or conn.machine.closed:
                continue
            for channel in list(conn.channels.values()):
                for consumer in list(channel.consumers.values()):
                    name = consumer.queue
                    topic = queue_topic(name[len(conn.vhost_prefix) :])  # the rules see the client's name
                    if name in conn.exclusive_queues or self.security.allowed(principal, READ, topic):
                        continue
                    self.security.refused(principal, READ, topic, "consumer cancelled by a reload")
                    del channel.consumers[consumer.tag]
                    self.forget_consumer(consumer)
                    consumer.cancelled = True
                    if consumer.handle is not None:
                        consumer.handle.set_credit(0)  # its unacked deliveries may still be acked
                        if not consumer.unacked:
                            conn.io.spawn(consumer.handle.cancel)
                    if conn.amqp.client_capabilities.get("consumer_cancel_notify") is True:
                        conn.amqp.send_method(channel.number, spec.BasicCancel(consumer.tag, True))
            conn.wake()

    def forget_consumer(self, consumer: Consumer) -> None:
        consumers = self.consumers.get(consumer.queue)
        if consumers is not None:
            consumers.discard(consumer)
            if not consumers:
                del self.consumers[consumer.queue]
                meta = self.meta.get(consumer.queue)
                if meta is not None:
                    meta.unused_since = time.monotonic()

    # -- events -----------------------------------------------------------------------------------

    def on_event(self, conn: Amqp091Conn, event: Event) -> Awaitable[None] | None:
        """Act on one event; an awaitable holds the connection's later frames until it is done."""
        if type(event) is ContentReceived:
            self.content(conn, event)
            return None
        if type(event) is ContentRun:
            self.content_run(conn, event)
            return None
        if type(event) is MethodReceived:
            return self._method(conn, event)
        if isinstance(event, AuthenticationRequested):
            return self._authenticate(conn, event)
        elif isinstance(event, SecureOkReceived):
            conn.amqp.reject_authentication("unexpected secure-ok")
        elif isinstance(event, ChannelOpened):
            conn.channels[event.channel] = ChannelState(conn, event.channel)
        elif isinstance(event, ChannelClosed):
            if not event.by_peer or event.reply_code != spec.REPLY_SUCCESS:
                log.info("amqp091: %s channel %d closed: %s", conn.name, event.channel, event.reply_text)
            return self._drop_channels(conn, [event.channel])
        elif isinstance(event, ChannelFlowChanged):
            self._flow(conn, event)
        elif isinstance(event, ConnectionOpened):
            self._opened(conn, event)
        elif isinstance(event, ConnectionClosing):
            log.info("amqp091: closing connection %s: %s", conn.name, event.reply_text)
            return self._drop_channels(conn, list(conn.channels))
        elif isinstance(event, ConnectionClosed):
            if event.by_peer and conn.pending:
                # The confirms of the publishes before the close go out before close-ok.
                return conn.confirms_sent()
            if not event.by_peer:
                log.debug("amqp091: connection %s ended: %s", conn.name, event.reply_text)
        return None

    def _method(self, conn: Amqp091Conn, event: MethodReceived) -> Awaitable[None] | None:
        method = event.method
        if isinstance(method, spec.ConnectionUpdateSecret):
            return self._update_secret(conn, method)
        channel = conn.channels.get(event.channel)
        if channel is None:
            return None
        kind = type(method)
        tenant: Tenant = conn.tenant
        ops = tenant.ops
        if kind in GUARDED:  # the rest (acks, qos, ...) name nothing the rules guard
            refusal = check_method(self.security, tenant.exchanges, conn, channel, method)
            if refusal is not None:
                return self.refuse(conn, event.channel, refusal)
        at_once = ops.at_once.get(kind)
        if at_once is not None:
            try:
                later = at_once(conn, channel, method)
            except spec.ProtocolError as exc:
                return self.refuse(conn, event.channel, exc)
            except ExchangeError as bad:
                return self.refuse(conn, event.channel, _error(bad.reply_code, bad.reason, method))
            if later is None:
                return None
            # It must wait after all (basic.get behind the channel's own publishes): so do later frames.
            return self._finish(conn, event.channel, method, later)
        waiting: Callable[..., Coroutine[Any, Any, None]] | None = ops.waiting.get(kind)
        if waiting is None:
            if isinstance(method, spec.ChannelFlowOk):
                return None
            error = _error(spec.NOT_IMPLEMENTED, f"{method.NAME} is not implemented", method)
            return self.refuse(conn, event.channel, error)

        async def step() -> None:
            try:
                await waiting(conn, channel, method)
            except spec.ProtocolError as exc:
                release = self.refuse(conn, event.channel, exc)
            except ExchangeError as bad:
                release = self.refuse(conn, event.channel, _error(bad.reply_code, bad.reason, method))
            else:
                return
            if release is not None:
                await release

        return step()

    async def _finish(
        self, conn: Amqp091Conn, number: int, method: spec.Method, later: Awaitable[None]
    ) -> None:
        try:
            await later
        except spec.ProtocolError as exc:
            release = self.refuse(conn, number, exc)
        except ExchangeError as bad:
            release = self.refuse(conn, number, _error(bad.reply_code, bad.reason, method))
        else:
            return
        if release is not None:
            await release

    def _update_secret(self, conn: Amqp091Conn, m: spec.ConnectionUpdateSecret) -> Awaitable[None] | None:
        """RabbitMQ's connection.update-secret (a refreshed token or password on a live connection):
        the new secret must still authenticate the connection's user; update-secret-ok, else the
        connection closes with 530 NOT_ALLOWED, as RabbitMQ closes it."""
        user = conn.user  # None: anonymous (guest/guest standing for nobody), nothing to check
        if user is None or conn.amqp.mechanism == "EXTERNAL":
            return self._secret_updated(conn, m, Login(True, user))  # the certificate still holds
        verdict = self.security.login(
            user, m.new_secret, conn.io.peer_host, protocol="amqp091", peer=conn.peer
        )
        if isinstance(verdict, Login):
            return self._secret_updated(conn, m, verdict)

        async def checked() -> None:
            login = await verdict
            if not conn.machine.closed:
                release = self._secret_updated(conn, m, login)
                if release is not None:
                    await release

        return checked()

    def _secret_updated(
        self, conn: Amqp091Conn, m: spec.ConnectionUpdateSecret, login: Login
    ) -> Awaitable[None] | None:
        if login.ok:
            log.info("amqp091: %s updated its secret (%s)", conn.name, m.reason or "no reason given")
            conn.amqp.send_method(0, spec.ConnectionUpdateSecretOk())
            conn.wake()
            return None
        error = _error(spec.NOT_ALLOWED, f"Secret update was refused for user '{conn.user}'", m)
        return self.refuse(conn, 0, error)

    def refuse(
        self, conn: Amqp091Conn, number: int, error: spec.ProtocolError, *, channel_only: bool = False
    ) -> Awaitable[None] | None:
        """Raise ``error`` as a channel or connection exception (with a log line saying why); the
        awaitable, if any, releases what the closed channels held. ``channel_only``: close the
        channel whatever the code (RabbitMQ's way for some hard codes, e.g. 540 for immediate)."""
        log.info("amqp091: %s channel %d: %s", conn.name, number, error)
        error.channel = number
        conn.wake()
        if channel_only:
            conn.amqp.close_channel(
                number, error.reply_code, error.full_text, error.class_id, error.method_id
            )
            return self._drop_channels(conn, [number])
        conn.amqp.raise_error(error)
        if error.connection_exception:
            return self._drop_channels(conn, list(conn.channels))
        return self._drop_channels(conn, [number])

    def _authenticate(self, conn: Amqp091Conn, event: AuthenticationRequested) -> Awaitable[None] | None:
        security, host, peer = self.security, conn.io.peer_host, conn.peer
        verdict: Login | Awaitable[Login]
        if event.mechanism == "EXTERNAL":
            user = security.certificate_identity(conn.io.peer_certificate())
            verdict = (
                security.login(None, None, host, protocol="amqp091", certificate_user=user, peer=peer)
                if user is not None
                else security.failed_login(
                    "amqp091", None, host, "no identity in the client certificate", True, (None, peer)
                )
            )
        elif event.username is None:
            verdict = security.failed_login(
                "amqp091", None, host, "bad user name or password", False, (None, peer)
            )
        elif security.is_default_guest(event.username, event.password):
            # RabbitMQ's default guest/guest is what AMQP clients send when they have no account:
            # it is the anonymous login here unless a real user 'guest' is configured (and, as
            # any 'guest', it is accepted from loopback only).
            verdict = security.login(
                event.username, None, host, protocol="amqp091", anonymous_alias=True, peer=peer
            )
        else:
            verdict = security.login(event.username, event.password, host, protocol="amqp091", peer=peer)
        return on_login(
            verdict, lambda login: self._logged_in(conn, event, login), lambda: not conn.machine.closed
        )

    def _logged_in(self, conn: Amqp091Conn, event: AuthenticationRequested, login: Login) -> None:
        machine = conn.amqp
        if login.ok:
            conn.user = login.user
            conn.principal = self.security.principal("amqp091", login.user, conn.peer, conn.io.peer_host)
            machine.accept_authentication()
            conn.wake()
            return
        if self.broker.events.wants(CLIENT_AUTH_FAILED):
            peer, user = conn.peer, event.username
            self.broker.events.client(
                CLIENT_AUTH_FAILED, peer, PROTOCOL_AMQP091, peer, user, reason=login.reason
            )
        conn.wake()
        machine.reject_authentication(
            f"Login was refused using authentication mechanism {event.mechanism}. "
            "For details see the broker logfile."
        )

    def _opened(self, conn: Amqp091Conn, event: ConnectionOpened) -> None:
        conn.tenant = self.tenant(event.virtual_host)  # _admit let it in
        conn.vhost_prefix = conn.tenant.prefix
        conn.io.vhost = event.virtual_host
        conn.io.user = conn.user
        name = conn.amqp.client_properties.get("connection_name")
        conn.name = f"{conn.peer} ({name})" if isinstance(name, str) and name else conn.peer
        if conn.principal is not None and isinstance(name, str) and name:
            conn.principal.rename(name)  # %c in the rules: the client's connection_name
        client = ClientInfo(conn.name, PROTOCOL_AMQP091, conn.user, _kick, conn, event.virtual_host)
        conn.client = client
        self.broker.presence.arrived(client, vhost=event.virtual_host)
        log.debug("amqp091: %s opened vhost %s as %r", conn.name, event.virtual_host, conn.user)

    def _flow(self, conn: Amqp091Conn, event: ChannelFlowChanged) -> None:
        channel = conn.channels.get(event.channel)
        if channel is None:
            return
        channel.flow_active = event.active
        if event.active:
            channel.refill_all()
        else:
            channel.stop_flow()

    # -- publishing -------------------------------------------------------------------------------

    def content(self, conn: Amqp091Conn, event: ContentReceived) -> None:
        """A basic.publish with its content (the hull hands it here straight, see ``Amqp091Conn``)."""
        channel = conn.channels.get(event.channel)
        method = event.method
        if channel is None or not isinstance(method, spec.BasicPublish):
            return
        self.broker.stats.messages_received += 1  # _count_publishes written out: once a message
        io = conn.io
        io.messages_in += 1
        if not io.publisher:
            io.publishing()
        if channel.tx:
            channel.tx_publishes.append((method, event.properties, event.body))
            return
        if method.immediate:
            # Refused as RabbitMQ 3 refuses it: the channel closes with 540, the connection stays.
            error = spec.ProtocolError(spec.NOT_IMPLEMENTED, "immediate=true", class_id=60, method_id=40)
            _later(conn, self.refuse(conn, event.channel, error, channel_only=True))
            return
        entry = None
        if channel.confirm:
            channel.publish_seq += 1
            entry = conn.begin_confirm(channel, channel.publish_seq)
        try:
            self.publish(conn, channel, method, event.properties, event.body, entry, event.encoded_properties)
        except spec.ProtocolError as exc:
            if entry is not None:
                conn.drop_confirm(entry)
            _later(conn, self.refuse(conn, event.channel, exc))
            return
        if entry is not None:
            entry.sealed()

    def _count_publishes(self, conn: Amqp091Conn, n: int) -> None:
        """``n`` publishes read on ``conn``: counted, and the connection one the alarms pause."""
        self.broker.stats.messages_received += n
        io = conn.io
        io.messages_in += n
        if not io.publisher:
            io.publishing()

    def _check_default_write(self, conn: Amqp091Conn, key: str, method: spec.BasicPublish) -> None:
        """A publish to the default exchange naming ``key``: ``403`` unless the rules let the
        publisher write that queue. Asked only for a key other than the one it wrote last under
        the same rules."""
        principal = conn.principal
        if principal is not None:
            generation = self.security.generation
            memo = principal.memo
            if memo is None or memo.generation != generation:
                memo = principal.memo_for(generation)  # the first publish, or the rules moved
            if key != memo.last_write:
                check_default_publish(self.security, principal, conn, key, method)

    def content_run(self, conn: Amqp091Conn, event: ContentRun) -> None:
        """Publishes of one channel with the same arguments, read together (``ContentRun``): to a
        queue here at once where :meth:`_run_messages` finds the way plain, else each as a publish
        of its own (:meth:`content`)."""
        channel = conn.channels.get(event.channel)
        method = event.method
        if channel is None or not isinstance(method, spec.BasicPublish):
            return
        now = now_ms()
        messages = self._run_messages(conn, channel, method, event.contents, now)
        if messages is None:
            for each in event.each():
                self.content(conn, each)
            return
        self._count_publishes(conn, len(messages))
        queue = conn.vhost_prefix + method.routing_key
        if not self.manager.publish_run(queue, messages, now):
            for message in messages:
                self._to_queue(channel, queue, message, None, now=now)

    def _run_messages(
        self,
        conn: Amqp091Conn,
        channel: ChannelState,
        method: spec.BasicPublish,
        contents: list[tuple[BasicProperties, bytes, bytes]],
        now: int,
    ) -> list[Message] | None:
        """A run's messages, when the way is plain: the default exchange, naming a queue here that
        the publisher may write, with no confirm, transaction or direct reply, and every message
        well-formed. None: each goes its own way (and is refused where it is, as it would be)."""
        key = method.routing_key
        if (
            method.exchange
            or not key
            or key[:1] == "$"
            or key.startswith(REPLY_PREFIX)
            or channel.tx
            or channel.confirm
            or method.immediate
            or conn.vhost_prefix + key not in self.manager.queues
            or any([p.reply_to == REPLY_TO for p, _b, _e in contents])
        ):
            return None
        try:
            self._check_default_write(conn, key, method)
        except spec.ProtocolError:
            return None
        try:
            return messages_from_run(
                contents,
                conn.vhost_prefix + QUEUE_PREFIX + key,  # queue_topic(queue), no call
                exchange="",
                routing_key=key,
                publisher_id=conn.name,
                now=now,
            )
        except MappingError:
            return None

    def publish(
        self,
        conn: Amqp091Conn,
        channel: ChannelState,
        method: spec.BasicPublish,
        props: BasicProperties,
        body: bytes,
        entry: Pending | None = None,
        encoded: bytes | None = None,
    ) -> None:
        """Route one basic.publish; ``entry`` (a confirm or a tx.commit) waits for its commits.
        ``encoded``: ``props`` as the frame carried them, kept on the message for its consumers."""
        exchange, key = method.exchange, method.routing_key
        if not exchange and key.startswith(REPLY_PREFIX):
            if not self._direct_reply(key, props, body) and method.mandatory:
                conn.amqp.send_content(
                    channel.number, spec.BasicReturn(spec.NO_ROUTE, "NO_ROUTE", exchange, key), props, body
                )
                conn.wake()
            return
        if props.reply_to == REPLY_TO:
            if channel.reply_token is None:
                raise spec.ProtocolError(
                    spec.PRECONDITION_FAILED, "fast reply consumer does not exist", class_id=60, method_id=40
                )
            props = replace(props, reply_to=REPLY_PREFIX + channel.reply_token)
            encoded = None  # no longer what the publisher sent
        if not exchange and key.startswith(QUEUE_PREFIX):
            self._publish_cross(conn, channel, method, props, body, entry, encoded)
            return
        tenant: Tenant = conn.tenant
        if not exchange:
            principal = conn.principal  # _check_default_write written out: once a message
            if principal is not None:
                generation = self.security.generation
                memo = principal.memo
                if memo is None or memo.generation != generation:
                    memo = principal.memo_for(generation)
                if key != memo.last_write:
                    check_default_publish(self.security, principal, conn, key, method)
            # The default exchange (always there, never internal: no lookup) routes the key to the
            # queue of that name, its key in the vhost (a /-client naming another vhost's key routes
            # nowhere); a $queue/ key took the cross-protocol way above. The message is built with
            # that queue's topic at once.
            if key[:1] == "$" and is_reserved(key):
                single = None
                queues: Collection[str] = ()
                first_topic = ""
            else:
                prefix = conn.vhost_prefix  # tenant.prefix, held on the connection (typed, compiled)
                single = prefix + key
                queues = (single,)
                first_topic = prefix + QUEUE_PREFIX + key  # queue_topic(single), no call
            to_router = False
        else:
            exchanges = tenant.exchanges
            routes = conn.routes
            if conn.routes_bindings != exchanges.generation or conn.routes_rules != self.security.generation:
                routes.clear()
                conn.routes_bindings = exchanges.generation
                conn.routes_rules = self.security.generation
            # (A headers exchange routes by the headers too: only a publish without any is kept.)
            route = routes.get((exchange, key)) if props.headers is None else None
            if route is None:
                route = self._route(conn, exchanges, exchange, key, props, method)
            queues, to_router, single, first_topic = route
        now = now_ms()  # the message's, and its queue's, time of publication
        try:
            message = message_from_content(
                props, body, first_topic, exchange=exchange, routing_key=key, publisher_id=conn.name, now=now
            )
        except MappingError as exc:
            raise spec.ProtocolError(spec.PRECONDITION_FAILED, str(exc), class_id=60, method_id=40) from None
        message.encoded_properties = encoded
        routed = 0
        if to_router:
            try:
                topic = routing_key_to_topic(key)
            except TopicError:
                topic = ""
            if topic:
                message.topic = tenant.prefix + topic
                self._collecting = entry
                try:
                    routed += self.broker.publish(message)
                finally:
                    self._collecting = None
        known = self.manager.queues  # asked once a queue, not through a call each
        for queue in queues:
            if queue not in known:
                continue
            routed += 1
            queued = message if single is not None else message.copy_with(topic=queue_topic(queue))
            if not self._to_queue(channel, queue, queued, entry, now=now) and entry is not None:
                entry.failed = True
        if not routed and method.mandatory:
            conn.amqp.send_content(
                channel.number, spec.BasicReturn(spec.NO_ROUTE, "NO_ROUTE", exchange, key), props, body
            )
            conn.wake()

    def _route(
        self,
        conn: Amqp091Conn,
        exchanges: ExchangeRegistry,
        exchange: str,
        key: str,
        props: BasicProperties,
        method: spec.BasicPublish,
    ) -> Route:
        """Where a publish through a named exchange goes, asked of the exchange and the rules, and
        kept on the connection (bounded) when the rules let it reach every queue it routes to."""
        try:
            exchanges.check_publish(exchange)
            result = exchanges.route(exchange, key, props.headers)
        except ExchangeError as bad:
            raise spec.ProtocolError(bad.reply_code, bad.reason, class_id=60, method_id=40) from None
        queues, to_router = result.queues, result.to_router
        if conn.principal is not None:
            queues = publish_targets(
                self.security, conn.principal, conn, exchanges, exchange, key, to_router, queues, method
            )
        # One queue and no router: the message is built with its queue topic at once rather than
        # copied per queue.
        single = next(iter(queues)) if len(queues) == 1 and not to_router else None
        route = (tuple(queues), to_router, single, "" if single is None else queue_topic(single))
        if props.headers is None and len(queues) == len(result.queues):  # none left out (logged each time)
            routes = conn.routes
            if len(routes) >= ROUTES_KEPT:
                routes.clear()
            routes[(exchange, key)] = route
        return route

    def _publish_cross(
        self,
        conn: Amqp091Conn,
        channel: ChannelState,
        method: spec.BasicPublish,
        props: BasicProperties,
        body: bytes,
        entry: Pending | None,
        encoded: bytes | None = None,
    ) -> None:
        """The default exchange with key ``$queue/<name>[/<key>]``: the cross-protocol namespace,
        where a queue is created on first use as for MQTT and AMQP 1.0 publishers
        (``queues.auto_create``). Refused (auto_create off, a bad name, a full queue): the confirm
        is a nack and a mandatory publish comes back; never confirmed and dropped."""
        key = method.routing_key
        vhost_prefix: str = conn.tenant.prefix
        parsed = parse_queue_topic(vhost_prefix + key)  # the queue's key in the connection's vhost
        sent = False
        if parsed is not None and parsed[2] is None and not is_reserved(key[len(QUEUE_PREFIX) :]):
            name, sub_key, _ = parsed
            topic = queue_topic(name, sub_key)
            if conn.principal is not None:
                own = topic[len(vhost_prefix) :]  # the rules see the client's names
                creates = name not in self.manager.queues and self.manager.settings.auto_create
                check_queue_publish(self.security, conn.principal, conn, name, own, method, creates)
            message = _content_message(props, body, topic, "", key, conn.name, encoded)
            sent = self._to_queue(channel, name, message, entry, sub_key)
        if sent:
            return
        if entry is not None:
            entry.failed = True
        if method.mandatory:
            conn.amqp.send_content(
                channel.number, spec.BasicReturn(spec.NO_ROUTE, "NO_ROUTE", "", key), props, body
            )
            conn.wake()

    def _direct_reply(self, key: str, props: BasicProperties, body: bytes) -> bool:
        """A reply to a direct reply-to requester: straight to its channel (no queue, no ack).
        False when the requester is gone (the reply is dropped, as RabbitMQ drops it)."""
        channel = self.reply_to.get(key[len(REPLY_PREFIX) :])
        if channel is None or channel.closed:
            return False
        tag = channel.next_tag
        channel.next_tag = tag + 1
        deliver = spec.BasicDeliver(channel.reply_tag, tag, False, "", key)
        if not channel.conn.amqp.send_content(channel.number, deliver, props, body):
            return False
        self.broker.stats.messages_sent += 1
        channel.conn.io.messages_out += 1
        channel.conn.wake()
        return True

    def _to_queue(
        self,
        channel: ChannelState | None,
        queue: str,
        message: Message,
        entry: Pending | None,
        key: str = "",
        now: int | None = None,
    ) -> bool:
        """Append to a queue; ``entry`` (if any) waits for the commit. False: the queue refused it.
        A durable append is remembered on the channel: its own later basic.get waits for it.
        ``now``: the time of the publish (epoch ms), when the caller read it already."""
        if entry is None:
            try:
                ticket = self.manager.publish_nowait(queue, message, key, now=now)
            except QueueError as exc:
                log.debug("amqp091: publish to %s refused: %s", describe(queue), exc)
                return False
        else:
            entry.waiting += 1  # Pending.expect, inline: one more commit to wait for
            try:
                ticket = self.manager.publish_nowait(queue, message, key, done=entry.committed, now=now)
            except QueueError as exc:
                log.debug("amqp091: publish to %s refused: %s", describe(queue), exc)
                entry.waiting -= 1  # never committed; the seal still holds the entry
                return False
        if ticket is not None and channel is not None:
            channel.last_write = ticket
        return True

    def dead_letter_queues(self, exchange: str, routing_key: str, message: Message) -> list[str]:
        """The queue manager's DeadLetterRouter: where a dead letter published now to ``exchange``
        goes (RabbitMQ routes dead letters when they die, with the message's headers). A missing
        exchange routes nowhere (the letter is dropped, as RabbitMQ drops it)."""
        tenant = self.tenant_of(message.topic)  # the dead letter's vhost
        try:
            key = routing_key if exchange else tenant.prefix + routing_key
            result = tenant.exchanges.route(exchange, key, message_headers(message))
        except ExchangeError:
            return []
        if result.to_router:
            try:
                topic = routing_key_to_topic(routing_key)
            except TopicError:
                topic = ""
            if topic:  # amq.topic is the shared router: its subscribers get the letter too
                self.broker.publish(message.copy_with(topic=tenant.prefix + topic))
        return sorted(q for q in result.queues if self.manager.exists(q))

    def stalled(self, conn: Amqp091Conn, consumer: Consumer, idle_s: float) -> None:
        """``consumer``'s queue held its publishers and nothing was settled for ``idle_s`` seconds
        (queue/flow.py): its channel closes with 406 PRECONDITION_FAILED, as RabbitMQ's
        consumer_timeout closes it; its unacknowledged deliveries go back to the queue (the
        channel's release) and the publishers go on."""
        channel = consumer.channel
        number = channel.number
        if channel.closed or conn.channels.get(number) is not channel:
            return
        log.warning(
            "amqp091: %s channel %d: consumer %r of %s settled nothing for %.0f s (%d unacknowledged) "
            "while the queue held its publishers; channel closed so that they go on "
            "(limits.stalled_consumer_timeout_s)",
            conn.name,
            number,
            consumer.tag,
            describe(consumer.queue),
            idle_s,
            len(channel.unacked),
        )
        text = (
            f"PRECONDITION_FAILED - delivery acknowledgement on channel {number} timed out: nothing "
            f"settled for {idle_s:.0f} s while the queue held its publishers"
        )
        conn.amqp.close_channel(number, spec.PRECONDITION_FAILED, text)
        _later(conn, self._drop_channels(conn, [number]))
        conn.wake()

    def deliver_from_router(
        self, binding: RouterBinding, message: Message, tenant: Tenant | None = None
    ) -> None:
        """A router match for a queue (or exchange) bound to amq.topic in ``tenant``'s vhost (``/``
        unless named): append to the queue(s)."""
        if message.retain:
            message = message.copy_with(retain=False)
        if binding.kind == "queue":
            queues: set[str] = {binding.destination}
        else:
            tenant = tenant or self.root
            try:
                key = topic_to_routing_key(message.topic[len(tenant.prefix) :])
                exchanges = tenant.exchanges
                queues = exchanges.route(binding.destination, key, dict(message.user_properties)).queues
            except ExchangeError:
                return
        entry = self._collecting
        for queue in queues:
            if not self.manager.exists(queue):
                continue
            if not self._to_queue(None, queue, message, entry):
                # A router copy (an MQTT or AMQP 1.0 publish bound to this queue): dropped, not a
                # failed publish.
                vhost, name = split_key(queue)
                self.broker.stats.drops.drop(QUEUE_OVERFLOW, vhost, name)


def _content_message(
    props: BasicProperties,
    body: bytes,
    topic: str,
    exchange: str,
    key: str,
    publisher_id: str,
    encoded: bytes | None,
) -> Message:
    """A basic.publish's message, carrying the publisher's property bytes as they came
    (``Message.encoded_properties``); properties that cannot be mapped are PRECONDITION_FAILED."""
    try:
        message = message_from_content(
            props, body, topic, exchange=exchange, routing_key=key, publisher_id=publisher_id
        )
    except MappingError as exc:
        raise spec.ProtocolError(spec.PRECONDITION_FAILED, str(exc), class_id=60, method_id=40) from None
    message.encoded_properties = encoded
    return message


def _kick(conn: Amqp091Conn) -> None:
    """An operator closes the connection (admin API)."""
    conn.kick(spec.CONNECTION_FORCED, "CONNECTION_FORCED - Closed by an administrator")


def _later(conn: Amqp091Conn, step: Awaitable[None] | None) -> None:
    """Run ``step`` in the background: a publish is handled without waiting, even when it closes
    its channel (what the channel held is released meanwhile; it takes no more frames)."""
    if step is None:
        return

    async def run() -> None:
        await step

    conn.io.spawn(run)
