"""``trimaran export`` without a JVM: the tables stream from SQLite into Parquet, typed as the audit
reads them, and the audit's Parquet reader takes them back."""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest
from pyspark.sql import SparkSession

from bench.audit_bench import _dlq_reasons, generate, write_sqlite
from trimaran.analytics import export
from trimaran.analytics.source import TABLES, Selection, read_tables


def test_export_streams_every_table_into_typed_parquet(
    tmp_path: Path, spark: SparkSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    tables = generate(3000)
    _dlq_reasons(tables["queue_events"])
    url = write_sqlite(tables, tmp_path / "trimaran.db")
    out = tmp_path / "export"
    (out / "queue_events").mkdir(parents=True)
    (out / "queue_events" / "stale.parquet").write_bytes(b"left from an older export")
    monkeypatch.setattr(export, "CHUNK_ROWS", 1000)  # several chunks per large table
    assert export.run_export(argparse.Namespace(output=str(out), queues=None), url) == 0
    for name, columns in TABLES.items():
        files = sorted(p.name for p in (out / name).iterdir())
        assert files == ["part-0.parquet"]
        read = pq.read_table(out / name / "part-0.parquet")
        assert read.column_names == list(columns)
        assert read.num_rows == len(tables[name])
    events = pq.read_table(out / "queue_events" / "part-0.parquet").to_pandas()
    expected = tables["queue_events"][list(TABLES["queue_events"])].sort_values("id").reset_index(drop=True)
    got = events.sort_values("id").reset_index(drop=True)
    same = [frame.astype(object).where(frame.notna(), None) for frame in (got, expected)]
    pd.testing.assert_frame_equal(*same, check_dtype=False)
    assert str(pq.read_schema(out / "queue_events" / "part-0.parquet").field("attempt").type) == "int32"

    # One queue only, and what the audit reads back.
    export.export(url, tmp_path / "orders", Selection(("orders",)))
    frames = read_tables(spark, Selection(), parquet=str(tmp_path / "orders"))
    assert {r["queue"] for r in frames["queue_events"].select("queue").distinct().collect()} == {"orders"}
    assert frames["queue_events"].count() == int((tables["queue_events"]["queue"] == "orders").sum())
