"""Durable queue throughput: N publishers and M consumers in one process, publish + consume + ack.

    python bench/queue_bench.py                                  # SQLite file in a temp dir
    python bench/queue_bench.py postgresql://user@host/db -n 50000 -p 8 -c 4

Every publish waits for its commit (group commit). Consumers ack each delivery (``ack_nowait``: in
the next group commit, as a front end does for PUBACK / basic.ack) and return the credit. Prints
msgs/s end to end and the publish latency percentiles.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import anyio

from trimaran.broker.message import Message
from trimaran.config import QueueSettings, StorageSettings
from trimaran.queue import ConsumerHandle, QueueDelivery, QueueManager
from trimaran.storage.store import Storage


class Sink:
    def __init__(self, id: str) -> None:
        self.id = id
        self.handle: ConsumerHandle | None = None
        self.received = 0

    def deliver(self, delivery: QueueDelivery) -> None:
        self.received += 1
        assert self.handle is not None
        self.handle.ack_nowait(delivery.offset)
        self.handle.add_credit(1)


async def run(args: argparse.Namespace) -> None:
    url = args.url
    if url is None:
        url = f"sqlite:///{Path(tempfile.mkdtemp(prefix='qbench-')) / 'bench.db'}"
    storage = Storage.from_url(url, sqlite_synchronous=args.synchronous)
    storage.migrate()
    settings = StorageSettings(commit_interval_ms=args.interval_ms, commit_batch_max=args.batch_max)
    manager = QueueManager(storage, QueueSettings(), settings)
    payload = b"x" * args.size
    latencies: list[float] = []
    queue = f"bench{int(time.time())}"
    async with manager.running():
        await manager.declare(queue)
        sinks = []
        for i in range(args.consumers):
            sink = Sink(f"c{i}")
            sink.handle = manager.consume(queue, sink)
            sink.handle.add_credit(args.credit)
            sinks.append(sink)
        per = args.messages // args.publishers
        total = per * args.publishers

        async def publisher(n: int) -> None:
            for _ in range(per):
                t0 = time.perf_counter()
                await manager.publish(queue, Message(topic=f"$queue/{queue}", payload=payload, qos=1))
                latencies.append(time.perf_counter() - t0)

        start = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for n in range(args.publishers):
                tg.start_soon(publisher, n)
        published = time.perf_counter() - start
        while sum(s.received for s in sinks) < total:
            await anyio.sleep(0.001)
        consumed = time.perf_counter() - start
        while manager.info(queue).depth:
            await anyio.sleep(0.001)
        drained = time.perf_counter() - start
    storage.close()
    latencies.sort()

    def p(q: float) -> float:
        return latencies[min(len(latencies) - 1, int(q * len(latencies)))] * 1000

    print(
        f"{storage.dialect}: {total} msgs x {args.size} B, {args.publishers} publishers, "
        f"{args.consumers} consumers\n"
        f"  publish {total / published:,.0f} msgs/s, end to end (consumed) {total / consumed:,.0f} msgs/s, "
        f"all acks applied {total / drained:,.0f} msgs/s\n"
        f"  publish latency p50 {p(0.5):.2f} ms  p99 {p(0.99):.2f} ms  mean "
        f"{statistics.fmean(latencies) * 1000:.2f} ms\n"
        f"  transactions {manager.writer.transactions}, submissions {manager.writer.submissions}, "
        f"writer busy {manager.writer.busy_s:.1f} s of {drained:.1f} s"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("url", nargs="?", help="SQLAlchemy URL; default: a temporary SQLite file")
    parser.add_argument("-n", "--messages", type=int, default=20_000)
    parser.add_argument("-p", "--publishers", type=int, default=8)
    parser.add_argument("-c", "--consumers", type=int, default=4)
    parser.add_argument("-s", "--size", type=int, default=256)
    parser.add_argument("--credit", type=int, default=100)
    parser.add_argument("--interval-ms", type=float, default=2.0)
    parser.add_argument("--batch-max", type=int, default=2000)
    parser.add_argument("--synchronous", default="full", choices=["off", "normal", "full"])
    parser.add_argument("--uvloop", action="store_true")
    parser.add_argument(
        "--switch-interval",
        type=float,
        default=None,
        help="sys.setswitchinterval: how soon the writer thread gets the GIL back after each I/O",
    )
    args = parser.parse_args()
    if args.switch_interval is not None:
        sys.setswitchinterval(args.switch_interval)
    anyio.run(run, args, backend_options={"use_uvloop": args.uvloop})


if __name__ == "__main__":
    main()
