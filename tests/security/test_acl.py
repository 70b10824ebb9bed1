"""The rule file: Mosquitto's syntax plus configure, first match wins, deny by default, patterns,
'$' topics outside first-level wildcards, and subscriptions allowed only when wholly covered."""

from __future__ import annotations

import pytest

from trimaran.security import acl
from trimaran.security.acl import CONFIGURE, READ, WRITE

RULES = acl.parse(
    """
# anonymous
topic read public/#
user alice
topic deny alice/secret/#
topic readwrite alice/#
topic read,configure $queue/jobs
topic write
pattern read users/%u/#
pattern clients/%c/#
user bob
topic all #
"""
)


def allowed(user: str | None, access: str, topic: str, client_id: str = "c1") -> bool:
    return acl.decide(RULES.rules_for(user, client_id), access, topic)


def test_sections_and_access_words() -> None:
    assert allowed(None, READ, "public/news") and not allowed(None, WRITE, "public/news")
    assert not allowed(None, READ, "alice/x")
    assert allowed("alice", WRITE, "alice/x") and allowed("alice", READ, "alice/x/y")
    assert allowed("alice", CONFIGURE, "$queue/jobs") and not allowed("alice", WRITE, "$queue/jobs")
    assert allowed("alice", READ, "write")  # 'topic write' alone: the topic named "write", readwrite
    assert not allowed("mallory", READ, "public/news")  # unknown user: no rules, denied


def test_first_match_wins_and_deny_overlaps() -> None:
    assert not allowed("alice", READ, "alice/secret/key")
    assert not allowed("alice", READ, "alice/#")  # the subscription would include alice/secret
    assert allowed("alice", READ, "alice/public/#")


def test_patterns_substitute_user_and_client_id() -> None:
    assert allowed("alice", READ, "users/alice/inbox") and not allowed("alice", READ, "users/bob/inbox")
    assert allowed("alice", WRITE, "clients/c1/x", "c1") and not allowed("alice", WRITE, "clients/c2/x", "c1")
    assert not allowed(None, READ, "users/None/x")  # no user: %u patterns never match
    assert not allowed("alice", WRITE, "clients/a/b/x", "a/b")  # unsafe client ids never substitute
    assert not allowed("alice", WRITE, "clients/+/x", "+")


def test_dollar_topics_need_their_own_rules() -> None:
    assert allowed("bob", READ, "anything/at/all")
    assert not allowed("bob", READ, "$SYS/broker/version")
    assert not allowed("bob", WRITE, "$queue/jobs")


@pytest.mark.parametrize(
    ("rule", "topic_filter", "covered", "overlapping"),
    [
        ("a/#", "a", True, True),
        ("a/#", "a/b/c", True, True),
        ("a/+", "a/#", False, True),
        ("a/+/c", "a/b/+", False, True),
        ("#", "$SYS/x", False, False),
        ("+/x", "$q/x", False, False),
        ("a/b", "a/+", False, True),
        ("a/b", "a/c", False, False),
        ("#", "#", True, True),
    ],
)
def test_covers_and_overlaps(rule: str, topic_filter: str, covered: bool, overlapping: bool) -> None:
    assert acl.covers(rule, topic_filter) is covered
    assert acl.overlaps(rule, topic_filter) is overlapping


def test_bad_lines_are_named() -> None:
    for text in ("topic", "topic read a/#/b", "user", "subscribe a/b", "topic deny,read a"):
        with pytest.raises(acl.AclError, match=r"<rules>:1"):
            acl.parse(text)


def some(user: str | None, topic_filter: str) -> bool:
    return acl.decide_some(RULES.rules_for(user, "c1"), READ, topic_filter)


def test_a_subscription_is_granted_when_some_topic_it_matches_may_be_read() -> None:
    """Mosquitto's way: a wildcard over a deny is granted (each delivery decides for itself); a
    filter wholly under a deny, or meeting no readable topic, is not."""
    assert some("alice", "alice/#") and some("alice", "#") and some("alice", "+/+")
    assert not some("alice", "alice/secret/#") and not some("alice", "alice/secret/+")
    assert not some("alice", "bob/#") and not some(None, "alice/#")
    assert some(None, "+/news") and some(None, "public")  # public/# matches "public" itself
    assert not some("bob", "$SYS/#")  # "$" topics need a rule naming them: "#" is not one
    assert some("alice", "$queue/+") and not some("alice", "$queue/other")


@pytest.mark.parametrize(
    ("a", "b", "meeting"),
    [
        ("#", "a/b", "a/b"),
        ("a/#", "a", "a"),
        ("+/+", "a/#", "a/+"),
        ("a/+", "+/b", "a/b"),
        ("a/b/#", "a/#", "a/b/#"),
        ("#", "#", "#"),
        ("a/b", "a/c", None),
        ("a/b", "a/b/c", None),
        ("#", "$SYS/x", None),
        ("+", "$SYS", None),
        ("$SYS/#", "$SYS/+", "$SYS/+"),
    ],
)
def test_intersection(a: str, b: str, meeting: str | None) -> None:
    assert acl.intersection(a, b) == meeting
    assert acl.intersection(b, a) == meeting
