"""Engine factory: SQLite (WAL) as the embedded default, PostgreSQL by URL.

``storage/`` is the only package that imports SQLAlchemy.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event, make_url
from sqlalchemy.engine import URL

log = logging.getLogger(__name__)


def now_ms() -> int:
    """Times are stored as integer epoch milliseconds so every reader (Spark's JDBC too) agrees."""
    return time.time_ns() // 1_000_000


def normalise_url(url: str) -> URL:
    """Pick our drivers: psycopg 3 for PostgreSQL, the stdlib sqlite3 for SQLite."""
    parsed = make_url(url)
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed


def build_engine(
    url: str,
    *,
    sqlite_synchronous: str = "full",
    pool_size: int = 5,
    statement_timeout_s: float = 30.0,
) -> Engine:
    parsed = normalise_url(url)
    if parsed.get_backend_name() == "sqlite":
        return _sqlite_engine(parsed, sqlite_synchronous)
    return create_engine(
        parsed,
        pool_size=pool_size,
        pool_pre_ping=True,
        future=True,
        connect_args=postgres_connect_args(statement_timeout_s),
    )


def postgres_connect_args(statement_timeout_s: float) -> dict[str, Any]:
    """Bound every statement and notice a dead server: a hung PostgreSQL must fail queue writes (and
    /readyz) in bounded time, never stall them without limit.

    ``statement_timeout`` ends a statement the server works on too long; TCP keep-alive and
    ``tcp_user_timeout`` end a connection whose server stopped answering (a frozen host, a dropped
    route), where no statement time-out can fire because the server never sees the statement.
    """
    timeout_ms = max(1, int(statement_timeout_s * 1000))
    args: dict[str, Any] = {
        "connect_timeout": max(1, int(statement_timeout_s)),
        "keepalives": 1,
        "keepalives_idle": 10,
        "keepalives_interval": 5,
        "keepalives_count": 3,
        "tcp_user_timeout": timeout_ms,
    }
    if statement_timeout_s > 0:
        args["options"] = f"-c statement_timeout={timeout_ms}"
    return args


def _sqlite_engine(url: URL, synchronous: str) -> Engine:
    database = url.database
    if database and database != ":memory:" and not database.startswith("file:"):
        Path(database).parent.mkdir(parents=True, exist_ok=True)
    # One connection per thread; the writer thread owns writes, readers use their own.
    engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30}, future=True)

    @event.listens_for(engine, "connect")
    def _pragmas(dbapi_connection: Any, _record: Any) -> None:
        # The stdlib driver's own transaction handling fights SQLAlchemy's; let SQLAlchemy BEGIN.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA synchronous={synchronous.upper()}")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA busy_timeout=30000")
        cursor.execute("PRAGMA temp_store=MEMORY")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _begin(connection: Any) -> None:
        # IMMEDIATE takes the write lock up front, so two writers never deadlock on upgrade.
        connection.exec_driver_sql("BEGIN IMMEDIATE")

    return engine


def sqlite_file(url: str | URL) -> Path | None:
    """The database file of a SQLite URL (``None`` for PostgreSQL and in-memory databases)."""
    parsed = normalise_url(url) if isinstance(url, str) else url
    database = parsed.database
    if parsed.get_backend_name() != "sqlite" or not database or database == ":memory:":
        return None
    if database.startswith("file:"):
        return None
    return Path(database)


def describe(engine: Engine) -> str:
    """The URL with the password hidden, for log lines."""
    return engine.url.render_as_string(hide_password=True)
