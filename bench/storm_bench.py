"""Many MQTT connections on one node: connect them, let them idle, drop them all, bring them back at
once (issue 47).

For each broker (`--brokers trimaran,mosquitto`), pinned to CPU 0, `--procs` generator processes on
CPU 1 hold `--connections` MQTT 3.1.1 clients between them, spread over `--sources` loopback source
addresses (127.0.0.2, 127.0.0.3, ...). Each client keeps a session (clean session off) and
subscribes to its own topic at QoS 1. The phases:

- `connect`: every client connects and subscribes, at most `--inflight` handshakes open per process;
  the time until all are subscribed, the broker's CPU until it settles (saving sessions included),
  and its RSS growth per connection then.
- `idle`: for `--idle` seconds each client sends a PINGREQ once per `--keep-alive` seconds (spread
  evenly) and reads its PINGRESP; the broker's CPU over that window, and pings unanswered. The
  clients keep that cadence from the end of `connect` on, through the wait for the RSS to settle:
  a client silent for 1.5 keep-alives is rightly closed (MQTT 3.1.2.10).
- `drop`: every client's socket is reset at once (SO_LINGER 0: a network that went away); then one
  publisher sends a QoS 1 message to every client's topic and has each acknowledged, so every session
  holds one queued message. With `--half-open` the sockets are left open and silent instead (a
  network that went away without the broker seeing it): the message goes to the old connection,
  unacknowledged, and the storm's connections take each session over from it.
- `storm`: every client connects again at once (the network is back), with the same client id and
  clean session off; the time until all have their CONNACK with the session present and their queued
  message, and how many did not.

The brokers hold at most their open files limit of connections (20,000 on the machine this was made
on: `ulimit -Hn`), which bounds `--connections`.

    python bench/storm_bench.py [--brokers trimaran,mosquitto] [--connections 19000] [--idle 120]

Prints one JSON object per broker.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import selectors
import socket
import struct
import sys
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import brokers  # noqa: E402
from idle_bench import _read_exactly, settle_rss  # noqa: E402
from tls_bench import BROKER_CPU, GEN_CPU  # noqa: E402

from trimaran.mqtt.codec import encode  # noqa: E402
from trimaran.mqtt.packets import MQTT_3_1_1, Connect, Publish, Subscribe, SubscriptionOptions  # noqa: E402

PINGREQ = b"\xc0\x00"
TOPIC = "storm/{}"


def _connect(client_id: str, keep_alive: int, clean: bool = False) -> bytes:
    """MQTT 3.1.1 CONNECT (clean session off unless ``clean``), from Trimaran's own codec."""
    return encode(Connect(clean_start=clean, keep_alive=keep_alive, client_id=client_id), MQTT_3_1_1)


def _subscribe(topic: str, qos: int = 1) -> bytes:
    return encode(Subscribe(1, [(topic, SubscriptionOptions(qos))]), MQTT_3_1_1)


def _publish(topic: str, payload: bytes, packet_id: int | None = None) -> bytes:
    """QoS 1 with a packet id, else QoS 0."""
    return encode(Publish(topic, payload, qos=0 if packet_id is None else 1, packet_id=packet_id), MQTT_3_1_1)


def _packets(buffer: bytearray) -> list[tuple[int, bytes]]:
    """The whole packets at the front of ``buffer``, taken out of it."""
    out: list[tuple[int, bytes]] = []
    while len(buffer) >= 2:
        size, shift, at = 0, 0, 1
        while True:
            if at >= len(buffer):
                return out
            byte = buffer[at]
            size |= (byte & 0x7F) << shift
            at += 1
            if not byte & 0x80:
                break
            shift += 7
        if len(buffer) < at + size:
            return out
        out.append((buffer[0], bytes(buffer[at : at + size])))
        del buffer[: at + size]
    return out


class _Client:
    __slots__ = ("buffer", "done", "index", "received", "session_present", "sock")

    def __init__(self, index: int) -> None:
        self.index = index
        self.sock: socket.socket | None = None
        self.buffer = bytearray()
        self.done = False
        self.session_present = False
        self.received = False


def _source(sources: int, index: int) -> str:
    return f"127.0.0.{2 + index % sources}"


def _connect_all(
    clients: list[_Client],
    address: tuple[str, int],
    sources: int,
    keep_alive: int,
    inflight: int,
    storm: bool,
) -> dict[str, Any]:
    """Connect every client; done at SUBACK (first time) or at its queued message (the storm)."""
    sel = selectors.DefaultSelector()
    waiting = list(reversed(clients))
    open_now = 0
    done = refused = 0
    started = time.monotonic()
    deadline = started + 300
    while (waiting or open_now) and time.monotonic() < deadline:
        while waiting and open_now < inflight:
            client = waiting.pop()
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind((_source(sources, client.index), 0))
            sock.setblocking(False)
            sock.connect_ex(address)
            client.sock, client.buffer, client.done = sock, bytearray(), False
            sel.register(sock, selectors.EVENT_WRITE, client)
            open_now += 1
        for key, events in sel.select(1.0):
            client = key.data
            sock = client.sock
            assert sock is not None
            if events & selectors.EVENT_WRITE:  # connected (or failed): send the handshake
                error = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                if error:
                    sel.unregister(sock)
                    sock.close()
                    waiting.append(client)  # try again, as a device would
                    open_now -= 1
                    refused += 1
                    continue
                hello = _connect(f"storm-{client.index}", keep_alive)
                if not storm:
                    hello += _subscribe(TOPIC.format(client.index))
                sock.sendall(hello)
                sel.modify(sock, selectors.EVENT_READ, client)
                continue
            try:
                data = sock.recv(65536)
            except ConnectionError:
                data = b""
            if not data:
                sel.unregister(sock)
                sock.close()
                waiting.append(client)
                open_now -= 1
                refused += 1
                continue
            client.buffer += data
            for first, body in _packets(client.buffer):
                kind = first >> 4
                if kind == 2:  # CONNACK
                    client.session_present = bool(body[0] & 1)
                elif kind == 9 and not storm:  # SUBACK
                    client.done = True
                elif kind == 3:  # PUBLISH: the queued message; acknowledged
                    topic_len = struct.unpack_from("!H", body)[0]
                    packet_id = body[2 + topic_len : 4 + topic_len]
                    sock.sendall(b"\x40\x02" + packet_id)
                    client.received = True
                    client.done = True
            if client.done:
                sel.unregister(sock)
                open_now -= 1
                done += 1
    elapsed = time.monotonic() - started
    sel.close()
    return {
        "done": done,
        "seconds": elapsed,
        "retries": refused,
        "session_present": sum(c.session_present for c in clients),
        "received": sum(c.received for c in clients),
    }


def _ping(
    clients: list[_Client],
    keep_alive: int,
    until: float,
    first: int = 0,
    interrupt: Connection | None = None,
) -> dict[str, Any]:
    """Each connected client pings once per ``keep_alive`` seconds, spread evenly, the rotation
    starting at ``first``, until the monotonic time ``until`` or, with ``interrupt``, until a command
    arrives there; pings sent and answered, and where the rotation stopped."""
    sel = selectors.DefaultSelector()
    clients = [client for client in clients if client.sock is not None]
    for client in clients:
        client.buffer = bytearray()
        sel.register(client.sock, selectors.EVENT_READ, client)  # type: ignore[arg-type]
    step = keep_alive / max(len(clients), 1)
    started = time.monotonic()
    sent = answered = 0
    while (now := time.monotonic()) < until and not (interrupt is not None and interrupt.poll()):
        due = int((now - started) / step)
        while sent <= due:
            sock = clients[(first + sent) % len(clients)].sock
            assert sock is not None
            sock.send(PINGREQ)
            sent += 1
        for key, _ in sel.select(min(step, 0.05)):
            client = key.data
            client.buffer += client.sock.recv(65536)
            answered += sum(1 for first_byte, _ in _packets(client.buffer) if first_byte == 0xD0)
    if interrupt is None:
        time.sleep(1.0)  # the last answers
    for key in list(sel.get_map().values()):
        client = key.data
        try:
            client.buffer += client.sock.recv(65536, socket.MSG_DONTWAIT)
        except BlockingIOError:
            continue
        answered += sum(1 for first_byte, _ in _packets(client.buffer) if first_byte == 0xD0)
    sel.close()
    return {"pings": sent, "answered": answered, "next": (first + sent) % max(len(clients), 1)}


def _drop(clients: list[_Client], stale: list[socket.socket] | None = None) -> None:
    """Reset every client's socket, or with ``stale`` leave it open and silent there."""
    for client in clients:
        if client.sock is not None:
            if stale is not None:
                stale.append(client.sock)
            else:
                client.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                client.sock.close()  # RST
            client.sock = None


def _worker(pipe: Connection, indexes: range, address: tuple[str, int], a: dict[str, Any]) -> None:
    os.sched_setaffinity(0, {GEN_CPU})
    clients = [_Client(i) for i in indexes]
    stale: list[socket.socket] = []  # --half-open: the sockets the broker still thinks are there
    rotation = 0  # the next client to ping, so that the idle phase keeps the held cadence
    while True:
        command = pipe.recv()
        if command == "connect" or command == "storm":
            result = _connect_all(
                clients, address, a["sources"], a["keep_alive"], a["inflight"], command == "storm"
            )
            if command == "connect":
                pipe.send(result)
                # Hold the connections alive until the next command (the broker settling).
                rotation = _ping(clients, a["keep_alive"], math.inf, interrupt=pipe)["next"]
                continue
        elif command == "idle":
            result = _ping(clients, a["keep_alive"], time.monotonic() + a["idle"], rotation)
        elif command == "drop":
            _drop(clients, stale if a["half_open"] else None)
            result = {}
        else:
            _drop(clients)
            for sock in stale:
                sock.close()
            return
        pipe.send(result)


def _queue_one_each(address: tuple[str, int], count: int) -> float:
    """One QoS 1 message to every client's topic, each acknowledged: seconds taken."""
    started = time.monotonic()
    sock = socket.create_connection(address, timeout=60)
    sock.sendall(_connect("storm-pub", 60, clean=True))
    _read_exactly(sock, 4)
    pending = bytearray()
    acked = 0
    for start in range(0, count, 500):
        batch = b"".join(
            _publish(TOPIC.format(i), b"queued", packet_id=i % 65535 + 1)
            for i in range(start, min(start + 500, count))
        )
        sock.sendall(batch)
        while acked < min(start + 500, count):
            pending += sock.recv(65536)
            acked += sum(1 for first, _ in _packets(pending) if first == 0x40)
    sock.close()
    return time.monotonic() - started


def _phase(pipes: list[Connection], command: str) -> list[dict[str, Any]]:
    for pipe in pipes:
        pipe.send(command)
    return [pipe.recv() for pipe in pipes]


def _sum(results: list[dict[str, Any]], key: str) -> int:
    return sum(int(r[key]) for r in results)


def measure(name: str, a: argparse.Namespace) -> dict[str, Any]:
    os.sched_setaffinity(0, {BROKER_CPU})  # the broker and every thread it starts inherit it
    with brokers.start(name) as running:
        os.sched_setaffinity(0, {GEN_CPU})
        if running.mqtt is None:
            return {"broker": name, "error": "no MQTT listener"}
        context = multiprocessing.get_context("spawn")
        share = vars(a)
        pipes, workers = [], []
        per = -(-a.connections // a.procs)
        for p in range(a.procs):
            here, there = context.Pipe()
            indexes = range(p * per, min((p + 1) * per, a.connections))
            worker = context.Process(target=_worker, args=(there, indexes, running.mqtt, share), daemon=True)
            worker.start()
            pipes.append(here)
            workers.append(worker)
        try:
            rss_before = settle_rss(running.pid, 5)
            cpu0 = brokers.cpu_seconds([running.pid])
            connected = _phase(pipes, "connect")
            rss_after = settle_rss(running.pid, 15)
            connect_cpu = brokers.cpu_seconds([running.pid]) - cpu0  # (saving the sessions included)
            cpu0, wall0 = brokers.cpu_seconds([running.pid]), time.monotonic()
            pinged = _phase(pipes, "idle")
            idle_cpu = (brokers.cpu_seconds([running.pid]) - cpu0) / (time.monotonic() - wall0)
            _phase(pipes, "drop")
            time.sleep(2.0)  # the broker sees the resets
            queued_s = _queue_one_each(running.mqtt, a.connections)
            cpu0 = brokers.cpu_seconds([running.pid])
            stormed = _phase(pipes, "storm")
            storm_cpu = brokers.cpu_seconds([running.pid]) - cpu0
        finally:
            for pipe in pipes:
                pipe.send("stop")
            for worker in workers:
                worker.join(30)
        return {
            "broker": name,
            "version": running.version,
            "connections": a.connections,
            "drop": "half-open" if a.half_open else "reset",
            "connected": _sum(connected, "done"),
            "connect_s": round(max(r["seconds"] for r in connected), 2),
            "connect_cpu_s": round(connect_cpu, 2),
            "kib_per_connection": round((rss_after - rss_before) / a.connections, 2),
            "idle_s": a.idle,
            "pings": _sum(pinged, "pings"),
            "pings_unanswered": _sum(pinged, "pings") - _sum(pinged, "answered"),
            "idle_cpu_pct": round(100 * idle_cpu, 2),
            "queue_s": round(queued_s, 2),
            "storm_s": round(max(r["seconds"] for r in stormed), 2),
            "storm_back": _sum(stormed, "done"),
            "storm_session_present": _sum(stormed, "session_present"),
            "storm_received": _sum(stormed, "received"),
            "storm_retries": _sum(stormed, "retries"),
            "storm_cpu_s": round(storm_cpu, 2),
        }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--brokers", default="trimaran,mosquitto")
    parser.add_argument("--connections", type=int, default=19_000)
    parser.add_argument("--procs", type=int, default=4)
    parser.add_argument("--sources", type=int, default=8, help="loopback source addresses")
    parser.add_argument("--inflight", type=int, default=1000, help="handshakes open at once per process")
    parser.add_argument("--keep-alive", type=int, default=60)
    parser.add_argument("--idle", type=float, default=120.0, help="seconds of keep-alive pings")
    parser.add_argument("--half-open", action="store_true", help="leave the dropped sockets open, silent")
    a = parser.parse_args()
    for name in a.brokers.split(","):
        try:
            result = measure(name.strip(), a)
        except brokers.BrokerUnavailable as exc:
            result = {"broker": name, "error": str(exc)}
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
