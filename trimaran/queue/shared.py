"""Shared mode: several server processes serve the same work queues from one PostgreSQL database.

No node holds a shared work queue whole. A node claims what it publishes for its own consumers as it
publishes it (the pending row joins the message's commit), while they have room; it claims batches
of what is left available (published by other nodes, released, or past its room) for its consumers
with credit, only what they select (``FOR UPDATE SKIP LOCKED``: two nodes never claim the same row),
and holds them under a lease it renews; what it is done with is marked done (a compaction
deletes what every group finished), what it hands back is released to every node (what it claimed
ahead, when no consumer left there selects it), and a node that dies hands its claims back when
their leases run out. Offsets of a shared node's durable queues come from blocks reserved in the
queue row, one UPDATE per block, so appends from several nodes never collide. What waits on the
database instead of memory is here too: a get waits for a claim made for it (``Claims.then``), and
a browser reads the stored rows (``Claims.browse``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from itertools import islice
from typing import Any

from trimaran.broker.message import Message, now_ms
from trimaran.queue.changes import Changes
from trimaran.queue.groups import Group, QueueDelivery, QueueState, StoredMessage, Taker
from trimaran.queue.handles import BrowseHandle
from trimaran.queue.journal import Journal
from trimaran.queue.policy import filter_matches
from trimaran.queue.work import WorkGroup
from trimaran.storage import queue_store
from trimaran.storage.queue_store import Wants
from trimaran.storage.rows import FIRST, SPANNED, WriteBatch

log = logging.getLogger(__name__)

_NEW = (FIRST, SPANNED)  # how a claim took a message never claimed before
_NO_CAP = 2**63 - 1  # no unclaimed publish of this node uncommitted: a claim's start is not capped
CLAIM_GROWTH = 16  # a group's claims grow to this many batches while each comes back full
KEPT_BYTES = 4 << 20  # of a queue's publishes left unclaimed, the payload bytes kept (Claims.keep)
POLL_MS = 100  # how often idle consumers look for messages other nodes published or released
# How often a poll's claims walk every new message instead of only what this node does not know
# (Claims.walk): what another node's claim had locked and then rolled back comes back here.
WHOLE_WALK_MS = 1000
# A node claims at publish, for its own consumers, at most what they hand out in this long (or a
# batch, or their credit): what other nodes' consumers could take waits here no longer.
HOLD_MS = 250
BROWSE_PAGE = 100  # most stored rows a browser reads at once


def takes_all(takers: Iterable[Taker]) -> bool:
    """One of ``takers`` takes every message (no routing filter, no selector). Asked per publish."""
    for t in takers:  # noqa: SIM110 (no generator frame per publish)
        if t.routing_filter is None and t.selects is None:
            return True
    return False


def taken_by(takers: Iterable[Taker]) -> Wants:
    """Whether one of ``takers`` takes a message (its routing filter and its selector), asked of a
    claim's messages in the writer's thread: the filters are read now, on the loop."""
    tests = [(t.routing_filter, t.selects) for t in takers]

    def takes(routing_key: str, message: Message) -> bool:
        return any(filter_matches(f, routing_key) and (s is None or s(message)) for f, s in tests)

    return takes


def stored_row(row: Any) -> StoredMessage:
    """A ``queue_messages`` row as the manager holds it."""
    message = queue_store.row_message(row)
    return StoredMessage(
        int(row.offset), message, row.routing_key, int(row.published_at), row.expires_at, len(message.payload)
    )


class Claims:
    """This node's claims, leases and offset blocks. ``dispatch(state, group)`` hands newly claimed
    messages to the group's consumers."""

    def __init__(
        self, journal: Journal, *, lease_ms: int, batch: int, dispatch: Callable[[QueueState, Group], None]
    ) -> None:
        self.journal = journal
        self.lease_ms = lease_ms
        self.batch = batch
        self.dispatch = dispatch
        # One claim in flight per group, and the consumers it claims for (their credit then).
        self.claiming: dict[Group, list[Taker]] = {}
        # How many the claim in flight asked for; which of this node's publishes left unclaimed
        # it can see (up to the last left when it was made, and below every one then uncommitted:
        # the highest offset the next claim may start past, ``WorkGroup.claim_after``); whether
        # it takes every message (no selector); and a copy of the queue's kept unclaimed
        # publishes (QueueState.unclaimed) when it was made.
        self.wanted: dict[Group, tuple[int, int, int, bool, dict[int, StoredMessage]]] = {}
        # What waits for a claim (Claims.then): for the one in flight, and for the next one.
        self.waiting: dict[Group, list[Callable[[], None]]] = {}
        self.later: dict[Group, list[tuple[Taker, Callable[[], None]]]] = {}
        self.last_renew = 0
        self.last_poll = 0
        self.last_whole_walk = 0
        self.walk_whole: set[Group] = set()  # groups whose next claim walks every new message
        self.open = False  # claims are made only while the manager runs
        # Queues this node settled something of since the last poll: their 'done' markers are
        # compacted at the next poll, so a claim's scan never walks far past finished messages.
        self.finished: set[str] = set()

    def due(self, group: Group) -> bool:
        """Time to claim, after a dispatch: few claimed messages left to hand out, or a consumer
        still has credit (none of those left is one it selects); not while the last claim found
        the queue drained of what this node may claim (``WorkGroup.dry_at``)."""
        ready = len(group.ready)
        if isinstance(group, WorkGroup):
            if group.dry_at == group.handed_back:
                return False
            ready = group.ready_now()
        return ready < self.batch // 4 or any(h.credit > 0 for h in group.consumers)

    def room(self, group: Group) -> int:
        """How many messages this node claims ahead for ``group``: a batch, or its consumers' credit
        when that is more (prefetch windows larger than a batch are kept full), or what its claims
        grew to while a backlog lasted (``WorkGroup.claim_size``), or what its consumers hand out
        in ``HOLD_MS`` (``WorkGroup.pace``). Less, and a consumer window smaller than what the
        publishers write between two commits left part of every burst unclaimed, to be claimed
        back by a claim that filled the room again (MQTT `$queue/`, window 100: 45% of the
        traffic through claims)."""
        credit = sum([h.credit for h in group.consumers if not h.closed])
        if isinstance(group, WorkGroup):
            return max(self.batch, credit, group.claim_size, group.pace)
        return max(self.batch, credit)

    def claimers(self, state: QueueState, routing_key: str, message: Message) -> list[WorkGroup]:
        """The groups this node claims a message for as it publishes it: every group whose consumers
        here take it, if each has room (claimed and not handed out, below :meth:`room`). Else
        none: the message is written unclaimed, and the groups claim it in offset order
        (:meth:`left_unclaimed`). Claimed past a publish left unclaimed before, it waits for a
        claim to take that one (``WorkGroup.barrier``); but not for consumers with selectors,
        whose claims pass over what they do not select (it would wait for a claim that comes back
        short)."""
        if not self.open:
            return []
        mine: list[WorkGroup] = []
        for group in state.groups.values():
            consumers = group.consumers
            if not consumers or not isinstance(group, WorkGroup):
                continue
            if not takes_all(consumers) and not taken_by(consumers)(routing_key, message):
                continue  # the others' to claim
            if not group.in_database or (group.holding_back and not takes_all(consumers)):
                return []
            ready = len(group.ready)
            if ready >= self.batch and ready >= self.room(group):  # room: a sum over consumers
                return []
            mine.append(group)
        return mine

    def track(self, state: QueueState, offset: int) -> None:
        """A publish of this node at ``offset``, claimed here or left unclaimed: the groups that
        claim every message (a consumer here without filter or selector) have each such publish
        claimed as it is published or in ``WorkGroup.left``, so they know from where
        (``WorkGroup.tracked_from``) their claims need not walk (:meth:`walk`); the others do not."""
        for group in state.groups.values():
            if isinstance(group, WorkGroup):
                if group.consumers and takes_all(group.consumers):
                    if group.tracked_from is None:
                        group.tracked_from = offset
                else:
                    group.tracked_from = None

    def walk(self, state: QueueState, group: WorkGroup, after: int) -> tuple[int, int]:
        """Where a claim of new messages for ``group`` walks past ``after``: below the first
        returned, then past the second (``(ALL_OFFSETS, -1)``: past ``after`` alone). Of the offsets in
        this node's run of blocks since it tracks the group (:meth:`track`), only its publishes
        left unclaimed can be new: from the oldest on (``barrier``), else from its next offset. The
        rest is claimed or acked, and acked messages leave index entries that PostgreSQL keeps
        until a vacuum: mid-run, 81,128 of them under 1,000 live rows, 700-900 blocks read by each
        claim that walked them. Below that run, and from where other nodes reserve on, the claim
        walks as before; every ``WHOLE_WALK_MS`` a poll's claims walk it all (:meth:`tick`)."""
        own_from, tracked = state.own_from, group.tracked_from
        if own_from is None or tracked is None:
            return queue_store.ALL_OFFSETS, -1
        known = max(own_from, tracked)
        first_new = group.barrier if group.holding_back else state.block_next
        resume = max(after, known - 1, first_new - 1)
        if resume == known - 1 and after < resume:
            return queue_store.ALL_OFFSETS, -1  # the two walks would meet: one
        return known, resume

    def left_unclaimed(self, state: QueueState, offset: int) -> list[WorkGroup]:
        """A publish of this node goes to the database unclaimed: the groups with consumers here
        claim what follows it only after a claim has taken it (:meth:`_claimed`). Returns them, for
        :meth:`committed_unclaimed` once its commit is done."""
        groups = [g for g in state.groups.values() if isinstance(g, WorkGroup) and g.consumers]
        for group in groups:
            group.left_unclaimed(offset)
        return groups

    def committed_unclaimed(self, groups: list[WorkGroup], offset: int) -> None:
        """The unclaimed publish :meth:`left_unclaimed` counted is committed (or failed): a claim
        made from now on sees it."""
        for group in groups:
            group.left_inflight.discard(offset)

    def keep(self, state: QueueState, stored: StoredMessage) -> None:
        """Keep a committed publish left unclaimed while this node's groups are behind, up to
        ``KEPT_BYTES`` of payload and what two of the largest claims take (the oldest go first):
        claimed here, it needs no row read back and decoded (half of what a message claimed back
        cost the node, MQTT ``$queue/`` at a consumer window of 64)."""
        kept = state.unclaimed
        kept[stored.offset] = stored
        state.unclaimed_bytes += stored.size
        while len(kept) > 2 * CLAIM_GROWTH * self.batch or state.unclaimed_bytes > KEPT_BYTES:
            state.unclaimed_bytes -= kept.pop(next(iter(kept))).size

    def _let_go(self, state: QueueState, upto: int) -> None:
        """Kept publishes up to ``upto`` (a claim's newest new message) are claimed, here or by
        another node, or passed over: no longer kept."""
        kept = state.unclaimed
        while kept and (first := next(iter(kept))) <= upto:
            state.unclaimed_bytes -= kept.pop(first).size

    def claim_published(
        self, state: QueueState, stored: StoredMessage, groups: list[WorkGroup], ch: WriteBatch
    ) -> None:
        """Claim a message being published for ``groups`` (:meth:`claimers`): held here under a
        lease in a span of its commit's offsets (``schema.queue_spans``), it is theirs to hand out
        now, before the commit, as one node's work queue does (``QueueManager.early``): no other
        node can claim what it never saw, and a consumer's ack that lands in the same commit writes
        no row for either."""
        state.add(stored)
        offset = stored.offset
        for group in groups:
            self.journal.held_here(ch, state, group, offset, stored.published_at)
            group.claimed(offset, SPANNED)

    def claim(self, state: QueueState, group: Group) -> None:
        """Claim a batch for this node, in one statement, for its consumers with credit: up to
        ``batch`` messages ready here, and only what those consumers select between them (what
        they refuse is left to the other nodes). Claiming only the credit of the moment (a few
        messages after each PUBACK) made every claim pay the scan and the commit for a handful,
        ~250 msg/s."""
        if group in self.claiming or not self.open or state.deleted:
            return
        takers = [h for h in group.consumers if h.credit > 0 and not h.closed]
        if not takers:
            return
        # What is claimed ahead may be what they do not select: then at least their credit more.
        credit = sum([h.credit for h in takers])
        # What waits behind a publish left unclaimed (``WorkGroup.barrier``) is not counted: the
        # claims that take that one would shrink to nothing (36 messages a claim, MQTT `$queue/`).
        if isinstance(group, WorkGroup):
            size, ready = max(group.claim_size, self.batch), group.ready_now()
        else:
            size, ready = self.batch, len(group.ready)
        want = max(max(size, credit) - ready, min(self.batch, credit))
        self.claiming[group] = takers
        # New messages from past the last full claim's, but not past an uncommitted unclaimed
        # publish of this node's (it would be passed over once committed).
        after = cap = seen = -1
        if isinstance(group, WorkGroup):
            seen = group.last_left()
            after = group.claim_after
            if group.left_inflight:
                cap = min(group.left_inflight) - 1
                after = min(after, cap)
            else:
                cap = _NO_CAP
        wants = None if takes_all(takers) else taken_by(takers)
        below, resume = queue_store.ALL_OFFSETS, -1
        if isinstance(group, WorkGroup) and wants is None:  # a selector's claim walks it all
            if group in self.walk_whole:
                self.walk_whole.discard(group)
            else:
                below, resume = self.walk(state, group, after)
        # The kept publishes the claim may take, copied for the writer: the first ``want`` past
        # where it starts (all of them, up to 3,200, copied for each claim, cost more than it saved).
        kept = state.unclaimed
        known = dict(islice(((o, m) for o, m in kept.items() if o > after), want)) if wants is None else {}
        self.wanted[group] = (want, seen, cap, wants is None, known)
        now = now_ms()
        call = queue_store.claim(
            state.name,
            group.name,
            self.journal.node,
            want,
            now,
            now + self.lease_ms,
            wants,
            after=after,
            below=below,
            resume=resume,
            known=known.keys(),
        )
        calls = [call, queue_store.count_groups(state.name)]
        self.journal.send(
            WriteBatch(calls=calls), on_results=lambda results: self._claimed(state, group, results)
        )

    def then(self, state: QueueState, group: Group, taker: Taker, done: Callable[[], None]) -> None:
        """Run ``done`` once a claim made for ``taker``'s credit has landed and what it claimed is
        handed out: the claim in flight if it was made for ``taker``, else the next one (started
        now if none is in flight). At once when there is nothing to claim for (no credit, stopped)."""
        if taker in self.claiming.get(group, ()):
            self.waiting.setdefault(group, []).append(done)
        elif group in self.claiming:
            self.later.setdefault(group, []).append((taker, done))
        else:
            self.claim(state, group)
            if taker in self.claiming.get(group, ()):
                self.waiting.setdefault(group, []).append(done)
            else:
                done()

    def _claimed(self, state: QueueState, group: Group, results: list[Any]) -> None:
        self.claiming.pop(group, None)
        want, seen, cap, plain, known = self.wanted.pop(group, (0, -1, -1, True, {}))
        rows = results[0] if results else []
        moved = False
        if isinstance(group, WorkGroup):  # claims are a shared work queue's
            newest = max([int(row.offset) for row, got in rows if got in _NEW], default=-1)
            if results:  # committed: the group has its row; the queue's one group deletes on ack
                group.in_database = True
                group.alone = results[1] == 1
                if group.holding_back:
                    # A claim takes new messages in offset order, but what another claim holds
                    # locked: this node's unclaimed publishes it could see (``seen``, ``cap``) are
                    # taken, up to its newest, or all when it came back short; and those it got.
                    # A claim with a selector passes over some: only a short one says.
                    upto = min(seen, cap)
                    if len(rows) == want:
                        upto = min(upto, newest) if plain else -1
                    moved = group.passed(upto, {int(row.offset) for row, _got in rows})
                    if moved and not plain:
                        # Passed over is not taken: what a selector refused may be there still for
                        # the group's other consumers, which the walk past this node's run would
                        # miss (``walk``): their next claim walks it all.
                        self.walk_whole.add(group)
            group.dry_at = group.handed_back if len(rows) < want and not group.holding_back else None
            # A full claim took every new message up to its last one but what another claim held
            # locked: the next starts there (below what of this node's was uncommitted when it
            # was made). One that came back short leaves the next to start from the beginning.
            group.claim_after = -1
            if results and len(rows) == want:
                group.claim_after = min(newest, cap)
            # A backlog in the database: each full claim asks for twice as many as the last (one
            # claim in flight a group, one a commit: at 100 a claim the backlog outgrew what the
            # claims took, MQTT `$queue/` open loop); one that comes back short, half as many.
            # The room to claim at publish follows, so that a burst that passed a batch does not
            # send every publish after it through claims.
            size = max(group.claim_size, self.batch)
            if results and len(rows) == want and want >= size:
                group.claim_size = min(size * 2, self.batch * CLAIM_GROWTH)
            elif results and len(rows) < want:
                group.claim_size = group.claim_size // 2 if group.claim_size > self.batch else 0
            unclaimed = state.unclaimed
            for row, got in rows:
                offset = int(row.offset)
                if offset in group.entries:
                    continue
                if offset not in state.messages:
                    # Kept when the claim was made (no row read), or since (its row read, not decoded)
                    kept = known[offset] if isinstance(row, queue_store.Known) else unclaimed.get(offset)
                    state.add(kept if kept is not None else stored_row(row))
                group.claimed(offset, got)
            self._let_go(state, newest)
            if rows and not any(not h.closed for h in group.consumers):
                # Every consumer it was made for left while it ran (a channel closing gives back
                # what it had not sent, which claimed again for it): back to every node, in order.
                ch = Changes()
                group.hand_back_claimed(now_ms(), ch)
                self.journal.submit(ch)
            elif rows or moved:
                self.dispatch(state, group)
        for done in self.waiting.pop(group, ()):
            done()
        for taker, done in self.later.pop(group, ()):
            self.then(state, group, taker, done)

    def browse(self, handle: BrowseHandle) -> None:
        """Read a browser the stored rows from its cursor on, as its credit allows: what some group
        has not finished, in offset order, claimed by no one (``queue_store.browse``). Through the
        writer, so it follows this node's own writes; what arrives later is read at the next local
        publish or poll. Offsets come from each node's blocks, so a message another node publishes
        later under an offset the browser has passed is not seen."""
        if handle.reading or handle.closed or handle.credit <= 0 or not self.open:
            return
        handle.reading = True
        want = min(handle.credit, BROWSE_PAGE)
        call = queue_store.browse(handle.queue.name, handle.cursor, want)
        self.journal.send(
            WriteBatch(calls=[call]), on_results=lambda results: self._browsed(handle, want, results)
        )

    def _browsed(self, handle: BrowseHandle, want: int, results: list[Any]) -> None:
        handle.reading = False
        rows = results[0] if results else []
        if handle.closed:
            return
        now = now_ms()
        name = handle.queue.name
        out: list[QueueDelivery] = []
        for row in rows:
            if handle.credit <= 0:
                break
            handle.cursor = int(row.offset) + 1
            if row.expires_at is not None and now >= row.expires_at:
                continue
            handle.credit -= 1
            message = queue_store.row_message(row)
            out.append(QueueDelivery(message, name, int(row.offset), "$browse", 1, False))
        for delivery in out:
            try:
                handle.consumer.deliver(delivery)
            except Exception:
                log.exception("browser %s failed to take a delivery", handle.consumer.id)
        if len(rows) == want and handle.credit > 0:
            self.browse(handle)  # a whole page: more is stored
        else:
            handle.was_read()

    def next_due(self) -> int:
        """When :meth:`tick` has work next (epoch ms)."""
        return min(self.last_poll + POLL_MS, self.last_renew + self.lease_ms // 3)

    def tick(self, now: int, queues: list[QueueState]) -> None:
        """Poll for what other nodes published or released; renew leases and compact."""
        if now - self.last_poll >= POLL_MS:
            elapsed = now - self.last_poll
            self.last_poll = now
            if now - self.last_whole_walk >= WHOLE_WALK_MS:
                self.last_whole_walk = now
                self.walk_whole = {g for state in queues for g in state.groups.values()}
            for state in queues:  # what other nodes published or released since: claim again,
                for group in state.groups.values():  # new messages from the beginning
                    if isinstance(group, WorkGroup):
                        group.dry_at = None
                        group.claim_after = -1
                        group.pace = group.handed * HOLD_MS // max(elapsed, POLL_MS)
                        group.handed = 0
            if self.finished:
                names, self.finished = self.finished, set()
                calls = [queue_store.compact_shared(n) for n in sorted(names)]
                self.journal.send(WriteBatch(calls=calls), ahead=True)
            for state in queues:
                for group in state.groups.values():
                    if group.consumers:  # claims only for consumers with credit
                        self.claim(state, group)
                for browser in state.browsers:  # what the other nodes published since
                    self.browse(browser)
        if now - self.last_renew >= self.lease_ms // 3:
            self.last_renew = now
            calls = [queue_store.renew_leases(self.journal.node, now + self.lease_ms)]
            calls += [queue_store.compact_shared(s.name, orphans=True) for s in queues]
            self.journal.send(WriteBatch(calls=calls), ahead=True)
