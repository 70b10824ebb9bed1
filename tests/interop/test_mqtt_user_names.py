"""MQTT user names with anonymous access (issue 18): what Mosquitto does, side by side.

With anonymous access allowed and no users (no password file), a CONNECT that carries a user name,
even an empty one as several client libraries send, is accepted; once users are configured, a
wrong password or an unknown user is still refused (0x86 / return code 4-5).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion

from tests.support.mosquitto import running_mosquitto
from tests.support.server import RunningServer, serving


@pytest.fixture(scope="module")
def open_trimaran(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """Trimaran with anonymous access and no users at all."""
    args = ["--mqtt", "127.0.0.1:0", "--mqtt-ws", "off", "--amqp", "off", "--http", "off"]
    env = {"TRIMARAN_AUTH__ALLOW_ANONYMOUS": "true"}
    with serving(RunningServer(args, cwd=tmp_path_factory.mktemp("open"), env=env).start()) as server:
        yield server.ports["mqtt"]


@pytest.fixture(scope="module")
def open_mosquitto(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """Mosquitto with allow_anonymous and no password file, on a free port."""
    with running_mosquitto(tmp_path_factory.mktemp("mosquitto")) as port:
        yield port


@pytest.fixture(params=["trimaran", "mosquitto"])
def open_port(request: pytest.FixtureRequest) -> int:
    return int(request.getfixturevalue(f"open_{request.param}"))


def connack(port: int, username: str | None, password: str | None, protocol: MQTTProtocolVersion) -> int:
    """The CONNACK's return / reason code for one CONNECT."""
    client = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=protocol)
    if username is not None:
        client.username_pw_set(username, password)
    done = threading.Event()
    codes: list[int] = []

    def on_connect(_c: Any, _u: Any, _flags: Any, reason: Any, _props: Any) -> None:
        codes.append(int(reason.value))
        done.set()

    client.on_connect = on_connect
    client.connect("127.0.0.1", port)
    client.loop_start()
    try:
        assert done.wait(5), "no CONNACK"
    finally:
        client.disconnect()
        client.loop_stop()
    return codes[0]


@pytest.mark.parametrize("protocol", [mqtt.MQTTv311, mqtt.MQTTv5])
@pytest.mark.parametrize(("username", "password"), [("", None), ("someone", None), ("someone", "anything")])
def test_a_user_name_is_accepted_when_anyone_may_connect(
    open_port: int, username: str, password: str | None, protocol: MQTTProtocolVersion
) -> None:
    assert connack(open_port, username, password, protocol) == 0


@pytest.mark.parametrize("protocol", [mqtt.MQTTv311, mqtt.MQTTv5])
def test_configured_users_still_need_their_password(
    mqtt_server: RunningServer, protocol: MQTTProtocolVersion
) -> None:
    port = mqtt_server.ports["mqtt"]
    refused = 0x86  # bad user name or password (paho reports 3.1.1's return code 4 as 0x86)
    assert connack(port, "alice", "wrong", protocol) == refused
    assert connack(port, "nobody", "x", protocol) == refused
    assert connack(port, "alice", "wonderland", protocol) == 0
