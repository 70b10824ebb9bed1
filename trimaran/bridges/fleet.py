"""The bridges and shovels of the settings, each running in a cancel scope of its own, so that a
reload of the settings adds, removes and changes them without touching the others or the server.
One namespace holds both: below, a "bridge" is either."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import anyio
from anyio.abc import TaskGroup, TaskStatus

from trimaran.bridges.link import Link
from trimaran.config import BridgeSettings, ShovelSettings

log = logging.getLogger("trimaran.bridges")

#: The longest a bridge that goes in a reload waits for the remote to acknowledge what is in flight.
LEAVE_S = 5.0

#: A ``[[bridges]]`` or a ``[[shovels]]`` table.
Configured = BridgeSettings | ShovelSettings


@dataclass(slots=True)
class Reloaded:
    """What a reload changed, by bridge name."""

    added: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        kinds = (("added", self.added), ("removed", self.removed), ("changed", self.changed))
        parts = [f"{what} {', '.join(names)}" for what, names in kinds if names]
        return "; ".join(parts) or "nothing changed"


class BridgeFleet:
    """``make`` builds a bridge from its settings (app.py, which has what a bridge is wired to)."""

    def __init__(self, make: Callable[[Configured], Link]) -> None:
        self._make = make
        self.bridges: dict[str, Link] = {}
        self._settings: dict[str, Configured] = {}
        self._scopes: dict[str, anyio.CancelScope] = {}
        self._group: TaskGroup | None = None

    async def run(
        self, settings: list[Configured], *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Start the bridges (each has its queue open and its subscriptions made when this has
        started), then keep them until cancelled."""
        async with anyio.create_task_group() as group:
            self._group = group
            for bridge in settings:
                await self._start(bridge)
            task_status.started()
            await anyio.sleep_forever()

    async def reload(self, settings: list[Configured]) -> Reloaded:
        """Make the running bridges those of ``settings``: a new one starts, one no longer there
        stops (its queue stays, with what it holds, for when it comes back), a changed one starts
        again with its new settings. The others go on untouched."""
        wanted = {bridge.name: bridge for bridge in settings}
        done = Reloaded()
        for name in sorted(set(self.bridges) - set(wanted)):
            await self._remove(name)
            done.removed.append(name)
        for name, bridge in wanted.items():
            running = self.bridges.get(name)
            if running is None:
                await self._start(bridge)
                done.added.append(name)
            elif self._settings[name] != bridge:
                await self._remove(name)
                await self._start(bridge)
                done.changed.append(name)
        log.info("bridges reloaded: %s", done)
        return done

    async def stop(self) -> None:
        """At shutdown: each bridge lets the remote acknowledge what is in flight, then disconnects."""
        for bridge in self.bridges.values():
            await bridge.stop()

    async def _start(self, settings: Configured) -> None:
        assert self._group is not None
        bridge = self._make(settings)
        self.bridges[settings.name] = bridge
        self._settings[settings.name] = settings
        await self._group.start(self._run_one, bridge)

    async def _run_one(self, bridge: Link, *, task_status: TaskStatus[None]) -> None:
        with anyio.CancelScope() as scope:
            self._scopes[bridge.name] = scope
            await bridge.run(task_status=task_status)

    async def _remove(self, name: str) -> None:
        bridge = self.bridges.pop(name)
        del self._settings[name]
        with anyio.move_on_after(LEAVE_S):
            await bridge.stop()
        self._scopes.pop(name).cancel()
        await bridge.release()
