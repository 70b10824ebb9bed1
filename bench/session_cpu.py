"""Broker CPU a persistent MQTT session costs, phase by phase (issue 47).

For each broker (`--brokers trimaran,mosquitto`), pinned to CPU 0 with this process on CPU 1:

- `connect`: `--sessions` MQTT 3.1.1 clients (clean session off, 200 handshakes open at once, spread
  over 8 loopback source addresses) connect and subscribe to a topic of their own at QoS 1;
- `drop`: every socket is reset, and one publisher sends each topic a QoS 1 message (acknowledged:
  the broker keeps it in the offline session);
- `storm`: every client connects again, reads its queued message and acknowledges it.

Each phase's broker CPU is read from /proc after a 2 s pause, so that what the phase set off
(Trimaran saves changed sessions twice a second) is counted with it. CPU, not time: the time of a
phase is the generator's pace as much as the broker's.

    python bench/session_cpu.py [--brokers trimaran,mosquitto] [--sessions 4000] [--rounds 1]

Prints one JSON object per broker and round: microseconds of broker CPU a session in each phase.
"""

from __future__ import annotations

import argparse
import json
import os
import selectors
import socket
import struct
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # `trimaran` from this checkout

from trimaran.mqtt.codec import encode
from trimaran.mqtt.packets import MQTT_3_1_1, Connect, Packet, PubAck, Publish, Subscribe, SubscriptionOptions

sys.path.insert(0, str(Path(__file__).resolve().parent))
import brokers

BROKER_CPU, GEN_CPU = 0, 1
OPEN_AT_ONCE = 200
SOURCES = 8
SETTLE_S = 2.0
PAYLOAD = b"x" * 16


def _packet(packet: Packet) -> bytes:
    return encode(packet, MQTT_3_1_1)


def _connect(i: int) -> bytes:
    return _packet(Connect(client_id=f"session-{i}", clean_start=False, keep_alive=600))


def _wave(
    address: tuple[str, int],
    count: int,
    first: Callable[[int], bytes],
    expect: Callable[[int], int],
    then: Callable[[int], bytes] | None,
) -> list[socket.socket]:
    """Client ``i`` sends ``first(i)`` and is done after ``expect(i)`` bytes back (then it sends
    ``then(i)``)."""
    sel = selectors.DefaultSelector()
    got: dict[socket.socket, list[int]] = {}
    waiting = 0

    def read(timeout: float) -> None:
        nonlocal waiting
        for key, _ in sel.select(timeout):
            sock = key.fileobj
            assert isinstance(sock, socket.socket)
            state = got[sock]
            data = sock.recv(65536)
            if not data:
                raise RuntimeError(f"the broker closed client {state[0]}")
            state[1] += len(data)
            if state[1] >= expect(state[0]):
                sel.unregister(sock)
                waiting -= 1
                if then is not None:
                    sock.sendall(then(state[0]))

    for i in range(count):
        sock = socket.socket()
        sock.bind((f"127.0.0.{2 + i % SOURCES}", 0))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.connect(address)
        sock.sendall(first(i))
        sock.setblocking(False)
        got[sock] = [i, 0]
        sel.register(sock, selectors.EVENT_READ)
        waiting += 1
        while waiting >= OPEN_AT_ONCE:
            read(1.0)
    deadline = time.monotonic() + 120
    while waiting and time.monotonic() < deadline:
        read(1.0)
    if waiting:
        raise RuntimeError(f"{waiting} clients not answered in 120 s")
    return list(got)


def measure(name: str, sessions: int) -> dict[str, object]:
    os.sched_setaffinity(0, {BROKER_CPU})  # the broker and every thread it starts inherit it
    with brokers.start(name) as running:
        os.sched_setaffinity(0, {GEN_CPU})
        if running.mqtt is None:
            return {"broker": name, "error": "no MQTT listener"}
        address = running.mqtt
        pids = [running.pid]
        spent: dict[str, float] = {}

        def phase(what: str, run: Callable[[], object]) -> None:
            before = brokers.cpu_seconds(pids)
            run()
            time.sleep(SETTLE_S)
            spent[what] = (brokers.cpu_seconds(pids) - before) / sessions * 1e6

        def subscribe(i: int) -> bytes:
            return _connect(i) + _packet(
                Subscribe(packet_id=1, subscriptions=[(f"session/{i}", SubscriptionOptions(qos=1))])
            )

        clients: list[socket.socket] = []
        phase("connect", lambda: clients.extend(_wave(address, sessions, subscribe, lambda i: 4 + 5, None)))

        def drop() -> None:
            for sock in clients:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                sock.close()
            with socket.create_connection(address) as publisher:
                publisher.sendall(_packet(Connect(client_id="session-publisher", keep_alive=600)))
                publisher.recv(4)
                messages = (
                    Publish(topic=f"session/{i}", payload=PAYLOAD, qos=1, packet_id=i % 65535 + 1)
                    for i in range(sessions)
                )
                publisher.sendall(b"".join(map(_packet, messages)))
                acked = 0
                while acked < 4 * sessions:
                    acked += len(publisher.recv(65536))

        phase("drop", drop)
        back: list[socket.socket] = []

        def queued(i: int) -> int:  # the CONNACK and the queued PUBLISH (its session's first id: 1)
            return 4 + len(_packet(Publish(topic=f"session/{i}", payload=PAYLOAD, qos=1, packet_id=1)))

        def storm() -> None:
            back.extend(_wave(address, sessions, _connect, queued, lambda i: _packet(PubAck(packet_id=1))))

        phase("storm", storm)
        for sock in back:
            sock.close()
        return {
            "broker": name,
            "version": running.version,
            "sessions": sessions,
            "cpu_us_a_session": {what: round(us, 1) for what, us in spent.items()},
        }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--brokers", default="trimaran,mosquitto")
    parser.add_argument("--sessions", type=int, default=4000)
    parser.add_argument("--rounds", type=int, default=1, help="the brokers in turn, this many times")
    a = parser.parse_args()
    for _ in range(a.rounds):
        for name in a.brokers.split(","):
            print(json.dumps(measure(name, a.sessions)), flush=True)


if __name__ == "__main__":
    main()
