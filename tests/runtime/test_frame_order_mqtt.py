"""Frames take effect in the order they arrived, however the bytes were cut (MQTT hull).

A recorded client conversation (CONNECT, PUBLISHes at QoS 0, 1 and 2, PUBREL, then DISCONNECT, or a
socket that simply ends) goes through the real runtime (``Wire``) into the real ``MqttFrontEnd`` and
broker, fed whole, byte by byte and cut at every position. Every run must deliver the same messages
to a subscriber on the deck, in order (none lost to the DISCONNECT behind them), and send the client
the same bytes (CONNACK, PUBACK, PUBREC, PUBCOMP).
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.support import runtime
from tests.support.runtime import Wire, cuts, running, settle
from trimaran.broker.core import Broker
from trimaran.broker.message import Message
from trimaran.broker.router import Delivery, SubscriptionOptions
from trimaran.config import Settings
from trimaran.mqtt.codec import encode
from trimaran.mqtt.handler import MqttFrontEnd
from trimaran.mqtt.packets import Connect, Disconnect, Publish, PubRel
from trimaran.security.guard import Security

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(autouse=True)
def quick_settle(monkeypatch: pytest.MonkeyPatch) -> None:
    """2 ms between settle()'s rounds, not 10: nothing here waits for time (no deadline, no timer
    but at zero), and a stream is settled after every cut of it (about 4 s per case saved)."""
    monkeypatch.setattr(runtime, "SETTLE_S", 0.002)


class Reader:
    id = "frame-order-reader"

    def __init__(self) -> None:
        self.payloads: list[bytes] = []

    def __hash__(self) -> int:
        return id(self)

    def deliver(self, message: Message, delivery: Delivery[Any]) -> None:
        self.payloads.append(bytes(message.payload))


def conversation(level: int, ending: bytes) -> bytes:
    packets = [
        encode(Connect(protocol_level=level, client_id=f"writer-{level}", keep_alive=30), level),
        encode(Publish("frames/a", b"q0-1"), level),
        encode(Publish("frames/a", b"q1", qos=1, packet_id=1), level),
        encode(Publish("frames/b", b"q2", qos=2, packet_id=2), level),
        encode(PubRel(2), level),
        encode(Publish("frames/a", b"q0-2"), level),
    ]
    return b"".join(packets) + ending


ENDINGS = {
    "disconnect": lambda level: encode(Disconnect(), level),
    "socket ends": lambda level: b"",
}


@pytest.mark.parametrize("level", [4, 5])
@pytest.mark.parametrize("ending", list(ENDINGS))
async def test_same_deliveries_and_replies_however_the_bytes_are_cut(level: int, ending: str) -> None:
    stream = conversation(level, ENDINGS[ending](level))
    outcomes: set[tuple[tuple[bytes, ...], bytes]] = set()
    runs = 0
    async with running() as runner:
        for chunks in cuts(stream):
            broker = Broker(sys_interval=0)
            settings = Settings()
            front = MqttFrontEnd(broker, settings, security=Security(settings.auth))
            reader = Reader()
            broker.router.subscribe(reader, "frames/#", SubscriptionOptions(qos=0))
            wire = Wire(
                runner, lambda io, first, front=front: front.open(io), peer=("127.0.0.1", 40000 + runs)
            )
            await wire.feed(chunks)
            await wire.eof()
            await settle()
            outcomes.add((tuple(reader.payloads), wire.transport.take()))
            runs += 1
    assert runs == len(stream) + 1
    assert len(outcomes) == 1, outcomes
    [(payloads, output)] = outcomes
    assert payloads == (b"q0-1", b"q1", b"q2", b"q0-2")  # all delivered, in order, before the close
    assert output.startswith(b"\x20")  # CONNACK, then the acknowledgements
    assert b"\x40\x02\x00\x01" in output  # PUBACK 1
    assert b"\x50\x02\x00\x02" in output and b"\x70\x02\x00\x02" in output  # PUBREC 2, PUBCOMP 2
