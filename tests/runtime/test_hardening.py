"""Hardening of the real server (issue 13): resets, half-open and byte-by-byte sessions on every
listener, limits answered while other clients keep working, and a mutation fuzzer over real MQTT
sessions. Each test runs ``trimaran serve`` as a subprocess and checks it still serves afterwards,
with no traceback in its log.

The long fuzz run: ``TRIMARAN_FUZZ_INPUTS=1000000 pytest -m slow tests/runtime/test_hardening.py``.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import random
import selectors
import socket
import sqlite3
import struct
import time
import urllib.request
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import pytest

from tests.support import paho
from tests.support.server import RunningServer, serving
from trimaran.mqtt.codec import Decoder as MqttDecoder
from trimaran.mqtt.codec import NeedData, encode
from trimaran.mqtt.packets import (
    ConnAck,
    Connect,
    Disconnect,
    PingReq,
    PingResp,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    SubAck,
    Subscribe,
    SubscriptionOptions,
    Unsubscribe,
    Will,
)
from trimaran.mqtt.properties import Properties

HOST = "127.0.0.1"
LISTENERS = ["mqtt", "mqtt-ws", "http"]
RST = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() sends a reset


def server_args(*listeners: str) -> list[str]:
    args: list[str] = []
    for name in ("mqtt", "mqtt-ws", "amqp", "http"):
        args += [f"--{name}", f"{HOST}:0" if name in listeners else "off"]
    return args


def start(tmp: Path, *listeners: str, env: dict[str, str] | None = None) -> RunningServer:
    return RunningServer(server_args(*listeners), cwd=tmp, env=env).start()


def assert_clean_log(server: RunningServer) -> None:
    assert server.process is not None and server.process.poll() is None, server.output()
    assert "Traceback" not in server.output(), server.output()


# -- raw clients ---------------------------------------------------------------------------------


def dial(port: int, source: str | None = None, timeout: float = 5.0) -> socket.socket:
    sock = socket.socket()
    sock.settimeout(timeout)
    if source is not None:
        sock.bind((source, 0))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.connect((HOST, port))
    return sock


def read_until_closed(sock: socket.socket, timeout: float = 5.0) -> bytes:
    """Everything the server sends until it closes (a reset counts as closed)."""
    sock.settimeout(timeout)
    data = bytearray()
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except ConnectionResetError:
        pass
    return bytes(data)


def ws_handshake(path: str = "/mqtt") -> bytes:
    key = base64.b64encode(os.urandom(16)).decode()
    return (
        f"GET {path} HTTP/1.1\r\nHost: {HOST}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: mqtt\r\n\r\n"
    ).encode()


def ws_frame(payload: bytes, opcode: int = 0x2) -> bytes:
    """One masked client frame."""
    mask = os.urandom(4)
    n = len(payload)
    if n < 126:
        head = bytes([0x80 | opcode, 0x80 | n])
    elif n < 65536:
        head = bytes([0x80 | opcode, 0x80 | 126]) + struct.pack("!H", n)
    else:
        head = bytes([0x80 | opcode, 0x80 | 127]) + struct.pack("!Q", n)
    return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


class MqttReader:
    """Server packets off a raw socket, plain or inside WebSocket frames."""

    def __init__(self, sock: socket.socket, level: int, websocket: bool = False) -> None:
        self.sock = sock
        self.decoder = MqttDecoder(protocol_level=level)
        self.websocket = websocket
        self.raw = bytearray()
        self.upgraded = not websocket

    def _more(self) -> None:
        chunk = self.sock.recv(65536)
        if not chunk:
            raise EOFError("server closed")
        if not self.websocket:
            self.decoder.feed(chunk)
            return
        self.raw += chunk
        if not self.upgraded:
            end = self.raw.find(b"\r\n\r\n")
            if end < 0:
                return
            head, self.raw = bytes(self.raw[:end]), self.raw[end + 4 :]
            assert head.startswith(b"HTTP/1.1 101"), head
            self.upgraded = True
        while len(self.raw) >= 2:
            n = self.raw[1] & 0x7F
            at = 2
            if n == 126:
                if len(self.raw) < 4:
                    return
                n, at = struct.unpack("!H", self.raw[2:4])[0], 4
            elif n == 127:
                if len(self.raw) < 10:
                    return
                n, at = struct.unpack("!Q", self.raw[2:10])[0], 10
            if len(self.raw) < at + n:
                return
            opcode = self.raw[0] & 0x0F
            if opcode == 0x2:
                self.decoder.feed(bytes(self.raw[at : at + n]))
            del self.raw[: at + n]

    def packet(self) -> object:
        while (packet := self.decoder.next_packet()) is NeedData.NEED_DATA:
            self._more()
        return packet


def mqtt_session(level: int, client_id: str, topic: str) -> list[bytes]:
    """A subscriber that publishes to itself at QoS 0, 1 and 2, then disconnects."""
    props = Properties(session_expiry_interval=0) if level == 5 else Properties()
    return [
        encode(Connect(protocol_level=level, client_id=client_id, keep_alive=30, properties=props), level),
        encode(Subscribe(1, [(topic, SubscriptionOptions(qos=2))]), level),
        encode(Publish(topic, b"q0", qos=0), level),
        encode(Publish(topic, b"q1", qos=1, packet_id=2), level),
        encode(Publish(topic, b"q2", qos=2, packet_id=3), level),
    ]


def bytewise(sock: socket.socket, data: bytes) -> None:
    for i in range(len(data)):
        sock.sendall(data[i : i + 1])


def answer_until(
    reader: MqttReader, sock: socket.socket, wrap: Callable[[bytes], bytes], level: int, want: set[type]
) -> None:
    """Read the server's packets, acknowledging its deliveries byte by byte, until each kind in
    ``want`` has been seen (the order of acknowledgements and deliveries is the server's)."""
    seen: set[type] = set()
    while not want <= seen:
        packet = reader.packet()
        seen.add(type(packet))
        reply: object = None
        if isinstance(packet, Publish) and packet.qos and packet.packet_id is not None:
            reply = (PubAck if packet.qos == 1 else PubRec)(packet.packet_id)
        elif isinstance(packet, PubRec):
            reply = PubRel(packet.packet_id)
        elif isinstance(packet, PubRel):
            reply = PubComp(packet.packet_id)
        if reply is not None:
            bytewise(sock, wrap(encode(reply, level)))  # type: ignore[arg-type]


def run_bytewise_mqtt(port: int, level: int, websocket: bool) -> None:
    """A whole MQTT session sent one byte per send; the server's answers checked on the way."""
    topic = f"hard/{uuid.uuid4().hex}"
    packets = mqtt_session(level, f"bytewise-{uuid.uuid4().hex[:8]}", topic)
    wrap: Callable[[bytes], bytes] = ws_frame if websocket else (lambda b: b)
    with dial(port) as sock:
        reader = MqttReader(sock, level, websocket)
        if websocket:
            bytewise(sock, ws_handshake())
        connect, subscribe, q0, q1, q2 = (wrap(p) for p in packets)
        bytewise(sock, connect)
        assert isinstance(reader.packet(), ConnAck)
        bytewise(sock, subscribe)
        assert isinstance(reader.packet(), SubAck)
        bytewise(sock, q0)
        got = reader.packet()
        assert isinstance(got, Publish) and got.payload == b"q0"
        bytewise(sock, q1)
        answer_until(reader, sock, wrap, level, {PubAck, Publish})
        bytewise(sock, q2)
        answer_until(reader, sock, wrap, level, {PubRec, PubRel, PubComp})
        bytewise(sock, wrap(encode(Disconnect(), level)))
        sock.shutdown(socket.SHUT_WR)
        read_until_closed(sock)


def run_bytewise_http(port: int) -> None:
    with dial(port) as sock:
        bytewise(sock, f"GET /healthz HTTP/1.1\r\nHost: {HOST}\r\nConnection: close\r\n\r\n".encode())
        answer = read_until_closed(sock)
    assert answer.startswith(b"HTTP/1.1 200"), answer


# -- the server still serves ------------------------------------------------------------------------


def assert_serving(server: RunningServer) -> None:
    """A real client of each listener gets through; the log has no traceback."""
    assert_clean_log(server)
    if "mqtt" in server.ports:
        check_paho(paho.Endpoints(HOST, server.ports["mqtt"]), "tcp")
    if "mqtt-ws" in server.ports:
        check_paho(paho.Endpoints(HOST, 0, ws=server.ports["mqtt-ws"]), "ws")
    if "http" in server.ports:
        with urllib.request.urlopen(f"http://{HOST}:{server.ports['http']}/healthz", timeout=5) as reply:
            assert reply.status == 200
    assert_clean_log(server)


def check_paho(endpoints: paho.Endpoints, transport: str) -> None:
    topic = f"check/{uuid.uuid4().hex}"
    client = paho.connect(endpoints, transport=transport, version=paho.V5)
    try:
        client.subscribe(topic, qos=1)
        client.publish(topic, b"still here", qos=1)
        assert client.expect().payload == b"still here"
    finally:
        paho.close_all(client)


# -- 1. resets, half-open sockets, byte-by-byte sessions ---------------------------------------------


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    with serving(start(tmp_path_factory.mktemp("hardening"), *LISTENERS)) as running:
        yield running


# 2,000 per listener by default; the slow run's 10,000 (TRIMARAN_RESETS_SLOW) as well. A socket kept
# per reset is seen at any count: the server's open descriptors are counted before and after.
RESETS = int(os.environ.get("TRIMARAN_RESETS", "2000"))
RESETS_SLOW = int(os.environ.get("TRIMARAN_RESETS_SLOW", "10000"))

PARTIAL = {
    "mqtt": encode(Connect(client_id="half-open"), 4)[:7],
    "mqtt-ws": ws_handshake()[:30],
    "http": b"GET /heal",
}


def open_descriptors(server: RunningServer) -> int | None:
    """How many descriptors the server process holds open (None where /proc does not say)."""
    assert server.process is not None
    try:
        return len(os.listdir(f"/proc/{server.process.pid}/fd"))
    except OSError:
        return None


def connect_and_reset(server: RunningServer, listener: str, resets: int) -> None:
    port = server.ports[listener]
    before = open_descriptors(server)
    started = time.monotonic()
    for _ in range(resets):
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, RST)
        sock.connect((HOST, port))
        sock.close()
    took = time.monotonic() - started
    print(f"{listener}: {resets} connect+RST in {took:.1f}s")
    assert_serving(server)
    if before is not None:  # what the resets opened was closed again (the last ones may be closing)
        deadline = time.monotonic() + 10
        while (after := open_descriptors(server)) is not None and after > before + 50:
            assert time.monotonic() < deadline, f"{after - before} descriptors more after {resets} resets"
            time.sleep(0.1)


@pytest.mark.parametrize("listener", LISTENERS)
def test_connect_and_reset_before_any_byte(server: RunningServer, listener: str) -> None:
    connect_and_reset(server, listener, RESETS)


@pytest.mark.slow
@pytest.mark.parametrize("listener", LISTENERS)
def test_connect_and_reset_before_any_byte_at_length(server: RunningServer, listener: str) -> None:
    connect_and_reset(server, listener, RESETS_SLOW)


@pytest.mark.parametrize("listener", LISTENERS)
def test_half_open_sockets_are_closed(server: RunningServer, listener: str) -> None:
    """Part of a header, then the client's half-close: the server closes its side too."""
    socks = []
    for _ in range(200):
        sock = dial(server.ports[listener])
        sock.sendall(PARTIAL[listener])
        sock.shutdown(socket.SHUT_WR)
        socks.append(sock)
    for sock in socks:
        with sock:
            read_until_closed(sock, timeout=5)  # raises TimeoutError if the server keeps it open
    assert_serving(server)


@pytest.mark.parametrize(("listener", "level"), [("mqtt", 4), ("mqtt", 5), ("mqtt-ws", 4), ("mqtt-ws", 5)])
def test_byte_by_byte_mqtt_session(server: RunningServer, listener: str, level: int) -> None:
    run_bytewise_mqtt(server.ports[listener], level, websocket=listener == "mqtt-ws")
    assert_serving(server)


def test_byte_by_byte_http_request(server: RunningServer) -> None:
    run_bytewise_http(server.ports["http"])
    assert_serving(server)


# -- 2. limits answered while other clients keep working -------------------------------------------


def hello(port: int, source: str, websocket: bool = False) -> socket.socket | None:
    """An MQTT 3.1.1 session from ``source``: the socket once CONNACK came, None if the server
    closed the connection instead (refused)."""
    sock = dial(port, source)
    try:
        if websocket:
            sock.sendall(ws_handshake())
        packet = encode(Connect(client_id=f"limit-{uuid.uuid4().hex[:8]}"), 4)
        sock.sendall(ws_frame(packet) if websocket else packet)
        got = MqttReader(sock, 4, websocket).packet()
    except (EOFError, ConnectionResetError, BrokenPipeError):
        sock.close()
        return None
    assert isinstance(got, ConnAck) and got.reason_code == 0, got
    return sock


def ping(sock: socket.socket, websocket: bool = False) -> None:
    sock.sendall(ws_frame(encode(PingReq(), 4)) if websocket else encode(PingReq(), 4))
    reader = MqttReader(sock, 4, websocket)
    reader.upgraded = True
    assert isinstance(reader.packet(), PingResp)


def bye(sock: socket.socket | None, websocket: bool = False) -> None:
    assert sock is not None
    with sock:
        sock.sendall(ws_frame(encode(Disconnect(), 4)) if websocket else encode(Disconnect(), 4))
        read_until_closed(sock)


class Control:
    """A paho client that stays connected through a test and must keep working."""

    def __init__(self, port: int) -> None:
        self.topic = f"control/{uuid.uuid4().hex}"
        self.client = paho.connect(paho.Endpoints(HOST, port), version=paho.V5)
        self.client.subscribe(self.topic, qos=1)
        self.sent = 0

    def check(self) -> None:
        self.sent += 1
        payload = f"ping {self.sent}".encode()
        self.client.publish(self.topic, payload, qos=1)
        assert self.client.expect().payload == payload

    def close(self) -> None:
        paho.close_all(self.client)


@pytest.fixture(scope="module")
def limited(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    env = {
        "TRIMARAN_LIMITS__MAX_CONNECTIONS_PER_ADDRESS": "5",
        "TRIMARAN_LIMITS__ACCEPT_RATE_PER_ADDRESS": "1",
        "TRIMARAN_LIMITS__HANDSHAKE_TIMEOUT": "1",
        # The admin port is not the runtime's: its own request timeout bounds a silent client.
        "TRIMARAN_HTTP__REQUEST_TIMEOUT_S": "1",
    }
    with serving(start(tmp_path_factory.mktemp("limited"), *LISTENERS, env=env)) as running:
        yield running


@pytest.mark.parametrize("listener", ["mqtt", "mqtt-ws"])
def test_connections_per_address(limited: RunningServer, listener: str) -> None:
    port, websocket = limited.ports[listener], listener == "mqtt-ws"
    source = "127.0.0.2" if websocket else "127.0.0.3"
    control = Control(limited.ports["mqtt"])
    try:
        held = [hello(port, source, websocket) for _ in range(5)]
        assert all(held), "the first five from one address are let in"
        assert hello(port, source, websocket) is None, "the sixth is refused"
        control.check()
        for sock in held:
            assert sock is not None
            ping(sock, websocket)
        bye(held.pop(0), websocket)
        deadline = time.monotonic() + 5
        while (again := hello(port, source, websocket)) is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert again is not None, "a place freed is taken again"
        held.append(again)
        for sock in held:
            assert sock is not None
            bye(sock, websocket)
        control.check()
    finally:
        control.close()
    assert "max_connections_per_address" in limited.output()
    assert_serving(limited)


def test_accept_rate_per_address(limited: RunningServer) -> None:
    """A burst of 50 from one address, then one a second; another address is not affected."""
    control = Control(limited.ports["mqtt"])
    try:
        outcomes = []
        for _ in range(60):
            sock = hello(limited.ports["mqtt"], "127.0.0.4")
            outcomes.append(sock is not None)
            if sock is not None:
                bye(sock)
        assert outcomes[:50] == [True] * 50
        assert outcomes[50:].count(False) >= 8, outcomes[50:]
        control.check()
        assert hello(limited.ports["mqtt"], "127.0.0.5") is not None
    finally:
        control.close()
    assert "accept_rate_per_address" in limited.output()
    assert_serving(limited)


@pytest.mark.parametrize("listener", LISTENERS)
def test_silent_connection_dropped_after_handshake_timeout(limited: RunningServer, listener: str) -> None:
    control = Control(limited.ports["mqtt"])
    try:
        with dial(limited.ports[listener], "127.0.0.6") as sock:
            started = time.monotonic()
            read_until_closed(sock, timeout=15)
            took = time.monotonic() - started
        assert 0.5 < took < 3.0, f"{listener}: a silent connection lasted {took:.1f}s (handshake_timeout 1s)"
        control.check()
    finally:
        control.close()
    assert_serving(limited)


def test_max_connections(tmp_path: Path) -> None:
    env = {"TRIMARAN_LIMITS__MAX_CONNECTIONS": "4"}
    with serving(start(tmp_path, "mqtt", env=env)) as server:
        port = server.ports["mqtt"]
        control = Control(port)
        try:
            held = [hello(port, "127.0.0.7") for _ in range(3)]
            assert all(held)
            assert hello(port, "127.0.0.8") is None, "the fifth connection is refused"
            control.check()
            for sock in held:
                assert sock is not None
                ping(sock)
            bye(held.pop(0))
            deadline = time.monotonic() + 5
            while (again := hello(port, "127.0.0.8")) is None and time.monotonic() < deadline:
                time.sleep(0.05)
            assert again is not None
            held.append(again)
            control.check()
            for sock in held:
                assert sock is not None
                bye(sock)
        finally:
            control.close()
        assert "max_connections" in server.output()
        assert_clean_log(server)


# -- 3. a mutation fuzzer over real MQTT sessions ----------------------------------------------------


def corpus() -> list[list[bytes]]:
    """Client sessions of MQTT 3.1.1 and 5, each a list of packets as a client sends them."""
    sessions: list[list[bytes]] = []
    for level in (4, 5):
        v5 = level == 5
        props = Properties(session_expiry_interval=0, receive_maximum=20) if v5 else Properties()
        pub_props = (
            Properties(message_expiry_interval=60, content_type="text/plain", user_properties=[("k", "v")])
            if v5
            else Properties()
        )
        connect = Connect(protocol_level=level, client_id=f"fuzz-{level}", keep_alive=30, properties=props)
        with_will = Connect(
            protocol_level=level,
            client_id=f"fuzz-will-{level}",
            username="alice",
            password=b"wonderland",
            will=Will("fuzz/will", b"gone", qos=1),
            properties=props,
        )
        options = SubscriptionOptions(qos=2, no_local=v5)
        sessions.append(
            [
                encode(connect, level),
                encode(Subscribe(1, [("fuzz/a", options), ("fuzz/+/b", SubscriptionOptions(qos=1))]), level),
                encode(Publish("fuzz/a", b"zero", qos=0, properties=pub_props), level),
                encode(Publish("fuzz/a", b"one", qos=1, packet_id=2, properties=pub_props), level),
                encode(Publish("fuzz/x/b", b"two", qos=2, packet_id=3), level),
                encode(PubRel(3), level),
                encode(PubAck(1), level),
                encode(PubRec(2), level),
                encode(PubComp(2), level),
                encode(Unsubscribe(4, ["fuzz/a"]), level),
                encode(PingReq(), level),
                encode(Disconnect(), level),
            ]
        )
        sessions.append(
            [
                encode(with_will, level),
                encode(Publish("fuzz/w", b"x" * 300, qos=1, packet_id=9), level),
                encode(PingReq(), level),
            ]
        )
    return sessions


def mutate(packets: list[bytes], rng: random.Random) -> bytes:
    """Apply one to four mutations to a session: bit flips, truncation, duplication, insertion,
    deletion, whole-packet shuffles, and tweaks of a packet's remaining-length field."""
    packets = list(packets)
    for _ in range(rng.randint(1, 4)):
        packets = [p for p in packets if p]
        if not packets:
            break
        op = rng.randrange(8)
        i = rng.randrange(len(packets))
        packet = bytearray(packets[i])
        if op == 0:  # bit flips
            for _ in range(rng.randint(1, 3)):
                at = rng.randrange(len(packet))
                packet[at] ^= 1 << rng.randrange(8)
        elif op == 1:  # truncate this packet (and drop the rest of the session, sometimes)
            del packet[rng.randrange(len(packet)) :]
            if rng.random() < 0.5:
                del packets[i + 1 :]
        elif op == 2:  # duplicate a slice in place
            a = rng.randrange(len(packet))
            b = rng.randrange(a, len(packet) + 1)
            packet[b:b] = packet[a:b]
        elif op == 3:  # insert random bytes
            at = rng.randrange(len(packet) + 1)
            packet[at:at] = rng.randbytes(rng.randint(1, 16))
        elif op == 4:  # delete a slice
            a = rng.randrange(len(packet))
            del packet[a : rng.randrange(a, min(len(packet), a + 16) + 1)]
        elif op == 5:  # the remaining-length field: off by a little, huge, or an endless varint
            choice = rng.randrange(4)
            if choice == 0 and len(packet) > 1:
                packet[1] = (packet[1] + rng.choice((-2, -1, 1, 2))) & 0xFF
            elif choice == 1:
                packet[1:2] = rng.choice((b"\xff\xff\xff\x7f", b"\x80\x80\x80\x80\x01", b"\xff\x7f"))
            elif choice == 2:
                packet[1:2] = b"\x80" * rng.randint(1, 6)
            else:
                packet[1:2] = bytes([rng.randrange(256)])
        elif op == 6:  # a whole packet repeated, or two swapped
            if rng.random() < 0.5:
                packets.insert(i, bytes(packet))
            else:
                j = rng.randrange(len(packets))
                packets[i], packets[j] = packets[j], packets[i]
                continue
        else:  # the first byte (type and flags) replaced
            packet[0] = rng.randrange(256)
        packets[i] = bytes(packet)
    return b"".join(packets)


def fuzz_input(seed: int, index: int, sessions: list[list[bytes]]) -> bytes:
    """Input ``index`` of run ``seed``: the same bytes every time."""
    rng = random.Random(f"{seed}:{index}")
    return mutate(rng.choice(sessions), rng)


class FuzzRun:
    """Send inputs over their own connection each, ``width`` at a time; each connection is
    half-closed after its input and must then be closed by the server."""

    def __init__(self, port: int, seed: int, width: int = 32, patience: float = 15.0) -> None:
        self.port = port
        self.seed = seed
        self.width = width
        self.patience = patience
        self.sessions = corpus()
        self.outcomes: Counter[str] = Counter()
        self.answered = 0  # inputs the server sent bytes back for
        self.hung: list[int] = []

    def run(self, count: int) -> None:
        selector = selectors.DefaultSelector()
        pending = iter(range(count))
        live: dict[socket.socket, tuple[int, float]] = {}

        def open_next() -> bool:
            index = next(pending, None)
            if index is None:
                return False
            data = fuzz_input(self.seed, index, self.sessions)
            sock = socket.socket()
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.connect((HOST, self.port))
            sock.setblocking(False)
            try:
                sock.sendall(data)  # small: fits the socket buffer at once
                sock.shutdown(socket.SHUT_WR)
            except (BrokenPipeError, ConnectionResetError, BlockingIOError):
                self.outcomes["reset while sending"] += 1
            live[sock] = (index, time.monotonic() + self.patience)
            selector.register(sock, selectors.EVENT_READ, bytearray())
            return True

        while len(live) < self.width and open_next():
            pass
        while live:
            for key, _ in selector.select(timeout=0.5):
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                try:
                    chunk = sock.recv(65536)
                except ConnectionResetError:
                    chunk, outcome = b"", "reset"
                else:
                    outcome = "closed"
                if chunk:
                    key.data.extend(chunk[:1])
                    continue
                self.outcomes[outcome] += 1
                self.answered += bool(key.data)
                selector.unregister(sock)
                sock.close()
                del live[sock]
                open_next()
            now = time.monotonic()
            for sock, (index, deadline) in list(live.items()):
                if now > deadline:
                    self.hung.append(index)
                    selector.unregister(sock)
                    sock.close()
                    del live[sock]
                    open_next()
        selector.close()

    def describe(self, index: int) -> str:
        return f"input seed={self.seed} index={index}: {fuzz_input(self.seed, index, self.sessions)!r}"


# Sessions of fuzzed client ids end this long after their connection (limits.max_session_expiry caps
# 3.1.1 clean-session-0 sessions too): what the run leaves must be reclaimable, and this reclaims it.
FUZZ_SESSION_EXPIRY_S = 2
FUZZ_TOKEN = "fuzz-admin"
RSS_LEFT_KB = 16 * 1024  # RSS above the baseline once the run's state is reclaimed (measured: see below)


def overview(server: RunningServer) -> dict[str, Any]:
    request = urllib.request.Request(
        f"http://{HOST}:{server.ports['http']}/api/v1/overview",
        headers={"Authorization": f"Bearer {FUZZ_TOKEN}"},
    )
    with urllib.request.urlopen(request, timeout=10) as reply:
        return cast(dict[str, Any], json.load(reply))


def retained_topics(tmp: Path) -> list[str]:
    """Every retained topic the server has written, $-topics included (no wildcard reaches those);
    $SYS is not written."""
    with contextlib.closing(sqlite3.connect(f"file:{tmp / 'data' / 'trimaran.db'}?mode=ro", uri=True)) as db:
        return [topic for (topic,) in db.execute("SELECT topic FROM retained_messages")]


def reclaim(server: RunningServer, tmp: Path, control: Control) -> dict[str, Any]:
    """What fuzzed sessions leave, gone the way an operator's clients would see it go: their
    sessions expire, the retained messages they left are cleared by an empty retained publish.
    Returns the server's overview once only the control client and $SYS are left."""
    deadline = time.monotonic() + FUZZ_SESSION_EXPIRY_S + 60  # patience, not a claim about speed
    while (now := overview(server))["sessions"] > 1 or now["connections"]["mqtt"] > 1:
        assert time.monotonic() < deadline, f"sessions or connections left: {now}"
        time.sleep(0.2)
    time.sleep(0.6)  # the broker writes retained changes in the background: the last ones land
    for topic in retained_topics(tmp):
        control.client.publish(topic, b"", qos=1, retain=True)
    # Cleared once none is on disk and the count in memory (the $SYS ones) holds still.
    previous = None
    while retained_topics(tmp) or (now := overview(server))["retained"] != previous:
        assert time.monotonic() < deadline, f"retained left: {now}, {retained_topics(tmp)[:20]}"
        previous = now["retained"]
        time.sleep(0.3)
    return now


def fuzz(tmp: Path, count: int, seed: int) -> None:
    env = {
        # Fuzzed CONNECTs with user names are failed logins: without this, the per-user-and-address login
        # delay (tested in tests/security) would make each one wait up to auth.login_delay_max_s.
        "TRIMARAN_AUTH__LOGIN_DELAY_INITIAL_S": "0",
        "TRIMARAN_LIMITS__MAX_SESSION_EXPIRY": str(FUZZ_SESSION_EXPIRY_S),
        "TRIMARAN_HTTP__TOKENS": json.dumps([FUZZ_TOKEN]),
    }
    with serving(start(tmp, "mqtt", "http", env=env)) as server:
        control = Control(server.ports["mqtt"])
        try:
            control.check()
            warm = FuzzRun(server.ports["mqtt"], seed + 1)
            warm.run(min(count, 2000))  # the server's code paths and caches loaded before the baseline
            before = reclaim(server, tmp, control)
            baseline = server.status("VmRSS")
            run = FuzzRun(server.ports["mqtt"], seed)
            started = time.monotonic()
            run.run(count)
            took = time.monotonic() - started
            grown = server.status("VmRSS")
            left = overview(server)
            after_state = reclaim(server, tmp, control)
            after, peak = server.status("VmRSS"), server.status("VmHWM")
            print(
                f"\nfuzz seed={seed}: {count} inputs in {took:.1f}s ({count / took:.0f}/s), "
                f"{dict(run.outcomes)}, {run.answered} answered, {len(run.hung)} hung; "
                f"left {left['sessions']} sessions, {left['retained']} retained; "
                f"RSS {baseline} kB before, {grown} kB after the run, peak {peak} kB, "
                f"{after} kB once sessions expired and retained were cleared ({after - baseline:+d} kB)"
            )
            assert not run.hung, "the server kept open: " + "; ".join(map(run.describe, run.hung[:5]))
            control.check()
            assert_serving(server)
            assert "internal error" not in server.output(), server.output()[-5000:]
            # The server's own numbers are exact: nothing of the fuzzed clients is left.
            for key in ("sessions", "subscriptions", "retained", "connections"):
                assert after_state[key] == before[key], (key, before, after_state)
            # RSS is not exact. In-process, after the state is reclaimed no Python object of the run is
            # left (tracemalloc) but SQLAlchemy's bounded statement caches; what RSS keeps is memory
            # the allocators hold: SQLite's page cache of the rows the run wrote and deleted (up to
            # 2 MB a pooled connection), chunks freed to glibc and not returned, pymalloc arenas that
            # a few long-lived objects keep. Measured: +0.1 MB after 2,000 inputs, +3.6 MB after
            # 100,000, +9.4 MB after 1,000,000 (README, "The mutation fuzzer"); without session
            # expiry the same 1,000,000 held +105 MB. At 1,000,000 inputs a leak of 7 bytes an
            # input fails this bound; the short run only catches a gross one.
            assert after - baseline < RSS_LEFT_KB, f"RSS {baseline} kB before, {after} kB after"
        finally:
            control.close()


FUZZ_SEED = int(os.environ.get("TRIMARAN_FUZZ_SEED", "13"))


def test_fuzz_mqtt_short(tmp_path: Path) -> None:
    fuzz(tmp_path, int(os.environ.get("TRIMARAN_FUZZ_SHORT", "2000")), FUZZ_SEED)


@pytest.mark.slow
@pytest.mark.timeout(0)
def test_fuzz_mqtt_long(tmp_path: Path) -> None:
    fuzz(tmp_path, int(os.environ.get("TRIMARAN_FUZZ_INPUTS", "1000000")), FUZZ_SEED + 1000)


def test_a_connection_storm_over_the_accept_rate_waits_and_is_all_let_in(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """limits.accept_rate: 60 MQTT clients at once against 200 a second in bursts of 10. None is
    reset: the ones past the burst wait, unread, and all get their CONNACK, in about a third of a
    second; the log says once that they waited."""
    env = {"TRIMARAN_LIMITS__ACCEPT_RATE": "200", "TRIMARAN_LIMITS__ACCEPT_BURST": "10"}
    with serving(start(tmp_path_factory.mktemp("storm"), "mqtt", env=env)) as running:
        port = running.ports["mqtt"]
        began = time.monotonic()
        socks = [dial(port, "127.0.0.6") for _ in range(60)]
        try:
            for i, sock in enumerate(socks):
                sock.sendall(encode(Connect(client_id=f"storm-{i}"), 4))
            for sock in socks:
                got = MqttReader(sock, 4, False).packet()
                assert isinstance(got, ConnAck) and got.reason_code == 0, got
            took = time.monotonic() - began
        finally:
            for sock in socks:
                sock.close()
        assert 0.15 < took < 5, (took, running.output()[-2000:])
        assert running.output().count("they wait their turn") >= 1
        assert "refused connection" not in running.output()
        assert_serving(running)
