"""security/permissions.py: RabbitMQ's rows, patterns and verdicts, without sockets."""

from __future__ import annotations

import re

import pytest

from trimaran.security.permissions import (
    ANONYMOUS,
    EXCHANGE,
    QUEUE,
    VERDICT_ENTRY_BYTES,
    PatternError,
    Permissions,
    check_pattern,
    default_rows,
)
from trimaran.vhosts import Permission, TopicPermission


def test_no_row_no_entry_whatever_else_the_table_holds() -> None:
    table = Permissions([Permission("alice", "t1")])
    assert table.may_enter("alice", "t1")
    assert not table.may_enter("alice", "/") and not table.may_enter("bob", "t1")
    assert not table.may_enter(None, "/")  # anonymous clients have guest's rows: none here
    assert not table.allows("bob", "t1", "read", QUEUE, "q")
    assert Permissions().may_enter("alice", "/") is False  # an empty table lets nobody in


def test_anonymous_clients_have_guests_permissions() -> None:
    table = Permissions(default_rows())
    assert default_rows() == [Permission(ANONYMOUS, "/", ".*", ".*", ".*")]
    assert table.may_enter(None, "/") and table.may_enter("guest", "/")
    assert table.allows(None, "/", "configure", QUEUE, "anything")
    assert not table.may_enter(None, "t1")


def test_a_pattern_is_searched_for_as_erlangs_re_run_does() -> None:
    table = Permissions([Permission("alice", "/", "^alice-", "alice", "")])
    assert table.allows("alice", "/", "configure", QUEUE, "alice-q")
    assert not table.allows("alice", "/", "configure", QUEUE, "bob-alice-q")  # anchored
    assert table.allows("alice", "/", "write", QUEUE, "bob-alice-q")  # unanchored: anywhere
    assert not table.allows("alice", "/", "write", QUEUE, "bob-q")
    # An empty pattern matches no resource (RabbitMQ reads it as ^$).
    assert not table.allows("alice", "/", "read", QUEUE, "alice-q")
    assert not table.allows("alice", "/", "read", EXCHANGE, "")


def test_the_default_exchange_is_amq_default() -> None:
    table = Permissions([Permission("alice", "/", "", r"^amq\.default$", "")])
    assert table.allows("alice", "/", "write", EXCHANGE, "")
    assert not table.allows("alice", "/", "write", EXCHANGE, "amq.topic")
    assert not table.allows("alice", "/", "write", QUEUE, "")  # only the exchange has that name


def test_verdicts_are_bounded_in_bytes() -> None:
    """Each connection's own queue name is asked once and never again: the cache forgets everything
    past its bound rather than growing with every connection."""
    table = Permissions([Permission("alice", "/", "^amq", ".*", ".*")])
    table.verdict_bytes = 4096
    sizes = []
    for n in range(1000):
        assert table.allows("alice", "/", "configure", QUEUE, f"amq.gen-{n:030d}")
        assert table.allows_key("alice", "/", "write", "amq.topic", f"device.{n:030d}", f"client-{n}")
        sizes.append(len(table._verdicts) + len(table._key_verdicts))
        assert table._verdicts_size <= 4096 and table._key_verdicts_size <= 4096
    assert max(sizes) <= 2 * 4096 // (VERDICT_ENTRY_BYTES + 37)
    assert table.allows("alice", "/", "configure", QUEUE, "amq.gen-0")  # asked again after forgetting


def test_everything_is_answered_without_a_search_or_a_verdict() -> None:
    """``.*`` (the default user's) matches every name: a connection's own new queue name costs no
    search and leaves no verdict behind."""
    table = Permissions([Permission("alice", "/", ".*", ".*", "^q")])
    for n in range(100):
        assert table.allows("alice", "/", "configure", QUEUE, f"mqtt-subscription-c{n}qos1")
        assert table.allows("alice", "/", "write", EXCHANGE, "")
    assert table._verdicts == {}
    assert table.allows("alice", "/", "read", QUEUE, "q1")
    assert not table.allows("alice", "/", "read", QUEUE, "r")
    assert len(table._verdicts) == 2
    assert not table.allows("bob", "/", "read", QUEUE, "q1")  # no row, no access


def test_verdicts_are_kept_until_a_permission_changes() -> None:
    table = Permissions([Permission("alice", "/", ".*", ".*", "^q$")])
    searched: list[str] = []
    real = table._patterns[("alice", "/")]["read"]
    assert real is not None
    search = real.search

    class Counting:
        def search(self, name: str) -> re.Match[str] | None:
            searched.append(name)
            return search(name)

    table._patterns[("alice", "/")]["read"] = Counting()  # type: ignore[assignment]
    for _ in range(100):
        assert table.allows("alice", "/", "read", QUEUE, "q")
    assert searched == ["q"]  # one regular expression for a hundred questions
    before = table.generation
    table.set(Permission("alice", "/", ".*", ".*", "^x"))
    assert table.generation > before
    assert not table.allows("alice", "/", "read", QUEUE, "q")
    assert table.clear("alice", "/") and not table.clear("alice", "/")
    assert not table.may_enter("alice", "/")


def test_forgetting_a_vhost_forgets_its_rows() -> None:
    table = Permissions([Permission("alice", "t1"), Permission("bob", "t1"), Permission("alice", "/")])
    assert table.allows("bob", "t1", "read", QUEUE, "q")
    table.forget_vhost("t1")
    assert table.rows() == [Permission("alice", "/")]
    assert not table.allows("bob", "t1", "read", QUEUE, "q")


def test_a_pattern_must_be_a_regular_expression() -> None:
    assert check_pattern("^alice-.*") == "^alice-.*"
    with pytest.raises(PatternError, match="not a regular expression"):
        check_pattern("(")


def test_topic_permissions_limit_keys_only_where_they_exist() -> None:
    table = Permissions([Permission("alice", "/")])
    assert table.allows_key("alice", "/", "write", "amq.topic", "any.key")  # none: any key
    table.set_topic(TopicPermission("alice", "/", "amq.topic", r"^{username}\.", r"^{vhost}\.{client_id}$"))
    assert table.topic_users == {("alice", "/")}
    assert table.allows_key("alice", "/", "write", "amq.topic", "alice.x")
    assert not table.allows_key("alice", "/", "write", "amq.topic", "bob.x")
    assert table.allows_key("alice", "/", "write", "other", "bob.x")  # another exchange: none there
    # Values stand for themselves: the vhost "/" and the id "a.b" are escaped, not patterns.
    assert table.allows_key("alice", "/", "read", "amq.topic", "/.a.b", client_id="a.b")
    assert not table.allows_key("alice", "/", "read", "amq.topic", "/.aXb", client_id="a.b")
    assert table.clear_topic("alice", "/") == 1 and table.topic_users == set()
    assert table.allows_key("alice", "/", "write", "amq.topic", "bob.x")


def test_anonymous_clients_have_guests_topic_permissions() -> None:
    table = Permissions(default_rows())
    table.set_topic(TopicPermission("guest", "/", "amq.topic", "^public\\.", ""))
    assert table.allows_key(None, "/", "write", "amq.topic", "public.x")
    assert not table.allows_key(None, "/", "read", "amq.topic", "public.x")  # "" matches nothing
