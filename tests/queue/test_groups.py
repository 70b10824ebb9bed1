"""queue/groups.py: the visibility time-outs of held deliveries (Deadlines)."""

from __future__ import annotations

from trimaran.queue.groups import DONE, HELD, Deadlines, Entry


def test_compact_keeps_exactly_the_items_of_deliveries_still_held() -> None:
    timeouts = Deadlines()
    held = Entry(HELD)
    held.token = 2
    redelivered = Entry(HELD)
    redelivered.token = 5  # its first delivery's item (token 4) is stale
    entries = {1: held, 2: Entry(DONE), 3: redelivered}
    for deadline, offset, token in [(10, 0, 1), (20, 1, 2), (30, 2, 1), (40, 3, 4), (50, 3, 5)]:
        timeouts.push(deadline, offset, token)
    timeouts.push(5, 1, 2)  # earlier than the last: on the heap, and still live
    timeouts.push(6, 3, 4)  # on the heap, stale
    timeouts.compact(entries)
    assert list(timeouts.fifo) == [(20, 1, 2), (50, 3, 5)]
    assert timeouts.heap == [(5, 1, 2)]
    assert len(timeouts) == 3
    assert timeouts.first() == 5
