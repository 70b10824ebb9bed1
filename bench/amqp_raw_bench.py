"""Broker CPU per message for AMQP 0.9.1 publish -> consume, driven by a cheap raw-socket client.

aio-pika/aiormq costs more CPU per message than our broker does, so on a busy 2-core host its rate
(and with it how many messages each broker read and write carries) moves with the load. This client
uses Trimaran's own codec over blocking sockets and sends a fixed number of publishes per write
(--batch), so the broker's cost per message can be compared between two checkouts (A/B, interleaved).

One transient queue on the default exchange; the consumer uses prefetch 1000 and acks with
`multiple` every 250 deliveries; the publisher keeps at most --window messages undelivered. Broker CPU
(user + system, from /proc) is counted over the messages after a warm-up of a fifth of --messages.

  python bench/amqp_raw_bench.py --messages 30000 --batch 4
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import brokers

from trimaran.amqp091 import spec
from trimaran.amqp091.frames import NEED_DATA, Frame, FrameDecoder, MethodFrame, encode_content, encode_method
from trimaran.amqp091.properties import BasicProperties


class RawClient:
    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.decoder = FrameDecoder(0)

    def frames(self) -> list[Frame]:
        data = self.sock.recv(65536)
        if not data:
            raise EOFError("the broker closed the connection")
        self.decoder.feed(data)
        out: list[Frame] = []
        while (frame := self.decoder.next_frame()) is not NEED_DATA:
            out.append(frame)
        return out

    def expect(self, kind: type[spec.Method]) -> None:
        while True:
            for frame in self.frames():
                if isinstance(frame, MethodFrame) and isinstance(frame.method, kind):
                    return

    def send(self, channel: int, method: spec.Method) -> None:
        self.sock.sendall(encode_method(channel, method))

    def open(self) -> None:
        self.sock.sendall(spec.PROTOCOL_HEADER)
        self.expect(spec.ConnectionStart)
        self.send(0, spec.ConnectionStartOk({"product": "raw"}, "PLAIN", b"\x00guest\x00guest", "en_US"))
        self.expect(spec.ConnectionTune)
        self.send(0, spec.ConnectionTuneOk(0, 131072, 60))
        self.send(0, spec.ConnectionOpen(virtual_host="/"))
        self.expect(spec.ConnectionOpenOk)
        self.send(1, spec.ChannelOpen())
        self.expect(spec.ChannelOpenOk)


def run(port: int, pid: int, messages: int, batch: int, window: int, payload: int) -> dict[str, object]:
    sub = RawClient(port)
    sub.open()
    sub.send(1, spec.QueueDeclare(0, "raw-bench", False, False, False, False, False, {}))
    sub.expect(spec.QueueDeclareOk)
    sub.send(1, spec.BasicQos(0, 1000, False))
    sub.expect(spec.BasicQosOk)
    sub.send(1, spec.BasicConsume(0, "raw-bench", "c", False, False, False, False, {}))
    sub.expect(spec.BasicConsumeOk)
    pub = RawClient(port)
    pub.open()
    warmup = messages // 5
    total = messages + warmup
    delivered = [0]
    marks: dict[str, tuple[float, float]] = {}
    done = threading.Event()

    def consume() -> None:
        n = 0
        while n < total:
            for frame in sub.frames():
                if isinstance(frame, MethodFrame) and isinstance(frame.method, spec.BasicDeliver):
                    n += 1
                    if n % 250 == 0:
                        sub.send(1, spec.BasicAck(frame.method.delivery_tag, True))
                    if n == warmup:
                        marks["start"] = (time.monotonic(), brokers.cpu_seconds([pid]))
            delivered[0] = n
        marks["end"] = (time.monotonic(), brokers.cpu_seconds([pid]))
        done.set()

    consumer = threading.Thread(target=consume, name="raw-consumer", daemon=True)
    consumer.start()
    publish = spec.BasicPublish(0, "", "raw-bench", False, False)
    chunk = encode_content(1, publish, BasicProperties(delivery_mode=1), b"x" * payload, 131072) * batch
    sent = 0
    while sent < total:
        while sent - delivered[0] > window:
            time.sleep(0.0005)
        pub.sock.sendall(chunk)
        sent += batch
    if not done.wait(120):
        raise SystemExit(f"only {delivered[0]} of {total} messages arrived")
    (w0, c0), (w1, c1) = marks["start"], marks["end"]
    return {
        "messages": messages,
        "batch": batch,
        "deliver_rate": round(messages / (w1 - w0)),
        "broker_us_per_msg": round((c1 - c0) / messages * 1e6, 1),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--messages", type=int, default=30000)
    p.add_argument("--batch", type=int, default=4, help="publishes per socket write (default 4)")
    p.add_argument("--window", type=int, default=400, help="max undelivered messages (default 400)")
    p.add_argument("--payload", type=int, default=64)
    args = p.parse_args()
    with brokers.trimaran() as broker:
        if broker.amqp is None:
            raise SystemExit("no AMQP listener")
        result = run(broker.amqp[1], broker.pid, args.messages, args.batch, args.window, args.payload)
    print(json.dumps({"broker": "trimaran", "version": broker.version, **result}))


if __name__ == "__main__":
    main()
