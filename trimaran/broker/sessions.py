"""The session directory: the deck's port for whoever lists and ends persistent sessions.

The MQTT hull keeps the sessions (only MQTT has server-side sessions that outlive a connection) and
implements :class:`SessionDirectory`; the admin API reads it without knowing the hull. What crosses
the port are plain snapshots, so the reader cannot change a session behind the hull's back.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class SessionSubscriptionInfo:
    topic_filter: str  # as the client sent it, "$share/<group>/<filter>" included
    qos: int
    no_local: bool
    retain_as_published: bool
    retain_handling: int
    subscription_identifier: int | None


@dataclass(frozen=True, slots=True)
class SessionInfo:
    client_id: str
    connected: bool
    protocol_level: int
    expiry_interval_s: int
    expires_in_s: float | None  # None: connected, or never expires
    subscription_count: int
    inflight: int
    queued: int
    dropped: int
    subscriptions: tuple[SessionSubscriptionInfo, ...] = ()  # filled only by ``SessionDirectory.session``


class SessionDirectory(Protocol):
    def session_count(self) -> int:
        """Sessions, connected or not."""
        ...

    def sessions(self) -> list[SessionInfo]:
        """Every session (without its subscriptions), in no particular order."""
        ...

    def session(self, client_id: str) -> SessionInfo | None:
        """One session with its subscriptions, or None."""
        ...

    def delete_session(self, client_id: str) -> bool:
        """End a session, disconnecting its client first; False when there is none."""
        ...
