from __future__ import annotations

from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trimaran.amqp091.exchanges import (
    BUILTIN_EXCHANGES,
    Binding,
    Exchange,
    ExchangeError,
    ExchangeRegistry,
    freeze_arguments,
    thaw_arguments,
    topic_key_matches,
)


def error(fn, *args, **kwargs) -> ExchangeError:  # type: ignore[no-untyped-def]
    with pytest.raises(ExchangeError) as info:
        fn(*args, **kwargs)
    return info.value


# -- built-in exchanges ---------------------------------------------------------------------------


def test_new_registry_has_the_default_and_amq_exchanges() -> None:
    reg = ExchangeRegistry()
    got = {x.name: (x.type, x.durable) for x in reg.exchanges()}
    assert got == {"": ("direct", True)} | {name: (t, True) for name, t in BUILTIN_EXCHANGES.items()}
    assert reg.get("amq.match") is not None and reg.get("amq.match").type == "headers"  # type: ignore[union-attr]
    assert reg.bindings() == []
    assert reg.is_router_backed("amq.topic") and not reg.is_router_backed("amq.direct")


# -- declare ----------------------------------------------------------------------------------------


def test_declare_creates_once_and_redeclare_with_same_properties_is_fine() -> None:
    reg = ExchangeRegistry()
    x, created = reg.declare("logs", "fanout", durable=True, arguments={"k": 1})
    assert created and x == Exchange("logs", "fanout", True, False, False, {"k": 1})
    again, created = reg.declare("logs", "fanout", durable=True)
    assert again is x and not created


def test_passive_declare() -> None:
    reg = ExchangeRegistry()
    e = error(reg.declare, "nope", "direct", passive=True)
    assert (e.reply_code, e.text) == (404, "NOT_FOUND - no exchange 'nope' in vhost '/'")
    assert e.reason == "no exchange 'nope' in vhost '/'"
    reg.declare("there", "topic")
    # a passive declare ignores the type and flags
    x, created = reg.declare("there", "fanout", passive=True, durable=True)
    assert x.type == "topic" and not created
    assert reg.declare("amq.direct", "", passive=True)[0].name == "amq.direct"


@pytest.mark.parametrize(
    ("kwargs", "text"),
    [
        ({"type": "fanout"}, "received 'fanout' but current is 'direct'"),
        ({"durable": True}, "inequivalent arg 'durable' for exchange 'x' in vhost '/': received 'true'"),
        ({"auto_delete": True}, "inequivalent arg 'auto_delete' for exchange 'x' in vhost '/'"),
        ({"internal": True}, "inequivalent arg 'internal' for exchange 'x' in vhost '/'"),
    ],
)
def test_inequivalent_redeclare_is_precondition_failed(kwargs: dict[str, object], text: str) -> None:
    reg = ExchangeRegistry()
    reg.declare("x", "direct")
    args: dict[str, object] = {"type": "direct"} | kwargs
    type_ = str(args.pop("type"))
    e = error(reg.declare, "x", type_, **args)
    assert e.reply_code == 406 and text in e.text and e.text.startswith("PRECONDITION_FAILED - ")


def test_inequivalent_type_text_is_rabbitmqs() -> None:
    reg = ExchangeRegistry()
    reg.declare("x", "direct")
    assert error(reg.declare, "x", "fanout").text == (
        "PRECONDITION_FAILED - inequivalent arg 'type' for exchange 'x' in vhost '/': "
        "received 'fanout' but current is 'direct'"
    )


def test_alternate_exchange_argument_must_be_equivalent() -> None:
    reg = ExchangeRegistry()
    reg.declare("x", "direct", arguments={"alternate-exchange": "ae"})
    reg.declare("x", "direct", arguments={"alternate-exchange": "ae", "other": 1})  # others not checked
    e = error(reg.declare, "x", "direct")
    assert e.text == (
        "PRECONDITION_FAILED - inequivalent arg 'alternate-exchange' for exchange 'x' in vhost '/': "
        "received none but current is the value 'ae' of type 'longstr'"
    )
    assert error(reg.declare, "y", "direct", arguments={"alternate-exchange": 5}).reply_code == 406


def test_reserved_prefix_unknown_type_and_default_exchange() -> None:
    reg = ExchangeRegistry()
    e = error(reg.declare, "amq.x", "direct")
    assert (e.reply_code, e.text) == (
        403,
        "ACCESS_REFUSED - exchange name 'amq.x' contains reserved prefix 'amq.*'",
    )
    # an existing amq. exchange redeclared identically is fine, differently is 406
    assert reg.declare("amq.direct", "direct", durable=True) == (reg.get("amq.direct"), False)
    assert error(reg.declare, "amq.direct", "direct").reply_code == 406
    e = error(reg.declare, "x", "foo")
    assert (e.reply_code, e.text) == (503, "COMMAND_INVALID - invalid exchange type 'foo'")
    for call in (
        lambda: reg.declare("", "direct"),
        lambda: reg.declare("", "direct", passive=True),
        lambda: reg.delete(""),
    ):
        e = error(call)
        assert (e.reply_code, e.text) == (
            403,
            "ACCESS_REFUSED - operation not permitted on the default exchange",
        )


def test_vhost_appears_in_texts() -> None:
    reg = ExchangeRegistry(vhost="prod")
    assert error(reg.route, "nope", "k").text == "NOT_FOUND - no exchange 'nope' in vhost 'prod'"


# -- delete -------------------------------------------------------------------------------------


def test_delete() -> None:
    reg = ExchangeRegistry()
    assert reg.delete("missing") is None  # RabbitMQ: deleting a missing exchange is not an error
    e = error(reg.delete, "amq.fanout")
    assert (e.reply_code, e.text) == (
        403,
        "ACCESS_REFUSED - deletion of system exchange 'amq.fanout' in vhost '/' not allowed",
    )
    reg.declare("x", "direct")
    reg.declare("y", "fanout")
    reg.bind("x", "q", "queue", "k")
    reg.bind("y", "x", "exchange", "")
    e = error(reg.delete, "x", if_unused=True)
    assert (e.reply_code, e.text) == (406, "PRECONDITION_FAILED - exchange 'x' in vhost '/' in use")
    # bound only as a destination: still unused
    reg.unbind("x", "q", "queue", "k")
    deleted = reg.delete("x", if_unused=True)
    assert deleted is not None and deleted.name == "x" and reg.get("x") is None
    assert reg.last_removed_bindings == [Binding("y", "x", "exchange", "")]
    assert reg.bindings() == [] and reg.bindings_for_source("y") == []


def test_delete_removes_bindings_as_source_and_destination() -> None:
    reg = ExchangeRegistry()
    for name in ("a", "b", "c"):
        reg.declare(name, "fanout")
    reg.bind("a", "b", "exchange", "")
    reg.bind("b", "c", "exchange", "")
    reg.bind("b", "q", "queue", "")
    reg.delete("b")
    assert reg.bindings() == []
    assert set(reg.last_removed_bindings) == {
        Binding("a", "b", "exchange", ""),
        Binding("b", "c", "exchange", ""),
        Binding("b", "q", "queue", ""),
    }
    assert reg.route("a", "").queues == set()
    assert reg.bindings_for_destination("q", "queue") == []


# -- bind / unbind ----------------------------------------------------------------------------------


def test_bind_is_idempotent_and_arguments_distinguish_bindings() -> None:
    reg = ExchangeRegistry()
    b1, new = reg.bind("amq.direct", "q", "queue", "k", {"a": [1, {"b": b"x"}]})
    assert new and b1.arguments_dict() == {"a": [1, {"b": b"x"}]}
    b2, new = reg.bind("amq.direct", "q", "queue", "k", {"a": [1, {"b": b"x"}]})
    assert not new and b2 is b1
    _, new = reg.bind("amq.direct", "q", "queue", "k", {"a": 2})
    assert new
    assert len(reg.bindings_for_source("amq.direct")) == 2
    assert len(reg.bindings_for_destination("q", "queue")) == 2
    # one binding removed, the other still routes
    assert reg.unbind("amq.direct", "q", "queue", "k", {"a": 2}) is not None
    assert reg.route("amq.direct", "k").queues == {"q"}
    assert reg.unbind("amq.direct", "q", "queue", "k", {"a": 2}) is None  # already gone: not an error
    assert reg.unbind("amq.direct", "q", "queue", "k", {"a": [1, {"b": b"x"}]}) is b1
    assert reg.route("amq.direct", "k").queues == set()


def test_bind_errors() -> None:
    reg = ExchangeRegistry()
    e = error(reg.bind, "nope", "q", "queue", "k")
    assert (e.reply_code, e.text) == (404, "NOT_FOUND - no exchange 'nope' in vhost '/'")
    e = error(reg.bind, "amq.direct", "nope", "exchange", "k")
    assert (e.reply_code, e.text) == (404, "NOT_FOUND - no exchange 'nope' in vhost '/'")
    assert error(reg.unbind, "nope", "q", "queue", "k").reply_code == 404
    assert error(reg.bind, "", "q", "queue", "q").reply_code == 403
    assert error(reg.bind, "amq.direct", "", "exchange", "q").reply_code == 403
    assert error(reg.unbind, "", "q", "queue", "q").reply_code == 403


def test_headers_binding_validates_x_match() -> None:
    reg = ExchangeRegistry()
    e = error(reg.bind, "amq.headers", "q", "queue", "", {"x-match": "foo"})
    assert (e.reply_code, e.text) == (
        406,
        'PRECONDITION_FAILED - Invalid x-match field value <<"foo">>; '
        "expected all, any, all-with-x, or any-with-x",
    )
    assert error(reg.bind, "amq.headers", "q", "queue", "", {"x-match": 1}).reply_code == 406
    for mode in ("all", "any", "all-with-x", "any-with-x"):
        reg.bind("amq.headers", "q", "queue", "", {"x-match": mode})
    # only headers exchanges look at x-match
    reg.bind("amq.direct", "q", "queue", "", {"x-match": "foo"})


def test_remove_queue_drops_its_bindings_only() -> None:
    reg = ExchangeRegistry()
    reg.bind("amq.direct", "q", "queue", "a")
    reg.bind("amq.direct", "q", "queue", "b")
    reg.bind("amq.direct", "r", "queue", "a")
    removed = reg.remove_queue("q")
    assert set(removed) == {
        Binding("amq.direct", "q", "queue", "a"),
        Binding("amq.direct", "q", "queue", "b"),
    }
    assert reg.route("amq.direct", "a").queues == {"r"}
    assert reg.remove_queue("q") == []


# -- auto-delete --------------------------------------------------------------------------------------


def test_auto_delete_when_last_source_binding_goes() -> None:
    reg = ExchangeRegistry()
    reg.declare("ad", "direct", auto_delete=True)
    reg.bind("ad", "q1", "queue", "k")
    reg.bind("ad", "q2", "queue", "k")
    assert reg.unbind("ad", "q1", "queue", "k") is not None
    assert reg.get("ad") is not None and reg.last_auto_deleted == []
    reg.unbind("ad", "q2", "queue", "k")
    assert reg.get("ad") is None
    assert [x.name for x in reg.last_auto_deleted] == ["ad"]


def test_auto_delete_is_not_triggered_by_destination_bindings_and_never_bound_stays() -> None:
    reg = ExchangeRegistry()
    reg.declare("ad", "fanout", auto_delete=True)
    reg.declare("src", "fanout")
    reg.bind("src", "ad", "exchange", "")
    reg.unbind("src", "ad", "exchange", "")
    assert reg.get("ad") is not None


def test_auto_delete_cascades_through_queue_removal_and_exchange_chains() -> None:
    reg = ExchangeRegistry()
    reg.declare("top", "fanout", auto_delete=True)
    reg.declare("mid", "fanout", auto_delete=True)
    reg.bind("top", "mid", "exchange", "")
    reg.bind("mid", "q", "queue", "")
    removed = reg.remove_queue("q")
    assert removed == [Binding("mid", "q", "queue", "")]
    # mid lost its last binding: deleted; that removed top -> mid, so top goes too
    assert [x.name for x in reg.last_auto_deleted] == ["mid", "top"]
    assert reg.get("top") is None and reg.get("mid") is None
    assert set(reg.last_removed_bindings) == {
        Binding("mid", "q", "queue", ""),
        Binding("top", "mid", "exchange", ""),
    }
    assert reg.bindings() == []


def test_explicit_delete_cascades_to_auto_delete_sources() -> None:
    reg = ExchangeRegistry()
    reg.declare("ad", "fanout", auto_delete=True)
    reg.declare("x", "fanout")
    reg.bind("ad", "x", "exchange", "")
    reg.delete("x")
    assert reg.get("ad") is None and [x.name for x in reg.last_auto_deleted] == ["ad"]


# -- routing: default, direct, fanout ---------------------------------------------------------------


def test_default_exchange_routes_to_the_named_queue() -> None:
    reg = ExchangeRegistry()
    assert reg.route("", "orders").queues == {"orders"}
    assert reg.route("", "$queue/orders").queues == {"orders"}
    assert reg.route("", "orders", {"a": 1}).to_router is False


def test_direct_and_fanout() -> None:
    reg = ExchangeRegistry()
    reg.bind("amq.direct", "q1", "queue", "red")
    reg.bind("amq.direct", "q2", "queue", "red")
    reg.bind("amq.direct", "q3", "queue", "blue")
    assert reg.route("amq.direct", "red").queues == {"q1", "q2"}
    assert reg.route("amq.direct", "green").queues == set()
    reg.bind("amq.fanout", "q1", "queue", "ignored")
    reg.bind("amq.fanout", "q4", "queue", "")
    assert reg.route("amq.fanout", "anything").queues == {"q1", "q4"}


def test_route_returns_a_fresh_set() -> None:
    reg = ExchangeRegistry()
    reg.bind("amq.direct", "q1", "queue", "k")
    reg.route("amq.direct", "k").queues.add("junk")
    assert reg.route("amq.direct", "k").queues == {"q1"}


def test_router_backed_exchange_is_left_to_the_router() -> None:
    reg = ExchangeRegistry()
    reg.bind("amq.topic", "q", "queue", "a.*")
    result = reg.route("amq.topic", "a.b")
    assert result.queues == set() and result.to_router
    # reached through an exchange-to-exchange binding
    reg.declare("f", "fanout")
    reg.bind("f", "amq.topic", "exchange", "")
    reg.bind("f", "q2", "queue", "")
    result = reg.route("f", "a.b")
    assert result.queues == {"q2"} and result.to_router
    # another registry may route amq.topic itself
    plain = ExchangeRegistry(router_backed=frozenset())
    plain.bind("amq.topic", "q", "queue", "a.*")
    assert plain.route("amq.topic", "a.b").queues == {"q"}


def test_check_publish() -> None:
    reg = ExchangeRegistry()
    reg.declare("in", "fanout", internal=True)
    e = error(reg.check_publish, "in")
    assert (e.reply_code, e.text) == (
        403,
        "ACCESS_REFUSED - cannot publish to internal exchange 'in' in vhost '/'",
    )
    assert error(reg.check_publish, "nope").reply_code == 404
    assert reg.check_publish("amq.direct").name == "amq.direct"
    # an internal exchange is still reached through bindings
    reg.declare("f", "fanout")
    reg.bind("f", "in", "exchange", "")
    reg.bind("in", "q", "queue", "")
    assert reg.route("f", "").queues == {"q"}


# -- exchange-to-exchange ------------------------------------------------------------------------------


def test_exchange_chains_and_cycles() -> None:
    reg = ExchangeRegistry()
    reg.declare("a", "direct")
    reg.declare("b", "topic")
    reg.declare("c", "fanout")
    reg.bind("a", "b", "exchange", "k.x")
    reg.bind("b", "c", "exchange", "k.*")
    reg.bind("c", "a", "exchange", "")  # cycle a -> b -> c -> a
    reg.bind("c", "qc", "queue", "")
    reg.bind("b", "qb", "queue", "#")
    reg.bind("a", "qa", "queue", "k.x")
    assert reg.route("a", "k.x").queues == {"qa", "qb", "qc"}
    assert reg.route("c", "k.x").queues == {"qa", "qb", "qc"}
    assert reg.route("c", "other").queues == {"qc"}
    reg.bind("c", "c", "exchange", "")  # self-loop
    assert reg.route("c", "other").queues == {"qc"}
    reg.delete("c")
    assert reg.route("a", "k.x").queues == {"qa", "qb"}


def test_alternate_exchange_takes_unroutable_messages() -> None:
    reg = ExchangeRegistry()
    reg.declare("ae", "fanout")
    reg.bind("ae", "unrouted", "queue", "")
    reg.declare("main", "direct", arguments={"alternate-exchange": "ae"})
    reg.bind("main", "q", "queue", "k")
    assert reg.route("main", "k").queues == {"q"}
    assert reg.route("main", "other").queues == {"unrouted"}
    reg.declare("ghost", "direct", arguments={"alternate-exchange": "missing"})
    assert reg.route("ghost", "k").queues == set()


# -- topic --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pattern", "key", "matches"),
    [
        ("a.b", "a.b", True),
        ("a.b", "a.b.c", False),
        ("a.*", "a.b", True),
        ("a.*", "a", False),
        ("a.*", "a.b.c", False),
        ("a.#", "a", True),
        ("a.#", "a.b.c", True),
        ("#", "", True),
        ("#", "a.b", True),
        ("*", "", False),
        ("*", "a", True),
        ("", "", True),
        ("", "a", False),
        ("#.b", "b", True),
        ("#.b", "a.x.b", True),
        ("a.#.b", "a.b", True),
        ("a.#.b", "a.x.y.b", True),
        ("a.#.b", "a.x.y.c", False),
        ("*.#", "", False),
        ("*.#", "a", True),
        ("a.", "a.", True),
        ("a.", "a", False),
        ("a.*", "a.", True),
        ("#.#", "a.b.c", True),
        ("*.*.#.*", "a.b", False),
        ("*.*.#.*", "a.b.c", True),
    ],
)
def test_topic_cases(pattern: str, key: str, matches: bool) -> None:
    reg = ExchangeRegistry()
    reg.declare("t", "topic")
    reg.bind("t", "q", "queue", pattern)
    assert reg.route("t", key).queues == ({"q"} if matches else set())
    assert reference_match(pattern, key) is matches
    assert topic_key_matches(pattern, key) is matches


def reference_match(pattern: str, key: str) -> bool:
    """RabbitMQ's topic rule, written the slow, obvious way."""

    def words(s: str) -> list[str]:
        return s.split(".") if s else []

    def go(p: list[str], k: list[str]) -> bool:
        if not p:
            return not k
        if p[0] == "#":
            return any(go(p[1:], k[i:]) for i in range(len(k) + 1))
        if not k:
            return False
        return (p[0] == "*" or p[0] == k[0]) and go(p[1:], k[1:])

    return go(words(pattern), words(key))


WORD = st.sampled_from(["a", "b", "c", ""])
PATTERN = st.lists(st.sampled_from(["a", "b", "c", "", "*", "#"]), max_size=5).map(".".join)
KEY = st.lists(WORD, max_size=5).map(".".join)


@settings(max_examples=150, deadline=None)
@given(patterns=st.lists(PATTERN, min_size=1, max_size=8), keys=st.lists(KEY, min_size=1, max_size=8))
def test_topic_trie_agrees_with_reference(patterns: list[str], keys: list[str]) -> None:
    reg = ExchangeRegistry()
    reg.declare("t", "topic")
    for i, p in enumerate(patterns):
        reg.bind("t", f"q{i}", "queue", p)
    for _ in range(2):  # the second pass is answered from the cache
        for k in keys:
            expected = {f"q{i}" for i, p in enumerate(patterns) if reference_match(p, k)}
            assert reg.route("t", k).queues == expected
    for p in patterns:
        for k in keys:
            assert topic_key_matches(p, k) is reference_match(p, k)
    # unbinding half of them prunes the trie and clears the cache
    for i, p in enumerate(patterns[::2]):
        reg.unbind("t", f"q{2 * i}", "queue", p)
    for k in keys:
        expected = {f"q{i}" for i, p in enumerate(patterns) if i % 2 and reference_match(p, k)}
        assert reg.route("t", k).queues == expected


def test_topic_unbind_everything_leaves_an_empty_trie() -> None:
    reg = ExchangeRegistry()
    reg.declare("t", "topic")
    keys = ["a.b", "a.*", "a.#", "#", "*.b.#", ""]
    for k in keys:
        reg.bind("t", "q", "queue", k)
        reg.bind("t", "r", "queue", k)
    for k in keys:
        reg.unbind("t", "q", "queue", k)
        reg.unbind("t", "r", "queue", k)
    assert reg.route("t", "a.b").queues == set()
    root = reg._entries["t"].matcher.root  # type: ignore[attr-defined]
    assert root.empty()


# -- headers --------------------------------------------------------------------------------------------


def headers_reg(args: dict[str, object]) -> ExchangeRegistry:
    reg = ExchangeRegistry()
    reg.bind("amq.headers", "q", "queue", "", args)
    return reg


@pytest.mark.parametrize(
    ("args", "headers", "matches"),
    [
        ({"x-match": "all", "a": 1, "b": "x"}, {"a": 1, "b": "x", "c": 3}, True),
        ({"x-match": "all", "a": 1, "b": "x"}, {"a": 1}, False),
        ({"x-match": "all", "a": 1, "b": "x"}, {"a": 1, "b": "y"}, False),
        ({"a": 1}, {"a": 1}, True),  # all is the default
        ({"a": 1}, None, False),
        ({"x-match": "all"}, None, True),  # nothing to match: all matches
        ({"x-match": "any"}, {"a": 1}, False),  # nothing to match: any does not
        ({"x-match": "any", "a": 1, "b": 2}, {"b": 2}, True),
        ({"x-match": "any", "a": 1, "b": 2}, {"a": 2, "b": 3}, False),
        ({"x-match": "all", "a": None}, {"a": "anything"}, True),  # void: presence only
        ({"x-match": "all", "a": None}, {"b": 1}, False),
        ({"x-match": "any", "a": None, "b": 1}, {"a": 5}, True),
        # x- binding arguments are ignored by all / any ...
        ({"x-match": "all", "x-k": "v", "a": 1}, {"a": 1}, True),
        ({"x-match": "any", "x-k": "v"}, {"x-k": "v"}, False),
        # ... and used by all-with-x / any-with-x
        ({"x-match": "all-with-x", "x-k": "v", "a": 1}, {"a": 1}, False),
        ({"x-match": "all-with-x", "x-k": "v", "a": 1}, {"a": 1, "x-k": "v"}, True),
        ({"x-match": "any-with-x", "x-k": "v", "a": 1}, {"x-k": "v"}, True),
        ({"x-match": "any-with-x", "x-k": "v"}, {"x-k": "w"}, False),
        # typed values
        ({"a": b"\x00\x01"}, {"a": b"\x00\x01"}, True),
        ({"a": Decimal("1.5")}, {"a": Decimal("1.50")}, True),
        ({"a": {"n": [1, 2]}}, {"a": {"n": [1, 2]}}, True),
        ({"a": {"n": [1, 2]}}, {"a": {"n": [2, 1]}}, False),
        ({"a": True}, {"a": 1}, False),
        ({"a": 1}, {"a": True}, False),
    ],
)
def test_headers_modes(args: dict[str, object], headers: dict[str, object] | None, matches: bool) -> None:
    assert headers_reg(args).route("amq.headers", "ignored", headers).queues == ({"q"} if matches else set())


def test_headers_exchange_to_exchange() -> None:
    reg = ExchangeRegistry()
    reg.declare("h", "headers")
    reg.bind("amq.match", "h", "exchange", "", {"x-match": "any", "kind": "a"})
    reg.bind("h", "q", "queue", "", {"level": None})
    assert reg.route("amq.match", "", {"kind": "a", "level": 1}).queues == {"q"}
    assert reg.route("amq.match", "", {"kind": "b", "level": 1}).queues == set()


# -- arguments and restore ---------------------------------------------------------------------------------


def test_freeze_and_thaw_round_trip() -> None:
    args: dict[str, object] = {"b": [1, {"z": None, "y": b"x"}], "a": Decimal("2.5"), "c": {"d": ["e"]}}
    frozen = freeze_arguments(args)
    assert hash(frozen) == hash(freeze_arguments(dict(reversed(list(args.items())))))
    assert thaw_arguments(frozen) == args
    assert [k for k, _ in frozen] == ["a", "b", "c"]


def test_restore_loads_exchanges_and_bindings() -> None:
    src = ExchangeRegistry()
    src.declare("d", "direct", durable=True)
    src.declare("t", "topic", durable=True)
    src.bind("d", "t", "exchange", "k")
    src.bind("t", "q", "queue", "k.#")
    src.bind("amq.direct", "q", "queue", "z")
    dst = ExchangeRegistry()
    skipped = dst.restore(
        [x for x in src.exchanges() if x.name in ("d", "t")],
        [*src.bindings(), Binding("gone", "q", "queue", "k"), Binding("d", "gone", "exchange", "k")],
    )
    assert skipped == [Binding("gone", "q", "queue", "k"), Binding("d", "gone", "exchange", "k")]
    assert dst.route("d", "k").queues == {"q"}
    assert dst.route("amq.direct", "z").queues == {"q"}
    assert set(dst.bindings()) == set(src.bindings())
