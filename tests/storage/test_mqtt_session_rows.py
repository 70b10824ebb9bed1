"""Persistent sessions are saved incrementally: a filling offline session writes the messages it
gained since the last save, a row each, never its whole queue on the loop every tick."""

from __future__ import annotations

import json

from trimaran.mqtt.handler import session_row
from trimaran.mqtt.session import OutboundMessage, Session
from trimaran.storage.mqtt_store import MqttStore, StoredSession
from trimaran.storage.store import Storage

PAYLOAD = b"p" * 16 * 1024


def queued(i: int) -> OutboundMessage:
    return OutboundMessage(f"t/{i}", PAYLOAD, qos=1)


def save(store: MqttStore, session: Session) -> StoredSession:
    """What MqttFrontEnd.persist does for one session: build on the loop, write, mark saved."""
    row = session_row(session, 5, True, 1000)
    next_seq = session.queue.next_seq
    store.save_sessions([row])
    session.saved_seq = next_seq
    return row


def restore(store: MqttStore, client_id: str) -> Session:
    (row,) = [s for s in store.load_sessions() if s.client_id == client_id]
    return Session.from_json(row.state, row.queued)


def test_filling_session_costs_each_tick_only_what_it_gained(storage_url: str) -> None:
    storage = Storage.from_url(storage_url)
    storage.migrate()
    store = MqttStore(storage.engine)
    try:
        session = Session("offline", expiry_interval=3600, max_queued=20_000)
        written: list[int] = []
        state_sizes: list[int] = []
        for tick in range(100):  # 100 ticks of 100 x 16 KB: 10,000 queued, 160 MB
            for i in range(100):
                assert session.enqueue(queued(tick * 100 + i))
            row = session_row(session, 5, True, 1000)
            written.append(len(row.queued))
            state_sizes.append(len(row.state))
            store.save_sessions([row])
            session.saved_seq = session.queue.next_seq
        # What a tick costs is what it writes: the 100 messages it gained and a state document that
        # does not grow with the queue (the whole queue as one JSON document is ~220 MB of text).
        # Counted, not timed: a timing bound fails on a loaded machine and proves less.
        assert written == [100] * 100
        assert len(session.queue) == 10_000
        assert max(state_sizes) == min(state_sizes) < 4096, (min(state_sizes), max(state_sizes))
        assert len(json.loads(row.state)["queue"]) == 0
        again = restore(store, "offline")
        assert [m.topic for m in again.queue] == [f"t/{i}" for i in range(10_000)]
        assert again.queue.first_seq == 0 and again.saved_seq == 10_000
    finally:
        storage.close()


def test_sent_messages_rows_go_and_a_clean_session_replaces_them(storage_url: str) -> None:
    storage = Storage.from_url(storage_url)
    storage.migrate()
    store = MqttStore(storage.engine)
    try:
        session = Session("c", expiry_interval=60)
        for i in range(5):
            session.enqueue(queued(i))
        save(store, session)
        first = session.next_to_send(window=2)
        session.next_to_send(window=2)
        assert first is not None
        session.enqueue(queued(5))
        row = save(store, session)
        assert [seq for seq, _ in row.queued] == [5]
        again = restore(store, "c")
        assert [m.topic for m in again.queue] == ["t/2", "t/3", "t/4", "t/5"]
        assert [e.topic for e in again.inflight_entries()] == ["t/0", "t/1"]
        # A new session under the same client id (clean start): nothing of the old queue survives.
        fresh = Session("c", expiry_interval=60)
        fresh.enqueue(queued(9))
        save(store, fresh)
        assert [m.topic for m in restore(store, "c").queue] == ["t/9"]
        store.delete_sessions(["c"])
        assert store.load_sessions() == []
    finally:
        storage.close()


def test_session_stored_whole_is_read_and_rewritten_as_rows(storage_url: str) -> None:
    """A session saved before the rows existed (its queue inside its JSON) still restores, and its
    next save moves its queue into rows."""
    storage = Storage.from_url(storage_url)
    storage.migrate()
    store = MqttStore(storage.engine)
    try:
        old = Session("legacy", expiry_interval=60)
        for i in range(3):
            old.enqueue(queued(i))
        whole = json.loads(old.to_json())
        del whole["queue_first_seq"]
        store.save_sessions([StoredSession("legacy", 5, 60, 1000, json.dumps(whole))])
        session = restore(store, "legacy")
        assert session.saved_seq is None and len(session.queue) == 3
        session.enqueue(queued(3))
        row = save(store, session)
        assert row.replace and [seq for seq, _ in row.queued] == [0, 1, 2, 3]
        assert [m.topic for m in restore(store, "legacy").queue] == ["t/0", "t/1", "t/2", "t/3"]
    finally:
        storage.close()
