"""The deck's side of a cluster, in process: the Forwarder port, forwarded deliveries, routes."""

from __future__ import annotations

from typing import Any

from trimaran.broker.core import Broker
from trimaran.broker.message import Message
from trimaran.broker.router import Delivery, SubscriptionOptions


class Sink:
    def __init__(self, name: str) -> None:
        self.id = name
        self.got: list[str] = []

    def __hash__(self) -> int:
        return id(self)

    def deliver(self, message: Message, delivery: Delivery[Any]) -> None:
        self.got.append(message.topic)


class Recorder:
    """A Forwarder that sends nothing and says share group g is served elsewhere."""

    def __init__(self, elsewhere: frozenset[tuple[str, str]] = frozenset()) -> None:
        self.forwarded: list[str] = []
        self.written: list[list[str]] = []
        self.elsewhere = elsewhere

    def forward(self, message: Message) -> tuple[int, frozenset[tuple[str, str]]]:
        self.forwarded.append(message.topic)
        return 1, self.elsewhere

    def retained_written(self, topics: list[str]) -> None:
        self.written.append(topics)


def test_the_router_reports_a_route_when_its_first_subscriber_comes_and_its_last_goes() -> None:
    broker = Broker()
    changes: list[tuple[str, bool]] = []
    broker.router.on_route = lambda key, added: changes.append((key, added))
    one, two = Sink("one"), Sink("two")
    broker.router.subscribe(one, "a/#", SubscriptionOptions())
    broker.router.subscribe(two, "a/#", SubscriptionOptions())
    broker.router.subscribe(one, "a/#", SubscriptionOptions(qos=1))  # replaced, not new
    broker.router.subscribe(two, "jobs", SubscriptionOptions(share_group="g"))
    assert changes == [("a/#", True), ("$share/g/jobs", True)]
    broker.router.unsubscribe(one, "a/#")
    assert changes[-1] == ("$share/g/jobs", True)
    broker.router.unsubscribe_all(two)
    assert changes[2:] == [("a/#", False), ("$share/g/jobs", False)]
    assert broker.router.routes() == []


def test_publish_hands_each_message_to_the_forwarder_and_skips_share_groups_served_elsewhere() -> None:
    broker = Broker()
    forwarder = Recorder(frozenset({("g", "jobs/+")}))
    broker.forwarder = forwarder
    plain, member = Sink("plain"), Sink("member")
    broker.router.subscribe(plain, "jobs/+", SubscriptionOptions())
    broker.router.subscribe(member, "jobs/+", SubscriptionOptions(share_group="g"))
    assert broker.publish(Message("jobs/1", b"x")) == 2  # the plain subscriber and the other node
    assert forwarder.forwarded == ["jobs/1"]
    assert plain.got == ["jobs/1"]
    assert member.got == []  # another node's member has it


def test_a_forwarded_message_is_delivered_here_only_and_to_the_share_groups_named() -> None:
    broker = Broker()
    forwarder = Recorder()
    broker.forwarder = forwarder
    plain, member, other = Sink("plain"), Sink("member"), Sink("other")
    broker.router.subscribe(plain, "jobs/+", SubscriptionOptions())
    broker.router.subscribe(member, "jobs/+", SubscriptionOptions(share_group="g"))
    broker.router.subscribe(other, "jobs/#", SubscriptionOptions(share_group="h"))
    count = broker.deliver_forwarded(Message("jobs/1", b"x", retain=True), frozenset({("g", "jobs/+")}))
    assert count == 2
    assert (plain.got, member.got, other.got) == (["jobs/1"], ["jobs/1"], [])
    assert forwarder.forwarded == []  # never forwarded again
    assert broker.retained.count() == 0  # the publishing node stored it


def test_retained_values_of_another_node_replace_without_being_written_again() -> None:
    changes: list[str] = []
    broker = Broker()
    broker.retained.on_change = lambda topic, _m: changes.append(topic)
    broker.retained.replace("a", Message("a", b"1", retain=True))
    assert broker.retained.get("a") is not None
    broker.retained.replace("a", None)
    assert broker.retained.get("a") is None
    assert changes == []


def test_sys_names_the_node_in_a_cluster() -> None:
    assert Broker(node_name="n1").sys_values()["$SYS/broker/node"] == "n1"
    assert "$SYS/broker/node" not in Broker().sys_values()
