"""The life of each message, replayed from its events in plain Python.

Spark brings every row that concerns one message slot (queue, offset) into one partition, sorted
by incarnation (``epoch``) and event id: the slot's events, its ``queue_messages`` row and its
``queue_pending`` rows. :func:`replay_partition` walks those rows once, the way the broker lived
them, and writes a *life* per (group, message) and a *violation* per broken rule (see
``replay.INVARIANTS``), and counts the live incarnation's messages.

Beside the rules, each message of the live incarnation gets its *ledger*: from the events alone,
one fate per group that existed while it was live (see FATES), checked against the live rows. The
rules each look at part of a life, so deleting the evidence one looks for could hide a loss; the
ledger cannot be fooled that way, and the report's per-queue table counts its lines. The events
that move a message to another queue (a dead letter's cause and copy, a redrive's) are handed out
for ``copies.py`` to pair across slots.

Spark's own operators (windows, joins, aggregates) did the same work, but each of them costs a
stage, generated code and JIT time; one pass over the sorted rows is several times faster, and the
rules read as the story of a message. The module imports only the standard library, so the rules are
tested without Spark; ``replay.py`` does the Arrow plumbing.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

FINISHED = "finished"
GROUP_KINDS = frozenset({"delivered", "acked", "nacked", "rejected", "released", "dead_lettered", "dropped"})
SETTLES = frozenset({"acked", "nacked", "rejected", "released"})
REMOVALS = frozenset({"expired", "dropped", "redriven"})  # queue-level: TTL, overflow, redrive
# The events copies.py matches: a copy's publication names its source by these prefixes; its cause
# is a dead_lettered or redriven event, or an expiry or drop routed to dead-letter queues (" -> ").
COPY_PREFIXES = ("dead_letter from ", "redrive from ")
CAUSES = frozenset({"dead_lettered", "redriven", "expired", "dropped"})
FINAL = frozenset({"acked", "dead_lettered", "dropped"})  # a group is done with the message for good
# How far a message's event may be stamped before the one logged ahead of it: the nodes sharing a
# database stamp events with their own clocks. Tampering or a reordering writer shows as more.
CLOCK_SLACK_MS = 1000
# The ledger: one line per (message, group that existed while the message was live), or one for
# the queue when the message never had a group, each with exactly one fate taken from the events:
# acked (a stream group: committed past it), dead_lettered (with its copy's queue:offset), dropped,
# expired, purged, redriven (with the copy's queue:offset), or still owed: pending (delivered or
# waiting, or stored in a queue with no group) or ahead (of the group's cursor, not yet delivered);
# "lost" is a line with none of these (the accounted rule broken). Counted per (queue, group) for the
# report's table, where a group's "published" is the sum of its lines' fates. The queue's own row
# counts published, its messages finished by every group ("finished"), still stored ("stored"),
# removed (expired, dropped, purged, redriven), lost, and an earlier incarnation's ("deleted");
# "redelivered" counts a group's messages delivered more than once.
FATES = ("acked", "dead_lettered", "dropped", "expired", "purged", "redriven", "pending", "ahead", "lost")
OWED = frozenset({"pending", "ahead"})
OUTCOMES = ("published", *FATES, "redelivered", "finished", "stored", "deleted")
# Which outcome a sampled message stands for, the rarest first (a message is sampled once).
_SAMPLE_ORDER = ("lost", "dead_lettered", "dropped", "redelivered", "expired", "purged", "redriven",
                 "ahead", "pending", "acked")  # fmt: skip
SAMPLES = 3  # messages sampled per (queue, outcome) and partition, for the report's message pages

# A "cause" or "copy" row is such an event, VIOLATION-shaped: its kind as ``invariant``, its reason
# as ``detail``, its id as ``event_id``; the driver matches them (copies.py).
# One input row: the slot (queue, offset, epoch), the event id (None for table rows), where the row
# comes from ("e" event, "m" queue_messages, "p" queue_pending), then the event's (or pending row's)
# fields. A pending row carries its attempts in ``attempt`` and its state in ``state``.
INPUT: dict[str, str] = {
    "queue": "string",
    "offset": "bigint",
    "epoch": "int",
    "id": "bigint",
    "src": "string",
    "time": "bigint",
    "group": "string",
    "consumer": "string",
    "kind": "string",
    "attempt": "int",
    "reason": "string",
    "state": "string",
}
QUEUE, OFFSET, EPOCH, ID, SRC, TIME, GROUP, CONSUMER, KIND, ATTEMPT, REASON, STATE = range(len(INPUT))

VIOLATION: dict[str, str] = {
    "invariant": "string",
    "queue": "string",
    "group": "string",
    "offset": "bigint",
    "epoch": "int",
    "message_id": "string",
    "event_id": "bigint",
    "detail": "string",
}
LIFE: dict[str, str] = {
    "queue": "string",
    "epoch": "int",
    "group": "string",
    "offset": "bigint",
    "last_kind": "string",
    "last_reason": "string",
    "attempts": "int",
    "holder": "string",
    "deliveries": "int",
    "acks": "int",
    "first_delivered_at": "bigint",
    "acked_at": "bigint",
    "dead_lettered_at": "bigint",
    "last_id": "bigint",
    "status": "string",
    "pub_time": "bigint",  # the message's publication (None: never published)
    "fate": "string",  # the ledger line's fate (FATES; None in an older incarnation)
    "copy": "string",  # a dead letter's or redrive's copy, "<queue>:<offset>" (several: comma-joined)
}
TOTALS: dict[str, str] = {
    "group_message_pairs": "bigint",
    "messages": "bigint",
    "messages_live": "bigint",
    "messages_removed": "bigint",
}
# An "outcome" row counts, per (queue, group), the messages with one outcome (OUTCOMES); a
# "sample" row names one message (queue, offset, epoch) standing for an outcome. A "ledger" row is a
# ledger line with no life (a group that never had an event for the message, or the queue's line):
# LIFE's columns, with only the fate and copy set.
OUTCOME: dict[str, str] = {"outcome": "string", "n": "bigint"}
# The output rows share one schema: ``record`` says which kind ("violation", "life", "ledger",
# "outcome", "sample", or one "totals" row per partition counting lives and the live incarnation's messages);
# the rest is the union (queue, group, offset and epoch are shared). Rows are tuples in this order.
OUTPUT: dict[str, str] = {"record": "string", **VIOLATION, **LIFE, **TOTALS, **OUTCOME}
_LIFE_AT = list(OUTPUT).index("last_kind")
_TOTALS_AT = list(OUTPUT).index("group_message_pairs")
_OUTCOME_AT = list(OUTPUT).index("outcome")
assert list(OUTPUT)[1:_LIFE_AT] == list(VIOLATION)
assert list(OUTPUT)[_LIFE_AT:_TOTALS_AT] == list(LIFE)[4:]
assert list(OUTPUT)[_TOTALS_AT:_OUTCOME_AT] == list(TOTALS) and list(OUTPUT)[_OUTCOME_AT:] == list(OUTCOME)


@dataclass(frozen=True)
class Context:
    """What a partition needs to know beyond its own rows: small per-queue and per-group facts."""

    modes: dict[str, str] = field(default_factory=dict)  # the live incarnation's mode, per queue
    stream_epochs: frozenset[tuple[str, int]] = frozenset()  # older incarnations that committed
    max_attempts: dict[str, int | None] = field(default_factory=dict)
    visibility_ms: dict[str, int | None] = field(default_factory=dict)
    next_offset: dict[str, int | None] = field(default_factory=dict)
    # Per queue, its groups: those with a queue_groups row (with their cursor) and those seen only
    # in events (cursor None).
    groups: dict[str, dict[str, int | None]] = field(default_factory=dict)
    committed: dict[str, dict[str, int | None]] = field(default_factory=dict)  # stream groups' position
    # Per queue and group, from its events in the live incarnation: the id of its first event and the
    # lowest offset it had an event for. A group with an event before a message was published, or
    # before it was gone and for a lower offset (it did not start past it), existed while it was
    # live, whatever its cursor says.
    firsts: dict[str, dict[str, tuple[int, int | None]]] = field(default_factory=dict)
    purge_ids: dict[str, int] = field(default_factory=dict)  # the newest purge, per queue
    # Per queue and group, a shared node's spans (first, last offset), in offset order: the messages
    # it claimed for the first time, held with no pending row (schema.queue_spans).
    spans: dict[str, dict[str, list[tuple[int, int]]]] = field(default_factory=dict)
    since_ms: int | None = None
    until_ms: int | None = None

    @property
    def windowed(self) -> bool:
        return self.since_ms is not None or self.until_ms is not None

    def mode(self, queue: str, epoch: int) -> str:
        if epoch == 0 and queue in self.modes:
            return self.modes[queue]
        return "stream" if (queue, epoch) in self.stream_epochs else "work"

    def in_window(self, time: int | None) -> bool:
        if time is None:
            return not self.windowed
        if self.since_ms is not None and time < self.since_ms:
            return False
        return self.until_ms is None or time < self.until_ms


def message_id(queue: str, offset: int | None, epoch: int | None) -> str:
    base = f"{queue}:{offset}"
    return f"{base}@epoch{epoch}" if epoch else base


def _text(value: object) -> str:
    """A value in a detail text as Spark's format_string writes it."""
    return "null" if value is None else str(value)


class Life:
    """One group's history of one message, and what the replay checks as it walks it."""

    __slots__ = (
        "ack_id",
        "acked_at",
        "acks",
        "again_id",
        "attempts",
        "clash_id",
        "clash_kind",
        "dead_lettered_at",
        "deliveries",
        "fate",
        "fate_id",
        "fate_reason",
        "first_delivered_at",
        "holder",
        "last_attempt",
        "last_delivery_time",
        "last_id",
        "last_kind",
        "last_reason",
        "prev_attempt",
        "prev_reason",
        "prev_time",
    )  # fmt: skip

    def __init__(self) -> None:
        self.last_kind: str | None = None  # also the previous event's kind while walking
        self.last_reason: str | None = None
        self.last_id: int | None = None
        self.attempts: int | None = None  # the highest attempt delivered
        self.holder: str | None = None  # the consumer of the newest delivery
        self.deliveries = 0
        self.acks = 0
        self.again_id: int | None = None  # the second ack, if any
        self.ack_id: int | None = None  # the first ack: the group is done with it for good
        self.first_delivered_at: int | None = None
        self.acked_at: int | None = None
        self.dead_lettered_at: int | None = None
        self.prev_attempt: int | None = None
        self.prev_reason: str | None = None
        self.prev_time: int | None = None
        self.last_attempt: int | None = None  # the newest delivery's attempt
        self.last_delivery_time: int | None = None
        self.fate: str | None = None  # the first final event (FINAL): the group's fate
        self.fate_reason: str | None = None
        self.fate_id: int | None = None
        self.clash_kind: str | None = None  # a second final event (not a repeated ack): two fates
        self.clash_id: int | None = None

    @property
    def status(self) -> str:
        """held: a consumer has it; wait: it will be delivered again; finished: the group is done."""
        if self.last_kind == "delivered":
            return "held"
        if self.last_kind == "released":
            return "wait"
        if self.last_kind == "nacked" and self.last_reason != "max_attempts":
            return "wait"
        return FINISHED

    def step(
        self, row: tuple[Any, ...], max_attempts: int | None, visibility_ms: int | None
    ) -> list[tuple[str, str]]:
        """Apply one event; returns the (invariant, detail) pairs it breaks."""
        kind, attempt, reason, time = row[KIND], row[ATTEMPT], row[REASON], row[TIME]
        prev_kind, prev_attempt, prev_reason = self.last_kind, self.prev_attempt, self.prev_reason
        if kind == "delivered" and self.fate is not None:
            # The group was done with it, whatever came between (a restart's release): reported,
            # and the life stays finished (the delivery is not counted, so it breaks this rule
            # alone). Its attempt is remembered: settling it is no settlement without a delivery.
            shown = "?" if attempt is None else attempt
            to = row[CONSUMER] or "nobody"
            self.last_attempt = attempt
            if self.ack_id is not None:
                why = f"attempt {shown} delivered to {to} after its ack (event {self.ack_id})"
                return [("acked_stays_acked", why)]
            return [("final", f"attempt {shown} delivered to {to} after {self.fate} (event {self.fate_id})")]
        broken: list[tuple[str, str]] = []
        if kind in SETTLES:
            last = self.last_attempt
            if last is None or (attempt is not None and last != attempt):
                why = (
                    "with no delivery before it"
                    if last is None
                    else f"but the last delivery was attempt {last}"
                )
                broken.append(
                    ("settled_after_delivery", f"{kind} attempt {'?' if attempt is None else attempt} {why}")
                )
        elif kind == "delivered":
            number = self.deliveries + 1
            if (-1 if attempt is None else attempt) != number:
                shown = "?" if attempt is None else attempt
                broken.append(
                    ("attempts", f"delivery numbered attempt {shown} is delivery {number} of this group")
                )
            if self.deliveries and not self._redelivery_explained(reason, visibility_ms):
                broken.append(
                    (
                        "redelivery_explained",
                        f"attempt {'?' if attempt is None else attempt} delivered for reason "
                        f"{reason or 'none'} after {prev_kind or 'nothing'} ({prev_reason or 'no reason'})",
                    )
                )
        elif kind in ("dead_lettered", "dropped"):
            at_max = prev_attempt is not None and prev_attempt >= (
                1 if max_attempts is None else max_attempts
            )
            explained = (
                prev_kind == "rejected"
                or (prev_kind == "nacked" and prev_reason == "max_attempts" and at_max)
                or (prev_kind == "released" and at_max)
            )
            if not explained:
                broken.append(
                    (
                        "dead_letter_explained",
                        f"{kind} ({reason or 'no reason'}) after {prev_kind or 'nothing'}, attempt "
                        f"{'?' if prev_attempt is None else prev_attempt} of max "
                        f"{'?' if max_attempts is None else max_attempts}",
                    )
                )
            self.dead_lettered_at = _max(self.dead_lettered_at, time)
        if kind == "delivered":
            self.deliveries += 1
            self.attempts = _max(self.attempts, attempt)
            self.holder = row[CONSUMER]
            self.last_attempt = attempt
            self.last_delivery_time = time
            if time is not None and (self.first_delivered_at is None or time < self.first_delivered_at):
                self.first_delivered_at = time
        elif kind == "acked":
            if self.acks == 0:
                self.ack_id = row[ID]
            elif self.acks == 1:
                self.again_id = row[ID]
            self.acks += 1
            self.acked_at = _max(self.acked_at, time)
        if kind in FINAL:
            if self.fate is None:
                self.fate, self.fate_reason, self.fate_id = kind, reason, row[ID]
            elif self.clash_id is None and not (kind == "acked" == self.fate):
                self.clash_kind, self.clash_id = kind, row[ID]
        self.last_kind, self.last_reason, self.last_id = kind, reason, row[ID]
        self.prev_attempt, self.prev_reason, self.prev_time = attempt, reason, time
        return broken

    def _redelivery_explained(self, reason: str | None, visibility_ms: int | None) -> bool:
        """A redelivery follows a nack, a release for the same reason (a timeout only once the
        visibility timeout has passed since the delivery), or a dead node's expired lease."""
        prev_kind, prev_reason = self.last_kind, self.prev_reason
        if prev_kind == "nacked":
            return reason == "nack" and prev_reason != "max_attempts"
        if prev_kind == "released":
            if prev_reason is None or reason != prev_reason:
                return False
            if prev_reason != "timeout" or visibility_ms is None:
                return True
            delivered, released = self.last_delivery_time, self.prev_time
            return delivered is not None and released is not None and released >= delivered + visibility_ms
        return prev_kind == "delivered" and reason == "lease_expired"


def _max(a: int | None, b: int | None) -> int | None:
    if a is None:
        return b
    return a if b is None or a >= b else b


class Output:
    """Output rows (tuples in OUTPUT's column order), handed out in batches; the counts of messages
    (live incarnation) and lives, the outcomes per (queue, group) and the sampled messages."""

    __slots__ = ("live", "lives", "messages", "outcomes", "removed", "rows", "samples")
    _AFTER_VIOLATION = (None,) * (len(OUTPUT) - _LIFE_AT)
    _AFTER_LIFE = (None,) * (len(OUTPUT) - _TOTALS_AT)
    _BEFORE_OUTCOME = (None,) * (_OUTCOME_AT - _LIFE_AT)

    def __init__(self) -> None:
        self.rows: list[tuple[Any, ...]] = []
        self.messages = self.live = self.removed = self.lives = 0
        self.outcomes: dict[tuple[str, str | None, str], int] = {}
        self.samples: dict[tuple[str, str], list[tuple[int, int]]] = {}

    def violation(
        self, invariant: str, queue: str, group: str | None, offset: int | None, epoch: int,
        event_id: int | None, detail: str,
    ) -> None:  # fmt: skip
        head = (
            "violation",
            invariant,
            queue,
            group,
            offset,
            epoch,
            message_id(queue, offset, epoch),
            event_id,
        )
        self.rows.append((*head, detail, *self._AFTER_VIOLATION))

    def life(
        self, queue: str, epoch: int, group: str, offset: int, life: Life, pub_time: int | None,
        fate: str | None = None, copy: str | None = None,
    ) -> None:  # fmt: skip
        self.lives += 1
        self.rows.append(
            ("life", None, queue, group, offset, epoch, None, None, None, life.last_kind, life.last_reason,
             life.attempts, life.holder, life.deliveries, life.acks, life.first_delivered_at, life.acked_at,
             life.dead_lettered_at, life.last_id, life.status, pub_time, fate, copy, *self._AFTER_LIFE)
        )  # fmt: skip

    def traced(self, record: str, row: tuple[Any, ...]) -> None:
        """A cause or copy event for copies.py (``record`` "cause" or "copy")."""
        self.rows.append(
            (record, row[KIND], row[QUEUE], row[GROUP], row[OFFSET], row[EPOCH], None, row[ID], row[REASON],
             *self._AFTER_VIOLATION)
        )  # fmt: skip

    def ledger(
        self, queue: str, group: str | None, offset: int, pub_time: int | None, fate: str, copy: str | None
    ) -> None:
        """A ledger line with no life: a group with no event for the message, or the queue's line."""
        self.rows.append(
            ("ledger", None, queue, group, offset, 0, None, None, None, None, None, None, None, 0, 0, None,
             None, None, None, None, pub_time, fate, copy, *self._AFTER_LIFE)
        )  # fmt: skip

    def count(self, queue: str, group: str | None, outcome: str) -> None:
        key = (queue, group, outcome)
        self.outcomes[key] = self.outcomes.get(key, 0) + 1

    def sample(self, queue: str, offset: int, epoch: int, outcome: str) -> None:
        taken = self.samples.setdefault((queue, outcome), [])
        if len(taken) < SAMPLES:
            taken.append((offset, epoch))

    def next(self) -> Output:
        """A fresh batch that carries the counts on."""
        fresh = Output()
        fresh.lives, fresh.messages = self.lives, self.messages
        fresh.live, fresh.removed = self.live, self.removed
        fresh.outcomes, fresh.samples = self.outcomes, self.samples
        return fresh

    def totals(self) -> None:
        """The message counts, outcomes and samples so far as rows (then zero)."""
        none = (None,) * (_TOTALS_AT - 1)
        self.rows.append(("totals", *none, self.lives, self.messages, self.live, self.removed, None, None))
        self.messages = self.live = self.removed = self.lives = 0
        for (queue, group, outcome), n in sorted(self.outcomes.items(), key=str):
            self.rows.append(
                ("outcome", None, queue, group, None, 0, None, None, None, *self._BEFORE_OUTCOME, outcome, n)
            )
        for (queue, outcome), taken in sorted(self.samples.items()):
            for offset, epoch in taken:
                self.rows.append(
                    ("sample", None, queue, None, offset, epoch, message_id(queue, offset, epoch), None, None,
                     *self._BEFORE_OUTCOME, outcome, None)
                )  # fmt: skip
        self.outcomes, self.samples = {}, {}


def replay_slot(ctx: Context, rows: list[tuple[Any, ...]], out: Output) -> None:
    """Every row of one (queue, offset, epoch), events in id order (table rows first)."""
    queue, offset, epoch = rows[0][QUEUE], rows[0][OFFSET], rows[0][EPOCH]
    publishes, pub_id, pub_time, again_id = 0, None, None, None
    for row in rows:
        if row[SRC] != "e":
            continue
        kind = row[KIND]
        if kind == "published":
            reason = row[REASON]
            if reason is not None and reason.startswith(COPY_PREFIXES):
                out.traced("copy", row)
            if ctx.in_window(row[TIME]):
                publishes += 1
                if publishes == 2:
                    again_id = row[ID]
                pub_id = row[ID] if pub_id is None else min(pub_id, row[ID])
                pub_time = row[TIME] if pub_time is None else min(pub_time, row[TIME])
        elif kind in CAUSES:
            if kind == "dead_lettered":
                traced = row[GROUP] is not None
            elif kind == "redriven":
                traced = True
            else:  # an expiry or a drop is a cause only when routed to dead-letter queues
                traced = row[GROUP] is None and " -> " in (row[REASON] or "")
            if traced:
                out.traced("cause", row)
    published = publishes > 0
    if ctx.windowed and not published:
        return  # outside the audited window
    mode = ctx.mode(queue, epoch)
    # The policy row belongs to the queue as declared now: older incarnations are checked without
    # one, as a queue with no row is.
    max_attempts = ctx.max_attempts.get(queue) if epoch == 0 else None
    visibility_ms = ctx.visibility_ms.get(queue) if epoch == 0 else None
    lives: dict[str, Life] = {}
    pending: dict[str, tuple[Any, ...]] = {}
    live = False
    removal: tuple[Any, ...] | None = None  # the queue-level removal event (REMOVALS)
    latest: tuple[Any, ...] | None = None  # the event stamped latest so far
    for row in rows:
        src = row[SRC]
        if src == "m":
            live = True
            continue
        if src == "p":
            pending[row[GROUP]] = row
            continue
        group, kind, time = row[GROUP], row[KIND], row[TIME]
        if time is not None:
            if latest is not None and time < latest[TIME] - CLOCK_SLACK_MS:
                out.violation(
                    "time_ordered", queue, group, offset, epoch, row[ID],
                    f"{kind} stamped {latest[TIME] - time} ms before the {latest[KIND]} logged ahead of it "
                    f"(event {latest[ID]})",
                )  # fmt: skip
            if latest is None or time > latest[TIME]:
                latest = row
        if group is None:
            if kind in REMOVALS and epoch == 0:
                if removal is None:
                    removal = row
                else:  # the broker removes a message once (``Letters.remove``)
                    out.violation(
                        "single_fate", queue, None, offset, epoch, row[ID],
                        f"{kind} after it was already {removal[KIND]} (event {removal[ID]})",
                    )  # fmt: skip
            continue
        if kind not in GROUP_KINDS or mode != "work":
            continue
        life = lives.get(group)
        if life is None:
            life = lives[group] = Life()
        for invariant, detail in life.step(row, max_attempts, visibility_ms):
            out.violation(invariant, queue, group, offset, epoch, row[ID], detail)

    for group, life in lives.items():
        if life.acks > 1:
            out.violation(
                "acked_once", queue, group, offset, epoch, life.again_id, f"acked {life.acks} times"
            )
        if life.clash_id is not None:
            out.violation(
                "single_fate", queue, group, offset, epoch, life.clash_id,
                f"{life.clash_kind} after it was already {life.fate} (event {life.fate_id})",
            )  # fmt: skip
        if not published:  # (only reached when no window is set)
            out.violation(
                "accounted", queue, group, offset, epoch, None,
                f"group history ({life.last_kind}) but no published event",
            )  # fmt: skip
    if epoch != 0 or not published:
        for group, life in lives.items():
            out.life(queue, epoch, group, offset, life, pub_time)
        if epoch != 0:
            if published:
                out.count(queue, None, "deleted")
            return  # older incarnations are replayed, not compared with the live tables
        if live and not ctx.windowed:
            out.violation("live_state", queue, None, offset, 0, None, "in queue_messages but never published")
        _check_pending(ctx, queue, offset, lives, pending, None, None, out)
        return

    removed_by: str | None = None
    removed_id: int | None = None
    copy: str | None = None
    if removal is not None:
        removed_by, removed_id = removal[KIND], removal[ID]
        copy = _copies(removal[REASON])
    else:
        purge_id = ctx.purge_ids.get(queue)
        if purge_id is not None and pub_id is not None and pub_id < purge_id:
            removed_by, removed_id = "purged", purge_id
    removed = removed_by is not None
    out.messages += 1
    out.live += live
    out.removed += removed
    lines, lost = _ledger(ctx, queue, offset, mode, live, removed_by, removed_id, copy, pub_id, lives, out)
    for group, life in lives.items():
        fate, copied = lines.get(group, (None, None))
        out.life(queue, epoch, group, offset, life, pub_time, fate, copied)
    for group, (fate, copied) in lines.items():
        if group not in lives:
            out.ledger(queue, group, offset, pub_time, fate, copied)
    _check_message(
        ctx, queue, offset, mode, publishes, again_id, live, removed, removed_by, lines, pending, out
    )
    _outcomes(queue, offset, live, removed_by, lost, lines, lives, out)
    _check_pending(ctx, queue, offset, lives, pending, live, removed, out)


def _copies(reason: str | None) -> str | None:
    """The copies a removal or dead letter names: what follows " -> " in its reason."""
    if reason is None:
        return None
    _, arrow, where = reason.partition("-> ")
    return where or None if arrow else None


def _ledger(
    ctx: Context, queue: str, offset: int, mode: str, live: bool, removed_by: str | None,
    removed_id: int | None, copy: str | None, pub_id: int | None, lives: dict[str, Life], out: Output,
) -> tuple[dict[str | None, tuple[str, str | None]], bool]:  # fmt: skip
    """The live incarnation's message's ledger: a (fate, copy) per group that existed while it was
    live (None: the queue's own line, when there is no such group), and whether it is unaccounted.
    A line with no fate in the events and the message gone from queue_messages breaks
    ``accounted``, whatever the cursor says."""
    groups = ctx.groups.get(queue, {})
    firsts = ctx.firsts.get(queue, {})
    lines: dict[str | None, tuple[str, str | None]] = {}
    lost: list[tuple[str | None, str]] = []
    if mode == "stream":
        committed = ctx.committed.get(queue, {})
        for group, cursor in groups.items():
            position = committed.get(group)
            if position is not None and offset < position:
                lines[group] = ("acked", None)
            elif removed_by is not None:
                lines[group] = (removed_by, copy)
            elif live:
                lines[group] = ("pending" if cursor is not None and offset < cursor else "ahead", None)
            else:
                lines[group] = ("lost", None)
        if not live and removed_by is None:
            lost.append((None, "stream message gone from queue_messages without a drop, expiry or purge"))
    else:
        # When the message was gone: the last group's fate (or its removal), for groups that never
        # touched it. A group with an event before then existed while it was live.
        gone_id = removed_id
        if gone_id is None and not live:
            fated = [life.fate_id for life in lives.values() if life.fate_id is not None]
            gone_id = max(fated) if fated else None
        for group in groups.keys() | lives.keys():
            life = lives.get(group)
            if life is not None and life.fate is not None:
                fate = life.fate
                lines[group] = (fate, _copies(life.fate_reason) if fate == "dead_lettered" else None)
                continue
            if life is not None and life.status == FINISHED:
                # Rejected, or nacked at its last attempt: the group held it until its dead letter.
                if removed_by is not None:
                    lines[group] = (removed_by, copy)
                else:
                    lines[group] = ("lost", None)
                    attempt = "?" if life.prev_attempt is None else life.prev_attempt
                    lost.append(
                        (group, f"{life.last_kind} at attempt {attempt} ({life.last_reason or 'no reason'}) "
                                "but no dead_lettered or dropped event")
                    )  # fmt: skip
                continue
            if life is not None:  # held, or waiting to be delivered again
                if removed_by is not None:
                    lines[group] = (removed_by, copy)
                elif live:
                    lines[group] = ("pending", None)
                else:
                    lines[group] = ("lost", None)
                    lost.append((group, f"gone from queue_messages while the group's copy was {life.status}"))
                continue
            cursor = groups.get(group)
            first, low = firsts.get(group, (None, None))
            ahead = cursor is None or offset >= cursor
            before = first is not None and pub_id is not None and first < pub_id  # there at publication
            # There before it was gone, and not started past it (a start position: "last", an offset)
            during = first is not None and gone_id is not None and first < gone_id and low is not None
            existed = ahead or before or (during and low < offset)  # type: ignore[operator]
            if not existed:
                continue  # began after it was gone, or was started past it
            if removed_by is not None:
                lines[group] = (removed_by, copy)
            elif live and ahead:
                lines[group] = ("ahead", None)
            else:
                lines[group] = ("lost", None)
                why = (
                    "gone from queue_messages before the group read it"
                    if ahead
                    else f"the group's cursor {cursor} passed it with no event for it"
                )
                lost.append((group, why))
        if not lines:
            whole = removed_by or ("pending" if live else "lost")
            lines[None] = (whole, copy)
            if whole == "lost":
                lost.append((None, "gone from queue_messages with no fate in the events"))
    for owner, why in lost:
        out.violation("accounted", queue, owner, offset, 0, None, why)
    return lines, bool(lost)


def _check_message(
    ctx: Context, queue: str, offset: int, mode: str, publishes: int, again_id: int | None, live: bool,
    removed: bool, removed_by: str | None, lines: dict[str | None, tuple[str, str | None]],
    pending: dict[str, tuple[Any, ...]], out: Output,
) -> None:  # fmt: skip
    """The live incarnation's message: published once, and in queue_messages exactly while needed
    (a work queue's message until every group's line is final: those with none began after it)."""
    if live and not removed and mode == "work":
        _check_finished(queue, offset, lines, pending, out)
    if publishes > 1:
        out.violation(
            "published_once",
            queue,
            None,
            offset,
            0,
            again_id,
            f"published {publishes} times under one offset",
        )
    if live and removed:
        why = f"still in queue_messages after {removed_by or 'a purge'}"
        out.violation("live_state", queue, None, offset, 0, None, why)
    next_offset = ctx.next_offset.get(queue)
    if next_offset is not None and offset >= next_offset:
        out.violation(
            "live_state",
            queue,
            None,
            offset,
            0,
            None,
            f"offset at or past the queue's next_offset {next_offset}",
        )


def _check_finished(
    queue: str, offset: int, lines: dict[str | None, tuple[str, str | None]],
    pending: dict[str, tuple[Any, ...]], out: Output,
) -> None:  # fmt: skip
    """A work queue's message still stored (live, not removed) must still be owed to a group that
    existed while it was live: one that finished it (acked, dead-lettered, dropped) needs it no
    more, and a group that began after it has no line. A stream keeps its messages by retention,
    and is not asked. In shared mode the compaction deletes a message once every group's 'done'
    marker is in queue_pending; until its next pass the message is stored with them, so a message
    whose every group left its marker is not flagged (a single node drops it with its last ack, and
    leaves no such markers; nor is it flagged when it does)."""
    fates = {group: fate for group, (fate, _copy) in lines.items() if group is not None}
    if not fates or not all(fate in FINAL for fate in fates.values()):
        return
    if all(group in pending and pending[group][STATE] == "done" for group in fates):
        return  # awaiting the compaction
    done = ", ".join(f"{group} {fate}" for group, fate in sorted(fates.items()))
    out.violation(
        "finished_removed", queue, None, offset, 0, None,
        f"still in queue_messages though every group finished it ({done})",
    )  # fmt: skip


def _outcomes(
    queue: str, offset: int, live: bool, removed_by: str | None, lost: bool,
    lines: dict[str | None, tuple[str, str | None]], lives: dict[str, Life], out: Output,
) -> None:  # fmt: skip
    """Count the ledger's lines per (queue, group) and the message on its queue's row, and sample it
    under its rarest outcome."""
    out.count(queue, None, "published")
    seen: set[str] = set()
    for group, (fate, _copy) in lines.items():
        seen.add(fate)
        if group is None:
            continue
        out.count(queue, group, "published")
        out.count(queue, group, fate)
        life = lives.get(group)
        if life is not None and life.deliveries > 1:
            out.count(queue, group, "redelivered")
            seen.add("redelivered")
    if removed_by is not None:
        whole = removed_by
    elif lost:
        whole = "lost"
    else:
        whole = "stored" if live else "finished"
    out.count(queue, None, whole)
    for outcome in _SAMPLE_ORDER:
        if outcome in seen:
            out.sample(queue, offset, 0, outcome)
            break


_LAST = 2**63 - 1  # past every offset: bisect's key for "spans starting at or before"


def _spanned(spans: list[tuple[int, int]] | None, offset: int) -> bool:
    """Whether one of a group's spans (offset order, not overlapping) holds ``offset``."""
    if not spans:
        return False
    at = bisect.bisect_right(spans, (offset, _LAST)) - 1
    return at >= 0 and spans[at][1] >= offset


def _check_pending(
    ctx: Context, queue: str, offset: int, lives: dict[str, Life], pending: dict[str, tuple[Any, ...]],
    live: bool | None, removed: bool | None, out: Output,
) -> None:  # fmt: skip
    """Replayed open entries against queue_pending, per group (live: None when never published)."""
    cursors = ctx.groups.get(queue, {})
    # The broker keeps no row for a first delivery of a queue's only group (WorkGroup.deliver,
    # held_at_start), nor for one a shared node holds by a span
    alone = len(cursors.keys() | lives.keys()) <= 1
    spans = ctx.spans.get(queue, {})
    for group in sorted(lives.keys() | pending.keys()):
        life = lives.get(group)
        row = pending.get(group)
        status = life.status if life is not None else None
        attempts = life.attempts if life is not None else None
        live_state = row[STATE] if row is not None else None
        live_attempts = row[ATTEMPT] if row is not None else None
        is_open = status in ("held", "wait") and not removed
        live_open = live_state in ("held", "wait")
        replayed = status or "never delivered"
        cursor = cursors.get(group)
        problem: str | None = None
        first_held = status == "held" and attempts == 1 and (alone or _spanned(spans.get(group), offset))
        if is_open and live_state is None and live and not first_held:
            problem = f"replay: {status} attempt {_text(attempts)}; no pending row"
        elif live_open and not is_open:
            problem = f"pending row {live_state} but replay: {replayed}"
        elif is_open and live_open and status != live_state:
            problem = f"pending row {live_state} but replay: {status}"
        elif (
            is_open
            and live_open
            and attempts is not None
            and live_attempts is not None
            and attempts != live_attempts
        ):
            problem = f"pending row attempts {live_attempts} but replay: {attempts}"
        elif (
            is_open and status == "held" and live_state == "held" and life is not None and row is not None
            and life.holder is not None and row[CONSUMER] is not None and life.holder != row[CONSUMER]
        ):  # fmt: skip
            problem = f"held by {row[CONSUMER]} but replay: {life.holder}"
        elif live_state == "done" and status != FINISHED:
            problem = f"pending row done but replay: {replayed}"
        elif (
            status == FINISHED and live_state is None and live and not removed
            and cursor is not None and offset >= cursor
        ):  # fmt: skip
            problem = "finished ahead of the cursor but no done row"
        if problem is not None:
            out.violation("live_state", queue, group, offset, 0, None, problem)


def replay_partition(
    ctx: Context, rows: Iterable[tuple[Any, ...]], batch_rows: int = 8192
) -> Iterator[Output]:
    """Replay a partition's rows, sorted by (queue, offset, epoch, id); yields filled outputs."""
    out = Output()
    slot: list[tuple[Any, ...]] = []
    key: tuple[Any, ...] | None = None
    for row in rows:
        here = (row[QUEUE], row[OFFSET], row[EPOCH])
        if here != key:
            if slot:
                replay_slot(ctx, slot, out)
                if len(out.rows) >= batch_rows:
                    yield out
                    out = out.next()
            slot = []
            key = here
        slot.append(row)
    if slot:
        replay_slot(ctx, slot, out)
    out.totals()
    yield out
