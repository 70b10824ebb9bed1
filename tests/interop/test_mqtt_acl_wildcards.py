"""A Mosquitto rule file with a deny under a readable tree, in Trimaran and in Debian's Mosquitto 2.0
side by side (paho): wildcard subscriptions over the tree are granted, and each delivery is checked
against the reader's rules, so the denied topic never arrives, live or retained.

One difference is kept on purpose: a filter no topic of which may be read (here the denied topic
itself) is refused by Trimaran (SUBACK 0x80 / 0x87, as the paho interop suite's
``test_subscribe_failure`` expects), where Mosquitto 2.0 grants every SUBACK and delivers nothing.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.mosquitto import running_mosquitto
from tests.support.paho import V5, V311, Endpoints, Received, close_all, connect
from tests.support.server import RunningServer, serving

RULES = "topic deny test/nosubscribe\ntopic readwrite #\n"


@pytest.fixture(scope="module")
def trimaran_acl(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    directory = tmp_path_factory.mktemp("trimaran-acl")
    (directory / "acl").write_text(RULES)
    args = ["--mqtt", "127.0.0.1:0", "--mqtt-ws", "off", "--amqp", "off", "--http", "off"]
    env = {"TRIMARAN_AUTH__ALLOW_ANONYMOUS": "true", "TRIMARAN_AUTH__ACL_FILE": str(directory / "acl")}
    with serving(RunningServer(args, cwd=directory, env=env).start()) as server:
        yield server.ports["mqtt"]


@pytest.fixture(scope="module")
def mosquitto_acl(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    directory: Path = tmp_path_factory.mktemp("mosquitto-acl")
    (directory / "acl").write_text(RULES)
    with running_mosquitto(directory, f"acl_file {directory / 'acl'}\n") as port:
        yield port


@pytest.fixture(params=["trimaran", "mosquitto"])
def broker(request: pytest.FixtureRequest) -> tuple[str, Endpoints]:
    port = int(request.getfixturevalue(f"{request.param}_acl"))
    return request.param, Endpoints("127.0.0.1", port)


def codes(values: list[Any]) -> list[int]:
    return [int(getattr(v, "value", v)) for v in values]


def collected(client: Any, wait: float = 1.0) -> list[Received]:
    time.sleep(wait)
    got = []
    while not client.messages.empty():
        got.append(client.messages.get())
    return got


@pytest.mark.parametrize("version", [V311, V5])
def test_wildcards_over_a_denied_topic_are_granted(broker: tuple[str, Endpoints], version: Any) -> None:
    _name, endpoints = broker
    client = connect(endpoints, f"acl-sub-{uuid.uuid4().hex[:8]}", version=version)
    try:
        for topic_filter in ("#", "+/+", "test/#", "test/+", "+/nosubscribe"):
            assert codes(client.subscribe(topic_filter, qos=1)) == [1], topic_filter
    finally:
        close_all(client)


@pytest.mark.parametrize("version", [V311, V5])
def test_each_delivery_is_checked_against_the_readers_rules(
    broker: tuple[str, Endpoints], version: Any
) -> None:
    _name, endpoints = broker
    mark = uuid.uuid4().hex[:8]
    publisher = connect(endpoints, f"acl-pub-{mark}", version=version)
    publisher.publish("test/nosubscribe", f"retained {mark}", qos=1, retain=True)
    publisher.publish(f"test/ok-{mark}", f"retained {mark}", qos=1, retain=True)
    everything = connect(endpoints, f"acl-all-{mark}", version=version)
    level = connect(endpoints, f"acl-level-{mark}", version=version)
    try:
        assert codes(everything.subscribe("#", qos=1)) == [1]
        assert codes(level.subscribe("test/+", qos=1)) == [1]
        for topic in ("test/nosubscribe", f"test/ok-{mark}", f"other/{mark}"):
            publisher.publish(topic, f"live {mark}", qos=1)
        got_all = {(m.topic, m.payload.decode()) for m in collected(everything) if mark in m.payload.decode()}
        got_level = {
            (m.topic, m.payload.decode()) for m in collected(level, 0.2) if mark in m.payload.decode()
        }
        assert got_all == {
            (f"test/ok-{mark}", f"retained {mark}"),
            (f"test/ok-{mark}", f"live {mark}"),
            (f"other/{mark}", f"live {mark}"),
        }
        assert got_level == {(f"test/ok-{mark}", f"retained {mark}"), (f"test/ok-{mark}", f"live {mark}")}
    finally:
        publisher.publish(f"test/ok-{mark}", b"", qos=1, retain=True)
        close_all(publisher, everything, level)


@pytest.mark.parametrize("version", [V311, V5])
def test_the_denied_topic_itself_delivers_nothing(broker: tuple[str, Endpoints], version: Any) -> None:
    """The one difference: Trimaran refuses the subscription, Mosquitto grants it; neither delivers."""
    name, endpoints = broker
    mark = uuid.uuid4().hex[:8]
    client = connect(endpoints, f"acl-denied-{mark}", version=version)
    publisher = connect(endpoints, f"acl-denied-pub-{mark}", version=version)
    try:
        refused = 0x80 if version == V311 else 0x87
        expected = refused if name == "trimaran" else 1
        assert codes(client.subscribe("test/nosubscribe", qos=1)) == [expected]
        publisher.publish("test/nosubscribe", f"live {mark}", qos=1)
        assert [m for m in collected(client) if mark in str(m.payload)] == []
    finally:
        close_all(client, publisher)
