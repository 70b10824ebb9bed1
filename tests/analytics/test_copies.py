"""Dead-letter and redrive copies matched with their causes (``copies.py``), without Spark."""

from __future__ import annotations

from typing import Any

from trimaran.analytics.copies import trace

AUDITED = {"q", "$dlq/q", "d"}


def cause(queue: str, offset: int, event_id: int, kind: str, reason: str, group: str | None = "g") -> Any:
    return (queue, offset, 0, event_id, kind, group, reason)


def copy(queue: str, offset: int, event_id: int, reason: str) -> Any:
    return (queue, offset, 0, event_id, reason)


def flagged(found: list[tuple[Any, ...]]) -> list[tuple[str, str, str]]:
    return [(v[0], v[5], v[7]) for v in found]


def test_each_cause_with_its_copy_is_clean() -> None:
    causes = [
        cause("q", 3, 10, "dead_lettered", "rejected -> $dlq/q:0"),
        cause("q", 3, 12, "dead_lettered", "max_attempts -> $dlq/q:1", group="h"),  # two groups, two copies
        cause("$dlq/q", 0, 20, "redriven", "-> q:9", group=None),
    ]
    copies = [
        copy("$dlq/q", 0, 11, "dead_letter from q:3"),
        copy("$dlq/q", 1, 13, "dead_letter from q:3"),
        copy("q", 9, 19, "redrive from $dlq/q:0"),
    ]
    assert trace(causes, copies, AUDITED) == []


def test_causes_that_name_no_offset_match_any_copy_of_their_source() -> None:
    """An expiry through a dead-letter exchange, and a shared dead-letter queue, name only queues."""
    causes = [
        cause("q", 4, 10, "expired", "ttl -> $dlq/q,d", group=None),
        cause("q", 5, 12, "dead_lettered", "rejected -> d"),
    ]
    copies = [
        copy("$dlq/q", 7, 11, "dead_letter from q:4"),
        copy("d", 2, 11, "dead_letter from q:4"),
        copy("d", 3, 13, "dead_letter from q:5"),
    ]
    assert trace(causes, copies, AUDITED) == []
    assert flagged(trace(causes, copies[1:], AUDITED)) == [
        ("copies_traced", "q:4", "expired into $dlq/q, but no copy of q:4 arrived there")
    ]


def test_a_cause_without_its_copy_names_both_ends() -> None:
    causes = [cause("q", 3, 10, "dead_lettered", "rejected -> $dlq/q:0")]
    assert flagged(trace(causes, [], AUDITED)) == [
        ("copies_traced", "q:3", "dead_lettered into $dlq/q:0, but $dlq/q:0 is no copy of q:3")
    ]
    # A dead-letter queue the audit did not read (in memory, or not selected) is not held to it.
    assert trace(causes, [], {"q"}) == []
    nowhere = [cause("q", 3, 10, "dead_lettered", "rejected")]
    assert flagged(trace(nowhere, [], AUDITED)) == [
        ("copies_traced", "q:3", "dead_lettered (rejected) names no copy")
    ]


def test_a_copy_without_its_cause_and_a_second_copy() -> None:
    stray = [copy("$dlq/q", 5, 30, "dead_letter from q:8")]
    assert flagged(trace([], stray, AUDITED)) == [
        (
            "copies_traced",
            "$dlq/q:5",
            "a copy of q:8, but q:8 has no dead_lettered, expired or dropped event naming $dlq/q:5",
        )
    ]
    causes = [cause("q", 3, 10, "dead_lettered", "rejected -> $dlq/q:0")]
    twice = [copy("$dlq/q", 0, 11, "dead_letter from q:3"), copy("$dlq/q", 0, 12, "dead_letter from q:3")]
    second = "a second copy of q:3 at $dlq/q:0; its dead_lettered, expired or dropped event names one"
    assert flagged(trace(causes, twice, AUDITED)) == [("copies_traced", "$dlq/q:0", second)]
    back = [copy("q", 9, 19, "redrive from $dlq/q:0")]
    assert flagged(trace([], back, AUDITED)) == [
        ("copies_traced", "q:9", "a copy of $dlq/q:0, but $dlq/q:0 has no redriven event naming q:9")
    ]
    # A redrive names its own kind of copy: a dead-letter copy does not stand for it.
    moved = [cause("$dlq/q", 0, 20, "redriven", "-> q:9", group=None)]
    assert len(trace(moved, [copy("q", 9, 21, "dead_letter from $dlq/q:0")], AUDITED)) == 2


def test_a_refused_publish_has_no_cause_in_its_source() -> None:
    """``reject-dead-letter``: a publish refused by a full queue goes straight to its dead letters."""
    assert trace([], [copy("$dlq/q", 0, 5, "dead_letter from q:-1")], AUDITED) == []
