"""Connect and keep-alive timeouts on the real server, with raw sockets (the clients' own timers off)."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.server import ALL_OFF, RunningServer

CONNECT_V5_KEEPALIVE_1 = bytes.fromhex("101100044d5154540502000100000474696d65")  # client id "time"
CONNECT_V311_KEEPALIVE_1 = bytes.fromhex("101000044d51545404020001000474696d65")
PINGREQ = b"\xc0\x00"


@pytest.fixture(scope="module")
def port(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    cwd: Path = tmp_path_factory.mktemp("timeouts")
    server = RunningServer(
        [*ALL_OFF, "--mqtt", "127.0.0.1:0"], cwd=cwd, env={"TRIMARAN_LIMITS__CONNECT_TIMEOUT": "1"}
    ).start()
    try:
        yield server.ports["mqtt"]
    finally:
        server.stop()


def read_until_closed(sock: socket.socket, limit: float) -> tuple[bytes, float]:
    """Everything the server sends until it closes, and how long that took."""
    started = time.monotonic()
    sock.settimeout(limit)
    data = b""
    while True:
        chunk = sock.recv(4096)
        if not chunk:
            return data, time.monotonic() - started
        data += chunk


def test_silent_socket_is_closed_after_the_connect_timeout(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port)) as sock:
        data, took = read_until_closed(sock, 5)
    assert data == b""
    assert 0.9 <= took < 2.5


@pytest.mark.parametrize("connect", [CONNECT_V5_KEEPALIVE_1, CONNECT_V311_KEEPALIVE_1], ids=["5.0", "3.1.1"])
def test_keep_alive_expires_at_one_and_a_half_times(port: int, connect: bytes) -> None:
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(connect)
        data, took = read_until_closed(sock, 5)
    assert data[0] == 0x20  # CONNACK
    rest = data[2 + data[1] :]
    if connect[8] == 5:  # then DISCONNECT with reason 0x8D Keep Alive timeout
        assert rest[0] == 0xE0 and rest[2] == 0x8D, rest
    else:  # 3.1.1 has no DISCONNECT from the server: the socket just closes
        assert rest == b""
    assert 1.4 <= took < 2.6


def test_pings_keep_the_connection_open(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(CONNECT_V5_KEEPALIVE_1)
        sock.settimeout(2)
        assert sock.recv(4096).startswith(b"\x20")
        for _ in range(5):
            time.sleep(0.7)
            sock.sendall(PINGREQ)
            assert sock.recv(2) == b"\xd0\x00"  # PINGRESP: still connected after 3.5 s
