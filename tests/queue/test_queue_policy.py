from __future__ import annotations

import pytest

from trimaran.config import QueuePolicySettings
from trimaran.queue import parse_message_id, parse_queue_topic
from trimaran.queue.policy import QueueError, backoff_s, dead_letter_target, filter_matches


@pytest.mark.parametrize(
    ("topic", "parsed"),
    [
        ("$queue/orders", ("orders", "", None)),
        ("$queue/orders/eu/de", ("orders", "eu/de", None)),
        ("$queue/orders/$ack", ("orders", "", "ack")),
        ("$queue/orders/eu/$nack", ("orders", "eu", "nack")),
        ("$queue/orders/$reject", ("orders", "", "reject")),
        ("$queue/orders/$commit", ("orders", "", "commit")),
        ("$queue/$dlq/orders", ("$dlq/orders", "", None)),
        ("$queue/$dlq/orders/$ack", ("$dlq/orders", "", "ack")),
        ("$queue/orders/$ack/x", None),
        ("$queue/", None),
        ("$queue/a+b", None),
        ("orders", None),
        ("$share/g/$queue/orders", None),
    ],
)
def test_parse_queue_topic(topic: str, parsed: tuple[str, str, str | None] | None) -> None:
    assert parse_queue_topic(topic) == parsed


def test_message_ids() -> None:
    assert parse_message_id("orders:12") == ("orders", 12)
    assert parse_message_id("$dlq/orders:0") == ("$dlq/orders", 0)
    with pytest.raises(QueueError):
        parse_message_id("orders")


def test_backoff_and_dead_letter_target() -> None:
    policy = QueuePolicySettings(backoff_initial_s=1, backoff_multiplier=2, backoff_max_s=5)
    assert [backoff_s(policy, n) for n in (1, 2, 3, 4)] == [1, 2, 4, 5]
    assert dead_letter_target("q", policy) == "$dlq/q"
    assert dead_letter_target("$dlq/q", policy) is None
    assert dead_letter_target("q", QueuePolicySettings(dead_letter="errors")) == "errors"
    assert dead_letter_target("q", QueuePolicySettings(dead_letter="none")) is None


def test_filters() -> None:
    assert filter_matches(None, "a/b")
    assert filter_matches("a/+", "a/b")
    assert filter_matches("a/#", "a")
    assert not filter_matches("a/+", "a/b/c")
    assert filter_matches("#", "")
