"""Engine factory: SQLite (WAL) as the embedded default, PostgreSQL by URL.

``storage/`` is the only package that imports SQLAlchemy.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event, make_url
from sqlalchemy.engine import URL

from trimaran.errors import first_line

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


#: Driver errors that mean "the database does not answer" rather than "this statement is wrong":
#: a refused or lost connection, a server shutting down or starting up, a statement time-out.
_UNAVAILABLE = ("OperationalError", "InterfaceError")


def is_unavailable(engine: Engine, exc: BaseException) -> bool:
    """Whether ``exc`` (SQLAlchemy's wrapper or psycopg's own, from a raw cursor) says that the
    PostgreSQL server is away. SQLite's OperationalErrors (a locked file, a missing table) are the
    file's or the code's, reported each time."""
    if engine.dialect.name != "postgresql":
        return False
    seen: BaseException | None = exc
    for _ in range(4):  # the exception and what it was raised from
        if seen is None:
            break
        if getattr(seen, "connection_invalidated", False):
            return True
        if any(cls.__name__ in _UNAVAILABLE for cls in type(seen).__mro__):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


class Availability:
    """Whether the database answers, as the server's own statements found it. The first failure of
    an outage is logged (one WARNING line with the driver's reason), the failures after it only
    counted, and the first success after it is logged (one INFO line with the outage's length):
    a database that is away for a minute under load is two lines, not one traceback per write."""

    def __init__(self, described: str) -> None:
        self.described = described
        self._lock = threading.Lock()
        self.since: float | None = None  # time.monotonic() of the outage's first failure
        self.reason = ""
        self.failures = 0  # in this outage
        self.outages = 0

    def failed(self, exc: BaseException, what: str) -> str:
        """Note a failure that :func:`is_unavailable`; returns its one-line reason."""
        reason = first_line(getattr(exc, "orig", None) or exc)  # the driver's, without SQLAlchemy's
        with self._lock:
            self.failures += 1
            if self.since is not None:
                return reason
            self.since = time.monotonic()
            self.reason = reason
            self.outages += 1
        log.warning(
            "storage %s is unavailable (%s: %s); durable queue writes fail and /readyz answers 503 "
            "until it answers again",
            self.described,
            what,
            reason,
        )
        return reason

    def succeeded(self) -> None:
        if self.since is None:  # the common case, without the lock
            return
        with self._lock:
            since, failures = self.since, self.failures
            if since is None:
                return
            self.since = None
            self.failures = 0
        log.info(
            "storage %s answers again after %.1f s (%d failed operations meanwhile)",
            self.described,
            time.monotonic() - since,
            failures,
        )


_availability: weakref.WeakKeyDictionary[Engine, Availability] = weakref.WeakKeyDictionary()
_availability_lock = threading.Lock()


def availability(engine: Engine) -> Availability:
    """The one :class:`Availability` of ``engine``, shared by its writer and its readiness check."""
    with _availability_lock:
        found = _availability.get(engine)
        if found is None:
            found = _availability[engine] = Availability(describe(engine))
        return found


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
