"""The audit over JDBC from PostgreSQL: the broker's two runs written to a throwaway cluster."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from tests.analytics.conftest import write_broker_tables
from tests.support.postgres import PostgresCluster
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
    assert summary["counts"]["events"] == events.count()
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
