"""Permissions written into a database before a test server starts."""

from __future__ import annotations

import anyio

from trimaran.config import AuthSettings
from trimaran.security.guard import Security
from trimaran.storage.store import Storage
from trimaran.storage.vhost_store import VHostRows
from trimaran.vhosts import Permission, TopicPermission


def store_permissions(url: str, grants: list[tuple[str, str]]) -> None:
    """(user, vhost) permissions in the database before the server starts (RabbitMQ's
    set_permissions, everything allowed in the vhost)."""
    storage = Storage.from_url(url)
    try:
        storage.migrate()

        async def grant() -> None:
            security = Security(AuthSettings())
            security.use_permissions(VHostRows(storage.engine))
            for user, vhost in grants:
                await security.set_permission(Permission(user, vhost))

        anyio.run(grant)
    finally:
        storage.close()


def store_topic_permission(url: str, permission: TopicPermission) -> None:
    """A topic permission in the database before the server starts (as ``trimaran permissions
    set-topic`` would store it through a running server's API)."""
    storage = Storage.from_url(url)
    try:
        storage.migrate()

        async def save() -> None:
            security = Security(AuthSettings())
            security.use_permissions(VHostRows(storage.engine))
            await security.set_topic_permission(permission)

        anyio.run(save)
    finally:
        storage.close()
