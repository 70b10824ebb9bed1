"""A read's run of plain QoS 0 or QoS 1 PUBLISHes to one topic is routed once and delivered whole
(MqttFrontEnd.run_received): every subscriber, MQTT or not, gets exactly what it got when each
PUBLISH was its own event (at QoS 1 the same packet ids, the same window and session queue), the
publisher the same PUBACKs, and the broker counts the same. Each test builds the same world twice,
once with runs and once without, feeds both the same bytes, and compares everything observable."""

from __future__ import annotations

from typing import Any

import pytest

from tests.mqtt.mqtt_client import connected
from tests.support.runtime import Wire
from trimaran.broker.core import Broker
from trimaran.broker.events import MESSAGE_PUBLISHED
from trimaran.broker.message import Message
from trimaran.broker.router import Delivery, SubscriptionOptions
from trimaran.config import Settings
from trimaran.mqtt.codec import encode
from trimaran.mqtt.conn import MqttConn
from trimaran.mqtt.connection import ClientLimits, ServerConnection, ServerLimits
from trimaran.mqtt.handler import PUSH_BACK_BYTES, MqttEndpoint, MqttFrontEnd
from trimaran.mqtt.packets import PubAck, Publish, PublishRun
from trimaran.mqtt.packets import SubscriptionOptions as PacketOptions
from trimaran.mqtt.properties import Properties
from trimaran.mqtt.session import Subscription as SessionSubscription
from trimaran.runtime.runner import Runner
from trimaran.vhosts import prefix

pytestmark = pytest.mark.anyio

# The broker's counters (broker/stats.py; compiled, its class has no __slots__ to read them from).
STATS = (
    "bytes_received",
    "bytes_sent",
    "clients_connected",
    "clients_maximum",
    "clients_total",
    "messages_dropped",
    "messages_received",
    "messages_sent",
    "publish_routed",
)


def test_the_counters_compared_are_all_of_them() -> None:
    from trimaran.broker.stats import Stats
    from trimaran.traffic import Traffic

    # The source's classes have __slots__ (the traffic counters in the base class); the build's do not.
    slots = [*getattr(Traffic, "__slots__", ()), *getattr(Stats, "__slots__", ())]
    # (messages_dropped is the total of ``drops``, which counts them by reason and vhost)
    assert not slots or set(slots) == set(STATS) - {"messages_dropped"} | {"drops"}
    stats = Stats()
    assert all(getattr(stats, name) == 0 for name in STATS)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class Foreign:
    """Another hull's subscriber (an AMQP queue binding): it takes broker messages."""

    id = "amqp-binding"

    def __init__(self) -> None:
        self.got: list[tuple[str, bytes, int, bool, str | None]] = []

    def __hash__(self) -> int:
        return id(self)

    def deliver(self, message: Message, delivery: Delivery[Any]) -> None:
        self.got.append((message.topic, message.payload, message.qos, message.retain, message.publisher_id))


class World:
    def __init__(self, runs: bool, publisher_level: int, vhost: str = "/") -> None:
        self.broker = Broker(sys_interval=0)
        self.front = MqttFrontEnd(self.broker, Settings())
        self.runner = Runner()
        self.key = prefix(vhost)
        self.clients: dict[str, Any] = {}
        self.servers: dict[str, ServerConnection] = {}
        self.wires: dict[str, Wire] = {}
        self.foreign = Foreign()
        self.offline: dict[str, MqttEndpoint] = {}
        self.runs_seen = 0
        limits = ServerLimits(publish_runs=runs, topic_alias_maximum=8)
        endpoint = MqttEndpoint(self.front, self.key + "pub", publisher_level)
        self.pub_server, self.pub_client, _ = connected(
            limits, level=publisher_level, client_id="pub", session=endpoint
        )
        self.pub = self._attach("pub", self.pub_server, endpoint)

    def _attach(self, name: str, server: ServerConnection, endpoint: MqttEndpoint) -> MqttConn:
        wire = Wire(self.runner, lambda io, first: None)  # the runtime's side, never read
        conn = MqttConn(self.front, server, wire.conn)
        endpoint.conn, conn.endpoint = conn, endpoint
        self.servers[name] = server
        self.wires[name] = wire
        return conn

    def subscriber(
        self, name: str, level: int, topic_filter: str, *, offline: bool = False, **options: Any
    ) -> MqttEndpoint:
        connect = {k: options.pop(k) for k in list(options) if k == "properties"}
        max_queued = options.pop("max_queued", 1000)
        if name == "pub":
            endpoint = self.pub.endpoint
            assert endpoint is not None
            kept = PacketOptions(qos=options.get("qos", 0), no_local=options.get("no_local", False))
            subscribed = SessionSubscription(topic_filter, kept)
            endpoint.add_subscription(subscribed)  # as MqttFrontEnd._subscribe records it
        else:
            endpoint = MqttEndpoint(self.front, self.key + name, level, max_queued=max_queued)
            if offline:
                self.offline[name] = endpoint
            else:
                server, client, _ = connected(level=level, client_id=name, session=endpoint, **connect)
                self.clients[name] = client
                self._attach(name, server, endpoint)
        options = {"qos": 0, **options}
        self.broker.router.subscribe(endpoint, self.key + topic_filter, SubscriptionOptions(**options))
        return endpoint

    def ack_all(self) -> None:
        """Each connected subscriber acknowledges what it got at QoS 1; its window then moves on."""
        for client in self.clients.values():
            ids = [p.packet_id for p in getattr(client, "got", []) if isinstance(p, Publish) and p.qos == 1]
            client.got = []
            if ids:
                client.send(*[PubAck(packet_id) for packet_id in ids])

    def feed(self, data: bytes) -> None:
        """One read of the publisher's socket, acted on as the runtime does."""
        self.pub_server.receive_data(data, 0.0)
        while (event := self.pub_server.next_event()) is not None:
            if type(event) is PublishRun:
                self.runs_seen += 1
            self.pub.handle(event)

    def observed(self) -> dict[str, Any]:
        stats = self.broker.stats
        received = {}
        for name, client in self.clients.items():
            got = client.received()
            client.got = [*getattr(client, "got", []), *got]
            received[name] = got
        sessions = {
            name: (
                [(e.packet_id, e.payload, e.sent) for e in s.session.inflight_entries()],  # type: ignore[union-attr]
                [(m.topic, m.payload, m.qos) for m in s.session.queue],  # type: ignore[union-attr]
                s.session.next_packet_id,  # type: ignore[union-attr]
            )
            for name, s in self.servers.items()
        }
        sessions.update(
            (name, ([], [(m.topic, m.payload, m.qos) for m in e.queue], e.next_packet_id))
            for name, e in self.offline.items()
        )
        return {
            "received": received,
            "publisher": self.pub_client.received(),
            "sessions": sessions,
            "foreign": list(self.foreign.got),
            "stats": {name: getattr(stats, name) for name in STATS},
            "machines": {name: (s.stats.packets_received, s.stats.packets_sent, s.stats.dropped_too_large)
                         for name, s in self.servers.items()},
            "io": {name: (w.conn.messages_in, w.conn.messages_out) for name, w in self.wires.items()},
        }  # fmt: skip


def populate(world: World, publisher_level: int) -> None:
    world.subscriber("v311", 4, "a/#")
    world.subscriber("v31", 3, "a/b")
    world.subscriber("v5", 5, "a/+")
    world.subscriber("v5-id", 5, "a/#", subscription_identifier=7)
    world.subscriber("v5-aliases", 5, "a/b", properties=Properties(topic_alias_maximum=4))
    world.subscriber("v5-small", 5, "a/#", properties=Properties(maximum_packet_size=60))
    world.subscriber("share-1", 4, "a/b", share_group="g")
    world.subscriber("share-2", 5, "a/b", share_group="g")
    world.subscriber("offline", 4, "a/#", offline=True)
    world.subscriber("pub", publisher_level, "a/#", no_local=True)
    world.broker.router.subscribe(world.foreign, world.key + "a/b", SubscriptionOptions(qos=1))
    # Behind: its socket is full, and its outbox has room for a few messages only.
    world.subscriber("slow", 4, "a/#")
    world.wires["slow"].conn.writable = False
    world.wires["slow"].transport.buffered = world.front.outbox_bytes - 200
    # Near the push-back mark: a run would pass it, each message decides alone.
    world.subscriber("near", 5, "a/b")
    world.servers["near"].pending_out = PUSH_BACK_BYTES - 120


def stream(level: int) -> bytes:
    """Runs cut by a retained PUBLISH, another topic, QoS 1, properties, an alias and a $ topic."""
    packets: list[Publish] = []
    packets += [Publish("a/b", b"m%d" % i + b"." * (i * 37)) for i in range(6)]  # to 2-byte lengths
    packets.append(Publish("a/b", b"retained", retain=True))
    packets += [Publish("a/b", b"after retained %d" % i) for i in range(3)]
    packets += [Publish("a/c", b"other topic %d" % i) for i in range(2)]
    packets.append(Publish("a/b", b"qos1", qos=1, packet_id=1))
    packets += [Publish("a/b", b"after qos1 %d" % i) for i in range(2)]
    if level == 5:
        packets.append(Publish("a/b", b"props", properties=Properties(user_properties=[("k", "v")])))
        packets.append(Publish("a/b", b"alias set", properties=Properties(topic_alias=1)))
        packets.append(Publish("", b"alias used", properties=Properties(topic_alias=1)))
    packets += [Publish("$x/y", b"dollar %d" % i) for i in range(2)]
    packets += [Publish("a/b", b"last %d" % i) for i in range(4)]
    return b"".join(encode(p, level) for p in packets)


def both(publisher_level: int, vhost: str = "/", fill: Any = None) -> tuple[World, World]:
    on, off = World(True, publisher_level, vhost), World(False, publisher_level, vhost)
    for world in (on, off):
        (fill or populate)(world, publisher_level)
    return on, off


def populate_qos1(world: World, publisher_level: int) -> None:
    """QoS 1 subscribers of every kind, and QoS 0 ones of a QoS 1 run."""
    world.subscriber("v311", 4, "a/#", qos=1)
    world.subscriber("v31", 3, "a/b", qos=1)
    world.subscriber("v5", 5, "a/+", qos=1)
    world.subscriber("v5-id", 5, "a/#", qos=1, subscription_identifier=7)
    world.subscriber("v5-aliases", 5, "a/b", qos=1, properties=Properties(topic_alias_maximum=4))
    world.subscriber("v5-small", 5, "a/#", qos=1, properties=Properties(maximum_packet_size=60))
    # A window of 3: most deliveries wait in the session's queue, pumped by its PUBACKs.
    world.subscriber("v5-window", 5, "a/b", qos=1, properties=Properties(receive_maximum=3))
    world.subscriber("v311-full", 4, "a/b", qos=1, max_queued=4)  # its queue overflows
    world.subscriber("v311-q0", 4, "a/b", qos=0)
    world.subscriber("v5-q0", 5, "a/b", qos=0)
    world.subscriber("share-1", 4, "a/b", qos=1, share_group="g")
    world.subscriber("share-2", 5, "a/b", qos=1, share_group="g")
    world.subscriber("offline", 4, "a/#", qos=1, offline=True)
    world.subscriber("pub", publisher_level, "a/#", qos=1, no_local=True)
    world.broker.router.subscribe(world.foreign, world.key + "a/b", SubscriptionOptions(qos=1))
    world.servers["v311-full"].client_limits = ClientLimits(2)  # (3.1.1 has no Receive Maximum)


def stream_qos1(level: int) -> bytes:
    """QoS 1 runs cut by QoS 0, a retained one, QoS 2, another topic, properties and a $ topic; a
    packet id used again after its PUBACK; payloads to 2-byte remaining lengths."""
    packets: list[Publish] = []
    packets += [Publish("a/b", b"m%d" % i + b"." * (i * 37), 1, packet_id=i + 1) for i in range(6)]
    packets.append(Publish("a/b", b"qos0"))
    packets += [Publish("a/b", b"after qos0 %d" % i, 1, packet_id=10 + i) for i in range(3)]
    packets.append(Publish("a/b", b"retained", 1, retain=True, packet_id=20))
    packets.append(Publish("a/b", b"qos2", 2, packet_id=21))
    packets += [Publish("a/c", b"other topic %d" % i, 1, packet_id=30 + i) for i in range(2)]
    packets += [Publish("a/b", b"again %d" % i, 1, packet_id=1) for i in range(2)]
    if level == 5:
        packets.append(
            Publish("a/b", b"props", 1, packet_id=40, properties=Properties(user_properties=[("k", "v")]))
        )
    packets += [Publish("$x/y", b"dollar %d" % i, 1, packet_id=50 + i) for i in range(2)]
    packets += [Publish("a/b", b"last %d" % i, 1, packet_id=60 + i) for i in range(8)]
    return b"".join(encode(p, level) for p in packets)


@pytest.mark.parametrize("level", [3, 4, 5])
async def test_a_run_is_delivered_as_each_publish_was(level: int) -> None:
    on, off = both(level)
    data = stream(level)
    on.feed(data)
    off.feed(data)
    assert on.runs_seen >= 4 and off.runs_seen == 0
    got = on.observed()
    assert got == off.observed()
    assert len(got["received"]["v311"]) >= 19  # (the comparison compared something)
    assert got["received"]["slow"] and len(got["received"]["slow"]) < len(got["received"]["v311"])
    assert got["stats"]["messages_dropped"] > 0


@pytest.mark.parametrize("level", [4, 5])
async def test_a_run_in_a_tenant_stays_in_it(level: int) -> None:
    on, off = both(level, vhost="t1")
    outsider = on.broker.router
    stranger = Foreign()
    outsider.subscribe(stranger, "a/#", SubscriptionOptions(qos=0))  # the same filter in /
    data = stream(level)
    on.feed(data)
    off.feed(data)
    assert on.observed() == off.observed()
    assert stranger.got == []
    assert all(topic.startswith("$vhost/") for topic, *_ in on.foreign.got)


async def test_a_run_split_at_every_packet_gives_the_same() -> None:
    whole, split = World(True, 4), World(True, 4)
    for world in (whole, split):
        populate(world, 4)
    data = stream(4)
    whole.feed(data)
    for i in range(0, len(data), 7):  # cut anywhere: runs form only from what a read holds
        split.feed(data[i : i + 7])
    assert whole.observed() == split.observed()


async def test_a_broker_that_reports_each_publish_takes_each() -> None:
    on, off = both(4)
    seen: dict[str, list[tuple[str | None, bytes | None, int]]] = {"on": [], "off": []}
    for name, world in (("on", on), ("off", off)):
        found = seen[name]
        world.broker.events.subscribe(
            lambda event, found=found: found.append((event.topic, event.payload, event.data["subscribers"])),
            {MESSAGE_PUBLISHED},
        )
    data = stream(4)
    on.feed(data)
    off.feed(data)
    assert on.observed() == off.observed()
    assert seen["on"] == seen["off"] and len(seen["on"]) > 10


@pytest.mark.parametrize("level", [3, 4, 5])
async def test_a_qos1_run_is_delivered_and_acked_as_each_publish_was(level: int) -> None:
    on, off = both(level, fill=populate_qos1)
    data = stream_qos1(level)
    on.feed(data)
    off.feed(data)
    assert on.runs_seen >= 4 and off.runs_seen == 0
    got = on.observed()
    assert got == off.observed()
    # a PUBACK or PUBREC to each PUBLISH but the QoS 0 one, the two to $x/y too
    assert len(got["publisher"]) == data.count(b"a/") - 1 + 2
    assert len(got["received"]["v311"]) >= 19 and len(got["sessions"]["v5-window"][1]) > 10
    assert got["stats"]["messages_dropped"] > 0  # v311-full's queue
    for _ in range(8):  # the windows move on as the subscribers acknowledge
        on.ack_all()
        off.ack_all()
        assert on.observed() == off.observed()
    assert not got["sessions"]["v311"][1] and not on.observed()["sessions"]["v5-window"][1]


async def test_a_qos1_run_split_anywhere_gives_the_same() -> None:
    whole, split = World(True, 4), World(True, 4)
    for world in (whole, split):
        populate_qos1(world, 4)
    data = stream_qos1(4)
    whole.feed(data)
    for i in range(0, len(data), 11):
        split.feed(data[i : i + 11])
    assert whole.observed() == split.observed()


async def test_a_qos1_run_to_a_broker_that_reports_each_publish_is_walked() -> None:
    on, off = both(5, fill=populate_qos1)
    for world in (on, off):
        world.broker.events.subscribe(lambda event: None, {MESSAGE_PUBLISHED})
    data = stream_qos1(5)
    on.feed(data)
    off.feed(data)
    assert on.observed() == off.observed()


@pytest.mark.parametrize("level", [4, 5])
async def test_a_qos1_publisher_subscribed_to_itself_gets_each_before_its_puback(level: int) -> None:
    def fill(world: World, publisher_level: int) -> None:
        populate_qos1(world, publisher_level)
        world.subscriber("pub", publisher_level, "a/b", qos=1)  # its own messages, before each PUBACK

    on, off = both(level, fill=fill)
    data = stream_qos1(level)
    on.feed(data)
    off.feed(data)
    got = on.observed()
    assert got == off.observed()
    kinds = [type(p).__name__ for p in got["publisher"]]
    assert kinds[:4] == ["Publish", "PubAck", "Publish", "PubAck"]


def fleet(level: int, qos: int, topics: int = 8, count: int = 40) -> bytes:
    """A device's readings: each PUBLISH to the next of ``topics`` topics, one not under a/."""
    names = [f"a/dev/{i}" for i in range(topics - 1)] + ["b/dev/x"]
    return b"".join(
        encode(Publish(names[i % topics], b"r%d" % i, qos, packet_id=i + 1 if qos else None), level)
        for i in range(count)
    )


def populate_fleet(world: World, publisher_level: int) -> None:
    """Subscribers that take every topic of a fleet alike: a run that changes topic is one run."""
    world.subscriber("v311", 4, "#", qos=1)
    world.subscriber("v5", 5, "+/dev/#", qos=1)
    world.subscriber("v5-q0", 5, "#", qos=0)
    world.subscriber("v5-window", 5, "#", qos=1, properties=Properties(receive_maximum=3))


@pytest.mark.parametrize("level", [4, 5])
@pytest.mark.parametrize("qos", [0, 1])
async def test_a_run_that_changes_topic_is_delivered_whole_as_each_publish_was(level: int, qos: int) -> None:
    on, off = both(level, fill=populate_fleet)
    data = fleet(level, qos)
    on.feed(data)
    off.feed(data)
    assert on.runs_seen == 1
    got = on.observed()
    assert got == off.observed()
    assert len(got["received"]["v5-q0"]) == 40
    assert len(got["received"]["v311"]) + len(got["sessions"]["v311"][1]) == 40  # sent, or queued
    assert len(got["publisher"]) == (40 if qos else 0)
    for _ in range(15):
        on.ack_all()
        off.ack_all()
        assert on.observed() == off.observed()


@pytest.mark.parametrize("level", [3, 4, 5])
@pytest.mark.parametrize("qos", [0, 1])
async def test_a_run_whose_topics_route_apart_is_taken_in_stretches_as_each_publish_was(
    level: int, qos: int
) -> None:
    def fill(world: World, publisher_level: int) -> None:  # a/b, a/c and b/x each their own readers
        (populate_qos1 if qos else populate)(world, publisher_level)
        world.subscriber("only-c", 4, "a/c", qos=qos)
        world.subscriber("b-share", 5, "b/#", qos=qos, share_group="h")

    names = ["a/b", "a/c", "a/b", "a/b", "b/x", "a/c", "b/x", "b/x", "a/b"]
    data = b"".join(
        encode(Publish(name, b"%d" % i, qos, packet_id=i + 1 if qos else None), level)
        for i, name in enumerate(names * 3)
    )
    on, off = both(level, fill=fill)
    for world in (on, off):  # one more member, so the group's picks show
        world.subscriber("b-share-2", 4, "b/#", qos=qos, share_group="h")
    on.feed(data)
    off.feed(data)
    assert on.runs_seen == 1
    got = on.observed()
    assert got == off.observed()
    assert got["received"]["only-c"] and got["received"]["b-share"] and got["received"]["b-share-2"]
    for _ in range(8):
        on.ack_all()
        off.ack_all()
        assert on.observed() == off.observed()


async def test_a_run_that_changes_to_a_topic_walked_is_walked_whole() -> None:
    def fill(world: World, publisher_level: int) -> None:
        populate_fleet(world, publisher_level)
        world.subscriber("pub", publisher_level, "b/#", qos=1)  # it hears one of its topics

    on, off = both(4, fill=fill)
    data = fleet(4, 1)
    on.feed(data)
    off.feed(data)
    got = on.observed()
    assert got == off.observed()
    kinds = [type(p).__name__ for p in got["publisher"]]
    assert kinds.count("PubAck") == 40 and kinds.count("Publish") == 5
