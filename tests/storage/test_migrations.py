from __future__ import annotations

from sqlalchemy import inspect

from trimaran.storage import migrate
from trimaran.storage.schema import metadata
from trimaran.storage.store import Storage


def test_new_database_is_migrated_to_head(storage_url: str) -> None:
    storage = Storage.from_url(storage_url)
    try:
        assert migrate.current_revision(storage.engine) is None
        storage.migrate()
        assert migrate.current_revision(storage.engine) == migrate.head_revision(storage.engine)
        tables = set(inspect(storage.engine).get_table_names())
        assert set(metadata.tables) <= tables
        assert storage.get_meta("last_start") is not None
    finally:
        storage.close()


def test_already_migrated_database_is_left_alone(storage_url: str) -> None:
    first = Storage.from_url(storage_url)
    first.migrate()
    first.set_meta("marker", "kept")
    first.close()
    second = Storage.from_url(storage_url)
    try:
        second.migrate()  # a no-op that must not fail or lose data
        assert second.get_meta("marker") == "kept"
        assert migrate.current_revision(second.engine) == migrate.head_revision(second.engine)
        assert second.ping()
    finally:
        second.close()


def test_sqlite_runs_in_wal_mode(tmp_path) -> None:  # type: ignore[no-untyped-def]
    storage = Storage.from_url(f"sqlite:///{tmp_path / 'w.db'}")
    try:
        with storage.engine.connect() as connection:
            assert connection.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
    finally:
        storage.close()
