"""AMQP 1.0 send -> receive throughput with python-qpid-proton's reactor as the client.

One sender connection and one receiver connection in this process (one proton Container), one
address (a queue by default):

  settled    pre-settled transfers both ways (snd-settle-mode settled: at most once)
  unsettled  the sender waits for each accepted disposition (for a queue: after the durable commit)
             and the receiver accepts every message (at least once)

The sender sends whenever it has link credit (the broker's credit window is the only limit); the
receiver grants --prefetch credit. The clock runs from the first send to the last receive of --count
messages. Latency: a send timestamp in the body, measured on receipt.

proton's Python reactor costs CPU too, so `gen_cpu` (cores this process used) is reported: near 1.0
means the client is the limit, not the broker.

Prints one JSON object. Examples:

  python bench/amqp1_bench.py --broker trimaran --mode unsettled
  python bench/amqp1_bench.py --url 127.0.0.1:5672 --address orders --mode settled --watch-pid 1234
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import struct
import sys
import time
from pathlib import Path
from typing import Any

from proton import Message
from proton.handlers import MessagingHandler
from proton.reactor import AtMostOnce, Container

sys.path.insert(0, str(Path(__file__).resolve().parent))
import brokers
import common

STAMP = struct.Struct("!QQ")  # sequence, send time (CLOCK_MONOTONIC ns)


class Bench(MessagingHandler):
    def __init__(self, url: str, address: str, count: int, size: int, settled: bool, prefetch: int) -> None:
        super().__init__(prefetch=prefetch, auto_accept=not settled)
        self.url = url
        self.address = address
        self.count = count
        self.pad = b"x" * max(0, size - STAMP.size)
        self.settled = settled
        self.sent = 0
        self.accepted = 0
        self.received = 0
        self.first_send = 0.0
        self.last_receive = 0.0
        self.latencies: list[float] = []
        self.errors: list[str] = []
        self.receiver_ready = False
        self.sender: Any = None
        self.timeout = 120.0  # the whole run; the connections close and the run reports an error
        self.started = 0.0
        self.conns: list[Any] = []

    def on_start(self, event: Any) -> None:
        self.container = event.container
        self.started = time.monotonic()
        self.last_progress = (time.monotonic(), 0)
        event.container.schedule(1.0, self)
        options = AtMostOnce() if self.settled else None
        rconn = event.container.connect(self.url)
        sconn = event.container.connect(self.url)
        self.conns = [rconn, sconn]
        event.container.create_receiver(rconn, self.address, options=options, name="bench-receiver")
        event.container.create_sender(sconn, self.address, options=options, name="bench-sender")

    def on_link_opened(self, event: Any) -> None:
        if event.receiver is not None:
            self.receiver_ready = True  # send only once the receiver is attached (topics keep nothing)
            self._pump()

    def on_sendable(self, event: Any) -> None:
        self.sender = event.sender
        self._pump()

    def _pump(self) -> None:
        sender = self.sender
        if not self.receiver_ready or sender is None:
            return
        if not self.first_send:
            self.first_send = time.monotonic()
        while sender.credit and self.sent < self.count:
            body = STAMP.pack(self.sent, time.monotonic_ns()) + self.pad
            sender.send(Message(body=body))
            self.sent += 1

    def on_accepted(self, event: Any) -> None:
        self.accepted += 1

    def on_message(self, event: Any) -> None:
        body = event.message.body
        _, sent_ns = STAMP.unpack_from(bytes(body[: STAMP.size]))
        if self.received % 10 == 0:
            self.latencies.append((time.monotonic_ns() - sent_ns) / 1e6)
        self.received += 1
        if self.received >= self.count:
            self.last_receive = time.monotonic()
            if self.settled or self.accepted >= self.count:
                self._finish()

    def on_settled(self, event: Any) -> None:
        if self.received >= self.count and self.accepted >= self.count:
            self._finish()

    def on_timer_task(self, event: Any) -> None:
        """Topic messages a slow receiver could not take are dropped by design: once everything
        is sent and nothing has arrived for 2 s, stop and report what was lost."""
        if not self.conns:
            return
        now = time.monotonic()
        if now - self.started > self.timeout:
            self.errors.append(f"timed out after {self.timeout:g}s")
            self._finish()
            return
        if self.received != self.last_progress[1]:
            self.last_progress = (now, self.received)
        elif self.sent >= self.count and now - self.last_progress[0] > 2.0:
            self.last_receive = self.last_progress[0]
            self._finish()
            return
        self.container.schedule(1.0, self)

    def _finish(self) -> None:
        for conn in self.conns:
            conn.close()
        self.conns = []

    def on_link_error(self, event: Any) -> None:
        self.errors.append(str(event.link.remote_condition))
        self._finish()

    def on_transport_error(self, event: Any) -> None:
        self.errors.append(str(event.transport.condition))


def run(url: str, args: argparse.Namespace, watch: list[int]) -> dict[str, Any]:
    settled = args.mode == "settled"
    bench = Bench(url, args.address, args.count, args.size, settled, args.prefetch)
    bench.timeout = args.timeout
    container = Container(bench)
    container.timeout = args.timeout
    start, t0 = common.Mark.now(watch), time.monotonic()
    container.run()
    end = common.Mark.now(watch)
    wall = common.window_s(start, end)
    cpu, broker_cpu, host_cpu = end.gen - start.gen, end.broker - start.broker, end.host - start.host
    elapsed = (bench.last_receive or time.monotonic()) - (bench.first_send or t0)
    lat = sorted(bench.latencies)
    return {
        "mode": args.mode,
        "address": args.address,
        "size": args.size,
        "count": args.count,
        "sent": bench.sent,
        "received": bench.received,
        "lost": bench.sent - bench.received,
        "accepted": bench.accepted if not settled else None,
        "msg_per_s": round(bench.received / elapsed) if elapsed > 0 else 0,
        "elapsed_s": round(elapsed, 3),
        "latency_ms_p50": round(statistics.median(lat), 2) if lat else None,
        "latency_ms_p99": round(lat[int(len(lat) * 0.99)], 2) if lat else None,
        "gen_cpu": round(cpu / wall, 2) if wall else None,
        "broker_cpu": round(broker_cpu / wall, 2) if watch and wall else None,
        "host_cpu": round(host_cpu / wall, 2) if wall else None,
        "errors": bench.errors,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--url", help="host:port of a running broker (else --broker starts one)")
    parser.add_argument("--broker", default="trimaran", help="broker to start when --url is not given")
    parser.add_argument("--mode", choices=("settled", "unsettled"), default="unsettled")
    parser.add_argument(
        "--address", help="default: queue 'bench' ('/queue/bench' on rabbitmq-amqp1); or topic://..."
    )
    parser.add_argument("--count", type=int, default=20000)
    parser.add_argument("--size", type=int, default=100, help="message body bytes")
    parser.add_argument("--prefetch", type=int, default=500, help="receiver credit window")
    parser.add_argument("--timeout", type=float, default=120.0)
    parser.add_argument("--watch-pid", type=int, action="append", default=[], help="broker pid for CPU")
    args = parser.parse_args(argv)
    with contextlib.ExitStack() as stack:
        url = args.url
        watch = list(args.watch_pid)
        broker = "external"
        if url is None:
            running = stack.enter_context(brokers.start(args.broker))
            if running.amqp is None:
                print(json.dumps({"broker": running.name, "error": "no AMQP listener"}))
                return 1
            url = f"{running.amqp[0]}:{running.amqp[1]}"
            if args.address is None and running.name == "rabbitmq":
                args.address = "/queue/bench"  # the 3.x plugin's address of a queue it declares
            watch.append(running.pid)
            broker = f"{running.name} {running.version}"
        if args.address is None:
            args.address = "bench"
        result = {"broker": broker, **run(url, args, watch)}
    print(json.dumps(result))
    return 0 if not result["errors"] and result["received"] == args.count else 1


if __name__ == "__main__":
    sys.exit(main())
