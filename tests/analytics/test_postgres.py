"""The audit over JDBC from PostgreSQL: the broker's two runs written to a throwaway cluster."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from tests.analytics.conftest import write_broker_tables
from tests.support.paho import V5, Endpoints, connect
from tests.support.postgres import PostgresCluster
from tests.support.server import ALL_OFF, RunningServer
from trimaran.analytics import source
from trimaran.analytics.replay import add_arguments, run_audit

pytestmark = pytest.mark.postgres


@pytest.fixture(scope="module")
def pg_broker_db(
    postgres_cluster: PostgresCluster, tmp_path_factory: pytest.TempPathFactory, tls_files: dict[str, str]
) -> str:
    url = postgres_cluster.create_database("audit_broker")
    write_broker_tables(tmp_path_factory.mktemp("audit-pg"), url, tls_files)
    return url


def test_postgres_tables_audit_clean(
    spark: SparkSession, pg_broker_db: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Small slices, so the events table is read over several parallel JDBC connections, as a large
    # one would be.
    monkeypatch.setattr(source, "ROWS_PER_SLICE", 40)
    events = source.read_jdbc(spark, pg_broker_db, "queue_events", source.Selection())
    assert events.rdd.getNumPartitions() > 1

    parser = argparse.ArgumentParser()
    add_arguments(parser, master_default="local[2]")
    args = parser.parse_args(["--output", str(tmp_path), "--no-charts"])
    code = run_audit(args, pg_broker_db, spark=spark)
    summary = json.loads((tmp_path / "summary.json").read_text())
    failed = {k: v["examples"] for k, v in summary["invariants"].items() if not v["ok"]}
    assert failed == {}
    assert code == 0
    assert summary["source"].startswith("127.0.0.1:")  # the user part of the URL is not printed
    # The audit counts events, and a row spanning consecutive offsets (a run published together,
    # as timing has it) is that many of them.
    assert summary["counts"]["events"] == source.expand_spans(events).count()
    kinds = set(summary["counts"]["events_by_kind"])
    every = {
        "published",
        "delivered",
        "acked",
        "nacked",
        "rejected",
        "released",
        "dead_lettered",
        "committed",
    }
    assert every <= kinds, every - kinds


def _shared_node(root: Path, name: str, url: str) -> RunningServer:
    workdir = root / name
    workdir.mkdir()
    env = {
        "TRIMARAN_NODE_NAME": name,
        "TRIMARAN_STORAGE__URL": url,
        "TRIMARAN_QUEUES__SHARED": "true",
        "TRIMARAN_LIMITS__SYS_INTERVAL": "0",
    }
    return RunningServer([*ALL_OFF, "--mqtt", "127.0.0.1:0"], cwd=workdir, env=env).start()


@pytest.mark.slow  # two servers and a Spark run: about a minute
def test_shared_queues_audit_clean(
    spark: SparkSession, postgres_cluster: PostgresCluster, tmp_path: Path
) -> None:
    """Two nodes sharing their work queues (queues.shared): the compaction deletes finished
    messages a poll later, so when the nodes stop right after the last acks some may still be
    stored with every group's 'done' marker. That is no finished_removed, nor anything else."""
    url = postgres_cluster.create_database("audit_shared")
    a, b = _shared_node(tmp_path, "a", url), _shared_node(tmp_path, "b", url)
    try:
        on_a = Endpoints("127.0.0.1", a.ports["mqtt"])
        on_b = Endpoints("127.0.0.1", b.ports["mqtt"])
        # Two groups, each with a consumer on both nodes, before anything is published.
        consumers = [connect(on, version=V5) for on in (on_a, on_b, on_a, on_b)]
        topics = ["$queue/jobs"] * 2 + ["$share/audit/$queue/jobs"] * 2
        for consumer, topic in zip(consumers, topics, strict=True):
            consumer.subscribe(topic, qos=1)
        publisher = connect(on_a, version=V5)
        for i in range(40):
            publisher.publish("$queue/jobs", f"j{i}".encode(), qos=1)
        publisher.disconnect()
        got: dict[int, int] = {0: 0, 1: 0}  # deliveries per group, PUBACKed by paho
        deadline = time.monotonic() + 20
        while got != {0: 40, 1: 40} and time.monotonic() < deadline:
            for i, consumer in enumerate(consumers):
                while not consumer.messages.empty():
                    consumer.messages.get()
                    got[i // 2] += 1
            time.sleep(0.01)
        assert got == {0: 40, 1: 40}
        time.sleep(0.2)  # the last PUBACKs land
        for consumer in consumers:
            consumer.disconnect()
    finally:
        assert a.stop() == 0, a.output()
        assert b.stop() == 0, b.output()
    parser = argparse.ArgumentParser()
    add_arguments(parser, master_default="local[2]")
    args = parser.parse_args(["--output", str(tmp_path / "report"), "--no-charts"])
    code = run_audit(args, url, spark=spark)
    summary = json.loads((tmp_path / "report" / "summary.json").read_text())
    failed = {k: v["examples"] for k, v in summary["invariants"].items() if not v["ok"]}
    assert failed == {}
    assert code == 0
    assert summary["counts"]["events_by_kind"]["acked"] == 80
