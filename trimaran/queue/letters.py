"""Where messages leave a queue other than by being done: expiry, drops, and dead letters.

A dead letter goes, with its history (``x-dead-letter-*`` user properties, ``dead_letter_history``
and RabbitMQ's x-death in ``extra``), to the queue's dead-letter queue (``$dlq/<queue>`` by default),
or through its dead-letter exchange (AMQP 0.9.1's ``x-dead-letter-exchange``) to whatever that
exchange routes it to now. The letter is appended to its target in the same commit as the change
that killed it, and becomes deliverable once that commit is in.
"""

from __future__ import annotations

import logging
from functools import partial
from typing import TYPE_CHECKING

from trimaran.broker.events import QUEUE_DEAD_LETTERED, QUEUE_EXPIRED, EventBus
from trimaran.broker.message import Message
from trimaran.queue.changes import Changes
from trimaran.queue.groups import Group, QueueState, StoredMessage
from trimaran.queue.policy import (
    DEATH_MAXLEN,
    DLQ_PROPERTIES,
    dead_letter_target,
    death_kind,
    expiry_ms,
    with_death,
)
from trimaran.storage import queue_store, rows
from trimaran.vhosts import describe, split_key

if TYPE_CHECKING:
    from trimaran.queue.ports import Queues

log = logging.getLogger(__name__)


class Letters:
    """Removal, expiry and dead-lettering for every queue of one manager."""

    def __init__(self, manager: Queues) -> None:
        self.manager = manager
        self.journal = manager.journal

    @property
    def events(self) -> EventBus:
        return self.manager.events  # the app may hand the manager its bus after construction

    def remove(self, state: QueueState, offset: int, kind: str, reason: str, now: int, ch: Changes) -> None:
        """Remove a message from the queue and every group (expired, dropped): one event."""
        if state.remove(offset) is None:
            return
        journal = self.journal
        for group in state.groups.values():
            entry = group.entries.pop(offset, None)
            if entry is not None:
                group.unready(offset)
                journal.pending_gone(ch, state, group, offset, entry)
        if kind == "expired":
            state.stats["expired"] += 1
            log.info("%s: message %d expired", describe(state.name), offset)
            if self.events.wants(QUEUE_EXPIRED):
                self.events.queue(QUEUE_EXPIRED, state.name, offset=offset, reason=reason)
        journal.removed(ch, state, offset)
        journal.event(ch, state, now, kind, offset=offset, reason=reason)

    def expire(self, state: QueueState, offset: int, now: int, ch: Changes) -> None:
        """A message's time is up: removed, and dead-lettered (reason ``expired``) when the queue
        routes its dead letters through an exchange, as RabbitMQ does with x-dead-letter-exchange."""
        stored = state.messages.get(offset)
        targets = (
            self.targets(state, stored, "expired")
            if stored is not None and state.policy.dead_letter_exchange is not None
            else []
        )
        where = ",".join(t for t, _ in targets)
        self.remove(state, offset, "expired", f"ttl -> {where}" if targets else "ttl", now, ch)
        if stored is not None and targets:
            state.stats["dead_lettered"] += 1
            self.letter(state, None, stored, 0, "expired", targets, now, ch)

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
        """A group is done with ``stored`` (rejected, or out of attempts): its letter goes out, or a
        ``dropped`` event says why it could not."""
        targets = self.targets(state, stored, reason)
        offset = stored.offset
        if self.events.wants(QUEUE_DEAD_LETTERED):
            self.events.queue(QUEUE_DEAD_LETTERED, state.name, group=group.name, offset=offset,
                              attempt=attempts, reason=reason,
                              dead_letter_queue=targets[0][0] if targets else None)  # fmt: skip
        if not targets:
            self.journal.event(ch, state, now, "dropped", group=group, offset=offset, attempt=attempts,
                               reason=f"no dead-letter queue: {reason}")  # fmt: skip
            return
        self.letter(state, group.name, stored, attempts, reason, targets, now, ch)

    def overflow(
        self, state: QueueState, stored: StoredMessage, now: int, ch: Changes, letters: Changes
    ) -> None:
        """The oldest message dropped for a new one (overflow ``drop-oldest``); with a dead-letter
        exchange it is dead-lettered (reason maxlen), the drop and its letter in ``letters``."""
        routed = state.policy.dead_letter_exchange is not None
        targets = self.targets(state, stored, DEATH_MAXLEN) if routed else []
        state.stats["dropped"] += 1
        if not targets:
            self.remove(state, stored.offset, "dropped", "overflow", now, ch)
            return
        where = ",".join(t for t, _ in targets)
        self.remove(state, stored.offset, "dropped", f"overflow -> {where}", now, letters)
        state.stats["dead_lettered"] += 1
        self.letter(state, None, stored, 0, DEATH_MAXLEN, targets, now, letters)

    def refused(self, state: QueueState, message: Message, now: int, ch: Changes) -> bool:
        """A publish refused by a full queue with overflow ``reject-dead-letter``: the message is
        dead-lettered (reason maxlen) through the queue's dead-letter exchange, as RabbitMQ's
        reject-publish-dlx does. False: it goes nowhere."""
        stored = StoredMessage(-1, message, "", now, None, len(message.payload))
        targets = self.targets(state, stored, DEATH_MAXLEN)
        if not targets:
            return False
        state.stats["dead_lettered"] += 1
        self.letter(state, None, stored, 0, DEATH_MAXLEN, targets, now, ch)
        return True

    def targets(self, state: QueueState, stored: StoredMessage, reason: str) -> list[tuple[str, Message]]:
        """Where a dead letter of ``state`` goes, each with the message as that queue gets it.

        A queue with a dead-letter exchange (AMQP 0.9.1) has it routed through that exchange now,
        with the message's headers and the dead-letter routing key (or its own); bindings made
        since the queue was declared count, and a fanout exchange reaches every bound queue.
        Otherwise the policy's dead-letter queue (by default ``$dlq/<queue>``; never the queue
        itself)."""
        policy = state.policy
        death = death_kind(reason)
        message = with_death(stored.message, state.name, death)
        exchange = policy.dead_letter_exchange
        if exchange is None:
            target = dead_letter_target(state.name, policy)
            if target is None or target == state.name:
                return []
            return [(target, message)]
        router = self.manager.dead_letter_router
        if router is None:
            return []
        extra = message.extra
        original = extra.get("routing_key")
        key = policy.dead_letter_routing_key
        if key is None:
            key = original if isinstance(original, str) else state.name
        extra["exchange"] = exchange
        extra["routing_key"] = key
        queues = router.dead_letter_queues(exchange, key, message)
        if death == "expired":
            # An expiry cycle with no rejection in it would go round for ever: RabbitMQ drops it.
            deaths = extra.get("deaths")
            previous = deaths[1:] if isinstance(deaths, list) else []
            looped = {d.get("queue") for d in previous if isinstance(d, dict) and d.get("reason") == death}
            queues = [q for q in queues if q != state.name and q not in looped]
        return [(q, message) for q in queues]

    def letter(
        self,
        state: QueueState,
        group: str | None,
        stored: StoredMessage,
        attempts: int,
        reason: str,
        targets: list[tuple[str, Message]],
        now: int,
        ch: Changes,
    ) -> None:
        """Append the dead letter of ``stored`` to each target queue (created if missing)."""
        manager = self.manager
        journal = self.journal
        offset = stored.offset
        original = stored.message
        history = {
            "queue": state.name,
            "topic": original.topic,
            "group": group,
            "offset": offset,
            "attempts": attempts,
            "reason": reason,
            "time": now,
        }
        props = [(k, v) for k, v in original.user_properties if k not in DLQ_PROPERTIES]
        props += [
            # As its clients name them: a dead letter stays in its vhost (trimaran/vhosts.py).
            ("x-dead-letter-queue", split_key(state.name)[1]),
            ("x-dead-letter-topic", split_key(original.topic)[1]),
            ("x-dead-letter-group", group or ""),
            ("x-dead-letter-attempts", str(attempts)),
            ("x-dead-letter-reason", reason),
            ("x-dead-letter-time", str(now)),
        ]
        grp = state.groups.get(group) if group is not None else None
        where: list[str] = []
        for target, message in targets:
            extra = dict(message.extra)
            previous = extra.get("dead_letter_history")
            extra["dead_letter_history"] = [*(previous if isinstance(previous, list) else []), history]
            copy = message.copy_with(user_properties=props, extra=extra, expires_at_ms=None)
            dlq = manager.queues.get(target)
            if dlq is None:
                dlq = manager.declare_now(target, None, state.durable, ch)
            if manager.shared_offsets(dlq):
                row = rows.MessageRow(target, 0, copy, stored.routing_key, now, None).row()
                published = rows.event_row(
                    now,
                    target,
                    "published",
                    node=journal.node,
                    reason=f"dead_letter from {state.name}:{offset}",
                )
                ch.calls.append(queue_store.append_reserving(row, published))
                where.append(target)
                if manager.is_shared(dlq):  # wakes its consumers' claims
                    ch.then(partial(manager.appended, dlq, StoredMessage(-1, copy, "", now, None, 0)))
                continue
            d_offset = dlq.next_offset
            dlq.next_offset += 1
            d_stored = StoredMessage(
                d_offset, copy, stored.routing_key, now, expiry_ms(dlq.policy, now, None), stored.size
            )
            dlq.stats["published"] += 1
            where.append(f"{target}:{d_offset}")
            if dlq.durable:
                journal.appended(ch, dlq, d_stored)
                journal.event(ch, dlq, now, "published", offset=d_offset,
                              reason=f"dead_letter from {state.name}:{offset}")  # fmt: skip
            ch.then(partial(manager.appended, dlq, d_stored))
        if grp is not None:  # an expiry has its own event (expired), with no group
            journal.event(ch, state, now, "dead_lettered", group=grp, offset=offset, attempt=attempts,
                          reason=f"{reason} -> {','.join(where)}")  # fmt: skip
