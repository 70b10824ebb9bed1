"""Flow control over AMQP 0.9.1 with pika and aio-pika against the real server (issue 44).

- Eight publishers without confirms into one queue whose one consumer (prefetch 10) stops: the
  queue stops growing near its high-water mark (its depth read from the broker), because its
  publishers are no longer read; when the consumer takes again, every message arrives, once, in
  each publisher's order. With confirms (aio-pika), what was confirmed is what is delivered.
- A consumer that settles nothing while its queue holds publishers loses its channel (406, as
  RabbitMQ's consumer_timeout closes it), its deliveries go to another consumer, its publishers go
  on: the same test against RabbitMQ, whose consumer_timeout is the model.
- The disk alarm says connection.blocked / unblocked to a client that asked, as RabbitMQ does:
  the same test against RabbitMQ, and Trimaran in-process (its disk measure is the test's).

The tests wait on events (a depth reached, a channel closed, a count delivered), never on a time a
busy host could overrun; the one time-based look (``plateau``) only asks that a held queue does
not grow on, which a slower host makes more certain, not less.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import aio_pika
import pika
import pytest

from tests.interop.conftest import amqp_server_args
from tests.support import rabbitmq
from tests.support.budget import InProcessServer
from tests.support.names import unique
from tests.support.server import RunningServer, serving
from tests.support.waiting import plateau, wait_until

HIGH = 300  # limits.queue_backpressure_messages here: the backlog past which publishers are held
PUBLISHERS = 8
COUNT = 2000  # per publisher: far past the mark
SIZE = 512
# What a held publisher had read is still taken (uvloop reads up to 256,000 bytes at a time, here
# about 440 publishes of ~580 bytes on the wire): past its mark a queue takes at most the rest of the
# read that crossed it and one more read of each publisher (a durable queue finds itself behind at
# the end of a read, so the crossing publisher's next read too).
BOUND = HIGH + (PUBLISHERS + 1) * (256_000 // (SIZE + 40))
STALL_S = 2  # limits.stalled_consumer_timeout_s, and RabbitMQ's consumer_timeout, in the stall test


def start(workdir: Path, stall_s: float) -> RunningServer:
    env = {
        "TRIMARAN_LIMITS__QUEUE_BACKPRESSURE_MESSAGES": str(HIGH),
        "TRIMARAN_LIMITS__STALLED_CONSUMER_TIMEOUT_S": str(stall_s),
    }
    return RunningServer(amqp_server_args(), cwd=workdir, env=env).start()


@pytest.fixture(scope="module")
def flow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """Small marks; a stalled-consumer timeout longer than any test here."""
    with serving(start(tmp_path_factory.mktemp("flow"), 300)) as server:
        yield server


@pytest.fixture(scope="module")
def stall_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    with serving(start(tmp_path_factory.mktemp("stall"), STALL_S)) as server:
        yield server


@pytest.fixture(scope="module")
def rabbitmq_stall_port(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """A RabbitMQ node of its own whose consumer_timeout is the stall test's (the session's node
    keeps RabbitMQ's default for the other tests)."""
    why = rabbitmq.available()
    if why is not None:
        pytest.skip(why)
    config = f"consumer_timeout = {STALL_S * 1000}\n"
    try:
        with rabbitmq.rabbitmq_node(tmp_path_factory.mktemp("rabbitmq-stall"), config=config) as port:
            yield port
    except RuntimeError as exc:
        pytest.skip(str(exc))


# RabbitMQ 3.10 looks at its consumer timeout about once a minute, and this case needs a node of its
# own: a minute and more of the default run, so RabbitMQ's side of it is in the slow suite.
@pytest.fixture(params=["trimaran", pytest.param("rabbitmq", marks=pytest.mark.slow)])
def stall_port(request: pytest.FixtureRequest) -> int:
    if request.param == "rabbitmq":
        return int(request.getfixturevalue("rabbitmq_stall_port"))
    server: RunningServer = request.getfixturevalue("stall_server")
    return server.ports["amqp"]


def params(port: int) -> pika.ConnectionParameters:
    return pika.ConnectionParameters("127.0.0.1", port, connection_attempts=3, retry_delay=0.5)


def body(who: int, i: int) -> bytes:
    return f"{who}:{i}:".encode().ljust(SIZE, b"x")


def parse(data: bytes) -> tuple[int, int]:
    who, i, _ = data.split(b":", 2)
    return int(who), int(i)


def declare(port: int, queue: str, *, durable: bool = False) -> None:
    conn = pika.BlockingConnection(params(port))
    try:
        conn.channel().queue_declare(queue, durable=durable)
    finally:
        conn.close()


class Depth(threading.Thread):
    """The queue's depth (ready messages, queue.declare-ok's message_count) as the broker says it,
    asked over and over on a connection of its own; the most it saw."""

    def __init__(self, port: int, queue: str) -> None:
        super().__init__(daemon=True)
        self.port, self.queue = port, queue
        self.last = self.most = 0
        self.done = threading.Event()

    def run(self) -> None:
        conn = pika.BlockingConnection(params(self.port))
        channel = conn.channel()
        while not self.done.is_set():
            self.last = channel.queue_declare(self.queue, passive=True).method.message_count
            self.most = max(self.most, self.last)
            time.sleep(0.005)
        conn.close()


class Publisher(threading.Thread):
    """``COUNT`` publishes without confirms; a publish returns once pika wrote it to the socket, so a
    held publisher blocks once its socket is full."""

    def __init__(self, port: int, queue: str, who: int, count: int = COUNT) -> None:
        super().__init__(daemon=True)
        self.port, self.queue, self.who, self.count = port, queue, who, count

    def run(self) -> None:
        conn = pika.BlockingConnection(params(self.port))
        channel = conn.channel()
        for i in range(self.count):
            channel.basic_publish("", self.queue, body(self.who, i))
        conn.close()


class Consumer(threading.Thread):
    """basic.consume with a prefetch; it takes what comes and acks only once ``go`` is set (each
    delivery at once from then on, what it held before in one ack). ``closed``: the broker's
    channel.close, if one came."""

    def __init__(self, port: int, queue: str, prefetch: int = 10) -> None:
        super().__init__(daemon=True)
        self.port, self.queue, self.prefetch = port, queue, prefetch
        self.go = threading.Event()
        self.done = threading.Event()
        self.consuming = threading.Event()
        self.got: list[tuple[bytes, bool]] = []  # (body, redelivered), in arrival order
        self.closed: tuple[int, str] | None = None

    def run(self) -> None:
        conn = pika.BlockingConnection(params(self.port))
        channel = conn.channel()
        channel.basic_qos(prefetch_count=self.prefetch)
        held: list[int] = []

        def on_message(ch: Any, method: Any, _props: Any, data: bytes) -> None:
            self.got.append((data, bool(method.redelivered)))
            if self.go.is_set():
                ch.basic_ack(method.delivery_tag)
            else:
                held.append(method.delivery_tag)

        def tick() -> None:
            if self.done.is_set():
                channel.stop_consuming()
                return
            if self.go.is_set() and held:
                channel.basic_ack(held[-1], multiple=True)
                held.clear()
            conn.call_later(0.02, tick)

        channel.basic_consume(self.queue, on_message)
        self.consuming.set()
        conn.call_later(0.02, tick)
        try:
            channel.start_consuming()
        except pika.exceptions.ChannelClosedByBroker as exc:
            self.closed = (exc.reply_code, exc.reply_text)
        finally:
            if conn.is_open:
                conn.close()


def check_everything_once_in_order(got: list[tuple[bytes, bool]], publishers: int, count: int) -> None:
    seen: dict[int, list[int]] = {}
    for data, redelivered in got:
        assert not redelivered
        who, i = parse(data)
        seen.setdefault(who, []).append(i)
    assert sorted(seen) == list(range(publishers))
    for numbers in seen.values():
        assert numbers == list(range(count))


@pytest.mark.parametrize("durable", [False, True], ids=["transient", "durable"])
def test_eight_publishers_into_a_stopped_consumer_are_held_and_lose_nothing(
    flow_server: RunningServer, durable: bool
) -> None:
    port = flow_server.ports["amqp"]
    queue = unique("flow")
    declare(port, queue, durable=durable)
    consumer = Consumer(port, queue)
    consumer.start()
    assert consumer.consuming.wait(10)
    depth = Depth(port, queue)
    depth.start()
    publishers = [Publisher(port, queue, who) for who in range(PUBLISHERS)]
    try:
        for publisher in publishers:
            publisher.start()
        # The consumer holds its ten and stops: the queue reaches its mark and stays near it, its
        # publishers no longer read (without flow control it would take all 16,000).
        wait_until(lambda: depth.last >= HIGH)
        held_at = plateau(lambda: depth.last)
        assert HIGH <= held_at <= BOUND, held_at
        assert any(p.is_alive() for p in publishers)
        consumer.go.set()  # it takes again: the publishers go on at its pace
        total = PUBLISHERS * COUNT
        wait_until(lambda: len(consumer.got) >= total, timeout=300)
        for publisher in publishers:
            publisher.join(30)
            assert not publisher.is_alive()
        assert depth.most <= BOUND, depth.most
        check_everything_once_in_order(consumer.got, PUBLISHERS, COUNT)
    finally:
        consumer.go.set()
        consumer.done.set()
        depth.done.set()
        consumer.join(10)


class Deaf(threading.Thread):
    """basic.consume with no ack, then nothing read until ``go`` is set: its socket fills."""

    def __init__(self, port: int, queue: str) -> None:
        super().__init__(daemon=True)
        self.port, self.queue = port, queue
        self.go = threading.Event()
        self.done = threading.Event()
        self.consuming = threading.Event()
        self.got: list[tuple[bytes, bool]] = []

    def run(self) -> None:
        conn = pika.BlockingConnection(params(self.port))
        channel = conn.channel()
        channel.basic_consume(
            self.queue,
            lambda _ch, method, _props, data: self.got.append((data, bool(method.redelivered))),
            True,
        )
        self.consuming.set()
        self.go.wait()
        while not self.done.is_set():
            conn.process_data_events(0.05)
        conn.close()


def test_a_no_ack_consumer_whose_socket_is_full_holds_its_publishers(flow_server: RunningServer) -> None:
    """Without flow control a no-ack consumer takes everything its queue has into the server's
    buffers for its socket; here its queue keeps what its socket cannot, up to the mark, and its
    publishers wait."""
    port = flow_server.ports["amqp"]
    queue = unique("deaf")
    declare(port, queue)
    consumer = Deaf(port, queue)
    consumer.start()
    assert consumer.consuming.wait(10)
    depth = Depth(port, queue)
    depth.start()
    count = 6000  # 8 x 6,000 x 512 bytes: far past what the sockets' buffers hold
    publishers = [Publisher(port, queue, who, count) for who in range(PUBLISHERS)]
    try:
        for publisher in publishers:
            publisher.start()
        wait_until(lambda: depth.last >= HIGH, timeout=60)
        held_at = plateau(lambda: depth.last)
        assert HIGH <= held_at <= BOUND, held_at
        assert any(p.is_alive() for p in publishers)
        consumer.go.set()
        wait_until(lambda: len(consumer.got) >= PUBLISHERS * count, timeout=300)
        for publisher in publishers:
            publisher.join(30)
            assert not publisher.is_alive()
        check_everything_once_in_order(consumer.got, PUBLISHERS, count)
    finally:
        consumer.go.set()
        consumer.done.set()
        depth.done.set()
        consumer.join(10)


class Timed(threading.Thread):
    """Publishes without confirms, as fast as pika goes, until ``stop`` is set; ``sent`` counts what
    pika wrote (all of it reaches the broker: the connection is closed in order after it)."""

    def __init__(self, port: int, queue: str, who: int, stop: threading.Event, size: int) -> None:
        super().__init__(daemon=True)
        self.port, self.queue, self.who, self.stop, self.size = port, queue, who, stop, size
        self.sent = 0

    def run(self) -> None:
        conn = pika.BlockingConnection(params(self.port))
        channel = conn.channel()
        while not self.stop.is_set():
            channel.basic_publish("", self.queue, f"{self.who}:{self.sent}:".encode().ljust(self.size, b"x"))
            self.sent += 1
        conn.close()


def peak_rss(pid: int) -> int:
    """The process's peak resident set (VmHWM), in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


@pytest.mark.slow
def test_eight_fast_publishers_for_a_minute_leave_the_broker_under_300_mb(tmp_path: Path) -> None:
    """Issue 44's measure, with the default marks: eight publishers without confirms into one queue
    read by one consumer with prefetch 10, for 60 s. Small messages, the most per byte the queue
    keeps: the broker's peak RSS stays under 300 MB and everything published is delivered."""
    server = RunningServer(amqp_server_args(), cwd=tmp_path).start()
    with serving(server):
        assert server.process is not None
        port = server.ports["amqp"]
        queue = unique("soak")
        declare(port, queue)
        consumer = Consumer(port, queue)
        consumer.go.set()
        consumer.start()
        assert consumer.consuming.wait(10)
        depth = Depth(port, queue)
        depth.start()
        stop = threading.Event()
        publishers = [Timed(port, queue, who, stop, 100) for who in range(PUBLISHERS)]
        try:
            for publisher in publishers:
                publisher.start()
            time.sleep(60)  # the measure is a minute of it
            stop.set()
            for publisher in publishers:
                publisher.join(600)
                assert not publisher.is_alive()
            total = sum(p.sent for p in publishers)
            wait_until(lambda: len(consumer.got) >= total, timeout=900)
            peak = peak_rss(server.process.pid)
            print(f"published {total}, deepest {depth.most}, peak RSS {peak / 2**20:.0f} MiB")
            assert peak < 300 * 2**20, peak
            assert len(consumer.got) == total
            seen: dict[int, list[int]] = {}
            for data, _ in consumer.got:
                who, i = parse(data)
                seen.setdefault(who, []).append(i)
            assert {who: seen.get(who) == list(range(p.sent)) for who, p in enumerate(publishers)} == {
                who: True for who in range(PUBLISHERS)
            }
        finally:
            stop.set()
            consumer.done.set()
            depth.done.set()
            consumer.join(10)


@pytest.mark.anyio
async def test_with_confirms_what_is_confirmed_is_what_is_delivered(flow_server: RunningServer) -> None:
    """aio-pika publishers with confirms (fifty unconfirmed each at most) into a consumer that stops
    then takes again: every confirmed message is delivered, once."""
    url = f"amqp://guest:guest@127.0.0.1:{flow_server.ports['amqp']}/"
    queue_name = unique("confirmed")
    count = 1000
    confirmed: list[bytes] = []
    refused: list[bytes] = []
    delivered: list[bytes] = []
    go = asyncio.Event()

    async def publisher(who: int) -> None:
        connection = await aio_pika.connect(url)
        async with connection:
            channel = await connection.channel(publisher_confirms=True)
            window = asyncio.Semaphore(50)

            async def one(i: int) -> None:
                data = body(who, i)
                try:
                    await channel.default_exchange.publish(aio_pika.Message(data), routing_key=queue_name)
                except aio_pika.exceptions.DeliveryError:
                    refused.append(data)
                else:
                    confirmed.append(data)
                finally:
                    window.release()

            tasks = []
            for i in range(count):
                await window.acquire()
                tasks.append(asyncio.create_task(one(i)))
            await asyncio.gather(*tasks)

    connection = await aio_pika.connect(url)
    async with connection:
        channel = await connection.channel()
        await channel.set_qos(prefetch_count=10)
        queue = await channel.declare_queue(queue_name, durable=True)
        held: list[aio_pika.abc.AbstractIncomingMessage] = []

        async def on_message(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            delivered.append(message.body)
            if go.is_set():
                await message.ack()
            else:
                held.append(message)

        await queue.consume(on_message)
        watch = await connection.channel()
        most = 0

        async def depth() -> int:
            nonlocal most
            declared = await watch.declare_queue(queue_name, passive=True)
            ready = declared.declaration_result.message_count or 0
            most = max(most, ready)
            return ready

        publishing = asyncio.gather(*(publisher(who) for who in range(PUBLISHERS)))
        async with asyncio.timeout(60):
            while await depth() < HIGH:
                await asyncio.sleep(0.01)
        # Held near the mark: without flow control every publish would be confirmed into the queue.
        last, since = await depth(), time.monotonic()
        while time.monotonic() - since < 0.5:
            await asyncio.sleep(0.02)
            if (now := await depth()) != last:
                last, since = now, time.monotonic()
        assert HIGH <= last <= BOUND and not publishing.done()
        go.set()
        for message in held:
            await message.ack()
        async with asyncio.timeout(300):
            while not publishing.done():
                await depth()
                await asyncio.sleep(0.01)
            await publishing
            while len(delivered) < len(confirmed):
                await asyncio.sleep(0.01)
    assert refused == []
    assert len(confirmed) == PUBLISHERS * count
    assert sorted(delivered) == sorted(confirmed)  # confirmed = delivered, each once
    assert most <= BOUND, most


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def test_a_consumer_that_stops_acking_loses_its_channel_and_another_gets_its_messages(
    stall_port: int, request: pytest.FixtureRequest
) -> None:
    port = stall_port
    queue = unique("stall")
    declare(port, queue)
    count = 3 * HIGH
    stuck = Consumer(port, queue)  # takes its ten and never acks them
    stuck.start()
    assert stuck.consuming.wait(10)
    publisher = Publisher(port, queue, 0, count)
    other: Consumer | None = None
    try:
        publisher.start()
        # Trimaran: the queue holds its publisher past its mark, nothing is settled for STALL_S,
        # the channel closes. RabbitMQ: its consumer_timeout (checked now and then) closes it.
        wait_until(lambda: not stuck.is_alive(), timeout=180)
        assert stuck.closed is not None
        code, text = stuck.closed
        assert code == 406, stuck.closed
        assert text.startswith("PRECONDITION_FAILED - delivery acknowledgement on channel 1 timed out"), text
        publisher.join(60)  # and its publisher went on
        assert not publisher.is_alive()
        other = Consumer(port, queue)
        other.go.set()
        other.start()
        wait_until(lambda: len(other.got) >= count)
        assert sorted(parse(data)[1] for data, _ in other.got) == list(range(count))
        # What the closed channel held came back, flagged redelivered.
        taken = {data for data, _ in stuck.got}
        assert len(taken) == 10
        assert {data for data, redelivered in other.got if redelivered} == taken
        if "trimaran" in request.node.callspec.id:
            server: RunningServer = request.getfixturevalue("stall_server")
            assert server.output().count("settled nothing for") == 1, server.output()
    finally:
        stuck.done.set()
        if other is not None:
            other.done.set()
            other.join(10)


# -- the disk alarm ----------------------------------------------------------------------------------


@contextmanager
def trimaran_disk(tmp_path: Path) -> Iterator[tuple[int, Callable[[bool], None]]]:
    """Trimaran in-process, with its disk measure in the test's hands: (AMQP port, set the alarm)."""
    server = InProcessServer(tmp_path, storage={"min_free_bytes": 1 << 20}).start()
    queues = server.app.queues
    assert queues is not None
    free = [1 << 40]
    queues.disk.measure = lambda _path: free[0]

    def alarm(on: bool) -> None:
        free[0] = 0 if on else 1 << 40
        server.app.runner.loop().call_soon_threadsafe(queues.disk.check)

    try:
        yield server.port("amqp"), alarm
    finally:
        server.stop()


@contextmanager
def rabbitmq_disk(port: int) -> Iterator[tuple[int, Callable[[bool], None]]]:
    def alarm(on: bool) -> None:
        rabbitmq.rabbitmqctl(port, "set_disk_free_limit", "100000GB" if on else "10MB")

    try:
        yield port, alarm
    finally:
        alarm(False)


@pytest.fixture(params=["trimaran", "rabbitmq"])
def disk(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[int, Callable[[bool], None]]]:
    if request.param == "rabbitmq":
        with rabbitmq_disk(int(request.getfixturevalue("rabbitmq_port"))) as got:
            yield got
    else:
        with trimaran_disk(tmp_path) as got:
            yield got


def test_the_disk_alarm_blocks_publishers_with_connection_blocked_and_unblocks_them(
    disk: tuple[int, Callable[[bool], None]],
) -> None:
    port, alarm = disk
    queue = unique("disk")
    conn = pika.BlockingConnection(params(port))  # pika announces the connection.blocked capability
    said: list[str] = []
    conn.add_on_connection_blocked_callback(lambda _c, frame: said.append(f"blocked: {frame.method.reason}"))
    conn.add_on_connection_unblocked_callback(lambda _c, _frame: said.append("unblocked"))
    try:
        channel = conn.channel()
        channel.queue_declare(queue)
        channel.basic_publish("", queue, b"before")  # a publishing connection
        alarm(True)
        channel.basic_publish("", queue, b"during")  # taken once the alarm is over

        def hears(what: str) -> Callable[[], bool]:
            def check() -> bool:
                conn.process_data_events(time_limit=0.05)
                return any(s.startswith(what) for s in said)

            return check

        wait_until(hears("blocked"), timeout=120)
        assert "disk" in said[0], said
        alarm(False)
        wait_until(hears("unblocked"), timeout=120)
        got = []
        while len(got) < 2:
            method, _props, data = channel.basic_get(queue, auto_ack=True)
            if method is None:
                conn.process_data_events(time_limit=0.05)
                continue
            got.append(data)
        assert got == [b"before", b"during"]
    finally:
        if conn.is_open:
            conn.close()
