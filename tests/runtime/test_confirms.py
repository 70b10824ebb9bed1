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


def test_entries_added_while_handing_out_are_handed_out_in_turn() -> None:
    acks: InOrder[Entry] = InOrder()
    acks.add(Entry("a", done=True))
    out = []
    for entry in acks.ready():
        out.append(entry.name)
        if entry.name == "a":
            acks.add(Entry("b", done=True))  # a hull acting on an ack can queue another
    assert out == ["a", "b"]
