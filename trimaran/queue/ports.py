"""What the rooms below the queue manager see of it: small protocols, so that ``work.py``,
``stream.py``, ``letters.py`` and ``admin.py`` never import ``manager.py`` above them (imports go
down only). :class:`~trimaran.queue.manager.QueueManager` implements them; the AMQP 0.9.1 front
end implements :class:`DeadLetterRouter`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from trimaran.broker.events import EventBus
    from trimaran.broker.message import Message
    from trimaran.config import QueuePolicySettings
    from trimaran.queue.changes import Changes
    from trimaran.queue.groups import Group, QueueState, StoredMessage
    from trimaran.queue.journal import Journal


class Host(Protocol):
    """What a group asks of the queue manager around it, without importing it: the journal, the
    event bus, and what reaches past one group (removing a message from every group, dead letters
    into other queues, the timers)."""

    journal: Journal
    events: EventBus
    wake_at: int  # when the timers wake next (epoch ms): an earlier due time must call ``due``

    def remove(self, state: QueueState, offset: int, kind: str, reason: str, now: int, ch: Changes) -> None:
        """Remove a message from the queue and every group (expired, dropped): one event."""

    def expire(self, state: QueueState, offset: int, now: int, ch: Changes) -> None:
        """A message's time is up: removed, and dead-lettered where the policy says so."""

    def dead_letter(
        self,
        state: QueueState,
        group: Group,
        stored: StoredMessage,
        attempts: int,
        reason: str,
        now: int,
        ch: Changes,
    ) -> None:
        """Route the dead letter of ``stored`` (the group is done with it already)."""

    def due(self, state: QueueState, group: Group, at: int) -> None:
        """``group`` has a timer due at ``at`` (epoch ms): a visibility time-out or a retry."""


class DeadLetterRouter(Protocol):
    """Routes the dead letters of queues with a ``dead_letter_exchange`` (the AMQP 0.9.1 front end
    implements it with its exchanges)."""

    def dead_letter_queues(self, exchange: str, routing_key: str, message: Message) -> list[str]:
        """The queues ``message`` reaches when published to ``exchange`` with ``routing_key`` now."""
        ...


class Queues(Protocol):
    """The manager as ``letters.py`` (dead letters land in other queues) and ``admin.py`` (purge,
    peek, redrive, info) see it: its queues, journal and bus, and how a message becomes
    deliverable."""

    queues: dict[str, QueueState]
    journal: Journal
    events: EventBus
    dead_letter_router: DeadLetterRouter | None

    def get(self, name: str) -> QueueState: ...

    def declare_now(
        self, name: str, policy: QueuePolicySettings | None, durable: bool, ch: Changes | None
    ) -> QueueState: ...

    def is_shared(self, state: QueueState) -> bool: ...

    def shared_offsets(self, state: QueueState) -> bool: ...

    def appended(self, state: QueueState, stored: StoredMessage) -> None: ...

    def remove(
        self, state: QueueState, offset: int, kind: str, reason: str, now: int, ch: Changes
    ) -> None: ...
