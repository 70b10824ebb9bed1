"""The queue's journal: state changes become storage rows and ``queue_events``, committed together.

The rooms (``work.py``, ``stream.py``, ``letters.py``, ``shared.py``, the manager) never build rows
themselves: they tell a :class:`Journal` what changed (a delivery, a pending entry's new state, a
cursor, an append, a removal) into one :class:`Changes` and hand it in with :meth:`Journal.submit`.
What comes back is a :class:`Receipt`, the one "committed" future front ends wait on (or follow with
``then``); :func:`committed` waits and turns a failed write into :class:`QueueError` ("storage").

An in-memory queue writes nothing: every method skips a state that is not durable. The rows and
events are exactly those the audit (``analytics/``) replays; their kinds and reasons are documented
there. :class:`MemoryJournal` keeps the same rows in dicts and lists instead of a database, for tests
that drive the groups in-process.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

from trimaran.broker.message import now_ms
from trimaran.queue.changes import Changes
from trimaran.queue.groups import HELD, WAIT, Entry, Group, QueueState, StoredMessage, policy_dict
from trimaran.queue.policy import QueueError
from trimaran.storage import queue_store
from trimaran.storage.rows import HeldKey, MessageRow, WriteBatch, add_event, add_published
from trimaran.storage.writer import Receipt, WriterError

if TYPE_CHECKING:
    from trimaran.storage.writer import GroupCommitWriter

__all__ = ["Journal", "MemoryJournal", "Receipt", "StagedPublish", "Turn", "committed"]


#: A publish whose rows are in the turn's changes (:meth:`Journal.stage`): its queue, its message,
#: and what its publisher is told once they are committed (``done(result, error)``, the manager's
#: ``publish_nowait``). A tuple: one is made a message, and a class would cost its ``__init__``.
StagedPublish = tuple[QueueState, StoredMessage, "Callable[..., None] | None"]


@dataclass(slots=True)
class Turn:
    """This turn of the loop's publishes to early queues: their one change, the receipt each was
    handed (it becomes the change's own when it is submitted), and the publishes themselves."""

    changes: Changes
    ticket: Receipt
    publishes: list[StagedPublish] = field(default_factory=list)


async def committed(receipt: Receipt | None) -> None:
    """Wait for a submission's commit; a failed write is a :class:`QueueError` ("storage")."""
    if receipt is None:
        return
    if receipt.done:  # committed already (or committed in memory): nothing to wait for
        if receipt.error is not None:
            raise QueueError("storage", str(receipt.error))
        return
    try:
        await receipt.wait()
    except WriterError as exc:
        raise QueueError("storage", str(exc)) from exc


def _run_all(callbacks: list[Callable[[], None]]) -> Callable[[], None]:
    def run() -> None:
        for callback in callbacks:
            callback()

    return run


class Journal:
    """Rows and events for the group-commit writer. ``node`` is written on events and claims;
    ``shared`` (several nodes on one PostgreSQL) adds leases to held entries and leaves group rows
    to the claims."""

    def __init__(
        self, writer: GroupCommitWriter | None, node: str, *, shared: bool = False, lease_ms: int = 30_000
    ):
        self.writer = writer
        self.node = node
        self.shared = shared
        self.lease_ms = lease_ms
        #: On the loop after every commit (and after a submission with nothing to write): the
        #: manager delivers what the commit made deliverable, once per batch.
        self.idle: Callable[[], None] | None = None
        #: This turn's publishes to early queues (:meth:`stage`), submitted at the end of the turn
        #: (:meth:`send_turn`) and before anything else is handed to the writer, so that nothing
        #: submitted later overtakes them.
        self.turn: Turn | None = None
        #: On the loop once a turn's change is committed or failed (its ticket's ``error`` says
        #: which): the manager tells each publish. Called with the turn and the commit's results.
        self.turn_done: Callable[[Turn, list[Any]], None] | None = None
        # held_here's leases run from the start of a tenth of one (at most a second), so that the
        # publishes of a commit share a lease and their offsets make one span.
        self._held_step = max(1, min(1000, lease_ms // 10))

    # -- state changes ----------------------------------------------------------------------------

    def event(
        self,
        ch: WriteBatch,
        state: QueueState,
        now: int,
        kind: str,
        *,
        group: Group | None = None,
        offset: int | None = None,
        consumer: str | None = None,
        attempt: int | None = None,
        reason: str | None = None,
    ) -> None:
        """An audit row in ``queue_events`` for a durable queue (in-memory queues keep none). The
        next offset of the change's last event, alike in all else (a dispatch's deliveries, a
        multiple ack), widens that event's span instead (``schema.queue_events``)."""
        # An unwritten early message writes no row (QueueState.unwritten): a set lookup, no call.
        if state.durable and offset not in state.unwritten:
            add_event(
                ch.events, now, state.name, kind, None if group is None else group.name, offset, consumer,
                self.node, attempt, reason,
            )  # fmt: skip

    def pending(self, ch: WriteBatch, state: QueueState, group: Group, offset: int, entry: Entry) -> None:
        """A pending entry's new state (only the last state of a key in a commit is written)."""
        if offset in state.unwritten:
            return
        entry.stored = True
        if not state.durable:
            return
        held = entry.state == HELD
        ch.pending[(state.name, group.name, offset)] = {
            "queue": state.name,
            "group": group.name,
            "offset": offset,
            "state": entry.state,
            "consumer": entry.consumer_id if held else None,
            "node": self.node if entry.state != WAIT else None,
            "delivered_at": entry.delivered_at,
            "attempts": entry.attempts,
            "available_at": entry.available_at,
            "lease_until": now_ms() + self.lease_ms if self.shared and held else None,
            "reason": entry.reason if entry.state == WAIT else None,
            "unsent": entry.unsent,
            "returned": entry.returned,
        }

    def held_here(self, ch: WriteBatch, state: QueueState, group: Group, offset: int, at: int) -> None:
        """A message this shared node claims as it publishes it at ``at`` (epoch ms): held here under
        a lease from then, handed to no consumer yet, and no pending row (``schema.queue_spans``)."""
        key = (state.name, group.name, self.node, at - at % self._held_step + self.lease_ms)
        offsets = ch.held.get(key)
        if offsets is None:
            ch.held[key] = [offset]
        else:
            offsets.append(offset)

    def pending_gone(
        self, ch: WriteBatch, state: QueueState, group: Group, offset: int, entry: Entry
    ) -> None:
        """The entry's row goes (an in-memory queue has none, nor has an entry never stored)."""
        if state.durable and entry.stored:
            ch.pending[(state.name, group.name, offset)] = None

    def cursor(self, ch: WriteBatch, state: QueueState, group: Group) -> None:
        """A group's cursor or committed offset moved. Shared: claims make the row; cursors are unused."""
        if not state.durable or self.shared:
            return
        key = (state.name, group.name)
        row = ch.groups.get(key)
        if row is not None:  # a dispatch moves it once per delivery: one row per change
            row["cursor"] = group.cursor
            row["committed"] = group.committed
            return
        ch.groups[key] = {
            "queue": state.name,
            "group": group.name,
            "cursor": group.cursor,
            "committed": group.committed,
            "updated_at": now_ms(),
        }

    def appended(
        self, ch: WriteBatch, state: QueueState, stored: StoredMessage, *, next_offset: bool = True
    ) -> None:
        """A message's row (``next_offset``: the queue row's next offset moves past it; not for
        offsets reserved in blocks)."""
        if not state.durable:
            return
        name = state.name
        ch.messages.append(
            MessageRow(
                name,
                stored.offset,
                stored.message,
                stored.routing_key,
                stored.published_at,
                stored.expires_at,
            )
        )
        if next_offset:
            ch.queue_next[name] = stored.offset + 1

    def publish(
        self,
        ch: WriteBatch,
        state: QueueState,
        stored: StoredMessage,
        *,
        next_offset: bool,
        wait: bool,
        on_results: Callable[[list[Any]], None],
    ) -> Receipt:
        """A durable queue's publish, committed on its own (not an early queue's, :meth:`stage`): its
        message row and ``published`` event join ``ch``, which goes to the writer. ``next_offset``:
        the queue row's next offset moves past it (not for offsets reserved in blocks). Refused
        with :class:`WriterError` while the database is away; the rest of ``ch`` (drops the publish
        made room with) is written all the same."""
        name = state.name
        add_published(
            ch.messages, ch.events, name, stored.offset, stored.message, stored.routing_key,
            stored.published_at, stored.expires_at, self.node,
        )  # fmt: skip
        if next_offset:
            ch.queue_next[name] = stored.offset + 1
        try:
            return self.send(ch, wait=wait, on_results=on_results, refusable=True)
        except WriterError:
            self._write_the_rest(ch, {name: {stored.offset}})
            raise

    def turn_changes(self) -> Changes:
        """This turn's one change, for rows that need nothing run after their commit and may wait
        for the end of the turn (a holder's acks: a read's acks are one submission). Whatever is
        submitted later sends the turn first (:meth:`send`, :meth:`submit`), so nothing overtakes
        these rows; the manager sends it at the end of the turn."""
        turn = self.turn
        if turn is None:
            turn = self.turn = Turn(Changes(), Receipt.standing_in())
        return turn.changes

    def stage(
        self,
        state: QueueState,
        stored: StoredMessage,
        done: Callable[..., None] | None,
        *,
        next_offset: bool = True,
    ) -> Receipt:
        """A durable early queue's publish (a finished row): into this turn's one change, submitted at
        the end of the turn (:meth:`send_turn`). Returns the turn's receipt, done once it is committed.
        ``next_offset``: the queue row's next offset moves past it (not for offsets reserved in blocks)."""
        turn = self.turn
        if turn is None:
            turn = self.turn = Turn(Changes(), Receipt.standing_in())
        name = state.name
        changes = turn.changes
        add_published(
            changes.messages, changes.events, name, stored.offset, stored.message, stored.routing_key,
            stored.published_at, stored.expires_at, self.node,
        )  # fmt: skip
        if next_offset:
            changes.queue_next[name] = stored.offset + 1
        turn.publishes.append((state, stored, done))
        return turn.ticket

    def send_turn(self) -> None:
        """Hand this turn's publishes to the writer, under the receipt they were given; ``turn_done``
        tells them once they are committed (or failed)."""
        turn = self.turn
        if turn is None:
            return
        self.turn = None
        assert self.writer is not None and self.turn_done is not None
        if not turn.publishes and turn.changes.empty():  # acks that settled nothing
            turn.ticket.settle(None)
            return
        try:
            self.writer.submit(
                turn.changes,
                on_results=partial(self.turn_done, turn),
                receipt=turn.ticket,
                refusable=bool(turn.publishes),
            )
        except WriterError as exc:
            refused: dict[str, set[int]] = {}
            for state, stored, _done in turn.publishes:
                refused.setdefault(state.name, set()).add(stored.offset)
            self._write_the_rest(turn.changes, refused)  # the holders' acks
            turn.ticket.settle(exc)  # runs turn_done: every publish of the turn hears it failed

    def _write_the_rest(self, batch: WriteBatch, refused: dict[str, set[int]]) -> None:
        """A refused submission's rows that are not about its refused publishes: the loop has
        moved on from them (an ack taken, a message dropped), so the writer holds them until the
        database is back."""
        rest = batch.without(refused)
        after = batch.after if isinstance(batch, Changes) else None
        if not rest.empty() or after:
            assert self.writer is not None
            with contextlib.suppress(WriterError):  # not running: nothing is written any more
                self.writer.submit(rest, on_commit=_run_all(after) if after else None)

    def finished_alone(self, ch: WriteBatch, state: QueueState, group: Group, offset: int) -> None:
        """A shared group that was the queue's only one at its last claim is done with ``offset``:
        the message and its row go, unless the commit finds another group (``WriteBatch``)."""
        if state.durable and offset not in state.unwritten:
            ch.finished_alone.setdefault((state.name, group.name), []).append(offset)

    def removed(self, ch: WriteBatch, state: QueueState, offset: int) -> None:
        if state.durable and offset not in state.unwritten:
            ch.message_deletes.append((state.name, offset))

    def declared(self, ch: WriteBatch, state: QueueState) -> None:
        if state.durable:
            ch.calls.append(
                queue_store.upsert_queue(
                    state.name, state.policy.mode, policy_dict(state.policy), state.created_at
                )
            )

    # -- committing -------------------------------------------------------------------------------

    def submit(self, ch: Changes, *, wait: bool = False) -> Receipt | None:
        """Hand ``ch`` to the writer; its ``after`` callbacks run once it is committed. With nothing to
        write they run now. ``None``: nothing to wait for.

        Whatever queue the change came from: ``ch`` holds durable queues' rows only, and an in-memory
        queue's dead letter into a durable dead-letter queue is such a row. Deciding by the source
        queue's durability would keep that dead letter in memory only."""
        after = ch.after
        if not ch.empty():
            assert self.writer is not None
            if self.turn is not None:
                self.send_turn()
            return self.writer.submit(ch, wait=wait, on_commit=_run_all(after) if after else None)
        if after:
            for f in after:
                f()
        if self.idle is not None:
            self.idle()
        return None

    def send(
        self,
        batch: WriteBatch,
        *,
        wait: bool = False,
        on_commit: Callable[[], None] | None = None,
        on_results: Callable[[list[Any]], None] | None = None,
        refusable: bool = False,
        ahead: bool = False,
    ) -> Receipt:
        """A batch straight to the writer (claims, reservations, a publish's rows); ``refusable``
        and ``ahead``: see :meth:`GroupCommitWriter.submit` (a batch sent ahead does not send this
        turn's rows first: it does not need to follow them)."""
        assert self.writer is not None
        if self.turn is not None and not ahead:
            self.send_turn()
        return self.writer.submit(
            batch, wait=wait, on_commit=on_commit, on_results=on_results, refusable=refusable, ahead=ahead
        )

    async def write(self, batch: WriteBatch, on_commit: Callable[[], Any] | None = None) -> list[Any]:
        """Submit and wait for the commit; returns the results of ``batch.calls``."""
        if batch.empty():
            if on_commit is not None:
                on_commit()
                if self.idle is not None:
                    self.idle()
            return []
        try:
            return await self.send(batch, wait=True, on_commit=on_commit).wait()
        except WriterError as exc:
            raise QueueError("storage", str(exc)) from exc


class MemoryJournal(Journal):
    """A journal that commits into memory at once: the same rows and events, kept in ``events``,
    ``pending``, ``groups`` and ``messages``. For tests that drive the groups without a database
    (``calls`` such as claims are not run)."""

    def __init__(self, node: str = "local", *, shared: bool = False) -> None:
        super().__init__(None, node, shared=shared)
        self.events: list[dict[str, Any]] = []
        self.pending_rows: dict[tuple[str, str, int], dict[str, Any]] = {}
        self.held: dict[HeldKey, list[int]] = {}
        self.group_rows: dict[tuple[str, str], dict[str, Any]] = {}
        self.messages: dict[tuple[str, int], dict[str, Any]] = {}
        self.commits = 0

    def send(
        self,
        batch: WriteBatch,
        *,
        wait: bool = False,
        on_commit: Callable[[], None] | None = None,
        on_results: Callable[[list[Any]], None] | None = None,
        refusable: bool = False,
        ahead: bool = False,
    ) -> Receipt:
        self.commits += 1
        for m in batch.messages:
            self.messages[(m.queue, m.offset)] = m.row()
        for key in batch.message_deletes:
            self.messages.pop(key, None)
        for pkey, prow in batch.pending.items():
            if prow is None:
                self.pending_rows.pop(pkey, None)
            else:
                self.pending_rows[pkey] = prow
        for hkey, offsets in batch.held.items():
            self.held.setdefault(hkey, []).extend(offsets)
        for gkey, grow in batch.groups.items():
            if grow is not None:
                self.group_rows[gkey] = grow
        for (queue, group), offsets in batch.finished_alone.items():
            others = any(q == queue and g != group for q, g in self.group_rows)
            for offset in offsets:
                if others:
                    self.pending_rows.setdefault((queue, group, offset), {"state": "done"})["state"] = "done"
                else:
                    self.messages.pop((queue, offset), None)
                    self.pending_rows.pop((queue, group, offset), None)
        for event in batch.events:
            self.events.extend(queue_store.expand_event(event))
        receipt = Receipt(batch, None, None)
        receipt.done = True
        if on_commit is not None:
            on_commit()
        if on_results is not None:
            on_results([])
        if self.idle is not None:
            self.idle()
        return receipt

    def submit(self, ch: Changes, *, wait: bool = False) -> Receipt | None:
        if ch.empty():
            return super().submit(ch, wait=wait)
        after = ch.after
        return self.send(ch, on_commit=_run_all(after) if after else None)

    async def write(self, batch: WriteBatch, on_commit: Callable[[], Any] | None = None) -> list[Any]:
        self.send(batch, on_commit=on_commit)
        return []

    def kinds(self, offset: int | None = None) -> list[str]:
        """The event kinds written so far (for one offset), in order."""
        return [e["kind"] for e in self.events if offset is None or e["offset"] == offset]
