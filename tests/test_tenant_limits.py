"""trimaran/tenant_limits.py: the limits per vhost and per user, their counts, and the token buckets."""

from __future__ import annotations

import logging

import pytest

from trimaran.tenant_limits import QUEUES, RATE, Rate, TenantLimits, UserLimits, VhostLimits


def test_a_vhost_and_a_user_are_let_in_up_to_their_limits_and_counted_until_they_leave() -> None:
    limits = TenantLimits({"/": VhostLimits(max_connections=2)}, {"bob": UserLimits(max_connections=1)})
    assert limits.enter("alice", "/") is None
    assert limits.enter("bob", "/") is None
    assert limits.enter("carol", "/") == (
        "access to vhost '/' refused for user 'carol': connection limit (2) is reached"
    )
    limits.leave("alice", "/")
    assert limits.enter("bob", "/") == "access refused for user 'bob': user connection limit (1) is reached"
    assert limits.enter("carol", "/") is None
    assert limits.enter("dave", "other") is None  # a vhost without limits
    assert limits.connections == {"/": 2, "other": 1}
    assert limits.user_connections == {"bob": 1, "carol": 1, "dave": 1}
    assert limits.bites == {("/", "connections"): 1, ("/", "user_connections"): 1}


def test_a_limit_that_bites_says_so_once_and_again_after_it_changes(caplog: pytest.LogCaptureFixture) -> None:
    limits = TenantLimits({"/": VhostLimits(max_queues=1)})
    with caplog.at_level(logging.WARNING, "trimaran.tenant_limits"):
        assert limits.may_declare_queue("/", 0, "a") is None
        for name in ("b", "c", "d"):
            assert limits.may_declare_queue("/", 1, name) == "vhost queue limit (1) is reached"
        assert len(caplog.records) == 1
        limits.set_vhost("/", VhostLimits(max_queues=1))
        assert limits.may_declare_queue("/", 1, "e") is not None
    assert len(caplog.records) == 2
    assert limits.bites[("/", QUEUES)] == 4


def test_the_stored_bytes_quota_counts_what_is_stored_and_what_comes() -> None:
    limits = TenantLimits({"/": VhostLimits(max_stored_bytes=100)})
    assert limits.may_store("/", 60, 40) is None
    assert limits.may_store("/", 60, 41) == "vhost '/' stored-bytes quota (100) is reached"
    assert limits.may_store("elsewhere", 10**9, 1) is None


def test_a_bucket_gives_a_seconds_burst_then_asks_for_the_time_its_debt_takes_to_refill() -> None:
    rate = Rate(UserLimits(max_messages_per_s=10, max_bytes_per_s=1000), now=0.0)
    assert rate.charge(10, 100, 0.0) == 0.0  # a second's worth at once
    assert rate.charge(5, 0, 0.0) == pytest.approx(0.5)  # 5 messages of debt at 10/s
    assert rate.charge(0, 0, 0.5) == pytest.approx(0.0)
    assert rate.charge(0, 2400, 0.5) == pytest.approx(1.4)  # bytes full again: 1400 in debt at 1000/s
    assert rate.charge(0, 0, 10.0) == 0.0
    assert rate.messages == 10 and rate.bytes == 1000  # refilled to the burst, no further


def test_a_users_connections_share_one_rate_that_follows_run_time_changes() -> None:
    limits = TenantLimits(default_user=UserLimits(max_messages_per_s=5))
    changes: list[int] = []
    limits.on_change = lambda: changes.append(1)
    assert limits.enter("u", "/") is None and limits.enter("u", "/") is None
    first, second = limits.rate("u", 0.0), limits.rate("u", 0.0)
    assert first is second is not None
    limits.set_user("u", UserLimits(max_messages_per_s=50))
    assert limits.rate("u", 0.0) is first and first.messages_per_s == 50
    limits.set_user("u", UserLimits())
    assert limits.rate("u", 0.0) is None
    assert changes == [1, 1]
    limits.bit(RATE, "/", "u", "over its publish rate")
    snapshot = limits.snapshot()
    assert snapshot["users"] == {
        "u": {"max_connections": 0, "max_messages_per_s": 0.0, "max_bytes_per_s": 0.0, "connections": 2}
    }
    assert snapshot["bites"] == [{"vhost": "/", "limit": "rate", "count": 1}]
    limits.leave("u", "/")
    limits.leave("u", "/")
    assert limits.user_connections == {} and limits.connections == {}
