from __future__ import annotations

from trimaran.broker.message import Message
from trimaran.storage.mqtt_store import MqttStore, StoredSession
from trimaran.storage.store import Storage


def open_store(url: str) -> tuple[Storage, MqttStore]:
    storage = Storage.from_url(url)
    storage.migrate()
    return storage, MqttStore(storage.engine)


def test_retained_upsert_delete_and_reload(storage_url: str) -> None:
    storage, store = open_store(storage_url)
    store.write_retained({"a": Message("a", b"1", qos=1, retain=True), "b": Message("b", b"2", retain=True)})
    store.write_retained({"a": Message("a", b"3", qos=0, retain=True), "b": None})
    storage.close()
    storage, store = open_store(storage_url)
    try:
        loaded = store.load_retained()
        assert [(m.topic, m.payload, m.qos, m.retain) for m in loaded] == [("a", b"3", 0, True)]
    finally:
        storage.close()


def test_expired_retained_messages_are_not_loaded(storage_url: str) -> None:
    storage, store = open_store(storage_url)
    try:
        store.write_retained({"old": Message("old", b"x", retain=True, expires_at_ms=1)})
        assert store.load_retained() == []
    finally:
        storage.close()


def test_sessions_replace_and_delete(storage_url: str) -> None:
    storage, store = open_store(storage_url)
    try:
        store.save_sessions([StoredSession("c1", 5, 60, None, '{"subs": 1}')])
        store.save_sessions([StoredSession("c1", 5, 120, 1000, '{"subs": 2}')])
        store.save_sessions([StoredSession("c2", 4, 0, None, "{}")])
        loaded = {s.client_id: s for s in store.load_sessions()}
        assert loaded["c1"].expiry_interval_s == 120 and loaded["c1"].state == '{"subs": 2}'
        assert loaded["c1"].disconnected_at == 1000
        store.delete_sessions(["c1"])
        assert [s.client_id for s in store.load_sessions()] == ["c2"]
    finally:
        storage.close()


def test_incremental_saves_of_many_sessions_in_one_batch(storage_url: str) -> None:
    """Sessions saved together, some with new queued rows and some without, each keep only theirs:
    one delete statement serves them all, with row numbers far apart as parameters."""
    storage, store = open_store(storage_url)
    try:
        first = [(1, "m1"), (2, "m2"), (3, "m3")]
        store.save_sessions([StoredSession(c, 4, 60, None, "{}", list(first)) for c in ("a", "b", "c")])
        store.save_sessions(
            [
                StoredSession("a", 4, 60, None, "{}", [(4, "m4")], first_seq=2, replace=False),  # 1 sent
                StoredSession("b", 4, 60, None, "{}", [], first_seq=3, replace=False),  # 1, 2 sent
                # A concurrent save wrote row 3 already: it is written again, not doubled.
                StoredSession("c", 4, 60, None, "{}", [(3, "m3'")], first_seq=1, replace=False),
            ]
        )
        loaded = {s.client_id: s.queued for s in store.load_sessions()}
        assert loaded == {
            "a": [(2, "m2"), (3, "m3"), (4, "m4")],
            "b": [(3, "m3")],
            "c": [(1, "m1"), (2, "m2"), (3, "m3'")],
        }
    finally:
        storage.close()
