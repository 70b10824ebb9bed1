"""runtime.confirms: acknowledgements leave in arrival order, each once its commit is done."""

from __future__ import annotations

from dataclasses import dataclass

from trimaran.runtime.confirms import InOrder


@dataclass
class Entry:
    name: str
    done: bool = False


def test_an_entry_not_done_holds_back_the_ones_behind_it() -> None:
    acks: InOrder[Entry] = InOrder()
    a, b, c = (acks.add(Entry(n)) for n in "abc")
    c.done = True  # an in-memory queue: done at once, behind two durable ones
    assert not acks.head_done() and list(acks.ready()) == []
    a.done = True
    assert acks.head_done()
    assert [e.name for e in acks.ready()] == ["a"]
    b.done = True
    assert [e.name for e in acks.ready()] == ["b", "c"]
    assert not acks and len(acks) == 0


def test_a_removed_entry_no_longer_holds_anything_back() -> None:
    acks: InOrder[Entry] = InOrder()
    refused = acks.add(Entry("refused"))
    acks.add(Entry("next", done=True))
    acks.remove(refused)
    assert [e.name for e in acks.ready()] == ["next"]


def test_entries_added_while_acting_on_a_batch_are_the_next_batch() -> None:
    acks: InOrder[Entry] = InOrder()
    acks.add(Entry("a", done=True))
    batches = []
    while batch := acks.ready():
        batches.append([e.name for e in batch])
        if len(batches) == 1:
            acks.add(Entry("b", done=True))  # a hull acting on an ack can queue another
    assert batches == [["a"], ["b"]]


def test_a_batch_is_a_list_taken_at_once() -> None:
    acks: InOrder[Entry] = InOrder()
    entries = [acks.add(Entry(str(n), done=n != 3)) for n in range(5)]
    assert acks.ready() == entries[:3]  # the head's done run, the rest wait behind "3"
    assert len(acks) == 2
    entries[3].done = True
    assert acks.ready() == entries[3:] and not acks
