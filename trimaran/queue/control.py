"""Settling a delivery by its message id (``<queue>:<offset>``): MQTT's control topics
(``$queue/<q>/$ack``, ``$nack``, ``$reject``, ``$commit``) and whoever holds only the id.

Above the manager: it finds the queue and the group through it.
"""

from __future__ import annotations

from trimaran.queue.groups import HELD, Group, QueueState
from trimaran.queue.handles import ConsumerHandle
from trimaran.queue.journal import Receipt
from trimaran.queue.manager import QueueManager
from trimaran.queue.outcomes import ACK, Commit, DeadLetter, Outcome, Retry
from trimaran.queue.policy import DEFAULT_GROUP, QueueError
from trimaran.vhosts import split_key

__all__ = [
    "ack_by_id",
    "commit_by_id",
    "holder_by_id",
    "nack_by_id",
    "parse_message_id",
    "reject_by_id",
    "settle_by_id",
    "settle_by_id_now",
]


def parse_message_id(text: str) -> tuple[str, int]:
    queue, sep, offset = text.rpartition(":")
    if not sep or not queue or not offset.isdigit():
        raise QueueError("bad-message-id", f"{text!r} is not <queue>:<offset>")
    return queue, int(offset)


def locate(manager: QueueManager, message_id_text: str, group: str | None) -> tuple[QueueState, Group, int]:
    queue, offset = parse_message_id(message_id_text)
    state = manager.get(queue)
    grp = state.groups.get(group or DEFAULT_GROUP)
    if grp is None:
        raise QueueError("no-group", f"queue {split_key(queue)[1]} has no group {group or DEFAULT_GROUP}")
    return state, grp, offset


async def settle_by_id(
    manager: QueueManager,
    outcome: Outcome,
    message_id_text: str,
    group: str | None = None,
    consumer_id: str | None = None,
) -> bool:
    """Settle by message id and wait for the commit. ``consumer_id`` restricts to its holder."""
    state, grp, offset = locate(manager, message_id_text, group)
    return await manager._settle(state, grp, offset, outcome, consumer_id=consumer_id)


async def ack_by_id(
    manager: QueueManager, message_id_text: str, group: str | None = None, consumer_id: str | None = None
) -> bool:
    """``$queue/<q>/$ack`` with the message id as payload. ``consumer_id`` restricts to its holder."""
    return await settle_by_id(manager, ACK, message_id_text, group, consumer_id)


async def nack_by_id(
    manager: QueueManager,
    message_id_text: str,
    group: str | None = None,
    consumer_id: str | None = None,
    delay_s: float | None = None,
) -> bool:
    return await settle_by_id(manager, Retry(delay_s), message_id_text, group, consumer_id)


async def reject_by_id(
    manager: QueueManager,
    message_id_text: str,
    group: str | None = None,
    consumer_id: str | None = None,
    reason: str = "rejected",
) -> bool:
    return await settle_by_id(manager, DeadLetter(reason), message_id_text, group, consumer_id)


async def commit_by_id(
    manager: QueueManager, message_id_text: str, group: str | None = None, consumer_id: str | None = None
) -> bool:
    _queue, offset = parse_message_id(message_id_text)
    return await settle_by_id(manager, Commit(offset), message_id_text, group, consumer_id)


def holder_by_id(
    manager: QueueManager, message_id_text: str, group: str | None = None
) -> ConsumerHandle | None:
    """The consumer that holds a work-queue delivery right now (None: nobody, or a stream)."""
    _state, grp, offset = locate(manager, message_id_text, group)
    entry = grp.entries.get(offset)
    if entry is None or entry.state != HELD or not isinstance(entry.holder, ConsumerHandle):
        return None
    return entry.holder


def settle_by_id_now(
    manager: QueueManager, outcome: Outcome, message_id_text: str, group: str | None = None
) -> tuple[bool, Receipt | None]:
    """Settle by message id, applied in memory at once (no await).

    For front ends that must apply control messages in the order they read them, relative to the
    protocol's own acks; await the returned receipt (when not None) for the commit.
    """
    state, grp, offset = locate(manager, message_id_text, group)
    return manager._settle_now(state, grp, offset, outcome, None, None, True)
