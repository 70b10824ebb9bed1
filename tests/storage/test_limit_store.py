"""trimaran/storage/limit_store.py and migration 0010, on SQLite and PostgreSQL: what the admin API
changed at run time comes back at the next start, over the settings."""

from __future__ import annotations

import anyio
from alembic import command
from sqlalchemy import inspect

from trimaran.storage import migrate
from trimaran.storage.limit_store import LimitRows
from trimaran.storage.store import Storage
from trimaran.tenant_limits import TenantLimits, UserLimits, VhostLimits


def _settings_limits() -> TenantLimits:
    return TenantLimits(
        {"/": VhostLimits(max_connections=10), "old": VhostLimits(max_queues=1)},
        {"alice": UserLimits(max_connections=2)},
    )


def test_changes_made_at_run_time_are_applied_over_the_settings_at_the_next_start(storage_url: str) -> None:
    storage = Storage.from_url(storage_url)
    try:
        storage.migrate()
        running = _settings_limits()
        running.use_store(LimitRows(storage.engine))
        assert running.vhosts["/"].max_connections == 10  # nothing stored yet: the settings

        async def change() -> None:
            await running.change_vhost("/", VhostLimits(max_connections=3, max_stored_bytes=1000))
            assert await running.change_vhost("old", None)  # cleared though the settings name it
            assert not await running.change_vhost("never", None)
            await running.change_user("bob", UserLimits(max_messages_per_s=5.5))
            await running.change_default_user(UserLimits(max_bytes_per_s=1e6))
            await running.change_user("bob", UserLimits(max_messages_per_s=7))  # the last one counts

        anyio.run(change)
        restarted = _settings_limits()
        restarted.use_store(LimitRows(storage.engine))
        assert restarted.vhosts == {"/": VhostLimits(max_connections=3, max_stored_bytes=1000)}
        assert restarted.users == {
            "alice": UserLimits(max_connections=2),
            "bob": UserLimits(max_messages_per_s=7),
        }
        assert restarted.default_user == UserLimits(max_bytes_per_s=1e6)
    finally:
        storage.close()


def test_the_table_comes_and_goes_with_its_revision(storage_url: str) -> None:
    storage = Storage.from_url(storage_url)
    try:
        migrate.upgrade(storage.engine, "0009")  # a database written before this revision
        assert "tenant_limits" not in inspect(storage.engine).get_table_names()
        storage.migrate()
        assert LimitRows(storage.engine).load_limits() == []
        command.downgrade(migrate.alembic_config(storage.engine), "0009")
        assert "tenant_limits" not in inspect(storage.engine).get_table_names()
        storage.migrate()
        assert "tenant_limits" in inspect(storage.engine).get_table_names()
    finally:
        storage.close()
