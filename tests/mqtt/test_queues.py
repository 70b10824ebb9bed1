"""MQTT's queue bindings (trimaran/mqtt/queues.py): which subscription filters name a queue."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trimaran.mqtt.queues import is_queue_filter
from trimaran.queue.policy import QUEUE_PREFIX
from trimaran.topics import TopicError, split_shared


@pytest.mark.parametrize(
    ("topic_filter", "expected"),
    [
        ("$queue/orders", True),
        ("$queue/orders/#", True),
        ("$share/workers/$queue/orders", True),
        ("sensors/+/temperature", False),
        ("$share/workers/sensors/#", False),
        ("$queuex/orders", False),
        ("$share/workers", False),  # no filter after the group
        ("$share/wor+kers/$queue/orders", False),  # a wildcard in the group
        ("$queue/or#ders", False),  # not a valid filter
        ("$share//$queue/orders", False),  # an empty group
    ],
)
def test_is_queue_filter(topic_filter: str, expected: bool) -> None:
    assert is_queue_filter(topic_filter) is expected


_levels = st.sampled_from(["$queue", "$share", "g", "+", "#", "a+", "", "q", "x#"])


@given(st.lists(_levels, min_size=1, max_size=5).map("/".join))
def test_is_queue_filter_is_a_valid_filter_whose_inner_part_names_a_queue(topic_filter: str) -> None:
    """The same answer as splitting and validating every filter first, as it was."""
    try:
        expected = split_shared(topic_filter)[1].startswith(QUEUE_PREFIX)
    except TopicError:
        expected = False
    assert is_queue_filter(topic_filter) is expected
