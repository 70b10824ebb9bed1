"""Durable queue repository: loading state at start, and the statements the writer runs as calls.

The queue manager never imports SQLAlchemy: it gets plain dicts and tuples from here, and hands
callables built here to the writer (``WriteBatch.calls``) for anything beyond the hot-path rows.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Container, Iterator
from typing import Any, NamedTuple

from sqlalchemy import Connection, Engine, and_, delete, func, insert, not_, or_, select, text, update
from sqlalchemy.dialects.postgresql import insert as pg_insert

from trimaran.broker.message import Message
from trimaran.storage import schema
from trimaran.storage.rows import FIRST, MESSAGE_COLUMNS, RUN_COLUMNS, SPAN_MAX, SPANNED, Claimed, held_spans
from trimaran.storage.schema import (
    queue_events,
    queue_groups,
    queue_messages,
    queue_pending,
    queue_spans,
    queues,
)
from trimaran.storage.serialize import message_from
from trimaran.vhosts import vhost_of

Call = Callable[[Connection], Any]


# The hot rows are rows.py's (compiled with the hot modules); the tables' column orders they follow:
assert tuple(c.name for c in queue_messages.columns) == MESSAGE_COLUMNS
assert tuple(c.name for c in queue_events.columns if c.name not in ("id", "offset", "span")) == RUN_COLUMNS
assert SPAN_MAX == schema.SPAN_MAX


def row_message(row: Any) -> Message:
    return message_from(row.topic, row.payload, row.qos, False, row.properties)


# -- calls run by the writer ----------------------------------------------------------------------


def upsert_queue(name: str, mode: str, policy: dict[str, Any], created_at: int) -> Call:
    """Create the queue row or update its mode and policy; returns the stored next_offset."""
    policy_text = json.dumps(policy, separators=(",", ":"), sort_keys=True)

    def call(connection: Connection) -> int:
        row = connection.execute(select(queues.c.next_offset).where(queues.c.name == name)).first()
        if row is None:
            connection.execute(
                insert(queues).values(
                    name=name,
                    mode=mode,
                    policy=policy_text,
                    next_offset=0,
                    created_at=created_at,
                    vhost=vhost_of(name),
                )
            )
            return 0
        connection.execute(update(queues).where(queues.c.name == name).values(mode=mode, policy=policy_text))
        return int(row.next_offset)

    return call


def delete_queue(name: str) -> Call:
    def call(connection: Connection) -> None:
        for table in (queue_messages, queue_groups, queue_pending, queue_spans):
            connection.execute(delete(table).where(table.c.queue == name))
        connection.execute(delete(queues).where(queues.c.name == name))

    return call


def purge_queue(name: str) -> Call:
    """Remove every message and pending entry; cursors stay (offsets are never reused)."""

    def call(connection: Connection) -> int:
        count = connection.execute(delete(queue_messages).where(queue_messages.c.queue == name)).rowcount
        connection.execute(delete(queue_pending).where(queue_pending.c.queue == name))
        connection.execute(delete(queue_spans).where(queue_spans.c.queue == name))
        return int(count or 0)

    return call


# One statement text for every reservation: built once, not per block (a few per second per queue).
_RESERVE = text("UPDATE queues SET next_offset = next_offset + :n WHERE name = :q RETURNING next_offset")


def reserve_offsets(name: str, count: int) -> Call:
    """Shared mode: reserve ``count`` offsets; returns the first. The row lock orders the nodes."""

    def call(connection: Connection) -> int:
        end = int(connection.execute(_RESERVE, {"n": count, "q": name}).scalar_one())
        return end - count

    return call


# -- loading at start -------------------------------------------------------------------------------


def load_queues(engine: Engine) -> list[dict[str, Any]]:
    with engine.connect() as connection:
        rows = connection.execute(select(queues).order_by(queues.c.name)).all()
        result = []
        for row in rows:
            high = connection.execute(
                select(func.max(queue_messages.c.offset)).where(queue_messages.c.queue == row.name)
            ).scalar()
            next_offset = max(int(row.next_offset), int(high) + 1 if high is not None else 0)
            result.append(
                {
                    "name": row.name,
                    "mode": row.mode,
                    "policy": json.loads(row.policy),
                    "next_offset": next_offset,
                    "created_at": int(row.created_at),
                }
            )
    return result


def load_groups(engine: Engine, queue: str) -> list[Any]:
    with engine.connect() as connection:
        return list(connection.execute(select(queue_groups).where(queue_groups.c.queue == queue)).all())


def load_pending(engine: Engine, queue: str) -> list[Any]:
    with engine.connect() as connection:
        stmt = (
            select(queue_pending)
            .where(queue_pending.c.queue == queue)
            .order_by(queue_pending.c.group, queue_pending.c.offset)
        )
        return list(connection.execute(stmt).all())


def iter_messages(engine: Engine, queue: str, page: int = 1000, after: int = -1) -> Iterator[list[Any]]:
    """Every stored message of a queue in offset order, read in pages (keyset pagination)."""
    while True:
        with engine.connect() as connection:
            stmt = (
                select(queue_messages)
                .where(and_(queue_messages.c.queue == queue, queue_messages.c.offset > after))
                .order_by(queue_messages.c.offset)
                .limit(page)
            )
            rows = list(connection.execute(stmt).all())
        if not rows:
            return
        yield rows
        after = int(rows[-1].offset)
        if len(rows) < page:
            return


def count_events(engine: Engine, queue: str | None = None) -> dict[str, int]:
    """Events per kind (tests and the admin API); a row counts as the events it spans."""
    with engine.connect() as connection:
        stmt = select(queue_events.c.kind, func.sum(queue_events.c.span)).group_by(queue_events.c.kind)
        if queue is not None:
            stmt = stmt.where(queue_events.c.queue == queue)
        return {str(kind): int(n) for kind, n in connection.execute(stmt).all()}


def events_for(engine: Engine, queue: str, offset: int | None = None) -> list[dict[str, Any]]:
    """A queue's events (of one offset) in order, one dict per event: spans are expanded."""
    with engine.connect() as connection:
        stmt = select(queue_events).where(queue_events.c.queue == queue).order_by(queue_events.c.id)
        if offset is not None:
            stmt = stmt.where(
                queue_events.c.offset > offset - SPAN_MAX,
                queue_events.c.offset <= offset,
                queue_events.c.offset + queue_events.c.span > offset,
            )
        events = [e for row in connection.execute(stmt).all() for e in expand_event(dict(row._mapping))]
        return events if offset is None else [e for e in events if e["offset"] == offset]


def expand_event(event: dict[str, Any]) -> list[dict[str, Any]]:
    """An event row (or a journal's event) as one event per offset it spans, without ``span``."""
    span = event.get("span", 1)
    if "span" in event:
        event = {key: value for key, value in event.items() if key != "span"}
    first = event["offset"]
    if span == 1 or first is None:
        return [event]
    return [{**event, "offset": first + i} for i in range(span)]


def stored_offsets(engine: Engine, queue: str) -> list[int]:
    with engine.connect() as connection:
        stmt = (
            select(queue_messages.c.offset)
            .where(queue_messages.c.queue == queue)
            .order_by(queue_messages.c.offset)
        )
        return [int(o) for o in connection.execute(stmt).scalars()]


def pending_rows(engine: Engine, queue: str) -> list[dict[str, Any]]:
    with engine.connect() as connection:
        stmt = select(queue_pending).where(queue_pending.c.queue == queue).order_by(queue_pending.c.offset)
        return [dict(row._mapping) for row in connection.execute(stmt).all()]


def span_rows(engine: Engine, queue: str) -> list[dict[str, Any]]:
    """Shared mode: the queue's spans (``schema.queue_spans``), in offset order."""
    with engine.connect() as connection:
        stmt = select(queue_spans).where(queue_spans.c.queue == queue).order_by(queue_spans.c.first_offset)
        return [dict(row._mapping) for row in connection.execute(stmt).all()]


# -- shared mode: several nodes on one PostgreSQL database -----------------------------------------
#
# A node delivers only messages it has claimed: a claim of a message delivered before turns its
# queue_pending row into state 'held' with this node's name and a lease; a new message (one the group
# has no row for) is held by a span of offsets under a lease instead (schema.queue_spans), whether the
# node claims it as it publishes it or later from the table (_NEW, _TAKEN), and a claim of new
# messages passes over what a span holds. A filtered claim inserts 'held' rows for what it picks,
# whose primary key makes a second node's insert a no-op. Claims are taken in batches, so the cost is
# per batch, not per message. A node that dies stops renewing its leases and what it held is claimed
# again by the others once lease_until has passed (_ADOPT_SPANS turns its spans into rows).

_CLAIM_AGAIN = text(
    """
    WITH c AS (
        SELECT "offset", state AS old_state FROM queue_pending
        WHERE queue = :q AND "group" = :g
          AND ((state = 'wait' AND available_at <= :now) OR (state = 'held' AND lease_until < :now))
        ORDER BY "offset" LIMIT :n
        FOR UPDATE SKIP LOCKED
    )
    UPDATE queue_pending p
    SET state = 'held', node = :node, consumer = NULL, lease_until = :lease
    FROM c
    WHERE p.queue = :q AND p."group" = :g AND p."offset" = c."offset"
    RETURNING p."offset", p.attempts, p.unsent, p.returned, c.old_state, p.reason
    """
)

# New messages are claimed in two steps. _NEW locks them (SKIP LOCKED: what another claim is
# taking is passed over); then _TAKEN, whose snapshot is taken once every lock is held, reads what
# holds their range now, and what a claim that committed meanwhile took (its lock released, _NEW's
# older snapshot did not see its span or row) is dropped; the rest is held by spans, one per run of
# consecutive offsets: a span's offsets are all claimed, so no message committed later can fall
# inside one. One span row a run, where a pending row a message was inserted and deleted again.
_NEW = text(
    """
    SELECT m."offset" FROM queue_messages m
    WHERE m.queue = :q
      AND (
          SELECT 1 FROM queue_pending p
          WHERE p.queue = m.queue AND p."group" = :g AND p."offset" = m."offset"
      ) IS NULL
      AND m."offset" > :after AND m."offset" < :below
      AND NOT coalesce((
          SELECT s.last_offset >= m."offset" FROM queue_spans s
          WHERE s.queue = :q AND s."group" = :g AND s.first_offset <= m."offset"
          ORDER BY s.first_offset DESC LIMIT 1
      ), false)
    ORDER BY m."offset" LIMIT :n
    FOR UPDATE OF m SKIP LOCKED
    """
)
# The group's spans and rows over [lo, hi]: spans do not overlap, so those that reach into it are
# the last one starting at or before lo and those starting inside. Two range scans and a probe,
# where a probe of each offset cost as much as _NEW itself.
_TAKEN = text(
    """
    SELECT first_offset, last_offset FROM queue_spans
    WHERE queue = :q AND "group" = :g AND first_offset > :lo AND first_offset <= :hi
    UNION ALL (
        SELECT first_offset, last_offset FROM queue_spans
        WHERE queue = :q AND "group" = :g AND first_offset <= :lo
        ORDER BY first_offset DESC LIMIT 1
    )
    UNION ALL
    SELECT "offset", "offset" FROM queue_pending
    WHERE queue = :q AND "group" = :g AND "offset" BETWEEN :lo AND :hi
    """
)


def _hold_by_spans(connection: Connection, params: dict[str, Any], locked: list[int]) -> list[int]:
    """Of the new messages _NEW locked (in offset order), those no claim took since its snapshot,
    held now by spans of this node; returns them."""
    taken = connection.execute(_TAKEN, {**params, "lo": locked[0], "hi": locked[-1]}).all()
    if taken:
        points = {int(first) for first, last in taken if first == last}
        ranges = [(int(first), int(last)) for first, last in taken if first != last]
        locked = [o for o in locked if o not in points and not any(f <= o <= last for f, last in ranges)]
    if locked:
        held = {(params["q"], params["g"], params["node"], params["lease"]): locked}
        columns = ("queue", "group", "first_offset", "last_offset", "node", "lease_until")
        spans = [dict(zip(columns, row, strict=True)) for row in held_spans(held, {})]
        connection.execute(insert(queue_spans), spans)
    return locked


# A span whose lease ran out (its node went): 'wait' rows for the messages it held with none of
# their own, counting the delivery its node may have made (as queue_store._again does for a held
# row's), and the span goes. Spans do not overlap (each is one node's claim of new offsets), so
# a message has at most one.
_ADOPT_SPANS = text(
    """
    WITH gone AS (
        DELETE FROM queue_spans
        WHERE queue = :q AND "group" = :g AND lease_until < :now
        RETURNING first_offset, last_offset
    )
    INSERT INTO queue_pending
        (queue, "group", "offset", state, consumer, node, delivered_at, attempts, available_at,
         lease_until, reason, unsent, returned)
    SELECT :q, :g, m."offset", 'wait', NULL, NULL, NULL, 1, :now, NULL, 'lease_expired', 0, 0
    FROM gone JOIN queue_messages m
        ON m.queue = :q AND m."offset" BETWEEN gone.first_offset AND gone.last_offset
    ON CONFLICT DO NOTHING
    """
)

# jit too: the disabled plans' costs (1e10) pass jit_above_cost, and a claim's sort of a few
# hundred offsets was JIT-compiled for 190 ms each claim.
_PLANNER = ("enable_sort", "enable_mergejoin", "enable_hashjoin", "enable_bitmapscan", "jit")
_WALK_IN_ORDER = text("; ".join(f"SET LOCAL {p} = off" for p in _PLANNER))
_PLAN_AS_USUAL = text("; ".join(f"SET LOCAL {p} TO DEFAULT" for p in _PLANNER))

_ENSURE_GROUP = text(
    """
    INSERT INTO queue_groups (queue, "group", cursor, committed, updated_at)
    VALUES (:q, :g, 0, 0, :now) ON CONFLICT DO NOTHING
    """
)
_HAS_GROUP = text('SELECT 1 FROM queue_groups WHERE queue = :q AND "group" = :g')
# A node making a group holds the queue row until its commit: a commit of what a group that
# believed itself alone finished (writer._finish_alone_pg) takes it shared, and so either deletes
# before this claim looks or sees this group and leaves 'done' markers instead.
_LOCK_QUEUE = text("SELECT 1 FROM queues WHERE name = :q FOR UPDATE")


def _again(r: Any) -> Claimed:
    """A claimable row claimed again: lease run out (its node went), or waiting for its turn. A
    node writes no row for a first delivery of what it claimed (``WorkGroup.deliver``): a held row
    whose lease ran out counts that delivery, which may have been made (redelivered, as RabbitMQ
    marks what a consumer that went may have seen)."""
    if r.old_state == "held":
        return Claimed(max(int(r.attempts), 1), int(r.unsent), int(r.returned), "lease_expired")
    return Claimed(int(r.attempts), int(r.unsent), int(r.returned), r.reason or "released")


#: Whether a claiming node's consumers take a message, by its routing key and the message.
Wants = Callable[[str, Message], bool]
ALL_OFFSETS = 2**63 - 1  # no bound above: a claim walks to the end
CLAIM_SCAN = 10_000  # most messages a filtered claim walks past (work.SCAN_LIMIT, a take's)
_CLAIM_PAGE = 500  # messages a filtered claim reads at once


def claim(
    queue: str,
    group: str,
    node: str,
    limit: int,
    now: int,
    lease_until: int,
    wants: Wants | None = None,
    *,
    after: int = -1,
    below: int = ALL_OFFSETS,
    resume: int = -1,
    known: Container[int] = (),
) -> Call:
    """Claim up to ``limit`` messages for a group; returns [(row, Claimed)] in offset order.
    ``known``: messages the claiming node holds (its own publishes left unclaimed): a new one of
    those claimed comes back as a :class:`Known`, its row not read.
    ``wants``: only the messages it takes (the claiming node's consumers' filters and selectors),
    walking past the others (left to other nodes), as a take walks past what its consumer refuses.
    ``after``: new messages (never claimed) only past this offset (the filtered walk ignores it);
    with ``below``, only those below it and those past ``resume`` (``Claims.walk``)."""

    def call(connection: Connection) -> list[tuple[Any, Claimed]]:
        params = {"q": queue, "g": group, "node": node, "n": limit, "now": now, "lease": lease_until}
        if connection.execute(_HAS_GROUP, params).first() is None:
            connection.execute(_LOCK_QUEUE, params)
            connection.execute(_ENSURE_GROUP, params)
        connection.execute(_ADOPT_SPANS, params)
        # Walk the messages by their key and stop at the limit: with a young table's statistics the
        # planner sorted (or bitmap-scanned) every message of the queue for each claim instead, O(backlog):
        # 30 ms a claim at 40,000 queued, the commit waiting behind it.
        connection.execute(_WALK_IN_ORDER)
        if wants is not None:
            wanted = _claim_wanted(connection, params, wants)
            connection.execute(_PLAN_AS_USUAL)
            return wanted
        claimed: dict[int, Claimed] = {}
        for row in connection.execute(_CLAIM_AGAIN, params):
            claimed[int(row.offset)] = _again(row)
        walks = [(after, below)] if after < below - 1 else []
        if below != ALL_OFFSETS:
            walks.append((resume, ALL_OFFSETS))
        locked: list[int] = []
        for start, end in walks:
            if len(claimed) + len(locked) >= limit:
                break
            params.update(after=start, below=end, n=limit - len(claimed) - len(locked))
            locked += [int(o) for (o,) in connection.execute(_NEW, params)]
        for offset in _hold_by_spans(connection, params, locked) if locked else ():
            claimed[offset] = SPANNED
        have = {o for o, got in claimed.items() if got is SPANNED and o in known} if known else set()
        read = [o for o in claimed if o not in have] if have else list(claimed)
        rows: list[Any] = _claimed_rows(connection, queue, read) if read else []
        connection.execute(_PLAN_AS_USUAL)
        if not claimed:
            return []
        if len(rows) < len(read):  # deleted meanwhile (purge, expiry elsewhere): drop the claims
            found = {int(r.offset) for r in rows}
            missing = [o for o in read if o not in found]
            connection.execute(
                delete(queue_pending).where(
                    and_(
                        queue_pending.c.queue == queue,
                        queue_pending.c.group == group,
                        queue_pending.c.offset.in_(missing),
                    )
                )
            )
        if have:  # locked by the claim: there (read or not)
            rows = sorted([*rows, *map(Known, have)], key=lambda r: int(r.offset))
        return [(r, claimed[int(r.offset)]) for r in rows]

    return call


def _claim_wanted(connection: Connection, params: dict[str, Any], wants: Wants) -> list[tuple[Any, Claimed]]:
    """A filtered claim: the waiting (or lease-expired) rows and then the messages the group has no
    row for are read with their messages a page at a time, without a lock, and only those ``wants``
    takes are claimed, each locked (SKIP LOCKED) and checked again as it is: what the claim walks
    past is never locked, so the other nodes' claims take it meanwhile. A row whose message is gone
    is passed over (an unfiltered claim drops it)."""
    p, m = queue_pending, queue_messages
    queue, group, limit = params["q"], params["g"], params["n"]
    again = (
        select(m)
        .join_from(p, m, and_(m.c.queue == p.c.queue, m.c.offset == p.c.offset))
        .where(p.c.queue == queue, p.c.group == group, _claimable(params["now"]))
    )
    unclaimed = select(m).where(m.c.queue == queue, _no_row(queue, group), _no_span(queue, group))
    claimed: list[tuple[Any, Claimed]] = []
    scanned = 0
    for stmt, key, claim_page in ((again, p.c.offset, _claim_again), (unclaimed, m.c.offset, _claim_new)):
        after = -1
        while len(claimed) < limit and scanned < CLAIM_SCAN:
            page = connection.execute(stmt.where(key > after).order_by(key).limit(_CLAIM_PAGE)).all()
            if not page:
                break
            scanned += len(page)
            after = int(page[-1].offset)
            chosen = {int(r.offset): r for r in page if wants(r.routing_key, row_message(r))}
            offsets = sorted(chosen)[: limit - len(claimed)]
            if offsets:
                claimed += [(chosen[o], got) for o, got in claim_page(connection, params, offsets)]
    claimed.sort(key=lambda c: int(c[0].offset))
    return claimed


def _claimable(now: int) -> Any:
    """A group's row another claim may take: waiting and due, or held under a lease run out."""
    p = queue_pending
    return or_(
        and_(p.c.state == "wait", p.c.available_at <= now), and_(p.c.state == "held", p.c.lease_until < now)
    )


def _no_row(queue: str, group: str) -> Any:
    """The message of the enclosing query has no row of the group: one probe of the primary key per
    message. Written as NOT EXISTS, PostgreSQL made it an anti-join that, with a young table's
    statistics, read every row of the group once and compared each message with all of them: 19 ms
    a claim over 542 messages in flight. A scalar subquery is never made a join."""
    p = queue_pending
    row = select(p.c.offset).where(
        p.c.queue == queue, p.c.group == group, p.c.offset == queue_messages.c.offset
    )
    return row.scalar_subquery().is_(None)


def _no_span(queue: str, group: str) -> Any:
    """The message of the enclosing query is held by no span of the group: the one span that
    starts at or before it (spans do not overlap) ends before it. One probe of the span key."""
    s, offset = queue_spans, queue_messages.c.offset
    covers = (
        select(s.c.last_offset >= offset)
        .where(s.c.queue == queue, s.c.group == group, s.c.first_offset <= offset)
        .order_by(s.c.first_offset.desc())
        .limit(1)
        .scalar_subquery()
    )
    return not_(func.coalesce(covers, False))


def _claim_again(
    connection: Connection, params: dict[str, Any], offsets: list[int]
) -> list[tuple[int, Claimed]]:
    """Of ``offsets``, the group's rows still claimable and not locked by another claim, held now."""
    p = queue_pending
    queue, group = params["q"], params["g"]
    locked = select(
        p.c.offset, p.c.state.label("old_state"), p.c.attempts, p.c.unsent, p.c.returned, p.c.reason
    ).where(p.c.queue == queue, p.c.group == group, p.c.offset.in_(offsets), _claimable(params["now"]))
    rows = connection.execute(locked.with_for_update(skip_locked=True)).all()
    if rows:
        connection.execute(
            update(p)
            .where(p.c.queue == queue, p.c.group == group, p.c.offset.in_([int(r.offset) for r in rows]))
            .values(state="held", node=params["node"], consumer=None, lease_until=params["lease"])
        )
    return [(int(r.offset), _again(r)) for r in rows]


def _claim_new(
    connection: Connection, params: dict[str, Any], offsets: list[int]
) -> list[tuple[int, Claimed]]:
    """Of ``offsets``, the messages the group still has no row for and no other claim has locked:
    their rows, held now (a row another node inserted first wins)."""
    m, p = queue_messages, queue_pending
    queue, group = params["q"], params["g"]
    free = select(m.c.offset).where(
        m.c.queue == queue, m.c.offset.in_(offsets), _no_row(queue, group), _no_span(queue, group)
    )
    ours = [int(o) for (o,) in connection.execute(free.with_for_update(of=m, skip_locked=True))]
    if not ours:
        return []
    rows = [
        {"queue": queue, "group": group, "offset": o, "state": "held", "consumer": None,
         "node": params["node"], "delivered_at": None, "attempts": 0, "available_at": None,
         "lease_until": params["lease"], "reason": "first", "unsent": 0, "returned": 0}
        for o in ours
    ]  # fmt: skip
    inserted = pg_insert(p).values(rows).on_conflict_do_nothing().returning(p.c.offset)
    return [(int(o), FIRST) for (o,) in connection.execute(inserted)]


_ROWS = text(
    """
    SELECT * FROM queue_messages
    WHERE queue = :q AND "offset" BETWEEN :lo AND :hi AND "offset" = ANY(CAST(:offsets AS bigint[]))
    ORDER BY "offset"
    """
)


def _claimed_rows(connection: Connection, queue: str, offsets: list[int]) -> list[Any]:
    """The claimed messages in offset order; the bounds put the key's range in the index condition
    instead of a filter over the whole queue. One array parameter: a list of a thousand bound
    values was compiled, and parsed by the driver, again for each claim."""
    params = {"q": queue, "lo": min(offsets), "hi": max(offsets), "offsets": offsets}
    return list(connection.execute(_ROWS, params).all())


class Known(NamedTuple):
    """A message :func:`claim` took that the claiming node holds already: no row read."""

    offset: int


def count_groups(queue: str) -> Call:
    """How many groups the queue has, on every node (their rows)."""

    def call(connection: Connection) -> int:
        return int(connection.execute(_groups(queue)).scalar_one())

    return call


def _groups(queue: str) -> Any:
    """How many groups ``queue`` has, on every node (their rows)."""
    return select(func.count()).select_from(queue_groups).where(queue_groups.c.queue == queue)


def _unfinished(connection: Connection, queue: str, *where: Any) -> Any:
    """The stored messages of ``queue`` (and ``where``) that some group has not finished, in
    offset order: every group's 'done' markers wait for the compaction. A queue with no group yet
    keeps everything, as the compaction does."""
    m, p = queue_messages, queue_pending
    stmt = select(m).where(m.c.queue == queue, *where)
    groups = connection.execute(_groups(queue)).scalar_one()
    if groups:
        done = (
            select(func.count())
            .select_from(p)
            .where(p.c.queue == queue, p.c.offset == m.c.offset, p.c.state == "done")
            .scalar_subquery()
        )
        stmt = stmt.where(done < groups)
    return stmt.order_by(m.c.offset)


def browse(queue: str, first: int, limit: int) -> Call:
    """Shared mode: up to ``limit`` stored messages of a queue from offset ``first`` on that some
    group has not finished (:func:`_unfinished`): what a queue browser sees. Nothing is claimed or
    locked."""

    def call(connection: Connection) -> list[Any]:
        stmt = _unfinished(connection, queue, queue_messages.c.offset >= first)
        return list(connection.execute(stmt.limit(limit)).all())

    return call


# A node's spans none of whose messages is left to it: every one finished (deleted, or 'done'),
# handed back ('wait') or gone. One walk over each of its spans' offsets, at each renewal.
_SPANS_DONE = text(
    """
    DELETE FROM queue_spans s
    WHERE s.node = :node AND NOT EXISTS (
        SELECT 1 FROM queue_messages m
        WHERE m.queue = s.queue AND m."offset" BETWEEN s.first_offset AND s.last_offset
          AND (
              SELECT 1 FROM queue_pending p
              WHERE p.queue = m.queue AND p."group" = s."group" AND p."offset" = m."offset"
          ) IS NULL
    )
    """
)


def renew_leases(node: str, lease_until: int) -> Call:
    """Renew what ``node`` holds (its held rows and its spans), and delete its spans it holds
    nothing of any more. Returns how many held rows were renewed."""

    def call(connection: Connection) -> int:
        stmt = (
            update(queue_pending)
            .where(and_(queue_pending.c.node == node, queue_pending.c.state == "held"))
            .values(lease_until=lease_until)
        )
        renewed = int(connection.execute(stmt).rowcount or 0)
        connection.execute(_SPANS_DONE, {"node": node})
        spans = queue_spans
        connection.execute(update(spans).where(spans.c.node == node).values(lease_until=lease_until))
        return renewed

    return call


def drop_spans(node: str) -> Call:
    """``node`` stops, having handed back what it held: its spans of which nothing is left to it
    go (those of a node that could not hand back, its memory lost, stay under their leases)."""

    def call(connection: Connection) -> None:
        connection.execute(_SPANS_DONE, {"node": node})

    return call


_FINISHED = text(
    """
    SELECT p."offset" FROM queue_pending p
    WHERE p.queue = :q AND p.state = 'done'
    GROUP BY p."offset"
    HAVING count(*) >= (SELECT count(*) FROM queue_groups g WHERE g.queue = :q)
       AND EXISTS (SELECT 1 FROM queue_groups g WHERE g.queue = :q)
    """
)

_ORPHANS = text(
    """
    DELETE FROM queue_pending p
    WHERE p.queue = :q AND p.state = 'done'
      AND NOT EXISTS (SELECT 1 FROM queue_messages m WHERE m.queue = :q AND m."offset" = p."offset")
    """
)


def compact_shared(queue: str, *, orphans: bool = False) -> Call:
    """Delete the messages every group has finished, and their 'done' markers, found through the
    markers' own index (``ix_queue_pending_done``): the cost follows what was finished since the last
    compaction, not the backlog, so it runs at every poll. A queue with no group yet (a dead-letter
    queue nobody consumes) keeps everything: its first group starts there. The deletes take the
    offsets as a list, one index probe each: joined to the markers in one statement, a young table's
    statistics (a row expected where hundreds were) had PostgreSQL rescan the markers for every
    message, 30-60 ms a compaction.
    ``orphans``: also the markers whose message went another way (expired, purged, dead-lettered by
    a node that had not finished it), a walk over every marker of the queue, at each lease renewal.
    Returns how many messages were deleted."""

    def call(connection: Connection) -> int:
        params = {"q": queue}
        finished = [int(o) for (o,) in connection.execute(_FINISHED, params)]
        if finished:
            m, p = queue_messages, queue_pending
            connection.execute(delete(m).where(m.c.queue == queue, m.c.offset.in_(finished)))
            connection.execute(
                delete(p).where(p.c.queue == queue, p.c.state == "done", p.c.offset.in_(finished))
            )
        if orphans:
            connection.execute(_ORPHANS, params)
        return len(finished)

    return call


def append_reserving(row: dict[str, Any], event: dict[str, Any]) -> Call:
    """Shared mode: append a message taking its offset from the queue row (dead-lettering)."""

    def call(connection: Connection) -> int:
        offset = int(reserve_offsets(row["queue"], 1)(connection))
        connection.execute(insert(queue_messages).values(**{**row, "offset": offset}))
        connection.execute(insert(queue_events).values(**{**event, "offset": offset}))
        return offset

    return call


def peek_stored(queue: str, after: int, limit: int, now: int) -> Call:
    """Shared mode: the admin API's peek of a work queue. Up to ``limit`` stored messages past
    offset ``after``, in offset order: what ``browse`` reads (every group's 'done' aside), without
    those expired by ``now`` (one node's sweep removes them within a second; here they wait for a
    claim). Nothing is claimed or locked."""

    def call(connection: Connection) -> list[Any]:
        m = queue_messages
        unexpired = or_(m.c.expires_at.is_(None), m.c.expires_at > now)
        stmt = _unfinished(connection, queue, m.c.offset > after, unexpired)
        return list(connection.execute(stmt.limit(limit)).all())

    return call
