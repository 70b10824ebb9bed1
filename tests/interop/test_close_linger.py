"""After a protocol error the server's last words reach the peer (issues 18 and 22): it stops
writing, half-closes and drains what the peer still sends, so the peer reads the DISCONNECT's
reason code (MQTT 5) or connection.close (AMQP 0.9.1) and then an orderly end of stream, never a
reset, even when it had more bytes on the way when the error happened. After a close the client
began, the end of the TCP connection is the client's, as with RabbitMQ."""

from __future__ import annotations

import socket
import struct
import time

from pamqp import commands, frame

from tests.interop.test_amqp091_conformance import RawClient
from tests.support.server import RunningServer

JUNK = 256 * 1024  # what a busy client still has on the way when the error happens


def read_all(sock: socket.socket, timeout: float = 5.0) -> bytes:
    """Everything until the server's end of stream (a reset raises ConnectionResetError)."""
    sock.settimeout(timeout)
    data = b""
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            return data
        data += chunk


def mqtt5_connect(client_id: bytes) -> bytes:
    variable = b"\x00\x04MQTT\x05\x02\x00\x3c\x00"  # clean start, keep-alive 60, no properties
    payload = struct.pack(">H", len(client_id)) + client_id
    body = variable + payload
    return bytes([0x10, len(body)]) + body


def mqtt_publish_qos0(topic: bytes, size: int) -> bytes:
    body = struct.pack(">H", len(topic)) + topic + b"\x00" + b"x" * size  # v5: empty properties
    length = len(body)
    encoded = b""
    while True:
        byte, length = length % 128, length // 128
        encoded += bytes([byte | (0x80 if length else 0)])
        if not length:
            break
    return b"\x30" + encoded + body


def test_mqtt_protocol_error_disconnect_survives_data_in_flight(amqp_server: RunningServer) -> None:
    sock = socket.create_connection(("127.0.0.1", amqp_server.ports["mqtt"]), timeout=5)
    try:
        sock.sendall(mqtt5_connect(b"linger-test"))
        connack = sock.recv(4)
        assert connack[0] == 0x20
        sock.recv(65536)  # the rest of CONNACK (its properties)
        junk = b"".join(mqtt_publish_qos0(b"linger/junk", 1000) for _ in range(JUNK // 1000))
        # A second CONNECT is a protocol error (0x82); the publishes behind it are in flight.
        sock.sendall(mqtt5_connect(b"linger-test") + junk)
        data = read_all(sock)
        assert data[:1] == b"\xe0", data[:16]  # DISCONNECT
        assert data[2] == 0x82  # reason code: protocol error
        # Half-closed, not closed: the server still reads (and drops) what we send for a moment.
        sock.sendall(b"\x00" * 1024)
    finally:
        sock.close()


def test_amqp091_connection_error_close_survives_frames_in_flight(amqp_server: RunningServer) -> None:
    client = RawClient(amqp_server.ports["amqp"])
    try:
        declare = frame.marshal(commands.Queue.Declare(queue="linger", passive=True), 1)
        # A second channel.open is a connection error (504); declares follow it in the same write.
        client.sock.sendall(frame.marshal(commands.Channel.Open(), 1) + declare * (JUNK // len(declare)))
        client.sock.settimeout(5)
        while True:
            kind, _payload, whole = client.raw_frame()
            close = frame.unmarshal(whole)[2] if kind == 1 else None
            if isinstance(close, commands.Connection.Close):
                break
        assert struct.unpack_from(">H", whole, 1)[0] == 0
        assert close.reply_code == 504
        client.send(0, commands.Connection.CloseOk())
        start = time.monotonic()
        assert read_all(client.sock) == b""  # then an orderly end of stream
        assert time.monotonic() - start < 3
    finally:
        client.close()


HEARTBEAT_FRAME = b"\x08\x00\x00\x00\x00\x00\x00\xce"


def seconds_until_closed(sock: socket.socket, timeout: float) -> float:
    """How long until the server ends the connection (an end of stream, or RabbitMQ's reset);
    only heartbeat frames may come meanwhile."""
    start = time.monotonic()
    sock.settimeout(timeout)
    while True:
        try:
            data = sock.recv(65536)
        except ConnectionResetError:
            data = b""
        if not data:
            return time.monotonic() - start
        assert data.replace(HEARTBEAT_FRAME, b"") == b"", data


def test_amqp091_close_ok_leaves_the_socket_to_the_client(amqp_port: int) -> None:
    """After the close-ok to the client's connection.close the server waits for the client to close
    the socket, and closes it itself only after a timeout, as RabbitMQ does (it waits the negotiated
    heartbeat, here 3 s, and resets; Trimaran waits its close timeout, 5 s, and ends the stream). A
    client that found the socket shut first could report its own clean close as an error
    (amqp091-go's ``TestConcurrentClose`` got ``501 EOF``)."""
    client = RawClient(amqp_port, heartbeat=3)
    try:
        client.send(0, commands.Connection.Close(200, "bye", 0, 0))
        client.expect(commands.Connection.CloseOk)
        waited = seconds_until_closed(client.sock, timeout=15)
        assert 2.5 < waited < 8
    finally:
        client.close()
