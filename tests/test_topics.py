"""Topic names, filters, $share parsing and the AMQP 0.9.1 key mapping."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trimaran.topics import (
    MAX_TOPIC_BYTES,
    SharedFilter,
    TopicError,
    binding_key_to_filter,
    filter_to_binding_key,
    is_valid_topic_filter,
    is_valid_topic_name,
    join_shared,
    routing_key_to_topic,
    split_shared,
    topic_matches,
    topic_to_routing_key,
    validate_topic_filter,
    validate_topic_name,
)

VALID_NAMES = ["a", "/", "a/b", "/a", "a/", "a//b", "$SYS/x", "sport/tennis/player1", "é/ü", "a b", "*"]
INVALID_NAMES = ["", "a/+", "a/#", "+", "#", "a+b", "a\x00b", "\ud800"]

VALID_FILTERS = ["#", "+", "a/#", "+/+", "/+", "+/", "a/+/c", "sport/tennis/#", "$SYS/#", "+/#", "a//#"]
INVALID_FILTERS = ["", "a#", "a/b#", "#/a", "a/#/b", "a+/b", "a/+b", "++", "##", "a\x00", "\udfff"]


@pytest.mark.parametrize("name", VALID_NAMES)
def test_valid_names(name: str) -> None:
    validate_topic_name(name)
    assert is_valid_topic_name(name)


@pytest.mark.parametrize("name", INVALID_NAMES)
def test_invalid_names(name: str) -> None:
    with pytest.raises(TopicError):
        validate_topic_name(name)
    assert not is_valid_topic_name(name)


@pytest.mark.parametrize("f", VALID_FILTERS + VALID_NAMES)
def test_valid_filters(f: str) -> None:
    validate_topic_filter(f)
    assert is_valid_topic_filter(f)


@pytest.mark.parametrize("f", INVALID_FILTERS)
def test_invalid_filters(f: str) -> None:
    with pytest.raises(TopicError):
        validate_topic_filter(f)
    assert not is_valid_topic_filter(f)


def test_topic_error_is_value_error() -> None:
    assert issubclass(TopicError, ValueError)


def test_length_limit_counts_utf8_bytes() -> None:
    assert is_valid_topic_name("a" * MAX_TOPIC_BYTES)
    assert not is_valid_topic_name("a" * (MAX_TOPIC_BYTES + 1))
    two_byte = "é" * (MAX_TOPIC_BYTES // 2)  # 65534 bytes
    assert is_valid_topic_name(two_byte)
    assert not is_valid_topic_name(two_byte + "é")
    assert not is_valid_topic_filter("a/" * 40000)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("a/b", (None, "a/b")),
        ("$share", (None, "$share")),
        ("$share/g/a/b", ("g", "a/b")),
        ("$share/g/#", ("g", "#")),
        ("$share/g//", ("g", "/")),
        ("$share/group-1/$queue/orders", ("group-1", "$queue/orders")),
        ("$share/g/$share/h/x", ("g", "$share/h/x")),
    ],
)
def test_split_shared(text: str, expected: SharedFilter) -> None:
    assert split_shared(text) == expected
    assert join_shared(*expected) == text


@pytest.mark.parametrize(
    "text",
    ["$share/", "$share/g", "$share//a", "$share/g/", "$share/g+/a", "$share/#/a", "$share/g/a/#/b", "a/#/b"],
)
def test_split_shared_invalid(text: str) -> None:
    with pytest.raises(TopicError):
        split_shared(text)


@pytest.mark.parametrize(
    ("f", "topic", "expected"),
    [
        ("sport/#", "sport", True),
        ("sport/#", "sport/x/y", True),
        ("sport/+", "sport", False),
        ("sport/+", "sport/", True),
        ("+/+", "/finance", True),
        ("/+", "/finance", True),
        ("+", "/finance", False),
        ("#", "$SYS/x", False),
        ("+/x", "$SYS/x", False),
        ("$SYS/#", "$SYS/x", True),
        ("$SYS/+", "$SYS/x", True),
        ("a/$x", "a/$x", True),
        ("+/$x", "a/$x", True),
        ("a/b", "a/b/c", False),
    ],
)
def test_topic_matches(f: str, topic: str, expected: bool) -> None:
    assert topic_matches(f, topic) is expected


# --- AMQP 0.9.1 -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "topic"),
    [
        ("a.b", "a/b"),
        ("a", "a"),
        ("a..b", "a//b"),
        (".a", "/a"),
        ("a.", "a/"),
        (".", "/"),
        ("v1/2.x", "v1.2/x"),  # a dot inside an MQTT level and a slash inside an AMQP word swap
        ("a.*", "a/*"),  # '*' in a routing key is literal, and literal in a topic too
        ("$SYS.x", "$SYS/x"),
    ],
)
def test_routing_key_topic_mapping(key: str, topic: str) -> None:
    assert routing_key_to_topic(key) == topic
    assert topic_to_routing_key(topic) == key


@pytest.mark.parametrize("key", ["", "a.#", "a.+", "a+b", "a\x00"])
def test_routing_keys_mqtt_cannot_carry(key: str) -> None:
    with pytest.raises(TopicError):
        routing_key_to_topic(key)


@pytest.mark.parametrize(
    ("binding", "f"),
    [
        ("a.b", "a/b"),
        ("a.*", "a/+"),
        ("*.b.#", "+/b/#"),
        ("#", "#"),
        ("*", "+"),
        ("a.*.*", "a/+/+"),
        ("a..#", "a//#"),
        ("x/y.*", "x.y/+"),
        ("a*.b", "a*/b"),  # '*' inside a word is literal on both sides
    ],
)
def test_binding_key_filter_mapping(binding: str, f: str) -> None:
    assert binding_key_to_filter(binding) == f
    assert filter_to_binding_key(f) == binding


@pytest.mark.parametrize("binding", ["", "a.#.b", "#.a", "a.b+", "a.+", "a#.b"])
def test_binding_keys_mqtt_cannot_express(binding: str) -> None:
    with pytest.raises(TopicError):
        binding_key_to_filter(binding)


@pytest.mark.parametrize("f", ["a/*", "*", "*/#", "a/#/b", ""])
def test_filters_amqp_cannot_express(f: str) -> None:
    with pytest.raises(TopicError):
        filter_to_binding_key(f)


_level = st.text(alphabet="ab./*$é", max_size=3)
_topic = st.lists(_level, min_size=1, max_size=5).map("/".join).filter(bool)


@given(_topic)
def test_topic_routing_key_round_trip(topic: str) -> None:
    assert routing_key_to_topic(topic_to_routing_key(topic)) == topic


_filter_level = st.text(alphabet="ab.*$é", max_size=3).filter(lambda w: w != "*") | st.just("+")


@given(st.lists(_filter_level, min_size=1, max_size=5), st.booleans())
def test_filter_binding_key_round_trip(levels: list[str], hash_last: bool) -> None:
    f = "/".join([*levels, "#"] if hash_last else levels)
    if not f:
        return
    assert binding_key_to_filter(filter_to_binding_key(f)) == f
