"""A node's forwards to the others hold their publishers while they wait (trimaran/cluster/node.py):
in process, with a stand-in for PostgreSQL's sender that sends only when the test lets it and a
recording stand-in for the runtime's gate; then two nodes on PostgreSQL with paho clients."""

from __future__ import annotations

import json
import logging
import threading
import urllib.request
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
import psycopg
import pytest

from tests.cluster.conftest import TOKEN, Nodes, wait_route, wait_until
from tests.support.gates import FakeGate, Publisher, Runner
from tests.support.paho import V311, Endpoints, connect
from trimaran.broker.core import Broker
from trimaran.broker.drops import CLUSTER_FORWARD
from trimaran.broker.message import Message
from trimaran.cluster import node as node_module
from trimaran.cluster.node import ClusterNode, Stalled
from trimaran.cluster.wire import FORWARD, decode_batch, parse_notice, unpack_inline
from trimaran.config import ClusterSettings
from trimaran.storage.notify import Flush

HIGH = 10  # forwards waiting above which publishers are held (at 5 or fewer: they go on)
TIMEOUT_S = 30.0


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class Sender:
    """PostgreSQL's sender: each send waits for the test's word, None (it commits) or an error."""

    def __init__(self) -> None:
        self.words, self._words = anyio.create_memory_object_stream[BaseException | None](10)
        self.asked = 0  # sends begun
        self.payloads: list[bytes] = []  # what committed, in order

    async def send(self, flush: Flush, _spill_text: Any) -> None:
        self.asked += 1
        word = await self._words.receive()
        if word is not None:
            raise word
        for _channel, text in flush.notices:
            assert text is not None
            kind, _, body = parse_notice(text)
            if kind == FORWARD:
                self.payloads += [message.payload for message, _ in decode_batch(unpack_inline(body))]


async def until(condition: Callable[[], bool]) -> None:
    with anyio.fail_after(10):
        while not condition():
            await anyio.sleep(0.001)


class Rig:
    def __init__(self, high_bytes: int = 1 << 30) -> None:
        self.runner = Runner()
        self.publisher = Publisher()
        self.runner.current = self.publisher
        self.gates: list[FakeGate] = []
        self.broker = Broker()
        settings = ClusterSettings(forward_backpressure_messages=HIGH, forward_backpressure_bytes=high_bytes)
        self.node = ClusterNode(
            settings,
            name="a",
            storage=None,  # type: ignore[arg-type]  # never reached: no run(), no reconnect
            broker=self.broker,
            claims_as="a",
            statement_timeout_s=5.0,
            make_gate=self._make,
            stalled_timeout_s=TIMEOUT_S,
        )
        self.node.table.add("b", "t/#")
        self.sender = Sender()
        self.node._sender = self.sender  # type: ignore[assignment]

    def _make(self, stalled: Stalled) -> FakeGate:
        self.gates.append(FakeGate(stalled, self.runner))
        return self.gates[-1]

    @property
    def gate(self) -> FakeGate:
        return self.gates[0]

    def forward(self, first: int, count: int, size: int = 1) -> None:
        for i in range(first, first + count):
            self.node.forward(Message(f"t/{i}", str(i).encode().ljust(size, b".")))


@pytest.fixture
async def rig() -> AsyncIterator[Rig]:
    rig = Rig()
    async with anyio.create_task_group() as group:
        group.start_soon(rig.node._flush_loop)
        yield rig
        group.cancel_scope.cancel()


def numbers(count: int) -> list[bytes]:
    return [str(i).encode() for i in range(count)]


@pytest.mark.anyio
async def test_forwards_waiting_above_the_mark_hold_the_publisher_until_a_send_leaves_half(rig: Rig) -> None:
    rig.forward(0, 1)
    await until(lambda: rig.sender.asked == 1)  # its send is in flight, and stays there
    rig.forward(1, HIGH - 1)  # ten waiting, in flight included: not above the mark yet
    assert rig.publisher.holds == 0 and not rig.node.behind
    rig.forward(HIGH, 1)  # eleven
    assert rig.publisher.holds == 1 and rig.node.behind and rig.gate.began == 1
    rig.forward(HIGH + 1, 5)  # what the held connection had read still goes: held once
    assert rig.publisher.holds == 1 and rig.gate.began == 1
    await rig.sender.words.send(None)  # the first send commits; fifteen wait, still above half
    await until(lambda: rig.sender.asked == 2)
    assert rig.publisher.holds == 1 and rig.node.behind
    await rig.sender.words.send(None)  # they commit: none wait, the publisher is read again
    await until(lambda: rig.publisher.holds == 0)
    assert not rig.node.behind and rig.node.sent == HIGH + 6
    assert rig.sender.payloads == numbers(HIGH + 6)
    assert rig.node.dropped == 0 and rig.broker.stats.drops.total == 0


@pytest.mark.anyio
async def test_the_byte_mark_holds_too() -> None:
    rig = Rig(high_bytes=4096)
    rig.forward(0, 4, size=2000)  # about 8 KB waiting (nothing flushes: no loop runs)
    assert rig.publisher.holds == 1 and rig.node.behind


@pytest.mark.anyio
async def test_a_failed_send_keeps_its_forwards_for_the_retry_in_order(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    reconnected = anyio.Event()

    async def reconnect() -> None:
        await reconnected.wait()

    monkeypatch.setattr(rig.node, "_reconnect_sender", reconnect)
    rig.forward(0, 3)
    await until(lambda: rig.sender.asked == 1)
    await rig.sender.words.send(psycopg.OperationalError("server closed the connection unexpectedly"))
    await until(lambda: rig.node._queued == 3)  # back in the buffer, counted
    rig.forward(3, HIGH)  # still waiting for PostgreSQL: thirteen waiting, the publisher is held
    assert rig.publisher.holds == 1
    reconnected.set()
    await until(lambda: rig.sender.asked == 2)
    await rig.sender.words.send(None)
    await until(lambda: rig.publisher.holds == 0)
    assert rig.sender.payloads == numbers(HIGH + 3)
    assert rig.node.dropped == 0 and rig.broker.stats.drops.total == 0


@pytest.mark.anyio
async def test_without_postgresql_the_publishers_stay_held_and_it_is_said_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    rig = Rig()
    rig.forward(0, HIGH + 1)  # nothing is ever sent
    assert rig.publisher.holds == 1
    with caplog.at_level(logging.WARNING, logger="trimaran.cluster.node"):
        assert rig.gate.check(1.0)  # keep holding: nothing acknowledged is dropped
        assert not caplog.records
        assert rig.gate.check(TIMEOUT_S)
        assert rig.gate.check(TIMEOUT_S)
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and "no forward was sent to the other nodes for 31 s (11 waiting)" in said[0]
    assert rig.publisher.holds == 1 and rig.node.dropped == 0


@pytest.mark.anyio
async def test_past_the_last_resort_bound_forwards_are_dropped_and_counted_by_reason(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(node_module, "MAX_PENDING", 3)
    rig = Rig()
    rig.runner.current = None  # a publish no connection made (nobody to hold)
    rig.forward(0, 5)
    assert rig.node.dropped == 2
    assert rig.broker.stats.drops.counts == {(CLUSTER_FORWARD, "/"): 2}


COUNT = 5000  # QoS 1 messages, up to 1,000 unacknowledged at once: far past the node's mark (10)


def cluster_api(server: Any) -> dict[str, Any]:
    request = urllib.request.Request(
        f"http://127.0.0.1:{server.ports['http']}/api/v1/cluster",
        headers={"Authorization": f"Bearer {TOKEN}"},
    )
    with urllib.request.urlopen(request, timeout=5) as reply:
        body: dict[str, Any] = json.load(reply)
    return body


def metrics_of(server: Any) -> dict[str, float]:
    request = urllib.request.Request(
        f"http://127.0.0.1:{server.ports['http']}/metrics", headers={"Authorization": f"Bearer {TOKEN}"}
    )
    with urllib.request.urlopen(request, timeout=5) as reply:
        text = reply.read().decode()
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            values[name] = float(value)
    return values


@pytest.mark.postgres
def test_a_qos1_publisher_outrunning_the_forwards_loses_nothing_it_was_acknowledged(nodes: Nodes) -> None:
    a = nodes.start("a", http=True, settings={"TRIMARAN_CLUSTER__FORWARD_BACKPRESSURE_MESSAGES": str(HIGH)})
    b = nodes.start("b")
    topic = f"f{uuid.uuid4().hex[:8]}"
    subscriber = connect(Endpoints("127.0.0.1", b.ports["mqtt"]), "reader", version=V311)
    publisher = connect(Endpoints("127.0.0.1", a.ports["mqtt"]), "writer", version=V311, max_inflight=1000)
    try:
        subscriber.subscribe(f"{topic}/#", qos=1)
        wait_route(nodes, "b", f"{topic}/#")
        acked: set[int] = set()
        all_acked = threading.Event()
        lock = threading.Lock()

        def on_publish(_c: Any, _u: Any, mid: int, _rc: Any, _p: Any) -> None:
            with lock:
                acked.add(mid)
                if len(acked) == COUNT:
                    all_acked.set()

        publisher.client.on_publish = on_publish
        for i in range(COUNT):
            publisher.client.publish(f"{topic}/x", f"{i:08d}".encode(), qos=1)
        assert all_acked.wait(120), f"{len(acked)} of {COUNT} acknowledged"
        got = [int(m.payload) for m in subscriber.drain(COUNT, timeout=120)]
        assert got == list(range(COUNT))  # every one, once, in order
        subscriber.expect_none(0.3)
        state = cluster_api(a)
        assert state["dropped"] == 0
        wait_until(lambda: cluster_api(a)["waiting"] == 0, what="the forwards sent")
        metrics = metrics_of(a)
        assert metrics['trimaran_flow_holds_total{place="cluster"}'] >= 1  # the publisher was held
        assert metrics['trimaran_messages_dropped_total{reason="cluster_forward",vhost="/"}'] == 0
    finally:
        subscriber.disconnect()
        publisher.disconnect()
