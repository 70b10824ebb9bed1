"""Router: matching rules, aggregation, No Local, share groups, cache, introspection."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pytest

from trimaran.broker.router import Delivery, Router, Subscription, SubscriptionOptions, _Node
from trimaran.topics import TopicError


@dataclass(frozen=True)
class Client:
    id: str


A, B, C = Client("a"), Client("b"), Client("c")
Opts = SubscriptionOptions


def ids(deliveries: Sequence[Delivery[Client]]) -> list[str]:
    return sorted(d.subscriber.id for d in deliveries)


def matches(f: str, topic: str, beside: str | None = None) -> bool:
    r: Router[Client] = Router()
    if beside is not None:  # another subscriber's filter first: ``f`` is then a branch held as itself
        r.subscribe(B, beside, Opts())
    r.subscribe(A, f, Opts())
    return A in [d.subscriber for d in r.match(topic)]


def held_at(f: str, depth: int) -> str:
    """A filter that makes ``f`` a branch held as its subscription from its level ``depth``."""
    levels = f.split("/")
    return "/".join([*levels[:depth], "other"])


@pytest.mark.parametrize(
    ("f", "topic", "expected"),
    [
        # MQTT 5.0 section 4.7 examples
        ("sport/tennis/player1/#", "sport/tennis/player1", True),
        ("sport/tennis/player1/#", "sport/tennis/player1/ranking", True),
        ("sport/tennis/player1/#", "sport/tennis/player1/score/wimbledon", True),
        ("sport/#", "sport", True),
        ("sport/tennis/+", "sport/tennis/player1", True),
        ("sport/tennis/+", "sport/tennis/player1/ranking", False),
        ("sport/+", "sport", False),
        ("sport/+", "sport/", True),
        ("+/+", "/finance", True),
        ("/+", "/finance", True),
        ("+", "/finance", False),
        ("+/tennis/#", "sport/tennis/x", True),
        ("#", "a", True),
        ("#", "/", True),
        ("a//b", "a//b", True),
        ("a/+/b", "a//b", True),
        ("+/+/+", "//", True),
        ("a/b", "a/b/c", False),
        ("a/b/c", "a/b", False),
        ("A", "a", False),
        # the $ rule
        ("#", "$SYS/x", False),
        ("#", "$SYS", False),
        ("+/monitor/Clients", "$SYS/monitor/Clients", False),
        ("+", "$x", False),
        ("$SYS/#", "$SYS/x", True),
        ("$SYS/#", "$SYS", True),
        ("$SYS/monitor/+", "$SYS/monitor/Clients", True),
        ("a/#", "a/$b", True),
        ("a/+", "a/$b", True),
        ("+/#", "a/$b", True),
        # a tenant's tree has the $ rule at its own first level (trimaran/vhosts.py)
        ("$vhost/v/#", "$vhost/v/$SYS/x", False),
        ("$vhost/v/+/x", "$vhost/v/$SYS/x", False),
        ("$vhost/v/$SYS/#", "$vhost/v/$SYS/x", True),
        ("$vhost/v/#", "$vhost/v/a/$b", True),
        ("$vhost/v/#", "$vhost/v", True),
        ("$vhost/+/#", "$vhost/v/a", True),
    ],
)
def test_match_rules(f: str, topic: str, expected: bool) -> None:
    """Each rule holds for a filter alone in the trie, and for one held as a branch from any level."""
    assert matches(f, topic) is expected
    for depth in range(len(f.split("/"))):
        assert matches(f, topic, held_at(f, depth)) is expected, f"held from level {depth}"


def test_subscribe_returns_new_or_replaced_and_counts() -> None:
    r: Router[Client] = Router()
    assert r.subscribe(A, "a/b", Opts(qos=0)) is True
    assert r.subscribe(A, "a/b", Opts(qos=2)) is False
    assert r.count() == 1
    assert r.match("a/b")[0].qos == 2
    assert r.subscribe(A, "a/b", Opts(share_group="g")) is True  # a different subscription
    assert r.count() == 2
    assert r.subscriber_count() == 1


def test_invalid_subscriptions() -> None:
    r: Router[Client] = Router()
    for bad in ["", "a/#/b", "a+", "$share/g/a"]:
        with pytest.raises(TopicError):
            r.subscribe(A, bad, Opts())
    for group in ["", "a/b", "g+", "#"]:
        with pytest.raises(TopicError):
            r.subscribe(A, "a", Opts(share_group=group))
    with pytest.raises(ValueError, match="No Local"):
        r.subscribe(A, "a", Opts(share_group="g", no_local=True))
    with pytest.raises(ValueError):
        r.subscribe(A, "a", Opts(qos=3))
    assert r.count() == 0


def test_invalid_topic_on_match() -> None:
    r: Router[Client] = Router()
    r.subscribe(A, "#", Opts())
    for bad in ["", "a/+", "#"]:
        with pytest.raises(TopicError):
            r.match(bad)


def test_overlapping_subscriptions_give_one_delivery() -> None:
    r: Router[Client] = Router()
    r.subscribe(A, "a/#", Opts(qos=0, subscription_identifier=1))
    r.subscribe(A, "a/+", Opts(qos=2, subscription_identifier=2, retain_as_published=True))
    r.subscribe(A, "a/b", Opts(qos=1))
    r.subscribe(A, "+/b", Opts(qos=1, subscription_identifier=1))  # duplicate identifier reported once
    r.subscribe(B, "a/b", Opts(qos=1, subscription_identifier=7))
    out = r.match("a/b")
    assert ids(out) == ["a", "b"]
    da = next(d for d in out if d.subscriber is A)
    assert da.qos == 2
    assert sorted(da.subscription_identifiers) == [1, 2]
    assert da.retain_as_published is True
    assert {s.topic_filter for s in da.subscriptions} == {"a/#", "a/+", "a/b", "+/b"}
    assert da.share_group is None
    db = next(d for d in out if d.subscriber is B)
    assert (db.qos, db.subscription_identifiers, db.retain_as_published) == (1, (7,), False)
    # Only 'a/#' matches 'a'.
    (only,) = r.match("a")
    assert (only.qos, only.subscription_identifiers) == (0, (1,))


def test_tag_is_passed_through() -> None:
    r: Router[Client] = Router()
    tag = object()
    r.subscribe(A, "t", Opts(tag=tag))
    assert r.match("t")[0].matched()[0].options.tag is tag


def test_no_local() -> None:
    r: Router[Client] = Router()
    r.subscribe(A, "chat/#", Opts(qos=1, no_local=True, subscription_identifier=1))
    r.subscribe(B, "chat/#", Opts(qos=1, no_local=True))
    r.subscribe(C, "chat/#", Opts())
    assert ids(r.match("chat/x", "a")) == ["b", "c"]
    assert ids(r.match("chat/x", "b")) == ["a", "c"]
    assert ids(r.match("chat/x", "c")) == ["a", "b", "c"]  # C did not ask for No Local
    assert ids(r.match("chat/x", None)) == ["a", "b", "c"]
    assert ids(r.match("chat/x", "a")) == ["b", "c"]  # memoised per publisher, same answer


def test_no_local_with_an_overlapping_subscription_keeps_the_other() -> None:
    r: Router[Client] = Router()
    r.subscribe(A, "chat/#", Opts(qos=2, no_local=True, subscription_identifier=1))
    r.subscribe(A, "chat/+", Opts(qos=1, subscription_identifier=2))
    (d,) = r.match("chat/x", "a")
    assert (d.qos, d.subscription_identifiers) == (1, (2,))
    (d,) = r.match("chat/x", "someone-else")
    assert (d.qos, sorted(d.subscription_identifiers)) == (2, [1, 2])


def test_a_branch_of_one_subscription_is_held_as_it_until_another_needs_its_levels() -> None:
    """Devices each subscribed to their own ``devices/<id>/+`` cost no trie levels of their own
    (issue 47): the branch is the subscription, in its parent's dict. A second subscription through
    it opens it into levels; matching, No Local, replacing and pruning are the same throughout."""
    r: Router[Client] = Router()
    devices = [Client(f"d{n}") for n in range(4)]
    for d in devices:
        assert r.subscribe(d, f"devices/{d.id}/+", Opts(qos=1, no_local=True)) is True
    devices_level = r._root.children
    assert isinstance(devices_level, _Node) and isinstance(devices_level.children, dict)
    held = devices_level.children
    # The first device came alone, as levels; each after it is held as its subscription.
    assert [isinstance(held[d.id], Subscription) for d in devices] == [False, True, True, True]
    assert r.subscribe(devices[1], "devices/d1/+", Opts(qos=2, no_local=True)) is False
    assert isinstance(held["d1"], Subscription) and held["d1"].options.qos == 2  # replaced in place
    (d,) = r.match("devices/d1/cmd")
    assert (d.subscriber, d.qos) == (devices[1], 2)
    assert ids(r.match("devices/d1/cmd", "d1")) == []  # No Local
    assert ids(r.match("devices/d1/cmd/x")) == [] and ids(r.match("devices/d1")) == []

    r.subscribe(A, "devices/d2/+", Opts())  # the same filter, another subscriber: opened
    r.subscribe(B, "devices/d3/#", Opts())  # a filter through its first level: opened
    assert not isinstance(held["d2"], Subscription) and not isinstance(held["d3"], Subscription)
    assert ids(r.match("devices/d2/cmd")) == ["a", "d2"]
    assert ids(r.match("devices/d2/cmd", "d2")) == ["a"]
    assert ids(r.match("devices/d3/cmd")) == ["b", "d3"]
    assert ids(r.match("devices/d3")) == ["b"]
    assert r.unsubscribe(devices[1], "devices/d1/+") is True
    assert "d1" not in held and r.unsubscribe(devices[1], "devices/d1/+") is False
    for client in [*devices, A, B]:
        r.unsubscribe_all(client)
    assert r._root.children is None and r.count() == 0


def test_share_group_round_robin() -> None:
    r: Router[Client] = Router()
    for c in (A, B, C):
        r.subscribe(c, "jobs/+", Opts(share_group="workers", qos=1))
    picks = [r.match("jobs/x") for _ in range(6)]
    assert all(len(p) == 1 for p in picks)
    assert [p[0].subscriber.id for p in picks] == ["a", "b", "c", "a", "b", "c"]
    assert all(p[0].share_group == "workers" and p[0].qos == 1 for p in picks)
    assert [s.subscriber for s in r.share_members("workers", "jobs/+")] == [A, B, C]
    assert r.share_members("workers", "jobs/#") == []
    assert r.share_members("other", "jobs/+") == []


def test_share_groups_are_per_group_and_filter_and_separate_from_plain() -> None:
    r: Router[Client] = Router()
    r.subscribe(A, "jobs/x", Opts(share_group="g1"))
    r.subscribe(B, "jobs/x", Opts(share_group="g1"))
    r.subscribe(C, "jobs/x", Opts(share_group="g2"))
    r.subscribe(A, "jobs/#", Opts(share_group="g1"))  # another group: same name, other filter
    r.subscribe(A, "jobs/x", Opts())
    out = r.match("jobs/x")
    assert len(out) == 4
    assert sorted((d.share_group or "-", d.subscriber.id) for d in out if d.share_group != "g1") == [
        ("-", "a"),
        ("g2", "c"),
    ]
    assert len([d for d in out if d.share_group == "g1"]) == 2


def test_share_member_leaving() -> None:
    r: Router[Client] = Router()
    r.subscribe(A, "q", Opts(share_group="g"))
    r.subscribe(B, "q", Opts(share_group="g"))
    assert r.match("q")[0].subscriber is A
    assert r.unsubscribe(B, "q", "g") is True
    assert [r.match("q")[0].subscriber for _ in range(3)] == [A, A, A]
    assert [s.subscriber for s in r.share_members("g", "q")] == [A]
    r.unsubscribe_all(A)
    assert not r.match("q")
    assert r.share_members("g", "q") == []


def test_unsubscribe() -> None:
    r: Router[Client] = Router()
    r.subscribe(A, "a/b", Opts())
    assert r.unsubscribe(A, "a/b", "g") is False
    assert r.unsubscribe(B, "a/b") is False
    assert r.unsubscribe(A, "a/+") is False
    assert r.match("a/b")
    assert r.unsubscribe(A, "a/b") is True
    assert r.unsubscribe(A, "a/b") is False
    assert not r.match("a/b")
    assert r.count() == 0
    assert not r._root.children  # pruned


def test_unsubscribe_all_and_introspection() -> None:
    r: Router[Client] = Router()
    r.subscribe(A, "a", Opts())
    r.subscribe(A, "b/#", Opts(qos=1))
    r.subscribe(A, "c", Opts(share_group="g"))
    r.subscribe(B, "a", Opts())
    assert [(s.topic_filter, s.options.share_group) for s in r.subscriptions_of(A)] == [
        ("a", None),
        ("b/#", None),
        ("c", "g"),
    ]
    assert r.subscriptions_of(C) == []
    assert len(list(r.iter_subscriptions())) == 4
    assert r.unsubscribe_all(A) == 3
    assert r.unsubscribe_all(A) == 0
    assert r.count() == 1
    assert [s.subscriber for s in r.iter_subscriptions()] == [B]
    assert ids(r.match("a")) == ["b"]
    assert not r.match("b/x")


def test_cache_hits_and_invalidation() -> None:
    r: Router[Client] = Router()
    r.subscribe(A, "a/+", Opts())
    assert ids(r.match("a/b")) == ["a"]
    assert ids(r.match("a/b")) == ["a"]
    assert r.cache_misses == 1
    r.subscribe(B, "#", Opts())
    assert ids(r.match("a/b")) == ["a", "b"]
    r.unsubscribe(A, "a/+")
    assert ids(r.match("a/b")) == ["b"]
    r.unsubscribe_all(B)
    assert not r.match("a/b")
    # a cache hit hands out the cached deliveries themselves, no copy, and they cannot be changed
    r.subscribe(A, "x", Opts())
    first = r.match("x")
    assert r.match("x") is first
    assert isinstance(first, tuple)
    assert ids(first) == ["a"]


def test_cache_is_bounded() -> None:
    r: Router[Client] = Router(cache_size=3)
    r.subscribe(A, "#", Opts())
    for i in range(10):
        assert ids(r.match(f"t/{i}")) == ["a"]
    assert r.cache_len() == 3
    assert ids(r.match("t/0")) == ["a"]
    uncached: Router[Client] = Router(cache_size=0)
    uncached.subscribe(A, "#", Opts())
    assert ids(uncached.match("x")) == ["a"]
    assert uncached.cache_len() == 0


def test_cache_is_bounded_in_bytes() -> None:
    r: Router[Client] = Router(cache_size=1000, cache_bytes=10_000)
    r.subscribe(A, "#", Opts())
    for i in range(10):
        assert ids(r.match(f"{i}/" + "x" * 3000)) == ["a"]  # long topics: three fit in 10,000 bytes
    assert r.cache_len() == 3
    assert ids(r.match("y" * 20_000)) == ["a"]  # larger than the whole cache: matched, not cached
    assert r.cache_len() == 3
    r.subscribe(B, "+/#", Opts())  # a wildcard change empties it, and its byte count
    for i in range(3):
        r.match(f"{i}/" + "x" * 3000)
    assert r.cache_len() == 3


def test_exact_filter_changes_keep_other_cache_entries() -> None:
    r: Router[Client] = Router()
    r.subscribe(A, "a/+", Opts())
    r.match("a/1")
    r.match("a/2")
    assert r.cache_len() == 2
    r.subscribe(B, "a/2", Opts())  # exact: only 'a/2' is dropped
    assert r.cache_len() == 1
    assert ids(r.match("a/1")) == ["a"]
    assert ids(r.match("a/2")) == ["a", "b"]
    r.unsubscribe_all(B)
    assert r.cache_len() == 1
    assert ids(r.match("a/2")) == ["a"]
    r.subscribe(C, "x/#", Opts())  # wildcard: everything goes
    assert r.cache_len() == 0


def test_reads_leaves_out_the_topics_a_subscriber_may_not_read_and_is_asked_once_per_topic() -> None:
    """A subscription its subscriber may read only in part (the permission rules): each topic is
    asked once, the answer kept with the topic's cached match."""
    r: Router[Client] = Router()
    asked: list[str] = []

    def reads(topic: str) -> bool:
        asked.append(topic)
        return topic != "t/secret"

    r.subscribe(A, "t/#", Opts(qos=1, reads=reads))
    r.subscribe(A, "t/+", Opts(qos=0))  # wholly readable: still delivered through this one
    r.subscribe(B, "t/#", Opts())
    for _ in range(3):
        assert ids(r.match("t/x")) == ["a", "b"]
        (secret_a,) = [d for d in r.match("t/secret") if d.subscriber is A]
        assert secret_a.qos == 0 and len(secret_a.matched()) == 1
    assert sorted(asked) == ["t/secret", "t/x"]
    r.unsubscribe(A, "t/+")
    assert ids(r.match("t/secret")) == ["b"]
    r.unsubscribe(A, "t/#")
    asked.clear()
    assert ids(r.match("t/x")) == ["b"] and asked == []
    with pytest.raises(ValueError):
        r.subscribe(C, "t/#", Opts(share_group="g", reads=reads))


def test_routes_are_counted_while_a_listener_hears_them_and_counted_when_asked_otherwise() -> None:
    """Without a listener (no cluster) the router keeps no count of each route (issue 47): routes()
    counts them when asked, and a listener set later starts from the subscriptions already held."""
    r: Router[Client] = Router()
    r.subscribe(A, "a/#", Opts())
    r.subscribe(B, "a/#", Opts())
    r.subscribe(A, "jobs", Opts(share_group="g"))
    assert r._routes is None
    assert sorted(r.routes()) == ["$share/g/jobs", "a/#"]
    heard: list[tuple[str, bool]] = []
    r.on_route = lambda key, added: heard.append((key, added))
    r.unsubscribe(A, "a/#")  # B still holds it
    r.subscribe(C, "b", Opts())
    r.unsubscribe_all(B)
    r.unsubscribe(A, "jobs", "g")
    assert heard == [("b", True), ("a/#", False), ("$share/g/jobs", False)]
    assert r.routes() == ["b"]
    r.on_route = None
    r.unsubscribe(C, "b")
    assert r._routes is None and r.routes() == [] and heard[-1] == ("$share/g/jobs", False)
