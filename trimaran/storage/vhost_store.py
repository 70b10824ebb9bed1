"""SQL for virtual hosts: the vhosts created at run time and who may enter which.

Implements :class:`trimaran.vhosts.VHostStore` and the permission store
:class:`trimaran.security.guard.Security` reads. Each call is one short transaction run on a worker
thread; these are administration calls, never on a message's path.
"""

from __future__ import annotations

import anyio.to_thread
from sqlalchemy import Connection, Engine, delete, insert, select

from trimaran.storage.engine import now_ms
from trimaran.storage.schema import broker_meta, topic_permissions, vhost_permissions, vhosts
from trimaran.vhosts import Permission, TopicPermission

__all__ = ["UPGRADE_MARKER", "VHostRows"]

#: The broker_meta key migration 0011 leaves for the next start (0011_permissions_enforced.py).
UPGRADE_MARKER = "permissions_upgrade"


class VHostRows:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    # -- vhosts -------------------------------------------------------------------------------------

    async def load_vhosts(self) -> list[str]:
        return await anyio.to_thread.run_sync(self._load_vhosts)

    async def save_vhost(self, name: str) -> None:
        await anyio.to_thread.run_sync(self._save_vhost, name)

    async def delete_vhost(self, name: str) -> None:
        await anyio.to_thread.run_sync(self._delete_vhost, name)

    def _load_vhosts(self) -> list[str]:
        with self.engine.connect() as connection:
            return [row.name for row in connection.execute(select(vhosts.c.name).order_by(vhosts.c.name))]

    def _save_vhost(self, name: str) -> None:
        with self.engine.begin() as connection:
            connection.execute(delete(vhosts).where(vhosts.c.name == name))
            connection.execute(insert(vhosts).values(name=name, created_at=now_ms()))

    def _delete_vhost(self, name: str) -> None:
        with self.engine.begin() as connection:
            connection.execute(delete(vhost_permissions).where(vhost_permissions.c.vhost == name))
            connection.execute(delete(topic_permissions).where(topic_permissions.c.vhost == name))
            connection.execute(delete(vhosts).where(vhosts.c.name == name))

    # -- permissions --------------------------------------------------------------------------------

    def load_permissions(self) -> list[Permission]:
        """Every permission row (blocking: at start, before the listeners open)."""
        with self.engine.connect() as connection:
            rows = connection.execute(
                select(vhost_permissions).order_by(vhost_permissions.c.vhost, vhost_permissions.c.user)
            )
            return [Permission(r.user, r.vhost, r.configure, r.write, r.read) for r in rows]

    def take_upgrade_marker(self) -> str | None:
        """What migration 0011 left for the first start after it (``open``: nobody had a permission,
        so everyone entered everywhere; ``guest``: guest's ``/`` was added), taken away (blocking)."""
        with self.engine.begin() as connection:
            where = broker_meta.c.key == UPGRADE_MARKER
            row = connection.execute(select(broker_meta.c.value).where(where)).first()
            if row is None:
                return None
            connection.execute(delete(broker_meta).where(where))
            return str(row.value)

    def save_permissions_now(self, permissions: list[Permission]) -> None:
        """Several rows in one transaction (blocking: the upgrade's grants, at start)."""
        with self.engine.begin() as connection:
            for p in permissions:
                self._insert_permission(connection, p)

    async def save_permission(self, permission: Permission) -> None:
        await anyio.to_thread.run_sync(self._save_permission, permission)

    async def delete_permission(self, user: str, vhost: str) -> None:
        await anyio.to_thread.run_sync(self._delete_permission, user, vhost)

    def _save_permission(self, p: Permission) -> None:
        with self.engine.begin() as connection:
            self._insert_permission(connection, p)

    @classmethod
    def _insert_permission(cls, connection: Connection, p: Permission) -> None:
        cls._delete_permission_in(connection, p.user, p.vhost)
        connection.execute(
            insert(vhost_permissions).values(
                user=p.user,
                vhost=p.vhost,
                configure=p.configure,
                write=p.write,
                read=p.read,
                updated_at=now_ms(),
            )
        )

    def _delete_permission(self, user: str, vhost: str) -> None:
        with self.engine.begin() as connection:
            self._delete_permission_in(connection, user, vhost)

    @staticmethod
    def _delete_permission_in(connection: Connection, user: str, vhost: str) -> None:
        connection.execute(
            delete(vhost_permissions).where(
                vhost_permissions.c.user == user, vhost_permissions.c.vhost == vhost
            )
        )

    # -- topic permissions (RabbitMQ's set_topic_permissions) -------------------------------------

    def load_topic_permissions(self) -> list[TopicPermission]:
        """Every topic permission row (blocking: at start)."""
        t = topic_permissions
        with self.engine.connect() as connection:
            rows = connection.execute(select(t).order_by(t.c.vhost, t.c.user, t.c.exchange))
            return [TopicPermission(r.user, r.vhost, r.exchange, r.write, r.read) for r in rows]

    async def save_topic_permission(self, permission: TopicPermission) -> None:
        await anyio.to_thread.run_sync(self._save_topic_permission, permission)

    async def delete_topic_permission(self, user: str, vhost: str, exchange: str) -> None:
        await anyio.to_thread.run_sync(self._delete_topic_permission, user, vhost, exchange)

    def _save_topic_permission(self, p: TopicPermission) -> None:
        with self.engine.begin() as connection:
            self._delete_topic_in(connection, p.user, p.vhost, p.exchange)
            connection.execute(
                insert(topic_permissions).values(
                    user=p.user,
                    vhost=p.vhost,
                    exchange=p.exchange,
                    write=p.write,
                    read=p.read,
                    updated_at=now_ms(),
                )
            )

    def _delete_topic_permission(self, user: str, vhost: str, exchange: str) -> None:
        with self.engine.begin() as connection:
            self._delete_topic_in(connection, user, vhost, exchange)

    @staticmethod
    def _delete_topic_in(connection: Connection, user: str, vhost: str, exchange: str) -> None:
        t = topic_permissions
        connection.execute(delete(t).where(t.c.user == user, t.c.vhost == vhost, t.c.exchange == exchange))
