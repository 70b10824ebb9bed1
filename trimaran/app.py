"""Composition root: storage, broker core, listeners and the admin API under one task group.

Shutdown (SIGINT/SIGTERM): stop accepting, let connections finish within the grace period,
flush what was acknowledged, close storage.
"""

from __future__ import annotations

import logging
import os
import secrets
import signal
import time
from typing import Any

import anyio
import anyio.to_thread
from anyio.abc import TaskGroup

from trimaran import __version__
from trimaran.amqp091.handler import Amqp091FrontEnd
from trimaran.amqp1.handler import Amqp1FrontEnd
from trimaran.broker.api import AdminApi
from trimaran.broker.core import Broker
from trimaran.broker.http import HttpServer
from trimaran.broker.listeners import AmqpPort, ConnectionHandler, Listener, server_tls_context
from trimaran.broker.telemetry import Telemetry
from trimaran.broker.webhooks import Webhooks
from trimaran.config import ConfigError, Endpoint, Settings, check_settings
from trimaran.mqtt.handler import MqttFrontEnd
from trimaran.queue.manager import QueueManager
from trimaran.storage.amqp_store import AmqpStore
from trimaran.storage.engine import describe
from trimaran.storage.mqtt_store import MqttStore
from trimaran.storage.store import Storage

log = logging.getLogger(__name__)


class App:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.started_at = time.time()
        self.storage: Storage | None = None
        self.broker: Broker | None = None
        self.mqtt: MqttFrontEnd | None = None
        self.amqp091: Amqp091FrontEnd | None = None
        self.amqp1: Amqp1FrontEnd | None = None
        self.queues: QueueManager | None = None
        self.webhooks: Webhooks | None = None
        self.listeners: list[Listener] = []
        self.http = HttpServer(
            max_body_bytes=settings.http.max_body_bytes,
            request_timeout_s=settings.http.request_timeout_s,
        )
        self.ready = False
        self._stop = anyio.Event()
        self.telemetry = Telemetry(settings.telemetry, node=settings.node_name)
        self.api = AdminApi(self)
        self.api.register(self.http)

    # -- lifecycle ------------------------------------------------------------------------------

    def request_stop(self) -> None:
        self._stop.set()

    async def run(self) -> None:
        settings = self.settings
        check_settings(settings)
        url = settings.storage.effective_url()
        storage = Storage.from_url(
            url, sqlite_synchronous=settings.storage.sqlite_synchronous, pool_size=settings.storage.pool_size
        )
        self.storage = storage
        log.info("trimaran %s starting, storage %s", __version__, describe(storage.engine))
        await anyio.to_thread.run_sync(storage.migrate)
        store = MqttStore(storage.engine)
        self.broker = Broker(store, sys_interval=settings.limits.sys_interval)
        self.queues = QueueManager(
            storage,
            settings.queues,
            settings.storage,
            node=self._node_id(),
            shared=settings.queues.shared,
            events=self.broker.events,
        )
        self.webhooks = Webhooks(settings.webhooks, self.broker.events, settings.node_name)
        self.mqtt = MqttFrontEnd(self.broker, settings, store, self.queues)
        self.amqp091 = Amqp091FrontEnd(self.broker, settings, self.queues, AmqpStore(storage.engine))
        self.amqp1 = Amqp1FrontEnd(self.broker, settings, self.queues)
        self.telemetry.bind(self.broker, self.queues, self.mqtt, self.webhooks)
        self.listeners = self._build_listeners()
        if settings.http.bind is not None and self.api.locked:
            log.warning("admin API is locked: no http.tokens configured, /api/v1 answers 401 to every call")
        try:
            async with anyio.create_task_group() as root:
                root.start_soon(self._watch_signals, name="signals")
                await root.start(self.broker.run, name="broker")
                await root.start(self.webhooks.run, name="webhooks")
                await self.queues.start(root)
                await root.start(self.mqtt.run, name="mqtt sessions")
                await root.start(self.amqp091.run, name="amqp091")
                async with anyio.create_task_group() as connections:
                    await self._start_listeners(connections)
                    self.ready = True
                    log.info("trimaran ready")
                    await self._stop.wait()
                    self.ready = False
                    await self._shutdown(connections)
                root.cancel_scope.cancel()
        finally:
            storage.close()
            self.telemetry.shutdown()
            log.info("trimaran stopped")

    def _node_id(self) -> str:
        """The name this process writes in queue events and claims.

        Shared queues lease claimed messages to a node id; a process restarted under the same id would
        renew its dead predecessor's leases, so each process adds its pid and a random suffix.
        """
        name = self.settings.node_name
        if not self.settings.queues.shared:
            return name
        node = f"{name}-{os.getpid()}-{secrets.token_hex(3)}"
        log.info("shared queues: this process claims messages as node %s", node)
        return node

    async def _start_listeners(self, connections: TaskGroup) -> None:
        for listener in self.listeners:
            await connections.start(listener.serve, connections, name=f"{listener.name} listener")

    async def _shutdown(self, connections: TaskGroup) -> None:
        grace = self.settings.shutdown_grace_s
        log.info("shutting down (grace %.1fs): no new connections", grace)
        for listener in self.listeners:
            listener.stop_accepting()
        with anyio.move_on_after(grace):
            await self._drain()
        if self.webhooks is not None:
            await self.webhooks.flush()  # bounded by webhooks.flush_timeout_s
        connections.cancel_scope.cancel()

    async def _drain(self) -> None:
        """Let the front ends close their connections, then write what is still in memory."""
        assert self.broker is not None and self.mqtt is not None and self.queues is not None
        await self.mqtt.shutdown()
        if self.amqp091 is not None:
            await self.amqp091.shutdown()
        if self.amqp1 is not None:
            await self.amqp1.shutdown()
        await self.queues.stop()
        await self.broker.flush()

    async def _watch_signals(self) -> None:
        with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async for signum in signals:
                log.info("received %s", signal.Signals(signum).name)
                self.request_stop()

    def _build_listeners(self) -> list[Listener]:
        settings = self.settings
        bind = settings.listeners
        assert self.mqtt is not None and self.amqp091 is not None and self.amqp1 is not None
        tls = None
        if bind.mqtt_tls or bind.mqtt_wss or bind.amqps:
            try:
                tls = server_tls_context(bind.tls)
            except (ValueError, OSError) as exc:
                raise ConfigError(f"invalid setting listeners.tls: {exc}") from None
        # AMQP 0.9.1 and 1.0 share the port, told apart by the protocol header.
        # AMQP 1.0 runs on the connection runtime (Amqp1FrontEnd.open); until the port is wired
        # onto it, an AMQP 1.0 header is answered as one the port does not serve.
        amqp = AmqpPort(self.amqp091.handle, None)
        plan: list[tuple[str, Endpoint | None, ConnectionHandler, bool]] = [
            ("mqtt", bind.mqtt, self.mqtt.handle, False),
            ("mqtt-tls", bind.mqtt_tls, self.mqtt.handle, True),
            ("mqtt-ws", bind.mqtt_ws, self.mqtt.handle_websocket, False),
            ("mqtt-wss", bind.mqtt_wss, self.mqtt.handle_websocket, True),
            ("amqp", bind.amqp, amqp.handle, False),
            ("amqps", bind.amqps, amqp.handle, True),
            ("http", settings.http.bind, self.http.handle, False),
        ]
        return [
            Listener(
                name,
                endpoint,
                handler,
                tls=tls if secure else None,
                backlog=bind.backlog,
                nodelay=bind.tcp_nodelay,
            )
            for name, endpoint, handler, secure in plan
            if endpoint is not None
        ]


def run(settings: Settings) -> None:
    """Run the server until a signal stops it."""
    app = App(settings)
    anyio.run(app.run, backend="asyncio", backend_options=_backend_options())


def _backend_options() -> dict[str, Any]:
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return {}
    return {"use_uvloop": True}
