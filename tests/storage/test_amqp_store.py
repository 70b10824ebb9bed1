"""The AMQP exchange store as storage sees it: rows and JSON text, no AMQP type (the field types'
round trip is ``amqp091.durable``'s, tested in tests/amqp091/test_durable.py)."""

from __future__ import annotations

from trimaran.storage.amqp_store import AmqpStore, BindingRow, ExchangeRow, binding_key
from trimaran.storage.store import Storage


def open_store(url: str) -> tuple[Storage, AmqpStore]:
    storage = Storage.from_url(url)
    storage.migrate()
    return storage, AmqpStore(storage.engine)


def test_rows_come_back_as_saved(storage_url: str) -> None:
    exchanges = [
        ExchangeRow("orders", "topic", True, False, False, '{"alternate-exchange":"lost"}'),
        ExchangeRow("lost", "fanout", True, True, True, "{}"),
    ]
    bindings = [
        BindingRow("orders", "eu", "queue", "order.eu.#", "{}"),
        BindingRow("orders", "lost", "exchange", "", '{"z":1,"a":{"$t":"x","v":"AQ=="}}'),
    ]
    storage, store = open_store(storage_url)
    try:
        for x in exchanges:
            store.save_exchange(x)
        for b in bindings:
            store.save_binding(b)
        store.save_binding(bindings[0])  # saving twice keeps one row
        store.save_exchange(exchanges[1])  # replaces
    finally:
        storage.close()
    storage, store = open_store(storage_url)
    try:
        loaded_exchanges, loaded_bindings = store.load()
        assert loaded_exchanges == sorted(exchanges, key=lambda x: x.name)
        assert sorted(loaded_bindings, key=repr) == sorted(bindings, key=repr)
        assert store.load("other") == ([], [])
    finally:
        storage.close()


def test_deletes_cascade_from_exchanges(storage_url: str) -> None:
    storage, store = open_store(storage_url)
    try:
        for name in ("a", "b"):
            store.save_exchange(ExchangeRow(name, "direct", True, False, False, "{}"))
        into_b = BindingRow("a", "b", "exchange", "k", "{}")
        to_q = BindingRow("b", "q", "queue", "k", "{}")
        to_r = BindingRow("a", "r", "queue", "k", '{"n":1}')
        for b in (into_b, to_q, to_r):
            store.save_binding(b)
        store.delete_binding(BindingRow("a", "r", "queue", "k", '{"n":2}'))  # other arguments: kept
        store.delete_queue_bindings("nothing")
        assert len(store.load()[1]) == 3
        store.delete_exchange("b")  # with the bindings from and to it
        assert store.load() == ([ExchangeRow("a", "direct", True, False, False, "{}")], [to_r])
        store.forget([to_r], ["a"])
        assert store.load() == ([], [])
    finally:
        storage.close()


def test_binding_key_ignores_key_order_of_the_arguments() -> None:
    one = BindingRow("s", "d", "queue", "k", '{"a":1,"b":[2,{"d":3,"c":4}]}')
    other = BindingRow("s", "d", "queue", "k", '{"b":[2,{"c":4,"d":3}],"a":1}')
    assert binding_key(one) == binding_key(other)
    assert binding_key(one) != binding_key(
        BindingRow("s", "d", "queue", "k", '{"a":2,"b":[2,{"d":3,"c":4}]}')
    )
    # The digest of a binding with no arguments, as every stored row of one has it.
    assert binding_key(BindingRow("s", "d", "queue", "k", "{}")) == (
        "f3015923aa700847942d2f38c06be24a2395151105b53df0f905a31aa8b509f3"
    )
