"""Drops counted by reason and vhost, and told in the log once a minute per subscriber."""

from __future__ import annotations

import logging

import pytest

from trimaran.broker import drops
from trimaran.broker.drops import OUTBOX_FULL, REASONS, TOO_LARGE, Drops


def test_each_reason_names_its_bound() -> None:
    assert all(text for text in REASONS.values())


def test_counts_by_reason_and_vhost_and_one_line_a_minute_per_subscriber(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = [1000.0]
    monkeypatch.setattr(drops.time, "monotonic", lambda: clock[0])
    caplog.set_level(logging.WARNING, logger="trimaran.broker.drops")
    counted = Drops()
    for _ in range(5):
        counted.drop(OUTBOX_FULL, "/", "slow")
    counted.drop(TOO_LARGE, "t1", "small")
    assert counted.counts == {(OUTBOX_FULL, "/"): 5, (TOO_LARGE, "t1"): 1}
    assert counted.total == 6
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2  # one for each subscriber, not one per message
    assert "slow" in lines[0] and "limits.outbox_bytes" in lines[0]
    clock[0] += 61  # a minute on: the next drop is told again, with what was not
    counted.drop(OUTBOX_FULL, "/", "slow")
    assert "4 more in the last minute" in caplog.records[-1].getMessage()
