"""The deck's port for which node holds a persistent session when several nodes share one database.

A front end that keeps sessions (MQTT) asks it before it resumes or creates one, so a session is
held by one node at a time; ``trimaran.cluster`` implements it, app.py wires it. Alone, a node has
none and holds every session it stored. (Which sessions there are, for the admin API, is the other
port, ``SessionDirectory``.)
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol

HandOver = Callable[[str], Awaitable[None]]
"""The front end's side: give up ``client_id``'s session (disconnect its client with 0x8E, write the
session to storage, forget it) because another node takes it over."""


class SessionHolders(Protocol):
    async def owned(self, client_ids: list[str]) -> set[str]:
        """Which of the stored sessions this node holds (and restores at start)."""

    async def acquire(self, client_id: str) -> bool:
        """Make this node the session's holder, taking it over from another node if one holds it.
        True when this node did not hold it: the caller loads it from storage."""

    def released(self, client_id: str) -> None:
        """This node no longer holds the session (ended, expired, taken over)."""

    def held(self, client_id: str) -> None:
        """This node holds the session after all (a clean start replaced the one it released)."""

    def serve(self, hand_over: HandOver) -> None:
        """Who gives sessions up when another node takes them over."""
