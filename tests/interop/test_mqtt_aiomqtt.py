"""aiomqtt (asyncio, MQTT 5 and 3.1.1) against the real server."""

from __future__ import annotations

import aiomqtt
import anyio
import pytest

from tests.support.paho import Endpoints

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.parametrize("version", [aiomqtt.ProtocolVersion.V5, aiomqtt.ProtocolVersion.V311])
async def test_aiomqtt_round_trip(mqtt: Endpoints, version: aiomqtt.ProtocolVersion) -> None:
    async with (
        aiomqtt.Client("127.0.0.1", mqtt.tcp, protocol=version, identifier=f"aio-sub-{version.value}") as sub,
        aiomqtt.Client("127.0.0.1", mqtt.tcp, protocol=version) as pub,
    ):
        await sub.subscribe("aio/+/t", qos=2)
        for i in range(10):
            await pub.publish(f"aio/{i}/t", f"p{i}".encode(), qos=i % 3)
        got = []
        with anyio.fail_after(10):
            async for message in sub.messages:
                got.append(bytes(message.payload))
                if len(got) == 10:
                    break
        assert got == [f"p{i}".encode() for i in range(10)]
