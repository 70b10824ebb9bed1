"""OpenTelemetry metrics: what the broker counts, read when someone asks.

Most instruments are *observable*: their callbacks read the counters the broker already keeps
(``Broker.stats``, the client registry, each queue's ``QueueState.stats``, depth and lag) at
collection time, so the per-message path pays nothing for metrics. Only events that have no counter
of their own are recorded as they happen, and none of them is per message: one histogram sample per
storage transaction (from the writer thread) and one count per webhook delivery attempt.

``/metrics`` is rendered by ``prometheus_client`` from a registry of this server's own
(trimaran/admin/exposition.py: the instruments below through an in-memory reader, plus the process,
platform and GC collectors; text format or OpenMetrics), rather than through
``opentelemetry-exporter-prometheus``: that exporter is a pre-release pinned to one SDK version and
registers into the process-global registry, which breaks as soon as two servers live in one process
(the tests). OTLP export is an optional extra (``pip install trimaran[otlp]``) used when
``telemetry.otlp_endpoint`` is set.
"""

from __future__ import annotations

import logging
import platform
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    InMemoryMetricReader,
    MetricReader,
    MetricsData,
)
from opentelemetry.sdk.metrics.view import ExplicitBucketHistogramAggregation, View
from opentelemetry.sdk.resources import Resource

from trimaran import __version__, compiled
from trimaran.admin import exposition
from trimaran.admin.exposition import prometheus_name as prometheus_name
from trimaran.admin.history import History
from trimaran.broker.drops import REASONS
from trimaran.broker.message import PROTOCOL_AMQP091, PROTOCOL_AMQP1, PROTOCOL_MQTT
from trimaran.config import TelemetrySettings
from trimaran.runtime.flow import PLACES, QUEUE, SESSION
from trimaran.vhosts import DEFAULT_VHOST, split_key

if TYPE_CHECKING:
    from trimaran.admin.view import BridgeStatus
    from trimaran.admin.webhooks import Webhooks
    from trimaran.broker.core import Broker
    from trimaran.broker.sessions import SessionDirectory
    from trimaran.queue.groups import Group
    from trimaran.queue.manager import QueueManager
    from trimaran.runtime.runner import Runner
    from trimaran.security.guard import Security
    from trimaran.storage.disk import DiskWatch

log = logging.getLogger(__name__)

Callback = Callable[[CallbackOptions], Iterable[Observation]]  # an observable instrument's reader

PROMETHEUS_CONTENT_TYPE = exposition.TEXT_CONTENT_TYPE
FRONT_ENDS = (PROTOCOL_MQTT, PROTOCOL_AMQP091, PROTOCOL_AMQP1)
COMMIT_SECONDS_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
COMMIT_ROWS_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000)
QUEUE_EVENTS = (
    "published",
    "delivered",
    "redelivered",
    "acked",
    "nacked",
    "rejected",
    "dead_lettered",
    "expired",
    "dropped",
    "refused",
)


PER_OBJECT_LABELS = frozenset({"queue", "vhost", "group", "endpoint"})


def _origin(url: str) -> str:
    """A webhook endpoint as scheme://host:port: its path and query may hold secrets."""
    parts = urlsplit(url)
    if not parts.scheme or not parts.netloc:
        return url
    host = parts.hostname or ""
    host = f"[{host}]" if ":" in host else host
    return f"{parts.scheme}://{host}" + (f":{parts.port}" if parts.port else "")


class Telemetry:
    """The broker's meter provider. ``bind`` the running parts; read with :meth:`prometheus_text`."""

    def __init__(self, settings: TelemetrySettings, node: str = "trimaran") -> None:
        self.enabled = settings.metrics
        # The management page's charts: sampled by the application, served by /api/v1/history.
        self.history = History(settings.history_samples, settings.history_interval_s)
        self.per_object = settings.per_object_metrics
        self.broker: Broker | None = None
        self.queues: QueueManager | None = None
        self.sessions: SessionDirectory | None = None
        self.webhooks: Webhooks | None = None
        self.security: Security | None = None
        self.runner: Runner | None = None
        self.bridges: Callable[[], list[BridgeStatus]] | None = None  # the view's bridge_statuses
        self.reader = InMemoryMetricReader()
        readers: list[MetricReader] = [self.reader]
        if settings.otlp_endpoint:
            otlp = _otlp_reader(settings.otlp_endpoint)
            if otlp is not None:
                readers.append(otlp)
        self._lock = threading.Lock()  # the reader's collect is not meant to run twice at once
        self.provider = MeterProvider(
            resource=Resource.create({"service.name": settings.service_name, "service.instance.id": node}),
            metric_readers=readers,
            views=[
                View(
                    instrument_name="trimaran.storage.commit.seconds",
                    aggregation=ExplicitBucketHistogramAggregation(COMMIT_SECONDS_BUCKETS),
                ),
                View(
                    instrument_name="trimaran.storage.commit.rows",
                    aggregation=ExplicitBucketHistogramAggregation(COMMIT_ROWS_BUCKETS),
                ),
            ],
        )
        meter = self.provider.get_meter("trimaran")
        counter, gauge = meter.create_observable_counter, meter.create_observable_gauge
        gauge(
            "trimaran.build.info",
            [_build_info],
            "1",
            "always 1; the version label is the running release, build is compiled or source",
        )
        counter("trimaran.messages.received", [self._stat("messages_received")], "1", "messages published in")
        counter("trimaran.messages.sent", [self._stat("messages_sent")], "1", "messages delivered out")
        counter(
            "trimaran.messages.dropped",
            [self._dropped],
            "1",
            "subscribers' copies dropped where the protocol and a bound allow it, per reason and vhost",
        )
        counter("trimaran.messages.routed", [self._stat("publish_routed")], "1", "pub/sub messages routed")
        counter("trimaran.received.bytes", [self._stat("bytes_received")], "By", "bytes read from clients")
        counter("trimaran.sent.bytes", [self._stat("bytes_sent")], "By", "bytes written to clients")
        counter("trimaran.connections.opened", [self._stat("clients_total")], "1", "connections accepted")
        gauge("trimaran.connections", [self._connections], "1", "open client connections per protocol")
        counter(
            "trimaran.connections.refused",
            [self._refused],
            "1",
            "connections the runtime refused, per reason (limits, accept rate, shutdown)",
        )
        counter(
            "trimaran.connections.waited",
            [self._runtime("waited")],
            "1",
            "connections that waited their turn under limits.accept_rate before they were read",
        )
        counter(
            "trimaran.connections.crashed",
            [self._runtime("crashes")],
            "1",
            "connections closed after an internal error (each one logged once)",
        )
        gauge(
            "trimaran.memory.buffered.bytes", [self._memory("total")], "By", "bytes waiting for slow readers"
        )
        gauge("trimaran.memory.blocked", [self._memory("blocked")], "1", "1 while publishers are paused")
        counter(
            "trimaran.flow.holds",
            [self._flow_holds],
            "1",
            "times a place that fell behind began holding the publishers feeding it, per place "
            "(session: a subscriber's queue or socket; queue; cluster: the forwards to other nodes)",
        )
        counter(
            "trimaran.flow.stalled.consumers",
            [self._flow_stalls],
            "1",
            "consumers closed for taking nothing while they held publishers, per place",
        )
        gauge(
            "trimaran.flow.held.connections",
            [self._runtime("held")],
            "1",
            "connections not read now because flow control holds them",
        )
        gauge("trimaran.subscriptions", [self._subscriptions], "1", "pub/sub subscriptions")
        gauge("trimaran.retained", [self._retained], "1", "retained messages")
        gauge(
            "trimaran.retained.unwritten",
            [self._broker_value(lambda b: b.retained_unwritten)],
            "1",
            "retained changes in memory not yet written (kept and retried when a write fails)",
        )
        gauge(
            "trimaran.storage.disk.free.bytes",
            [self._disk(lambda d: d.free)],
            "By",
            "free bytes on the data directory's disk (SQLite; measured once a second)",
        )
        gauge(
            "trimaran.storage.disk.low",
            [self._disk(lambda d: int(d.low))],
            "1",
            "1 while free disk is below storage.min_free_bytes and durable publishes are refused",
        )
        counter(
            "trimaran.queue.refused.disk",
            [self._disk(lambda d: d.refused)],
            "1",
            "durable publishes refused for the disk-free watermark",
        )
        counter(
            "trimaran.retained.write.failures",
            [self._broker_value(lambda b: b.retained_write_failures)],
            "1",
            "retained writes that failed (each is kept and retried)",
        )
        gauge("trimaran.mqtt.sessions", [self._sessions], "1", "MQTT sessions, connected or not")
        counter("trimaran.auth.login.failures", [self._login_failures], "1", "logins refused")
        counter(
            "trimaran.auth.refusals",
            [self._refusals],
            "1",
            "publishes, subscriptions, settles refused by rules",
        )
        counter(
            "trimaran.queue.messages",
            [self._objects(self._queue_events)],
            "1",
            "queue message events per queue",
        )
        gauge("trimaran.queue.depth", [self._objects(self._queue_depth)], "1", "messages a queue holds")
        gauge(
            "trimaran.queue.stored.bytes",
            [self._objects(self._queue_bytes)],
            "By",
            "payload bytes a queue holds",
        )
        gauge(
            "trimaran.queue.pending",
            [self._objects(self._per_group(lambda g: g.held()))],
            "1",
            "delivered and not settled",
        )
        gauge(
            "trimaran.queue.lag",
            [self._objects(self._queue_lag)],
            "1",
            "messages a consumer group has not finished",
        )
        gauge(
            "trimaran.queue.consumers",
            [self._objects(self._per_group(lambda g: len(g.consumers)))],
            "1",
            "consumers per group",
        )
        self._commit_seconds = meter.create_histogram(
            "trimaran.storage.commit.seconds", "s", "time to write and commit one group-commit transaction"
        )
        self._commit_rows = meter.create_histogram(
            "trimaran.storage.commit.rows", "1", "rows written in one group-commit transaction"
        )
        counter(
            "trimaran.webhook.requests", [self._objects(self._webhook("requests"))], "1", "webhook POSTs sent"
        )
        counter(
            "trimaran.webhook.failures",
            [self._objects(self._webhook("failed"))],
            "1",
            "webhook POSTs that failed",
        )
        counter(
            "trimaran.webhook.retries",
            [self._objects(self._webhook("retried"))],
            "1",
            "webhook POSTs retried",
        )
        counter(
            "trimaran.webhook.events",
            [self._objects(self._webhook("sent"))],
            "1",
            "events delivered to webhooks",
        )
        counter(
            "trimaran.webhook.dropped",
            [self._objects(self._webhook("dropped"))],
            "1",
            "webhook events given up",
        )
        gauge(
            "trimaran.webhook.queued",
            [self._objects(self._webhook("queued"))],
            "1",
            "events waiting per endpoint",
        )
        gauge(
            "trimaran.webhook.breaker.open",
            [self._objects(self._breaker_open)],
            "1",
            "1 while a breaker is open or half-open",
        )
        self._limit_instruments(counter, gauge)
        self._bridge_instruments(counter, gauge)
        self.registry = exposition.build_registry(self.metrics_data)

    def _limit_instruments(self, counter: Callable[..., Any], gauge: Callable[..., Any]) -> None:
        """Limits per vhost and user (trimaran/tenant_limits.py), labelled with the vhost."""
        counter(
            "trimaran.limit.bites",
            [self._limit_bites],
            "1",
            "logins and declares refused, publishes refused or reads paused by a vhost or user limit",
        )
        gauge("trimaran.vhost.connections", [self._vhost_connections], "1", "logged-in connections per vhost")
        gauge("trimaran.vhost.limit", [self._vhost_limits], "1", "each vhost's configured limits (0: none)")

    def _bridge_instruments(self, counter: Callable[..., Any], gauge: Callable[..., Any]) -> None:
        """Bridges to other MQTT brokers (trimaran/bridges/), labelled with the bridge's name: the
        operator's own, so always per bridge."""
        gauge(
            "trimaran.bridge.up",
            [self._bridge(lambda b: int(b.state == "connected"))],
            "1",
            "1 while the bridge is connected to its remote",
        )
        counter(
            "trimaran.bridge.connects",
            [self._bridge(lambda b: b.connects)],
            "1",
            "connections the remote accepted",
        )
        counter(
            "trimaran.bridge.messages",
            [self._bridge_messages],
            "1",
            "messages handed to the remote (out; QoS 1/2 once it acknowledged them) and taken from it (in)",
        )
        counter(
            "trimaran.bridge.dropped",
            [self._bridge(lambda b: b.dropped)],
            "1",
            "outbound messages not kept: QoS 0 while the remote is away, or past queue_bytes",
        )
        counter(
            "trimaran.bridge.refused",
            [self._bridge(lambda b: b.refused)],
            "1",
            "messages refused by the remote (MQTT 5 reason codes) or by a local queue",
        )
        gauge(
            "trimaran.bridge.in_flight",
            [self._bridge(lambda b: b.in_flight)],
            "1",
            "outbound messages sent and not yet acknowledged by the remote",
        )
        gauge(
            "trimaran.bridge.backlog.bytes",
            [self._bridge(lambda b: b.backlog_bytes)],
            "By",
            "payload bytes of outbound QoS 1/2 messages queued for the remote or in flight",
        )

    # -- wiring -----------------------------------------------------------------------------------

    def bind(
        self,
        broker: Broker | None = None,
        queues: QueueManager | None = None,
        sessions: SessionDirectory | None = None,
        webhooks: Webhooks | None = None,
        runner: Runner | None = None,
        *,
        bridges: Callable[[], list[BridgeStatus]] | None = None,
    ) -> None:
        self.broker, self.queues, self.sessions, self.webhooks = broker, queues, sessions, webhooks
        self.runner, self.bridges = runner, bridges
        if queues is not None:
            queues.writer.on_transaction = self.commit_observed

    def shutdown(self) -> None:
        try:
            self.provider.shutdown()
        except Exception:  # an exporter that cannot flush must not spoil the shutdown
            log.warning("telemetry shutdown failed", exc_info=True)

    # -- events without a counter of their own ---------------------------------------------------

    def commit_observed(self, seconds: float, rows: int) -> None:
        """One group-commit transaction (called from the writer thread; OTel instruments are
        thread-safe)."""
        self._commit_seconds.record(seconds)
        self._commit_rows.record(rows)

    # -- reading ----------------------------------------------------------------------------------

    def metrics_data(self) -> MetricsData | None:
        with self._lock:
            return self.reader.get_metrics_data()

    def exposition(self, accept: str = "") -> tuple[bytes, str]:
        """``/metrics``: the body and its content type, OpenMetrics when ``accept`` asks for it."""
        return exposition.render(self.registry, accept)

    def prometheus_text(self) -> str:
        return self.exposition()[0].decode()

    # -- callbacks (on whichever thread collects; they only read) --------------------------------

    def _objects(self, callback: Callback) -> Callback:
        """Per-queue, per-group and per-endpoint series only with ``telemetry.per_object_metrics``
        (names such as a client's exclusive reply queue are not for everyone who reads /metrics);
        otherwise one series summed over them, as RabbitMQ aggregates by default."""
        if self.per_object:
            return callback

        def aggregated(options: CallbackOptions) -> Iterable[Observation]:
            totals: dict[tuple[tuple[str, Any], ...], float] = {}
            for observation in callback(options):
                labels = tuple(
                    (k, v) for k, v in (observation.attributes or {}).items() if k not in PER_OBJECT_LABELS
                )
                totals[labels] = totals.get(labels, 0) + observation.value
            return [Observation(value, dict(labels)) for labels, value in totals.items()]

        return aggregated

    def _dropped(self, _options: CallbackOptions) -> Iterable[Observation]:
        if self.broker is None:
            return []
        # Every reason has a series in / from the start (zero until it happens): dashboards and
        # alerts find the metric before the first drop.
        counts = dict.fromkeys(((reason, DEFAULT_VHOST) for reason in REASONS), 0)
        counts.update(self.broker.stats.drops.counts)
        return [Observation(n, {"reason": reason, "vhost": vhost}) for (reason, vhost), n in counts.items()]

    def _refused(self, _options: CallbackOptions) -> Iterable[Observation]:
        if self.runner is None:
            return []
        return [Observation(n, {"reason": reason}) for reason, n in list(self.runner.stats.refused.items())]

    def _flow_holds(self, _options: CallbackOptions) -> Iterable[Observation]:
        if self.runner is None:
            return []
        counts = dict.fromkeys(PLACES, 0)  # a series per place from the start, as the drops have
        counts.update(self.runner.stats.holds)
        return [Observation(n, {"place": place}) for place, n in counts.items()]

    def _flow_stalls(self, _options: CallbackOptions) -> Iterable[Observation]:
        if self.runner is None:
            return []
        counts = dict.fromkeys((SESSION, QUEUE), 0)
        counts.update(self.runner.stats.stalls)
        if self.queues is not None:
            counts[QUEUE] += self.queues.flow.closed
        return [Observation(n, {"place": place}) for place, n in counts.items()]

    def _runtime(self, name: str) -> Callback:
        def observe(_options: CallbackOptions) -> Iterable[Observation]:
            return [] if self.runner is None else [Observation(getattr(self.runner.stats, name))]

        return observe

    def _memory(self, name: str) -> Callback:
        def observe(_options: CallbackOptions) -> Iterable[Observation]:
            return [] if self.runner is None else [Observation(int(getattr(self.runner.memory, name)))]

        return observe

    def _stat(self, name: str) -> Callback:
        def observe(_options: CallbackOptions) -> Iterable[Observation]:
            if self.broker is None:
                return []
            return [Observation(getattr(self.broker.stats, name))]

        return observe

    def _webhook(self, name: str) -> Callback:
        """One of each endpoint's own counters (trimaran/admin/webhooks.py), per endpoint."""

        def observe(_options: CallbackOptions) -> Iterable[Observation]:
            if self.webhooks is None:
                return []
            return [Observation(st[name], {"endpoint": _origin(st["url"])}) for st in self.webhooks.stats()]

        return observe

    def _breaker_open(self, _options: CallbackOptions) -> Iterable[Observation]:
        if self.webhooks is None:
            return []
        return [
            Observation(int(st["breaker"] != "closed"), {"endpoint": _origin(st["url"])})
            for st in self.webhooks.stats()
        ]

    def _connections(self, _options: CallbackOptions) -> Iterable[Observation]:
        if self.broker is None:
            return []
        counts = {protocol: 0 for protocol in FRONT_ENDS}
        counts.update(self.broker.clients.count_by_protocol())
        return [Observation(n, {"protocol": protocol}) for protocol, n in counts.items()]

    def _subscriptions(self, _options: CallbackOptions) -> Iterable[Observation]:
        return [] if self.broker is None else [Observation(self.broker.router.count())]

    def _broker_value(
        self, read: Callable[[Broker], int]
    ) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def observe(_options: CallbackOptions) -> Iterable[Observation]:
            return [] if self.broker is None else [Observation(read(self.broker))]

        return observe

    def _disk(
        self, read: Callable[[DiskWatch], int | None]
    ) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def observe(_options: CallbackOptions) -> Iterable[Observation]:
            if self.queues is None or not self.queues.disk.enabled:
                return []
            value = read(self.queues.disk)
            return [] if value is None else [Observation(value)]

        return observe

    def _retained(self, _options: CallbackOptions) -> Iterable[Observation]:
        return [] if self.broker is None else [Observation(self.broker.retained.count())]

    def _login_failures(self, _options: CallbackOptions) -> Iterable[Observation]:
        return [] if self.security is None else [Observation(self.security.stats["login_failures"])]

    def _refusals(self, _options: CallbackOptions) -> Iterable[Observation]:
        if self.security is None:
            return []
        counts = {protocol: 0 for protocol in ("mqtt", "amqp091", "amqp1")}
        counts.update(self.security.refusals)
        return [Observation(n, {"protocol": protocol}) for protocol, n in counts.items()]

    def _limit_bites(self, _options: CallbackOptions) -> Iterable[Observation]:
        if self.runner is None:
            return []
        bites = list(self.runner.tenants.bites.items())
        return [Observation(n, {"vhost": vhost, "limit": limit}) for (vhost, limit), n in bites]

    def _vhost_connections(self, _options: CallbackOptions) -> Iterable[Observation]:
        if self.runner is None:
            return []
        counts = list(self.runner.tenants.connections.items())
        return [Observation(n, {"vhost": vhost}) for vhost, n in counts]

    def _vhost_limits(self, _options: CallbackOptions) -> Iterable[Observation]:
        if self.runner is None:
            return []
        return [
            Observation(value, {"vhost": vhost, "limit": limit})
            for vhost, limits in list(self.runner.tenants.vhosts.items())
            for limit, value in (
                ("max_connections", limits.max_connections),
                ("max_queues", limits.max_queues),
                ("max_stored_bytes", limits.max_stored_bytes),
            )
        ]

    def _bridge(self, read: Callable[[BridgeStatus], int]) -> Callback:
        """One of each bridge's figures, labelled with its name."""

        def observe(_options: CallbackOptions) -> Iterable[Observation]:
            if self.bridges is None:
                return []
            return [Observation(read(bridge), {"bridge": bridge.name}) for bridge in self.bridges()]

        return observe

    def _bridge_messages(self, _options: CallbackOptions) -> Iterable[Observation]:
        if self.bridges is None:
            return []
        return [
            Observation(count, {"bridge": bridge.name, "direction": direction})
            for bridge in self.bridges()
            for direction, count in (("out", bridge.sent), ("in", bridge.received))
        ]

    def _sessions(self, _options: CallbackOptions) -> Iterable[Observation]:
        return [] if self.sessions is None else [Observation(self.sessions.session_count())]

    def _each_queue(self) -> Iterator[Any]:
        if self.queues is None:
            return
        try:
            yield from list(self.queues.queues.values())
        except RuntimeError:  # changed while another thread (OTLP export) read it: skip this round
            return

    def _queue_events(self, _options: CallbackOptions) -> Iterable[Observation]:
        out = []
        for state in self._each_queue():
            for event in QUEUE_EVENTS:
                out.append(
                    Observation(state.stats.get(event, 0), {**_queue_labels(state.name), "event": event})
                )
        return out

    def _queue_depth(self, _options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(len(s.messages), _queue_labels(s.name)) for s in self._each_queue()]

    def _queue_bytes(self, _options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(s.bytes, _queue_labels(s.name)) for s in self._each_queue()]

    def _per_group(self, measure: Callable[[Group], int]) -> Callback:
        """One of each consumer group's numbers, labelled with its queue and group."""

        def observe(_options: CallbackOptions) -> Iterable[Observation]:
            return [
                Observation(measure(group), {**_queue_labels(state.name), "group": group.name})
                for state in self._each_queue()
                for group in list(state.groups.values())
            ]

        return observe

    def _queue_lag(self, _options: CallbackOptions) -> Iterable[Observation]:
        queues = self.queues
        out: list[Observation] = []
        if queues is None:
            return out
        for state in self._each_queue():
            try:
                info = queues.info(state.name)
            except Exception:  # deleted meanwhile, or changed under another thread
                continue
            for group in info.groups.values():
                out.append(Observation(group.lag, {**_queue_labels(state.name), "group": group.name}))
        return out


def _queue_labels(key: str) -> dict[str, str]:
    """A queue's labels as RabbitMQ's per-object metrics have them: its name and its vhost (never
    the internal key, trimaran/vhosts.py)."""
    vhost, name = split_key(key)
    return {"queue": name, "vhost": vhost}


def _build_info(_options: CallbackOptions) -> Iterable[Observation]:
    labels = {"version": __version__, "python": platform.python_version(), "build": compiled.build()}
    return [Observation(1, labels)]


def _otlp_reader(endpoint: str) -> MetricReader | None:
    try:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import (
            OTLPMetricExporter,
        )
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
    except ImportError:
        log.error(
            "telemetry.otlp_endpoint is set but the OTLP exporter is not installed "
            "(pip install 'trimaran[otlp]'); metrics stay on /metrics only"
        )
        return None
    log.info("exporting metrics by OTLP to %s", endpoint)
    reader: MetricReader = PeriodicExportingMetricReader(OTLPMetricExporter(endpoint=endpoint))
    return reader
