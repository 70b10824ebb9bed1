"""Heartbeats and the missed-heartbeat close on an open connection, over a real socket.

The reader keeps one timeout scope across a run of reads while the connection is open (rather than one
per read); these tests pin what that must keep doing: send heartbeats when idle, keep a connection that
keeps talking, and close one that goes silent for two heartbeat intervals.
"""

from __future__ import annotations

import socket
import time

from tests.support.server import RunningServer
from trimaran.amqp091 import spec
from trimaran.amqp091.frames import (
    NEED_DATA,
    FrameDecoder,
    HeartbeatFrame,
    MethodFrame,
    encode_content,
    encode_method,
)
from trimaran.amqp091.properties import BasicProperties


class RawClient:
    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        self.decoder = FrameDecoder(0)

    def send_method(self, channel: int, method: spec.Method) -> None:
        self.sock.sendall(encode_method(channel, method))

    def frames(self, timeout: float) -> list[object] | None:
        """Frames that arrive within ``timeout`` seconds; ``None`` once the server closed the socket."""
        self.sock.settimeout(timeout)
        try:
            data = self.sock.recv(65536)
        except TimeoutError:
            return []
        if not data:
            return None
        self.decoder.feed(data)
        out: list[object] = []
        while (frame := self.decoder.next_frame()) is not NEED_DATA:
            out.append(frame)
        return out

    def expect_method(self, kind: type[spec.Method]) -> spec.Method:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            for frame in self.frames(1) or []:
                if isinstance(frame, MethodFrame) and isinstance(frame.method, kind):
                    return frame.method
        raise AssertionError(f"no {kind.__name__}")

    def handshake(self, heartbeat: int) -> None:
        self.sock.sendall(spec.PROTOCOL_HEADER)
        self.expect_method(spec.ConnectionStart)
        start_ok = spec.ConnectionStartOk({"product": "test"}, "PLAIN", b"\x00guest\x00guest", "en_US")
        self.send_method(0, start_ok)
        self.expect_method(spec.ConnectionTune)
        self.send_method(0, spec.ConnectionTuneOk(0, 131072, heartbeat))
        self.send_method(0, spec.ConnectionOpen(virtual_host="/"))
        self.expect_method(spec.ConnectionOpenOk)


def test_idle_connection_gets_heartbeats_then_closes_when_silent(amqp_server: RunningServer) -> None:
    client = RawClient(amqp_server.ports["amqp"])
    with client.sock:
        client.handshake(heartbeat=1)
        start = time.monotonic()
        heartbeats = 0
        while time.monotonic() - start < 8:
            frames = client.frames(1)
            if frames is None:
                break
            heartbeats += sum(isinstance(f, HeartbeatFrame) for f in frames)
        closed_after = time.monotonic() - start
    assert heartbeats >= 1  # sent after heartbeat / 2 seconds of not sending
    assert 1.5 <= closed_after < 6, closed_after  # closed after 2 * heartbeat seconds of silence


def test_talking_connection_stays_open_and_gets_heartbeats(amqp_server: RunningServer) -> None:
    client = RawClient(amqp_server.ports["amqp"])
    with client.sock:
        client.handshake(heartbeat=1)
        client.send_method(1, spec.ChannelOpen())
        client.expect_method(spec.ChannelOpenOk)
        publish = encode_content(
            1, spec.BasicPublish(0, "", "no-such-queue", False, False), BasicProperties(), b"x", 131072
        )
        heartbeats = 0
        start = time.monotonic()
        while time.monotonic() - start < 3.5:  # longer than 2 * heartbeat: only our publishes keep it
            client.sock.sendall(publish)
            frames = client.frames(0.2)
            assert frames is not None, "the server closed a connection that kept publishing"
            heartbeats += sum(isinstance(f, HeartbeatFrame) for f in frames)
        assert heartbeats >= 1  # nothing else came our way, so the server kept its side alive too
        client.send_method(0, spec.ConnectionClose(spec.REPLY_SUCCESS, "bye", 0, 0))
        client.expect_method(spec.ConnectionCloseOk)
