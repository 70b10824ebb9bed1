"""The charts' ring (trimaran/admin/history.py): rates from cumulative counters, bounded samples."""

from __future__ import annotations

from trimaran.admin.history import MAX_BRIDGES, MAX_QUEUES, History


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


def test_bridges_rates_from_their_counters_bounded_and_forgotten_when_removed() -> None:
    history = History(samples=3, interval_s=1.0)

    def bridges(sent: int, *names: str) -> dict[str, tuple[int, dict[str, int]]]:
        return {name: (n, {"sent": sent, "received": 2 * sent}) for n, name in enumerate(names)}

    first = history.sample(0.0, {}, {}, {}, bridges(10, "cloud", "edge"))
    assert first.bridges["cloud"].rates == {"sent": None, "received": None}  # one sample is no rate yet
    second = history.sample(2.0, {}, {}, {}, bridges(30, "cloud", "edge"))
    assert second.bridges["cloud"].rates == {"sent": 10.0, "received": 20.0}
    assert second.bridges["edge"].backlog_bytes == 1

    # Bounded: the most backlog first (the names' order is the settings').
    many = [f"b{n}" for n in range(MAX_BRIDGES + 5)]
    bounded = history.sample(3.0, {}, {}, {}, bridges(30, *many))
    assert len(bounded.bridges) == MAX_BRIDGES and "b0" not in bounded.bridges and many[-1] in bounded.bridges

    # Removed by a reload: in no later sample, its counters forgotten (back again, it starts with no
    # rate), and gone from the ring once the ring has turned over.
    assert "edge" not in history.sample(4.0, {}, {}, {}, bridges(40, "cloud")).bridges
    history.sample(5.0, {}, {}, {}, bridges(50, "cloud"))
    assert history.sample(6.0, {}, {}, {}, bridges(60, "cloud", "edge")).bridges["edge"].rates["sent"] is None
    history.sample(7.0, {}, {}, {}, bridges(70, "cloud"))
    history.sample(8.0, {}, {}, {}, bridges(80, "cloud"))
    history.sample(9.0, {}, {}, {}, bridges(90, "cloud"))
    assert all(s.bridges.keys() == {"cloud"} for s in history.samples())
    assert history.samples()[-1].bridges["cloud"].rates == {"sent": 10.0, "received": 20.0}


def test_a_bridge_started_again_is_no_negative_rate() -> None:
    """A bridge changed by a reload starts again with its counters from zero."""
    history = History(samples=5, interval_s=1.0)
    history.sample(0.0, {}, {}, {}, {"cloud": (0, {"sent": 100, "received": 5})})
    again = history.sample(1.0, {}, {}, {}, {"cloud": (0, {"sent": 3, "received": 0})})
    assert again.bridges["cloud"].rates == {"sent": 0.0, "received": 0.0}
