"""``/metrics`` through prometheus_client: process, platform and GC collectors beside the broker's
OTel instruments, the runtime's counters, OpenMetrics when asked, one registry per server."""

from __future__ import annotations

from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics_families
from prometheus_client.parser import text_string_to_metric_families

from trimaran import __version__, compiled
from trimaran.admin.telemetry import Telemetry
from trimaran.config import TelemetrySettings
from trimaran.runtime.runner import Runner


def families(text: str) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """Every sample of a text exposition (it must parse), keyed by name and labels."""
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return out


def test_process_gc_platform_and_build_info() -> None:
    got = families(Telemetry(TelemetrySettings()).prometheus_text())
    for name in (
        "process_cpu_seconds_total",
        "process_resident_memory_bytes",
        "process_open_fds",
        "process_start_time_seconds",
        "python_gc_collections_total",
        "python_gc_objects_collected_total",
        "python_info",
    ):
        assert name in got, name
    assert next(iter(got["process_resident_memory_bytes"].values())) > 1_000_000
    ((labels, value),) = got["trimaran_build_info"].items()
    assert dict(labels)["version"] == __version__ and value == 1
    assert dict(labels)["build"] == compiled.build() in ("compiled", "source")


def test_runtime_counters_come_from_runner_stats() -> None:
    telemetry = Telemetry(TelemetrySettings())
    runner = Runner()
    telemetry.bind(runner=runner)
    runner.stats.refuse("max_connections")
    runner.stats.refuse("max_connections")
    runner.stats.refuse("accept_rate")
    runner.stats.crashes = 3
    got = families(telemetry.prometheus_text())
    assert got["trimaran_connections_refused_total"] == {
        (("reason", "max_connections"),): 2,
        (("reason", "accept_rate"),): 1,
    }
    assert got["trimaran_connections_crashed_total"] == {(): 3}
    assert got["trimaran_memory_blocked"] == {(): 0}


def test_histogram_buckets_are_cumulative() -> None:
    telemetry = Telemetry(TelemetrySettings())
    for seconds in (0.0004, 0.003, 0.003, 2.0):
        telemetry.commit_observed(seconds, 10)
    got = families(telemetry.prometheus_text())
    buckets = {dict(k)["le"]: v for k, v in got["trimaran_storage_commit_seconds_bucket"].items()}
    assert buckets["0.0005"] == 1 and buckets["0.005"] == 3 and buckets["+Inf"] == 4
    assert got["trimaran_storage_commit_seconds_count"] == {(): 4}
    assert abs(got["trimaran_storage_commit_seconds_sum"][()] - 2.0064) < 1e-9


def test_openmetrics_when_the_scraper_asks() -> None:
    telemetry = Telemetry(TelemetrySettings())
    body, content_type = telemetry.exposition("application/openmetrics-text; version=1.0.0,text/plain;q=0.5")
    assert content_type.startswith("application/openmetrics-text; version=1.0.0")
    text = body.decode()
    assert text.endswith("# EOF\n")
    names = {family.name for family in openmetrics_families(text)}
    assert {"process_cpu_seconds", "trimaran_build_info", "python_gc_collections"} <= names
    body, content_type = telemetry.exposition("text/plain")
    assert content_type.startswith("text/plain; version=0.0.4") and b"# EOF" not in body


def test_two_servers_in_one_process_keep_their_own_numbers() -> None:
    first, second = Telemetry(TelemetrySettings()), Telemetry(TelemetrySettings())
    runner = Runner()
    runner.stats.refuse("shutdown")
    first.bind(runner=runner)
    assert "trimaran_connections_refused_total" in families(first.prometheus_text())
    assert "trimaran_connections_refused_total" not in families(second.prometheus_text())
