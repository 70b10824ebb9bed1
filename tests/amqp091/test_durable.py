"""Exchanges and bindings through ``amqp091.durable`` into SQL and back: every field type of their
arguments survives, and a restored registry routes as the saved one did."""

from __future__ import annotations

import math
from decimal import Decimal

from hypothesis import given, settings
from hypothesis import strategies as st

from trimaran.amqp091.durable import DurableExchanges, binding_row, table_from_json, table_to_json
from trimaran.amqp091.exchanges import Binding, ExchangeRegistry, freeze_arguments
from trimaran.amqp091.fields import (
    Float32,
    Int8,
    Int16,
    Int64,
    Timestamp,
    UInt8,
    UInt16,
    UInt32,
    decode_table,
    table_bytes,
)
from trimaran.storage.amqp_store import AmqpStore, binding_key
from trimaran.storage.store import Storage

EVERY_TYPE: dict[str, object] = {
    "bool": True,
    "i8": Int8(-5),
    "u8": UInt8(200),
    "i16": Int16(-300),
    "u16": UInt16(60000),
    "i32": -7,
    "u32": UInt32(4_000_000_000),
    "i64": Int64(1 << 40),
    "f32": Float32(1.5),
    "f64": 2.25,
    "dec": Decimal("-12.345"),
    "str": "héllo \udcff",
    "bytes": b"\x00\xff",
    "array": [1, "two", [Int8(3)], {"n": None}],
    "ts": Timestamp(1_700_000_000),
    "table": {"nested": {"deeper": b"z"}, "$t": "not a tag"},
    "void": None,
}


def open_store(url: str) -> tuple[Storage, DurableExchanges]:
    storage = Storage.from_url(url)
    storage.migrate()
    return storage, DurableExchanges(AmqpStore(storage.engine))


def same_wire(a: dict[str, object], b: dict[str, object]) -> bool:
    """Equal as AMQP sees it: the same bytes on the wire (so each value kept its type)."""
    return table_bytes(a) == table_bytes(b)  # type: ignore[arg-type]


def test_every_field_type_survives_json() -> None:
    back = table_from_json(table_to_json(EVERY_TYPE))
    assert same_wire(back, EVERY_TYPE)
    assert {k: type(v) for k, v in back.items()} == {k: type(v) for k, v in EVERY_TYPE.items()}


def test_non_finite_floats_and_canonical_text() -> None:
    back = table_from_json(table_to_json({"inf": math.inf, "nan": math.nan, "f": Float32(math.inf)}))
    assert back["inf"] == math.inf and math.isnan(back["nan"]) and back["f"] == math.inf  # type: ignore[arg-type]
    assert isinstance(back["f"], Float32)
    assert table_to_json({"b": 1, "a": 2}, canonical=True) == table_to_json({"a": 2, "b": 1}, canonical=True)
    assert list(table_from_json(table_to_json({"b": 1, "a": 2}))) == ["b", "a"]


# Values as the wire decoder returns them, so "equal" can be checked on the wire bytes.
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**31), 2**31 - 1),
    st.integers(-128, 127).map(Int8),
    st.integers(0, 2**32 - 1).map(UInt32),
    st.integers(-(2**63), 2**63 - 1).map(Int64),
    st.integers(0, 2**63).map(Timestamp),
    st.floats(allow_nan=False),
    st.floats(width=32, allow_nan=False).map(Float32),
    st.text(max_size=8),
    st.binary(max_size=8),
    st.decimals(allow_nan=False, allow_infinity=False, places=2, min_value=-(10**6), max_value=10**6),
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=10,
)


@settings(max_examples=200, deadline=None)
@given(table=st.dictionaries(st.text(max_size=6), VALUES, max_size=5))
def test_json_round_trip_keeps_the_wire_bytes(table: dict[str, object]) -> None:
    wire = table_bytes(table)  # type: ignore[arg-type]
    decoded, _ = decode_table(wire, 0)
    assert table_bytes(table_from_json(table_to_json(decoded))) == wire  # type: ignore[arg-type]


def test_save_reload_and_route_the_same(storage_url: str) -> None:
    storage, store = open_store(storage_url)
    try:
        reg = ExchangeRegistry()
        reg.declare("orders", "topic", durable=True, arguments={"alternate-exchange": "lost"})
        reg.declare("lost", "fanout", durable=True, internal=True)
        reg.declare("hdr", "headers", durable=True, auto_delete=True, arguments=EVERY_TYPE)
        for name in ("orders", "lost", "hdr"):
            x = reg.get(name)
            assert x is not None
            store.save_exchange(x)
        saved = [
            reg.bind("orders", "eu", "queue", "order.eu.#")[0],
            reg.bind("orders", "hdr", "exchange", "order.*.vip")[0],
            reg.bind("hdr", "vip", "queue", "", {"x-match": "any", "tier": "gold", "raw": b"\x01"})[0],
            reg.bind("lost", "dead", "queue", "")[0],
            reg.bind("amq.direct", "eu", "queue", "k", {"n": [Int8(1), {"d": Decimal("1.5")}]})[0],
        ]
        for binding in saved:
            store.save_binding(binding)
        store.save_binding(saved[0])  # saving twice keeps one row
    finally:
        storage.close()

    storage, store = open_store(storage_url)
    try:
        exchanges, bindings = store.load()
        assert store.load("other") == ([], [])
        fresh = ExchangeRegistry()
        assert fresh.restore(exchanges, bindings) == []
        assert sorted(bindings, key=repr) == sorted(saved, key=repr)
        for name in ("orders", "lost", "hdr"):
            assert fresh.get(name) == reg.get(name)
        hdr = fresh.get("hdr")
        assert hdr is not None and same_wire(hdr.arguments, EVERY_TYPE)
        for exchange, key, headers in [
            ("orders", "order.eu.x", None),
            ("orders", "order.us.vip", {"tier": "gold"}),
            ("orders", "order.us.vip", {"raw": b"\x01"}),
            ("orders", "order.us.vip", {"tier": "silver"}),
            ("orders", "nowhere", None),
            ("amq.direct", "k", None),
        ]:
            assert fresh.route(exchange, key, headers) == reg.route(exchange, key, headers)
        assert fresh.route("orders", "order.us.vip", {"tier": "gold"}).queues == {"vip"}
        assert fresh.route("orders", "nowhere").queues == {"dead"}
    finally:
        storage.close()


def test_deletes(storage_url: str) -> None:
    storage, store = open_store(storage_url)
    try:
        reg = ExchangeRegistry()
        for name in ("a", "b", "c"):
            x, _ = reg.declare(name, "direct", durable=True)
            store.save_exchange(x)
        for binding in [
            reg.bind("a", "b", "exchange", "k")[0],
            reg.bind("b", "c", "exchange", "k")[0],
            reg.bind("c", "q", "queue", "k")[0],
            reg.bind("c", "q", "queue", "k2")[0],
            reg.bind("c", "r", "queue", "k")[0],
            reg.bind("amq.direct", "q", "queue", "k")[0],
        ]:
            store.save_binding(binding)

        store.delete_binding(Binding("c", "q", "queue", "k2"))
        store.delete_binding(Binding("c", "q", "queue", "nope"))  # nothing to delete: fine
        store.delete_queue_bindings("q")
        _, bindings = store.load()
        assert {(b.source, b.destination) for b in bindings} == {("a", "b"), ("b", "c"), ("c", "r")}

        store.delete_exchange("b")  # with bindings from and to it
        exchanges, bindings = store.load()
        assert sorted(x.name for x in exchanges) == ["a", "c"]
        assert [(b.source, b.destination) for b in bindings] == [("c", "r")]

        store.forget([Binding("c", "r", "queue", "k")], ["a"])
        exchanges, bindings = store.load()
        assert [x.name for x in exchanges] == ["c"] and bindings == []
    finally:
        storage.close()


def test_cascade_is_persisted_with_forget(storage_url: str) -> None:
    storage, store = open_store(storage_url)
    try:
        reg = ExchangeRegistry()
        for name in ("top", "mid"):
            x, _ = reg.declare(name, "fanout", durable=True, auto_delete=True)
            store.save_exchange(x)
        store.save_binding(reg.bind("top", "mid", "exchange", "")[0])
        store.save_binding(reg.bind("mid", "q", "queue", "")[0])
        reg.remove_queue("q")
        store.forget(reg.last_removed_bindings, [x.name for x in reg.last_auto_deleted])
        assert store.load() == ([], [])
    finally:
        storage.close()


def test_binding_key_depends_on_every_part() -> None:
    base = Binding("s", "d", "queue", "k", ())
    keys = {
        binding_key(binding_row(b))
        for b in [
            base,
            Binding("s2", "d", "queue", "k"),
            Binding("s", "d2", "queue", "k"),
            Binding("s", "d", "exchange", "k"),
            Binding("s", "d", "queue", "k2"),
            Binding("s", "d", "queue", "k", (("a", 1),)),
        ]
    }
    assert len(keys) == 6 and binding_key(binding_row(base)) == binding_key(
        binding_row(Binding("s", "d", "queue", "k"))
    )


def test_binding_keys_of_rows_already_stored_are_unchanged() -> None:
    """The digest is the row's primary key: keys written before storage stopped knowing AMQP types
    (digests taken then) must still find their rows."""
    arguments = freeze_arguments(
        {"x-match": "any", "b": Int8(1), "a": [1.5, b"\x01", {"d": Decimal("1.5")}], "u": "hé"}
    )
    assert binding_key(binding_row(Binding("s", "d", "queue", "k"))) == (
        "f3015923aa700847942d2f38c06be24a2395151105b53df0f905a31aa8b509f3"
    )
    assert binding_key(binding_row(Binding("x", "q", "queue", "k", arguments))) == (
        "9bd4ccce903bff67baa8cfdc756c95d6a4f67ece7841d6c23cb3ebb9b458d284"
    )
