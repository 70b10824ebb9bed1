"""net/websocket.py over real sockets: every handshake the MQTT-over-WebSocket listener cannot take is
answered in HTTP as websockets and h11 answer (414, 431, 400, 426, 405, 505, 404) and said in one log
line, never an internal error (issue 47: 1 MB of headers ended in an AssertionError).

The AMQP port's and the MQTT port's refusals of a wrong protocol header, over the same server, are
here too: one answer in the protocol's own bytes, one log line.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import struct
from collections.abc import Iterator

import pytest

from tests.support.budget import InProcessServer
from trimaran.config import Endpoint

KEY = "dGhlIHNhbXBsZSBub25jZQ=="


def upgrade(
    path: str = "/mqtt",
    *,
    method: str = "GET",
    version: str = "HTTP/1.1",
    headers: dict[str, str] | None = None,
) -> bytes:
    fields = {
        "Host": "127.0.0.1",
        "Upgrade": "websocket",
        "Connection": "Upgrade",
        "Sec-WebSocket-Key": KEY,
        "Sec-WebSocket-Version": "13",
        **(headers or {}),
    }
    lines = "".join(f"{name}: {value}\r\n" for name, value in fields.items() if value)
    return f"{method} {path} {version}\r\n{lines}\r\n".encode()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessServer]:
    local = Endpoint("127.0.0.1", 0)
    running = InProcessServer(tmp_path_factory.mktemp("websocket"), listeners={"mqtt_ws": local}).start()
    try:
        yield running
    finally:
        running.stop()


def exchange(port: int, data: bytes) -> bytes:
    """Send ``data`` and read until the server closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        with contextlib.suppress(OSError):  # it may refuse and close before reading all of it
            sock.sendall(data)
        got = b""
        try:
            while chunk := sock.recv(65536):
                got += chunk
        except ConnectionResetError:
            pass
        return got


def refusals(caplog: pytest.LogCaptureFixture, logger: str) -> list[str]:
    records = caplog.records
    assert not [r for r in records if r.levelno >= logging.WARNING], [r.getMessage() for r in records]
    assert not [r for r in records if r.exc_info], "no traceback"
    return [r.getMessage() for r in records if r.name == logger]


@pytest.mark.parametrize(
    ("request_bytes", "status", "said"),
    [
        (upgrade(headers={"X-Big": "a" * (1 << 20)}), 431, "expected no more than 8192 bytes"),
        (upgrade(headers={f"X-{n}": "a" for n in range(300)}), 431, "no more than 128 headers"),
        (upgrade("/" + "a" * 20000), 414, "expected no more than 8192 bytes"),
        (b"HELLO\r\n\r\n", 400, "invalid HTTP request line: HELLO"),
        (upgrade(headers={"Sec-WebSocket-Key": ""}), 400, "missing Sec-WebSocket-Key header"),
        (upgrade(headers={"Sec-WebSocket-Key": "short"}), 400, "invalid Sec-WebSocket-Key header: short"),
        (upgrade(headers={"Sec-WebSocket-Version": "8"}), 400, "invalid Sec-WebSocket-Version header: 8"),
        (upgrade(headers={"Upgrade": ""}), 426, "missing Upgrade header"),
        (upgrade(headers={"Sec-WebSocket-Protocol": "chat"}), 400, "no supported subprotocol among ['chat']"),
        (upgrade(headers={"Sec-WebSocket-Protocol": "mqtt;"}), 400, "bad Sec-WebSocket-Protocol header"),
        (upgrade(method="POST", headers={"Content-Length": "0"}), 405, "unsupported HTTP method: POST"),
        (upgrade(version="HTTP/1.0"), 505, "unsupported HTTP version: HTTP/1.0"),
        (upgrade("/elsewhere"), 404, "no WebSocket endpoint at /elsewhere"),
    ],
    ids=[
        "1MB-header",
        "300-headers",
        "long-request-line",
        "bad-request-line",
        "no-key",
        "bad-key",
        "bad-version",
        "no-upgrade",
        "other-subprotocol",
        "bad-subprotocol-header",
        "post",
        "http-1.0",
        "unknown-path",
    ],
)
def test_a_bad_handshake_is_answered_and_said_once(
    server: InProcessServer, caplog: pytest.LogCaptureFixture, request_bytes: bytes, status: int, said: str
) -> None:
    with caplog.at_level(logging.INFO):
        got = exchange(server.port("mqtt-ws"), request_bytes)
    assert got.startswith(f"HTTP/1.1 {status} ".encode()), got[:200]
    assert got.count(b"HTTP/1.1 ") == 1, "one answer"
    lines = refusals(caplog, "trimaran.net.websocket")
    assert len(lines) == 1, lines
    assert f"refused: {status} " in lines[0] and said in lines[0], lines[0]
    assert "127.0.0.1:" in lines[0], "the peer is named"


def test_the_listener_serves_on_after_refusals(server: InProcessServer) -> None:
    got = exchange(server.port("mqtt-ws"), upgrade(headers={"X-Big": "a" * (1 << 20)}))
    assert got.startswith(b"HTTP/1.1 431 ")
    with socket.create_connection(("127.0.0.1", server.port("mqtt-ws")), timeout=10) as sock:
        sock.sendall(upgrade(headers={"Sec-WebSocket-Protocol": "mqtt"}))
        assert sock.recv(4096).startswith(b"HTTP/1.1 101 ")


def _mqtt_connect(name: str, level: int) -> bytes:
    def string(text: str) -> bytes:
        return struct.pack("!H", len(text)) + text.encode()

    body = string(name) + bytes([level, 0x02]) + struct.pack("!H", 60) + string("c")
    return bytes([0x10, len(body)]) + body


@pytest.mark.parametrize(
    ("listener", "hello", "answer", "logger", "said"),
    [
        (
            "amqp",
            b"AMQP\x00\x00\x08\x00",
            b"AMQP\x00\x00\x09\x01",
            "trimaran.runtime.transport",
            "is not served",
        ),
        (
            "amqp",
            b"AMQP\x05\x01\x00\x00",
            b"AMQP\x00\x00\x09\x01",
            "trimaran.runtime.transport",
            "is not served",
        ),
        (
            "amqp",
            b"GET / HTTP/1.1\r\n\r\n",
            b"AMQP\x00\x00\x09\x01",
            "trimaran.runtime.transport",
            "not-amqp",
        ),
        # 3.1.1 section 3.1.2.2: return code 0x01, as Mosquitto answers a level it does not speak.
        ("mqtt", _mqtt_connect("MQTT", 9), b"\x20\x02\x00\x01", "trimaran.mqtt.handler", "level 9"),
        ("mqtt", _mqtt_connect("MQTT", 6), b"\x20\x02\x00\x01", "trimaran.mqtt.handler", "level 6"),
        ("mqtt", b"GET / HTTP/1.1\r\n\r\n", b"", "trimaran.mqtt.handler", "must be CONNECT"),
    ],
    ids=["amqp-0-8", "amqp-1.0-other", "amqp-http", "mqtt-level-9", "mqtt-level-6", "mqtt-http"],
)
def test_a_wrong_protocol_header_is_answered_and_said_once(
    server: InProcessServer,
    caplog: pytest.LogCaptureFixture,
    listener: str,
    hello: bytes,
    answer: bytes,
    logger: str,
    said: str,
) -> None:
    with caplog.at_level(logging.INFO):
        got = exchange(server.port(listener), hello)
    assert got == answer
    lines = refusals(caplog, logger)
    assert len(lines) == 1 and said in lines[0], lines
