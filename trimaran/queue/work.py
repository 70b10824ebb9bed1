"""Work-mode consumer groups: competing consumers, each message done once per group.

A :class:`WorkGroup` hands out messages past its cursor (and the ones waiting to come back), records
each delivery as a held pending entry with a visibility time-out, and settles it with a typed outcome
(:mod:`trimaran.queue.outcomes`):

- :class:`~trimaran.queue.outcomes.Ack`: done. Below the cursor the entry goes; at or past it the
  entry stays as ``done`` until the cursor passes (acks out of order). A message every group is done
  with leaves the queue at once, its ``done`` markers with it.
- :class:`~trimaran.queue.outcomes.Retry`: a failed attempt comes back after the consumer's delay or
  the queue's backoff, or is dead-lettered once ``max_attempts`` failed attempts are reached
  (:func:`~trimaran.queue.policy.retry_after_ms`); an unprocessed or unsent one comes back at once.
- :class:`~trimaran.queue.outcomes.DeadLetter`: done here, and its letter goes to the dead-letter
  queue (``Host.dead_letter``).

A held delivery nobody settles comes back at its visibility time-out (or when its consumer goes), as
a failed attempt. Every change goes to the journal in the caller's :class:`Changes`; nothing here
waits, writes or imports the manager. In shared mode (``shared=True``) the group holds only what this
node claimed: what it is done with, or hands back, is forgotten here and claimed again from the
database by whichever node is free.
"""

from __future__ import annotations

import bisect
import heapq
from collections import deque
from collections.abc import Callable, Container, Iterable

from trimaran.broker.events import QUEUE_ACKED, QUEUE_NACKED, QUEUE_REJECTED
from trimaran.broker.message import Message
from trimaran.queue.changes import Changes
from trimaran.queue.groups import (
    DONE,
    HELD,
    WAIT,
    Entry,
    Group,
    QueueDelivery,
    QueueState,
    Selects,
    StoredMessage,
    Taker,
    expired,
)
from trimaran.queue.outcomes import Ack, Commit, DeadLetter, Outcome, Retry
from trimaran.queue.policy import exhausted, filter_matches, retry_after_ms
from trimaran.queue.ports import Host
from trimaran.storage.rows import Claimed

SCAN_LIMIT = 10_000  # most messages a filtered consumer scans per take
NO_BARRIER = 2**63 - 1  # no publish of this node left unclaimed: everything claimed goes out
LEFT_MAX = 4096  # of a group's unclaimed publishes, how many it tracks one by one (WorkGroup.left)


class WorkGroup(Group):
    mode = "work"

    def __init__(
        self,
        state: QueueState,
        name: str,
        host: Host,
        *,
        cursor: int = 0,
        committed: int = 0,
        shared: bool = False,
    ) -> None:
        super().__init__(state, name, cursor=cursor, committed=committed)
        self.host = host
        self.journal = host.journal
        self.shared = shared
        # Shared: the highest token of an entry this node forgot (handed back, finished). One claimed
        # again starts past it, so the time-out of an earlier delivery never matches a later one.
        self.forgotten_token = 0
        # Shared: the queue's one group on every node (``Claims``, at each claim). Its acks delete
        # the message and its row at once instead of leaving a 'done' marker for the compaction.
        self.alone = False
        # Shared: its row is in queue_groups (its first claim landed), so it claims at publish and
        # the compaction counts it.
        self.in_database = False
        # Shared: messages this node made claimable again (make_available), and their count when
        # the last claim found less than it asked for (None: it did not). While the two are equal
        # the group claims only at the poll: each claim walks past what is held or finished here.
        self.handed_back = 0
        self.dry_at: int | None = None
        # Shared: this node's publishes that went to the database unclaimed and that no claim is
        # known to have taken yet, oldest first (``left``, up to ``LEFT_MAX``; past it, the first
        # and last of the rest, ``left_beyond``: a consumer that takes nothing while publishes
        # flow would grow it with the backlog), and those of them not committed yet. What this
        # node holds past the oldest (claimed as it was published, or by a claim) is not handed
        # out before a claim has taken it (``barrier``): it would overtake it.
        self.left: deque[int] = deque()
        self.left_beyond: tuple[int, int] | None = None
        self.left_inflight: set[int] = set()
        self.barrier = NO_BARRIER
        # Shared: the last new message the group's last full claim took (below this node's
        # unclaimed publishes then uncommitted): the next claim of new messages starts past it
        # instead of walking again what is held or acked (-1: from the start; each poll resets it).
        self.claim_after = -1
        # Shared: from which offset every publish of this node was claimed as it was published or
        # left unclaimed in ``left`` for this group (None: not so, or no publish yet; Claims.track).
        self.tracked_from: int | None = None
        # Shared: how many its next claim asks for at least, past a batch (Claims: while claims
        # come back full; 0: a batch).
        self.claim_size = 0
        # Shared: deliveries since the last poll, and how many it hands out in ``HOLD_MS`` at the
        # pace of the last poll's interval (Claims.tick): how far it claims ahead at publish.
        self.handed = 0
        self.pace = 0

    # -- taking -----------------------------------------------------------------------------------

    def take(
        self, routing_filter: str | None, now: int, ch: Changes, selects: Selects | None = None
    ) -> tuple[StoredMessage, Entry | None] | None:
        """The next message for a consumer with ``routing_filter`` (and ``selects``, its message
        selector): one waiting to come back first, then the oldest past the cursor. Expired
        messages met on the way are expired; the ones passed over stay for other consumers."""
        state = self.state
        messages = state.messages
        ready = self.ready
        barrier = self.barrier
        i = 0  # walked in place: a copy per take cost O(ready), up to a claim batch, per message
        while i < len(ready):
            offset = ready[i]
            if offset > barrier:
                break  # shared: past a publish of this node that no claim has taken yet
            stored = messages.get(offset)
            if stored is None:
                del ready[i]
                gone = self.entries.pop(offset, None)
                if gone is not None:
                    self.journal.pending_gone(ch, state, self, offset, gone)
                continue
            if expired(stored, now):
                self.host.expire(state, offset, now, ch)
                if i < len(ready) and ready[i] == offset:
                    i += 1  # still ready (expiry left it): passed over, as before
                continue
            if (routing_filter is not None and not filter_matches(routing_filter, stored.routing_key)) or (
                selects is not None and not selects(stored.message)
            ):
                i += 1
                continue
            del ready[i]
            return stored, self.entries.get(offset)
        if self.shared:
            return None  # only claimed messages
        offset = self.cursor
        high = state.high
        entries = self.entries
        scanned = 0
        while offset < high:
            stored = messages.get(offset)
            if stored is None or offset in entries:
                if offset == self.cursor:
                    self.advance(offset + 1, ch)
                    offset = self.cursor  # past the run of 'done' markers it retired, too
                else:
                    offset += 1
                continue
            expires_at = stored.expires_at  # groups.expired, inline: asked of every message taken
            if expires_at is not None and now >= expires_at:
                self.host.expire(state, offset, now, ch)
                continue
            if (routing_filter is None or filter_matches(routing_filter, stored.routing_key)) and (
                selects is None or selects(stored.message)
            ):
                if offset == self.cursor:  # advance, inline for the usual step: no entry to retire
                    self.cursor = offset + 1
                    if offset + 1 in entries:
                        self.advance(offset + 1, ch)
                    else:
                        self.journal.cursor(ch, state, self)
                return stored, None
            offset += 1
            scanned += 1
            if scanned >= SCAN_LIMIT:
                break
        return None

    def advance(self, to: int, ch: Changes) -> None:
        """Move the cursor, retiring 'done' entries it passes and the run of them right after it;
        the group row gets the final cursor (a row short of it would, after a restart, deliver again
        what was acked out of order)."""
        old = self.cursor
        self.cursor = to
        entries = self.entries
        # Only offsets with an entry can be retired: asked first, a taken message's step costs no call.
        for offset in range(old, to):
            if offset in entries:
                self._retire(offset, ch)
        high = self.state.high
        while self.cursor < high and (entry := entries.get(self.cursor)) is not None and entry.state == DONE:
            self.cursor += 1
            self._retire(self.cursor - 1, ch)
        self.journal.cursor(ch, self.state, self)

    def _retire(self, offset: int, ch: Changes) -> None:
        """Drop the 'done' entry of ``offset``, which the cursor has passed, and the message if every
        group is done with it. The cursor moves first: at or past it, only an entry says done, and
        the one that did is gone."""
        entry = self.entries.get(offset)
        if entry is None or entry.state != DONE:
            return
        del self.entries[offset]
        self.journal.pending_gone(ch, self.state, self, offset, entry)
        self.drop_if_finished(offset, ch)

    def deliver(
        self, handle: Taker, stored: StoredMessage, entry: Entry | None, now: int, ch: Changes
    ) -> QueueDelivery:
        """Record a delivery (held until settled, or done at once for an auto-ack consumer); the
        caller hands it to the consumer."""
        state = self.state
        journal = self.journal
        offset = stored.offset
        attempt = entry.attempts + 1 if entry is not None else 1
        cid = handle.consumer.id
        stats = state.stats
        stats["delivered"] += 1
        self.handed += 1
        if attempt > 1:
            stats["redelivered"] += 1
        journal.event(ch, state, now, "delivered", group=self, offset=offset, consumer=cid, attempt=attempt,
                      reason=entry.reason if entry is not None else "first")  # fmt: skip
        if handle.auto_ack:
            stats["acked"] += 1
            if self.shared:
                # A 'done' marker, as a shared node's ack writes (finish): its cursor and its groups
                # see only this node's claims, so neither may say the message is finished.
                done = self.entries[offset] = Entry(DONE, attempts=attempt)
                self.finish(offset, done, ch)
            elif offset >= self.cursor:
                done = self.entries[offset] = Entry(DONE, attempts=attempt)
                journal.pending(ch, state, self, offset, done)
            elif entry is not None:
                del self.entries[offset]
                journal.pending_gone(ch, state, self, offset, entry)
            journal.event(ch, state, now, "acked", group=self, offset=offset, consumer=cid, attempt=attempt,
                          reason="auto")  # fmt: skip
            if not self.shared:
                self.drop_if_finished(offset, ch)
        else:
            first = entry is None
            if entry is None:
                entry = Entry(HELD)
            entry.state = HELD
            entry.attempts = attempt
            entry.holder = handle
            entry.consumer_id = cid
            entry.delivered_at = now
            entry.available_at = None
            entry.token += 1
            self.entries[offset] = entry
            deadline = now + int(state.policy.visibility_timeout_s * 1000)
            timeouts = self.timeouts
            timeouts.push(deadline, offset, entry.token)
            if len(timeouts.fifo) + len(timeouts.heap) > 2 * len(self.entries) + 1024:  # mostly settled
                timeouts.compact(self.entries)
            host = self.host
            if not self.timed or deadline < host.wake_at:
                host.due(state, self, deadline)
            if first and offset < self.cursor and not self.shared and len(state.groups) == 1:
                # No row (the group alone, the cursor past it): the 'delivered' event says as much,
                # and the load reads a message below the cursor with no row as this (manager._load,
                # held_at_start). One taken ahead of the cursor (a selector, a filter) needs its
                # row: at the load it would pass for never delivered.
                entry.stored = False
            elif not (self.shared and attempt == 1):
                # Shared: a first delivery's row is the claim's, held here under a lease: a node
                # that dies leaves it to a claim that counts the delivery it may have made
                # (queue_store._again), so the delivery writes nothing more.
                journal.pending(ch, state, self, offset, entry)
        handle.credit -= 1
        unsent = entry.unsent if entry is not None else 0
        returned = entry.returned if entry is not None else 0
        return QueueDelivery(
            stored.message,
            state.name,
            offset,
            self.name,
            attempt,
            # maybe_seen_below: sent by a process that died before recording it (manager._mark_running)
            attempt - unsent > 1 or offset < state.maybe_seen_below,
            attempt - 1 - unsent - returned,
        )

    # -- settling ---------------------------------------------------------------------------------

    def settle(
        self,
        offset: int,
        outcome: Outcome,
        holder: Taker | None,
        consumer_id: str | None,
        now: int,
        ch: Changes,
    ) -> bool:
        """Settle the held delivery of ``offset`` (``holder`` / ``consumer_id``: only if it holds it).
        False: nothing of theirs to settle. A :class:`Commit` settles the delivery at its offset."""
        if outcome.__class__ is Commit:
            offset = outcome.offset
        entry = self.entries.get(offset)
        if entry is None or entry.state != HELD:
            return False
        if holder is not None and entry.holder is not holder:
            return False
        if consumer_id is not None and entry.consumer_id != consumer_id:
            return False
        state = self.state
        journal = self.journal
        events = self.host.events
        cid = entry.consumer_id
        match outcome:
            case Ack() | Commit():
                self._acked(offset, entry, now, ch)
            case Retry(failed=True, delay_s=delay_s):
                state.stats["nacked"] += 1
                if events.wants(QUEUE_NACKED):
                    events.queue(QUEUE_NACKED, state.name, group=self.name, offset=offset, consumer=cid,
                                 attempt=entry.attempts, reason=None)  # fmt: skip
                delay_ms = retry_after_ms(state.policy, entry.failed(), delay_s)
                if delay_ms is None:
                    journal.event(ch, state, now, "nacked", group=self, offset=offset, consumer=cid,
                                  attempt=entry.attempts, reason="max_attempts")  # fmt: skip
                    self.dead_letter(offset, entry, "max_attempts", now, ch)
                else:
                    self.make_available(offset, entry, "nack", now + delay_ms, now, ch)
                    journal.event(ch, state, now, "nacked", group=self, offset=offset, consumer=cid,
                                  attempt=entry.attempts, reason=f"delay_ms={delay_ms}")  # fmt: skip
            case Retry(sent=sent):
                # The journal shows the delivery and its release and numbers the next one on, but it
                # is not a failed attempt: unsent is not flagged redelivered either; returned
                # (handed back unprocessed, AMQP 1.0 released) leaves the delivery-count.
                reason = "released" if sent else "unsent"
                self.released_event(offset, entry, reason, now, ch)
                if sent:
                    entry.returned += 1
                else:
                    entry.unsent += 1
                self.make_available(offset, entry, reason, now, now, ch)
            case DeadLetter(reason=reason):
                state.stats["rejected"] += 1
                if events.wants(QUEUE_REJECTED):
                    events.queue(QUEUE_REJECTED, state.name, group=self.name, offset=offset, consumer=cid,
                                 attempt=entry.attempts, reason=reason)  # fmt: skip
                journal.event(ch, state, now, "rejected", group=self, offset=offset, consumer=cid,
                              attempt=entry.attempts, reason=reason)  # fmt: skip
                self.dead_letter(offset, entry, reason, now, ch)
        return True

    def settle_all(
        self,
        offsets: Iterable[int],
        outcome: Outcome,
        holder: Taker | None,
        consumer_id: str | None,
        now: int,
        ch: Changes,
    ) -> int:
        """:meth:`settle` for each offset, an ack by its holder (basic.ack with ``multiple``, a
        read's PUBACKs: the usual case) in one loop, without the outcome's match per offset."""
        if outcome.__class__ is not Ack or holder is None or consumer_id is not None:
            return super().settle_all(offsets, outcome, holder, consumer_id, now, ch)
        entries = self.entries
        acked = self._acked
        n = 0
        for offset in offsets:
            entry = entries.get(offset)
            if entry is not None and entry.state == HELD and entry.holder is holder:
                acked(offset, entry, now, ch)
                n += 1
        return n

    def _acked(self, offset: int, entry: Entry, now: int, ch: Changes) -> None:
        """What an ack of a held delivery records: counted, told to the bus, finished, journaled."""
        state = self.state
        state.stats["acked"] += 1
        events = self.host.events
        if events.wants(QUEUE_ACKED):
            events.queue(QUEUE_ACKED, state.name, group=self.name, offset=offset, consumer=entry.consumer_id,
                         attempt=entry.attempts, reason=None)  # fmt: skip
        self.finish(offset, entry, ch)
        self.journal.event(ch, state, now, "acked", group=self, offset=offset, consumer=entry.consumer_id,
                           attempt=entry.attempts)  # fmt: skip

    def finish(self, offset: int, entry: Entry, ch: Changes) -> None:
        """The group is done with ``offset`` (acked or dead-lettered)."""
        state = self.state
        if self.shared:  # a 'done' marker; the compaction deletes finished messages
            entry.state = DONE
            entry.holder = None
            if self.alone and len(state.groups) == 1:
                # No group anywhere else at the last claim: the message and its row go now, unless
                # the commit finds that a node made another group since (Journal.finished_alone),
                # which then writes a 'done' row. A claim made as it was published has no row.
                self.journal.pending_gone(ch, state, self, offset, entry)
                self.journal.finished_alone(ch, state, self, offset)
                self._forget(offset, entry)
                return
            self.journal.pending(ch, state, self, offset, entry)
            self._forget(offset, entry)
            return
        if offset >= self.cursor:
            # A 'done' marker, written only if it outlives the message: when this group is the
            # last to finish, drop_if_finished takes the message and the entry's row at once.
            entry.state = DONE
            entry.holder = None
            self.drop_if_finished(offset, ch)
            if offset in self.entries:
                self.journal.pending(ch, state, self, offset, entry)
        else:
            del self.entries[offset]
            self.journal.pending_gone(ch, state, self, offset, entry)
            self.drop_if_finished(offset, ch)

    def store_held(self, ch: Changes) -> None:
        """Rows for the held first deliveries written without one, now that the queue is no longer
        this group's alone. Shared: none needed, what a node claimed is held by the claim's row or
        span whatever the groups."""
        if self.shared:
            return
        for offset, entry in self.entries.items():
            if not entry.stored:
                self.journal.pending(ch, self.state, self, offset, entry)

    def held_at_start(self, now: int) -> list[tuple[int, Entry]]:
        """At load, the group alone: messages below the cursor with no entry were held by the last
        process (first deliveries keep no row). They wait to be delivered again, as held rows do."""
        restarted = []
        for offset in self.state.messages:
            if offset >= self.cursor:
                break
            if offset not in self.entries:
                entry = Entry(WAIT, attempts=1, reason="restart", available_at=now)
                self.entries[offset] = entry
                self.make_ready(offset)
                restarted.append((offset, entry))
        return restarted

    def make_available(self, offset: int, entry: Entry, reason: str, at: int, now: int, ch: Changes) -> None:
        """Waiting to be delivered again at ``at`` (now, or after a retry delay)."""
        state = self.state
        entry.state = WAIT
        entry.holder = None
        entry.reason = reason
        entry.available_at = at
        entry.token += 1
        if self.shared:  # released to every node: claimed again when available
            self.journal.pending(ch, state, self, offset, entry)
            self._forget(offset, entry)
            self.handed_back += 1
            return
        if at <= now:
            self.make_ready(offset)
        else:
            heapq.heappush(self.delayed, (at, offset, entry.token))
            if not self.timed or at < self.host.wake_at:
                self.host.due(state, self, at)
        self.journal.pending(ch, state, self, offset, entry)

    def claimed(self, offset: int, got: Claimed) -> None:
        """Shared: ``offset`` claimed for this group by this node, ready to hand out."""
        self.entries[offset] = Entry(
            WAIT,
            attempts=got.attempts,
            unsent=got.unsent,
            returned=got.returned,
            reason=got.reason,
            token=self.forgotten_token,
            stored=got.stored,
        )
        self.make_ready(offset)

    def left_unclaimed(self, offset: int) -> None:
        """Shared: a publish of this node goes to the database unclaimed, past those left before."""
        left = self.left
        if self.left_beyond is not None:
            self.left_beyond = (self.left_beyond[0], offset)
        elif len(left) >= LEFT_MAX:
            self.left_beyond = (offset, offset)
        else:
            if not left:
                self.barrier = offset
            left.append(offset)
        self.left_inflight.add(offset)
        self.dry_at = None  # claim it

    @property
    def holding_back(self) -> bool:
        """Shared: a publish of this node left unclaimed holds back what was claimed past it."""
        return self.barrier != NO_BARRIER

    def last_left(self) -> int:
        """Shared: the newest publish of this node left unclaimed and not known taken (-1: none)."""
        if self.left_beyond is not None:
            return self.left_beyond[1]
        return self.left[-1] if self.left else -1

    def ready_now(self) -> int:
        """Shared: how many claimed messages it could hand out now (not held back by ``barrier``)."""
        ready = self.ready
        return bisect.bisect_right(ready, self.barrier) if self.holding_back else len(ready)

    def passed(self, upto: int, taken: Container[int]) -> bool:
        """Shared: a claim has taken (here, or another node's claim had it locked) this node's
        unclaimed publishes up to ``upto``, and ``taken``: what waited behind them may go out.
        True when the barrier moved."""
        left = self.left
        before = self.barrier
        while left and (left[0] <= upto or left[0] in taken):
            left.popleft()
        beyond = self.left_beyond
        if beyond is not None and not left:
            # Not tracked one by one: the range goes once a claim has seen past its last, and
            # until then its first not known taken is no later than just past ``upto``.
            first, last = beyond
            self.left_beyond = None if last <= upto else (max(first, upto + 1), last)
        if left:
            self.barrier = left[0]
        else:
            self.barrier = self.left_beyond[0] if self.left_beyond is not None else NO_BARRIER
        return self.barrier != before

    def _forget(self, offset: int, entry: Entry) -> None:
        """Shared: the database holds ``offset``'s state now, not this node."""
        if entry.token > self.forgotten_token:
            self.forgotten_token = entry.token
        del self.entries[offset]
        self.unready(offset)
        self.state.forget(offset)

    def dead_letter(self, offset: int, entry: Entry, reason: str, now: int, ch: Changes) -> None:
        """Done here; the letter goes wherever the queue's policy sends it."""
        state = self.state
        stored = state.messages.get(offset)
        self.finish(offset, entry, ch)
        if stored is None:
            return
        state.stats["dead_lettered"] += 1
        self.host.dead_letter(state, self, stored, entry.attempts, reason, now, ch)

    def release(self, offset: int, entry: Entry, reason: str, now: int, ch: Changes) -> None:
        """A held delivery came back unsettled (time-out, disconnect): a failed attempt, offered
        again at once or dead-lettered once attempts are exhausted."""
        self.released_event(offset, entry, reason, now, ch)
        if exhausted(self.state.policy, entry.failed()):
            self.dead_letter(offset, entry, "max_attempts", now, ch)
        else:
            self.make_available(offset, entry, reason, now, now, ch)

    def released_event(self, offset: int, entry: Entry, reason: str, now: int, ch: Changes) -> None:
        """A held delivery came back without a settlement (timeout, disconnect, restart): the cause
        of the redelivery or dead-lettering that follows, for the audit."""
        self.journal.event(ch, self.state, now, "released", group=self, offset=offset,
                           consumer=entry.consumer_id, attempt=entry.attempts, reason=reason)  # fmt: skip

    def hand_back_claimed(
        self, now: int, ch: Changes, keep: Callable[[str, Message], bool] | None = None
    ) -> None:
        """Shared mode: what this node claimed ahead and has not handed out goes back to every node,
        but what ``keep`` says (by routing key and message) a consumer here still takes."""
        messages = self.state.messages
        for offset in list(self.ready):
            entry = self.entries.get(offset)
            if entry is None or entry.state != WAIT:
                continue
            stored = messages.get(offset)
            if keep is not None and stored is not None and keep(stored.routing_key, stored.message):
                continue
            self.make_available(offset, entry, entry.reason or "first", now, now, ch)

    def cancel(self, handle: Taker, now: int, ch: Changes) -> None:
        """``handle`` is gone: what it held comes back (or dies, attempts exhausted)."""
        for offset, entry in list(self.entries.items()):
            if entry.state == HELD and entry.holder is handle:
                self.release(offset, entry, "disconnect", now, ch)

    # -- timers -----------------------------------------------------------------------------------

    def _holds(self, offset: int, token: int) -> bool:
        """A time-out item still stands for a held delivery."""
        entry = self.entries.get(offset)
        return entry is not None and entry.state == HELD and entry.token == token

    def run_due(self, now: int, ch: Changes) -> bool:
        """Visibility time-outs and retry delays up to ``now``; True when something came back."""
        changed = False
        entries = self.entries
        for offset, token in self.timeouts.pop_due(now):
            if self._holds(offset, token):  # else settled or delivered again since
                self.release(offset, entries[offset], "timeout", now, ch)
                changed = True
        delayed = self.delayed
        while delayed and delayed[0][0] <= now:
            _, offset, token = heapq.heappop(delayed)
            entry = entries.get(offset)
            if entry is None or entry.state != WAIT or (token and entry.token != token):
                continue
            self.make_ready(offset)
            changed = True
        return changed

    def drop_if_finished(self, offset: int, ch: Changes) -> None:
        """Drop a message every group of the queue has finished, at once, wherever the cursors
        stand: a message acked ahead of a cursor is not left for a browser or a restart. Its
        'done' markers go with it (a cursor skips a missing message as it skips a marker)."""
        state = self.state
        if offset not in state.messages:
            return
        groups = state.groups.values()
        for group in groups:
            if not group.is_done(offset):
                return
        state.remove(offset)
        self.journal.removed(ch, state, offset)
        for group in groups:
            entry = group.entries.pop(offset, None)
            if entry is not None:
                self.journal.pending_gone(ch, state, group, offset, entry)
