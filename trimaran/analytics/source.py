"""Where the audit reads the queue tables from: the database over JDBC, or a Parquet export.

Only the columns the audit needs are read (never message payloads). Large tables are read in
parallel slices of a numeric column (Spark's partitioned JDBC reads); filters on queue names, on a
vhost (a key prefix) and on the time window are pushed into the SQL so the database sends only what
is audited.
"""

from __future__ import annotations

import logging
import math
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import parse_qs, unquote, urlsplit

from trimaran.vhosts import DEFAULT_VHOST, TENANT, prefix

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

# Debian's libxerial-sqlite-jdbc-java and libpostgresql-jdbc-java.
DEBIAN_JARS: tuple[str, ...] = ("/usr/share/java/sqlite-jdbc.jar", "/usr/share/java/postgresql.jar")

# The columns read from each table, with the Spark SQL type each is cast to (JDBC drivers and
# Parquet writers disagree on integer widths; the replay sees one schema).
TABLES: dict[str, dict[str, str]] = {
    "queues": {"name": "string", "mode": "string", "policy": "string", "next_offset": "bigint"},
    "queue_messages": {
        "queue": "string",
        "offset": "bigint",
        "published_at": "bigint",
        "expires_at": "bigint",
        "publisher": "string",
        "protocol": "string",
    },
    "queue_groups": {"queue": "string", "group": "string", "cursor": "bigint", "committed": "bigint"},
    "queue_pending": {
        "queue": "string",
        "group": "string",
        "offset": "bigint",
        "state": "string",
        "consumer": "string",
        "node": "string",
        "delivered_at": "bigint",
        "attempts": "int",
        "available_at": "bigint",
        "reason": "string",
    },
    # A shared node's claims of new messages (migration 0015): held with no pending row.
    "queue_spans": {"queue": "string", "group": "string", "first_offset": "bigint", "last_offset": "bigint"},
    "queue_events": {
        "id": "bigint",
        "time": "bigint",
        "queue": "string",
        "group": "string",
        "offset": "bigint",
        "consumer": "string",
        "node": "string",
        "kind": "string",
        "attempt": "int",
        "reason": "string",
        "span": "int",  # the row stands for this many consecutive offsets (expand_spans)
    },
}
# Tables younger than the first schema, with the migration that made them: read as empty from a
# database or an export older than it.
SINCE = {"queue_spans": "0015"}
# Numeric column each large table is sliced on for parallel JDBC reads.
SLICE_COLUMN = {"queue_events": "id", "queue_messages": "offset", "queue_pending": "offset"}
ROWS_PER_SLICE = 200_000  # at most (about): one slice is one query, fetched by one task
MIN_ROWS_PER_SLICE = 10_000  # below this, one more connection costs more than it saves


def slice_count(rows: int, parallelism: int) -> int:
    """How many partitioned reads of a table: one per core, so every executor core has a share,
    when the table has enough rows for each; more when slices would pass ``ROWS_PER_SLICE``."""
    by_size = math.ceil(rows / ROWS_PER_SLICE)
    by_cores = min(parallelism, rows // MIN_ROWS_PER_SLICE)
    return max(1, by_size, by_cores)


@dataclass(frozen=True)
class Selection:
    """What to audit: some queues (``None``: all; queue keys), of one vhost (``None``: every
    vhost), and messages published in [since, until)."""

    queues: tuple[str, ...] | None = None
    since_ms: int | None = None
    until_ms: int | None = None
    vhost: str | None = None

    @property
    def windowed(self) -> bool:
        return self.since_ms is not None or self.until_ms is not None


def jdbc_target(storage_url: str) -> tuple[str, dict[str, str]]:
    """A SQLAlchemy-style storage URL -> (JDBC URL, connection properties)."""
    parts = urlsplit(storage_url)
    scheme = parts.scheme.split("+", 1)[0]
    if scheme == "sqlite":
        path = storage_url.split(":///", 1)[1] if ":///" in storage_url else ""
        path = path.split("?", 1)[0]
        if not path or path == ":memory:":
            raise ValueError("the audit needs a SQLite database file, not an in-memory one")
        return f"jdbc:sqlite:{Path(path).resolve()}", {"driver": "org.sqlite.JDBC"}
    if scheme in ("postgresql", "postgres"):
        host = parts.hostname or parse_qs(parts.query).get("host", ["localhost"])[0]
        port = parts.port or 5432
        database = parts.path.lstrip("/")
        props = {"driver": "org.postgresql.Driver"}
        if parts.username:
            props["user"] = unquote(parts.username)
        if parts.password:
            props["password"] = unquote(parts.password)
        return f"jdbc:postgresql://{host}:{port}/{database}", props
    raise ValueError(f"unsupported storage URL {storage_url!r}: use sqlite:/// or postgresql://")


def _sql_string(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _where(table: str, selection: Selection) -> str:
    clauses = []
    if selection.queues is not None:
        column = '"name"' if table == "queues" else '"queue"'
        names = ", ".join(_sql_string(q) for q in selection.queues) or "NULL"
        clauses.append(f"{column} IN ({names})")
    if selection.vhost is not None:
        # A key's vhost is its prefix (trimaran/vhosts.py); substr compares bytes, as LIKE may not.
        column = '"name"' if table == "queues" else '"queue"'
        if selection.vhost == DEFAULT_VHOST:
            clauses.append(f"substr({column}, 1, {len(TENANT)}) <> {_sql_string(TENANT)}")
        else:
            mine = prefix(selection.vhost)
            clauses.append(f"substr({column}, 1, {len(mine)}) = {_sql_string(mine)}")
    # Events of a message come after its publication: older events cannot concern the window.
    if table == "queue_events" and selection.since_ms is not None:
        clauses.append(f'"time" >= {int(selection.since_ms)}')
    return (" WHERE " + " AND ".join(clauses)) if clauses else ""


def _typed(frame: DataFrame, table: str) -> DataFrame:
    from pyspark.sql import functions as F

    present = set(frame.columns)
    return frame.select(
        *[
            # an export made before event spans (migration 0007) has single events only
            (F.col(c) if c in present else F.lit(1)).cast(t).alias(c)
            for c, t in TABLES[table].items()
        ]
    )


def replayed_columns(table: str) -> dict[str, str]:
    """The columns the replay sees of ``table``: as read, less ``span`` (``expand_spans`` took it)."""
    return {c: t for c, t in TABLES[table].items() if c != "span"}


def expand_spans(events: DataFrame) -> DataFrame:
    """One row per event: a row spanning ``span`` consecutive offsets (``schema.queue_events``)
    becomes that many rows, one per offset, with the same id (their order is the offsets')."""
    from pyspark.sql import functions as F

    offsets = F.when(
        F.col("span") > 1, F.sequence(F.col("offset"), F.col("offset") + F.col("span") - 1)
    ).otherwise(F.array(F.col("offset")))
    return events.withColumn("offset", F.explode(offsets)).drop("span")


def read_jdbc(
    spark: SparkSession,
    storage_url: str,
    table: str,
    selection: Selection,
) -> DataFrame:
    """One table over JDBC. The large ones are read in slices of their numeric column
    (``partitionColumn``/``lowerBound``/``upperBound``/``numPartitions`` from a min/max/count query),
    as many as :func:`slice_count` gives for the executors' cores, so the executors share the read;
    the database sees one range query per slice."""
    url, props = jdbc_target(storage_url)
    where = _where(table, selection)
    columns = ", ".join(f'"{c}"' for c in TABLES[table])
    sql = f"SELECT {columns} FROM {table}{where}"

    def reader() -> object:
        r = spark.read.format("jdbc").option("url", url).option("fetchsize", "10000")
        for key, value in props.items():
            r = r.option(key, value)
        return r

    base = reader()
    slice_column = SLICE_COLUMN.get(table)
    if slice_column is not None:
        c = f'"{slice_column}"'
        bounds_sql = (
            f"SELECT CAST(min({c}) AS BIGINT) AS lo, CAST(max({c}) AS BIGINT) AS hi,"
            f" CAST(count(*) AS BIGINT) AS n FROM {table}{where}"
        )
        bounds = base.option("query", bounds_sql).option(  # type: ignore[attr-defined]
            "customSchema",
            "lo BIGINT, hi BIGINT, n BIGINT",  # SQLite reports no type for aggregates
        )
        row = bounds.load().first()
        n = int(row["n"] or 0) if row is not None else 0
        slices = slice_count(n, spark.sparkContext.defaultParallelism)
        if row is not None and slices > 1:
            frame = (
                reader()
                .option("dbtable", f"({sql}) AS t")  # type: ignore[attr-defined]
                .option("partitionColumn", slice_column)
                .option("lowerBound", str(int(row["lo"])))
                .option("upperBound", str(int(row["hi"]) + 1))
                .option("numPartitions", str(slices))
                .load()
            )
            return _typed(frame, table)
    frame = reader().option("dbtable", f"({sql}) AS t").load()  # type: ignore[attr-defined]
    return _typed(frame, table)


def read_parquet(spark: SparkSession, directory: str, table: str, selection: Selection) -> DataFrame:
    from pyspark.sql import functions as F

    path = Path(directory) / table
    if table in SINCE and not path.exists():  # an export made before the table was
        return _empty(spark, table)
    frame = _typed(spark.read.parquet(str(path)), table)
    if selection.queues is not None:
        column = "name" if table == "queues" else "queue"
        frame = frame.filter(F.col(column).isin(list(selection.queues)))
    if selection.vhost is not None:
        column = "name" if table == "queues" else "queue"
        if selection.vhost == DEFAULT_VHOST:
            frame = frame.filter(~F.col(column).startswith(TENANT))
        else:
            frame = frame.filter(F.col(column).startswith(prefix(selection.vhost)))
    if table == "queue_events" and selection.since_ms is not None:
        frame = frame.filter(F.col("time") >= selection.since_ms)
    return frame


def _empty(spark: SparkSession, table: str) -> DataFrame:
    schema = ", ".join(f"`{c}` {t}" for c, t in TABLES[table].items())
    return spark.createDataFrame([], schema)


def _read_jdbc_since(spark: SparkSession, storage_url: str, table: str, selection: Selection) -> DataFrame:
    """A table newer than some databases the audit may be pointed at (not migrated since): empty
    where it is missing."""
    try:
        return read_jdbc(spark, storage_url, table, selection)
    except Exception as exc:  # the driver's "no such table" comes through py4j as any error
        if table not in str(exc):
            raise
        log.info("no %s table (a schema from before migration %s): read as empty", table, SINCE[table])
        return _empty(spark, table)


def read_tables(
    spark: SparkSession,
    selection: Selection,
    *,
    storage_url: str | None = None,
    parquet: str | None = None,
) -> dict[str, DataFrame]:
    if (storage_url is None) == (parquet is None):
        raise ValueError("read from exactly one of a storage URL and a Parquet export")
    if parquet is not None:
        tables = {t: read_parquet(spark, parquet, t, selection) for t in TABLES}
    else:
        assert storage_url is not None
        tables = {
            t: (_read_jdbc_since if t in SINCE else read_jdbc)(spark, storage_url, t, selection)
            for t in TABLES
        }
    tables["queue_events"] = expand_spans(tables["queue_events"])
    return tables


def spark_session(
    master: str | None,
    jars: list[str] | None,
    *,
    app_name: str = "trimaran-audit",
    shuffle_partitions: int | None = None,
    extra: dict[str, str] | None = None,
) -> SparkSession:
    """``master=None`` keeps what spark-submit configured; ``jars=None`` adds none (spark-submit --jars)."""
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(app_name)
    if master is not None:
        builder = builder.master(master)
        if master.startswith("local"):
            # The replay runs Python on the executors: in local mode, this interpreter (and its
            # pyarrow), not whatever ``python3`` is first on the PATH.
            os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    if jars:
        present = [j for j in jars if Path(j).exists()]
        if present:
            builder = builder.config("spark.jars", ",".join(present))
    builder = builder.config("spark.ui.showConsoleProgress", "true").config(
        "spark.sql.session.timeZone", "UTC"
    )
    # Adaptive execution: shuffles coalesced to what the data needs, sort-merge joins turned into
    # broadcast joins when one side proves small. The audit's many small stages cost more than its data.
    builder = builder.config("spark.sql.adaptive.enabled", "true").config(
        "spark.sql.adaptive.coalescePartitions.enabled", "true"
    )
    if shuffle_partitions is not None:
        builder = builder.config("spark.sql.shuffle.partitions", str(shuffle_partitions))
    for key, value in (extra or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark
