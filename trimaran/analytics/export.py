"""``trimaran export``: copy the queue tables to Parquet, so the audit can run without the database.

One directory per table (``queues``, ``queue_messages``, ``queue_groups``, ``queue_pending``,
``queue_spans``, ``queue_events``), each holding ``part-0.parquet`` with the columns the audit reads
(no payloads), typed as the audit reads them (``source.TABLES``). The rows stream from SQL in chunks
straight into pyarrow: no JVM, and memory bounded by one chunk. ``trimaran audit --parquet DIR``
reads it back.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path
from typing import Any

from trimaran.analytics.source import SINCE, TABLES, Selection, _where

CHUNK_ROWS = 100_000
_ARROW = {"string": "string", "bigint": "int64", "int": "int32"}


def _schema() -> dict[str, Any]:
    import pyarrow as pa

    return {
        table: pa.schema([(name, pa.type_for_alias(_ARROW[kind])) for name, kind in columns.items()])
        for table, columns in TABLES.items()
    }


def export(storage_url: str, directory: Path, selection: Selection | None = None) -> dict[str, int]:
    """Write each table under ``directory`` (replacing what was there); returns the rows per table."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from sqlalchemy import inspect

    from trimaran.storage.store import Storage

    selection = selection or Selection()
    schemas = _schema()
    storage = Storage.from_url(storage_url)
    written: dict[str, int] = {}
    try:
        with storage.engine.connect() as connection:
            for table, columns in TABLES.items():
                out = directory / table
                shutil.rmtree(out, ignore_errors=True)
                out.mkdir(parents=True)
                names = ", ".join(f'"{c}"' for c in columns)
                sql = f"SELECT {names} FROM {table}{_where(table, selection)}"
                rows = 0
                with pq.ParquetWriter(out / "part-0.parquet", schemas[table]) as writer:
                    if table in SINCE and not inspect(connection).has_table(table):
                        written[table] = 0  # a schema from before the table: exported empty
                        continue
                    result = connection.execution_options(stream_results=True).exec_driver_sql(sql)
                    for chunk in result.partitions(CHUNK_ROWS):
                        values = list(zip(*chunk, strict=True))
                        writer.write_batch(
                            pa.record_batch(
                                [
                                    pa.array(v, type=t)
                                    for v, t in zip(values, schemas[table].types, strict=True)
                                ],
                                schema=schemas[table],
                            )
                        )
                        rows += len(chunk)
                written[table] = rows
    finally:
        storage.close()
    return written


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--output", "-o", required=True, metavar="DIR", help="directory for the Parquet tables"
    )
    parser.add_argument(
        "--queue", dest="queues", action="append", metavar="NAME", help="only this queue (repeatable)"
    )


def run_export(args: argparse.Namespace, storage_url: str) -> int:
    selection = Selection(tuple(args.queues) if args.queues else None)
    written = export(storage_url, Path(args.output), selection)
    for name, rows in written.items():
        print(f"{name}: {rows} rows")
    print(f"exported to {args.output}; audit it with: trimaran audit --parquet {args.output}")
    return 0
