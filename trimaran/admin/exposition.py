"""``/metrics`` through ``prometheus_client``: one registry per server, fed by the OTel instruments.

The broker's numbers are OpenTelemetry instruments (trimaran/admin/telemetry.py), so OTLP export and
Prometheus scraping see the same values. :class:`OtelBridge` turns what the in-memory reader collects
into ``prometheus_client`` metric families at scrape time; the registry adds the process
(``process_cpu_seconds_total``, ``process_resident_memory_bytes``, ``process_open_fds``,
``process_start_time_seconds``, ...), platform (``python_info``) and garbage collector
(``python_gc_*``) collectors, and ``prometheus_client`` renders the text format or OpenMetrics,
whichever the scraper's ``Accept`` header asks for.

Each server has its own :class:`CollectorRegistry` (never the process-global one), so two servers in
one process (the tests) do not collide.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from opentelemetry.sdk.metrics.export import Gauge, Histogram, MetricsData, Sum
from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector

TEXT_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
OPENMETRICS_CONTENT_TYPE = "application/openmetrics-text; version=1.0.0; charset=utf-8"


def prometheus_name(name: str) -> str:
    """An OTel instrument name as a Prometheus one: ``trimaran.queue.depth`` -> ``trimaran_queue_depth``."""
    return "".join(c if c.isalnum() or c == "_" else "_" for c in name)


class OtelBridge(Collector):
    """The OTel reader's data as Prometheus metric families, read at each scrape."""

    def __init__(self, read: Callable[[], MetricsData | None]) -> None:
        self._read = read

    def collect(self) -> Iterable[Metric]:
        data = self._read()
        if data is None:
            return
        for resource_metrics in data.resource_metrics:
            for scope in resource_metrics.scope_metrics:
                for metric in scope.metrics:
                    yield from _families(prometheus_name(metric.name), metric.description or "", metric.data)


def _families(name: str, description: str, data: Any) -> Iterator[Metric]:
    points = list(data.data_points)
    keys = sorted({str(k) for point in points for k in (point.attributes or {})})
    labels = [prometheus_name(k) for k in keys]

    def values(point: Any) -> list[str]:
        attributes = point.attributes or {}
        return [str(attributes.get(k, "")) for k in keys]

    if isinstance(data, Sum) and data.is_monotonic:
        counter = CounterMetricFamily(name.removesuffix("_total"), description, labels=labels)
        for point in points:
            counter.add_metric(values(point), point.value)
        yield counter
    elif isinstance(data, (Sum, Gauge)):
        gauge = GaugeMetricFamily(name, description, labels=labels)
        for point in points:
            gauge.add_metric(values(point), point.value)
        yield gauge
    elif isinstance(data, Histogram):
        histogram = HistogramMetricFamily(name, description, labels=labels)
        for point in points:
            buckets: list[tuple[str, float]] = []
            cumulative = 0
            for bound, count in zip(point.explicit_bounds, point.bucket_counts, strict=False):
                cumulative += count
                buckets.append((repr(float(bound)), cumulative))
            buckets.append(("+Inf", point.count))
            histogram.add_metric(values(point), buckets, point.sum)
        yield histogram


def build_registry(read: Callable[[], MetricsData | None]) -> CollectorRegistry:
    """A server's own registry: its OTel instruments, the process, the platform and the GC."""
    registry = CollectorRegistry(auto_describe=False)
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    registry.register(OtelBridge(read))
    return registry


def render(registry: CollectorRegistry, accept: str = "") -> tuple[bytes, str]:
    """The exposition the ``Accept`` header asks for: OpenMetrics when offered, else the text format."""
    encoder, content_type = choose_encoder(accept)
    return encoder(registry), content_type
