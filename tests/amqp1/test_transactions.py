"""trimaran/amqp1/transactions.py: ids, what a coordinator's end takes away, a link's end dooms
the transactions that settled on it, and the bound on a transaction's work."""

from __future__ import annotations

from typing import Any, cast

from trimaran.amqp1.transactions import MAX_WORK, Transactions


class Stub:
    id = "c/link"


def test_declare_gives_fresh_ids_and_a_coordinators_end_takes_its_own() -> None:
    txns = Transactions()
    a, b = cast(Any, object()), cast(Any, object())
    one, two, three = txns.declare(a), txns.declare(a), txns.declare(b)
    assert len({one.txn_id, two.txn_id, three.txn_id}) == 3
    assert txns.of_link(a) == [one, two]
    assert list(txns.open) == [three.txn_id]


def test_a_link_end_dooms_what_settled_on_it() -> None:
    txn = Transactions().declare(cast(Any, object()))
    mine, other = cast(Any, Stub()), cast(Any, Stub())
    txn.settles = [(mine, 1, cast(Any, None)), (other, 2, cast(Any, None))]
    txn.link_ended(cast(Any, Stub()))  # a link it never settled on: nothing
    assert txn.doomed is None
    txn.link_ended(mine)
    assert txn.doomed is not None and "went back to the queue" in txn.doomed
    assert [s[1] for s in txn.settles] == [2]


def test_full_past_max_work() -> None:
    txn = Transactions().declare(cast(Any, object()))
    txn.publishes = [cast(Any, None)] * (MAX_WORK - 1)
    assert not txn.full()
    txn.publishes.append(cast(Any, None))
    assert txn.full() and txn.doomed is not None
