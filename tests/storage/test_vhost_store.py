"""trimaran/storage/vhost_store.py and migration 0009, on SQLite and PostgreSQL."""

from __future__ import annotations

import anyio
from sqlalchemy import insert, inspect, select

from trimaran.config import AuthSettings
from trimaran.security.guard import Security
from trimaran.storage import migrate
from trimaran.storage.schema import queues, topic_permissions, vhost_permissions
from trimaran.storage.store import Storage
from trimaran.storage.vhost_store import VHostRows
from trimaran.vhosts import Permission, TopicPermission, VHosts, prefix


def test_an_old_database_upgrades_with_its_queues_in_the_default_vhost(storage_url: str) -> None:
    storage = Storage.from_url(storage_url)
    try:
        migrate.upgrade(storage.engine, "0008")  # a database written before vhosts
        with storage.engine.begin() as connection:
            connection.exec_driver_sql(
                "INSERT INTO queues (name, mode, policy, next_offset, created_at) "
                "VALUES ('orders', 'work', '{}', 7, 1)"
            )
        storage.migrate()
        assert migrate.current_revision(storage.engine) == migrate.head_revision(storage.engine)
        assert {"vhosts", "vhost_permissions"} <= set(inspect(storage.engine).get_table_names())
        with storage.engine.begin() as connection:
            assert connection.execute(select(queues.c.name, queues.c.vhost)).all() == [("orders", "/")]
            connection.execute(
                insert(queues).values(
                    name=prefix("t") + "orders", mode="work", policy="{}", next_offset=0, created_at=2
                )
            )
            assert len(connection.execute(select(queues)).all()) == 2
        migrate.upgrade(storage.engine, "0008")  # and back down, and up again
        storage.migrate()
    finally:
        storage.close()


def test_vhosts_and_permissions_persist(storage_url: str) -> None:
    storage = Storage.from_url(storage_url)
    storage.migrate()

    async def main() -> None:
        rows = VHostRows(storage.engine)
        vhosts = VHosts(["/"], rows)
        await vhosts.add("team a")
        await vhosts.add("prod/eu")
        security = Security(AuthSettings())
        security.use_permissions(rows)
        # A fresh database: guest (and so anonymous clients) on / and nothing else, new vhosts closed.
        assert security.permissions() == [Permission("guest", "/")]
        assert not security.may_enter("alice", "team a") and not security.may_enter(None, "prod/eu")
        assert not security.may_enter("alice", "/") and security.may_enter(None, "/")
        await security.set_permission(Permission("alice", "team a", "^$", ".*", ".*"))
        await security.set_permission(Permission("bob", "prod/eu"))
        again = VHosts(["/"], rows)
        await again.load()
        assert again.names() == ["/", "prod/eu", "team a"]
        other = Security(AuthSettings())
        other.use_permissions(rows)
        assert other.permissions("team a") == [Permission("alice", "team a", "^$", ".*", ".*")]
        assert other.may_enter("alice", "team a") and not other.may_enter("alice", "prod/eu")
        assert other.may_enter("bob", "prod/eu") and not other.may_enter("bob", "/")
        assert other.may_enter("guest", "/") and other.may_enter(None, "/")
        assert not other.may_enter("guest", "team a") and not other.may_enter(None, "team a")
        assert await other.clear_permission("bob", "prod/eu") and not other.may_enter("bob", "prod/eu")
        assert not await other.clear_permission("bob", "prod/eu")
        await other.set_topic_permission(
            TopicPermission("alice", "team a", "amq.topic", r"^{username}\.", ".*")
        )
        third = Security(AuthSettings())
        third.use_permissions(rows)
        assert third.topic_permissions() == [
            TopicPermission("alice", "team a", "amq.topic", r"^{username}\.", ".*")
        ]
        assert await third.clear_topic_permission("alice", "team a") == 1
        assert await third.clear_topic_permission("alice", "team a") == 0
        await other.set_topic_permission(TopicPermission("alice", "team a", "amq.topic"))
        await again.delete("team a")
        with storage.engine.connect() as connection:
            left = connection.execute(select(vhost_permissions.c.user, vhost_permissions.c.vhost)).all()
        assert left == [("guest", "/")]
        with storage.engine.connect() as connection:
            assert connection.execute(select(topic_permissions)).all() == []  # gone with the vhost
        assert again.names() == ["/", "prod/eu"]

    try:
        anyio.run(main)
    finally:
        storage.close()
