"""The storage facade the broker holds: engine lifecycle, migrations, health.

Blocking database calls run on worker threads; the per-message write path (group commit)
lives in ``writer.py`` and takes whole batches per thread hop.
"""

from __future__ import annotations

import logging

import anyio.to_thread
from sqlalchemy import Engine, text
from sqlalchemy.exc import DBAPIError

from trimaran.errors import StorageUnavailable, first_line
from trimaran.storage import migrate
from trimaran.storage.engine import build_engine, describe, now_ms
from trimaran.storage.schema import broker_meta

log = logging.getLogger(__name__)


class Storage:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    @classmethod
    def from_url(cls, url: str, *, sqlite_synchronous: str = "full", pool_size: int = 5) -> Storage:
        return cls(build_engine(url, sqlite_synchronous=sqlite_synchronous, pool_size=pool_size))

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

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
        except Exception:
            log.warning("storage %s is not reachable", describe(self.engine), exc_info=True)
            return False
        return True

    async def aping(self) -> bool:
        return await anyio.to_thread.run_sync(self.ping)

    def close(self) -> None:
        self.engine.dispose()
