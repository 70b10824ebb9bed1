"""SQL for the limits per vhost and per user changed at run time (trimaran.tenant_limits' store).

Each save is one short transaction on a worker thread: administration calls, never on a message's
path. The rows hold plain JSON (the limits' field names and numbers), no protocol.
"""

from __future__ import annotations

import json
from typing import Any

import anyio.to_thread
from sqlalchemy import Engine, delete, insert, select

from trimaran.storage.engine import now_ms
from trimaran.storage.schema import tenant_limits

__all__ = ["LimitRows"]


class LimitRows:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def load_limits(self) -> list[tuple[str, str, dict[str, Any] | None]]:
        """Every ``(kind, name, limits or None for cleared)`` (blocking: at start)."""
        with self.engine.connect() as connection:
            rows = connection.execute(
                select(tenant_limits).order_by(tenant_limits.c.kind, tenant_limits.c.name)
            )
            return [(r.kind, r.name, None if r.limits is None else json.loads(r.limits)) for r in rows]

    async def save_limits(self, kind: str, name: str, limits: dict[str, Any] | None) -> None:
        await anyio.to_thread.run_sync(self._save, kind, name, limits)

    def _save(self, kind: str, name: str, limits: dict[str, Any] | None) -> None:
        text = None if limits is None else json.dumps(limits, sort_keys=True)
        with self.engine.begin() as connection:
            connection.execute(
                delete(tenant_limits).where(tenant_limits.c.kind == kind, tenant_limits.c.name == name)
            )
            connection.execute(
                insert(tenant_limits).values(kind=kind, name=name, limits=text, updated_at=now_ms())
            )
