"""The MQTT front end: binds the sans-IO ServerConnection to sockets and to the broker.

One task group per connection: the reader feeds the state machine and acts on its events; the
writer sends whatever the machine has queued, once per wake-up, so replies and fan-out deliveries
leave in batches. Sessions live in ``endpoints`` (one router subscriber per client id) and outlive
connections when their expiry says so; persistent ones are kept in SQL.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import replace
from typing import Any, Final

import anyio
import anyio.to_thread
from anyio.abc import ByteStream, TaskGroup

from trimaran.broker.auth import Authenticator, AuthResult
from trimaran.broker.clients import ClientInfo
from trimaran.broker.core import Broker
from trimaran.broker.events import (
    CLIENT_AUTH_FAILED,
    CLIENT_CONNECTED,
    CLIENT_DISCONNECTED,
    MESSAGE_DROPPED,
    SESSION_CREATED,
    SESSION_EXPIRED,
    SESSION_TAKEN_OVER,
    SUBSCRIPTION_CREATED,
    SUBSCRIPTION_REMOVED,
)
from trimaran.broker.message import PROTOCOL_MQTT, Message
from trimaran.broker.router import Delivery, SubscriptionOptions
from trimaran.broker.topics import TopicError, split_shared
from trimaran.broker.websocket import WebSocketError, WebSocketStream
from trimaran.config import Settings
from trimaran.mqtt.connection import (
    NO_EXPIRY,
    ConnectionClosed,
    ConnectRequest,
    Event,
    MessageAcked,
    MessageDropped,
    PublishReceived,
    ServerConnection,
    ServerLimits,
    SubscribeRequest,
    UnsubscribeReceived,
)
from trimaran.mqtt.mapping import (
    SHARE_TAG,
    FanOutEncoder,
    delivered_retain,
    message_from_outbound,
    message_from_publish,
    outbound,
)
from trimaran.mqtt.queues import LinkQueues, MqttQueues, is_queue_filter
from trimaran.mqtt.reason_codes import ReasonCode
from trimaran.mqtt.session import AWAITING_PUBCOMP, OutboundMessage, Session, Subscription
from trimaran.queue.manager import QueueManager
from trimaran.storage.mqtt_store import MqttStore, StoredSession

log = logging.getLogger(__name__)

READ_CHUNK: Final = 65536
# Will delays, session expiry, session persistence, and the connect and keep-alive timeouts of every
# connection: one sweep is far cheaper than a timer per read per connection.
HOUSEKEEPING_INTERVAL: Final = 0.5


def server_limits(settings: Settings) -> ServerLimits:
    limits = settings.limits
    return ServerLimits(
        max_packet_size=limits.max_packet_size,
        receive_maximum=limits.receive_maximum,
        maximum_qos=limits.maximum_qos,
        retain_available=limits.retain_available,
        topic_alias_maximum=limits.topic_alias_maximum,
        server_keep_alive=limits.max_keep_alive or None,
        connect_timeout=limits.connect_timeout,
        max_inflight_legacy=limits.max_inflight,
        max_queued_messages=limits.session_queue_size,
        maximum_session_expiry=limits.max_session_expiry,
    )


class Link:
    """One network connection and the wake-up its writer waits on."""

    __slots__ = (
        "_wake",
        "client",
        "conn",
        "done",
        "endpoint",
        "front",
        "peer",
        "queue_bindings",
        "reading",
        "stream",
        "tasks",
        "unflushed",
    )

    def __init__(self, front: MqttFrontEnd, conn: ServerConnection, stream: ByteStream, peer: str) -> None:
        self.front = front
        self.conn = conn
        self.stream = stream
        self.peer = peer
        self.endpoint: MqttEndpoint | None = None
        self.client: ClientInfo | None = None  # in the broker's client registry while connected
        self.done = False  # the reader has finished; the writer flushes and ends
        self.reading = anyio.CancelScope()
        self.tasks: TaskGroup | None = None
        self.queue_bindings = LinkQueues()
        self.unflushed = 0  # QoS 0 messages queued since the writer last took the bytes
        self._wake = anyio.Event()

    def spawn(self, job: Callable[[], Coroutine[Any, Any, object]]) -> None:
        """Run a coroutine in this connection's task group (it ends with the connection)."""
        assert self.tasks is not None
        self.tasks.start_soon(job)

    def close(self, reason_code: int, reason: str) -> None:
        """Server-initiated close: DISCONNECT (5.0) after what is queued, then the socket."""
        self.apply(self.conn.disconnect(reason_code, reason))

    def apply(self, events: list[Event]) -> None:
        """Act on events the server caused outside the reader (a close, a timeout); once they close
        the connection, stop the reader so that the writer flushes what is queued and ends."""
        self.front.dispatch(self, events)
        if self.conn.closed:
            self.done = True
            self.reading.cancel()
        self.wake()

    def wake(self) -> None:
        self._wake.set()

    async def wait(self) -> None:
        await self._wake.wait()
        self._wake = anyio.Event()


class MqttEndpoint:
    """The router's subscriber for one client id: its session, and its link while connected."""

    __slots__ = ("client_id", "expires_at", "front", "link", "protocol_level", "session")

    def __init__(self, front: MqttFrontEnd, session: Session, protocol_level: int) -> None:
        self.front = front
        self.client_id = session.client_id
        self.session = session
        self.protocol_level = protocol_level
        self.link: Link | None = None
        self.expires_at: float | None = None  # monotonic; set while offline with a finite expiry

    @property
    def id(self) -> str:
        return self.client_id

    def __hash__(self) -> int:
        return id(self)

    def deliver(self, message: Message, delivery: Delivery[Any], retained: bool = False) -> None:
        front = self.front
        link = self.link
        qos = min(message.qos, delivery.qos)
        if link is None:
            if qos > 0:
                # Offline persistent session: keep QoS 1/2 (bounded by the session's queue).
                if self.session.enqueue(outbound(message, delivery, retained=retained)):
                    front.mark_dirty(self)
                else:
                    front.dropped(message, self.client_id, "session queue full")
            return
        conn = link.conn
        if qos > 0:
            sent = conn.publish(outbound(message, delivery, retained=retained))
        else:
            # A slow reader's QoS 0 backlog is bounded: past the outbox size it is dropped and
            # counted, so it never grows the server's memory or slows the publisher.
            if link.unflushed >= front.outbox_size:
                front.dropped(message, self.client_id, "outbox full")
                return
            link.unflushed += 1
            if message.expires_at_ms is None and not conn.uses_topic_aliases:
                retain = delivered_retain(message, delivery, retained)
                ids = delivery.subscription_identifiers
                sent = conn.publish_encoded(
                    front.fan_out.qos0_publish(message, conn.protocol_level, retain, ids)
                )
            else:
                sent = conn.publish(outbound(message, delivery, retained=retained))
        if sent:
            front.broker.stats.messages_sent += 1
            link.wake()
        else:
            front.dropped(
                message, self.client_id, "refused by the connection: too large, expired or queue full"
            )


class MqttFrontEnd:
    def __init__(
        self,
        broker: Broker,
        settings: Settings,
        store: MqttStore | None = None,
        queues: QueueManager | None = None,
    ) -> None:
        self.broker = broker
        self.queues = MqttQueues(queues) if queues is not None else None
        self.settings = settings
        self.store = store
        self.limits = server_limits(settings)
        self.outbox_size = settings.limits.outbox_size
        self.fan_out = FanOutEncoder()
        self.endpoints: dict[str, MqttEndpoint] = {}
        self.links: set[Link] = set()
        self._wills: dict[str, tuple[float, Message]] = {}  # client id -> (due, will) for delayed wills
        self._dirty: set[str] = set()
        self._deleted: set[str] = set()
        self.auth = Authenticator(settings.auth)
        self._drained: anyio.Event | None = None  # set once shutdown has seen the last link go

    # -- lifecycle --------------------------------------------------------------------------------

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        if self.store is not None:
            stored = await anyio.to_thread.run_sync(self.store.load_sessions)
            self._restore(stored)
        task_status.started()
        while True:
            await anyio.sleep(HOUSEKEEPING_INTERVAL)
            self._housekeeping(time.monotonic())
            await self.persist()

    def _restore(self, stored: Iterable[StoredSession]) -> None:
        now_wall = time.time() * 1000
        now = time.monotonic()
        count = 0
        for row in stored:
            try:
                session = Session.from_json(row.state)
            except (ValueError, KeyError) as exc:
                log.error("mqtt: stored session %r is unreadable (%s); dropped", row.client_id, exc)
                self._deleted.add(row.client_id)
                continue
            endpoint = MqttEndpoint(self, session, row.protocol_level)
            if row.expiry_interval_s != NO_EXPIRY:
                offline_for = max(0.0, (now_wall - (row.disconnected_at or now_wall)) / 1000)
                endpoint.expires_at = now + row.expiry_interval_s - offline_for
            self.endpoints[session.client_id] = endpoint
            for subscription in session.subscriptions.values():
                if not is_queue_filter(subscription.topic_filter):
                    self._route(endpoint, subscription)
            count += 1
        if count:
            log.info("mqtt: restored %d persistent sessions", count)

    async def shutdown(self) -> None:
        """Disconnect every client (5.0: 0x8B server shutting down) and keep persistent sessions."""
        for link in list(self.links):
            events = link.conn.disconnect(ReasonCode.SERVER_SHUTTING_DOWN, "server shutting down")
            for event in events:
                if isinstance(event, ConnectionClosed):
                    event.publish_will = False
            link.apply(events)
        if self.links:
            self._drained = anyio.Event()
            await self._drained.wait()
        self._dirty.update(cid for cid, e in self.endpoints.items() if e.session.expiry_interval)
        await self.persist()

    async def persist(self) -> None:
        """Write changed persistent sessions and forget deleted ones, in one transaction each."""
        if self.store is None or not (self._dirty or self._deleted):
            return
        dirty, self._dirty = self._dirty, set()
        deleted, self._deleted = self._deleted, set()
        now_wall = int(time.time() * 1000)
        rows = []
        for client_id in dirty:
            endpoint = self.endpoints.get(client_id)
            if endpoint is None or not endpoint.session.expiry_interval:
                deleted.add(client_id)
                continue
            rows.append(
                StoredSession(
                    client_id,
                    endpoint.protocol_level,
                    endpoint.session.expiry_interval,
                    None if endpoint.link is not None else now_wall,
                    endpoint.session.to_json().decode(),
                )
            )
        store = self.store
        with anyio.CancelScope(shield=True):
            try:
                await anyio.to_thread.run_sync(store.delete_sessions, deleted - dirty)
                await anyio.to_thread.run_sync(store.save_sessions, rows)
            except Exception:
                log.exception("mqtt: saving sessions failed; will retry")
                self._dirty |= dirty
                self._deleted |= deleted

    def mark_dirty(self, endpoint: MqttEndpoint) -> None:
        if endpoint.session.expiry_interval:
            self._dirty.add(endpoint.client_id)

    def _housekeeping(self, now: float) -> None:
        for link in list(self.links):
            deadline = link.conn.next_deadline()
            if deadline is not None and deadline <= now:
                link.apply(link.conn.check_timeouts(now))
        for client_id, (due, will) in list(self._wills.items()):
            if due <= now:
                del self._wills[client_id]
                self._publish_will(will)
        for endpoint in list(self.endpoints.values()):
            if endpoint.link is None and endpoint.expires_at is not None and endpoint.expires_at <= now:
                log.info("mqtt: session %r expired", endpoint.client_id)
                if self.broker.events.wants(SESSION_EXPIRED):
                    self.broker.events.client(SESSION_EXPIRED, endpoint.client_id, PROTOCOL_MQTT, None, None)
                self._drop_session(endpoint)

    # -- connections ------------------------------------------------------------------------------

    async def handle_websocket(self, stream: ByteStream, peer: str) -> None:
        try:
            ws = await WebSocketStream.accept(
                stream,
                path=self.settings.listeners.mqtt_ws_path,
                max_message_size=self.limits.max_packet_size + 5,
                peer=peer,
            )
        except (WebSocketError, TimeoutError, anyio.BrokenResourceError, OSError):
            return
        await self.handle(ws, peer)

    async def handle(self, stream: ByteStream, peer: str) -> None:
        link = Link(self, ServerConnection(self.limits, now=time.monotonic()), stream, peer)
        self.links.add(link)
        try:
            async with anyio.create_task_group() as tg:
                link.tasks = tg
                tg.start_soon(self._writer, link, tg.cancel_scope)
                with link.reading:
                    await self._reader(link)
                link.done = True
                link.wake()
                # The writer flushes what is queued, then cancels the group (queue control settles
                # still waiting for their commit cannot be answered any more).
        finally:
            self.links.discard(link)
            if self._drained is not None and not self.links:
                self._drained.set()
            if not link.conn.closed:
                self.dispatch(link, link.conn.connection_lost())
            if self.queues is not None:
                await self.queues.detach(link)

    async def _reader(self, link: Link) -> None:
        conn = link.conn
        stats = self.broker.stats
        while not conn.closed:
            try:
                data = await link.stream.receive(READ_CHUNK)
            except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                data = b""
            if not data:
                events = conn.connection_lost()
            else:
                stats.bytes_received += len(data)
                events = conn.receive_data(data, time.monotonic())
            self.dispatch(link, events)
            link.wake()

    async def _writer(self, link: Link, scope: anyio.CancelScope) -> None:
        try:
            await self._write_until_done(link, scope)
        finally:
            scope.cancel()

    async def _write_until_done(self, link: Link, scope: anyio.CancelScope) -> None:
        conn = link.conn
        stats = self.broker.stats
        while True:
            await link.wait()
            data = conn.data_to_send()
            link.unflushed = 0
            if data:
                try:
                    await link.stream.send(data)
                except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                    scope.cancel()
                    return
                stats.bytes_sent += len(data)
                if self.queues is not None:
                    self.queues.after_write(link)
            if link.done:
                return

    # -- events -----------------------------------------------------------------------------------

    def dispatch(self, link: Link, events: list[Event]) -> None:
        for event in events:
            if isinstance(event, PublishReceived):
                self._publish_received(link, event)
            elif isinstance(event, MessageAcked):
                if _is_queue_tag(event.message.tag) and self.queues is not None:
                    self.queues.settled(link, event.message.tag, event.reason_code)
            elif isinstance(event, MessageDropped):
                subscriber = link.endpoint.client_id if link.endpoint else ""
                self.dropped(event.message, subscriber, event.reason)
                if _is_queue_tag(event.message.tag) and self.queues is not None:
                    self.queues.settled(link, event.message.tag, ReasonCode.UNSPECIFIED_ERROR)
            elif isinstance(event, SubscribeRequest):
                self._subscribe(link, event)
            elif isinstance(event, UnsubscribeReceived):
                self._unsubscribe(link, event)
            elif isinstance(event, ConnectRequest):
                self.dispatch(link, self._connect(link, event))
            elif isinstance(event, ConnectionClosed):
                self._connection_closed(link, event)
        if self.queues is not None:
            self.queues.after_events(link)

    def _connect(self, link: Link, request: ConnectRequest) -> list[Event]:
        conn = link.conn
        connect = request.connect
        verdict = self.auth.check(connect.username, connect.password)
        if verdict is not AuthResult.OK:
            refusal = (
                ReasonCode.NOT_AUTHORIZED
                if verdict is AuthResult.ANONYMOUS_REFUSED
                else ReasonCode.BAD_USER_NAME_OR_PASSWORD
            )
            log.info(
                "mqtt: client %r from %s refused (%s, user %r)",
                request.client_id,
                link.peer,
                verdict.value,
                connect.username,
            )
            user = connect.username
            self._client_event(CLIENT_AUTH_FAILED, link, request.client_id, user, reason=verdict.value)
            return conn.reject(refusal)
        client_id = request.client_id
        self._wills.pop(client_id, None)  # a reconnect within the Will Delay Interval cancels the will
        endpoint = self.endpoints.get(client_id)
        if endpoint is not None and endpoint.link is not None:
            old = endpoint.link.peer
            self._client_event(SESSION_TAKEN_OVER, link, client_id, connect.username, previous_address=old)
            log.info("mqtt: client %r taken over by a new connection", client_id)
            endpoint.link.close(ReasonCode.SESSION_TAKEN_OVER, "session taken over")
        if endpoint is not None and connect.clean_start:
            self._drop_session(endpoint)
            endpoint = None
        present = endpoint is not None
        if endpoint is None:
            session = Session(client_id, max_queued=self.limits.max_queued_messages)
            endpoint = self.endpoints[client_id] = MqttEndpoint(self, session, connect.protocol_level)
            self._client_event(SESSION_CREATED, link, client_id, connect.username)
        endpoint.protocol_level = connect.protocol_level
        endpoint.link = link
        endpoint.expires_at = None
        link.endpoint = endpoint
        self.broker.stats.client_connected()
        link.client = self.broker.clients.add(
            ClientInfo(client_id, PROTOCOL_MQTT, link.peer, connect.username, lambda: self._kick(link))
        )
        _forget_queue_deliveries(endpoint.session)
        events = conn.accept(endpoint.session, session_present=present)
        self.mark_dirty(endpoint)
        self._resume_queue_subscriptions(link, endpoint.session)
        self._client_event(
            CLIENT_CONNECTED,
            link,
            client_id,
            connect.username,
            protocol_version=connect.protocol_level,
            session_present=present,
        )
        log.debug(
            "mqtt: client %r connected from %s (level %d)", client_id, link.peer, connect.protocol_level
        )
        return events

    # -- broker events (webhooks): built only when someone listens --------------------------------

    def dropped(self, message: Message | OutboundMessage, subscriber: str, reason: str) -> None:
        """A subscriber's copy of a message was not delivered: count it and tell the event bus (a
        session's copy is turned back into a broker message only when someone listens)."""
        self.broker.stats.messages_dropped += 1
        events = self.broker.events
        if events.wants(MESSAGE_DROPPED):
            if isinstance(message, OutboundMessage):
                message = message_from_outbound(message)
            events.message(MESSAGE_DROPPED, message, subscriber=subscriber, reason=reason)

    def _client_event(
        self, event_type: str, link: Link, client_id: str, user: str | None, **extra: Any
    ) -> None:
        events = self.broker.events
        if events.wants(event_type):
            events.client(event_type, client_id, PROTOCOL_MQTT, link.peer, user, **extra)

    def _subscription_event(self, event_type: str, link: Link, topic_filter: str, **extra: Any) -> None:
        events = self.broker.events
        if events.wants(event_type) and link.client is not None:
            events.client_info(event_type, link.client, topic_filter=topic_filter, **extra)

    def _kick(self, link: Link) -> None:
        """An operator closes the connection (admin API): DISCONNECT 0x98 where the protocol has it."""
        log.info(
            "mqtt: client %r disconnected by an administrator", link.endpoint and link.endpoint.client_id
        )
        link.close(ReasonCode.ADMINISTRATIVE_ACTION, "disconnected by an administrator")

    def delete_session(self, client_id: str) -> bool:
        """An operator ends a session (admin API): a connected client is disconnected first (0x98)
        and its session is not kept whatever its expiry. False if there is no such session."""
        endpoint = self.endpoints.get(client_id)
        if endpoint is None:
            return False
        endpoint.session.expiry_interval = 0
        if endpoint.link is not None:
            self._kick(endpoint.link)  # closing drops the session: its expiry is now 0
        if self.endpoints.get(client_id) is endpoint:
            self._drop_session(endpoint)
        log.info("mqtt: session %r deleted by an administrator", client_id)
        return True

    def _connection_closed(self, link: Link, event: ConnectionClosed) -> None:
        endpoint = link.endpoint
        if link.client is not None:
            self.broker.clients.remove(link.client)
            if self.broker.events.wants(CLIENT_DISCONNECTED):
                self.broker.events.client_info(
                    CLIENT_DISCONNECTED,
                    link.client,
                    reason=event.reason,
                    reason_code=event.reason_code,
                    initiator="client" if event.by_client else "server",
                )
            link.client = None
        if event.reason_code >= 0x80 and not event.by_client:
            log.info(
                "mqtt: closing %s (%s): %s",
                link.peer,
                endpoint.client_id if endpoint else "before CONNECT",
                event.reason,
            )
        if endpoint is None or endpoint.link is not link:
            return  # never accepted, or already handed to a newer connection
        endpoint.link = None
        link.endpoint = None
        self.broker.stats.client_disconnected()
        session = endpoint.session
        connect = link.conn.connect_packet
        if event.publish_will and connect is not None and connect.will is not None:
            will = message_from_publish(connect.will, endpoint.client_id)
            delay = connect.will.properties.will_delay_interval or 0
            if session.expiry_interval != NO_EXPIRY:
                delay = min(delay, session.expiry_interval)
            if delay:
                self._wills[endpoint.client_id] = (time.monotonic() + delay, will)
            else:
                self._publish_will(will)
        if not session.expiry_interval:
            self._drop_session(endpoint)
            return
        if session.expiry_interval != NO_EXPIRY:
            endpoint.expires_at = time.monotonic() + session.expiry_interval
        self.mark_dirty(endpoint)

    def _drop_session(self, endpoint: MqttEndpoint) -> None:
        self.broker.router.unsubscribe_all(endpoint)
        self._hand_over_shared(endpoint.session)
        if self.endpoints.get(endpoint.client_id) is endpoint:
            del self.endpoints[endpoint.client_id]
        pending = self._wills.pop(endpoint.client_id, None)
        if pending is not None:
            self._publish_will(pending[1])  # the session ended before the will delay did
        self._deleted.add(endpoint.client_id)
        self._dirty.discard(endpoint.client_id)

    def _hand_over_shared(self, session: Session) -> None:
        """A share member's session ended: its unacknowledged shared messages go to another member."""
        unfinished: list[OutboundMessage] = [
            entry.message for entry in session.inflight.values() if entry.state != AWAITING_PUBCOMP
        ]
        unfinished.extend(session.queue)
        for out in unfinished:
            tag = out.tag
            if not (isinstance(tag, str) and tag.startswith(SHARE_TAG)):
                continue
            group, _, topic_filter = tag[len(SHARE_TAG) :].partition("\x00")
            members = self.broker.router.share_members(group, topic_filter)
            if not members:
                self.dropped(out, session.client_id, "no share member left")
                continue
            live = [m for m in members if getattr(m.subscriber, "link", None) is not None] or members
            member = live[0]
            options = member.options
            ids = () if options.subscription_identifier is None else (options.subscription_identifier,)
            delivery: Delivery[Any] = Delivery(
                member.subscriber, options.qos, ids, options.retain_as_published, (member,), group
            )
            member.subscriber.deliver(message_from_outbound(out), delivery)

    def _publish_will(self, will: Message) -> None:
        self.broker.stats.messages_received += 1
        self.broker.publish(will)

    def _publish_received(self, link: Link, event: PublishReceived) -> None:
        publish = event.publish
        endpoint = link.endpoint
        assert endpoint is not None
        self.broker.stats.messages_received += 1
        message = message_from_publish(publish, endpoint.client_id)
        if publish.topic.startswith("$queue/"):
            if self.queues is not None:
                self.queues.publish(link, message, publish.packet_id if publish.qos else None)
                return
            log.info("mqtt: %r published to %r but durable queues are off", endpoint.client_id, publish.topic)
        self.broker.publish(message)
        if publish.qos and publish.packet_id is not None:
            link.conn.ack_publish(publish.packet_id)

    # -- subscriptions ----------------------------------------------------------------------------

    def _route(self, endpoint: MqttEndpoint, subscription: Subscription) -> int:
        """Add a session subscription to the router; returns the granted QoS or a failure code."""
        try:
            group, topic_filter = split_shared(subscription.topic_filter)
            options = subscription.options
            self.broker.router.subscribe(
                endpoint,
                topic_filter,
                SubscriptionOptions(
                    qos=options.qos,
                    no_local=options.no_local,
                    retain_as_published=options.retain_as_published,
                    subscription_identifier=subscription.subscription_identifier,
                    share_group=group,
                    retain_handling=options.retain_handling,
                ),
            )
        except TopicError:
            return ReasonCode.TOPIC_FILTER_INVALID
        except ValueError:
            return ReasonCode.PROTOCOL_ERROR
        return options.qos

    def _subscribe(self, link: Link, request: SubscribeRequest) -> None:
        endpoint = link.endpoint
        assert endpoint is not None
        codes: list[int] = []
        retained: list[tuple[str, int, int]] = []  # (filter, granted qos, index)
        queue_filters: list[str] = []
        for index, (topic_filter, options) in enumerate(request.subscriptions):
            preset = request.preset[index]
            if preset is not None:
                codes.append(preset)
                continue
            granted = min(options.qos, self.limits.maximum_qos)
            if is_queue_filter(topic_filter):
                if self.queues is None:
                    codes.append(ReasonCode.IMPLEMENTATION_SPECIFIC_ERROR)
                    continue
                queue_options = replace(options, qos=granted)
                code = self.queues.subscribe(link, topic_filter, queue_options, request.user_properties)
                codes.append(code)
                if code < 0x80:
                    queue_filters.append(topic_filter)
                    self._subscription_event(SUBSCRIPTION_CREATED, link, topic_filter, qos=code)
                continue
            granted_options = replace(options, qos=granted)
            subscription = Subscription(topic_filter, granted_options, request.subscription_identifier)
            code = self._route(endpoint, subscription)
            codes.append(code)
            if code < 0x80:
                self._subscription_event(SUBSCRIPTION_CREATED, link, topic_filter, qos=code)
            if code < 0x80 and not topic_filter.startswith("$share/"):
                wanted = options.retain_handling == 0 or (
                    options.retain_handling == 1 and not request.existed[index]
                )
                if wanted:
                    retained.append((topic_filter, granted, index))
        link.conn.send_suback(request.packet_id, codes)
        self.mark_dirty(endpoint)
        if self.queues is not None:
            for topic_filter in queue_filters:  # deliveries start after the SUBACK
                self.queues.grant_initial_credit(link, link.queue_bindings.subscriptions[topic_filter])
        ids = () if request.subscription_identifier is None else (request.subscription_identifier,)
        for topic_filter, granted, index in retained:
            rap = request.subscriptions[index][1].retain_as_published
            delivery: Delivery[Any] = Delivery(endpoint, granted, ids, rap, ())
            for message in self.broker.retained.match(topic_filter):
                endpoint.deliver(message, delivery, retained=True)

    def _unsubscribe(self, link: Link, event: UnsubscribeReceived) -> None:
        endpoint = link.endpoint
        assert endpoint is not None
        for topic_filter in event.topic_filters:
            self._subscription_event(SUBSCRIPTION_REMOVED, link, topic_filter)
            if is_queue_filter(topic_filter):
                if self.queues is not None:
                    self.queues.unsubscribe(link, topic_filter)
                continue
            try:
                group, plain = split_shared(topic_filter)
            except TopicError:
                continue
            self.broker.router.unsubscribe(endpoint, plain, group)
        self.mark_dirty(endpoint)

    def _resume_queue_subscriptions(self, link: Link, session: Session) -> None:
        """A resumed session's queue subscriptions consume again on the new connection."""
        if self.queues is None:
            return
        for subscription in session.subscriptions.values():
            if is_queue_filter(subscription.topic_filter):
                code = self.queues.subscribe(link, subscription.topic_filter, subscription.options, [])
                if code < 0x80:
                    bound = link.queue_bindings.subscriptions[subscription.topic_filter]
                    self.queues.grant_initial_credit(link, bound)


def _forget_queue_deliveries(session: Session) -> None:
    """Queue deliveries of an earlier connection were handed back to their queue when it closed;
    the queue redelivers them, so the session must not resend them."""
    for packet_id, entry in list(session.inflight.items()):
        if _is_queue_tag(entry.message.tag):
            del session.inflight[packet_id]
    kept = [m for m in session.queue if not _is_queue_tag(m.tag)]
    if len(kept) != len(session.queue):
        session.queue.clear()
        session.queue.extend(kept)


def _is_queue_tag(tag: object) -> bool:
    return tag is not None and not (isinstance(tag, str) and tag.startswith(SHARE_TAG))
