"""PostgreSQL fails under durable load; nothing acknowledged is lost (issue #46).

A real PostgreSQL started by the test, the real server (``trimaran serve --storage postgresql://``)
as a subprocess on it, and steady durable load on all three protocols at once
(tests/support/durable_load.py: MQTT QoS 1 to ``$queue/``, AMQP 0.9.1 confirms, AMQP 1.0
``accepted``, each with a consumer acknowledging what it gets). The faults:

- PostgreSQL restarted with ``pg_ctl -m immediate`` (a crash: every connection cut, crash recovery at
  the start), kept down a moment so that the broker sees it away;
- every connection of the server's database ended with ``pg_terminate_backend``.

While PostgreSQL is down, ``/readyz`` answers 503 and the log says why in one line; after each fault
the broker resumes by itself, and the time from PostgreSQL accepting connections again (or from the
kill) to the first delivery of a message published after it is measured, per protocol. At the end the
publishers stop, the consumers drain, and every message a publisher was acknowledged for must have
been received (0 lost); a message received twice must carry its protocol's redelivery mark (MQTT
DUP, AMQP 0.9.1 ``redelivered``, AMQP 1.0 ``delivery-count``). The numbers are printed (``-s``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import logging
import os
import re
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import psycopg
import pytest
from sqlalchemy import text

from tests.support.audit import audit as run_audit
from tests.support.audit import cannot_audit
from tests.support.durable_load import PROTOCOLS, Ledger, Worker, load
from tests.support.postgres import PostgresCluster, find_bindir
from tests.support.server import RunningServer
from trimaran.storage import queue_store
from trimaran.storage import writer as writer_module
from trimaran.storage.rows import WriteBatch
from trimaran.storage.store import Storage
from trimaran.storage.writer import GroupCommitWriter, WriterError

pytestmark = pytest.mark.postgres

DATABASE = "trimaran"
QUEUES = {"mqtt": "dbf-mqtt", "amqp091": "dbf-amqp091", "amqp1": "dbf-amqp1"}
SERVER_ENV = {
    # Every redelivery here is a fault's, never a visibility timeout's, and a message that goes
    # round many times is not dead-lettered (a dead letter would count as lost).
    "TRIMARAN_QUEUES__DEFAULTS__VISIBILITY_TIMEOUT_S": "600",
    "TRIMARAN_QUEUES__DEFAULTS__MAX_ATTEMPTS": "1000",
    "TRIMARAN_LIMITS__SYS_INTERVAL": "0",
    "TRIMARAN_SHUTDOWN_GRACE_S": "2",
}
RECOVERY_BOUND_S = 30.0  # asserted; the goal is under 5 s, and the real figures are printed
DOWN_S = 1.0  # how long PostgreSQL stays down at least in a restart
DRAIN_TIMEOUT_S = 30.0
SHARED_MQTT_RATE = 500.0  # messages a second
LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ (?:INFO|WARNING|ERROR|CRITICAL) ")


@pytest.fixture
def pg() -> Iterator[PostgresCluster]:
    """A PostgreSQL of the test's own: restarting the session's would disturb other tests."""
    bindir = find_bindir()
    if bindir is None:
        if os.environ.get("TRIMARAN_REQUIRE_POSTGRES"):
            pytest.fail("PostgreSQL binaries are missing and TRIMARAN_REQUIRE_POSTGRES is set")
        pytest.skip("PostgreSQL is not installed (Debian package 'postgresql')")
    cluster = PostgresCluster(bindir).start()
    try:
        yield cluster
    finally:
        cluster.stop()


def readyz(server: RunningServer) -> tuple[int, dict[str, object]]:
    url = f"http://127.0.0.1:{server.ports['http']}/readyz"
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def wait_for(condition: Callable[[], object], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


@dataclass
class Run:
    pg: PostgresCluster
    url: str
    workdir: Path
    shared: bool = False
    ledger: Ledger = field(default_factory=Ledger)
    servers: list[RunningServer] = field(default_factory=list)
    workers: list[Worker] = field(default_factory=list)
    recoveries: dict[str, list[float]] = field(default_factory=lambda: {"restart": [], "kill": []})
    lines: list[str] = field(default_factory=list)
    detail: str = ""  # the last recovery's figures per protocol

    def start_server(self, name: str) -> RunningServer:
        workdir = self.workdir / name
        workdir.mkdir()
        env = {**SERVER_ENV, "TRIMARAN_NODE_NAME": name}
        if self.shared:
            env["TRIMARAN_QUEUES__SHARED"] = "true"
        args = ["--mqtt", "127.0.0.1:0", "--mqtt-ws", "off", "--amqp", "127.0.0.1:0"]
        args += ["--http", "127.0.0.1:0", "--storage", self.url]
        server = RunningServer(args, cwd=workdir, env=env).start(timeout=60)
        self.servers.append(server)
        return server

    def log(self) -> str:
        return "\n".join(f"--- {s.args} ---\n{s.output()[-20000:]}" for s in self.servers)

    def check_running(self) -> None:
        for server in self.servers:
            assert server.process is not None and server.process.poll() is None, self.log()

    def resumed(self, since: float, fault: str) -> float:
        """Seconds from ``since`` until every protocol's consumer got a message published after it."""

        def every_protocol() -> bool:
            self.check_running()
            return all(self.ledger.resumed(p, since) is not None for p in PROTOCOLS)

        try:
            wait_for(every_protocol, RECOVERY_BOUND_S, f"delivery on every protocol after {fault}")
        except AssertionError:
            late = [p for p in PROTOCOLS if self.ledger.resumed(p, since) is None]
            failures = {w.name: w.failures[-3:] for w in self.workers}
            raise AssertionError(f"{late} did not resume after {fault}; {failures}\n{self.log()}") from None
        times = {p: self.ledger.resumed(p, since) for p in PROTOCOLS}
        acks = {p: self.ledger.first_ack(p, since) for p in PROTOCOLS}
        self.detail = (
            " (acknowledged / delivered again after: "
            + ", ".join(f"{p} {_since(acks[p], since)} / {_since(times[p], since)}" for p in PROTOCOLS)
            + ")"
        )
        return max(t - since for t in times.values() if t is not None)

    def restart(self, n: int) -> None:
        """PostgreSQL down (immediate), /readyz 503 and the log's reason meanwhile, up again."""
        logged = [len(s.lines) for s in self.servers]
        seen: dict[str, object] = {}

        def while_down() -> None:
            down = time.monotonic()
            for server in self.servers:
                wait_for(lambda s=server: readyz(s)[0] == 503, 10, "/readyz to answer 503")  # type: ignore[misc]
                seen.update(readyz(server)[1])
            time.sleep(max(0.0, DOWN_S - (time.monotonic() - down)))

        self.pg.restart("immediate", while_down=while_down)
        up = time.monotonic()
        for server in self.servers:  # first: the deliveries are timed by the consumers meanwhile
            wait_for(lambda s=server: readyz(s)[0] == 200, RECOVERY_BOUND_S, "/readyz to answer 200 again")  # type: ignore[misc]
        ready = time.monotonic() - up
        recovery = self.resumed(up, f"restart {n}")
        self.recoveries["restart"].append(recovery)
        self.lines.append(f"restart {n}: resumed in {recovery:.2f} s{self.detail}, ready in {ready:.2f} s")
        assert seen.get("status") == "not ready" and isinstance(seen.get("checks"), dict), seen
        assert seen["checks"]["storage"] is False, seen  # type: ignore[index]
        for server, i in zip(self.servers, logged, strict=True):
            self.check_log("".join(server.lines[i:]), f"restart {n}", down=True)

    def kill_backends(self, n: int) -> None:
        logged = [len(s.lines) for s in self.servers]
        ended = self.pg.terminate_backends(DATABASE)
        killed = time.monotonic()
        assert ended > 0, "the server held no connection to end"
        recovery = self.resumed(killed, f"backend kill {n}")
        self.recoveries["kill"].append(recovery)
        self.lines.append(f"kill {n}: {ended} backends ended, resumed in {recovery:.2f} s{self.detail}")
        for server, i in zip(self.servers, logged, strict=True):
            self.check_log("".join(server.lines[i:]), f"backend kill {n}", down=False)

    def check_log(self, new: str, fault: str, *, down: bool) -> None:
        """The log says why once per outage (``down``: PostgreSQL was away), not once per failed
        write or refused publish, and shows no traceback."""
        lines = [line for line in new.splitlines() if LOG_LINE.match(line)]
        why = [line for line in lines if "is unavailable" in line]
        if down:
            assert len(why) == 1, f"{len(why)} lines say why after {fault}:\n{new[-5000:]}"
        assert len(lines) <= 6, f"{len(lines)} lines logged for {fault}:\n{new[-5000:]}"
        assert "Traceback" not in new, f"a traceback logged for {fault}:\n{new[-5000:]}"


def fault_series(
    pg: PostgresCluster,
    workdir: Path,
    *,
    restarts: int,
    kills: int,
    load_s: float,
    shared: bool = False,
    audit: bool = False,
    drain_timeout_s: float = DRAIN_TIMEOUT_S,
) -> Run:
    url = pg.create_database(DATABASE)
    run = Run(pg, url, workdir, shared=shared)
    started = time.monotonic()
    try:
        a = run.start_server("a")
        b = run.start_server("b") if shared else a
        # Two nodes: published through a, consumed through b (the claims cross the database).
        # Shared: a node's MQTT consumer takes less than its publisher is acknowledged for, and the
        # backlog would delay the first delivery after a fault by its own length: paced below.
        run.workers = load(
            run.ledger, a.ports, b.ports, QUEUES, mqtt_rate=SHARED_MQTT_RATE if shared else None
        )
        for worker in run.workers:
            worker.start()
        run.resumed(time.monotonic(), "the start")
        order = _interleave(restarts, kills)
        counters = {"restart": 0, "kill": 0}
        for fault in order:
            time.sleep(load_s)
            counters[fault] += 1
            if fault == "restart":
                run.restart(counters[fault])
            else:
                run.kill_backends(counters[fault])
        time.sleep(load_s)

        publishers = [w for w in run.workers if w.role == "publisher"]
        consumers = [w for w in run.workers if w.role == "consumer"]
        for worker in publishers:
            worker.stop()
        drain_started = time.monotonic()
        with contextlib.suppress(AssertionError):
            wait_for(lambda: not run.ledger.missing(), drain_timeout_s, "the drain")
        drained = time.monotonic() - drain_started
        time.sleep(0.3)  # the last acks land
        for worker in consumers:
            worker.stop()
        missing = sorted(run.ledger.missing())
        counts = run.ledger.counts()
        duplicates, unmarked = run.ledger.duplicates()
        connects = dict(run.ledger.connects)
        run.lines.append(f"drained in {drained:.2f} s; {counts}")
        run.lines.append(f"duplicates {duplicates}, {len(unmarked)} without the redelivery mark")
        run.lines.append(f"connections per client {connects}")
        for kind, times in run.recoveries.items():
            if times:
                run.lines.append(
                    f"{kind}: recovery max {max(times):.2f} s, median {sorted(times)[len(times) // 2]:.2f} s"
                    f" over {len(times)}"
                )
        run.lines.append(f"{time.monotonic() - started:.1f} s in all")
        print("\n" + "\n".join(run.lines))
        by_protocol = {p: [m for m in missing if m.startswith(p + "/")] for p in PROTOCOLS}
        assert not missing, (
            f"{len(missing)} acknowledged messages not received: "
            f"{ {p: (len(m), m[:5]) for p, m in by_protocol.items()} }; in the tables: "
            f"{where_stored(url, missing)}\n" + "\n".join(run.lines)
        )
        assert not unmarked, f"received again without the redelivery mark: {unmarked[:10]}"
        for protocol in PROTOCOLS:
            assert counts[protocol]["acknowledged"] > 0, counts
        for server in run.servers:
            assert server.stop() == 0, server.output()
        if audit:
            why_not = cannot_audit()
            if why_not is not None:
                pytest.skip(f"nothing acknowledged was lost; the audit cannot run here: {why_not}")
            audit_started = time.monotonic()
            summary = run_audit(run.url, workdir / "audit", "after the database faults")
            invariants = summary["invariants"]
            assert isinstance(invariants, dict)
            print(f"audit clean ({len(invariants)} invariants) in {time.monotonic() - audit_started:.1f} s")
        return run
    finally:
        for worker in run.workers:
            worker.stopping.set()
        for server in run.servers:
            server.kill()


def where_stored(url: str, payloads: list[str]) -> dict[str, int]:
    """Of messages not received: how many are still stored (a delivery stalled, not a loss), and
    in which state their pending rows are (none: never delivered or claimed)."""
    import psycopg

    with psycopg.connect(url) as connection:
        rows = connection.execute(
            "SELECT m.payload, p.state, p.node FROM queue_messages m LEFT JOIN queue_pending p "
            'ON p.queue = m.queue AND p."offset" = m."offset" WHERE m.payload = ANY(%s)',
            ([p.encode() for p in payloads],),
        ).fetchall()
    found: dict[str, int] = {"stored": len({bytes(r[0]) for r in rows}), "not stored": 0}
    found["not stored"] = len(payloads) - found["stored"]
    for _payload, state, node in rows:
        key = f"pending {state} on {node}" if state else "no pending row"
        found[key] = found.get(key, 0) + 1
    return found


def _since(at: float | None, since: float) -> str:
    return "-" if at is None else f"{at - since:.2f}"


def _interleave(restarts: int, kills: int) -> list[str]:
    """A restart, a kill, a restart... while both last."""
    order: list[str] = []
    for i in range(max(restarts, kills)):
        if i < restarts:
            order.append("restart")
        if i < kills:
            order.append("kill")
    return order


def test_a_restart_and_a_backend_kill_lose_nothing_acknowledged(pg: PostgresCluster, tmp_path: Path) -> None:
    run = fault_series(pg, tmp_path, restarts=1, kills=1, load_s=1.5)
    for times in run.recoveries.values():
        assert all(t < RECOVERY_BOUND_S for t in times)


@pytest.mark.slow
def test_ten_restarts_and_ten_backend_kills_lose_nothing_acknowledged(
    pg: PostgresCluster, tmp_path: Path
) -> None:
    fault_series(pg, tmp_path, restarts=10, kills=10, load_s=2.0)


@pytest.mark.slow
def test_the_audit_is_clean_after_backend_kills(pg: PostgresCluster, tmp_path: Path) -> None:
    """A killed backend fails the writer's transaction in flight; the writer tries it again on a new
    connection, so no publish is refused and the tables' history stays whole."""
    fault_series(pg, tmp_path, restarts=0, kills=5, load_s=1.5, audit=True)


@pytest.mark.slow
def test_the_audit_is_clean_after_restarts(pg: PostgresCluster, tmp_path: Path) -> None:
    """An early queue hands a consumer its messages before their commit; the writer holds what it
    took while PostgreSQL is away (message, delivery and ack rows in order) and refuses the
    publishes that come meanwhile, so the tables never record an ack of a message they lack."""
    fault_series(pg, tmp_path, restarts=3, kills=0, load_s=1.5, audit=True)


@pytest.mark.slow
def test_shared_queues_on_two_nodes_lose_nothing_acknowledged(pg: PostgresCluster, tmp_path: Path) -> None:
    """``queues.shared``: two servers on the database, publishers on one and consumers on the other,
    so that every delivery goes through a claim in PostgreSQL."""
    fault_series(pg, tmp_path, restarts=5, kills=5, load_s=2.0, shared=True)


def test_the_writer_holds_what_it_took_and_refuses_publishes_while_the_database_is_away(
    pg: PostgresCluster, caplog: pytest.LogCaptureFixture
) -> None:
    """PostgreSQL down: a write the writer had taken waits and commits once it is back (the loop has
    moved on from it: nothing taken is failed for an outage); while it is known away a refusable
    write (a publish) is refused at once with a one-line reason (what the publisher's refusal
    carries), and any other is taken and waits too. The log says so in one line, not a traceback
    per write, and says when it answers again."""
    storage = Storage.from_url(pg.create_database("writer"))
    storage.migrate()
    writer = GroupCommitWriter(storage.engine)
    errors: list[str] = []

    def one_write(name: str) -> WriteBatch:
        return WriteBatch(calls=[queue_store.upsert_queue(name, "work", {}, 1)])

    async def refused(name: str) -> None:
        writer.submit(one_write(name), wait=True, refusable=True)

    async def scenario() -> None:
        writer.start()
        try:
            await writer.write(one_write("before"))
            loop = asyncio.get_running_loop()
            waiting: list[concurrent.futures.Future[list[object]]] = []

            def while_down() -> None:
                waiting.append(asyncio.run_coroutine_threadsafe(writer.write(one_write("taken")), loop))
                wait_for(lambda: writer.away, 10, "the writer to find it away")
                for i in range(5):
                    with pytest.raises(WriterError) as failed:
                        asyncio.run_coroutine_threadsafe(refused(f"down{i}"), loop).result(10)
                    errors.append(str(failed.value))
                waiting.append(asyncio.run_coroutine_threadsafe(writer.write(one_write("settle")), loop))
                time.sleep(0.3)
                assert not any(future.done() for future in waiting)

            await asyncio.to_thread(pg.restart, "immediate", while_down=while_down)
            for future in waiting:
                await asyncio.wait_for(asyncio.wrap_future(future), 30)
            await writer.write(one_write("after"))
        finally:
            await writer.stop()

    try:
        with caplog.at_level(logging.INFO, logger="trimaran"):
            asyncio.run(scenario())
        with storage.engine.connect() as connection:
            names = {row[0] for row in connection.execute(text("SELECT name FROM queues"))}
    finally:
        storage.close()
    assert names == {"before", "taken", "settle", "after"}, names
    assert len(errors) == 5
    assert all(e.startswith("database unavailable: ") and "\n" not in e for e in errors), errors
    said = [r for r in caplog.records if r.name.startswith("trimaran") and r.levelno >= logging.INFO]
    assert [r.levelname for r in said] == ["WARNING", "INFO"], [r.getMessage() for r in said]
    assert "is unavailable" in said[0].getMessage() and said[0].exc_info is None
    assert "answers again" in said[1].getMessage()


def test_a_lone_write_on_a_killed_connection_commits_on_a_new_one(
    postgres_cluster: PostgresCluster, postgres_url: str
) -> None:
    """The writer's connection ended by the database (pg_terminate_backend, a fail-over): the next
    write, alone in its transaction, is tried again on a new connection instead of being refused."""
    storage = Storage.from_url(postgres_url)
    storage.migrate()
    writer = GroupCommitWriter(storage.engine)
    database = postgres_url.rsplit("/", 1)[1]

    async def scenario() -> None:
        writer.start()
        try:
            await writer.write(WriteBatch(calls=[queue_store.upsert_queue("before", "work", {}, 1)]))
            assert await asyncio.to_thread(postgres_cluster.terminate_backends, database) > 0
            await writer.write(WriteBatch(calls=[queue_store.upsert_queue("after", "work", {}, 1)]))
        finally:
            await writer.stop()

    try:
        asyncio.run(scenario())
    finally:
        storage.close()


def test_a_connection_lost_unseen_by_sqlalchemy_is_replaced(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A backend killed in the middle of a pipeline once left psycopg's connection answering
    "another command is already in progress" to every statement, SQLAlchemy not counting it lost:
    the writer retried on that connection for ever (a full run's time-out). The writer now drops a
    connection that failed as the database went away."""
    storage = Storage.from_url(postgres_url)
    storage.migrate()
    writer = GroupCommitWriter(storage.engine)
    real = writer_module.apply
    poisoned: list[object] = []

    def apply(connection: Any, batch: WriteBatch) -> list[Any]:
        raw = connection.connection.dbapi_connection
        if not poisoned:
            poisoned.append(raw)
        if raw is poisoned[0]:
            raise psycopg.OperationalError("another command is already in progress")
        return real(connection, batch)

    async def scenario() -> None:
        writer.start()
        try:
            with anyio.fail_after(10):
                await writer.write(WriteBatch(calls=[queue_store.upsert_queue("after", "work", {}, 1)]))
        finally:
            await writer.stop()

    monkeypatch.setattr(writer_module, "apply", apply)
    try:
        asyncio.run(scenario())
        assert [q["name"] for q in queue_store.load_queues(storage.engine)] == ["after"]
    finally:
        storage.close()
