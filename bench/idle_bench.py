"""Memory per idle MQTT connection: the broker's RSS growth per connected, subscribed, silent client.

For each broker (`--brokers trimaran,mosquitto,rabbitmq`) this starts it, reads its RSS, opens
`--connections` MQTT 3.1.1 clients from this process (raw sockets: CONNECT with keep-alive 600 and
one SUBSCRIBE each, answered before the next batch), lets the broker settle, reads the RSS again, and
reports the difference per connection. The clients stay silent, which is what most device fleets look
like between messages. RSS is memory the kernel gives the broker, so unlike throughput it is not
skewed by a busy host.

    python bench/idle_bench.py --connections 5000 --brokers trimaran,mosquitto

Prints one JSON object per broker.
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # `trimaran` from this checkout

from trimaran.mqtt.codec import encode
from trimaran.mqtt.packets import MQTT_3_1_1, Connect, Subscribe, SubscriptionOptions

sys.path.insert(0, str(Path(__file__).resolve().parent))
import brokers

BATCH = 200


def connect_packet(client_id: str, keep_alive: int = 600) -> bytes:
    """An MQTT 3.1.1 CONNECT (clean session), from Trimaran's own codec."""
    return encode(Connect(keep_alive=keep_alive, client_id=client_id), MQTT_3_1_1)


def subscribe_packet(packet_id: int, topic: str) -> bytes:
    """An MQTT 3.1.1 SUBSCRIBE to one filter at QoS 0."""
    return encode(Subscribe(packet_id, [(topic, SubscriptionOptions(0))]), MQTT_3_1_1)


def _read_exactly(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("broker closed the connection")
        data += chunk
    return data


def open_clients(address: tuple[str, int], count: int) -> list[socket.socket]:
    clients: list[socket.socket] = []
    for start in range(0, count, BATCH):
        batch = []
        for i in range(start, min(start + BATCH, count)):
            sock = socket.create_connection(address, timeout=30)
            sock.sendall(connect_packet(f"idle-{i}") + subscribe_packet(1, f"idle/{i}/cmd"))
            batch.append(sock)
        for sock in batch:
            connack = _read_exactly(sock, 4)
            if connack[0] != 0x20 or connack[3] != 0:
                raise ConnectionError(f"CONNACK refused: {connack!r}")
            suback = _read_exactly(sock, 5)
            if suback[0] != 0x90:
                raise ConnectionError(f"no SUBACK: {suback!r}")
        clients.extend(batch)
    return clients


def settle_rss(pid: int, seconds: float) -> int:
    """The broker's RSS once it stops changing much (or after ``seconds``)."""
    deadline = time.monotonic() + seconds
    last = brokers.rss_kib([pid])
    while time.monotonic() < deadline:
        time.sleep(0.5)
        now = brokers.rss_kib([pid])
        if abs(now - last) < 64:
            return now
        last = now
    return last


def measure(name: str, connections: int) -> dict[str, object]:
    with brokers.BROKERS[name]() as running:
        if running.mqtt is None:
            return {"broker": name, "error": "no MQTT listener"}
        before = settle_rss(running.pid, 5)
        started = time.monotonic()
        clients = open_clients(running.mqtt, connections)
        connect_s = time.monotonic() - started
        try:
            after = settle_rss(running.pid, 10)
        finally:
            for sock in clients:
                sock.close()
        return {
            "broker": name,
            "version": running.version,
            "connections": connections,
            "rss_before_kib": before,
            "rss_after_kib": after,
            "kib_per_connection": round((after - before) / connections, 2),
            "connect_rate_per_s": round(connections / connect_s),
        }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--connections", type=int, default=5000)
    parser.add_argument("--brokers", default="trimaran,mosquitto")
    args = parser.parse_args()
    for name in args.brokers.split(","):
        try:
            result = measure(name.strip(), args.connections)
        except brokers.BrokerUnavailable as exc:
            result = {"broker": name, "error": str(exc)}
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
