"""Telemetry in-process: observable instruments read the broker's counters; Prometheus text format."""

from __future__ import annotations

import importlib.util
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, cast

import pytest

from trimaran.admin.telemetry import Telemetry, prometheus_name
from trimaran.admin.view import BridgeStatus
from trimaran.broker.clients import ClientInfo
from trimaran.broker.core import Broker
from trimaran.config import TelemetrySettings

if TYPE_CHECKING:
    from trimaran.admin.webhooks import Webhooks


def samples(text: str) -> dict[str, float]:
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def test_counters_are_read_from_the_broker_at_scrape_time() -> None:
    telemetry = Telemetry(TelemetrySettings())
    assert "trimaran_messages_received_total" not in telemetry.prometheus_text()  # nothing bound yet
    broker = Broker(None, sys_interval=0)
    telemetry.bind(broker)
    broker.stats.messages_received = 7
    broker.stats.bytes_sent = 1234
    broker.clients.add(ClientInfo("c1", "mqtt", None, lambda _: None, SimpleNamespace(peer="127.0.0.1:1")))
    broker.clients.add(
        ClientInfo("c2", "amqp091", "bob", lambda _: None, SimpleNamespace(peer="127.0.0.1:2"))
    )
    got = samples(telemetry.prometheus_text())
    assert got["trimaran_messages_received_total"] == 7
    assert got["trimaran_sent_bytes_total"] == 1234
    assert got['trimaran_connections{protocol="mqtt"}'] == 1
    assert got['trimaran_connections{protocol="amqp091"}'] == 1
    assert got['trimaran_connections{protocol="amqp1"}'] == 0
    broker.stats.messages_received = 9  # cumulative counters follow the broker's own
    assert samples(telemetry.prometheus_text())["trimaran_messages_received_total"] == 9


def test_drops_are_counted_by_reason_and_vhost() -> None:
    from trimaran.broker.drops import OFFLINE_QUEUE_FULL, OUTBOX_FULL

    telemetry = Telemetry(TelemetrySettings())
    broker = Broker(None, sys_interval=0)
    telemetry.bind(broker)
    broker.stats.drops.drop(OUTBOX_FULL, "/", "slow", 3)
    broker.stats.drops.drop(OFFLINE_QUEUE_FULL, "t1", "away")
    got = samples(telemetry.prometheus_text())
    assert got['trimaran_messages_dropped_total{reason="outbox_full",vhost="/"}'] == 3
    assert got['trimaran_messages_dropped_total{reason="offline_queue_full",vhost="t1"}'] == 1
    assert broker.stats.messages_dropped == 4
    sys = broker.sys_values()
    assert sys["$SYS/broker/messages/dropped"] == "4"
    assert sys["$SYS/broker/messages/dropped/outbox_full"] == "3"


class FakeWebhooks:
    """What Telemetry reads of trimaran.admin.webhooks.Webhooks: each endpoint's stats()."""

    def stats(self) -> list[dict[str, Any]]:
        common = {"queued": 4, "dropped": 5, "retried": 1, "breaker": "open"}
        return [{"url": 'odd"name', "requests": 3, "failed": 2, "sent": 3, **common}]


def test_webhook_counters_and_commit_histogram() -> None:
    telemetry = Telemetry(TelemetrySettings(per_object_metrics=True))
    telemetry.bind(webhooks=cast("Webhooks", FakeWebhooks()))
    telemetry.commit_observed(0.003, 40)
    telemetry.commit_observed(0.2, 1)
    text = telemetry.prometheus_text()
    got = samples(text)
    endpoint = 'endpoint="odd\\"name"'  # label values escaped
    assert got[f"trimaran_webhook_requests_total{{{endpoint}}}"] == 3
    assert got[f"trimaran_webhook_failures_total{{{endpoint}}}"] == 2
    assert got[f"trimaran_webhook_events_total{{{endpoint}}}"] == 3
    assert got[f"trimaran_webhook_dropped_total{{{endpoint}}}"] == 5
    assert got[f"trimaran_webhook_queued{{{endpoint}}}"] == 4
    assert got[f"trimaran_webhook_breaker_open{{{endpoint}}}"] == 1
    assert "# TYPE trimaran_storage_commit_seconds histogram" in text
    assert got['trimaran_storage_commit_seconds_bucket{le="0.0025"}'] == 0
    assert got['trimaran_storage_commit_seconds_bucket{le="0.005"}'] == 1  # cumulative buckets
    assert got['trimaran_storage_commit_seconds_bucket{le="+Inf"}'] == 2
    assert got["trimaran_storage_commit_seconds_count"] == 2
    assert abs(got["trimaran_storage_commit_seconds_sum"] - 0.203) < 1e-9
    assert got["trimaran_storage_commit_rows_sum"] == 41
    # Every sample line is "name{labels} value" and every family has HELP and TYPE.
    families = {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE")}
    assert {"trimaran_webhook_requests_total", "trimaran_storage_commit_rows"} <= families


def bridge(name: str, state: str, **figures: int) -> BridgeStatus:
    counts = {"connects": 0, "sent": 0, "received": 0, "dropped": 0, "refused": 0, "in_flight": 0}
    return BridgeStatus(
        name=name,
        kind="bridge",
        address="127.0.0.1:1883",
        client_id=f"trimaran.{name}",
        protocol_version="mqttv311",
        vhost="/",
        state=state,
        state_for_s=1.0,
        last_error=None,
        backlog_bytes=figures.pop("backlog_bytes", 0),
        queue=f"$bridge.{name}",
        topics=("# out 1",),
        **counts | figures,
    )


def test_bridge_families_are_labelled_with_each_bridge_name() -> None:
    from prometheus_client.parser import text_string_to_metric_families

    telemetry = Telemetry(TelemetrySettings())  # per bridge even without per_object_metrics
    assert "trimaran_bridge_up" not in telemetry.prometheus_text()  # nothing bound: no family
    bridges = [
        bridge("cloud", "connected", connects=2, sent=7, received=3, in_flight=1, backlog_bytes=300),
        bridge("backup", "waiting", dropped=4, refused=1),
    ]
    telemetry.bind(bridges=lambda: bridges)
    text = telemetry.prometheus_text()
    got = samples(text)
    assert got['trimaran_bridge_up{bridge="cloud"}'] == 1 and got['trimaran_bridge_up{bridge="backup"}'] == 0
    assert got['trimaran_bridge_connects_total{bridge="cloud"}'] == 2
    assert got['trimaran_bridge_messages_total{bridge="cloud",direction="out"}'] == 7
    assert got['trimaran_bridge_messages_total{bridge="cloud",direction="in"}'] == 3
    assert got['trimaran_bridge_dropped_total{bridge="backup"}'] == 4
    assert got['trimaran_bridge_refused_total{bridge="backup"}'] == 1
    assert got['trimaran_bridge_in_flight{bridge="cloud"}'] == 1
    assert got['trimaran_bridge_backlog_bytes{bridge="cloud"}'] == 300
    kinds = {f.name: (f.type, f.documentation) for f in text_string_to_metric_families(text)}
    for name, kind in [
        ("trimaran_bridge_up", "gauge"),
        ("trimaran_bridge_connects", "counter"),
        ("trimaran_bridge_messages", "counter"),
        ("trimaran_bridge_dropped", "counter"),
        ("trimaran_bridge_refused", "counter"),
        ("trimaran_bridge_in_flight", "gauge"),
        ("trimaran_bridge_backlog_bytes", "gauge"),
    ]:
        assert kinds[name][0] == kind and kinds[name][1], name
    bridges[0] = bridge("cloud", "connecting", connects=2, sent=9)  # read at each scrape
    got = samples(telemetry.prometheus_text())
    assert got['trimaran_bridge_up{bridge="cloud"}'] == 0
    assert got['trimaran_bridge_messages_total{bridge="cloud",direction="out"}'] == 9


def test_prometheus_names() -> None:
    assert prometheus_name("trimaran.queue.depth") == "trimaran_queue_depth"
    assert prometheus_name("a-b c") == "a_b_c"


def test_otlp_without_the_extra_is_logged_not_fatal(caplog: pytest.LogCaptureFixture) -> None:
    try:
        installed = importlib.util.find_spec("opentelemetry.exporter.otlp") is not None
    except ModuleNotFoundError:  # no opentelemetry.exporter namespace at all
        installed = False
    telemetry = Telemetry(TelemetrySettings(otlp_endpoint="http://127.0.0.1:1/v1/metrics"))
    assert installed or "OTLP exporter is not installed" in caplog.text
    telemetry.commit_observed(0.001, 1)
    assert "trimaran_storage_commit_rows" in telemetry.prometheus_text()
    telemetry.shutdown()


class PathWebhooks:
    """Two endpoints whose URLs carry secrets in their paths."""

    def stats(self) -> list[dict[str, Any]]:
        common = {
            "requests": 1,
            "failed": 0,
            "sent": 1,
            "queued": 0,
            "dropped": 0,
            "retried": 0,
            "breaker": "closed",
        }
        return [
            {"url": "https://hooks.example:8443/token/s3cret?key=1", **common},
            {"url": "http://other.example/t/abc", **common},
        ]


def test_per_object_series_only_when_asked_and_never_webhook_paths() -> None:
    aggregated = Telemetry(TelemetrySettings())
    aggregated.bind(webhooks=cast("Webhooks", PathWebhooks()))
    text = aggregated.prometheus_text()
    assert samples(text)["trimaran_webhook_requests_total"] == 2  # one series, summed
    assert "endpoint=" not in text and "s3cret" not in text
    per_object = Telemetry(TelemetrySettings(per_object_metrics=True))
    per_object.bind(webhooks=cast("Webhooks", PathWebhooks()))
    text = per_object.prometheus_text()
    got = samples(text)
    assert got['trimaran_webhook_requests_total{endpoint="https://hooks.example:8443"}'] == 1
    assert got['trimaran_webhook_requests_total{endpoint="http://other.example"}'] == 1
    assert "s3cret" not in text and "/t/abc" not in text


def test_limit_bites_and_vhost_connections_carry_the_vhost_label() -> None:
    from trimaran.runtime.runner import Runner
    from trimaran.tenant_limits import CONNECTIONS, QUEUES, TenantLimits, VhostLimits

    telemetry = Telemetry(TelemetrySettings())
    tenants = TenantLimits({"/": VhostLimits(max_connections=1, max_queues=3)})
    telemetry.bind(runner=Runner(tenants=tenants))
    assert tenants.enter("alice", "/") is None
    assert tenants.enter("bob", "/") is not None
    tenants.may_declare_queue("/", 3, "q")
    got = samples(telemetry.prometheus_text())
    assert got[f'trimaran_limit_bites_total{{limit="{CONNECTIONS}",vhost="/"}}'] == 1
    assert got[f'trimaran_limit_bites_total{{limit="{QUEUES}",vhost="/"}}'] == 1
    assert got['trimaran_vhost_connections{vhost="/"}'] == 1
    assert got['trimaran_vhost_limit{limit="max_queues",vhost="/"}'] == 3
    assert got['trimaran_vhost_limit{limit="max_stored_bytes",vhost="/"}'] == 0


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.anyio
async def test_flow_holds_are_counted_when_a_gate_begins_holding_and_held_connections_gauged() -> None:
    from tests.support.runtime import LineHull, LineMachine, Wire, running
    from trimaran.app import flow_gates
    from trimaran.config import Settings
    from trimaran.runtime.flow import CLUSTER, QUEUE, SESSION
    from trimaran.runtime.runner import Runner

    telemetry = Telemetry(TelemetrySettings())
    async with running(Runner()) as runner:
        telemetry.bind(runner=runner)
        got = samples(telemetry.prometheus_text())
        for place in ("session", "queue", "cluster"):  # a series per place from the start
            assert got[f'trimaran_flow_holds_total{{place="{place}"}}'] == 0
        assert got['trimaran_flow_stalled_consumers_total{place="session"}'] == 0
        assert got["trimaran_flow_held_connections"] == 0
        wire = Wire(runner, lambda io, _first: LineHull(io, LineMachine()))
        await wire.feed([b"hello\n"])
        forwards = flow_gates(Settings(), runner, CLUSTER)(lambda _idle: True)
        queue = flow_gates(Settings(), runner, QUEUE)(lambda _idle: True)
        for _ in range(3):  # a hold per message: counted once, when the gate begins holding
            forwards.hold(wire.conn)
        queue.hold(wire.conn)  # a second gate on the same connection: one more hold, one connection
        got = samples(telemetry.prometheus_text())
        assert got['trimaran_flow_holds_total{place="cluster"}'] == 1
        assert got['trimaran_flow_holds_total{place="queue"}'] == 1
        assert got["trimaran_flow_held_connections"] == 1
        forwards.release()
        assert samples(telemetry.prometheus_text())["trimaran_flow_held_connections"] == 1
        queue.release()
        forwards.hold(wire.conn)  # behind again: a second hold begun
        forwards.release()
        runner.stats.stalled(SESSION)
        got = samples(telemetry.prometheus_text())
        assert got['trimaran_flow_holds_total{place="cluster"}'] == 2
        assert got["trimaran_flow_held_connections"] == 0
        assert got['trimaran_flow_stalled_consumers_total{place="session"}'] == 1


def test_the_broker_publishes_the_figures_given_to_it_in_sys() -> None:
    broker = Broker(None, sys_interval=0)
    broker.sys_figures = lambda: {"$SYS/broker/flow/held": 2}
    assert broker.sys_values()["$SYS/broker/flow/held"] == "2"
