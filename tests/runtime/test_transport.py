"""The runtime's connection in-process: event order, batched writes, crash isolation, the close."""

from __future__ import annotations

import time
from collections.abc import Callable, Coroutine
from typing import Any

import anyio
import pytest

from tests.support.runtime import LineHull, LineMachine, Wire, cuts, running, settle
from trimaran.runtime.flow import Gate
from trimaran.runtime.limits import RuntimeLimits
from trimaran.runtime.runner import Runner
from trimaran.runtime.transport import Conn, Hull
from trimaran.tenant_limits import TenantLimits, UserLimits, VhostLimits

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class Hulls:
    def __init__(self) -> None:
        self.made: list[LineHull] = []

    def __call__(self, io: Conn, first: bytes) -> Hull:
        hull = LineHull(io)
        self.made.append(hull)
        return hull


async def test_same_events_and_output_however_the_bytes_are_cut() -> None:
    stream = b"one\ntwo\nclose\nthree\n"
    outcomes = set()
    for chunks in cuts(stream):
        hulls = Hulls()
        wire = Wire(Runner(), hulls)
        await wire.feed(chunks)
        outcomes.add((tuple(hulls.made[0].seen), wire.transport.take()))
    assert outcomes == {((b"one", b"two", b"close"), b"ONE\nTWO\nBYE\nCLOSE\n")}


async def test_writes_are_batched_per_loop_iteration() -> None:
    """What a turn of the loop causes (its reads' replies, a delivery from elsewhere, a commit)
    leaves in one write per connection, at the end of the turn."""
    hulls = Hulls()
    wire = Wire(Runner(), hulls)
    writes: list[bytes] = []
    original = wire.transport.write
    # None, as Transport.write returns (the compiled runtime checks what it is given).
    wire.transport.write = lambda data: writes.append(bytes(data)) or original(data)  # type: ignore[method-assign]
    wire.conn.data_received(b"a\nb\n")
    machine = hulls.made[0].machine
    machine.out.append(b"X\n")
    wire.conn.wake()
    wire.conn.data_received(b"c\n")
    assert writes == []
    await settle()
    assert writes == [b"A\nB\nX\nC\n"]
    machine.out.append(b"Y\n")
    wire.conn.wake()
    await settle()
    assert writes == [b"A\nB\nX\nC\n", b"Y\n"]


async def test_a_bug_in_the_hull_closes_only_its_connection(caplog: pytest.LogCaptureFixture) -> None:
    hulls = Hulls()
    async with running() as runner:
        broken, healthy = Wire(runner, hulls), Wire(runner, hulls, peer=("127.0.0.2", 1))
        await broken.feed([b"boom\n"])
        await healthy.feed([b"fine\n"])
        assert broken.transport.aborted
        assert hulls.made[0].finished
        assert healthy.transport.take() == b"FINE\n" and not healthy.transport.closed
    assert runner.stats.crashes == 1
    warnings = [r for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "127.0.0.1:40000" in warnings[0].getMessage()
    assert "a bug in the hull" in warnings[0].getMessage()


async def test_close_half_closes_then_lingers_until_the_peer_closes() -> None:
    hulls = Hulls()
    async with running() as runner:
        wire = Wire(runner, hulls)
        await wire.feed([b"close\n"])
        assert wire.transport.take() == b"BYE\nCLOSE\n"
        assert wire.transport.eof_written and not wire.transport.closed
        await wire.feed([b"late bytes are read and dropped\n"])
        assert not wire.transport.closed and hulls.made[0].seen == [b"close"]
        await wire.eof()
        assert wire.transport.closed and hulls.made[0].finished


async def test_a_hull_with_nothing_to_give_back_starts_no_task_when_it_goes() -> None:
    """A task for every closed connection, to run a clean-up with nothing to do, was a quarter of an
    MQTT connect's cost (from the source, connect + CONNECT + DISCONNECT 145 -> 105 us): a hull's
    ``finish`` says whether there is one, and only that one runs in the task group."""
    gave_back: list[LineHull] = []

    class Holding(LineHull):
        def finish(self) -> Callable[[], Coroutine[Any, Any, None]] | None:  # type: ignore[override]
            super().finish()

            async def give_back() -> None:
                gave_back.append(self)

            return give_back if self.seen else None  # held something once it saw a line

    made: list[LineHull] = []

    def holding(io: Conn, first: bytes) -> Hull:
        made.append(Holding(io))
        return made[-1]

    async with running() as runner:
        quiet, busy = Wire(runner, holding), Wire(runner, holding, peer=("127.0.0.2", 1))
        await busy.feed([b"take\n"])
        quiet.transport.close()
        quiet.conn.connection_lost(None)
        assert runner._jobs == [] and made[0].finished  # nothing to run: no task
        busy.transport.close()
        busy.conn.connection_lost(None)
        assert len(runner._jobs) == 1
        await settle()
    assert gave_back == [made[1]]


def peer_closes(seconds: float) -> tuple[LineMachine, Callable[[Conn, bytes], Hull]]:
    machine = LineMachine()
    machine.peer_close_s = seconds
    return machine, lambda io, first: LineHull(io, machine)


async def test_a_close_left_to_the_peer_is_not_half_closed_and_ends_after_the_wait() -> None:
    """AMQP 0.9.1 after its close-ok: the peer closes the socket; the runtime only after the wait."""
    _machine, factory = peer_closes(0.2)
    async with running() as runner:
        wire = Wire(runner, factory)
        await wire.feed([b"close\n"])
        assert wire.transport.take() == b"BYE\nCLOSE\n"
        assert not wire.transport.eof_written and not wire.transport.closed
        await wire.feed([b"late bytes are read and dropped\n"])
        start = time.monotonic()
        while not wire.transport.closed and time.monotonic() - start < 2:
            await settle()
        assert wire.transport.closed and not wire.transport.eof_written
        assert time.monotonic() - start > 0.1


async def test_a_close_left_to_the_peer_ends_with_the_peers_end_of_stream() -> None:
    _machine, factory = peer_closes(30)
    async with running() as runner:
        wire = Wire(runner, factory)
        await wire.feed([b"close\n"])
        assert not wire.transport.closed
        await wire.eof()
        assert wire.transport.closed and not wire.transport.eof_written


async def test_shutdown_does_not_wait_for_a_peer_left_to_close() -> None:
    _machine, factory = peer_closes(30)
    runner = Runner()
    async with running(runner):
        wire = Wire(runner, factory)
        await wire.feed([b"close\n"])
        with anyio.fail_after(2):
            await runner.shutdown()
        assert wire.transport.closed and not runner.conns


async def test_machine_deadline_ticks() -> None:
    machine = LineMachine(deadline=time.monotonic() + 0.05)
    runner = Runner()
    wire = Wire(runner, lambda io, first: LineHull(io, machine))
    await settle()
    assert not machine.ticks
    for _ in range(50):
        await settle()
        if machine.closed:
            break
    assert machine.ticks and wire.transport.take() == b"TIMEOUT\n"


class SilenceMachine(LineMachine):
    """Times its peer out after ``window`` seconds without bytes, as a keep-alive or heartbeat does."""

    def __init__(self, window: float) -> None:
        super().__init__(deadline=time.monotonic() + window)
        self.window = window

    def receive_data(self, data: bytes, now: float) -> None:
        super().receive_data(data, now)
        self.deadline = now + self.window

    def paused(self, now: float) -> None:
        super().paused(now)
        self.deadline = now + self.window


async def test_a_connection_held_for_flow_control_is_not_timed_out_for_the_silence_it_did_not_make() -> None:
    """While a gate holds a connection (its socket is not read), its machine is told before each of
    its deadlines that the silence is the runtime's (``Machine.paused``), and again when it is read
    again: a publisher held for longer than its keep-alive keeps its connection."""
    machine = SilenceMachine(window=0.05)
    async with running(Runner()) as runner:
        wire = Wire(runner, lambda io, first: LineHull(io, machine))
        await wire.feed([b"hello\n"])
        gate = Gate(runner, 60.0, lambda _idle: True)
        gate.hold(wire.conn)
        assert not wire.transport.reading
        with anyio.fail_after(10):
            while len(machine.pauses) < 3:  # three of its time-outs came and went
                await anyio.sleep(0.01)
        assert not machine.closed and machine.ticks
        paused = len(machine.pauses)
        gate.release()
        assert wire.transport.reading and len(machine.pauses) == paused + 1
        # Read again, and silent for real: now it times out.
        with anyio.fail_after(10):
            while not machine.closed:
                await anyio.sleep(0.01)


async def test_a_silent_connection_is_dropped_at_the_handshake_deadline() -> None:
    runner = Runner(RuntimeLimits(handshake_timeout_s=0.05))
    wire = Wire(runner, lambda io, first: None)  # never recognises a protocol
    for _ in range(50):
        await settle()
        if wire.transport.closed:
            break
    assert wire.transport.closed and not runner.conns


async def test_connection_limits_refuse_and_count() -> None:
    runner = Runner(RuntimeLimits(max_connections=3, max_connections_per_address=2))
    hulls = Hulls()
    wires = [Wire(runner, hulls, peer=("10.0.0.1", i)) for i in range(3)]
    assert [w.transport.aborted for w in wires] == [False, False, True]
    other = Wire(runner, hulls, peer=("10.0.0.2", 1))
    assert not other.transport.aborted
    full = Wire(runner, hulls, peer=("10.0.0.3", 1))
    assert full.transport.aborted
    assert runner.stats.refused == {"max_connections_per_address": 1, "max_connections": 1}
    await settle()


async def test_accept_rate_per_address() -> None:
    runner = Runner(RuntimeLimits(accept_rate_per_address=1.0, accept_burst_per_address=2))
    hulls = Hulls()
    wires = [Wire(runner, hulls, peer=("10.0.0.1", i)) for i in range(3)]
    assert [w.transport.aborted for w in wires] == [False, False, True]
    assert runner.stats.refused == {"accept_rate_per_address": 1}
    await settle()


async def test_memory_watermark_pauses_and_resumes_publishers() -> None:
    runner = Runner(RuntimeLimits(memory_high_watermark=1000, memory_low_watermark=100))
    hulls = Hulls()
    publisher, reader = Wire(runner, hulls), Wire(runner, hulls, peer=("127.0.0.2", 1))
    publisher.conn.publisher = True
    reader.transport.buffered = 5000  # a slow reader: its socket buffer holds 5000 bytes
    await reader.feed([b"x\n"])
    assert runner.memory.blocked
    assert not publisher.transport.reading and reader.transport.reading
    assert hulls.made[0].blocks == [True]
    reader.transport.buffered = 0
    reader.conn.resume_writing()
    assert not runner.memory.blocked and publisher.transport.reading
    assert hulls.made[0].blocks == [True, False]


async def test_shutdown_closes_every_hull_its_protocols_way() -> None:
    runner = Runner()
    hulls = Hulls()
    wires = [Wire(runner, hulls, peer=("127.0.0.1", i)) for i in range(3)]
    await settle()
    # The runner waits until each connection is gone; the fake peers close once told.
    import anyio

    async with anyio.create_task_group() as tg:
        tg.start_soon(runner.shutdown)
        await settle()
        for wire in wires:
            assert wire.transport.take() == b"SHUTDOWN\n"
            await wire.eof()
    assert not runner.conns


async def test_a_full_subscriber_holds_its_publishers_until_it_drains() -> None:
    """push_back: a delivery to a connection whose socket is full stops reading the connection whose
    frames are being acted on; the subscriber draining (resume_writing) lets it go on."""
    hulls = Hulls()
    async with running() as runner:
        subscriber = Wire(runner, hulls, peer=("127.0.0.2", 1))
        publisher = Wire(runner, hulls)
        pushing = hulls.made[1]

        def handle(event: object) -> None:
            # What a hull does when it delivers to a subscriber that is behind.
            subscriber.conn.push_back()
            subscriber.conn.wake()

        pushing.handle = handle  # type: ignore[method-assign]
        subscriber.conn.pause_writing()
        await publisher.feed([b"one\n"])
        assert not publisher.transport.reading and subscriber.transport.reading
        subscriber.conn.resume_writing()
        assert publisher.transport.reading
        # A subscriber that is written without filling its socket releases them at the flush.
        await publisher.feed([b"two\n"])
        assert publisher.transport.reading
        # A subscriber that goes away releases them too.
        subscriber.conn.pause_writing()
        await publisher.feed([b"three\n"])
        assert not publisher.transport.reading
        subscriber.transport.abort()
        await settle()
        assert publisher.transport.reading


async def test_a_reader_that_holds_its_publishers_too_long_is_stuck_and_holds_no_more() -> None:
    hulls = Hulls()
    async with running(Runner(RuntimeLimits(hold_publishers_s=0.05))) as runner:
        subscriber = Wire(runner, hulls, peer=("127.0.0.2", 1))
        publisher = Wire(runner, hulls)

        def handle(event: object) -> None:
            subscriber.conn.push_back()

        hulls.made[1].handle = handle  # type: ignore[method-assign]
        subscriber.conn.pause_writing()  # never drains
        await publisher.feed([b"one\n"])
        assert not publisher.transport.reading
        for _ in range(20):
            await settle()
            if publisher.transport.reading:
                break
        assert publisher.transport.reading  # let go after hold_publishers_s
        await publisher.feed([b"two\n"])
        assert publisher.transport.reading  # a stuck reader holds nobody
        subscriber.conn.resume_writing()  # it drains: behind again, not stuck
        subscriber.conn.pause_writing()
        await publisher.feed([b"three\n"])
        assert not publisher.transport.reading


def reader_fed_by_a_publisher(runner: Runner, hulls: Hulls) -> tuple[Wire, Wire, LineHull]:
    """A subscriber and a publisher whose every line is delivered to it (and pushes back)."""
    subscriber = Wire(runner, hulls, peer=("127.0.0.2", 1))
    publisher = Wire(runner, hulls)

    def handle(event: object) -> None:
        subscriber.conn.push_back()

    hulls.made[1].handle = handle  # type: ignore[method-assign]
    return subscriber, publisher, hulls.made[0]


async def test_a_reader_behind_on_its_queue_holds_its_publishers_until_below_the_low_mark() -> None:
    """Its socket drains, but its hull's queue (an MQTT session's) is still above the low-water mark
    (``Hull.behind``): the publishers wait until a flush finds it below."""
    hulls = Hulls()
    limits = RuntimeLimits(hold_publishers_s=0.02, stalled_consumer_timeout_s=60)
    async with running(Runner(limits)) as runner:
        subscriber, publisher, reader = reader_fed_by_a_publisher(runner, hulls)
        reader.backlog_mark = 0
        await publisher.feed([b"one\n"])
        assert not publisher.transport.reading
        for mark in range(1, 6):  # it takes a message now and then: behind, never stalled
            reader.backlog_mark = mark
            subscriber.conn.wake()
            await settle()
            assert not publisher.transport.reading
        assert reader.stalls == []
        reader.backlog_mark = None  # below the low mark: the next flush lets them go
        subscriber.conn.wake()
        await settle()
        assert publisher.transport.reading


async def test_a_reader_behind_that_takes_nothing_is_closed_and_its_publishers_go_on() -> None:
    hulls = Hulls()
    limits = RuntimeLimits(hold_publishers_s=0.01, stalled_consumer_timeout_s=0.05)
    async with running(Runner(limits)) as runner:
        _subscriber, publisher, reader = reader_fed_by_a_publisher(runner, hulls)
        reader.backlog_mark = 7  # and it never moves
        await publisher.feed([b"one\n"])
        assert not publisher.transport.reading
        with anyio.fail_after(10):
            while not reader.stalls:
                await anyio.sleep(0.005)
        assert reader.stalls[0] >= 0.05 and len(reader.stalls) == 1
        assert publisher.transport.reading
        assert runner.stats.stalls == {"session": 1} and runner.stats.holds == {"session": 1}
        assert runner.stats.held == 0  # the metrics' gauge of connections held


class CountingHull(LineHull):
    """Each line is a published message, counted where the hulls count theirs."""

    def handle(self, event: object) -> None:
        super().handle(event)
        self.io.runner.traffic.messages_received += 1


async def test_a_user_over_its_rate_is_not_read_until_its_buckets_refill() -> None:
    tenants = TenantLimits(default_user=UserLimits(max_messages_per_s=20, max_bytes_per_s=10_000))
    runner = Runner(tenants=tenants)
    made: list[CountingHull] = []
    wire = Wire(runner, lambda io, _first: made.append(CountingHull(io)) or made[-1])
    assert wire.conn.enter("u", "/") is None
    wire.conn.data_received(b"m\n" * 20)  # a second's worth of messages: still read
    assert wire.transport.reading
    wire.conn.data_received(b"m\n" * 5)  # 5 over: a quarter of a second unread
    assert not wire.transport.reading and len(made[0].seen) == 25  # what was read is acted on
    assert tenants.bites == {("/", "rate"): 1}
    started = time.monotonic()
    while not wire.transport.reading:
        await anyio.sleep(0.01)
    assert 0.15 < time.monotonic() - started < 1.0
    wire.conn.data_received(b"x" * 30_000)  # bytes: 20 000 over a 10 000 B/s rate, about 2 s
    assert not wire.transport.reading
    await tenants.change_default_user(UserLimits())  # the limit lifted: read at the next look
    await anyio.sleep(2.2)
    assert wire.transport.reading and wire.conn.rate is None


async def test_a_throttled_connection_that_closes_leaves_no_timer_and_no_count() -> None:
    tenants = TenantLimits(
        {"/": VhostLimits(max_connections=1)}, default_user=UserLimits(max_bytes_per_s=100)
    )
    runner = Runner(tenants=tenants)
    async with running(runner):
        wire = Wire(runner, Hulls())
        assert wire.conn.enter("u", "/") is None
        assert Wire(runner, Hulls()).conn.enter("v", "/") is not None  # the vhost's one place taken
        wire.conn.data_received(b"y" * 1000)
        assert not wire.transport.reading
        wire.transport.abort()
        await settle()
    assert not wire.conn._throttled
    assert tenants.connections == {} and tenants.user_connections == {} and tenants.rates == {}


async def test_accept_rate_makes_connections_wait_their_turn_in_order() -> None:
    """limits.accept_rate: past the burst a listener's new connections are not reset but wait,
    unread and not yet counted as open, and are let in at the rate in the order they came; one
    that goes while it waits takes no turn."""
    runner = Runner(RuntimeLimits(accept_rate=100.0, accept_burst=2))
    hulls = Hulls()
    wires = [Wire(runner, hulls, peer=("10.0.0.1", i)) for i in range(5)]
    assert not any(w.transport.aborted for w in wires)
    assert [w.transport.reading for w in wires] == [True, True, False, False, False]
    assert len(runner.conns) == 2 and runner.stats.waited == 3
    wires[3].conn.connection_lost(None)
    started: list[int] = []
    with anyio.fail_after(5):
        while len(started) < 2:
            await anyio.sleep(0.002)
            started += [i for i in (2, 4) if wires[i].conn in runner.conns and i not in started]
    assert started == [2, 4]
    assert wires[2].transport.reading and wires[4].transport.reading
    assert wires[3].conn not in runner.conns
    await settle()


async def test_waiting_connections_count_toward_max_connections() -> None:
    runner = Runner(RuntimeLimits(accept_rate=1.0, accept_burst=1, max_connections=3))
    hulls = Hulls()
    wires = [Wire(runner, hulls, peer=("10.0.0.1", i)) for i in range(4)]
    assert [w.transport.aborted for w in wires] == [False, False, False, True]
    assert runner.stats.refused == {"max_connections": 1} and runner.stats.waited == 2
    await runner.shutdown()
    assert all(w.transport.aborted for w in wires[1:3])
