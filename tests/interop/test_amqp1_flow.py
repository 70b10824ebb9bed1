"""Flow control over AMQP 1.0 with python-qpid-proton against the real server (issue 44).

- Eight senders (at least once) into one queue whose one receiver (prefetch 10) stops accepting:
  the queue stops growing near its high-water mark (its depth read from the broker), because the
  senders get no new link credit; when the receiver accepts again, everything accepted arrives,
  once, in each sender's order.
- A receiver that settles nothing while its queue holds publishers is detached with
  ``amqp:resource-limit-exceeded`` (proton calls ``on_link_error``); what it held goes to another
  receiver, and the sender goes on.

The depth is the broker's (AMQP 0.9.1's queue.declare-ok on the same port). The tests wait on
events; the one time-based look (``plateau``) only asks that a held queue does not grow on.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika
import pytest

from tests.interop.conftest import amqp1_server_args
from tests.support.names import unique
from tests.support.server import RunningServer, serving
from tests.support.waiting import plateau, wait_until

proton = pytest.importorskip("proton")

from proton import Message  # noqa: E402
from proton.handlers import MessagingHandler  # noqa: E402
from proton.reactor import Container  # noqa: E402

HIGH = 300  # limits.queue_backpressure_messages here
CREDIT = 50  # amqp1.link_credit here: the window a sender may have open
SENDERS = 8
COUNT = 1500  # per sender
SIZE = 512
# Past its mark a queue takes what its senders still had credit for (a window each), and the rest
# of the read that crossed it (a durable queue finds itself behind at the end of a read).
BOUND = HIGH + (SENDERS + 1) * CREDIT
STALL_S = 2


def start(workdir: Path, stall_s: float) -> RunningServer:
    env = {
        "TRIMARAN_LIMITS__QUEUE_BACKPRESSURE_MESSAGES": str(HIGH),
        "TRIMARAN_LIMITS__STALLED_CONSUMER_TIMEOUT_S": str(stall_s),
        "TRIMARAN_AMQP1__LINK_CREDIT": str(CREDIT),
    }
    return RunningServer(amqp1_server_args(), cwd=workdir, env=env).start()


@pytest.fixture(scope="module")
def flow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    with serving(start(tmp_path_factory.mktemp("flow1"), 300)) as server:
        yield server


@pytest.fixture(scope="module")
def stall_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    with serving(start(tmp_path_factory.mktemp("stall1"), STALL_S)) as server:
        yield server


class Depth(threading.Thread):
    """The queue's ready messages as the broker says them (AMQP 0.9.1, same port), asked over and
    over; the most it saw."""

    def __init__(self, port: int, queue: str) -> None:
        super().__init__(daemon=True)
        self.port, self.queue = port, queue
        self.last = self.most = 0
        self.done = threading.Event()

    def run(self) -> None:
        conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", self.port))
        channel = conn.channel()
        while not self.done.is_set():
            self.last = channel.queue_declare(self.queue, passive=True).method.message_count
            self.most = max(self.most, self.last)
            time.sleep(0.005)
        conn.close()


class Flow(MessagingHandler):  # type: ignore[misc]
    """``senders`` connections sending ``count`` messages each to ``address`` as their credit
    allows, and one receiver with ten deliveries unsettled at most (its credit, given back as it
    accepts: proton's ``prefetch`` would top it up as messages arrive) that accepts only once ``go``
    is set: each delivery at once from then on, what it held before together."""

    def __init__(self, url: str, address: str, senders: int, count: int) -> None:
        super().__init__(prefetch=0, auto_accept=False)
        self.url, self.address, self.senders, self.count = url, address, senders, count
        self.go = threading.Event()
        self.stop = threading.Event()  # the senders send no more (each sends ``count`` at most)
        self.sent = [0] * senders
        self.accepted = [0] * senders
        self.rejected = 0
        self.received: list[tuple[int, int]] = []
        self.errors: list[str] = []
        self.held: list[Any] = []
        self.conns: list[Any] = []
        self.links: dict[Any, int] = {}
        self.attached = threading.Event()  # the receiver's link (which made the queue) is attached

    def on_start(self, event: Any) -> None:
        container = event.container
        receiving = container.connect(self.url)
        self.conns.append(receiving)
        container.create_receiver(receiving, self.address)
        container.schedule(0.02, self)

    def on_link_opened(self, event: Any) -> None:
        """The receiver is attached (the queue is read): it takes ten, and the senders start."""
        if event.receiver is None or self.links:
            return
        event.receiver.flow(10)
        self.attached.set()
        container = event.container
        for who in range(self.senders):
            conn = container.connect(self.url)
            self.conns.append(conn)
            self.links[container.create_sender(conn, self.address)] = who

    def on_timer_task(self, event: Any) -> None:
        if self.go.is_set() and self.held:
            for delivery in self.held:
                self.accept(delivery)
            self.held[0].link.flow(len(self.held))
            self.held.clear()
        if self.finished():
            for conn in self.conns:
                conn.close()
            return
        event.container.schedule(0.02, self)

    def finished(self) -> bool:
        sent = sum(self.sent)
        return (
            (self.stop.is_set() or sent == self.senders * self.count)
            and sum(self.accepted) + self.rejected == sent
            and len(self.received) >= sent
        )

    def on_sendable(self, event: Any) -> None:
        who = self.links[event.sender]
        while event.sender.credit and self.sent[who] < self.count and not self.stop.is_set():
            body = f"{who}:{self.sent[who]}:".ljust(SIZE, "x")
            event.sender.send(Message(body=body))
            self.sent[who] += 1

    def on_accepted(self, event: Any) -> None:
        self.accepted[self.links[event.link]] += 1

    def on_rejected(self, event: Any) -> None:
        self.rejected += 1

    def on_message(self, event: Any) -> None:
        who, i, _ = event.message.body.split(":", 2)
        self.received.append((int(who), int(i)))
        if self.go.is_set():
            self.accept(event.delivery)
            event.receiver.flow(1)
        else:
            self.held.append(event.delivery)

    def on_link_error(self, event: Any) -> None:
        self.errors.append(str(event.link.remote_condition))

    def on_transport_error(self, event: Any) -> None:
        self.errors.append(str(event.transport.condition))


def running(handler: MessagingHandler) -> threading.Thread:
    container = Container(handler)
    thread = threading.Thread(target=container.run, daemon=True)
    thread.start()
    return thread


def peak_rss(pid: int) -> int:
    """The process's peak resident set (VmHWM), in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


@pytest.mark.slow
def test_eight_fast_senders_for_a_minute_leave_the_broker_under_300_mb(tmp_path: Path) -> None:
    """Issue 44's measure over AMQP 1.0, with the default marks and link credit: eight senders into
    one queue read by one receiver with ten unsettled at most, for 60 s: the broker's peak RSS
    stays under 300 MB and everything accepted is delivered."""
    server = RunningServer(amqp1_server_args(), cwd=tmp_path).start()
    with serving(server):
        assert server.process is not None
        port = server.ports["amqp"]
        handler = Flow(f"127.0.0.1:{port}", f"queue://{unique('soak1')}", SENDERS, 1 << 40)
        handler.go.set()
        thread = running(handler)
        try:
            assert handler.attached.wait(30)
            time.sleep(60)  # the measure is a minute of it
            handler.stop.set()
            thread.join(900)
            assert not thread.is_alive()
            peak = peak_rss(server.process.pid)
            print(f"sent {sum(handler.sent)}, peak RSS {peak / 2**20:.0f} MiB")
            assert peak < 300 * 2**20, peak
            assert handler.errors == [] and handler.rejected == 0
            assert sum(handler.accepted) == sum(handler.sent) == len(handler.received)
            assert len(set(handler.received)) == len(handler.received)
        finally:
            handler.go.set()
            handler.stop.set()


def test_eight_senders_into_a_stopped_receiver_get_no_credit_and_lose_nothing(
    flow_server: RunningServer,
) -> None:
    port = flow_server.ports["amqp"]
    queue = unique("flow1")
    handler = Flow(f"127.0.0.1:{port}", f"queue://{queue}", SENDERS, COUNT)
    thread = running(handler)
    assert handler.attached.wait(30)
    depth = Depth(port, queue)
    depth.start()
    try:
        # The receiver holds its ten and accepts nothing: the queue reaches its mark, and stays
        # near it while the senders' credit is not topped up (without it, all 12,000 would come).
        wait_until(lambda: depth.last >= HIGH)
        held_at = plateau(lambda: depth.last)
        assert HIGH <= held_at <= BOUND, held_at
        assert sum(handler.sent) < SENDERS * COUNT
        handler.go.set()
        thread.join(300)
        assert not thread.is_alive()
        assert handler.errors == [] and handler.rejected == 0
        assert handler.accepted == [COUNT] * SENDERS  # what was accepted ...
        seen: dict[int, list[int]] = {}
        for who, i in handler.received:
            seen.setdefault(who, []).append(i)
        assert {who: numbers == list(range(COUNT)) for who, numbers in seen.items()} == {
            who: True for who in range(SENDERS)
        }  # ... is what arrived, once, in each sender's order
        assert depth.most <= BOUND, depth.most
    finally:
        handler.go.set()
        depth.done.set()


class Stuck(MessagingHandler):  # type: ignore[misc]
    """A receiver that takes ten (its credit) and settles nothing; the broker's detach is what it
    hears."""

    def __init__(self, url: str, address: str) -> None:
        super().__init__(prefetch=0, auto_accept=False)
        self.url, self.address = url, address
        self.got: list[str] = []
        self.condition: Any = None
        self.attached = threading.Event()

    def on_start(self, event: Any) -> None:
        event.container.create_receiver(event.container.connect(self.url), self.address)

    def on_link_opened(self, event: Any) -> None:
        event.receiver.flow(10)
        self.attached.set()

    def on_message(self, event: Any) -> None:
        self.got.append(event.message.body)

    def on_link_error(self, event: Any) -> None:
        self.condition = event.link.remote_condition
        event.connection.close()


def test_a_receiver_that_settles_nothing_is_detached_and_another_gets_its_messages(
    stall_server: RunningServer,
) -> None:
    from proton.utils import BlockingConnection

    port = stall_server.ports["amqp"]
    url = f"127.0.0.1:{port}"
    queue = unique("stall1")
    address = f"queue://{queue}"
    count = 3 * HIGH
    stuck = Stuck(url, address)
    stuck_thread = running(stuck)
    assert stuck.attached.wait(30)  # online before anything is published: the queue is read
    sent = threading.Event()

    def send_all() -> None:
        """Each send waits for its outcome (and, held, for credit)."""
        conn = BlockingConnection(url, timeout=120)
        try:
            link = conn.create_sender(address)
            for i in range(count):
                link.send(Message(body=f"{i}"))
        finally:
            conn.close()
        sent.set()

    publisher = threading.Thread(target=send_all, daemon=True)
    publisher.start()
    # The queue holds its sender past the mark, nothing is settled for STALL_S: detached.
    stuck_thread.join(60)
    assert not stuck_thread.is_alive()
    assert stuck.condition is not None and stuck.condition.name == "amqp:resource-limit-exceeded"
    assert len(stuck.got) == 10
    assert sent.wait(60)  # the sender went on
    conn = BlockingConnection(url, timeout=30)
    try:
        receiver = conn.create_receiver(address, credit=100)
        bodies = [receiver.receive(timeout=30).body for _ in range(count)]
        receiver.accept()
    finally:
        conn.close()
    assert sorted(int(b) for b in bodies) == list(range(count))
    assert stall_server.output().count("settled nothing for") == 1, stall_server.output()
