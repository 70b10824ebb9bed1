"""``trimaran export``: copy the queue tables to Parquet, so the audit can run without the database.

One directory per table (``queues``, ``queue_messages``, ``queue_groups``, ``queue_pending``,
``queue_events``), the columns the audit reads (no payloads), written by Spark from partitioned
JDBC reads. ``trimaran audit --parquet DIR`` reads it back.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from trimaran.analytics.source import DEBIAN_JARS, TABLES, Selection, read_tables, spark_session

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def export(
    spark: SparkSession, storage_url: str, directory: Path, selection: Selection | None = None
) -> dict[str, int]:
    """Write each table under ``directory``; returns the rows written per table."""
    tables = read_tables(spark, selection or Selection(), storage_url=storage_url)
    written = {}
    for name in TABLES:
        frame = tables[name].persist()
        frame.write.mode("overwrite").parquet(str(directory / name))
        written[name] = frame.count()
        frame.unpersist()
    return written


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--output", "-o", required=True, metavar="DIR", help="directory for the Parquet tables"
    )
    parser.add_argument(
        "--queue", dest="queues", action="append", metavar="NAME", help="only this queue (repeatable)"
    )
    parser.add_argument("--master", default="local[*]", help="Spark master (default: local[*])")
    parser.add_argument(
        "--jars",
        default=None,
        metavar="JAR[,JAR]",
        help="JDBC driver jars (default: " + ", ".join(DEBIAN_JARS) + ")",
    )


def run_export(args: argparse.Namespace, storage_url: str) -> int:
    jars = args.jars.split(",") if args.jars else list(DEBIAN_JARS)
    spark = spark_session(args.master, jars, app_name="trimaran-export")
    selection = Selection(tuple(args.queues) if args.queues else None)
    written = export(spark, storage_url, Path(args.output), selection)
    for name, rows in written.items():
        print(f"{name}: {rows} rows")
    print(f"exported to {args.output}; audit it with: trimaran audit --parquet {args.output}")
    return 0
