"""kill -9 of a real ``trimaran serve`` under load, again and again on the same data (issue #15).

Each life of the server: consumers (paho QoS 1 and pika, each on both queues, acking in batches so
that some deliveries are always held) drain what the previous life owed; then an MQTT publisher
(QoS 1 to ``$queue/crash-mqtt``) and two AMQP 0.9.1 publishers (persistent, confirms, to the durable
queue ``crash-amqp``) run beside them until the server is killed at a seeded random moment. After
every restart:

- every message the broker acknowledged (PUBACK 0, basic.ack) and no consumer acked is delivered
  again: nothing acknowledged is lost;
- a message delivered in an earlier life and delivered again carries the redelivery flag (MQTT DUP,
  AMQP ``redelivered``), and a message first delivered in the life it was published in does not.

A last life drains everything, stops with SIGTERM, and ``trimaran audit`` replays the tables: every
invariant must hold. ``TRIMARAN_CRASH_SEED`` repeats a series; the seed is in every failure.
"""

from __future__ import annotations

import os
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.support.audit import audit as run_audit
from tests.support.audit import audit_in, cannot_audit
from tests.support.crash import (
    AmqpConsumer,
    AmqpPublisher,
    Ledger,
    MqttConsumer,
    MqttPublisher,
    Worker,
)
from tests.support.paho import Endpoints
from tests.support.server import RunningServer

SERVER_ARGS = ["--mqtt", "127.0.0.1:0", "--mqtt-ws", "off", "--amqp", "127.0.0.1:0", "--http", "off"]
SERVER_ENV = {
    # A held delivery is released by the restart, never by a visibility timeout inside a life, and a
    # message held at many kills in a row is not dead-lettered: every redelivery here is the crash's.
    "TRIMARAN_QUEUES__DEFAULTS__VISIBILITY_TIMEOUT_S": "600",
    "TRIMARAN_QUEUES__DEFAULTS__MAX_ATTEMPTS": "1000",
    "TRIMARAN_STORAGE__SQLITE_SYNCHRONOUS": "full",
    "TRIMARAN_LIMITS__SYS_INTERVAL": "0",
}
DRAIN_TIMEOUT_S = 20.0


@dataclass
class Series:
    seed: int
    url: str
    workdir: Path
    ledger: Ledger = field(default_factory=Ledger, repr=False)
    kills: int = 0
    lines: list[str] = field(default_factory=list, repr=False)  # one per life, for the report

    def where(self, life: int) -> str:
        return f"(seed {self.seed}, life {life}; TRIMARAN_CRASH_SEED={self.seed} repeats it)"


def _start(series: Series) -> RunningServer:
    env = {**SERVER_ENV, "TRIMARAN_STORAGE__URL": series.url}
    return RunningServer(SERVER_ARGS, cwd=series.workdir, env=env).start(timeout=60)


def _endpoints(server: RunningServer) -> Endpoints:
    return Endpoints("127.0.0.1", server.ports["mqtt"])


def _check_errors(workers: list[Worker], series: Series, life: int, *, killed: bool = False) -> None:
    for w in workers:
        why = w.failure(killed=killed)
        assert why is None, f"{w.name} failed {series.where(life)}: {why}"


def _drain(series: Series, life: int, owed: set[str], server: RunningServer) -> None:
    """Wait until every owed message was delivered in this life."""
    deadline = time.monotonic() + DRAIN_TIMEOUT_S
    while time.monotonic() < deadline:
        if owed <= series.ledger.received_in(life):
            return
        assert server.process is not None and server.process.poll() is None, server.output()
        time.sleep(0.02)
    missing = sorted(owed - series.ledger.received_in(life))
    raise AssertionError(
        f"{len(missing)} acknowledged messages lost after kill {series.kills} {series.where(life)}, "
        f"e.g. {missing[:10]}"
    )


def _check_flags(series: Series, life: int) -> None:
    """Deliveries of this life: flagged when delivered in an earlier life, not flagged when first
    delivered in the life they were published in."""
    ledger = series.ledger
    unflagged: list[str] = []
    wrongly: list[str] = []
    with ledger.lock:
        for payload, receipts in ledger.receipts.items():
            earlier = any(r.life < life for r in receipts)
            for i, r in enumerate(receipts):
                if r.life != life:
                    continue
                if earlier and not r.flagged:
                    unflagged.append(f"{payload} to {r.consumer}")
                if i == 0 and r.flagged and ledger.published_in.get(payload) == life:
                    wrongly.append(f"{payload} to {r.consumer}")
    by_consumer = Counter(u.rpartition(" to ")[2] for u in unflagged)
    assert not unflagged, (
        f"{len(unflagged)} redeliveries without the flag {series.where(life)} ({dict(by_consumer)}), "
        f"e.g. {unflagged[:10]}"
    )
    assert not wrongly, f"{len(wrongly)} first deliveries flagged {series.where(life)}, e.g. {wrongly[:10]}"


def _life(series: Series, life: int, rng: random.Random, *, kill: bool) -> None:
    started = time.monotonic()
    owed = series.ledger.owed()
    server = _start(series)
    workers: list[Worker] = []
    try:
        mqtt, amqp = _endpoints(server), server.ports["amqp"]
        consumers: list[Worker] = [
            MqttConsumer(series.ledger, life, mqtt).start(),
            AmqpConsumer(series.ledger, life, amqp).start(),
        ]
        workers += consumers
        _drain(series, life, owed, server)
        _check_errors(workers, series, life)
        drained = time.monotonic() - started
        if kill:
            workers += [
                MqttPublisher(series.ledger, life, mqtt).start(),
                AmqpPublisher(series.ledger, life, amqp, "x").start(),
                AmqpPublisher(series.ledger, life, amqp, "y").start(),
            ]
            load_s = rng.uniform(0.3, 1.5)
            time.sleep(load_s)
            _check_errors(workers, series, life)
            server.kill()
            series.kills += 1
            for w in workers:
                w.thread.join(10)
                assert not w.thread.is_alive(), f"{w.name} hangs after the kill {series.where(life)}"
            _check_errors(workers, series, life, killed=True)
            what = f"killed after {load_s:.2f} s of load"
        else:
            time.sleep(0.5)  # let the last acks land before the consumers leave
            for w in consumers:
                w.stop()
            _check_errors(workers, series, life)
            assert server.stop() == 0, server.output()
            what = "stopped with SIGTERM"
        _check_flags(series, life)
        series.lines.append(
            f"life {life}: {len(owed)} owed drained in {drained:.2f} s, {what}; {series.ledger.counts()}"
        )
    finally:
        for w in workers:
            w.stopping.set()
        server.kill()


def run_series(
    url: str, workdir: Path, runs: int, *, audit: bool = True, request: pytest.FixtureRequest | None = None
) -> Series:
    """``runs`` lives killed under load, one drained and stopped, then (``audit``) the audit; when
    the audit cannot run here the test is skipped after the kill checks passed, saying both. With
    ``request`` (the test's), the audit runs in this process on the session's ``spark``
    fixture, else as ``trimaran audit`` in a subprocess of its own."""
    seed = int(os.environ.get("TRIMARAN_CRASH_SEED") or random.randrange(1 << 32))
    rng = random.Random(seed)
    series = Series(seed, url, workdir)
    started = time.monotonic()
    for life in range(runs):
        _life(series, life, rng, kill=True)
    _life(series, runs, rng, kill=False)
    counts = series.ledger.counts()
    assert series.kills == runs
    assert counts["confirmed"] > 0 and counts["redelivered"] > 0, counts
    audit_started = time.monotonic()
    why_not = cannot_audit() if audit else None
    if audit and why_not is None and request is not None:
        audit_in(request.getfixturevalue("spark"), series.url, workdir / "audit", series.where(-1))
    elif audit and why_not is None:
        run_audit(series.url, workdir / "audit", series.where(-1))
    audited = (
        "no audit" if not audit or why_not else f"audit clean in {time.monotonic() - audit_started:.1f} s"
    )
    total = time.monotonic() - started
    series.lines.append(f"seed {seed}: {runs} kills, {total:.1f} s ({audited}); {counts}")
    print("\n".join(series.lines))
    if why_not is not None:
        pytest.skip(f"{runs} kills lost nothing, flags right; audit not run: {why_not}")
    return series


def test_two_kills_lose_nothing(storage_url: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    # The audit on SQLite only, in this process on the tests' Spark session (tests/conftest.py;
    # tests/analytics started it already): a subprocess's audit costs about 20 s, mostly the JVM's
    # start. The slow series audits both, each as `trimaran audit` in a subprocess.
    run_series(storage_url, tmp_path, runs=2, audit=storage_url.startswith("sqlite"), request=request)


@pytest.mark.slow
def test_twenty_kills_lose_nothing(storage_url: str, tmp_path: Path) -> None:
    run_series(storage_url, tmp_path, runs=20)
