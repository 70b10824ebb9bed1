"""Composition root: storage, broker core, listeners and the admin API under one task group.

Shutdown (SIGINT/SIGTERM): stop accepting, let connections finish within the grace period,
flush what was acknowledged, close storage.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import secrets
import signal
import ssl
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import anyio
import anyio.to_thread

from trimaran import __version__, compiled
from trimaran.admin import ui as management_page
from trimaran.admin.api import AdminApi
from trimaran.admin.http import HttpServer
from trimaran.admin.telemetry import FRONT_ENDS, Telemetry
from trimaran.admin.view import (
    BridgeStatus,
    NotReady,
    PermissionOps,
    QueueOps,
    Readiness,
    ServerCounts,
)
from trimaran.admin.webhooks import Webhooks
from trimaran.amqp091.handler import Amqp091FrontEnd
from trimaran.amqp1.handler import SELECTOR_MEMORY, Amqp1FrontEnd
from trimaran.amqp1.selection import parse_selector, selecting
from trimaran.bridges.fleet import BridgeFleet
from trimaran.bridges.link import Link
from trimaran.bridges.mqtt import MqttBridge
from trimaran.bridges.shovel import Shovel
from trimaran.broker.clients import ClientRegistry
from trimaran.broker.core import Broker
from trimaran.broker.message import Message
from trimaran.broker.router import Subscription
from trimaran.broker.sessions import SessionDirectory
from trimaran.config import BridgeSettings, ConfigError, Endpoint, Settings, ShovelSettings, check_settings
from trimaran.errors import bind_failure
from trimaran.mqtt.handler import MqttFrontEnd
from trimaran.net.listeners import Listener, ProtocolListener, amqp_port
from trimaran.net.tls import keep_large_blocks_mapped, server_tls_context
from trimaran.net.websocket import WebSocketMachine
from trimaran.queue.flow import QueueFlow, Stalled
from trimaran.queue.groups import Selects
from trimaran.queue.manager import PublishResult, QueueManager
from trimaran.runtime.flow import BRIDGE, CLUSTER, PLACES, QUEUE, SESSION, Gate
from trimaran.runtime.limits import RESERVED_FILES, RuntimeLimits, raise_open_files
from trimaran.runtime.machine import Machine
from trimaran.runtime.memory import DISK
from trimaran.runtime.poller import available as poller_available
from trimaran.runtime.runner import Runner
from trimaran.runtime.transport import Conn, Hull, HullFactory
from trimaran.security.acl import AclError
from trimaran.security.guard import Security
from trimaran.security.passwords import PasswordFileError
from trimaran.security.permissions import pattern_user
from trimaran.storage.amqp_store import AmqpStore
from trimaran.storage.engine import describe, sqlite_file
from trimaran.storage.limit_store import LimitRows
from trimaran.storage.lock import DataDirLock
from trimaran.storage.mqtt_store import MqttStore
from trimaran.storage.store import Storage
from trimaran.storage.vhost_store import VHostRows
from trimaran.tenant_limits import TenantLimits, UserLimits, VhostLimits
from trimaran.vhosts import DEFAULT_VHOST, VHosts, prefix, split_key, vhost_of

if TYPE_CHECKING:
    from trimaran.cluster.node import ClusterNode

log = logging.getLogger(__name__)


def queue_selector(text: str) -> Selects:
    """An AMQP 0.9.1 consumer's ``x-selector``: a JMS selector read as an AMQP 1.0 queue receiver's
    is (amqp1/selection.py: the same fields of every protocol's messages)."""
    return selecting(parse_selector(text), SELECTOR_MEMORY)


def handshake_deadline(settings: Settings) -> float:
    """The shortest time a client has for its login, whichever protocol it speaks (MQTT's CONNECT,
    AMQP 0.9.1's start to open, AMQP 1.0's SASL and open): the login throttle answers within it."""
    limits = settings.limits
    return min(limits.connect_timeout, limits.handshake_timeout, settings.amqp091.handshake_timeout)


class App:
    """``reread``: the settings read again from where they came (the file, the environment, the
    flags), for a reload of the parts that take new settings while running (the bridges)."""

    def __init__(self, settings: Settings, reread: Callable[[], Settings] | None = None) -> None:
        self.settings = settings
        self._reread = reread
        self.started_at = time.time()
        self.storage: Storage | None = None
        self.broker: Broker | None = None
        self.mqtt: MqttFrontEnd | None = None
        self.amqp091: Amqp091FrontEnd | None = None
        self.amqp1: Amqp1FrontEnd | None = None
        self.queues: QueueManager | None = None
        self.webhooks: Webhooks | None = None
        self.security: Security | None = None
        self.cluster: ClusterNode | None = None
        self.bridge_fleet: BridgeFleet | None = None
        self.runner = Runner(runtime_limits(settings), tenant_limits(settings))
        self.listeners: list[ProtocolListener | Listener] = []
        self.http = HttpServer(
            max_body_bytes=settings.http.max_body_bytes,
            request_timeout_s=settings.http.request_timeout_s,
        )
        self.ready = False
        self._tls: ssl.SSLContext | None = None
        self._stop = anyio.Event()
        self.telemetry = Telemetry(settings.telemetry, node=settings.node_name)
        self.api = AdminApi(self, settings.http, self.telemetry)  # the app as trimaran.admin.view.AdminView
        self.api.register(self.http)
        management_page.register(self.http)

    # -- lifecycle ------------------------------------------------------------------------------

    def request_stop(self) -> None:
        self._stop.set()

    async def run(self) -> None:
        settings = self.settings
        check_settings(settings)
        self._open_files()
        self._tls = self._tls_context()  # a missing certificate is said before any database is created
        if self._tls is not None and not poller_available():
            # The loop's TLS transports serve (no epoll): each one's read buffer resident only as used.
            keep_large_blocks_mapped()
        try:
            self.security = security = Security(settings.auth, handshake_s=handshake_deadline(settings))
        except (PasswordFileError, AclError) as exc:  # a bad password or rule file stops the start
            raise ConfigError(str(exc)) from None
        security.describe_start()
        url = settings.storage.effective_url()
        database = sqlite_file(url)
        lock = DataDirLock(database.parent) if database is not None else None
        if lock is not None:
            lock.acquire()  # before the file is opened: a second server stops here, in one line
        try:
            await self._run(url)
        finally:
            if lock is not None:
                lock.release()

    def _open_files(self) -> None:
        """Take the open files max_connections needs, and hold connections to what there is: one
        past the limit would be reset by the event loop unseen, where the runtime refuses it in a
        log line."""
        limits = self.runner.limits
        wanted = limits.max_connections
        before, now = raise_open_files(wanted + RESERVED_FILES)
        room = max(now - RESERVED_FILES, 1)
        if room < wanted:
            limits.max_connections = room
            # The default (100,000) means "as many as the host allows"; a number set is a promise.
            report = log.warning if "max_connections" in self.settings.limits.model_fields_set else log.info
            report(
                "open files limited to %d (the hard limit): at most %d connections, not %d; "
                "raise the hard limit (ulimit -Hn, systemd LimitNOFILE=) to hold more",
                now,
                room,
                wanted,
            )
        elif now > before:
            log.info("open files: soft limit raised from %d to %d for %d connections", before, now, wanted)

    async def _run(self, url: str) -> None:
        settings = self.settings
        tls = self._tls
        security = self.security
        assert security is not None
        storage = Storage.from_url(
            url,
            sqlite_synchronous=settings.storage.sqlite_synchronous,
            pool_size=settings.storage.pool_size,
            statement_timeout_s=settings.storage.statement_timeout_s,
        )
        self.storage = storage
        log.info("trimaran %s starting, storage %s", __version__, describe(storage.engine))
        log.info("protocol machines: %s", compiled.describe())
        await anyio.to_thread.run_sync(storage.check)  # a damaged or locked file: one line, no wait
        await anyio.to_thread.run_sync(storage.migrate)
        store = MqttStore(storage.engine)
        clustered = settings.cluster.enabled
        vhost_rows = VHostRows(storage.engine)
        vhosts = VHosts(settings.declared_vhosts(), vhost_rows)
        await vhosts.load()
        await anyio.to_thread.run_sync(security.use_permissions, vhost_rows, vhosts.names())
        await anyio.to_thread.run_sync(self.runner.tenants.use_store, LimitRows(storage.engine))
        self.broker = Broker(
            store,
            sys_interval=settings.limits.sys_interval,
            node_name=settings.node_name if clustered else None,
            vhosts=vhosts,
        )
        self.runner.traffic = self.broker.stats  # every protocol's bytes, counted once by the runtime
        self.broker.tenant_figures = self._tenant_figures
        self.broker.sys_figures = self._flow_figures
        self.queues = QueueManager(
            storage,
            settings.queues,
            settings.storage,
            node=self._node_id(),
            shared=self._shared_queues,
            events=self.broker.events,
        )
        self.queues.limits = self.runner.tenants  # one registry: the runtime's and the queues' limits
        self.queues.at_turn_end = self.runner.after_read  # deliveries leave in their publish's turn
        self.queues.flow = queue_flow(settings, self.runner, shared=self._shared_queues)
        # Below storage.min_free_bytes, publishers are paused (connection.blocked) as at the memory
        # watermark: the disk alarm, RabbitMQ's too.
        self.queues.disk.on_change = lambda low: self.runner.alarm(DISK, low)
        self.webhooks = Webhooks(settings.webhooks, self.broker.events, settings.node_name)
        self.mqtt = MqttFrontEnd(self.broker, settings, store, self.queues, security)
        if clustered:
            # Imported here: psycopg comes with the postgresql extra, which a single node may lack.
            from trimaran.cluster.node import ClusterNode

            self.cluster = ClusterNode(
                settings.cluster,
                name=settings.node_name,
                storage=storage,
                broker=self.broker,
                claims_as=self.queues.node,
                statement_timeout_s=settings.storage.statement_timeout_s,
                make_gate=flow_gates(settings, self.runner, CLUSTER),
                stalled_timeout_s=settings.limits.stalled_consumer_timeout_s,
            )
            self.mqtt.holders = self.cluster  # a persistent session is held by one node at a time
            self.cluster.serve(self.mqtt.hand_over)
        amqp_store = AmqpStore(storage.engine)
        self.amqp091 = Amqp091FrontEnd(
            self.broker, settings, self.queues, amqp_store, security, selecting=queue_selector
        )
        self.amqp1 = Amqp1FrontEnd(self.broker, settings, self.queues, security)
        broker, queues = self.broker, self.queues

        def make_bridge(table: BridgeSettings | ShovelSettings) -> Link:
            wiring: dict[str, Any] = {  # what every kind of link is wired to
                "node_name": settings.node_name,
                "runner": self.runner,
                "make_gate": flow_gates(settings, self.runner, BRIDGE),
                "queues": queues,
                "stalled_timeout_s": settings.limits.stalled_consumer_timeout_s,
            }
            if isinstance(table, BridgeSettings):
                return MqttBridge(table, broker, **wiring)
            return Shovel(table, broker, **wiring)

        self.bridge_fleet = BridgeFleet(make_bridge)
        vhosts.on_delete(self._empty_vhost)
        security.on_permission_cleared(self._permission_cleared)
        self.telemetry.bind(
            self.broker, self.queues, self.mqtt, self.webhooks, self.runner, bridges=self.bridge_statuses
        )
        self.telemetry.security = security  # failed logins and refusals in /metrics
        self.listeners = self._build_listeners(tls)
        if settings.http.bind is not None and self.api.locked:
            log.warning("admin API is locked: no http.tokens configured, /api/v1 answers 401 to every call")
        try:
            async with anyio.create_task_group() as root:
                root.start_soon(self._watch_signals, name="signals")
                await root.start(self.runner.run, name="connection runtime")
                await root.start(self.broker.run, name="broker")
                if self.cluster is not None:
                    await root.start(self.cluster.run, name="cluster")
                await root.start(self.webhooks.run, name="webhooks")
                await self.queues.start(root)
                if settings.http.bind is not None:  # (only the management page reads the charts)
                    root.start_soon(self.telemetry.history.run, self, name="history")
                await root.start(self.mqtt.run, name="mqtt sessions")
                await root.start(self.amqp091.run, name="amqp091")
                await self.amqp1.restore()  # durable topic subscriptions fed again
                links = [*settings.bridges, *settings.shovels]
                await root.start(self.bridge_fleet.run, links, name="bridges")
                async with anyio.create_task_group() as listening:
                    for listener in self.listeners:
                        try:
                            await listening.start(listener.serve, name=f"{listener.name} listener")
                        except OSError as exc:
                            raise bind_failure(listener.name, str(listener.endpoint), exc) from None
                    self.ready = True
                    # What start-up built (modules, settings, restored sessions) lives as long as the
                    # server: out of the collector's sight, a full collection walks only what came
                    # later, so thousands of connecting clients no longer pay for the whole heap.
                    gc.freeze()
                    # A message's objects die by reference counting; what a young-generation pass
                    # walks is what is in flight (thousands of messages under load), again every
                    # 700 allocations by default. At 50,000 the passes cost under 1% of a loaded
                    # durable run instead of 8%, a pause of a few ms about once a second.
                    gc.set_threshold(50_000, 10, 10)
                    log.info("trimaran ready")
                    await self._stop.wait()
                    self.ready = False
                    await self._shutdown()
                    listening.cancel_scope.cancel()
                root.cancel_scope.cancel()
        finally:
            storage.close()
            self.telemetry.shutdown()
            log.info("trimaran stopped")

    async def _empty_vhost(self, vhost: str) -> None:
        """``VHosts.delete``: everything in the vhost goes — its connections, MQTT sessions, AMQP
        exchanges and bindings, queues (any protocol's), retained messages, permissions and limits."""
        assert self.broker is not None and self.queues is not None and self.security is not None
        key_prefix = prefix(vhost)
        if self.amqp1 is not None:
            self.amqp1.forget_vhost(key_prefix)
        sessions = self.mqtt.forget_vhost(key_prefix) if self.mqtt is not None else 0
        if self.amqp091 is not None:
            await self.amqp091.forget_vhost(vhost)  # its queues with their AMQP consumers
        queues = [name for name in list(self.queues.queues) if name.startswith(key_prefix)]
        for name in queues:
            await self.queues.delete(name)
        retained = [m.topic for m in self.broker.retained.messages() if m.topic.startswith(key_prefix)]
        for topic in retained:
            self.broker.retained.delete(topic)
        self.security.forget_vhost(vhost)
        await self.runner.tenants.change_vhost(vhost, None)  # its limits too (kept cleared)
        self.runner.forget_vhost(vhost)
        log.info(
            "vhost %s deleted: %d sessions, %d more queues, %d retained messages",
            vhost,
            sessions,
            len(queues),
            len(retained),
        )

    def _permission_cleared(self, user: str, vhost: str) -> None:
        """``user`` may no longer enter ``vhost``: its connections there close, as RabbitMQ closes
        them (AMQP 0.9.1 320 CONNECTION_FORCED, MQTT 5 DISCONNECT 0x98, AMQP 1.0 connection-forced)."""
        assert self.broker is not None
        # Anonymous clients have guest's permissions (security/permissions.py): they go with guest's.
        doomed = [c for c in self.broker.clients if pattern_user(c.user) == user and c.vhost == vhost]
        for client in doomed:
            client.kick()
        if doomed:
            log.info("user '%s' lost vhost '%s': %d connections closed", user, vhost, len(doomed))

    def _flow_figures(self) -> dict[str, int]:
        """Flow control in $SYS, as in /metrics: holds begun per place, consumers closed for taking
        nothing per place, connections held now."""
        stats = self.runner.stats
        stalls = dict.fromkeys((SESSION, QUEUE), 0) | stats.stalls
        if self.queues is not None:
            stalls[QUEUE] += self.queues.flow.closed
        return {
            **{f"$SYS/broker/flow/holds/{place}": stats.holds.get(place, 0) for place in PLACES},
            **{f"$SYS/broker/flow/stalled/{place}": n for place, n in stalls.items()},
            "$SYS/broker/flow/held": stats.held,
        }

    def _tenant_figures(self) -> dict[str, dict[str, int]]:
        """A tenant's $SYS figures the deck does not hold: its connections' traffic (the runtime's
        counters) and its queues (Broker.tenant_sys_values)."""
        assert self.broker is not None
        traffic = self.runner.traffic_by_vhost()
        queues = Counter(vhost_of(name) for name in (self.queues.queues if self.queues is not None else ()))
        figures: dict[str, dict[str, int]] = {}
        for vhost in self.broker.vhosts.names():
            if vhost == DEFAULT_VHOST:
                continue
            messages_in, messages_out, bytes_in, bytes_out = traffic.get(vhost, (0, 0, 0, 0))
            figures[vhost] = {
                "$SYS/broker/messages/received": messages_in,
                "$SYS/broker/messages/sent": messages_out,
                "$SYS/broker/bytes/received": bytes_in,
                "$SYS/broker/bytes/sent": bytes_out,
                "$SYS/broker/queues/count": queues[vhost],
            }
        return figures

    def _node_id(self) -> str:
        """The name this process writes in queue events and claims.

        Shared queues lease claimed messages to a node id; a process restarted under the same id would
        renew its dead predecessor's leases, so each process adds its pid and a random suffix.
        """
        name = self.settings.node_name
        if not self._shared_queues:
            return name
        node = f"{name}-{os.getpid()}-{secrets.token_hex(3)}"
        log.info("shared queues: this process claims messages as node %s", node)
        return node

    @property
    def _shared_queues(self) -> bool:
        """Nodes of a cluster share their durable queues."""
        return self.settings.queues.shared or self.settings.cluster.enabled

    async def _shutdown(self) -> None:
        grace = self.settings.shutdown_grace_s
        log.info("shutting down (grace %.1fs): no new connections", grace)
        self.runner.stop_accepting()
        for listener in self.listeners:
            listener.stop_accepting()
        with anyio.move_on_after(grace):
            await self._drain()
        if self.cluster is not None:
            await self.cluster.leave()  # even after a drain cut short: the others need not wait the time-out
        if self.webhooks is not None:
            await self.webhooks.flush()  # bounded by webhooks.flush_timeout_s

    async def _drain(self) -> None:
        """Let every connection close its protocol's way, then write what is still in memory."""
        assert self.broker is not None and self.mqtt is not None and self.queues is not None
        await self.runner.shutdown()
        if self.bridge_fleet is not None:  # what local publishers gave them goes out before they close
            await self.bridge_fleet.stop()
        await self.mqtt.shutdown()
        await self.queues.stop()
        await self.broker.flush()

    async def _watch_signals(self) -> None:
        with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM, signal.SIGHUP) as signals:
            async for signum in signals:
                log.info("received %s", signal.Signals(signum).name)
                if signum == signal.SIGHUP:
                    if self.security is not None:
                        self.security.reload()  # users and rules; no connection is dropped
                    await self.reload_bridges()
                    continue
                self.request_stop()

    @property
    def bridges(self) -> list[Link]:
        return [] if self.bridge_fleet is None else list(self.bridge_fleet.bridges.values())

    async def reload_bridges(self) -> dict[str, list[str]] | None:
        """The bridges of the settings read again: None when they cannot be read (logged; the
        running bridges go on) or the server was not started from settings it can read again."""
        if self._reread is None or self.bridge_fleet is None:
            return None
        try:
            settings = await anyio.to_thread.run_sync(self._reread)  # a file read: off the loop
        except ConfigError as exc:
            log.error("bridges not reloaded, the settings cannot be read: %s", exc)
            return None
        done = await self.bridge_fleet.reload([*settings.bridges, *settings.shovels])
        return {"added": done.added, "removed": done.removed, "changed": done.changed}

    # -- what the admin API sees (trimaran.admin.view.AdminView) ---------------------------------

    @property
    def node(self) -> str:
        return self.settings.node_name

    async def readiness(self) -> Readiness:
        storage = self.storage
        checks: dict[str, Any] = {
            "storage": storage is not None and await storage.aping(self.settings.storage.ready_timeout_s),
            "listeners": {
                listener.name: str(listener.bound) if listener.bound else None for listener in self.listeners
            },
            "accepting": self.ready,
        }
        broker = self.broker
        if broker is not None and broker.retained_write_error is not None:
            # retained messages PUBACKed but not on disk: kept in memory and retried, not ready
            unwritten, error = broker.retained_unwritten, broker.retained_write_error
            checks["retained_writes"] = f"failing ({unwritten} unwritten): {error}"
        ok = (
            bool(checks["storage"])
            and self.ready
            and all(checks["listeners"].values())
            and "retained_writes" not in checks
        )
        return Readiness(ok, checks)

    def counts(self) -> ServerCounts:
        broker = self._deck()
        stats = broker.stats
        return ServerCounts(
            connections={**dict.fromkeys(FRONT_ENDS, 0), **broker.clients.count_by_protocol()},
            sessions=self.mqtt.session_count() if self.mqtt is not None else 0,
            subscriptions=broker.router.count(),
            retained=broker.retained.count(),
            queues=len(self.queues.queues) if self.queues is not None else 0,
            messages={
                "received": stats.messages_received,
                "sent": stats.messages_sent,
                "dropped": stats.messages_dropped,
                "routed": stats.publish_routed,
            },
            bytes={"received": stats.bytes_received, "sent": stats.bytes_sent},
        )

    def clients(self) -> ClientRegistry:
        return self._deck().clients

    def subscriptions(self) -> Iterator[Subscription[Any]]:
        return self._deck().router.iter_subscriptions()

    def publish(self, message: Message) -> int:
        broker = self._deck()
        broker.stats.messages_received += 1
        return broker.publish(message)

    async def publish_to_queue(self, queue: str, message: Message, routing_key: str) -> PublishResult:
        result = await self.queue_ops().publish(queue, message, routing_key)
        self._deck().stats.messages_received += 1
        return result

    def queue_ops(self) -> QueueOps:
        if self.queues is None:
            raise NotReady("queues")
        return self.queues

    def session_directory(self) -> SessionDirectory:
        if self.mqtt is None:
            raise NotReady("sessions")
        return self.mqtt

    async def cluster_nodes(self) -> dict[str, Any] | None:
        return None if self.cluster is None else await self.cluster.describe()

    def tenant_limits(self) -> TenantLimits:
        return self.runner.tenants

    def vhost_registry(self) -> VHosts:
        if self.broker is None:
            raise NotReady("broker")
        return self.broker.vhosts

    def permission_ops(self) -> PermissionOps:
        if self.security is None:
            raise NotReady("security")
        return self.security

    def reload_security(self) -> bool:
        if self.security is None:
            raise NotReady("security")
        return self.security.reload()

    def bridge_statuses(self) -> list[BridgeStatus]:
        try:
            now = asyncio.get_running_loop().time()
        except RuntimeError:  # OTLP's export thread: no loop there, but asyncio's and uvloop's clock
            now = time.monotonic()  # is the monotonic one
        statuses = []
        for bridge in self.bridges:
            figures = bridge.figures
            statuses.append(
                BridgeStatus(
                    name=bridge.name,
                    kind=bridge.kind,
                    address=figures.address or bridge.configured_address,
                    client_id=bridge.client_id,
                    protocol_version=bridge.protocol_version,
                    vhost=bridge.vhost,
                    state=figures.state,
                    state_for_s=max(0.0, now - figures.since),
                    last_error=figures.last_error,
                    connects=figures.connects,
                    sent=figures.sent,
                    received=figures.received,
                    dropped=figures.dropped,
                    refused=figures.refused,
                    in_flight=figures.in_flight,
                    backlog_bytes=bridge.backlog_bytes,
                    queue=split_key(bridge.queue)[1],
                    topics=bridge.lines,
                )
            )
        return statuses

    def restart_bridge(self, name: str) -> bool:
        bridge = next((bridge for bridge in self.bridges if bridge.name == name), None)
        if bridge is not None:
            bridge.restart()
        return bridge is not None

    def _deck(self) -> Broker:
        if self.broker is None:
            raise NotReady("broker")
        return self.broker

    def _tls_context(self) -> ssl.SSLContext | None:
        bind = self.settings.listeners
        if not (bind.mqtt_tls or bind.mqtt_wss or bind.amqps):
            return None
        try:
            return server_tls_context(bind.tls)
        except (ValueError, OSError) as exc:
            raise ConfigError(f"invalid setting listeners.tls: {exc}") from None

    def _build_listeners(self, tls: ssl.SSLContext | None) -> list[ProtocolListener | Listener]:
        settings = self.settings
        bind = settings.listeners
        mqtt, amqp091, amqp1 = self.mqtt, self.amqp091, self.amqp1
        assert mqtt is not None and amqp091 is not None and amqp1 is not None

        def websocket(mqtt_machine: Machine, peer: str) -> Machine:
            return WebSocketMachine(
                mqtt_machine,
                paths=bind.mqtt_ws_paths,
                origins=bind.mqtt_ws_origins,
                now=time.monotonic(),
                max_message_size=settings.limits.max_packet_size + 5,
                peer=peer,  # for its refusals' log lines
            )

        def plain(io: Conn, _first: bytes) -> Hull:
            return mqtt.open(io)

        def over_websocket(io: Conn, _first: bytes) -> Hull:
            return mqtt.open(io, lambda machine: websocket(machine, io.peer))

        plan: list[tuple[str, Endpoint | None, HullFactory, bool]] = [
            ("mqtt", bind.mqtt, plain, False),
            ("mqtt-tls", bind.mqtt_tls, plain, True),
            ("mqtt-ws", bind.mqtt_ws, over_websocket, False),
            ("mqtt-wss", bind.mqtt_wss, over_websocket, True),
        ]
        if bind.amqp or bind.amqps:
            # AMQP 0.9.1 and 1.0 share the port, told apart by the protocol header.
            amqp = amqp_port(amqp091.open, amqp1.open)
            plan += [("amqp", bind.amqp, amqp, False), ("amqps", bind.amqps, amqp, True)]
        listeners: list[ProtocolListener | Listener] = [
            ProtocolListener(
                name, endpoint, factory, self.runner, tls=tls if secure else None, backlog=bind.backlog
            )
            for name, endpoint, factory, secure in plan
            if endpoint is not None
        ]
        if settings.http.bind is not None:
            listeners.append(
                Listener("http", settings.http.bind, self.http.handle, backlog=bind.backlog, nodelay=True)
            )
        return listeners


def tenant_limits(settings: Settings) -> TenantLimits:
    """The limits per vhost and per user in the settings (the admin API changes them later)."""
    limits = settings.limits
    return TenantLimits(
        {name: VhostLimits(**v.model_dump()) for name, v in limits.vhosts.items()},
        {name: UserLimits(**u.model_dump()) for name, u in limits.users.items()},
        UserLimits(**limits.default_user.model_dump()),
    )


def flow_gates(settings: Settings, runner: Runner, place: str) -> Callable[[Stalled], Gate]:
    """Makes the runtime's gates for a place that holds publishers (a queue, the cluster's
    forwards): each asks about progress a few times per stalled-consumer timeout (at most once a
    second) and is counted by the runtime, per place, when it begins holding."""
    patience = min(1.0, settings.limits.stalled_consumer_timeout_s / 4)
    stats = runner.stats

    def make_gate(stalled: Stalled) -> Gate:
        return Gate(runner, patience, stalled, lambda: stats.began(place))

    return make_gate


def queue_flow(settings: Settings, runner: Runner, *, shared: bool) -> QueueFlow:
    """The queues' backpressure (queue/flow.py) holding publishers with the runtime's gates."""
    limits = settings.limits
    return QueueFlow(
        flow_gates(settings, runner, QUEUE),
        high_messages=limits.queue_backpressure_messages,
        high_bytes=limits.queue_backpressure_bytes,
        timeout_s=limits.stalled_consumer_timeout_s,
        shared=shared,
    )


def runtime_limits(settings: Settings) -> RuntimeLimits:
    limits = settings.limits
    return RuntimeLimits(
        max_connections=limits.max_connections,
        max_connections_per_address=limits.max_connections_per_address,
        accept_rate_per_address=limits.accept_rate_per_address,
        accept_rate=limits.accept_rate,
        accept_burst=limits.accept_burst,
        handshake_timeout_s=limits.handshake_timeout,
        tcp_nodelay=settings.listeners.tcp_nodelay,
        memory_high_watermark=limits.memory_high_watermark,
        memory_low_watermark=limits.memory_low_watermark,
        hold_publishers_s=limits.hold_publishers_s,
        stalled_consumer_timeout_s=limits.stalled_consumer_timeout_s,
    )


def run(settings: Settings, reread: Callable[[], Settings] | None = None) -> None:
    """Run the server until a signal stops it; ``reread``: see :class:`App`."""
    app = App(settings, reread)
    anyio.run(app.run, backend="asyncio", backend_options=_backend_options())


def _backend_options() -> dict[str, Any]:
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return {}
    return {"use_uvloop": True}
