"""Group commit: one writer thread owns the database writes of the durable queues.

Callers on the event loop build a :class:`WriteBatch` (message appends, pending-entry changes, cursor
moves, events) and :meth:`GroupCommitWriter.submit` it; that only appends to a list and, when the
thread sleeps, wakes it once at the end of the loop's current turn (so every submission of that turn
rides along). There is no fixed gather wait: an idle writer commits at once, so a lone message costs
one fsync; while a commit is in flight the next batch gathers, so batches grow with the load. The
thread writes what it took (at most ``commit_batch_max`` rows) in ONE transaction with executemany
statements, and then hands the whole finished batch back to the event loop with one thread hop, where
every waiter is released and every ``on_commit`` callback runs in submission order.
``commit_interval_ms`` (0 by default) adds a gather wait only between back-to-back commits, never
after idleness.

A submission is atomic: it never straddles two transactions. If a merged transaction fails, each
submission is retried alone so that one bad submission cannot fail its neighbours.

A submission taken is never failed for the database being away (PostgreSQL restarting, a killed
connection): it waits, with those behind it, and is written again, in order, once the database
answers (backing off up to ``RETRY_MAX_S``). The event loop has moved on from what it submitted (a
delivery handed out, an ack taken), so failing those rows would leave the tables behind it, and an
early queue's message row is submitted before its delivery's and ack's. What may be refused is
refused at the door instead: while the database is away (a write failed twice running, the second
time on a new connection) a ``refusable`` submission (a publish, whose publisher hears of it) raises
:class:`WriterError` in :meth:`~GroupCommitWriter.submit`, so what waits is only what consumers
settle, bounded by what they hold. Closing while the database is away fails what waits.

Pending entries and group cursors are written as final states: within one transaction only the last
state of a key counts (a delivery acknowledged in the same batch writes nothing but the delete), and a
message appended and deleted in the same transaction is written not at all, nor is its row built, nor
the delete of a pending entry it cannot have had (its events still are). Adjacent events on
consecutive offsets that differ in nothing else are written as one row spanning them (a run of
publishes, a dispatch's deliveries, a multiple ack): a message costs a fraction of an event row.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
import threading
import time
import weakref
from collections.abc import Callable
from itertools import chain, islice
from operator import itemgetter
from typing import Any

import anyio
import anyio.from_thread
import anyio.lowlevel
from sqlalchemy import Connection, Engine

from trimaran.storage.engine import availability, is_unavailable
from trimaran.storage.pg_arrays import packed
from trimaran.storage.pg_arrays import register as register_arrays
from trimaran.storage.rows import (
    MESSAGE_COLUMNS,
    RUN_COLUMNS,
    GroupKey,
    PendingKey,
    PendingRow,
    WriteBatch,
    event_rows,
    held_spans,
    message_tuples,
    without_transients,
)
from trimaran.storage.schema import queue_events, queue_groups, queue_messages, queue_pending

log = logging.getLogger(__name__)


class WriterError(Exception):
    """The transaction holding a submission failed."""


def _rows_in(batch: WriteBatch) -> int:
    """What a batch weighs in the writer's gathering (``commit_batch_max``)."""
    return (
        len(batch.messages)
        + len(batch.message_deletes)
        + len(batch.pending)
        + sum(map(len, batch.finished_alone.values()))
        + sum(map(len, batch.held.values()))
        + len(batch.groups)
        + len(batch.events)
        + len(batch.calls)
    )


class Receipt:
    """One submission's fate, the "committed" future. ``event`` is set on the loop once committed (or
    failed)."""

    __slots__ = (
        "ahead", "batch", "done", "error", "event", "followers", "on_commit", "on_results", "results", "rows",
    )  # fmt: skip

    def __init__(
        self,
        batch: WriteBatch,
        event: anyio.Event | None,
        on_commit: Callable[[], None] | None,
        on_results: Callable[[list[Any]], None] | None = None,
    ):
        self.batch = batch
        self.rows = _rows_in(batch)  # counted once: the submit, the gathering and the statistics use it
        self.event = event
        self.on_commit = on_commit
        self.on_results = on_results
        self.error: BaseException | None = None
        self.results: list[Any] = []
        self.done = False  # committed or failed, its callbacks run
        self.followers: list[Callable[[], None]] | None = None
        self.ahead = False  # its calls may run ahead of earlier submissions' rows (GroupCommitWriter.submit)

    def then(self, follower: Callable[[], None]) -> None:
        """Run ``follower`` on the loop once this submission is done (at once if it is). Submissions
        complete in submission order, so this also follows every earlier submission."""
        if self.done:
            follower()
        elif self.followers is None:
            self.followers = [follower]
        else:
            self.followers.append(follower)

    @classmethod
    def standing_in(cls) -> Receipt:
        """A receipt for work not submitted yet (a publish waiting for its offset): awaitable and
        followable like any other, done when :meth:`settle` says so."""
        return cls(WriteBatch(), anyio.Event(), None)

    def settle(self, error: BaseException | None) -> None:
        """Done, as the receipt it stood in for (``error``: that one failed), on the loop."""
        self.error = error
        _complete([self])

    async def wait(self) -> list[Any]:
        assert self.event is not None, "submitted without wait=True"
        await self.event.wait()
        if self.error is not None:
            raise WriterError(str(self.error)) from self.error
        return self.results


#: The longest pause between two tries while the database is away (the first try is at once): a
#: refused connection costs little, and what waits is written this soon after it answers.
RETRY_MAX_S = 0.25
RETRY_MIN_S = 0.05

#: How much nicer the writer thread is than the event loop (Linux).
WRITER_NICE = 10


def _yield_to_the_loop() -> None:
    """Lower this thread's CPU priority below the event loop's (Linux: a thread has its own nice
    value). On a shared core a commit (SQLite's page writes, the fsync's kernel work) no longer
    holds up a read the loop just woke for: the loop preempts the writer. Under a flood the writer
    then commits mostly while the loop waits, in bigger batches, and still gets its share of a
    saturated core (nice 10: about a tenth). Shared bench, MQTT queue fan-in, three pairs each:
    x1.44, x1.12, x1.11 with nice 10; nice 19 starved the writer (x0.90 against 10); durable
    latency at 1k msg/s: p99 -19%, p50 -2%."""
    if sys.platform != "linux":
        return
    tid = threading.get_native_id()
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + WRITER_NICE))


class GroupCommitWriter:
    def __init__(self, engine: Engine, *, commit_interval_ms: float = 0.0, commit_batch_max: int = 2000):
        self.engine = engine
        self.interval_s = commit_interval_ms / 1000.0
        self.batch_max = commit_batch_max
        # Submits take the lock itself (C), not the condition (a Python __enter__/__exit__ each).
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._items: list[Receipt] = []
        self._rows = 0
        self._idle = False  # the thread waits for work: a submit must notify it
        self._wake_pending = False  # a wake is scheduled for the end of the loop's turn
        self._closing = False
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._token: Any = None
        # statistics
        self.transactions = 0
        self.submissions = 0
        self.batch_done: Callable[[], None] | None = None  # on the loop, after each batch's callbacks
        # In the writer thread, after each batch of transactions: (seconds spent, rows written).
        self.on_transaction: Callable[[float, int], None] | None = None
        self.busy_s = 0.0  # time spent writing (the rest of the thread's life it waits for work)
        # PostgreSQL away: logged once per outage (shared with the readiness check), not per write.
        self.availability = availability(engine)
        self._retry_s = 0.0  # the pause before the next try while the database is away
        # A write failed for the database twice running, the second on a new connection: it is
        # away (a killed connection alone is replaced at once, and refuses nothing).
        self.away = False

    # -- lifecycle (on the event loop) -----------------------------------------------------------

    def start(self) -> None:
        try:
            self._loop = asyncio.get_running_loop()
        except RuntimeError:  # not asyncio (trio): release through anyio's portal instead
            self._loop = None
            self._token = anyio.lowlevel.current_token()
        self._closing = False
        self._thread = threading.Thread(target=self._run, name="trimaran-writer", daemon=True)
        self._thread.start()

    async def stop(self) -> None:
        """Write everything submitted so far, then end the thread."""
        thread = self._thread
        if thread is None:
            return
        with self._cond:
            self._closing = True
            self._cond.notify()
        # Completions of the last batches are delivered to the loop while we wait here.
        while thread.is_alive():
            await anyio.sleep(0.002)
        self._thread = None

    # -- submitting (on the event loop) ----------------------------------------------------------

    def submit(
        self,
        batch: WriteBatch,
        *,
        wait: bool = False,
        on_commit: Callable[[], None] | None = None,
        on_results: Callable[[list[Any]], None] | None = None,
        receipt: Receipt | None = None,
        refusable: bool = False,
        ahead: bool = False,
    ) -> Receipt:
        """Queue a batch. ``on_commit`` / ``on_results`` run on the loop after the commit.
        ``receipt``: a standing-in receipt handed out before the batch was complete (a turn's
        publishes): it becomes this submission's receipt, so nothing has to settle it after.
        ``refusable``: raise :class:`WriterError` now while the database is away (a publish).
        ``ahead``: the batch's calls touch no row an earlier submission writes (an offset
        reservation, a compaction): merged with the submissions around it (:func:`_runs`)."""
        if receipt is None:
            receipt = Receipt(batch, anyio.Event() if wait else None, on_commit, on_results)
        else:
            receipt.batch = batch
            receipt.rows = _rows_in(batch)
            receipt.on_commit = on_commit
            receipt.on_results = on_results
        receipt.ahead = ahead
        if self._thread is None:
            raise WriterError("the writer is not running")
        if refusable and self.away:
            raise WriterError(f"database unavailable: {self.availability.reason}")
        with self._lock:
            self._items.append(receipt)
            self._rows += receipt.rows
            if self._rows >= self.batch_max:
                self._cond.notify()
            elif self._idle and not self._wake_pending:
                if self._loop is None:
                    self._cond.notify()
                else:
                    # Wake the thread after the loop's turn: what the rest of this turn submits (the
                    # other frames of the same read, other connections' reads) goes in the same
                    # commit. Two hops: the callbacks this turn scheduled, the runtime's socket
                    # writes among them, run first; woken sooner, the thread (on the same core)
                    # took the core and then waited for the interpreter while a delivery was
                    # still to be written (durable p50 at 1k msg/s 243 -> 210-215 µs).
                    self._wake_pending = True
                    self._loop.call_soon(self._loop.call_soon, self._wake)
        self.submissions += 1
        return receipt

    def _wake(self) -> None:
        with self._cond:
            self._wake_pending = False
            self._cond.notify()

    async def write(self, batch: WriteBatch, on_commit: Callable[[], None] | None = None) -> list[Any]:
        return await self.submit(batch, wait=True, on_commit=on_commit).wait()

    # -- the thread ------------------------------------------------------------------------------

    def _take(self) -> list[Receipt] | None:
        cond = self._cond
        with cond:
            idle = False
            while not self._items:
                if self._closing:
                    return None
                self._idle = idle = True
                cond.wait()
                self._idle = False
            if not idle and self.interval_s > 0 and self._rows < self.batch_max and not self._closing:
                # Back-to-back commits, and an operator asked for bigger batches: gather a while
                # (submitters notify only when the batch is full). Never after idleness.
                cond.wait(self.interval_s)
            taken: list[Receipt] = []
            rows = 0
            items = self._items
            i = 0
            while i < len(items) and (rows < self.batch_max or not taken):
                rows += items[i].rows
                i += 1
            taken = items[:i]
            del items[:i]
            self._rows -= rows
            return taken

    def _run(self) -> None:
        _yield_to_the_loop()
        connection = self.engine.connect()
        try:
            while True:
                receipts = self._take()
                if receipts is None:
                    break
                started = time.perf_counter()
                waiting = self._write(connection, receipts)
                spent = time.perf_counter() - started
                self.busy_s += spent
                if waiting:
                    receipts = receipts[: len(receipts) - len(waiting)]
                    self._wait_for_the_database(waiting)
                    if not receipts:
                        continue
                observe = self.on_transaction
                if observe is not None:
                    try:
                        observe(spent, sum(t.rows for t in receipts))
                    except Exception:
                        log.exception("on_transaction callback failed")
                self._release(receipts)
        except BaseException:  # pragma: no cover - the thread must never die silently
            log.exception("queue writer thread failed")
            raise
        finally:
            connection.close()

    def _write(self, connection: Connection, receipts: list[Receipt]) -> list[Receipt]:
        """Write ``receipts``, each committed or failed, but for those the database being away
        stopped: returned (the last ones, in order) to be written again once it answers."""
        try:
            with connection.begin():
                results = [r for run in _runs(receipts) for r in apply(connection, _merged(run))]
            self.transactions += 1
            i = 0
            for receipt in receipts:
                n = len(receipt.batch.calls)
                receipt.results = results[i : i + n]
                i += n
            self._answered()
            return []
        except Exception as exc:
            if is_unavailable(self.engine, exc):
                _discard(connection)
                return self._away(receipts, exc)
            if len(receipts) == 1:
                self._failed(receipts[0], exc)
                return []
            log.warning("a batch of %d submissions failed; retrying one by one", len(receipts), exc_info=True)
        for i, receipt in enumerate(receipts):
            try:
                with connection.begin():
                    receipt.results = apply(connection, receipt.batch)
                self.transactions += 1
                self._answered()
            except Exception as exc:
                if is_unavailable(self.engine, exc):
                    _discard(connection)
                    return self._away(receipts[i:], exc)
                self._failed(receipt, exc)
        return []

    def _answered(self) -> None:
        self._retry_s = 0.0
        self.away = False
        self.availability.succeeded()

    def _away(self, receipts: list[Receipt], exc: Exception) -> list[Receipt]:
        """The database is away (said once per outage): ``receipts`` wait for it, unless the writer
        is closing, when they fail with a one-line reason."""
        reason = self.availability.failed(exc, "queue write")
        log.debug("queue write failed", exc_info=True)
        if self._retry_s > 0:  # the try before failed too
            self.away = True
        if not self._closing:
            return receipts
        for receipt in receipts:
            error = WriterError(f"database unavailable: {reason}")
            error.__cause__ = exc
            receipt.error = error
        return []

    def _wait_for_the_database(self, receipts: list[Receipt]) -> None:
        """Put ``receipts`` back ahead of everything submitted since, and pause before the next try
        (at once the first time: a killed connection is replaced at once), or until closing."""
        with self._cond:
            self._items[:0] = receipts
            self._rows += sum(receipt.rows for receipt in receipts)
            pause = self._retry_s
            self._retry_s = min(RETRY_MAX_S, max(RETRY_MIN_S, pause * 2))
            deadline = time.monotonic() + pause
            while not self._closing and (left := deadline - time.monotonic()) > 0:
                self._cond.wait(left)  # submissions notify too: the deadline holds

    def _failed(self, receipt: Receipt, exc: Exception) -> None:
        """A submission's transaction failed, the database answering (a constraint, a bug)."""
        log.exception("queue write failed")
        receipt.error = exc

    def _release(self, receipts: list[Receipt]) -> None:
        if self._loop is not None:
            with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits any more
                self._loop.call_soon_threadsafe(self._completed, receipts)
        else:
            anyio.from_thread.run_sync(self._completed, receipts, token=self._token)

    def _completed(self, receipts: list[Receipt]) -> None:
        _complete(receipts)
        if self.batch_done is not None:
            try:
                self.batch_done()
            except Exception:
                log.exception("batch_done callback failed")


def _discard(connection: Connection) -> None:
    """The next try gets a new driver connection: SQLAlchemy does not see every loss as one (a
    backend killed in the middle of a pipeline left psycopg answering "another command is already
    in progress" to every later statement, and the writer retried on it for ever)."""
    with contextlib.suppress(Exception):
        connection.invalidate()


def _runs(receipts: list[Receipt]) -> list[list[Receipt]]:
    """Split submissions into runs that merge without reordering: a batch's calls run before its
    rows, so a batch with calls starts a new run. Merged behind earlier submissions, a queue delete or
    purge would run before their rows and leave them behind (a delivery's pending row outliving its
    deleted queue, a message row its purge). A batch submitted ``ahead`` does not: a shared node's
    offset reservation, in nearly every commit, kept a publish and its ack in different runs, each
    written (a message in five was dropped unwritten where one node without it dropped two in five)."""
    runs: list[list[Receipt]] = []
    for receipt in receipts:
        if not runs or (receipt.batch.calls and not receipt.ahead):
            runs.append([receipt])
        else:
            runs[-1].append(receipt)
    return runs


def _merged(run: list[Receipt]) -> WriteBatch:
    batch = run[0].batch if len(run) == 1 else WriteBatch.joined([receipt.batch for receipt in run])
    return without_transients(batch)


def _complete(receipts: list[Receipt]) -> None:
    """On the event loop: callbacks in submission order, then wake the waiters.

    A done receipt lets go of its callbacks. A callback that closes over its own receipt
    (to read ``error``) is a reference cycle; left in place, every durable publish became some 25
    objects only the cyclic collector could free, and its collections cost a fifth of the loop."""
    for receipt in receipts:
        on_commit, on_results, followers = receipt.on_commit, receipt.on_results, receipt.followers
        receipt.on_commit = receipt.on_results = receipt.followers = None
        if receipt.error is None and on_commit is not None:
            try:
                on_commit()
            except Exception:
                log.exception("on_commit callback failed")
        if on_results is not None:
            try:
                on_results(receipt.results if receipt.error is None else [])
            except Exception:
                log.exception("on_results callback failed")
        receipt.done = True
        if receipt.event is not None:
            receipt.event.set()
        if followers is not None:
            for follower in followers:
                try:
                    follower()
                except Exception:
                    log.exception("a follower of a queue write failed")


# -- statements --------------------------------------------------------------------------------
#
# The hot path goes straight to the DB-API cursor with prebuilt SQL: SQLAlchemy's per-row parameter
# processing costs about as much as SQLite's own insert, and these rows are plain ints, str and bytes.


# An event's columns in the table's order, ``id`` left out: the run's key with ``offset`` fourth
# and ``span`` last (a row is built as key[:3], offset, key[3:], span).
_EVENT_COLUMNS = [c.name for c in queue_events.columns if c.name != "id"]
assert [*RUN_COLUMNS[:3], "offset", *RUN_COLUMNS[3:], "span"] == _EVENT_COLUMNS


class _Sql:
    def __init__(self, marker: str) -> None:
        def cols(table: Any) -> list[str]:
            return [c.name for c in table.columns]

        def ins(table: Any, names: list[str]) -> str:
            quoted = ", ".join(f'"{n}"' for n in names)
            return f"INSERT INTO {table.name} ({quoted}) VALUES ({', '.join([marker] * len(names))})"

        def where(names: list[str]) -> str:
            return " AND ".join(f'"{n}" = {marker}' for n in names)

        self.message_cols = list(MESSAGE_COLUMNS)
        self.pending_cols = cols(queue_pending)
        self.event_cols = _EVENT_COLUMNS
        keys = ("queue", "group", "offset")
        updates = ", ".join(f'"{n}" = excluded."{n}"' for n in self.pending_cols if n not in keys)
        # SQLite: many rows a statement. executemany steps once a row, and that per-row round
        # (reset, bind, step) was about a third of an event's insert (1.7 -> 1.1 µs a row).
        self.messages_in = _Chunked(ins(queue_messages, self.message_cols), marker)
        # One statement per pending entry whatever it was before (a first delivery has no row; a
        # redelivery or a nack replaces one), instead of a delete ahead of every insert.
        self.pending_in = _Chunked(
            f"{ins(queue_pending, self.pending_cols)} "
            f'ON CONFLICT ("queue", "group", "offset") DO UPDATE SET {updates}',
            marker,
        )
        self.events_in = _Chunked(ins(queue_events, self.event_cols), marker)
        self.messages_out = _Chunked(f"DELETE FROM queue_messages WHERE {where(['queue', 'offset'])}", marker)
        self.pending_out = _Chunked(f"DELETE FROM queue_pending WHERE {where(list(keys))}", marker)
        self.queue_next = (
            f'UPDATE queues SET "next_offset" = {marker} WHERE "name" = {marker} AND "next_offset" < {marker}'
        )


class _Chunked:
    """One statement for up to ``per`` rows: an insert's ``VALUES`` list repeated, or a delete's
    key condition OR-ed (SQLite's primary-key lookup per term, as one statement). Rows beyond the
    last whole chunk go through ``executemany``. At most 999 parameters a statement, the lowest
    limit of any SQLite build."""

    __slots__ = ("full", "one", "per")

    def __init__(self, one: str, marker: str) -> None:
        self.one = one
        self.per = per = max(1, 999 // one.count(marker))  # a row's parameters
        if one.startswith("INSERT"):
            head, _, rest = one.partition(" VALUES ")
            values, on_conflict, tail = rest.partition(" ON CONFLICT ")
            self.full = f"{head} VALUES {', '.join([values] * per)}{on_conflict}{tail}"
        else:
            head, _, condition = one.partition(" WHERE ")
            self.full = f"{head} WHERE " + " OR ".join([f"({condition})"] * per)

    def run(self, cursor: Any, rows: list[tuple[Any, ...]]) -> None:
        per = self.per
        whole = len(rows) - len(rows) % per
        for start in range(0, whole, per):  # the rows' values in one flat list, flattened in C
            cursor.execute(self.full, list(chain.from_iterable(islice(rows, start, start + per))))
        if whole < len(rows):
            cursor.executemany(self.one, rows[whole:])


_sql_by_style: dict[str, _Sql] = {}


def _sql_for(connection: Connection) -> _Sql:
    style = connection.dialect.paramstyle
    sql = _sql_by_style.get(style)
    if sql is None:
        marker = {"qmark": "?", "format": "%s", "pyformat": "%s"}.get(style)
        if marker is None:
            raise WriterError(f"unsupported DB-API paramstyle {style}")
        sql = _sql_by_style[style] = _Sql(marker)
    return sql


def _pg_type(column: Any) -> str:
    name = type(column.type).__name__.upper()
    if "BIGINT" in name or (column.name == "id"):
        return "bigint"
    if "INTEGER" in name:
        return "integer"
    if "BINARY" in name or "BLOB" in name:
        return "bytea"
    if "BOOLEAN" in name:
        return "boolean"
    return "text"


class _PgSql:
    """PostgreSQL: one statement per table and batch, rows passed as arrays through unnest().

    psycopg's executemany still runs one server-side execute per row; unnest makes it one."""

    def __init__(self) -> None:
        self.inserts: dict[str, tuple[str, list[str]]] = {}
        self.types: dict[str, list[str]] = {}  # each column's, packed by pg_arrays
        self.deletes: dict[str, str] = {}
        skip: tuple[str, ...]
        for table, skip in (
            (queue_messages, ()),
            (queue_pending, ()),
            (queue_groups, ()),
            (queue_events, ("id",)),
        ):
            cols = [c for c in table.columns if c.name not in skip]
            names = [c.name for c in cols]
            types = self.types[table.name] = [_pg_type(c) for c in cols]
            quoted = ", ".join(f'"{n}"' for n in names)
            arrays = ", ".join(f"%b::{t}[]" for t in types)
            self.inserts[table.name] = (
                f"INSERT INTO {table.name} ({quoted}) SELECT * FROM unnest({arrays})",
                names,
            )
        # Deletes per queue (and group): a run of consecutive offsets by its bounds; the offsets
        # between runs by "offset" = ANY(array) in chunks, with BETWEEN bounds that make the primary
        # key the plan even before the table has statistics (without them the planner chose a bitmap
        # scan of the whole queue). The array is a filter that PostgreSQL searches linearly for every
        # row, so one array of a batch's 700 offsets cost ~12 us a row, a run's bounds ~1.3.
        prefix = {"queue_messages": "queue = %s", "queue_pending": 'queue = %s AND "group" = %s'}
        self.deletes = {
            table: f'DELETE FROM {table} WHERE {where} AND "offset" BETWEEN %s AND %s'
            for table, where in prefix.items()
        }
        self.deletes_listed = {
            table: f'{sql} AND "offset" = ANY(%b::bigint[])' for table, sql in self.deletes.items()
        }

    def insert(self, cursor: Any, table: str, rows: list[tuple[Any, ...]]) -> None:
        """``rows``: tuples in the table's column order (``id`` left out)."""
        columns = zip(*rows, strict=True)
        arrays = [packed(c, t) for c, t in zip(columns, self.types[table], strict=True)]
        cursor.execute(self.inserts[table][0], arrays)

    def columns(self, table: str) -> list[str]:
        return self.inserts[table][1]

    def delete(self, cursor: Any, table: str, keys: list[tuple[Any, ...]]) -> None:
        """Delete the rows of ``keys``."""
        by_prefix: dict[tuple[Any, ...], list[int]] = {}
        for key in keys:
            by_prefix.setdefault(key[:-1], []).append(key[-1])
        runs: list[tuple[Any, ...]] = []
        listed: list[tuple[Any, ...]] = []
        for prefix, offsets in by_prefix.items():
            offsets.sort()
            scattered: list[int] = []
            start = 0
            for end in range(1, len(offsets) + 1):
                if end < len(offsets) and offsets[end] == offsets[end - 1] + 1:
                    continue
                if end - start >= _RUN:
                    runs.append((*prefix, offsets[start], offsets[end - 1]))
                else:
                    scattered += offsets[start:end]
                start = end
            for at in range(0, len(scattered), _LISTED):
                chunk = scattered[at : at + _LISTED]
                listed.append((*prefix, chunk[0], chunk[-1], chunk))
        if runs:
            cursor.executemany(self.deletes[table], runs)
        if listed:
            cursor.executemany(self.deletes_listed[table], listed)


# A run of consecutive offsets this long is deleted by its bounds; the rest in arrays of at most
# _LISTED, short enough that searching one per row stays cheap.
_RUN, _LISTED = 8, 64

_pg_sql: _PgSql | None = None
_arrays_known: weakref.WeakSet[Any] = weakref.WeakSet()  # connections whose adapters pass PgArray


def _apply_pg(connection: Connection, batch: WriteBatch) -> None:
    global _pg_sql
    sql = _pg_sql = _pg_sql or _PgSql()
    raw: Any = connection.connection.dbapi_connection
    if raw not in _arrays_known:  # each connection's adapters are its own (a reconnect: new ones)
        register_arrays(raw.adapters)
        _arrays_known.add(raw)
    cursor = raw.cursor()
    # Pipeline mode: every statement of the batch goes out in one flush, one round trip in all.
    with contextlib.ExitStack() as stack:
        if hasattr(raw, "pipeline"):
            stack.enter_context(raw.pipeline())
        _apply_pg_statements(cursor, sql, batch)
    cursor.close()


def _apply_pg_statements(cursor: Any, sql: _PgSql, batch: WriteBatch) -> None:
    finished = batch.finished_alone
    alone: set[GroupKey] = set()
    written: dict[str, tuple[str, set[int]]] = {}
    if finished:
        # First: what follows knows which groups are still alone (_finish_alone_pg).
        alone = _alone_now(cursor, finished)
        written = _written_and_finished(batch, alone)
    if batch.messages:
        if written:
            rows = [m.values() for m in batch.messages if not _finished_here(written, m.queue, m.offset)]
            if rows:
                sql.insert(cursor, "queue_messages", rows)
        else:
            sql.insert(cursor, "queue_messages", _message_tuples(batch))
    if batch.message_deletes:
        sql.delete(cursor, "queue_messages", batch.message_deletes)
    if batch.pending:
        _write_pending_pg(cursor, sql, batch.pending, written)
    if batch.held and (spans := _spans(batch, written)):
        cursor.executemany(_SPAN_IN, spans)
    if finished:
        _finish_alone_pg(cursor, sql, finished, alone, written)
    if batch.groups:
        _write_groups(cursor, "%s", batch)
    if batch.queue_next:
        cursor.executemany(
            "UPDATE queues SET next_offset = %s WHERE name = %s AND next_offset < %s",
            [(v, n, v) for n, v in batch.queue_next.items()],
        )
    if batch.events:
        sql.insert(cursor, "queue_events", event_rows(batch.events))


def _alone_now(cursor: Any, finished: dict[GroupKey, list[int]]) -> set[GroupKey]:
    """Of the groups in ``finished_alone``, those their queue still has alone. The queue rows are
    taken shared first (in name order), and a node making a group takes its queue's row for update
    (``queue_store.claim``): the answer holds until this transaction ends. One round trip."""
    keys = sorted(finished)
    cursor.execute(_QUEUES_SHARED, (sorted({queue for queue, _ in keys}),))
    cursor.execute(_ALONE, ([queue for queue, _ in keys], [group for _, group in keys]))
    return {(queue, group) for queue, group in cursor.fetchall()}


_QUEUES_SHARED = "SELECT 1 FROM queues WHERE name = ANY(%s) ORDER BY name FOR SHARE"
_ALONE = (
    "SELECT f.q, f.g FROM unnest(%s::text[], %s::text[]) AS f(q, g) "
    'WHERE NOT EXISTS (SELECT 1 FROM queue_groups WHERE queue = f.q AND "group" <> f.g)'
)


def _written_and_finished(batch: WriteBatch, alone: set[GroupKey]) -> dict[str, tuple[str, set[int]]]:
    """Per queue, the messages this batch writes that the queue's one group, still alone, finishes
    in it too: neither they nor their rows are written."""
    written: dict[str, tuple[str, set[int]]] = {}
    for queue, group in alone:
        finished = set(batch.finished_alone[(queue, group)])
        offsets = {m.offset for m in batch.messages if m.queue == queue and m.offset in finished}
        if offsets:
            written[queue] = (group, offsets)
    return written


def _finished_here(written: dict[str, tuple[str, set[int]]], queue: str, offset: int) -> bool:
    entry = written.get(queue)
    return entry is not None and offset in entry[1]


def _write_pending_pg(
    cursor: Any, sql: _PgSql, pending: dict[PendingKey, PendingRow], written: dict[str, tuple[str, set[int]]]
) -> None:
    """Pending rows replace what a key had (deleted, then inserted). The rows of messages written
    and finished alone here are left to :func:`_finish_alone_pg`."""
    replaced: list[PendingKey] = []
    rows: list[dict[str, Any]] = []
    for key, row in pending.items():
        if written and (entry := written.get(key[0])) is not None and key[2] in entry[1]:
            continue
        replaced.append(key)
        if row is not None:
            rows.append(row)
    if replaced:
        sql.delete(cursor, "queue_pending", replaced)
    if rows:
        sql.insert(cursor, "queue_pending", _tuples(rows, sql.columns("queue_pending")))


def _spans(batch: WriteBatch, written: dict[str, tuple[str, set[int]]]) -> list[tuple[Any, ...]]:
    """The batch's ``queue_spans`` rows (:func:`rows.held_spans`)."""
    skip = {(queue, group): offsets for queue, (group, offsets) in written.items()}
    return held_spans(batch.held, skip)


_SPAN_IN = (
    'INSERT INTO queue_spans (queue, "group", first_offset, last_offset, node, lease_until) '
    "VALUES (%s, %s, %s, %s, %s, %s)"
)


def _finish_alone_pg(
    cursor: Any,
    sql: _PgSql,
    finished: dict[GroupKey, list[int]],
    alone: set[GroupKey],
    written: dict[str, tuple[str, set[int]]],
) -> None:
    """What groups that believed themselves alone finished (``WriteBatch.finished_alone``): the
    messages go where the group is still alone (:func:`_alone_now`), else 'done' rows are written
    for them (their own rows, if any, were deleted by the batch's pending changes). Without the
    check a group made meanwhile on another node could have claimed a message this commit deletes.
    What this batch writes and finishes alone was never written (:func:`_written_and_finished`)."""
    for (queue, group), offsets in finished.items():
        if (queue, group) not in alone:
            cursor.execute(_DONE, (queue, group, offsets))
            continue
        stored = offsets
        if (entry := written.get(queue)) is not None:
            stored = [o for o in offsets if o not in entry[1]]
        if stored:
            sql.delete(cursor, "queue_messages", [(queue, o) for o in stored])


def _finish_alone_sqlite(cursor: Any, sql: _Sql, finished: dict[GroupKey, list[int]]) -> None:
    """As :func:`_finish_alone_pg` (shared mode runs on PostgreSQL; SQLite's one writer needs no lock)."""
    for (queue, group), offsets in finished.items():
        others = cursor.execute(
            'SELECT 1 FROM queue_groups WHERE queue = ? AND "group" <> ? LIMIT 1', (queue, group)
        ).fetchone()
        if others is None:
            sql.messages_out.run(cursor, [(queue, o) for o in offsets])
            sql.pending_out.run(cursor, [(queue, group, o) for o in offsets])
            continue
        cursor.executemany(
            'INSERT INTO queue_pending (queue, "group", "offset", state, attempts, unsent, returned) '
            'VALUES (?, ?, ?, \'done\', 0, 0, 0) ON CONFLICT (queue, "group", "offset") '
            "DO UPDATE SET state = 'done', consumer = NULL",
            [(queue, group, o) for o in offsets],
        )


_DONE = (
    'INSERT INTO queue_pending (queue, "group", "offset", state, attempts, unsent, returned) '
    "SELECT %s, %s, o, 'done', 0, 0, 0 FROM unnest(%b::bigint[]) o "
    'ON CONFLICT (queue, "group", "offset") DO UPDATE SET state = \'done\', consumer = NULL'
)


def _tuples(rows: list[dict[str, Any]], names: list[str]) -> list[tuple[Any, ...]]:
    get = itemgetter(*names)
    return [get(row) for row in rows]


def _message_tuples(batch: WriteBatch) -> list[tuple[Any, ...]]:
    return message_tuples(batch.messages)


def _write_groups(cursor: Any, marker: str, batch: WriteBatch) -> None:
    """Upsert cursors in place: a delete + insert of the same key in every transaction would leave
    PostgreSQL one dead index entry per commit to step over until vacuum."""
    gone = [key for key, row in batch.groups.items() if row is None]
    if gone:
        cursor.executemany(f'DELETE FROM queue_groups WHERE queue = {marker} AND "group" = {marker}', gone)
    rows = [
        (r["queue"], r["group"], r["cursor"], r["committed"], r["updated_at"])
        for r in batch.groups.values()
        if r is not None
    ]
    if rows:
        m = marker
        cursor.executemany(
            f'INSERT INTO queue_groups (queue, "group", cursor, committed, updated_at) '
            f"VALUES ({m}, {m}, {m}, {m}, {m}) "
            'ON CONFLICT (queue, "group") DO UPDATE SET cursor = excluded.cursor, '
            "committed = excluded.committed, updated_at = excluded.updated_at",
            rows,
        )


def apply(connection: Connection, batch: WriteBatch) -> list[Any]:
    """Write one (merged) batch inside the caller's transaction."""
    results = [call(connection) for call in batch.calls]
    if connection.dialect.name == "postgresql":
        _apply_pg(connection, batch)
        return results
    sql = _sql_for(connection)
    cursor = connection.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
    try:
        if batch.messages:
            sql.messages_in.run(cursor, _message_tuples(batch))
        if batch.message_deletes:
            sql.messages_out.run(cursor, batch.message_deletes)
        if batch.pending:
            gone = [key for key, row in batch.pending.items() if row is None]
            if gone:
                sql.pending_out.run(cursor, gone)
            rows = [row for row in batch.pending.values() if row is not None]
            if rows:
                sql.pending_in.run(cursor, _tuples(rows, sql.pending_cols))
        if batch.held and (spans := _spans(batch, {})):
            cursor.executemany(_SPAN_IN.replace("%s", "?"), spans)
        if batch.finished_alone:
            _finish_alone_sqlite(cursor, sql, batch.finished_alone)
        if batch.groups:
            _write_groups(cursor, "?", batch)
        if batch.queue_next:
            cursor.executemany(sql.queue_next, [(v, n, v) for n, v in batch.queue_next.items()])
        if batch.events:
            sql.events_in.run(cursor, event_rows(batch.events))
    finally:
        cursor.close()
    return results
