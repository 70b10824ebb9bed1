"""The MQTT front end: the events of each connection's machine to the broker and back.

The connection runtime feeds each machine and hands its events here one packet at a time; replies
and fan-out deliveries are queued on the subscribers' machines and written once per loop iteration.
Sessions live in ``endpoints`` (one router subscriber per client id) and outlive
connections when their expiry says so; persistent ones are kept in SQL.
"""

from __future__ import annotations

import heapq
import logging
import math
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import replace
from typing import Any, Final

import anyio
import anyio.to_thread

from trimaran.alarm import Alarm
from trimaran.broker.core import Broker
from trimaran.broker.drops import NO_SHARE_MEMBER, OFFLINE_QUEUE_FULL, OUTBOX_FULL
from trimaran.broker.events import (
    CLIENT_AUTH_FAILED,
    MESSAGE_DROPPED,
    SESSION_CREATED,
    SESSION_EXPIRED,
    SESSION_TAKEN_OVER,
    SUBSCRIPTION_CREATED,
    SUBSCRIPTION_REMOVED,
)
from trimaran.broker.holders import SessionHolders
from trimaran.broker.message import PROTOCOL_MQTT, Message
from trimaran.broker.router import Delivery, SubscriptionOptions
from trimaran.broker.sessions import SessionInfo, SessionSubscriptionInfo
from trimaran.config import Settings
from trimaran.mqtt.codec import encode_run, run_stretches
from trimaran.mqtt.conn import FrontEnd, MqttConn
from trimaran.mqtt.connection import (
    NO_EXPIRY,
    ConnectionClosed,
    ConnectRequest,
    MessageAcked,
    MessageDropped,
    MessagesAcked,
    ServerConnection,
    ServerLimits,
    SubscribeRequest,
    UnsubscribeReceived,
)
from trimaran.mqtt.mapping import (
    SHARE_TAG,
    FanOutEncoder,
    message_from_outbound,
    message_from_publish,
    outbound,
    run_messages,
)
from trimaran.mqtt.packets import MQTT_5, Publish, PublishRun, granted_options
from trimaran.mqtt.packets import SubscriptionOptions as PacketOptions
from trimaran.mqtt.queues import MqttQueues, is_queue_filter
from trimaran.mqtt.reason_codes import ReasonCode
from trimaran.mqtt.session import (
    AWAITING_PUBCOMP,
    NO_SUBSCRIPTIONS,
    OutboundMessage,
    Session,
    Subscription,
    message_json,
)
from trimaran.queue.manager import QueueManager
from trimaran.runtime.machine import Machine
from trimaran.runtime.transport import Conn
from trimaran.security.guard import (
    AMQ_TOPIC,
    CONFIGURE,
    EXCHANGE,
    QUEUE,
    READ,
    WRITE,
    Login,
    Principal,
    Security,
    is_guarded,
    on_login,
    publish_access,
    publish_resource,
    queue_of,
    subscription_filter,
)
from trimaran.storage.mqtt_store import MqttStore, StoredSession
from trimaran.topics import (
    SHARE_PREFIX,
    TopicError,
    split_shared,
    topic_matches,
)
from trimaran.vhosts import DEFAULT_VHOST, describe, is_reserved, prefix, split_key, split_user, vhost_of

log = logging.getLogger(__name__)


READ_CHUNK: Final = 65536
# How soon changed persistent sessions are saved (together, in one transaction). The housekeeping
# (delayed wills, session expiry, saving) sleeps until what it holds falls due: with nothing, it
# sleeps until told (alarm.py).
SAVE_AFTER_S: Final = 0.5
# QoS 0 bytes queued for one subscriber within one turn of the loop past which they are written at
# once rather than at the turn's end: a turn can read thousands of paced publishers.
WRITE_MARK: Final = 64 * 1024
# Past this (bytes WRITE_MARK could not write: a connection closing), its publishers are held, and a
# run is delivered a message at a time (where the outbox's bound is checked).
PUSH_BACK_BYTES: Final = 256 * 1024


# The owner of every anonymous client's session (Session.owner): one tuple, not one per session. Of
# no fixed length for mypyc's sake: a fixed-length tuple constant is a native value it boxes again at
# each use (48 bytes of every session).
ANONYMOUS: Final[tuple[str | None, ...]] = (None,)


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
        max_queued_bytes=limits.session_queue_bytes,
        maximum_session_expiry=limits.max_session_expiry,
        max_packet_size_unauthenticated=limits.max_packet_size_unauthenticated,
        max_topic_length=limits.max_topic_length,
        max_topic_levels=limits.max_topic_levels,
        max_subscriptions=limits.max_subscriptions_per_client,
        publish_runs=True,  # MqttFrontEnd.run_received
    )


class MqttEndpoint(Session):
    """A client id's session as the router's subscriber: the session itself, and its conn while
    connected. One object, not a session and an endpoint around it: every session has exactly one,
    and an idle connection held both (issue 47)."""

    __slots__ = ("conn", "cut", "expires_at", "front", "protocol_level", "vhost_prefix")

    def __init__(
        self,
        front: MqttFrontEnd,
        client_id: str,
        protocol_level: int,
        *,
        max_queued: int = 1000,
        max_queued_bytes: int = 0,
    ) -> None:
        super().__init__(client_id, max_queued=max_queued, max_queued_bytes=max_queued_bytes)
        self.front = front
        # Its client id is the session's key: the id behind its vhost's prefix (trimaran/vhosts.py).
        # What the router holds for it carries that prefix, which deliveries cut off again.
        self.vhost_prefix = prefix(vhost_of(client_id))
        self.cut = len(self.vhost_prefix)
        self.protocol_level = protocol_level
        self.conn: MqttConn | None = None
        self.expires_at: float | None = None  # monotonic; set while offline with a finite expiry

    @property
    def id(self) -> str:
        return self.client_id

    def __hash__(self) -> int:
        return id(self)

    def deliver(self, message: Message, delivery: Delivery[Any], retained: bool = False) -> None:
        front = self.front
        conn = self.conn
        qos = message.qos
        if delivery.qos < qos:
            qos = delivery.qos
        if conn is None:
            if qos > 0:
                # Offline persistent session: keep QoS 1/2 (bounded by the session's queue).
                if self.enqueue(outbound(message, delivery, self.cut, retained=retained)):
                    front.mark_dirty(self)
                else:
                    front.dropped(message, self.client_id, OFFLINE_QUEUE_FULL)
            return
        machine = conn.mqtt
        if qos > 0:
            wire = None
            if message.expires_at_ms is None and not machine.uses_topic_aliases and not self.queue.items:
                # Encoded once for every subscriber of this level, QoS, retain flag and identifiers;
                # the connection puts in the packet id. Not for one that queues behind others (a
                # reader slower than its publishers): it is encoded at its turn, and bytes cut for
                # it now would be thrown away.
                retain = message.retain and (retained or delivery.retain_as_published)
                ids = delivery.subscription_identifiers
                wire = front.fan_out.publish_around_id(
                    message, self.protocol_level, qos, retain, ids, self.cut
                )
            sent = machine.publish(
                outbound(message, delivery, self.cut, retained=retained, qos=qos, wire=wire)
            )
            queue = self.queue
            if queue.items and queue.over(front.backpressure_messages, front.backpressure_bytes):
                conn.io.push_back()  # behind on what it must be given: its publishers wait for it
        else:
            # A slow reader's QoS 0 backlog is bounded: past the outbox size it is dropped and
            # counted, so it never grows the server's memory or slows the publisher.
            io = conn.io
            if machine.pending_out > WRITE_MARK and io.writable:
                io.send_now()
            if not io.writable or machine.pending_out > PUSH_BACK_BYTES:
                if io.backlog() + machine.pending_out >= front.outbox_bytes:
                    front.dropped(message, self.client_id, OUTBOX_FULL)
                    return
                io.push_back()  # behind: its publishers wait for it instead of losing messages
            if message.expires_at_ms is None and not machine.uses_topic_aliases:
                # The bytes every subscriber of this level, retain flag and identifiers gets, encoded
                # once; delivered_retain() written out.
                retain = message.retain and (retained or delivery.retain_as_published)
                ids = delivery.subscription_identifiers
                sent = machine.publish_encoded(
                    front.fan_out.qos0_publish(message, self.protocol_level, retain, ids, self.cut)
                )
            else:
                sent = machine.publish(outbound(message, delivery, self.cut, retained=retained))
        if sent:
            front.broker.stats.messages_sent += 1
            io = conn.io
            io.messages_out += 1
            if not io.dirty:  # already in this iteration's flush: most deliveries of a batch
                io.wake()
        else:
            front.dropped(message, self.client_id, machine.dropped_why)

    def deliver_run(self, run: PublishRun, delivery: Delivery[Any]) -> bool:
        """A run of plain messages (MqttFrontEnd.run_received) as :meth:`deliver` would deliver
        each, in one call. At QoS 0: the bytes as they came, or as this kind of client gets them,
        encoded once per run. At QoS 1 (a QoS 1 run to a QoS 1 subscription): the bytes as they
        came with this session's packet ids (ServerConnection.publish_qos1_run). False, with
        nothing done, where each must take :meth:`deliver`: a client not connected (at QoS 1),
        with outbound topic aliases, of the other protocol family or with subscription identifiers
        (at QoS 1), one whose Maximum Packet Size a message exceeds, or one that is behind at QoS 0
        (its socket full, or the run would take its outbox past the push-back mark, where deliver
        holds publishers and drops). A QoS 1 run that leaves the session's queue above its
        high-water mark holds the publisher, as deliver does."""
        conn = self.conn
        qos1 = run.qos and delivery.qos
        if conn is None:
            return not qos1  # QoS 0 to an offline session: nothing is kept (as deliver)
        machine = conn.mqtt
        io = conn.io
        v5 = self.protocol_level == MQTT_5
        if qos1:
            if (
                v5 != run.v5
                or (v5 and delivery.subscription_identifiers)
                or not machine.publish_qos1_run(run)
            ):
                return False
            queue = self.queue
            front = self.front
            if queue.items and queue.over(front.backpressure_messages, front.backpressure_bytes):
                io.push_back()  # as deliver
        else:
            if machine.uses_topic_aliases or not io.writable:
                return False
            ids = delivery.subscription_identifiers if v5 else ()
            if v5 == run.v5 and not ids and not run.qos:
                data = run.wire  # the relay's case: the bytes as they came
                largest = run.largest
            else:
                encoded = run.encoded
                if encoded is None:
                    encoded = run.encoded = {}
                key = (v5, ids)
                got = encoded.get(key)
                if got is None:
                    got = encoded[key] = encode_run(run, v5, ids)
                data, largest = got
            if machine.pending_out + len(data) > WRITE_MARK:
                io.send_now()
            if machine.pending_out + len(data) > PUSH_BACK_BYTES or not machine.publish_run(
                data, run.count, largest
            ):
                return False
        count = run.count
        self.front.broker.stats.messages_sent += count
        io.messages_out += count
        if not io.dirty:
            io.wake()
        return True


class MqttFrontEnd(FrontEnd[MqttEndpoint]):
    def __init__(
        self,
        broker: Broker,
        settings: Settings,
        store: MqttStore | None = None,
        queues: QueueManager | None = None,
        security: Security | None = None,
    ) -> None:
        self.broker = broker
        self.queues = MqttQueues(queues) if queues is not None else None
        self.settings = settings
        self.store = store
        self.limits = server_limits(settings)
        self.outbox_bytes = settings.limits.outbox_bytes
        self.backpressure_messages = settings.limits.backpressure_messages
        self.backpressure_bytes = settings.limits.backpressure_bytes
        self.shutting_down = False
        self.fan_out = FanOutEncoder()
        self.endpoints = {}
        self._wills: dict[str, tuple[float, Message]] = {}  # client id -> (due, will) for delayed wills
        # (expires_at, client id) of offline sessions with an expiry: the housekeeping looks at the due
        # ones, not at every session twice a second. An entry whose session came back is skipped.
        self._expiring: list[tuple[float, str]] = []
        self._dirty: set[str] = set()
        self._deleted: set[str] = set()
        self._housekeeper = Alarm()  # the housekeeping's sleep (run), rung by what it must do sooner
        self.security = security if security is not None else Security(settings.auth)
        self.security.on_reload(self._recheck_all)
        # Several nodes: which node holds each session (app.py sets it; alone, every session is ours).
        self.holders: SessionHolders | None = None

    # -- lifecycle --------------------------------------------------------------------------------

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        if self.store is not None:
            stored = await anyio.to_thread.run_sync(self.store.load_sessions)
            if self.holders is not None:
                mine = await self.holders.owned([row.client_id for row in stored])
                stored = [row for row in stored if row.client_id in mine]
            self._restore(stored)
        task_status.started()
        while True:
            await self._housekeeper.sleep(self._housekeeping_wait(time.monotonic()))
            self._housekeeping(time.monotonic())
            await self.persist()

    def _housekeeping_wait(self, now: float) -> float | None:
        """Seconds until the housekeeping has something to do; None: nothing until it is rung."""
        due = math.inf
        if self.store is not None and (self._dirty or self._deleted):
            due = now + SAVE_AFTER_S
        if self._expiring:
            due = min(due, self._expiring[0][0])
        for at, _ in self._wills.values():
            due = min(due, at)
        return None if due == math.inf else max(0.0, due - now)

    def _restore(self, stored: Iterable[StoredSession]) -> None:
        now_wall = time.time() * 1000
        now = time.monotonic()
        count = 0
        for row in stored:
            endpoint = MqttEndpoint(self, row.client_id, row.protocol_level)
            try:
                endpoint.load_json(row.state, row.queued)
            except (ValueError, KeyError) as exc:
                what = describe(row.client_id, "session")
                log.error("mqtt: stored %s is unreadable (%s); dropped", what, exc)
                self._deleted.add(row.client_id)
                continue
            if row.expiry_interval_s != NO_EXPIRY:
                offline_for = max(0.0, (now_wall - (row.disconnected_at or now_wall)) / 1000)
                self._expire_at(endpoint, now + row.expiry_interval_s - offline_for)
            self.endpoints[endpoint.client_id] = endpoint
            self._route_restored(endpoint)
            count += 1
        if count:
            log.info("mqtt: restored %d persistent sessions", count)

    def _route_restored(self, endpoint: MqttEndpoint) -> None:
        """A stored session's subscriptions back in the router, read by its owner's rules (Mosquitto's
        rule, :meth:`_grant`): one that may read only some of its topics checks each message queued
        for it while its client is away; one that may read none is dropped (the rules changed)."""
        owner = endpoint.owner
        principal = None
        if self.security.rules is not None and owner is not None:
            client_id = endpoint.client_id[endpoint.cut :]  # %c: the id the client names
            principal = self.security.principal("mqtt", owner[0], client_id, "")
            principal.vhost = vhost_of(endpoint.client_id)  # whose permission patterns apply
        for topic_filter, subscription in list(endpoint.subscriptions.items()):
            if is_queue_filter(topic_filter):
                continue
            grant = self._grant(principal, endpoint, topic_filter, subscription.options.qos)
            if grant is False:
                who = describe(endpoint.client_id, "client")
                log.warning("mqtt: stored subscription %r of %s dropped by the rules", topic_filter, who)
                endpoint.remove_subscription(topic_filter)
                continue
            self._route(endpoint, subscription, None if grant is True else grant)

    async def shutdown(self) -> None:
        """After the runtime closed every connection (``MqttConn.shutdown``): keep persistent sessions."""
        self._dirty.update(cid for cid, e in self.endpoints.items() if e.expiry_interval)
        await self.persist()

    async def persist(self) -> None:
        """Write changed persistent sessions and forget deleted ones, in one transaction each."""
        if self.store is None or not (self._dirty or self._deleted):
            return
        dirty, self._dirty = self._dirty, set()
        deleted, self._deleted = self._deleted, set()
        now_wall = int(time.time() * 1000)
        rows = []
        saved: list[tuple[Session, int]] = []
        for client_id in dirty:
            endpoint = self.endpoints.get(client_id)
            if endpoint is None or not endpoint.expiry_interval:
                deleted.add(client_id)
                continue
            rows.append(session_row(endpoint, endpoint.protocol_level, endpoint.conn is None, now_wall))
            saved.append((endpoint, endpoint.queue.next_seq))
        store = self.store
        with anyio.CancelScope(shield=True):
            try:
                await anyio.to_thread.run_sync(store.delete_sessions, deleted - dirty)
                await anyio.to_thread.run_sync(store.save_sessions, rows)
            except Exception:
                log.exception("mqtt: saving sessions failed; will retry")
                self._dirty |= dirty
                self._deleted |= deleted
                return
        for session, next_seq in saved:
            session.saved_seq = next_seq

    def mark_dirty(self, endpoint: MqttEndpoint) -> None:
        if endpoint.expiry_interval:
            if not self._dirty:
                self._save_soon()
            self._dirty.add(endpoint.client_id)

    def _save_soon(self) -> None:
        """The first change since the last save: saved within the interval."""
        self._housekeeper.ring_by(time.monotonic() + SAVE_AFTER_S)

    def _housekeeping(self, now: float) -> None:
        for client_id, (due, will) in list(self._wills.items()):
            if due <= now:
                del self._wills[client_id]
                self._publish_will(will)
        expiring = self._expiring
        while expiring and expiring[0][0] <= now:
            at, client_id = heapq.heappop(expiring)
            endpoint = self.endpoints.get(client_id)
            if endpoint is None or endpoint.conn is not None or endpoint.expires_at != at:
                continue  # gone, back, or offline again with a later expiry
            log.info("mqtt: %s expired", describe(endpoint.client_id, "session"))
            if self.broker.events.wants(SESSION_EXPIRED):
                self.broker.events.client(SESSION_EXPIRED, endpoint.client_id, PROTOCOL_MQTT, None, None)
            self._drop_session(endpoint)

    def _expire_at(self, endpoint: MqttEndpoint, at: float) -> None:
        endpoint.expires_at = at
        expiring = self._expiring
        if len(expiring) > 2 * len(self.endpoints) + 1024:  # mostly sessions that came back
            expiring[:] = [
                (e.expires_at, cid)
                for cid, e in self.endpoints.items()
                if e.conn is None and e.expires_at is not None and e is not endpoint
            ]
            heapq.heapify(expiring)
        heapq.heappush(expiring, (at, endpoint.client_id))
        self._housekeeper.ring_by(at)

    # -- connections ------------------------------------------------------------------------------

    def open(self, io: Conn, wrap: Callable[[Machine], Machine] | None = None) -> MqttConn:
        """A new connection on an MQTT listener: its hull for the runtime. ``wrap`` puts a transport
        machine around the MQTT machine (WebSocket)."""
        mqtt = ServerConnection(self.limits, now=time.monotonic())
        mqtt.report_plain_acks = False  # only queue and $share deliveries (tagged) need settling
        return MqttConn(self, mqtt, io, None if wrap is None else wrap(mqtt))

    # -- events -----------------------------------------------------------------------------------

    def handle(self, conn: MqttConn, event: object) -> Awaitable[None] | None:
        """Act on one event of ``conn``'s machine (the runtime hands them out one packet at a time);
        a login that must check a hash returns an awaitable (the connection reads nothing meanwhile)."""
        if isinstance(event, Publish):
            self.publish_received(conn, event)
        elif isinstance(event, MessagesAcked):
            if self.queues is not None:
                self.queues.settled(conn, event.messages, ReasonCode.SUCCESS)
        elif isinstance(event, MessageAcked):
            if self.queues is not None:
                self.queues.settled(conn, (event.message,), event.reason_code)
        elif isinstance(event, MessageDropped):
            subscriber = conn.endpoint.client_id if conn.endpoint else ""
            self.dropped(event.message, subscriber, event.reason)
            if self.queues is not None:
                self.queues.settled(conn, (event.message,), ReasonCode.UNSPECIFIED_ERROR)
        elif isinstance(event, SubscribeRequest):
            self._subscribe(conn, event)
        elif isinstance(event, UnsubscribeReceived):
            self._unsubscribe(conn, event)
        elif isinstance(event, ConnectRequest):
            return self._login(conn, event)
        elif isinstance(event, ConnectionClosed):
            self._connection_closed(conn, event)
        return None

    def _login(self, conn: MqttConn, request: ConnectRequest) -> Awaitable[None] | None:
        connect = request.connect
        security = self.security
        certificate_user = None
        if security.settings.use_identity_as_username and conn.io.peer_certificate() is not None:
            certificate_user = security.certificate_identity(conn.io.peer_certificate())
        named, username = split_user(connect.username)  # RabbitMQ's vhost:user
        vhost = named or self._vhost_for(conn, certificate_user or username)
        key = prefix(vhost) + request.client_id  # the session's key: its client id in its vhost
        verdict = security.login(
            username,
            connect.password,
            conn.io.peer_host,
            protocol="mqtt",
            certificate_user=certificate_user,
            anonymous_without_users=True,  # Mosquitto's rule
            client_id=request.client_id,
            peer=conn.peer,
        )
        if self.holders is not None:
            return self._connect_held(conn, request, verdict, self.holders, vhost, key)
        return on_login(
            verdict,
            lambda login: self._connect(conn, request, login, vhost, key),
            lambda: not conn.mqtt.closed,
        )

    def _vhost_for(self, conn: MqttConn, identity: str | None) -> str:
        """The vhost of a client that names none: its user's or certificate's mapping
        (``auth.vhost_map``), else its listener's (``listeners.vhosts``), else ``/``."""
        settings = self.settings
        mapped = settings.auth.vhost_map.get(identity) if identity is not None else None
        listener = conn.io.listener.replace("-", "_")  # "mqtt-tls" is listeners.mqtt_tls
        return mapped or settings.listeners.vhosts.get(listener) or DEFAULT_VHOST

    async def _connect_held(
        self,
        conn: MqttConn,
        request: ConnectRequest,
        verdict: Login | Awaitable[Login],
        holders: SessionHolders,
        vhost: str,
        client_id: str,
    ) -> None:
        """Several nodes: the session is made ours (taken over from the node holding it, loaded from
        storage) before the CONNACK says whether one is present."""
        login = verdict if isinstance(verdict, Login) else await verdict
        if login.ok and not conn.mqtt.closed and await holders.acquire(client_id):
            stale = self.endpoints.get(client_id)
            if stale is not None and stale.conn is None:
                self.broker.router.unsubscribe_all(stale)
                del self.endpoints[client_id]
            if self.store is not None and client_id not in self.endpoints:
                self._restore(await anyio.to_thread.run_sync(self.store.load_sessions, client_id))
        if not conn.mqtt.closed:
            self._connect(conn, request, login, vhost, client_id)
            if client_id in self.endpoints:
                holders.held(client_id)  # a clean start ended the old session, not the hold

    async def hand_over(self, client_id: str) -> None:
        """Another node takes ``client_id`` over: its client here is disconnected (0x8E), its session
        written whole and forgotten here, without deleting it from storage."""
        endpoint = self.endpoints.get(client_id)
        if endpoint is None:
            return
        conn = endpoint.conn
        if conn is not None:
            endpoint.conn = None
            conn.endpoint = None
            conn.close(ReasonCode.SESSION_TAKEN_OVER, "session taken over by another node")
        self.broker.router.unsubscribe_all(endpoint)
        if self.endpoints.get(client_id) is endpoint:
            del self.endpoints[client_id]
        self._dirty.discard(client_id)
        self._wills.pop(client_id, None)
        if not endpoint.expiry_interval or self.store is None:
            return
        endpoint.saved_seq = None  # the whole queue, replacing what an earlier save wrote
        row = session_row(endpoint, endpoint.protocol_level, True, int(time.time() * 1000))
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(self.store.save_sessions, [row])

    def _connect(
        self, conn: MqttConn, request: ConnectRequest, login: Login, vhost: str, client_id: str
    ) -> None:
        """Accept or refuse a CONNECT; ``client_id`` is the session's key (its id in ``vhost``)."""
        machine = conn.mqtt
        connect = request.connect
        endpoint = self.endpoints.get(client_id)
        principal = self.security.principal("mqtt", login.user, request.client_id, conn.io.peer_host)
        principal.vhost = vhost  # whose permission patterns apply
        reason = login.reason
        refusal: int | None = None
        if login.ok and not self.broker.vhosts.exists(vhost):
            # RabbitMQ's MQTT plugin answers a missing vhost as bad credentials
            reason, refusal = f"vhost {vhost} not found", ReasonCode.BAD_USER_NAME_OR_PASSWORD
        elif login.ok and not self.security.may_enter(login.user, vhost):
            reason = f"access to vhost '{vhost}' refused for user '{login.user or 'guest'}'"
            refusal = ReasonCode.NOT_AUTHORIZED
        elif login.ok and is_reserved(request.client_id):
            reason = "client id names another vhost's session"
            refusal = ReasonCode.CLIENT_IDENTIFIER_NOT_VALID
        elif (
            login.ok
            and endpoint is not None
            and endpoint.owner is not None
            and endpoint.owner != (login.user,)
        ):
            reason = "client id belongs to a session of another user"
        elif (
            login.ok
            and connect.will is not None
            and not (
                self.security.allowed(principal, WRITE, connect.will.topic)
                and self._permits_publish(principal, connect.will.topic)
            )
        ):
            reason = f"will topic {connect.will.topic!r} not writable"
        over = conn.io.enter(login.user, vhost) if reason == "ok" else None
        if over is not None:
            # MQTT 5: Quota exceeded; 3.1.1 has no such code and gets Server unavailable (0x03).
            log.info("mqtt: %s: %s", conn.peer, over)
            self._client_event(CLIENT_AUTH_FAILED, conn, client_id, connect.username, reason=over)
            machine.reject(ReasonCode.QUOTA_EXCEEDED, over)
            return
        if reason != "ok":
            if refusal is None:
                bad = not (login.not_authorized or login.ok)
                refusal = ReasonCode.BAD_USER_NAME_OR_PASSWORD if bad else ReasonCode.NOT_AUTHORIZED
            if login.ok:
                self.security.refused(principal, "connect as", client_id, reason)
            user = connect.username
            self._client_event(CLIENT_AUTH_FAILED, conn, request.client_id, user, reason=reason)
            machine.reject(refusal)
            return
        conn.io.vhost = vhost
        conn.io.user = login.user
        if principal.memo is not None:  # the will's check remembered something (_who)
            conn.principal = principal
        self._wills.pop(client_id, None)  # a reconnect within the Will Delay Interval cancels the will
        if endpoint is not None and endpoint.conn is not None:
            old = endpoint.conn.peer
            self._client_event(SESSION_TAKEN_OVER, conn, client_id, connect.username, previous_address=old)
            log.info("mqtt: %s taken over by a new connection", describe(client_id, "client"))
            endpoint.conn.close(ReasonCode.SESSION_TAKEN_OVER, "session taken over")
        if endpoint is not None and connect.clean_start:
            self._drop_session(endpoint)
            endpoint = None
        present = endpoint is not None
        if endpoint is None:
            endpoint = self.endpoints[client_id] = MqttEndpoint(
                self,
                client_id,
                connect.protocol_level,
                max_queued=self.limits.max_queued_messages,
                max_queued_bytes=self.limits.max_queued_bytes,
            )
            self._client_event(SESSION_CREATED, conn, client_id, connect.username)
        endpoint.protocol_level = connect.protocol_level
        endpoint.owner = ANONYMOUS if login.user is None else (login.user,)
        endpoint.conn = conn
        endpoint.expires_at = None
        conn.endpoint = endpoint
        self.broker.presence.arrived(conn, protocol_version=connect.protocol_level, session_present=present)
        _forget_queue_deliveries(endpoint)
        if present:
            self._recheck(endpoint)  # a resumed session keeps only what this login may read
        machine.accept(endpoint, session_present=present)
        self.mark_dirty(endpoint)
        self._resume_queue_subscriptions(conn, endpoint)
        if log.isEnabledFor(logging.DEBUG):  # (the peer's text is made when asked)
            log.debug(
                "mqtt: client %r connected from %s (level %d)", client_id, conn.peer, connect.protocol_level
            )

    # -- broker events (webhooks): built only when someone listens --------------------------------

    def dropped(self, message: Message | OutboundMessage, subscriber: str, reason: str) -> None:
        """A subscriber's copy of a message was not delivered (``reason``: one of broker/drops.py's):
        count it and tell the event bus (a session's copy is turned back into a broker message only
        when someone listens). ``subscriber`` is the session's key, its vhost's prefix and all."""
        vhost, client_id = split_key(subscriber)
        self.broker.stats.drops.drop(reason, vhost, client_id)
        events = self.broker.events
        if events.wants(MESSAGE_DROPPED):
            if isinstance(message, OutboundMessage):
                message = message_from_outbound(message)
            events.message(MESSAGE_DROPPED, message, subscriber=subscriber, reason=reason)

    def _client_event(
        self, event_type: str, conn: MqttConn, client_id: str, user: str | None, **extra: Any
    ) -> None:
        events = self.broker.events
        if events.wants(event_type):
            events.client(event_type, client_id, PROTOCOL_MQTT, conn.peer, user, **extra)

    def _subscription_event(self, event_type: str, conn: MqttConn, topic_filter: str, **extra: Any) -> None:
        events = self.broker.events
        if events.wants(event_type) and conn.slot >= 0:  # (in the client registry)
            events.client_info(event_type, conn, topic_filter=topic_filter, **extra)

    # -- the session directory (trimaran.broker.sessions.SessionDirectory) ---------------------------

    def session_count(self) -> int:
        return len(self.endpoints)

    def sessions(self) -> list[SessionInfo]:
        return [_session_info(endpoint, False) for endpoint in list(self.endpoints.values())]

    def session(self, client_id: str) -> SessionInfo | None:
        endpoint = self.endpoints.get(client_id)
        return None if endpoint is None else _session_info(endpoint, True)

    def delete_session(self, client_id: str) -> bool:
        """An operator ends a session (admin API): a connected client is disconnected first (0x98)
        and its session is not kept whatever its expiry. False if there is no such session."""
        endpoint = self.endpoints.get(client_id)
        if endpoint is None:
            return False
        endpoint.expiry_interval = 0
        if endpoint.conn is not None:
            endpoint.conn.kick()  # closing drops the session: its expiry is now 0
        if self.endpoints.get(client_id) is endpoint:
            self._drop_session(endpoint)
        log.info("mqtt: %s deleted by an administrator", describe(client_id, "session"))
        return True

    def forget_vhost(self, vhost_prefix: str) -> int:
        """A vhost is deleted: its sessions end (connected clients are disconnected, 0x98) and are
        not kept. Returns how many there were."""
        doomed = [cid for cid in self.endpoints if vhost_prefix and cid.startswith(vhost_prefix)]
        for client_id in doomed:
            self.delete_session(client_id)
        return len(doomed)

    def _connection_closed(self, conn: MqttConn, event: ConnectionClosed) -> None:
        endpoint: MqttEndpoint | None = conn.endpoint
        self.broker.presence.left(
            conn,
            reason=event.reason,
            reason_code=event.reason_code,
            initiator="client" if event.by_client else "server",
        )
        if event.reason_code >= 0x80 and not event.by_client:
            log.info(
                "mqtt: closing %s (%s): %s",
                conn.peer,
                endpoint.client_id if endpoint else "before CONNECT",
                event.reason,
            )
        if endpoint is None or endpoint.conn is not conn:
            return  # never accepted, or already handed to a newer connection
        endpoint.conn = None
        conn.endpoint = None
        connect = conn.mqtt.connect_packet
        publish_will = event.publish_will and not self.shutting_down
        if publish_will and connect is not None and connect.will is not None:
            will = message_from_publish(connect.will, endpoint.client_id, None, endpoint.vhost_prefix)
            delay = connect.will.properties.will_delay_interval or 0
            if endpoint.expiry_interval != NO_EXPIRY:
                delay = min(delay, endpoint.expiry_interval)
            if delay:
                due = time.monotonic() + delay
                self._wills[endpoint.client_id] = (due, will)
                self._housekeeper.ring_by(due)
            else:
                self._publish_will(will)
        if not endpoint.expiry_interval:
            self._drop_session(endpoint)
            return
        if endpoint.expiry_interval != NO_EXPIRY:
            self._expire_at(endpoint, time.monotonic() + endpoint.expiry_interval)
        self.mark_dirty(endpoint)

    def _drop_session(self, endpoint: MqttEndpoint) -> None:
        self.broker.router.unsubscribe_all(endpoint)
        self._hand_over_shared(endpoint)
        if self.endpoints.get(endpoint.client_id) is endpoint:
            del self.endpoints[endpoint.client_id]
        pending = self._wills.pop(endpoint.client_id, None)
        if pending is not None:
            self._publish_will(pending[1])  # the session ended before the will delay did
        if not self._deleted:
            self._save_soon()
        self._deleted.add(endpoint.client_id)
        self._dirty.discard(endpoint.client_id)
        if self.holders is not None:
            self.holders.released(endpoint.client_id)

    def _hand_over_shared(self, session: Session) -> None:
        """A share member's session ended: its unacknowledged shared messages go to another member."""
        unfinished: list[OutboundMessage] = [
            entry for entry in session.inflight_entries() if entry.state != AWAITING_PUBCOMP
        ]
        unfinished.extend(session.queue)
        for out in unfinished:
            tag = out.tag
            if not (isinstance(tag, str) and tag.startswith(SHARE_TAG)):
                continue
            group, _, topic_filter = tag[len(SHARE_TAG) :].partition("\x00")
            members = self.broker.router.share_members(group, topic_filter)
            if not members:
                self.dropped(out, session.client_id, NO_SHARE_MEMBER)
                continue
            live = [m for m in members if getattr(m.subscriber, "conn", None) is not None] or members
            member = live[0]  # its own Delivery (the router's subscription, of this group)
            topic_key = member.subscriber.vhost_prefix + out.topic  # the copy carries the client's topic
            member.subscriber.deliver(message_from_outbound(out, None, topic_key), member)

    def _publish_will(self, will: Message) -> None:
        self.broker.stats.messages_received += 1
        self.broker.publish(will)

    def publish_received(self, conn: MqttConn, publish: Publish) -> None:
        endpoint: MqttEndpoint | None = conn.endpoint
        assert endpoint is not None
        io = conn.io
        if not io.publisher:
            io.publishing()  # the alarms pause the connections that publish
        io.messages_in += 1
        self.broker.stats.messages_received += 1
        principal = conn.principal
        if principal is None:
            principal = conn.principal = self._who(conn)  # its first publish: kept, with its memo
        security = self.security
        # A topic allowed last time under the same rules is allowed again (a publisher mostly
        # repeats its topic: no call then). Without rules only a write to $SYS or $vhost/ is
        # refused (Security.allowed): the rest need not ask.
        memo = principal.memo
        if memo is None or memo.generation != security.generation:
            memo = principal.memo_for(security.generation)  # the first publish, or the rules moved
        if publish.topic != memo.last_write:
            topic = publish.topic
            if security.rules is not None or (topic[0] == "$" and is_guarded(topic)):
                access, target = publish_access(topic)
                if not security.authorize(principal, access, target):
                    self._publish_refused(conn, publish.packet_id if publish.qos else None)
                    return
            # RabbitMQ's patterns: a topic writes amq.topic, allowed once per permissions' generation.
            if (
                (memo.last_exchange is None or topic[0] == "$")
                and not self._permits_publish(principal, topic)
            ) or (memo.keyed and not self._permits_key(principal, WRITE, topic)):
                self._publish_refused(conn, publish.packet_id if publish.qos else None)
                return
            memo.last_write = topic
        message = message_from_publish(
            publish, endpoint.client_id, conn.io.runner.read_at_ms, endpoint.vhost_prefix
        )
        if publish.wire is not None:  # fan_out.received() written out: once per message
            fan_out = self.fan_out
            fan_out.arrived = message
            fan_out.arrived_wire = publish.wire
            fan_out.arrived_v5 = endpoint.protocol_level == MQTT_5
        if publish.topic[0] == "$" and publish.topic.startswith("$queue/"):  # (never empty)
            if self.queues is not None:
                self.queues.publish(conn, message, publish.packet_id if publish.qos else None)
                return
            who = describe(endpoint.client_id, "client")
            log.info("mqtt: %s published to %r but durable queues are off", who, publish.topic)
        self.broker.publish(message)
        if publish.qos and publish.packet_id is not None:
            conn.mqtt.ack_publish(publish.packet_id)

    def run_received(self, conn: MqttConn, run: PublishRun) -> None:
        """A run of plain QoS 0 or QoS 1 PUBLISHes (PublishRun): counted, authorized and routed
        once a topic, taken whole by each subscriber that can (MqttEndpoint.deliver_run), the
        others getting each message as :meth:`publish_received` gives it; then, at QoS 1, one
        PUBACK each. A ``$`` topic ($queue/, refusals), a refused one, a broker that must see each
        publish and a QoS 1 run its own publisher subscribes to have the machine walk the run: each
        PUBLISH its own event, publish_received's. A run whose topics route to different
        subscribers (or share groups) is taken in stretches of one topic."""
        endpoint: MqttEndpoint | None = conn.endpoint
        assert endpoint is not None
        topics = run.topics
        broker = self.broker
        prefix = endpoint.vhost_prefix
        publisher_id = endpoint.client_id
        if topics is None:
            deliveries = None
            if self._takes_run(conn, endpoint, run.topic, run.qos):
                deliveries = broker.route_run(prefix + run.topic, publisher_id, run.count)
            if deliveries is None:
                conn.mqtt.walk_run(run)
                return
            self._take_run(conn, run, deliveries)
        else:
            counts = Counter(topics)
            for topic in counts:
                if not self._takes_run(conn, endpoint, topic, run.qos):
                    conn.mqtt.walk_run(run)
                    return
            routes: dict[str, Sequence[Delivery[Any]]] = {}
            first = None
            alike = True  # every topic to the same deliveries, no share group among them
            for topic, count in counts.items():
                deliveries = broker.route_run(prefix + topic, publisher_id, count)
                if deliveries is None:  # (for every topic, or none)
                    conn.mqtt.walk_run(run)
                    return
                routes[topic] = deliveries
                if first is None:
                    first = deliveries
                    alike = type(first) is tuple
                elif alike and deliveries != first:
                    alike = False
            if alike and first is not None:
                self._take_run(conn, run, first)  # a fleet's topics to one wildcard: the usual case
            else:
                for stretch in run_stretches(run):
                    deliveries = routes.pop(stretch.topic, None)
                    if deliveries is None:  # the topic again: its share groups pick again
                        deliveries = broker.router.match(prefix + stretch.topic, publisher_id)
                    self._take_run(conn, stretch, deliveries)
        if run.qos:
            conn.mqtt.ack_run(run)  # routed: now acknowledged

    def _takes_run(self, conn: MqttConn, endpoint: MqttEndpoint, topic: str, qos: int) -> bool:
        """Whether a run's messages to ``topic`` may be routed together; not where each must be
        walked: a ``$`` topic, a QoS 1 run its publisher hears, a refused topic."""
        # (none is NO_SUBSCRIPTIONS, asked by identity: a lone Subscription's truth is a Python call
        # from the source)
        if topic[0] == "$" or (
            qos and endpoint.subscriptions is not NO_SUBSCRIPTIONS and _hears_itself(endpoint, topic)
        ):
            return False
        principal = conn.principal
        if principal is None:
            principal = conn.principal = self._who(conn)
        security = self.security
        memo = principal.memo
        if memo is None or memo.generation != security.generation:
            memo = principal.memo_for(security.generation)
        if topic != memo.last_write:
            if security.rules is not None:
                access, target = publish_access(topic)
                if not security.authorize(principal, access, target):
                    return False  # each refused as publish_received refuses it
            if (memo.last_exchange is None and not self._permits_publish(principal, topic)) or (
                memo.keyed and not self._permits_key(principal, WRITE, topic)
            ):
                return False  # each refused as publish_received refuses it
            memo.last_write = topic
        return True

    def _take_run(self, conn: MqttConn, run: PublishRun, deliveries: Sequence[Delivery[Any]]) -> None:
        """A routed run to its ``deliveries``: whole to each subscriber that takes it so, one
        message at a time to the others."""
        io = conn.io
        if not io.publisher:
            io.publishing()
        count = run.count
        io.messages_in += count
        broker = self.broker
        broker.stats.messages_received += count
        rest: list[Delivery[Any]] | None = None
        for delivery in deliveries:
            subscriber = delivery.subscriber
            if (
                type(subscriber) is MqttEndpoint
                and delivery.share_group is None
                and subscriber.deliver_run(run, delivery)
            ):
                continue
            if rest is None:
                rest = []
            rest.append(delivery)
        if rest is not None:
            endpoint: MqttEndpoint | None = conn.endpoint
            assert endpoint is not None
            messages = run_messages(run, endpoint.vhost_prefix, endpoint.client_id, io.runner.read_at_ms)
            broker.deliver_each([m for m, _ in messages], rest)

    def _publish_refused(self, conn: MqttConn, packet_id: int | None) -> None:
        """A publish the rules refuse: 5.0 PUBACK/PUBREC 0x87; 3.1.1 has no refusal, the message is
        dropped and acknowledged. Acks of queue publishes still waiting for their commit go first."""
        if packet_id is None:
            return
        code = ReasonCode.NOT_AUTHORIZED if conn.mqtt.protocol_level >= 5 else 0
        if self.queues is not None and conn.uses_queues and conn.queue_bindings.tickets:
            self.queues.acknowledge_in_order(conn, packet_id, code, "not authorized")
        else:
            conn.mqtt.ack_publish(packet_id, code)

    def _permits_publish(self, principal: Principal, topic: str) -> bool:
        """RabbitMQ's patterns for an MQTT publish to ``topic`` (publish_resource: a topic writes
        ``amq.topic``, a ``$queue/`` name ``amq.default``, a settle reads its queue); refused: logged
        and counted. An allowed ``amq.topic`` is remembered on the principal for the generation."""
        security = self.security
        access, kind, name = publish_resource(topic)
        if not security.permits(principal, access, kind, name):
            security.refuse_resource(principal, access, kind, name)
            return False
        if kind == EXCHANGE and not name and not self._permits_creation(principal, queue_of(topic)):
            return False
        memo = principal.memo
        if name == AMQ_TOPIC and memo is not None and memo.generation == security.generation:
            # Only into a memo of this generation, and none made for it: a will's topic, checked at
            # the CONNECT, leaves the idle connection without one (issue 47).
            memo.last_exchange = name
            memo.keyed = security.has_topic_permissions(principal)
        return True

    def _permits_key(self, principal: Principal, access: str, topic: str) -> bool:
        """RabbitMQ's topic permissions on ``amq.topic`` for a publish (write) or a subscription
        (read) to ``topic`` (:meth:`Security.topic_refusal`)."""
        return self.security.topic_refusal(principal, access, topic) is None

    def _permits_creation(self, principal: Principal, queue: str | None) -> bool:
        """A ``$queue/<q>`` that this operation will create (``queues.auto_create``) is configured:
        the patterns must allow configure on ``q``."""
        if queue is None or self.queues is None or not self.settings.queues.auto_create:
            return True
        if prefix(principal.vhost) + queue in self.queues.manager.queues:
            return True
        if self.security.permits(principal, CONFIGURE, QUEUE, queue):
            return True
        self.security.refuse_resource(principal, CONFIGURE, QUEUE, queue)
        return False

    def _permits_subscription(
        self, principal: Principal, endpoint: MqttEndpoint, topic_filter: str, qos: int
    ) -> bool:
        """RabbitMQ's patterns for a subscription, as its MQTT plugin needs them: a ``$queue/<q>``
        filter (also in a share group) consumes, reading queue ``q``; a topic filter declares, binds
        and consumes the client's subscription queue ``mqtt-subscription-<client id>qos<0|1>``
        (configure, write and read on it) bound from ``amq.topic`` (read on that exchange)."""
        security = self.security
        queue = queue_of(subscription_filter(topic_filter))
        if queue is not None:
            if not self._permits_creation(principal, queue):
                return False
            needs = [(READ, QUEUE, queue)]
        else:
            own = f"mqtt-subscription-{endpoint.client_id[endpoint.cut :]}qos{min(qos, 1)}"
            needs = [
                (CONFIGURE, QUEUE, own),
                (READ, QUEUE, own),
                (WRITE, QUEUE, own),
                (READ, EXCHANGE, AMQ_TOPIC),
            ]
        for access, kind, name in needs:
            if not security.permits(principal, access, kind, name):
                security.refuse_resource(principal, access, kind, name)
                return False
        if queue is None and security.has_topic_permissions(principal):
            return self._permits_key(principal, READ, subscription_filter(topic_filter))
        return True

    def _who(self, conn: MqttConn) -> Principal:
        """The principal of a logged-in connection: the one it keeps, or one made from what the
        connection holds (its login's user and vhost, its client id, its peer's address). A
        connection keeps its principal once the principal remembers something (its memo: verdicts,
        refusals told, queues it made; every publisher's), so that one never checked, or checked
        only against the permission patterns, holds none (88 bytes compiled, issue 47)."""
        principal = conn.principal
        if principal is None:
            io = conn.io
            principal = self.security.principal("mqtt", io.user, conn.mqtt.client_id, io.peer_host)
            principal.vhost = io.vhost  # whose permission patterns apply
        return principal

    def _grant(
        self, principal: Principal | None, endpoint: MqttEndpoint, topic_filter: str, qos: int = 0
    ) -> bool | Callable[[str], bool]:
        """May this client subscribe (RabbitMQ's patterns, then :meth:`Security.reading`): True,
        False, or the check each delivery's key goes through. Queues and share groups are read whole
        or not at all."""
        if principal is None:
            return True
        if not self._permits_subscription(principal, endpoint, topic_filter, qos):
            return False
        if is_queue_filter(topic_filter) or topic_filter.startswith("$share/"):
            return self.security.authorize(principal, READ, subscription_filter(topic_filter))
        return self.security.reading(principal, topic_filter, endpoint.cut)

    def _recheck_all(self) -> None:
        """The rules were reloaded: connected clients lose the subscriptions they may no longer read."""
        self.broker.router.forget_matches()  # each topic's deliveries are decided again
        for endpoint in list(self.endpoints.values()):
            if endpoint.conn is not None:
                self._recheck(endpoint)

    def _recheck(self, endpoint: MqttEndpoint) -> None:
        conn = endpoint.conn
        if conn is None:
            return
        principal = self._who(conn)
        routed = self.broker.router.subscriptions_of(endpoint)
        checked = {s.topic_filter[endpoint.cut :] for s in routed if s.options.reads}
        for topic_filter, subscription in list(endpoint.subscriptions.items()):
            grant = self._grant(principal, endpoint, topic_filter, subscription.options.qos)
            if grant is not False:
                if grant is not True or topic_filter in checked:  # (re)bound to this login's rules
                    self._route(endpoint, subscription, None if grant is True else grant)
                continue
            who = describe(endpoint.client_id, "client")
            log.warning("mqtt: subscription %r of %s revoked by the rules", topic_filter, who)
            endpoint.remove_subscription(topic_filter)
            if is_queue_filter(topic_filter):
                if self.queues is not None:
                    self.queues.unsubscribe(conn, topic_filter)
                continue
            try:
                group, plain = split_shared(topic_filter)
            except TopicError:
                continue
            self.broker.router.unsubscribe(endpoint, endpoint.vhost_prefix + plain, group)
        if principal.memo is not None:  # the checks remembered something: kept (_who)
            conn.principal = principal
        self.mark_dirty(endpoint)

    # -- subscriptions ----------------------------------------------------------------------------

    def _route(
        self, endpoint: MqttEndpoint, subscription: Subscription, reads: Callable[[str], bool] | None = None
    ) -> int:
        """Add a session subscription to the router; returns the granted QoS or a failure code.
        ``reads``: the subscriber may read only the topics it says yes to (:meth:`_grant`)."""
        try:
            group, topic_filter = split_shared(subscription.topic_filter)
            options = subscription.options
            self.broker.router.subscribe(
                endpoint,
                endpoint.vhost_prefix + topic_filter,
                _route_options(options, subscription.subscription_identifier, group, reads),
            )
        except TopicError:
            return ReasonCode.TOPIC_FILTER_INVALID
        except ValueError:
            return ReasonCode.PROTOCOL_ERROR
        return options.qos

    def _subscribe(self, conn: MqttConn, request: SubscribeRequest) -> None:
        endpoint: MqttEndpoint | None = conn.endpoint
        assert endpoint is not None
        codes: list[int] = []
        # (filter, granted qos, index, the check of each topic when only some may be read)
        retained: list[tuple[str, int, int, Callable[[str], bool] | None]] = []
        queue_filters: list[str] = []
        principal = self._who(conn)
        for index, (topic_filter, options) in enumerate(request.subscriptions):
            preset = request.preset[index]
            if preset is not None:
                codes.append(preset)
                continue
            granted = min(options.qos, self.limits.maximum_qos)
            grant = self._grant(principal, endpoint, topic_filter, granted)
            if grant is False:
                codes.append(ReasonCode.NOT_AUTHORIZED)  # 3.1.1: 0x80 (the machine maps it)
                continue
            reads = None if grant is True else grant
            if is_queue_filter(topic_filter):
                if self.queues is None:
                    codes.append(ReasonCode.IMPLEMENTATION_SPECIFIC_ERROR)
                    continue
                queue_options = replace(options, qos=granted)
                code = self.queues.subscribe(conn, topic_filter, queue_options, request.user_properties)
                codes.append(code)
                if code < 0x80:
                    queue_filters.append(topic_filter)
                    self._subscription_event(SUBSCRIPTION_CREATED, conn, topic_filter, qos=code)
                continue
            granted_as = granted_options(
                granted, options.no_local, options.retain_as_published, options.retain_handling
            )
            subscription = Subscription(topic_filter, granted_as, request.subscription_identifier)
            code = self._route(endpoint, subscription, reads)
            codes.append(code)
            if code < 0x80:
                self._subscription_event(SUBSCRIPTION_CREATED, conn, topic_filter, qos=code)
            if code < 0x80 and not topic_filter.startswith("$share/"):
                wanted = options.retain_handling == 0 or (
                    options.retain_handling == 1 and not request.existed[index]
                )
                if wanted:
                    retained.append((topic_filter, granted, index, reads))
        if principal.memo is not None:  # the checks remembered something: kept (_who)
            conn.principal = principal
        conn.mqtt.send_suback(request.packet_id, codes)
        self.mark_dirty(endpoint)
        if self.queues is not None:
            for topic_filter in queue_filters:  # deliveries start after the SUBACK
                self.queues.grant_initial_credit(conn, conn.queue_bindings.subscriptions[topic_filter])
        ids = () if request.subscription_identifier is None else (request.subscription_identifier,)
        for topic_filter, granted, index, reads in retained:
            rap = request.subscriptions[index][1].retain_as_published
            delivery: Delivery[Any] = Delivery(endpoint, granted, ids, rap, ())
            for message in self.broker.retained.match(endpoint.vhost_prefix + topic_filter):
                if reads is None or reads(message.topic):
                    endpoint.deliver(message, delivery, retained=True)

    def _unsubscribe(self, conn: MqttConn, event: UnsubscribeReceived) -> None:
        endpoint: MqttEndpoint | None = conn.endpoint
        assert endpoint is not None
        for topic_filter in event.topic_filters:
            self._subscription_event(SUBSCRIPTION_REMOVED, conn, topic_filter)
            if is_queue_filter(topic_filter):
                if self.queues is not None:
                    self.queues.unsubscribe(conn, topic_filter)
                continue
            try:
                group, plain = split_shared(topic_filter)
            except TopicError:
                continue
            self.broker.router.unsubscribe(endpoint, endpoint.vhost_prefix + plain, group)
        self.mark_dirty(endpoint)

    def _resume_queue_subscriptions(self, conn: MqttConn, session: Session) -> None:
        """A resumed session's queue subscriptions consume again on the new connection."""
        if self.queues is None:
            return
        for subscription in session.subscriptions.values():
            if is_queue_filter(subscription.topic_filter):
                code = self.queues.subscribe(conn, subscription.topic_filter, subscription.options, [])
                if code < 0x80:
                    bound = conn.queue_bindings.subscriptions[subscription.topic_filter]
                    self.queues.grant_initial_credit(conn, bound)


def _forget_queue_deliveries(session: Session) -> None:
    """Queue deliveries of an earlier connection were handed back to their queue when it closed;
    the queue redelivers them, so the session must not resend them."""
    inflight = session.inflight
    if not inflight and not session.queue:
        return  # a new or drained session, most of them
    if inflight:
        for packet_id, entry in list(inflight.items()):
            if _is_queue_tag(entry.tag):
                del inflight[packet_id]
    kept = [m for m in session.queue if not _is_queue_tag(m.tag)]
    if len(kept) != len(session.queue):
        session.queue.clear()
        session.queue.extend(kept)


def _hears_itself(endpoint: MqttEndpoint, topic: str) -> bool:
    """Whether a client's own subscriptions may match what it publishes to ``topic``: at QoS 1 it
    then gets each of its messages before that message's PUBACK, as when each was read alone."""
    subscriptions = endpoint.subscriptions
    # A device's one, held alone: from the source, its values() would be a Python call.
    held: Iterable[Subscription] = (
        (subscriptions,) if isinstance(subscriptions, Subscription) else subscriptions.values()
    )
    for subscription in held:
        if subscription.options.no_local:
            continue
        topic_filter = subscription.topic_filter
        if topic_filter.startswith(SHARE_PREFIX):
            topic_filter = split_shared(topic_filter)[1]
        if topic_matches(topic_filter, topic):
            return True
    return False


def _is_queue_tag(tag: object) -> bool:
    return tag is not None and not (isinstance(tag, str) and tag.startswith(SHARE_TAG))


def _route_options(
    options: PacketOptions, identifier: int | None, group: str | None, reads: Callable[[str], bool] | None
) -> SubscriptionOptions:
    """The router's options of a subscription: shared by every subscription alike (96 bytes each
    otherwise, issue 47), up to a bound, since identifiers and share groups are the clients' own.
    Looked up by a tuple of the values: a frozen dataclass made only to be looked up cost a
    subscription three Python-level calls (its __init__, __hash__ and __eq__), compiled too."""
    key: _OptionsKey | None = None
    if reads is None:  # (else a connection's own permission check: never shared)
        key = (
            options.qos,
            options.no_local,
            options.retain_as_published,
            identifier,
            group,
            options.retain_handling,
        )
        kept = _ROUTE_OPTIONS.get(key)
        if kept is not None:
            return kept
    made = SubscriptionOptions(
        qos=options.qos,
        no_local=options.no_local,
        retain_as_published=options.retain_as_published,
        subscription_identifier=identifier,
        share_group=group,
        retain_handling=options.retain_handling,
        reads=reads,
    )
    if key is not None and len(_ROUTE_OPTIONS) < ROUTE_OPTIONS_KEPT:
        _ROUTE_OPTIONS[key] = made
    return made


ROUTE_OPTIONS_KEPT: Final = 4096
# qos, no_local, retain_as_published, identifier, share group, retain_handling
_OptionsKey = tuple[int, bool, bool, int | None, str | None, int]
_ROUTE_OPTIONS: dict[_OptionsKey, SubscriptionOptions] = {}


def session_row(session: Session, protocol_level: int, offline: bool, now_wall: int) -> StoredSession:
    """What one save of a persistent session writes, built on the loop: the session's JSON without
    its queue (subscriptions, inflight, ids: small) and only the queued messages new since the last
    save, a row each. A filling offline session costs the messages it gained, not its whole queue."""
    first_save = session.saved_seq is None
    queue = session.queue
    return StoredSession(
        session.client_id,
        protocol_level,
        session.expiry_interval,
        now_wall if offline else None,
        session.state_json(with_queue=False),
        [(seq, message_json(m)) for seq, m in queue.since(session.saved_seq or 0)],
        queue.first_seq,
        replace=first_save,
    )


def _session_info(endpoint: MqttEndpoint, with_subscriptions: bool) -> SessionInfo:
    expires_in = None
    if endpoint.expires_at is not None:
        expires_in = round(max(0.0, endpoint.expires_at - time.monotonic()), 3)
    subscriptions: tuple[SessionSubscriptionInfo, ...] = ()
    if with_subscriptions:
        subscriptions = tuple(
            SessionSubscriptionInfo(
                topic_filter=s.topic_filter,
                qos=s.options.qos,
                no_local=s.options.no_local,
                retain_as_published=s.options.retain_as_published,
                retain_handling=s.options.retain_handling,
                subscription_identifier=s.subscription_identifier,
            )
            for s in endpoint.subscriptions.values()
        )
    return SessionInfo(
        client_id=endpoint.client_id,
        connected=endpoint.conn is not None,
        protocol_level=endpoint.protocol_level,
        expiry_interval_s=endpoint.expiry_interval,
        expires_in_s=expires_in,
        subscription_count=len(endpoint.subscriptions),
        inflight=len(endpoint.inflight or ()),
        queued=len(endpoint.queue),
        dropped=endpoint.dropped,
        subscriptions=subscriptions,
    )
