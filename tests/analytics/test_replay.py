"""The audit on tables the real broker wrote: clean first, then one injected fault at a time."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from pyspark.sql import SparkSession

from trimaran.analytics.replay import INVARIANTS, run_audit


def test_broker_tables_audit_clean(spark: SparkSession, broker_db: str, tmp_path: Path) -> None:
    args = argparse.Namespace(
        parquet=None, since=None, until=None, queues=None, output=str(tmp_path / "report"),
        master="local[2]", jars=None, no_charts=False,
    )
    code = run_audit(args, broker_db, spark=spark)
    summary = json.loads((tmp_path / "report" / "summary.json").read_text())
    failed = {k: v["examples"] for k, v in summary["invariants"].items() if not v["ok"]}
    assert failed == {}
    assert code == 0
    assert set(summary["invariants"]) == set(INVARIANTS)
