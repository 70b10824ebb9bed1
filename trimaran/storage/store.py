"""The storage facade the broker holds: engine lifecycle, migrations, health.

Blocking database calls run on worker threads; the per-message write path (group commit)
lives in ``writer.py`` and takes whole batches per thread hop.
"""

from __future__ import annotations

import logging
import sqlite3

import anyio.to_thread
from sqlalchemy import Engine, text
from sqlalchemy.exc import DBAPIError

from trimaran.errors import StorageUnavailable, first_line
from trimaran.storage import migrate
from trimaran.storage.engine import availability, build_engine, describe, is_unavailable, now_ms, sqlite_file
from trimaran.storage.schema import broker_meta

log = logging.getLogger(__name__)

CHECK_BUSY_TIMEOUT_S = 2.0  # how long the start-up check waits for a lock another process holds


class Storage:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        sqlite_synchronous: str = "full",
        pool_size: int = 5,
        statement_timeout_s: float = 30.0,
    ) -> Storage:
        return cls(
            build_engine(
                url,
                sqlite_synchronous=sqlite_synchronous,
                pool_size=pool_size,
                statement_timeout_s=statement_timeout_s,
            )
        )

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    def check(self, busy_timeout_s: float = CHECK_BUSY_TIMEOUT_S) -> None:
        """SQLite: refuse a damaged or locked file in one line before anything else touches it.

        ``PRAGMA quick_check`` reads every page (seconds for gigabytes, once per start); a short write
        transaction proves nobody else holds the file, instead of the engine's 30 s silent busy wait.
        """
        path = sqlite_file(self.engine.url)
        if path is None or not path.exists():
            return
        try:
            connection = sqlite3.connect(path, timeout=busy_timeout_s, isolation_level=None)
        except sqlite3.Error as exc:
            raise StorageUnavailable(f"cannot open the database {path}: {first_line(exc)}") from None
        try:
            rows = connection.execute("PRAGMA quick_check").fetchall()
            problems = [str(row[0]) for row in rows if row[0] != "ok"]
            if problems:
                more = f" (and {len(problems) - 1} more problems)" if len(problems) > 1 else ""
                raise StorageUnavailable(
                    f"the database {path} is damaged: {problems[0]}{more}; restore it from a backup "
                    "or move it aside"
                )
            connection.execute("BEGIN IMMEDIATE")
            connection.execute("ROLLBACK")
        except sqlite3.OperationalError as exc:
            if "locked" in str(exc) or "busy" in str(exc):
                raise StorageUnavailable(
                    f"the database {path} is locked by another process (waited {busy_timeout_s:g} s): "
                    f"{first_line(exc)}"
                ) from None
            raise StorageUnavailable(f"the database {path} cannot be read: {first_line(exc)}") from None
        except sqlite3.DatabaseError as exc:  # "file is not a database", "database disk image is malformed"
            raise StorageUnavailable(
                f"the database {path} is damaged: {first_line(exc)}; restore it from a backup "
                "or move it aside"
            ) from None
        finally:
            connection.close()

    def migrate(self) -> None:
        try:
            before = migrate.current_revision(self.engine)
        except DBAPIError as exc:  # the first connection: a server down, a wrong password, no file
            reason = first_line(exc.orig) if exc.orig is not None else first_line(exc)
            raise StorageUnavailable(f"cannot open the database {describe(self.engine)}: {reason}") from None
        migrate.upgrade(self.engine)
        after = migrate.current_revision(self.engine)
        if before != after:
            log.info("storage migrated %s from %s to %s", describe(self.engine), before or "empty", after)
        self.set_meta("last_start", str(now_ms()))

    def set_meta(self, key: str, value: str) -> None:
        with self.engine.begin() as connection:
            updated = connection.execute(
                broker_meta.update().where(broker_meta.c.key == key).values(value=value, updated_at=now_ms())
            ).rowcount
            if not updated:
                connection.execute(broker_meta.insert().values(key=key, value=value, updated_at=now_ms()))

    def get_meta(self, key: str) -> str | None:
        with self.engine.connect() as connection:
            row = connection.execute(broker_meta.select().where(broker_meta.c.key == key)).first()
        return None if row is None else str(row.value)

    def ping(self) -> bool:
        try:
            with self.engine.connect() as connection:
                connection.execute(text("SELECT 1"))
        except Exception as exc:
            if is_unavailable(self.engine, exc):  # said once per outage, not at every probe
                availability(self.engine).failed(exc, "readiness check")
            else:
                log.warning("storage %s is not reachable", describe(self.engine), exc_info=True)
            return False
        availability(self.engine).succeeded()
        return True

    async def aping(self, timeout_s: float | None = None) -> bool:
        """``ping`` on a worker thread; False after ``timeout_s`` (a hung server: the thread is left
        to end on the driver's own time-outs, the caller answers now)."""
        if timeout_s is None:
            return await anyio.to_thread.run_sync(self.ping)
        with anyio.move_on_after(timeout_s):
            return await anyio.to_thread.run_sync(self.ping, abandon_on_cancel=True)
        log.warning("storage %s did not answer within %.1f s", describe(self.engine), timeout_s)
        return False

    def close(self) -> None:
        self.engine.dispose()
