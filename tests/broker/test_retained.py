"""RetainedStore: set/clear, wildcard lookups with the $ rule, expiry, load and change reporting."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trimaran.broker.message import Message
from trimaran.broker.retained import RetainedStore
from trimaran.topics import TopicError, topic_matches


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000

    def __call__(self) -> int:
        return self.now


def msg(topic: str, payload: bytes = b"x", expires_at_ms: int | None = None) -> Message:
    return Message(topic, payload, retain=True, expires_at_ms=expires_at_ms)


def topics_of(messages: list[Message]) -> list[str]:
    return sorted(m.topic for m in messages)


def make(*topics: str) -> RetainedStore:
    store = RetainedStore()
    for t in topics:
        store.set(msg(t))
    return store


def test_set_get_replace_clear() -> None:
    changes: list[tuple[str, Message | None]] = []
    store = RetainedStore(on_change=lambda t, m: changes.append((t, m)))
    first, second = msg("a/b", b"1"), msg("a/b", b"2")
    assert store.set(first) is True
    assert store.get("a/b") is first
    assert store.set(second) is True
    assert store.get("a/b") is second
    assert store.count() == 1 and len(store) == 1 and "a/b" in store
    assert store.set(msg("a/b", b"")) is True  # empty payload clears
    assert store.get("a/b") is None and "a/b" not in store
    assert store.set(msg("a/b", b"")) is False  # nothing to clear
    assert store.delete("a/b") is False
    assert changes == [("a/b", first), ("a/b", second), ("a/b", None)]
    assert store._root.children == {}  # pruned


def test_set_validates_topic() -> None:
    store = RetainedStore()
    for bad in ["", "a/+", "a/#"]:
        with pytest.raises(TopicError):
            store.set(msg(bad))


@pytest.mark.parametrize(
    ("f", "expected"),
    [
        ("#", ["/", "/x", "a", "a/b", "a/b/c", "a/c", "b"]),
        ("a/#", ["a", "a/b", "a/b/c", "a/c"]),
        ("a/+", ["a/b", "a/c"]),
        ("+", ["a", "b"]),
        ("+/+", ["/", "/x", "a/b", "a/c"]),  # "/" is two empty levels
        ("/+", ["/", "/x"]),
        ("+/#", ["/", "/x", "a", "a/b", "a/b/c", "a/c", "b"]),
        ("+/b/#", ["a/b", "a/b/c"]),
        ("a/b", ["a/b"]),
        ("a/z", []),
        ("z/#", []),
        ("$SYS/#", ["$SYS", "$SYS/load", "$SYS/x/y"]),
        ("$SYS/+", ["$SYS/load"]),
        ("+/load", []),
        ("$SYS", ["$SYS"]),
    ],
)
def test_match(f: str, expected: list[str]) -> None:
    store = make("a", "a/b", "a/b/c", "a/c", "b", "/", "/x", "$SYS", "$SYS/load", "$SYS/x/y")
    assert topics_of(store.match(f)) == expected


def test_match_rejects_invalid_filter() -> None:
    with pytest.raises(TopicError):
        RetainedStore().match("a/#/b")


def test_expiry() -> None:
    clock = Clock()
    changes: list[tuple[str, Message | None]] = []
    store = RetainedStore(clock=clock, on_change=lambda t, m: changes.append((t, m)))
    store.set(msg("a/1", expires_at_ms=clock.now + 1000))
    store.set(msg("a/2", expires_at_ms=clock.now + 2000))
    store.set(msg("a/3"))
    assert topics_of(store.match("a/+")) == ["a/1", "a/2", "a/3"]
    clock.now += 1000
    assert topics_of(store.match("a/#")) == ["a/2", "a/3"]
    assert store.count() == 2  # a/1 removed by the lookup that found it expired
    assert changes[-1] == ("a/1", None)
    clock.now += 1000
    assert store.get("a/2") is None
    assert store.count() == 1
    # an already expired message clears the topic instead of being stored
    assert store.set(msg("a/3", expires_at_ms=clock.now - 1)) is True
    assert store.count() == 0
    assert store.set(msg("a/4", expires_at_ms=clock.now)) is False


def test_purge_expired() -> None:
    clock = Clock()
    store = RetainedStore(clock=clock)
    store.set(msg("x", expires_at_ms=clock.now + 10))
    store.set(msg("y"))
    clock.now += 10
    assert store.purge_expired() == ["x"]
    assert [m.topic for m in store.messages()] == ["y"]


def test_load_and_clear() -> None:
    clock = Clock()
    changes: list[tuple[str, Message | None]] = []
    store = RetainedStore(clock=clock, on_change=lambda t, m: changes.append((t, m)))
    loaded = store.load([msg("a"), msg("b", b""), msg("c", expires_at_ms=clock.now), msg("d/e")])
    assert loaded == 2
    assert changes == []  # loading is not a change to write back
    assert topics_of(store.match("#")) == ["a", "d/e"]
    store.clear()
    assert store.count() == 0 and store.match("#") == []
    assert sorted(t for t, m in changes if m is None) == ["a", "d/e"]


level = st.sampled_from(["a", "b", "", "$s"])
topic_names = st.lists(level, min_size=1, max_size=4).map("/".join).filter(bool)
filters = st.builds(
    lambda levels, hash_last: "/".join([*levels, "#"] if hash_last else levels),
    st.lists(st.sampled_from(["a", "b", "", "+", "$s"]), max_size=4),
    st.booleans(),
).filter(bool)


@settings(max_examples=150)
@given(
    st.lists(st.tuples(topic_names, st.booleans(), st.sampled_from([None, 0, 5]))),
    st.lists(filters, min_size=1, max_size=5),
)
def test_match_equals_brute_force(ops: list[tuple[str, bool, int | None]], queries: list[str]) -> None:
    clock = Clock()
    store = RetainedStore(clock=clock)
    reference: dict[str, Message] = {}
    for topic, clear, expiry in ops:
        m = msg(topic, b"" if clear else b"p", None if expiry is None else clock.now + expiry)
        store.set(m)
        if clear:
            reference.pop(topic, None)
        else:
            reference[topic] = m
    clock.now += 1  # the messages with expiry 0 are now expired
    live = {t: m for t, m in reference.items() if not m.is_expired(clock.now)}
    for f in queries:
        got = store.match(f)
        assert len({id(m) for m in got}) == len(got)
        assert {m.topic: m for m in got} == {t: m for t, m in live.items() if topic_matches(f, t)}
    for t, m in live.items():
        assert store.get(t) is m
    store.purge_expired()
    assert store.count() == len(live)
