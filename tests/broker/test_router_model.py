"""The router against a brute-force reference, over random subscribe/unsubscribe/match sequences."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from trimaran.broker.router import Router, Subscription, SubscriptionOptions
from trimaran.topics import topic_matches


@dataclass(frozen=True)
class Client:
    id: str


CLIENTS = [Client("a"), Client("b"), Client("c")]


def reference_match(topic_filter: str, topic: str) -> bool:
    """Recursive definition of MQTT matching, written independently of the trie and of topic_matches."""
    if topic.startswith("$") and topic_filter[0] in "+#":
        return False
    f, t = topic_filter.split("/"), topic.split("/")

    def rec(i: int, j: int) -> bool:
        if i == len(f):
            return j == len(t)
        if f[i] == "#":
            return True  # the parent level (j == len(t)) or any number of levels below
        if j == len(t):
            return False
        return (f[i] == "+" or f[i] == t[j]) and rec(i + 1, j + 1)

    return rec(0, 0)


topic_level = st.sampled_from(["a", "b", "", "$s"])
topics = st.lists(topic_level, min_size=1, max_size=3).map("/".join).filter(bool)
filter_level = st.sampled_from(["a", "b", "", "+", "$s"])
filters = st.builds(
    lambda levels, hash_last: "/".join([*levels, "#"] if hash_last else levels),
    st.lists(filter_level, min_size=0, max_size=3),
    st.booleans(),
).filter(bool)


def topic_for(topic_filter: str, data: st.DataObject) -> str:
    """A topic that a filter probably matches: wildcards replaced by random levels."""
    out: list[str] = []
    for level in topic_filter.split("/"):
        if level == "+":
            out.append(data.draw(topic_level))
        elif level == "#":
            out.extend(data.draw(st.lists(topic_level, max_size=2)))
        else:
            out.append(level)
    return "/".join(out) or "a"


clients = st.sampled_from(CLIENTS)
groups = st.sampled_from([None, None, "g1", "g2"])
publishers = st.sampled_from([None, "a", "b", "z"])


@given(filters, topics)
def test_topic_matches_agrees_with_reference(topic_filter: str, topic: str) -> None:
    assert topic_matches(topic_filter, topic) == reference_match(topic_filter, topic)


Key = tuple[Client, str, str | None]


class RouterModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.router: Router[Client] = Router()
        self.model: dict[Key, SubscriptionOptions] = {}
        self.matched: list[str] = []  # topics likely to be in the match cache

    @initialize(cache_size=st.sampled_from([0, 2, 1000]))
    def make(self, cache_size: int) -> None:
        self.router = Router(cache_size=cache_size)

    @rule(
        client=clients,
        topic_filter=filters,
        group=groups,
        qos=st.integers(0, 2),
        no_local=st.booleans(),
        rap=st.booleans(),
        sid=st.none() | st.integers(1, 3),
    )
    def subscribe(
        self,
        client: Client,
        topic_filter: str,
        group: str | None,
        qos: int,
        no_local: bool,
        rap: bool,
        sid: int | None,
    ) -> None:
        options = SubscriptionOptions(
            qos=qos,
            no_local=no_local and group is None,
            retain_as_published=rap,
            subscription_identifier=sid,
            share_group=group,
        )
        key = (client, topic_filter, group)
        assert self.router.subscribe(client, topic_filter, options) is (key not in self.model)
        self.model[key] = options

    @rule(client=clients, topic_filter=filters, group=groups)
    def unsubscribe(self, client: Client, topic_filter: str, group: str | None) -> None:
        key = (client, topic_filter, group)
        assert self.router.unsubscribe(client, topic_filter, group) is (key in self.model)
        self.model.pop(key, None)

    @rule(data=st.data())
    def unsubscribe_existing(self, data: st.DataObject) -> None:
        if self.model:
            client, topic_filter, group = data.draw(st.sampled_from(sorted(self.model, key=repr)))
            assert self.router.unsubscribe(client, topic_filter, group)
            del self.model[(client, topic_filter, group)]

    @rule(client=clients)
    def unsubscribe_all(self, client: Client) -> None:
        mine = [k for k in self.model if k[0] == client]
        assert self.router.unsubscribe_all(client) == len(mine)
        for k in mine:
            del self.model[k]

    @rule(data=st.data(), publisher=publishers, repeat=st.integers(1, 3))
    def match_subscribed(self, data: st.DataObject, publisher: str | None, repeat: int) -> None:
        if self.model:
            (_, topic_filter, _) = data.draw(st.sampled_from(sorted(self.model, key=repr)))
            self.match(topic_for(topic_filter, data), publisher, repeat)

    @rule(data=st.data(), publisher=publishers)
    def rematch(self, data: st.DataObject, publisher: str | None) -> None:
        """Match a topic matched before: after a change, the cached answer must not be reused."""
        if self.matched:
            self.match(data.draw(st.sampled_from(self.matched)), publisher, 1)

    @rule(topic=topics, publisher=publishers, repeat=st.integers(1, 3))
    def match(self, topic: str, publisher: str | None, repeat: int) -> None:
        if topic not in self.matched:
            self.matched.append(topic)
        plain: dict[Client, list[SubscriptionOptions]] = {}
        shared: dict[tuple[str, str], set[Client]] = {}
        for (client, topic_filter, group), options in self.model.items():
            if not reference_match(topic_filter, topic):
                continue
            if group is not None:
                shared.setdefault((group, topic_filter), set()).add(client)
            elif not (options.no_local and client.id == publisher):
                plain.setdefault(client, []).append(options)

        for _ in range(repeat):  # the second time round comes from the cache
            out = self.router.match(topic, publisher)
            got_plain = [d for d in out if d.share_group is None]
            got_shared = [d for d in out if d.share_group is not None]
            assert sorted(d.subscriber.id for d in got_plain) == sorted(c.id for c in plain)
            for d in got_plain:
                expected = plain[d.subscriber]
                assert d.qos == max(o.qos for o in expected)
                assert set(d.subscription_identifiers) == {
                    o.subscription_identifier for o in expected if o.subscription_identifier is not None
                }
                assert len(set(d.subscription_identifiers)) == len(d.subscription_identifiers)
                assert d.retain_as_published == any(o.retain_as_published for o in expected)
                assert sorted((s.options for s in d.matched()), key=repr) == sorted(expected, key=repr)
                assert all(s.subscriber is d.subscriber for s in d.matched())
            assert len(got_shared) == len(shared)
            seen = set()
            for d in got_shared:
                (sub,) = d.matched()
                group_key = (sub.options.share_group, sub.topic_filter)
                assert group_key not in seen
                seen.add(group_key)
                assert d.share_group == sub.options.share_group
                assert d.subscriber in shared[group_key]  # type: ignore[index]
                assert self.model[(d.subscriber, sub.topic_filter, d.share_group)] is sub.options
                assert d.qos == sub.options.qos

    @invariant()
    def cached_topics_still_agree(self) -> None:
        """After any change, topics that are (or were) in the match cache give the model's answer."""
        for topic in self.matched[-6:]:
            self.match(topic, None, 1)

    @invariant()
    def counts_and_listings(self) -> None:
        assert self.router.count() == len(self.model)
        listed = {
            (s.subscriber, s.topic_filter, s.options.share_group): s.options
            for s in self.router.iter_subscriptions()
        }
        assert listed == self.model
        for client in CLIENTS:
            assert {
                (s.topic_filter, s.options.share_group) for s in self.router.subscriptions_of(client)
            } == {(f, g) for (c, f, g) in self.model if c == client}

    @invariant()
    def trie_shape(self) -> None:
        """A level's only child is held as itself or in a dict; each is named by its own level; a
        branch with one plain subscription may be held as it, in a dict, named by its filter's level;
        and a branch with nothing subscribed below it is pruned."""

        def walk(node: Any, path: list[str]) -> int:  # subscriptions at and below node
            children = node.children
            below = [children] if isinstance(children, type(node)) else list((children or {}).items())
            held = len(node.subs if isinstance(node.subs, dict) else [node.subs] if node.subs else [])
            held += sum(len(g.members) for g in (node.groups or {}).values())
            for item in below:
                child = item[1] if isinstance(item, tuple) else item
                if isinstance(child, Subscription):  # a branch held as its subscription
                    assert isinstance(item, tuple) and child.options.share_group is None
                    assert child.topic_filter.split("/")[: len(path) + 1] == [*path, item[0]]
                    assert self.model[(child.subscriber, child.topic_filter, None)] is child.options
                    held += 1
                    continue
                assert not isinstance(item, tuple) or item[0] == child.level
                under = walk(child, [*path, child.level])
                assert under > 0  # no empty branch
                held += under
            assert children != {}
            return held

        assert walk(self.router._root, []) == len(self.model)

    def teardown(self) -> None:
        # Everything unsubscribed leaves an empty trie behind (branches are pruned).
        for client in CLIENTS:
            self.router.unsubscribe_all(client)
        assert self.router._root.children is None


TestRouterModel = RouterModel.TestCase
TestRouterModel.settings = settings(max_examples=100, stateful_step_count=30, deadline=None)
