"""The AMQP 0.9.1 front end: binds the sans-IO ServerConnection to sockets, the router and queues.

One task group per connection: the reader feeds the state machine and acts on its events in order
(queue and exchange methods may await their commit; publishes and acks never do); the writer sends
what the machine has queued, once per wake-up; the confirmer sends publisher confirms (and
tx.commit-ok) in publish order once the messages are committed.

Exchanges live in :class:`~trimaran.amqp091.exchanges.ExchangeRegistry`; ``amq.topic`` is the
shared router (a binding there is a router subscription that appends to the queue), every queue
is a queue of the manager (see :mod:`trimaran.amqp091.queues`).
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from dataclasses import dataclass
from typing import Final

import anyio
from anyio.abc import ByteStream, TaskGroup

from trimaran.amqp091 import spec
from trimaran.amqp091.channels import ChannelState, Consumer
from trimaran.amqp091.connection import (
    AuthenticationRequested,
    ChannelClosed,
    ChannelFlowChanged,
    ChannelOpened,
    ConnectionClosed,
    ConnectionClosing,
    ConnectionOpened,
    ConnectionState,
    ContentReceived,
    Event,
    MethodReceived,
    SecureOkReceived,
    ServerConnection,
)
from trimaran.amqp091.exchanges import ExchangeError, ExchangeRegistry
from trimaran.amqp091.mapping import MappingError, message_from_content
from trimaran.amqp091.operations import Operations
from trimaran.amqp091.properties import BasicProperties
from trimaran.amqp091.queues import QueueMeta, RouterBinding
from trimaran.broker.auth import Authenticator, AuthResult
from trimaran.broker.clients import ClientInfo
from trimaran.broker.core import Broker
from trimaran.broker.events import CLIENT_AUTH_FAILED, CLIENT_CONNECTED, CLIENT_DISCONNECTED
from trimaran.broker.message import PROTOCOL_AMQP091, Message
from trimaran.broker.topics import TopicError, routing_key_to_topic, topic_to_routing_key
from trimaran.config import Settings
from trimaran.queue.manager import QueueManager
from trimaran.queue.policy import QueueError, queue_topic
from trimaran.storage.amqp_store import AmqpStore
from trimaran.storage.writer import Ticket, WriterError

log = logging.getLogger(__name__)

READ_CHUNK: Final = 65536
HOUSEKEEPING_INTERVAL: Final = 1.0
GUEST: Final = ("guest", "guest")


@dataclass(slots=True, eq=False)
class Pending:
    """A publish awaiting its commit for a confirm, or a tx.commit awaiting its commit-ok."""

    channel: ChannelState
    seq: int
    tickets: list[Ticket]
    failed: bool = False
    reply: spec.Method | None = None

    def done(self) -> bool:
        return all(t.event is None or t.event.is_set() for t in self.tickets)


class Link:
    """One network connection: its machine, channels, and the wake-ups of its tasks."""

    def __init__(self, front: Amqp091FrontEnd, conn: ServerConnection, stream: ByteStream, peer: str) -> None:
        self.front = front
        self.conn = conn
        self.stream = stream
        self.peer = peer
        self.name = peer
        self.user: str | None = None
        self.client: ClientInfo | None = None
        self.channels: dict[int, ChannelState] = {}
        self.written_hooks: set[ChannelState] = set()
        self.pending: deque[Pending] = deque()
        self.pending_ready = anyio.Event()
        self.exclusive_queues: set[str] = set()
        self.tasks: TaskGroup | None = None
        self.done = False
        self.flushed = anyio.Event()
        self.reading = anyio.CancelScope()
        self._wake = anyio.Event()

    def wake(self) -> None:
        self._wake.set()

    async def wait(self) -> None:
        await self._wake.wait()
        self._wake = anyio.Event()

    def release(self, consumer: Consumer) -> None:
        """A cancelled consumer has nothing unacknowledged left: detach it from its queue."""
        handle = consumer.handle
        if handle is not None and not handle.closed and self.tasks is not None:
            self.tasks.start_soon(handle.cancel)

    def kick(self, code: int, text: str) -> None:
        self.conn.close(code, text)
        self.wake()


class Amqp091FrontEnd:
    def __init__(
        self, broker: Broker, settings: Settings, queues: QueueManager, store: AmqpStore | None = None
    ) -> None:
        self.broker = broker
        self.store = store
        self.settings = settings
        self.config = settings.amqp091
        self.manager = queues
        self.auth = Authenticator(settings.auth)
        self._guest_is_user = any(user.name == GUEST[0] for user in settings.auth.users)
        self.exchanges = ExchangeRegistry()
        self.meta: dict[str, QueueMeta] = {}
        #: queue name -> its consumers (every channel, every connection), for counts and cancels.
        self.consumers: dict[str, set[Consumer]] = {}
        self.router_bindings: dict[tuple[str, str], RouterBinding] = {}
        self.links: set[Link] = set()
        self.ops = Operations(self)
        self._collecting: list[Ticket] | None = None
        self._drained: anyio.Event | None = None

    # -- lifecycle --------------------------------------------------------------------------------

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        await self.ops.restore()
        task_status.started()
        while True:
            await anyio.sleep(HOUSEKEEPING_INTERVAL)
            await self.ops.expire_queues(time.monotonic())

    async def shutdown(self) -> None:
        """Close every connection with 320 CONNECTION_FORCED and wait for them to go."""
        for link in list(self.links):
            link.kick(spec.CONNECTION_FORCED, "CONNECTION_FORCED - broker forced connection closure")
        if self.links:
            self._drained = anyio.Event()
            with anyio.move_on_after(self.config.handshake_timeout):
                await self._drained.wait()

    # -- connections ------------------------------------------------------------------------------

    async def handle(self, stream: ByteStream, peer: str, initial: bytes) -> None:
        config = self.config
        conn = ServerConnection(
            virtual_hosts=config.vhosts,
            channel_max=config.channel_max,
            frame_max=config.frame_max,
            heartbeat=config.heartbeat,
            max_body_size=config.max_message_size,
            now=time.monotonic(),
        )
        link = Link(self, conn, stream, peer)
        self.links.add(link)
        try:
            async with anyio.create_task_group() as tg:
                link.tasks = tg
                tg.start_soon(self._writer, link, tg.cancel_scope)
                tg.start_soon(self._confirmer, link)
                with link.reading:
                    await self._reader(link, initial)
                link.done = True
                link.wake()
                with anyio.move_on_after(5):
                    await link.flushed.wait()
                tg.cancel_scope.cancel()
        finally:
            with anyio.CancelScope(shield=True):
                await self._cleanup(link)
            self.links.discard(link)
            if self._drained is not None and not self.links:
                self._drained.set()

    async def _reader(self, link: Link, initial: bytes) -> None:
        conn = link.conn
        stats = self.broker.stats
        handshake_deadline = time.monotonic() + self.config.handshake_timeout
        data: bytes | None = initial
        while conn.state is not ConnectionState.CLOSED:
            if data is None and conn.state is ConnectionState.OPEN:
                await self.dispatch(link, await self._read_open(link))
                link.wake()
                continue
            if data is None:
                deadline = conn.next_deadline()
                if conn.state is not ConnectionState.OPEN and conn.state is not ConnectionState.CLOSING:
                    deadline = handshake_deadline if deadline is None else min(deadline, handshake_deadline)
                with anyio.move_on_after(math.inf if deadline is None else deadline - time.monotonic()):
                    try:
                        data = await link.stream.receive(READ_CHUNK)
                    except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                        data = b""
            now = time.monotonic()
            if data is None:
                if conn.virtual_host is None and now >= handshake_deadline:
                    log.info("amqp091: %s did not finish the handshake in time; closing", link.peer)
                    return
                events = conn.tick(now)
            else:
                stats.bytes_received += len(data)
                events = conn.receive_data(data, now)
            data = None
            await self.dispatch(link, events)
            link.wake()

    async def _read_open(self, link: Link) -> list[Event]:
        """Read while the connection is open under one timeout scope for the whole run, not one per
        read (a scope costs about as much as decoding a publish): while open, the heartbeat deadline
        only moves later, so a scope entered with it fires at worst early, and then we tick.

        Publishes (content events) are handled here, and never await; the first other event and
        everything after it are returned, to be dispatched outside the scope so that the deadline
        never cancels an operation half-way.
        """
        conn = link.conn
        stats = self.broker.stats
        deadline = conn.next_deadline()
        with anyio.move_on_after(math.inf if deadline is None else deadline - time.monotonic()):
            while conn.state is ConnectionState.OPEN:
                try:
                    data = await link.stream.receive(READ_CHUNK)
                except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                    data = b""
                stats.bytes_received += len(data)
                events = conn.receive_data(data, time.monotonic())
                for i, event in enumerate(events):
                    if type(event) is not ContentReceived:
                        return events[i:]
                    self._content(link, event)
                if conn.has_data_to_send:  # a publish alone answers nothing: no empty writer wake-up
                    link.wake()
        return conn.tick(time.monotonic())

    async def _writer(self, link: Link, scope: anyio.CancelScope) -> None:
        conn = link.conn
        stats = self.broker.stats
        try:
            while True:
                await link.wait()
                data = conn.data_to_send()
                if data:
                    try:
                        await link.stream.send(data)
                    except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                        link.reading.cancel()
                        return
                    stats.bytes_sent += len(data)
                if link.written_hooks:
                    hooks, link.written_hooks = link.written_hooks, set()
                    for channel in hooks:
                        channel.after_write()
                if link.done:
                    return
        finally:
            link.flushed.set()

    async def _confirmer(self, link: Link) -> None:
        """Publisher confirms and tx.commit-ok, in publish order, after the commits."""
        pending = link.pending
        while True:
            while not pending:
                await link.pending_ready.wait()
                link.pending_ready = anyio.Event()
            head = pending[0]
            for ticket in head.tickets:
                if ticket.event is None:
                    continue
                try:
                    await ticket.wait()
                except WriterError:
                    head.failed = True
            acks: dict[ChannelState, int] = {}
            while pending and pending[0].done():
                entry = pending.popleft()
                self._send_confirm(link, entry, acks)
            for channel, seq in acks.items():
                link.conn.send_method(channel.number, spec.BasicAck(seq, True))
            link.wake()

    def _send_confirm(self, link: Link, entry: Pending, acks: dict[ChannelState, int]) -> None:
        channel = entry.channel
        if not entry.failed:
            entry.failed = any(t.error is not None for t in entry.tickets)
        if entry.reply is not None:
            link.conn.send_method(channel.number, entry.reply)
        elif entry.failed:
            seq = acks.pop(channel, None)
            if seq is not None:
                link.conn.send_method(channel.number, spec.BasicAck(seq, True))
            link.conn.send_method(channel.number, spec.BasicNack(entry.seq, False, False))
        else:
            acks[channel] = entry.seq

    def add_pending(self, link: Link, entry: Pending) -> None:
        if not link.pending and entry.done() and entry.reply is None:
            # Nothing before it, nothing to wait for: confirm at once.
            acks: dict[ChannelState, int] = {}
            self._send_confirm(link, entry, acks)
            for channel, seq in acks.items():
                link.conn.send_method(channel.number, spec.BasicAck(seq, False))
            return
        link.pending.append(entry)
        link.pending_ready.set()

    async def _cleanup(self, link: Link) -> None:
        for number in list(link.channels):
            await self.close_channel(link, number)
        for name in list(link.exclusive_queues):
            try:
                await self.ops.delete_queue(name)
            except QueueError:
                log.exception("amqp091: deleting exclusive queue %s failed", name)
        if link.client is not None:
            self.broker.clients.remove(link.client)
            self.broker.stats.client_disconnected()
            if self.broker.events.wants(CLIENT_DISCONNECTED):
                self.broker.events.client_info(CLIENT_DISCONNECTED, link.client)
            link.client = None

    async def close_channel(self, link: Link, number: int) -> None:
        channel = link.channels.pop(number, None)
        if channel is not None:
            await self._release_channel(link, channel)

    async def _release_channel(self, link: Link, channel: ChannelState) -> None:
        """What a closed channel held: its consumers, its queue-manager handles, its auto-delete queues."""
        for consumer in list(channel.consumers.values()):
            self.forget_consumer(consumer)
        for handle in channel.handles():
            await handle.cancel()
        link.written_hooks.discard(channel)
        await self.ops.auto_delete_queues({c.queue for c in channel.consumers.values()})

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

    async def dispatch(self, link: Link, events: list[Event]) -> None:
        conn = link.conn
        for event in events:
            if isinstance(event, ContentReceived):
                self._content(link, event)
            elif isinstance(event, MethodReceived):
                channel = link.channels.get(event.channel)
                if channel is None:
                    continue
                try:
                    await self.ops.method(link, channel, event.method)
                except spec.ProtocolError as exc:
                    await self.refuse(link, event.channel, exc)
            elif isinstance(event, AuthenticationRequested):
                self._authenticate(link, event)
            elif isinstance(event, SecureOkReceived):
                await self.dispatch(link, conn.reject_authentication("unexpected secure-ok"))
            elif isinstance(event, ChannelOpened):
                link.channels[event.channel] = ChannelState(link, event.channel, self.config.prefetch_window)
            elif isinstance(event, ChannelClosed):
                if not event.by_peer or event.reply_code != spec.REPLY_SUCCESS:
                    log.info("amqp091: %s channel %d closed: %s", link.name, event.channel, event.reply_text)
                await self.close_channel(link, event.channel)
            elif isinstance(event, ChannelFlowChanged):
                self._flow(link, event)
            elif isinstance(event, ConnectionOpened):
                self._opened(link, event)
            elif isinstance(event, ConnectionClosing):
                log.info("amqp091: closing connection %s: %s", link.name, event.reply_text)
                for number in list(link.channels):
                    await self.close_channel(link, number)
            elif isinstance(event, ConnectionClosed) and not event.by_peer:
                log.debug("amqp091: connection %s ended: %s", link.name, event.reply_text)

    async def refuse(self, link: Link, number: int, error: spec.ProtocolError) -> None:
        """Raise ``error`` as a channel or connection exception (with a log line saying why)."""
        log.info("amqp091: %s channel %d: %s", link.name, number, error)
        error.channel = number
        link.conn.raise_error(error)
        if error.connection_exception:
            for n in list(link.channels):
                await self.close_channel(link, n)
        else:
            await self.close_channel(link, number)
        link.wake()

    def _authenticate(self, link: Link, event: AuthenticationRequested) -> None:
        conn = link.conn
        if event.username is None:
            verdict = AuthResult.BAD_CREDENTIALS
        elif (event.username, event.password) == GUEST and not self._guest_is_user:
            # RabbitMQ's default guest/guest is what AMQP clients send when they have no account:
            # it is the anonymous login here unless a real user 'guest' is configured.
            verdict = self.auth.check(None, None)
        else:
            verdict = self.auth.check(event.username, event.password)
        if verdict is AuthResult.OK:
            link.user = event.username
            conn.accept_authentication()
            return
        log.info("amqp091: %s refused (%s, user %r)", link.peer, verdict.value, event.username)
        if self.broker.events.wants(CLIENT_AUTH_FAILED):
            peer, user = link.peer, event.username
            self.broker.events.client(
                CLIENT_AUTH_FAILED, peer, PROTOCOL_AMQP091, peer, user, reason=verdict.value
            )
        events = conn.reject_authentication(
            f"Login was refused using authentication mechanism {event.mechanism}. "
            "For details see the broker logfile."
        )
        for ev in events:
            if isinstance(ev, ConnectionClosing | ConnectionClosed):
                link.wake()

    def _opened(self, link: Link, event: ConnectionOpened) -> None:
        name = link.conn.client_properties.get("connection_name")
        link.name = f"{link.peer} ({name})" if isinstance(name, str) and name else link.peer
        self.broker.stats.client_connected()
        link.client = self.broker.clients.add(
            ClientInfo(
                link.name,
                PROTOCOL_AMQP091,
                link.peer,
                link.user,
                lambda: link.kick(spec.CONNECTION_FORCED, "CONNECTION_FORCED - Closed by an administrator"),
            )
        )
        if self.broker.events.wants(CLIENT_CONNECTED):
            self.broker.events.client_info(CLIENT_CONNECTED, link.client, vhost=event.virtual_host)
        log.debug("amqp091: %s opened vhost %s as %r", link.name, event.virtual_host, link.user)

    def _flow(self, link: Link, event: ChannelFlowChanged) -> None:
        channel = link.channels.get(event.channel)
        if channel is None:
            return
        channel.flow_active = event.active
        if event.active:
            channel.refill_all()
        else:
            channel.stop_flow()

    # -- publishing -------------------------------------------------------------------------------

    def _content(self, link: Link, event: ContentReceived) -> None:
        channel = link.channels.get(event.channel)
        method = event.method
        if channel is None or not isinstance(method, spec.BasicPublish):
            return
        self.broker.stats.messages_received += 1
        if channel.tx:
            channel.tx_publishes.append((method, event.properties, event.body))
            return
        try:
            tickets, failed = self.publish(link, channel, method, event.properties, event.body)
        except spec.ProtocolError as exc:
            exc.channel = event.channel
            link.conn.raise_error(exc)
            log.info("amqp091: %s channel %d: %s", link.name, event.channel, exc)
            link.channels.pop(event.channel, None)
            if link.tasks is not None:  # not awaited here: publishes are handled without awaiting
                link.tasks.start_soon(self._release_channel, link, channel)
            return
        if channel.confirm:
            channel.publish_seq += 1
            self.add_pending(link, Pending(channel, channel.publish_seq, tickets, failed))

    def publish(
        self,
        link: Link,
        channel: ChannelState,
        method: spec.BasicPublish,
        props: BasicProperties,
        body: bytes,
    ) -> tuple[list[Ticket], bool]:
        """Route one basic.publish; returns the commit tickets to wait for and whether a queue refused it."""
        exchange, key = method.exchange, method.routing_key
        try:
            self.exchanges.check_publish(exchange)
            result = self.exchanges.route(exchange, key, props.headers)
        except ExchangeError as exc:
            raise spec.ProtocolError(exc.reply_code, exc.reason, class_id=60, method_id=40) from None
        queues = result.queues
        # One queue and no router (the default exchange, the usual case): build the message with
        # its queue topic at once rather than copy it per queue below.
        single = next(iter(queues)) if len(queues) == 1 and not result.to_router else None
        try:
            message = message_from_content(
                props,
                body,
                "" if single is None else queue_topic(single),
                exchange=exchange,
                routing_key=key,
                publisher_id=link.name,
            )
        except MappingError as exc:
            raise spec.ProtocolError(spec.PRECONDITION_FAILED, str(exc), class_id=60, method_id=40) from None
        tickets: list[Ticket] = []
        failed = False
        routed = 0
        if result.to_router:
            try:
                topic = routing_key_to_topic(key)
            except TopicError:
                topic = ""
            if topic:
                message.topic = topic
                self._collecting = tickets
                try:
                    routed += self.broker.publish(message)
                finally:
                    self._collecting = None
        for queue in queues:
            if not self.manager.exists(queue):
                continue
            routed += 1
            queued = message if single is not None else message.copy_with(topic=queue_topic(queue))
            try:
                ticket = self.manager.publish_nowait(queue, queued)
            except QueueError as exc:
                log.debug("amqp091: publish to queue %s refused: %s", queue, exc)
                failed = True
                continue
            if ticket is not None:
                tickets.append(ticket)
        if not routed and method.mandatory:
            link.conn.send_content(
                channel.number, spec.BasicReturn(spec.NO_ROUTE, "NO_ROUTE", exchange, key), props, body
            )
            link.wake()
        return tickets, failed

    def deliver_from_router(self, binding: RouterBinding, message: Message) -> None:
        """A router match for a queue (or exchange) bound to amq.topic: append to the queue(s)."""
        if message.retain:
            message = message.copy_with(retain=False)
        if binding.kind == "queue":
            queues: set[str] = {binding.destination}
        else:
            try:
                key = topic_to_routing_key(message.topic)
                queues = self.exchanges.route(binding.destination, key, dict(message.user_properties)).queues
            except ExchangeError:
                return
        for queue in queues:
            if not self.manager.exists(queue):
                continue
            try:
                ticket = self.manager.publish_nowait(queue, message)
            except QueueError as exc:
                self.broker.stats.messages_dropped += 1
                log.debug("amqp091: router message for queue %s refused: %s", queue, exc)
                continue
            if ticket is not None and self._collecting is not None:
                self._collecting.append(ticket)
