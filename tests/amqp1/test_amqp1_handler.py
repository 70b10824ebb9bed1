"""The AMQP 1.0 front end in process, on a real socket: client registry, kick and shutdown."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest
from anyio.abc import ByteStream, SocketAttribute, SocketListener

from trimaran.amqp1.frames import AMQP_HEADER, FRAME_AMQP, Frame, FrameDecoder, encode_frame
from trimaran.amqp1.handler import Amqp1FrontEnd
from trimaran.amqp1.performatives import Begin, Close, Composite, Open
from trimaran.broker.core import Broker
from trimaran.broker.message import PROTOCOL_AMQP1
from trimaran.config import Settings

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class Client:
    def __init__(self, stream: ByteStream) -> None:
        self.stream = stream
        self.decoder = FrameDecoder()

    async def send(self, perf: Composite, channel: int = 0) -> None:
        await self.stream.send(bytes(encode_frame(FRAME_AMQP, channel, perf)))

    async def perf(self) -> Any:
        with anyio.fail_after(5):
            while True:
                frame = self.decoder.next_frame()
                if isinstance(frame, Frame):
                    if frame.is_empty:
                        continue
                    return frame.performative()[0]
                self.decoder.feed(await self.stream.receive())

    async def connect(self) -> Open:
        await self.stream.send(AMQP_HEADER)  # no SASL: anonymous clients are allowed by default
        with anyio.fail_after(5):
            while not isinstance(self.decoder.next_header(), bytes):
                self.decoder.feed(await self.stream.receive())
        await self.send(Open(container_id="in-process"))
        opened = await self.perf()
        assert isinstance(opened, Open)
        return opened


@asynccontextmanager
async def serving(front: Amqp1FrontEnd) -> AsyncIterator[Callable[[], Awaitable[Client]]]:
    multi = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
    async with multi, anyio.create_task_group() as tg:
        listener = multi.listeners[0]
        assert isinstance(listener, SocketListener)
        port = listener.extra(SocketAttribute.local_port)

        async def accept_loop() -> None:
            while True:
                stream = await listener.accept()

                async def serve(s: ByteStream = stream) -> None:
                    async with s:
                        await front.handle(s, "test", b"")

                tg.start_soon(serve)

        tg.start_soon(accept_loop)

        async def connect() -> Client:
            return Client(await anyio.connect_tcp("127.0.0.1", port))

        yield connect
        tg.cancel_scope.cancel()


async def test_registered_while_open_and_kick_closes_with_connection_forced() -> None:
    broker = Broker(None, sys_interval=0)
    seen: list[tuple[str, str]] = []
    broker.events.subscribe(
        lambda e: seen.append((e.type, e.data["protocol"])), ["client.connected", "client.disconnected"]
    )
    front = Amqp1FrontEnd(broker, Settings())
    async with serving(front) as connect:
        client = await connect()
        opened = await client.connect()
        assert opened.container_id == "trimaran"
        await client.send(Begin(next_outgoing_id=0, incoming_window=10, outgoing_window=10))
        assert isinstance(await client.perf(), Begin)
        [info] = list(broker.clients)
        assert (info.client_id, info.protocol) == ("in-process", PROTOCOL_AMQP1)
        assert broker.stats.clients_connected == 1
        info.kick()
        close = await client.perf()
        assert isinstance(close, Close)
        assert close.error is not None and close.error.condition == "amqp:connection:forced"
        with anyio.fail_after(5):
            while len(broker.clients) or front.connections:
                await anyio.sleep(0.01)
        assert broker.stats.clients_connected == 0
    assert seen == [("client.connected", "amqp1"), ("client.disconnected", "amqp1")]


async def test_shutdown_closes_every_connection() -> None:
    broker = Broker(None, sys_interval=0)
    front = Amqp1FrontEnd(broker, Settings())
    async with serving(front) as connect:
        clients = [await connect() for _ in range(3)]
        for client in clients:
            await client.connect()
        with anyio.fail_after(5):
            await front.shutdown()
        for client in clients:
            close = await client.perf()
            assert isinstance(close, Close) and close.error is not None
            assert close.error.description == "server shutting down"
        assert not front.connections and not len(broker.clients)
