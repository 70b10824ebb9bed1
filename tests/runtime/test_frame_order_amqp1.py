"""Frames take effect in the order they arrived, however the bytes were cut (AMQP 1.0 hull).

Recorded client byte streams (a whole conversation written at once: handshake, attach, transfers,
then detach / end / close in the same bytes) go through the real runtime (``Wire``) into the real
``Amqp1FrontEnd`` with a real broker and a queue manager on SQLite, fed whole, byte by byte and cut
at every frame boundary. Every run must put the same messages on the deck (none lost) and send the
client the same frames; dispositions are compared delivery by delivery, as a commit may answer a
run of deliveries with one ranged disposition or with several.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.support.runtime import Wire, settle
from trimaran.amqp1.conn import Amqp1Conn
from trimaran.amqp1.frames import AMQP_HEADER, FRAME_AMQP, FRAME_SASL, SASL_HEADER, Frame, FrameDecoder
from trimaran.amqp1.frames import encode_frame as frame
from trimaran.amqp1.handler import Amqp1FrontEnd
from trimaran.amqp1.messages import Data, Message, encode_message
from trimaran.amqp1.performatives import (
    ROLE_SENDER,
    Attach,
    Begin,
    Close,
    Composite,
    Detach,
    Disposition,
    End,
    Open,
    SaslInit,
    SaslOutcome,
    Source,
    Target,
    Transfer,
)
from trimaran.broker.core import Broker
from trimaran.broker.message import Message as DeckMessage
from trimaran.broker.router import Delivery, SubscriptionOptions
from trimaran.config import QueueSettings, Settings, StorageSettings
from trimaran.queue.manager import QueueManager
from trimaran.runtime.runner import Runner
from trimaran.runtime.transport import Conn
from trimaran.storage.store import Storage

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


# -- recorded client streams --------------------------------------------------------------------


@dataclass(frozen=True)
class Script:
    name: str
    address: str
    settled: bool
    ending: str  # "detach", "end" or "close": what follows the transfers in the same bytes
    sasl: bool
    count: int = 3

    @property
    def bodies(self) -> list[bytes]:
        return [b"m%d" % i for i in range(self.count)]


def record(script: Script) -> tuple[bytes, list[int]]:
    """The client's whole conversation and the offsets of its frame boundaries."""
    pieces: list[bytes] = []
    if script.sasl:
        pieces.append(SASL_HEADER)
        pieces.append(bytes(frame(FRAME_SASL, 0, SaslInit(mechanism="ANONYMOUS"))))
    pieces.append(AMQP_HEADER)
    perfs: list[tuple[Composite, bytes]] = [
        (Open(container_id="recorded"), b""),
        (Begin(next_outgoing_id=0, incoming_window=100, outgoing_window=100), b""),
        (
            Attach(
                name="sender",
                handle=0,
                role=ROLE_SENDER,
                source=Source(address="client"),
                target=Target(address=script.address),
                initial_delivery_count=0,
            ),
            b"",
        ),
    ]
    for i, body in enumerate(script.bodies):
        transfer = Transfer(handle=0, delivery_id=i, delivery_tag=b"t%d" % i, settled=script.settled)
        perfs.append((transfer, encode_message(Message(body=[Data(body)]))))
    perfs.append((Detach(handle=0, closed=True), b""))
    if script.ending in ("end", "close"):
        perfs.append((End(), b""))
    if script.ending == "close":
        perfs.append((Close(), b""))
    for perf, payload in perfs:
        pieces.append(bytes(frame(FRAME_AMQP, 0, perf, payload)))
    bounds = []
    at = 0
    for piece in pieces[:-1]:
        at += len(piece)
        bounds.append(at)
    return b"".join(pieces), bounds


def ways(data: bytes, bounds: list[int]) -> Iterator[tuple[str, list[bytes]]]:
    yield "whole", [data]
    yield "byte by byte", [data[i : i + 1] for i in range(len(data))]
    cuts = [0, *bounds, len(data)]
    yield "frame by frame", [data[a:b] for a, b in itertools.pairwise(cuts)]
    for at in bounds:
        yield f"cut at {at}", [data[:at], data[at:]]


SCRIPTS = [
    Script(f"{kind} {'settled' if settled else 'unsettled'} then {ending}", address, settled, ending, sasl)
    for kind, address in (("queue", "queue://orders"), ("topic", "topic://news"))
    for settled in (True, False)
    for ending, sasl in (("detach", False), ("end", True), ("close", False))
]


# -- what the client saw, frame by frame ----------------------------------------------------------


def frames_seen(output: bytes) -> list[Any]:
    """The server's frames; a disposition counts once per delivery it settles."""
    decoder = FrameDecoder()
    decoder.feed(output)
    seen: list[Any] = []
    while True:
        header = decoder.next_header()
        if not isinstance(header, bytes):
            break
        seen.append(("header", header))
        while True:
            got = decoder.next_frame()
            if not isinstance(got, Frame):
                break
            if got.is_empty:
                continue
            perf, payload = got.performative()
            if isinstance(perf, Disposition):
                last = perf.first if perf.last is None else perf.last
                for did in range(perf.first, last + 1):
                    seen.append(("disposition", did, perf.role, perf.settled, type(perf.state).__name__))
            else:
                seen.append((got.type, got.channel, repr(perf), bytes(payload)))
            if isinstance(perf, SaslOutcome):
                break  # a new header follows
    return seen


# -- the deck -------------------------------------------------------------------------------------


class TopicReader:
    id = "frame-order-reader"

    def __init__(self) -> None:
        self.bodies: list[bytes] = []

    def __hash__(self) -> int:
        return id(self)

    def deliver(self, message: DeckMessage, delivery: Delivery[Any]) -> None:
        self.bodies.append(bytes(message.payload))


@dataclass
class Deck:
    front: Amqp1FrontEnd
    queues: QueueManager
    reader: TopicReader
    runner: Runner
    seen_offset: int = -1

    def taken(self, script: Script) -> list[bytes]:
        """What this run put on the deck: new queue messages or what the topic reader got."""
        if script.address.startswith("topic://"):
            bodies, self.reader.bodies = self.reader.bodies, []
            return bodies
        if not self.queues.exists("orders"):
            return []
        stored = self.queues.peek("orders", after=self.seen_offset, limit=1000)
        if stored:
            self.seen_offset = stored[-1].offset
        return [bytes(s.message.payload) for s in stored]


@asynccontextmanager
async def deck(tmp_path: Path) -> AsyncIterator[Deck]:
    storage = Storage.from_url(f"sqlite:///{tmp_path / 'frame-order.db'}", sqlite_synchronous="normal")
    storage.migrate()
    broker = Broker(None, sys_interval=0)
    queues = QueueManager(storage, QueueSettings(auto_create=True), StorageSettings(commit_interval_ms=1.0))
    reader = TopicReader()
    broker.router.subscribe(reader, "news", SubscriptionOptions(qos=1))
    runner = Runner()
    try:
        async with queues.running(), anyio.create_task_group() as tg:
            await tg.start(runner.run)
            yield Deck(Amqp1FrontEnd(broker, Settings(), queues), queues, reader, runner)
            tg.cancel_scope.cancel()
    finally:
        storage.close()


async def run_once(d: Deck, chunks: list[bytes]) -> list[Any]:
    def factory(io: Conn, first: bytes) -> Amqp1Conn | None:
        return d.front.open(io) if first else None

    wire = Wire(d.runner, factory)
    for chunk in chunks:
        # Only what a socket would do: deliver the next chunk once the runtime reads again.
        with anyio.fail_after(5):
            while not wire.transport.reading and not wire.transport.closed:
                await anyio.sleep(0.001)
        if wire.transport.closed:
            break
        wire.conn.data_received(chunk)
        await anyio.sleep(0)
    hull = wire.conn.hull
    with anyio.fail_after(5):  # every publish committed and answered, every held frame acted on
        while isinstance(hull, Amqp1Conn) and (hull.pending or hull.machine.hold_closing):
            await anyio.sleep(0.001)
    await settle()
    output = wire.transport.take()
    await wire.eof()
    with anyio.fail_after(5):
        while wire.conn in d.runner.conns or d.front.connections:
            await anyio.sleep(0.001)
    await settle()
    return frames_seen(output)


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda s: s.name)
async def test_same_deliveries_and_same_frames_however_the_bytes_are_cut(
    script: Script, tmp_path: Path
) -> None:
    data, bounds = record(script)
    async with deck(tmp_path) as d:
        reference: list[Any] | None = None
        for how, chunks in ways(data, bounds):
            seen = await run_once(d, chunks)
            assert d.taken(script) == script.bodies, f"{how}: messages lost or changed"
            assert not d.runner.stats.crashes, how
            if reference is None:
                reference = seen
                # The reference itself answers everything the client asked, in order.
                kinds = [s[2].split("(")[0] if len(s) == 4 else s[0] for s in seen if s[0] != "header"]
                assert kinds[-1] == (
                    "Close" if script.ending == "close" else "Detach" if script.ending == "detach" else "End"
                )
                dispositions = [s for s in seen if s[0] == "disposition"]
                if script.settled:
                    assert dispositions == []
                else:
                    assert dispositions == [
                        ("disposition", i, True, True, "Accepted") for i in range(script.count)
                    ]
                    assert kinds.index("Detach") > max(
                        i for i, k in enumerate(kinds) if k == "disposition"
                    ), "every outcome reaches the client before its link is gone"
            else:
                assert seen == reference, f"{how}: the client saw other frames"
