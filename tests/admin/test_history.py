"""The charts' ring (trimaran/admin/history.py): rates from cumulative counters, bounded samples."""

from __future__ import annotations

from trimaran.admin.history import MAX_QUEUES, History


def test_rates_come_from_the_difference_between_samples() -> None:
    history = History(samples=10, interval_s=5.0)
    first = history.sample(100.0, {"received": 50, "sent": 40}, {"mqtt": 2}, {"jobs": (3, {"published": 7})})
    assert first.messages_in is None and first.messages_out is None  # one sample is no rate yet
    assert first.connections == {"mqtt": 2} and first.queues["jobs"].depth == 3
    assert first.queues["jobs"].rates == {"published": None, "delivered": None, "acked": None}

    second = history.sample(
        105.0,
        {"received": 150, "sent": 40, "dropped": 0},
        {"mqtt": 3, "amqp091": 1},
        {"jobs": (1, {"published": 17, "delivered": 12, "acked": 9}), "new": (0, {})},
    )
    assert second.messages_in == 20.0 and second.messages_out == 0.0
    assert second.at_ms == 105_000
    assert second.queues["jobs"].rates == {"published": 2.0, "delivered": 2.4, "acked": 1.8}
    assert second.queues["new"].rates["published"] is None  # a queue's first sample
    assert [s.at_ms for s in history.samples()] == [100_000, 105_000]


def test_the_ring_keeps_the_last_samples_and_the_deepest_queues() -> None:
    history = History(samples=3, interval_s=1.0)
    queues = {f"q{n}": (n, {"published": n}) for n in range(MAX_QUEUES + 5)}
    for second in range(5):
        history.sample(float(second), {"received": second}, {}, queues)
    samples = history.samples()
    assert [s.at_ms for s in samples] == [2000, 3000, 4000]
    assert len(samples[-1].queues) == MAX_QUEUES
    assert "q0" not in samples[-1].queues and f"q{MAX_QUEUES + 4}" in samples[-1].queues


def test_a_counter_that_went_back_is_no_negative_rate() -> None:
    """A queue deleted and declared again starts its counters from zero."""
    history = History(samples=5, interval_s=1.0)
    history.sample(0.0, {}, {}, {"q": (5, {"published": 100})})
    assert history.sample(1.0, {}, {}, {"q": (0, {"published": 2})}).queues["q"].rates["published"] == 0.0
