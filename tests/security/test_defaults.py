"""Safe defaults over real sockets: with ``auth.allow_anonymous`` unset, anonymous clients only from
loopback; RabbitMQ's ``guest`` only from loopback; plaintext passwords in the config warned about.
The other address is this host's own non-loopback one (skipped when it has none)."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.security.test_guard import NOT_AUTHORIZED, connack
from tests.support.paho import V5, Endpoints
from tests.support.server import ALICE, ALICE_PERMISSIONS, RunningServer, serving

ARGS = ["--mqtt", "0.0.0.0:0", "--mqtt-ws", "off", "--amqp", "0.0.0.0:0", "--http", "off"]


def outside_address() -> str | None:
    """An address of this host that is not loopback."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))  # TEST-NET: nothing is sent
        except OSError:
            return None
        address = str(probe.getsockname()[0])
    return None if address.startswith("127.") or address == "0.0.0.0" else address


@pytest.fixture(scope="module")
def open_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    directory: Path = tmp_path_factory.mktemp("defaults")
    server = RunningServer(
        ARGS,
        cwd=directory,
        env={"TRIMARAN_AUTH__USERS": ALICE, "TRIMARAN_AUTH__PERMISSIONS": ALICE_PERMISSIONS},
    )
    with serving(server.start()) as running:
        yield running


@pytest.fixture(scope="module")
def outside() -> str:
    address = outside_address()
    if address is None:
        pytest.skip("this host has no non-loopback address")
    return address


def test_start_log_says_who_may_connect(open_server: RunningServer) -> None:
    log = open_server.output()
    assert "anonymous clients accepted from loopback addresses only" in log
    assert "WARNING" in log and "plaintext passwords" in log


def test_anonymous_mqtt_only_from_loopback(open_server: RunningServer, outside: str) -> None:
    port = open_server.ports["mqtt"]
    assert connack(Endpoints("127.0.0.1", port), V5) == 0
    assert connack(Endpoints(outside, port), V5) == NOT_AUTHORIZED
    assert connack(Endpoints(outside, port), V5, username="alice", password="wonderland") == 0


def test_guest_only_from_loopback(open_server: RunningServer, outside: str) -> None:
    pika = pytest.importorskip("pika")
    port = open_server.ports["amqp"]

    def open_as(host: str) -> object:
        params = pika.ConnectionParameters(host, port, credentials=pika.PlainCredentials("guest", "guest"))
        return pika.BlockingConnection(params)

    local = open_as("127.0.0.1")
    local.close()  # type: ignore[attr-defined]
    with pytest.raises(pika.exceptions.ProbableAuthenticationError):
        open_as(outside)


def test_amqp1_anonymous_only_from_loopback(open_server: RunningServer, outside: str) -> None:
    pytest.importorskip("proton")
    from proton import ConnectionException
    from proton.utils import BlockingConnection

    port = open_server.ports["amqp"]
    local = BlockingConnection(f"amqp://127.0.0.1:{port}", timeout=10, allowed_mechs="ANONYMOUS")
    local.create_receiver("topic://anything").close()
    local.close()
    with pytest.raises(ConnectionException):
        remote = BlockingConnection(f"amqp://{outside}:{port}", timeout=10, allowed_mechs="ANONYMOUS")
        remote.create_receiver("topic://anything")
