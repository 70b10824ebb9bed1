"""pg_arrays: the writer's columns packed as PostgreSQL binary arrays, read back through unnest()
by a real PostgreSQL as psycopg's own lists are."""

from __future__ import annotations

from typing import Any

import pytest

from trimaran.storage.pg_arrays import BigintArray, ByteaArray, IntegerArray, TextArray, packed, register

pytestmark = pytest.mark.postgres

COLUMNS: list[tuple[str, list[Any]]] = [
    ("bigint", [0, -1, 2**63 - 1, -(2**63), None, 1_733_000_000_000]),
    ("integer", [0, 7, -(2**31), 2**31 - 1, None]),
    ("text", ["$queue/orders", "", "héllo wörld ☃", None, '{"a": 1}']),
    ("bytea", [b"", b"\x00\xff" * 10, None, bytes(range(256))]),
]


@pytest.fixture
def connection(postgres_url: str) -> Any:
    psycopg = pytest.importorskip("psycopg")
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        register(conn.adapters)
        yield conn


@pytest.mark.parametrize(("pg_type", "values"), COLUMNS, ids=[t for t, _ in COLUMNS])
def test_each_type_reads_back_as_it_went_in(connection: Any, pg_type: str, values: list[Any]) -> None:
    array = packed(values, pg_type)
    assert not isinstance(array, list)
    rows = connection.execute(f"SELECT * FROM unnest(%b::{pg_type}[])", [array]).fetchall()
    assert [r[0] for r in rows] == values


def test_several_columns_through_one_unnest_as_the_writer_inserts(connection: Any) -> None:
    rows = [(1, "a", b"x", None), (2, "b", b"", 5), (3, "ü", b"\x00", 7)]
    types = ["bigint", "text", "bytea", "integer"]
    arrays = [packed(c, t) for c, t in zip(zip(*rows, strict=True), types, strict=True)]
    got = connection.execute(
        "SELECT * FROM unnest(%b::bigint[], %b::text[], %b::bytea[], %b::integer[])", arrays
    ).fetchall()
    assert [tuple(r) for r in got] == rows


def test_an_empty_column_is_an_empty_array(connection: Any) -> None:
    for pg_type in ("bigint", "integer", "text", "bytea"):
        assert connection.execute(
            f"SELECT cardinality(%b::{pg_type}[])", [packed([], pg_type)]
        ).fetchone() == (0,)


def test_what_does_not_pack_goes_to_psycopg_as_a_list_as_before(connection: Any) -> None:
    # An integer in a text column, an integer out of range: psycopg dumps them, or refuses, as before.
    mixed = packed(["a", 7], "text")
    assert mixed == ["a", 7]
    assert packed([2**63], "bigint") == [2**63]  # out of range: PostgreSQL refuses it, as before
    assert packed([2**31], "integer") == [2**31]


def test_the_kinds_carry_their_array_types() -> None:
    assert [k.array_oid for k in (BigintArray, IntegerArray, TextArray, ByteaArray)] == [
        1016,
        1007,
        1009,
        1001,
    ]
