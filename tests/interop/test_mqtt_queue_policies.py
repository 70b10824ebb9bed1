"""Queue policies through MQTT with paho (3.1.1 and 5) against the real server.

Visibility timeout, nack backoff, TTL expiry, max length (reject and drop-oldest), stream start
positions and commits, named groups, and a SIGKILL restart in the middle of each. The queues with
short timeouts are declared in a config file (``[[queues.declare]]``) given to the server.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy

from tests.interop.conftest import endpoints_of, mqtt_server_args, start_server
from tests.support.paho import (
    V5,
    V311,
    Client,
    Endpoints,
    PacketTypes,
    close_all,
    connect,
    props,
    user_props,
    watch_pubacks,
)
from tests.support.server import RunningServer, serving

CONFIG = """
[queues.defaults]
backoff_initial_s = 0.1
backoff_max_s = 0.5

[[queues.declare]]
name = "vt"
visibility_timeout_s = 0.5

[[queues.declare]]
name = "backoff"
backoff_initial_s = 0.3
backoff_multiplier = 2.0
backoff_max_s = 5.0
max_attempts = 3

[[queues.declare]]
name = "restart-backoff"
backoff_initial_s = 2.5

[[queues.declare]]
name = "ttl"
ttl_s = 0.4

[[queues.declare]]
name = "capped"
max_length = 3
overflow = "reject"

[[queues.declare]]
name = "capped-drop"
max_length = 3
overflow = "drop-oldest"

[[queues.declare]]
name = "events"
mode = "stream"

[[queues.declare]]
name = "events-311"
mode = "stream"
"""

QUOTA_EXCEEDED = 0x97


def start(workdir: Path, tls_files: dict[str, str], storage_url: str | None = None) -> RunningServer:
    config = workdir / "trimaran.toml"
    config.write_text(CONFIG)
    env = {"TRIMARAN_STORAGE__URL": storage_url} if storage_url else None
    return start_server(workdir, tls_files, env, args=[*mqtt_server_args(), "--config", str(config)])


def sqlite_url(workdir: Path) -> str:
    return f"sqlite:///{workdir / 'data' / 'trimaran.db'}"


@pytest.fixture(scope="module")
def pserver(tmp_path_factory: pytest.TempPathFactory, tls_files: dict[str, str]) -> Iterator[RunningServer]:
    with serving(start(tmp_path_factory.mktemp("policies"), tls_files)) as server:
        yield server


@pytest.fixture(scope="module")
def ends(pserver: RunningServer, tls_files: dict[str, str]) -> Endpoints:
    return endpoints_of(pserver, tls_files)


def events(url: str, queue: str, kind: str) -> list[tuple[Any, ...]]:
    """(offset, reason, attempt) of the queue's events of one kind, read from the server's database."""
    engine = sqlalchemy.create_engine(url)
    try:
        with engine.connect() as db:
            rows = db.execute(
                sqlalchemy.text(
                    'SELECT "offset", reason, attempt FROM queue_events '
                    "WHERE queue = :q AND kind = :k ORDER BY id"
                ),
                {"q": queue, "k": kind},
            )
            return [tuple(row) for row in rows]
    finally:
        engine.dispose()


def wait_events(url: str, queue: str, kind: str, count: int, timeout: float = 5.0) -> list[tuple[Any, ...]]:
    deadline = time.monotonic() + timeout
    while len(found := events(url, queue, kind)) < count and time.monotonic() < deadline:
        time.sleep(0.05)
    return found


def stream_subscribe(client: Client, topic: str, group: str, start: str | None = None, qos: int = 1) -> None:
    pairs = [("consumer-group", group)] + ([("stream-offset", start)] if start is not None else [])
    client.subscribe(topic, qos=qos, properties=props(PacketTypes.SUBSCRIBE, UserProperty=pairs))


# -- work queues -----------------------------------------------------------------------------------


@pytest.mark.parametrize("version", [V311, V5])
def test_visibility_timeout_redelivers(ends: Endpoints, version: Any) -> None:
    q = "$queue/vt"
    pub = connect(ends, version=version)
    sub = connect(ends, version=version, manual_ack=True)
    try:
        sub.subscribe(q, qos=1)
        pub.publish(q, f"slow-{version}".encode(), qos=1)
        first = sub.expect()
        t0 = time.monotonic()
        second = sub.expect(5)  # never acked: back after visibility_timeout_s = 0.5
        waited = time.monotonic() - t0
        assert second.payload == first.payload
        assert 0.4 <= waited < 3.0, waited
        if version == V5:
            assert user_props(first)["x-queue-attempt"] == "1"
            assert user_props(second)["x-queue-redelivered"] == "true"
            assert user_props(second)["x-queue-attempt"] == "2"
        sub.client.ack(second.mid, 1)
        sub.expect_none(0.8)  # acked in time: no third copy
    finally:
        close_all(pub, sub)


def test_nack_backoff_is_respected_then_dead_letters(ends: Endpoints) -> None:
    q = "$queue/backoff"
    pub = connect(ends, version=V5)
    sub = connect(ends, version=V5, manual_ack=True)
    dlq = connect(ends, version=V5)
    try:
        sub.subscribe(q, qos=1)
        pub.publish(q, b"flaky", qos=1)
        got = sub.expect()
        message_id = user_props(got)["x-queue-message-id"]
        for attempt, delay in ((1, 0.3), (2, 0.6)):  # initial 0.3 s, multiplier 2
            assert user_props(got)["x-queue-attempt"] == str(attempt)
            sent = time.monotonic()
            sub.publish(f"{q}/$nack", b"", qos=1, properties=props(UserProperty=[("message-id", message_id)]))
            sub.client.ack(got.mid, 1)
            got = sub.expect(5)
            waited = time.monotonic() - sent
            assert delay - 0.01 <= waited < delay + 2.0, (attempt, waited)
            assert user_props(got)["x-queue-message-id"] == message_id
        assert user_props(got)["x-queue-attempt"] == "3"
        sub.publish(f"{q}/$nack", b"", qos=1, properties=props(UserProperty=[("message-id", message_id)]))
        sub.client.ack(got.mid, 1)
        dlq.subscribe("$queue/$dlq/backoff", qos=1)
        dead = dlq.expect()  # max_attempts = 3: the third nack dead-letters it
        assert dead.payload == b"flaky"
        assert user_props(dead)["x-dead-letter-reason"] == "max_attempts"
        assert user_props(dead)["x-dead-letter-attempts"] == "3"
        sub.expect_none(0.5)
    finally:
        close_all(pub, sub, dlq)


@pytest.mark.parametrize("version", [V311, V5])
def test_ttl_expiry_drops_and_logs(ends: Endpoints, pserver: RunningServer, version: Any) -> None:
    q = "$queue/ttl"
    pub = connect(ends, version=version)
    try:
        before = len(events(sqlite_url(pserver.cwd), "ttl", "expired"))
        pub.publish(q, b"stale", qos=1)
        time.sleep(0.5)  # ttl_s = 0.4
        pub.publish(q, b"fresh", qos=1)
        sub = connect(ends, version=version)
        try:
            sub.subscribe(q, qos=1)
            assert sub.expect().payload == b"fresh"
            sub.expect_none(0.3)
        finally:
            sub.disconnect()
        expired = wait_events(sqlite_url(pserver.cwd), "ttl", "expired", before + 1)
        assert len(expired) == before + 1 and expired[-1][1] == "ttl"
    finally:
        close_all(pub)


def test_max_length_reject_refuses_with_quota_exceeded_v5(ends: Endpoints) -> None:
    q = "$queue/capped"
    pub = connect(ends, version=V5)
    try:
        codes = watch_pubacks(pub)
        infos = [pub.publish(q, f"m{i}".encode(), qos=1) for i in range(4)]
        assert [codes[i.mid] for i in infos] == [0, 0, 0, QUOTA_EXCEEDED]
        sub = connect(ends, version=V5)
        try:
            sub.subscribe(q, qos=1)
            assert [m.payload for m in sub.drain(3)] == [b"m0", b"m1", b"m2"]
            sub.expect_none(0.3)
            info = pub.publish(q, b"m4", qos=1)  # room again once consumed
            assert codes[info.mid] == 0
            assert sub.expect().payload == b"m4"
        finally:
            sub.disconnect()
    finally:
        close_all(pub)


def test_max_length_reject_closes_v311(ends: Endpoints) -> None:
    q = "$queue/capped"
    filler = connect(ends, version=V311)
    try:
        for i in range(3):
            filler.publish(q, f"f{i}".encode(), qos=1)
        filler.publish(q, b"over", qos=1, wait=False)
        filler.disconnects.get(timeout=5)  # 3.1.1 has no negative PUBACK: the server closes
    finally:
        filler.client.loop_stop()
    sub = connect(ends, version=V311)
    try:
        sub.subscribe(q, qos=1)
        assert [m.payload for m in sub.drain(3)] == [b"f0", b"f1", b"f2"]
        sub.expect_none(0.3)
    finally:
        sub.disconnect()


@pytest.mark.parametrize("version", [V311, V5])
def test_max_length_drop_oldest_counts(ends: Endpoints, pserver: RunningServer, version: Any) -> None:
    q = "$queue/capped-drop"
    pub = connect(ends, version=version)
    try:
        before = len(events(sqlite_url(pserver.cwd), "capped-drop", "dropped"))
        for i in range(5):
            pub.publish(q, f"m{i}".encode(), qos=1)  # all accepted
        sub = connect(ends, version=version)
        try:
            sub.subscribe(q, qos=1)
            assert [m.payload for m in sub.drain(3)] == [b"m2", b"m3", b"m4"]
            sub.expect_none(0.3)
        finally:
            sub.disconnect()
        dropped = wait_events(sqlite_url(pserver.cwd), "capped-drop", "dropped", before + 2)[before:]
        assert [reason for _, reason, _ in dropped] == ["overflow", "overflow"]
    finally:
        close_all(pub)


@pytest.mark.parametrize("version", [V311, V5])
def test_two_groups_each_receive_everything(ends: Endpoints, version: Any) -> None:
    q = f"$queue/two-groups-{version}"
    g1 = connect(ends, version=version)
    g2a = connect(ends, version=version)
    g2b = connect(ends, version=version)
    pub = connect(ends, version=version)
    try:
        g1.subscribe(f"$share/billing/{q}", qos=1)
        g2a.subscribe(f"$share/audit/{q}", qos=1)
        g2b.subscribe(f"$share/audit/{q}", qos=1)  # two consumers compete inside one group
        expected = [f"m{i}".encode() for i in range(20)]
        for payload in expected:
            pub.publish(q, payload, qos=1)
        assert [m.payload for m in g1.drain(20)] == expected
        audit: list[bytes] = []
        deadline = time.monotonic() + 10
        while len(audit) < 20 and time.monotonic() < deadline:
            for c in (g2a, g2b):
                with contextlib.suppress(Exception):
                    audit.append(c.expect(0.02).payload)
        assert sorted(audit) == sorted(expected)
        for c in (g1, g2a, g2b):
            c.expect_none(0.2)
    finally:
        close_all(g1, g2a, g2b, pub)


# -- streams ---------------------------------------------------------------------------------------


def test_stream_start_positions(ends: Endpoints) -> None:
    q = "$queue/events"
    pub = connect(ends, version=V5)
    clients: list[Client] = [pub]
    try:
        for i in range(2):
            pub.publish(q, f"s{i}".encode(), qos=1)
        time.sleep(0.05)
        stamp = int(time.time() * 1000)
        time.sleep(0.05)
        for i in range(2, 5):
            pub.publish(q, f"s{i}".encode(), qos=1)
        all5 = [f"s{i}".encode() for i in range(5)]

        def reader(group: str, start: str | None) -> Client:
            c = connect(ends, version=V5)
            clients.append(c)
            stream_subscribe(c, q, group, start)
            return c

        first = reader("from-first", "first")
        from_first = first.drain(5)
        assert [m.payload for m in from_first] == all5
        offsets = [int(user_props(m)["x-queue-offset"]) for m in from_first]
        assert offsets == list(range(offsets[0], offsets[0] + 5))
        last = reader("from-last", "last")
        assert last.expect().payload == b"s4"
        nxt = reader("from-next", "next")
        by_offset = reader("from-offset", str(offsets[2]))
        assert [m.payload for m in by_offset.drain(3)] == all5[2:]
        by_time = reader("from-time", f"timestamp:{stamp}")
        assert [m.payload for m in by_time.drain(3)] == all5[2:]
        default = reader("from-default", None)  # a new stream group starts at "next"
        for c in (first, last, nxt, by_offset, by_time, default):
            c.expect_none(0.2)
        pub.publish(q, b"s5", qos=1)
        for c in (first, last, nxt, by_offset, by_time, default):
            assert c.expect().payload == b"s5"
    finally:
        close_all(*clients)


def test_stream_commits_by_ack_and_by_commit_topic_v5(ends: Endpoints) -> None:
    q = "$queue/events"
    pub = connect(ends, version=V5)
    first_run = connect(ends, version=V5, manual_ack=True)
    try:
        stream_subscribe(first_run, q, "committer", "next")
        for i in range(6):
            pub.publish(q, f"c{i}".encode(), qos=1)
        got = first_run.drain(6)
        assert [m.payload for m in got] == [f"c{i}".encode() for i in range(6)]
        first_run.client.ack(got[0].mid, 1)  # commit by PUBACK: c0 done
        first_run.client.ack(got[1].mid, 1)
        commit_id = user_props(got[3])["x-queue-message-id"]  # commit by topic: through c3
        first_run.publish(
            f"{q}/$commit",
            b"",
            qos=1,
            properties=props(UserProperty=[("message-id", commit_id), ("consumer-group", "committer")]),
        )
        first_run.drop()  # c4 and c5 were never committed
        again = connect(ends, version=V5)
        try:
            stream_subscribe(again, q, "committer")  # no start: resume at the committed offset
            assert [m.payload for m in again.drain(2)] == [b"c4", b"c5"]
            again.expect_none(0.3)
        finally:
            again.disconnect()
    finally:
        close_all(pub)


def test_stream_commit_by_puback_v311(ends: Endpoints) -> None:
    q = "$queue/events-311"
    pub = connect(ends, version=V311)
    sub = connect(ends, version=V311)  # paho PUBACKs each delivery: each one commits
    try:
        sub.subscribe(f"$share/reader/{q}", qos=1)  # a new group starts at "next"
        for i in range(3):
            pub.publish(q, f"p{i}".encode(), qos=1)
        assert [m.payload for m in sub.drain(3)] == [b"p0", b"p1", b"p2"]
        time.sleep(0.2)  # the PUBACKs reach the server
        sub.disconnect()
        pub.publish(q, b"p3", qos=1)
        sub = connect(ends, version=V311)
        sub.subscribe(f"$share/reader/{q}", qos=1)
        assert sub.expect().payload == b"p3"  # resumes after the last commit, nothing repeated
        sub.expect_none(0.3)
    finally:
        close_all(pub, sub)


# -- a restart in the middle of each ---------------------------------------------------------------


def test_sigkill_restart_keeps_pending_entries_cursors_and_limits(
    tmp_path: Path, tls_files: dict[str, str], storage_url: str
) -> None:
    """On SQLite and on PostgreSQL (``storage_url`` runs it on each)."""
    server = start(tmp_path, tls_files, storage_url)
    try:
        ends = endpoints_of(server, tls_files)
        pub = connect(ends, version=V5)
        # Work queue: one delivery held (unacked), one acked, one nacked with a backoff.
        held_sub = connect(ends, version=V5, manual_ack=True)
        held_sub.subscribe("$queue/restart-work", qos=1)  # default 30 s visibility timeout
        pub.publish("$queue/restart-work", b"held", qos=1)
        held = held_sub.expect()
        held_sub.client.ack(held.mid, 1)  # acked ...
        pub.publish("$queue/restart-work", b"unacked", qos=1)
        unacked = held_sub.expect()  # ... and this one is held when the server dies
        pub.publish("$queue/restart-backoff", b"retry", qos=1)
        nack_sub = connect(ends, version=V5, manual_ack=True)
        nack_sub.subscribe("$queue/restart-backoff", qos=1)
        retry = nack_sub.expect()
        # Wall-clock time, as the retry's due time is kept across the restart: a step of the host's
        # clock (seen: 11 ms) moves both, where the monotonic clock would not.
        nacked_at = time.time()
        nack_sub.publish(
            "$queue/restart-backoff/$nack",
            b"",
            qos=1,
            properties=props(UserProperty=[("message-id", user_props(retry)["x-queue-message-id"])]),
        )
        # Groups: "billing" consumed everything, "audit" nothing.
        billing = connect(ends, version=V5)
        billing.subscribe("$share/billing/$queue/restart-groups", qos=1)
        audit = connect(ends, version=V5, manual_ack=True)
        audit.subscribe("$share/audit/$queue/restart-groups", qos=1)
        for i in range(3):
            pub.publish("$queue/restart-groups", f"g{i}".encode(), qos=1)
        assert len(billing.drain(3)) == 3 and len(audit.drain(3)) == 3
        # Stream: committed through s1 of s0..s3.
        reader = connect(ends, version=V5, manual_ack=True)
        stream_subscribe(reader, "$queue/events", "restart-reader", "next")
        for i in range(4):
            pub.publish("$queue/events", f"r{i}".encode(), qos=1)
        got = reader.drain(4)
        reader.client.ack(got[0].mid, 1)
        reader.client.ack(got[1].mid, 1)
        # Max length: the capped queue is full; TTL: a message that expires while the server is down.
        for i in range(3):
            pub.publish("$queue/capped", f"k{i}".encode(), qos=1)
        pub.publish("$queue/ttl", b"expires-while-down", qos=1)
        time.sleep(0.5)  # acks and deliveries are in the next group commit
        server.kill()
        for c in (pub, held_sub, nack_sub, billing, audit, reader):
            c.client.loop_stop()
        assert unacked.payload == b"unacked"
    finally:
        server.kill()

    server = start(tmp_path, tls_files, storage_url)
    clients: list[Client] = []
    try:
        ends = endpoints_of(server, tls_files)

        def client(**kw: Any) -> Client:
            c = connect(ends, version=V5, **kw)
            clients.append(c)
            return c

        vt = client()
        vt.subscribe("$queue/restart-work", qos=1)
        back = vt.expect()
        assert back.payload == b"unacked"  # the held one comes back, the acked one does not
        assert (
            user_props(back)["x-queue-redelivered"] == "true" and user_props(back)["x-queue-attempt"] == "2"
        )
        vt.expect_none(0.3)

        retry_sub = client()
        retry_sub.subscribe("$queue/restart-backoff", qos=1)
        again = retry_sub.expect(8)
        assert again.payload == b"retry" and user_props(again)["x-queue-attempt"] == "2"
        assert time.time() - nacked_at >= 2.49  # its 2.5 s backoff survived the restart

        billing = client()
        billing.subscribe("$share/billing/$queue/restart-groups", qos=1)
        billing.expect_none(0.3)  # its cursor survived
        audit = client()
        audit.subscribe("$share/audit/$queue/restart-groups", qos=1)
        assert [m.payload for m in audit.drain(3)] == [b"g0", b"g1", b"g2"]

        reader = client()
        stream_subscribe(reader, "$queue/events", "restart-reader")
        assert [m.payload for m in reader.drain(2)] == [b"r2", b"r3"]  # from the committed offset
        reader.expect_none(0.3)

        pub = client()
        codes = watch_pubacks(pub)
        info = pub.publish("$queue/capped", b"over", qos=1)
        assert codes[info.mid] == QUOTA_EXCEEDED  # the queue is still full after the restart

        ttl = client()
        ttl.subscribe("$queue/ttl", qos=1)
        ttl.expect_none(0.5)  # expired while the server was down
        assert wait_events(storage_url, "ttl", "expired", 1)
    finally:
        close_all(*clients)
        assert server.stop() == 0, server.output()
