"""Durable queue throughput: publish + consume + ack, 256 B payloads.

In process (the queue manager alone, no network, no protocol): N publishers and M consumers.

    python bench/queue_bench.py                                  # SQLite file in a temp dir
    python bench/queue_bench.py postgresql://user@host/db -n 50000 -p 8 -c 4 [--shared]

Against RabbitMQ in the same session (``--compare``): each broker is started on free loopback ports
and driven by the same raw MQTT client (``mqtt_bench.py --durable``: 4 QoS 1 publishers, each with 100
unacknowledged PUBLISHes, one QoS 1 subscriber with a persistent session PUBACKing every message):

- Trimaran on SQLite (WAL, synchronous=FULL) and on PostgreSQL (a throwaway cluster with fsync on):
  ``$queue/`` topics, PUBACK after the commit, the subscriber's PUBACK acks;
- RabbitMQ with its MQTT plugin: QoS 1 publishes are persistent messages PUBACKed on the publisher
  confirm, into the durable queue of a persistent session;
- RabbitMQ over AMQP 0.9.1 (``amqp_bench.py --mode confirm``: durable queue, persistent messages,
  publisher confirms, manual acks), for reference: that Python client is the limit there.

    python bench/queue_bench.py --compare --runs 3 --out bench/results/DATE-queues.json

Every publish waits for its commit (group commit). Consumers ack each delivery (``ack_nowait``: in
the next group commit, as a front end does for PUBACK / basic.ack) and return the credit. Prints
msgs/s end to end and the publish latency percentiles.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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
    manager = QueueManager(storage, QueueSettings(), settings, shared=args.shared)
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


# -- side by side with RabbitMQ ----------------------------------------------------------------------

HERE = Path(__file__).resolve().parent
TARGETS = ["trimaran-sqlite", "trimaran-postgresql", "rabbitmq", "rabbitmq-amqp"]


@contextlib.contextmanager
def start_target(name: str) -> Iterator[tuple[Any, list[int]]]:
    """The running broker and the pids whose CPU counts as the broker's."""
    sys.path.insert(0, str(HERE))
    sys.path.insert(0, str(HERE.parent))
    import brokers

    if name == "trimaran-sqlite":
        with brokers.trimaran(python=sys.executable) as running:
            yield running, [running.pid]
    elif name == "trimaran-postgresql":
        from tests.support.postgres import PostgresCluster, find_bindir

        bindir = find_bindir()
        if bindir is None:
            raise brokers.BrokerUnavailable("PostgreSQL is not installed")
        cluster = PostgresCluster(bindir, fsync=True).start()
        try:
            url = cluster.create_database("bench")
            with brokers.trimaran(python=sys.executable, extra_args=["--storage", url]) as running:
                yield running, [running.pid, *_postgres_pids(cluster.datadir)]
        finally:
            cluster.stop()
    else:
        with brokers.rabbitmq(mqtt=True) as running:
            yield running, [running.pid]


def _postgres_pids(datadir: Path) -> list[int]:
    """The postmaster (its children are counted with it): the database's CPU is the broker's too."""
    try:
        return [int((datadir / "postmaster.pid").read_text().split()[0])]
    except (OSError, ValueError, IndexError):
        return []


def bench_once(name: str, running: Any, watch: list[int], args: argparse.Namespace) -> dict[str, Any]:
    common = ["--payload", str(args.size), "--duration", str(args.duration), "--warmup", str(args.warmup)]
    common += [arg for pid in watch for arg in ("--watch-pid", str(pid))]
    if name == "rabbitmq-amqp":
        host, port = running.amqp
        cmd = [sys.executable, str(HERE / "amqp_bench.py"), "--url", f"amqp://guest:guest@{host}:{port}/"]
        cmd += ["--mode", "confirm", "--client", "aiormq", *common]
    else:
        host, port = running.mqtt
        cmd = [sys.executable, str(HERE / "mqtt_bench.py"), "--host", host, "--port", str(port), "--durable"]
        cmd += ["--scenario", "fan-in", "--qos", "1", "--clients", str(args.publishers), *common]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=args.duration + 120, check=False)
    if out.returncode != 0:
        return {"error": (out.stderr or out.stdout)[-800:]}
    result: dict[str, Any] = json.loads(out.stdout)
    return result


def compare(args: argparse.Namespace) -> None:
    """Every broker runs for the whole session and the runs go round-robin (run 1 of each, then run
    2 of each, ...), so on a shared host each broker meets about the same load from other jobs."""
    names = [n.strip() for n in args.targets.split(",") if n.strip()]
    results: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    running: dict[str, tuple[Any, list[int]]] = {}
    with contextlib.ExitStack() as stack:
        for name in names:
            # rabbitmq-amqp drives the same RabbitMQ (its AMQP port) when rabbitmq runs too
            shared = "rabbitmq" if name == "rabbitmq-amqp" and "rabbitmq" in running else None
            try:
                running[name] = running[shared] if shared else stack.enter_context(start_target(name))
            except Exception as exc:  # a broker that cannot start is reported, the others still run
                results[name].append({"error": str(exc)[-800:]})
        import brokers  # on sys.path once start_target ran

        for i in range(args.runs):
            for name, (broker, watch) in running.items():
                idle = sorted({p for n, (_, w) in running.items() if w != watch for p in w})
                t0, c0 = time.monotonic(), brokers.cpu_seconds(idle)
                r = bench_once(name, broker, watch, args)
                # the other brokers are idle meanwhile, but not free (RabbitMQ's schedulers spin)
                r["idle_brokers_cpu"] = round((brokers.cpu_seconds(idle) - c0) / (time.monotonic() - t0), 3)
                results[name].append(r)
                rate = r.get("deliver_rate", r.get("error"))
                print(f"{name} run {i + 1}: {rate} msg/s", file=sys.stderr)
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=2))
    print(compare_table(results))


def _median(runs: list[dict[str, Any]]) -> dict[str, Any] | None:
    ok = sorted((r for r in runs if "deliver_rate" in r), key=lambda r: float(r["deliver_rate"]))
    return ok[len(ok) // 2] if ok else None


def compare_table(results: dict[str, list[dict[str, Any]]]) -> str:
    base = _median(results.get("rabbitmq", []))
    lines = [
        "| broker | delivered msg/s (median; min-max) | published msg/s | lost | latency p50 / p99 ms "
        "| broker CPU (cores) | broker CPU µs/msg | generator CPU | other CPU on host (of it: idle brokers) "
        "| vs RabbitMQ (MQTT) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, runs in results.items():
        m = _median(runs)
        if m is None:
            lines.append(f"| {name} | not available: {runs[-1].get('error', '?')[:80]!r} | | | | | | | | |")
            continue
        rates = [float(r["deliver_rate"]) for r in runs if "deliver_rate" in r]
        lat = m.get("latency_ms", {})
        ratio = f"{m['deliver_rate'] / base['deliver_rate']:.2f}" if base and base["deliver_rate"] else "-"
        spread = f"{min(rates):,.0f}-{max(rates):,.0f}"
        cpu = m.get("broker_cpu")
        per_message = f"{cpu / m['deliver_rate'] * 1e6:.0f}" if cpu and m["deliver_rate"] else "-"
        idle = f" ({m['idle_brokers_cpu']})" if "idle_brokers_cpu" in m else ""
        lines.append(
            f"| {name} | {m['deliver_rate']:,.0f} ({spread}) | {m['pub_rate']:,.0f} "
            f"| {m.get('lost', 0)} | {lat.get('p50') or 0:.1f} / {lat.get('p99') or 0:.1f} "
            f"| {m.get('broker_cpu')} | {per_message} | {m.get('gen_cpu')} | {m.get('other_cpu')}{idle} "
            f"| {ratio} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("url", nargs="?", help="SQLAlchemy URL; default: a temporary SQLite file")
    parser.add_argument("--compare", action="store_true", help="run the brokers side by side (see above)")
    parser.add_argument("--targets", default=",".join(TARGETS), help=f"--compare: of {','.join(TARGETS)}")
    parser.add_argument("--runs", type=int, default=3, help="--compare: runs per broker (median reported)")
    parser.add_argument("--duration", type=float, default=10.0, help="--compare: seconds per run")
    parser.add_argument("--warmup", type=float, default=2.0, help="--compare: seconds left out of the rates")
    parser.add_argument("--out", help="--compare: write every run as JSON here")
    parser.add_argument("--table", metavar="JSON", help="print the --compare table again from an --out file")
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
        "--shared", action="store_true", help="queues.shared (PostgreSQL): the claim path of several nodes"
    )
    parser.add_argument(
        "--switch-interval",
        type=float,
        default=None,
        help="sys.setswitchinterval: how soon the writer thread gets the GIL back after each I/O",
    )
    args = parser.parse_args()
    if args.table:
        print(compare_table(json.loads(Path(args.table).read_text())))
        return
    if args.compare:
        if "-p" not in sys.argv and "--publishers" not in sys.argv:
            args.publishers = 4
        compare(args)
        return
    if args.switch_interval is not None:
        sys.setswitchinterval(args.switch_interval)
    anyio.run(run, args, backend_options={"use_uvloop": args.uvloop})


if __name__ == "__main__":
    main()
