"""AMQP 0.9.1 publish -> consume throughput with aio-pika as the client.

One publisher connection and one consumer connection in this process, on uvloop when installed, one
queue on the default exchange:

  transient  non-durable queue, non-persistent messages, no publisher confirms
  confirm    durable queue, persistent messages (delivery mode 2), publisher confirms

The publisher keeps --window publishes outstanding (awaiting their confirm in `confirm` mode, their
write otherwise). The consumer uses manual acks with basic.qos prefetch --prefetch and acks with
`multiple` every prefetch/4 messages. Rates are counted over [--warmup, --duration]; afterwards the
consumer drains (bounded) and what never arrived is `lost`. Latency: a send timestamp in the body.

aio-pika is much slower than the brokers it drives, so the client cost is kept in view:
- `gen_cpu` (cores used by this process over the steady window): near 1.0 means the client is the limit;
- `--client-only` measures, without any broker, how many publish frame sets (method + header + body)
  per second pamqp (aio-pika's codec) can marshal, and deliver frame sets it can unmarshal: an upper
  bound on what this client can push through one core, whatever the broker.

Prints one JSON object. Example:

  python bench/amqp_bench.py --url amqp://guest:guest@127.0.0.1:5672/ --mode confirm --watch-pid 1234
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import struct
import sys
import time
from pathlib import Path
from typing import Any

import aio_pika
from aio_pika.abc import AbstractIncomingMessage

sys.path.insert(0, str(Path(__file__).resolve().parent))
import brokers

STAMP = struct.Struct("!QQ")  # sequence, send time (CLOCK_MONOTONIC ns)
monotonic_ns = time.monotonic_ns


def percentile(sorted_values: list[int], q: float) -> float | None:
    if not sorted_values:
        return None
    k = min(len(sorted_values) - 1, max(0, round(q / 100 * (len(sorted_values) - 1))))
    return sorted_values[k] / 1e6


async def run(args: argparse.Namespace) -> dict[str, Any]:
    confirm = args.mode == "confirm"
    queue_name = f"bench-{os.getpid()}-{int(time.time() * 1000) % 100000}"
    pad = bytes(args.payload - STAMP.size)
    pub_conn = await aio_pika.connect(args.url)
    sub_conn = await aio_pika.connect(args.url)
    delivered = 0
    latencies: list[int] = []
    ack_every = max(1, args.prefetch // 4)
    try:
        sub_ch = await sub_conn.channel()
        await sub_ch.set_qos(prefetch_count=args.prefetch)
        queue = await sub_ch.declare_queue(queue_name, durable=confirm, auto_delete=False)

        async def on_message(message: AbstractIncomingMessage) -> None:
            nonlocal delivered
            now = monotonic_ns()
            delivered += 1
            seq, ts = STAMP.unpack_from(message.body)
            if seq % args.sample_every == 0:
                latencies.append(now - ts)
            if delivered % ack_every == 0:
                await message.ack(multiple=True)

        tag = await queue.consume(on_message, no_ack=False)

        pub_ch = await pub_conn.channel(publisher_confirms=confirm)
        exchange = pub_ch.default_exchange
        mode = aio_pika.DeliveryMode.PERSISTENT if confirm else aio_pika.DeliveryMode.NOT_PERSISTENT
        published = 0
        stop = asyncio.Event()

        async def publisher() -> None:
            nonlocal published
            pending: set[asyncio.Future[Any]] = set()
            seq = 0
            while not stop.is_set():
                while len(pending) < args.window:
                    body = STAMP.pack(seq, monotonic_ns()) + pad
                    seq += 1
                    pending.add(
                        asyncio.ensure_future(
                            exchange.publish(
                                aio_pika.Message(body, delivery_mode=mode), routing_key=queue_name
                            )
                        )
                    )
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for fut in done:
                    fut.result()  # a nack or a closed channel must fail the run
                published += len(done)
            if pending:
                done, _ = await asyncio.wait(pending, timeout=10)
                published += sum(1 for f in done if not f.exception())

        def snapshot() -> tuple[int, int, int, float, float, float]:
            return (
                monotonic_ns(),
                published,
                delivered,
                time.process_time(),
                brokers.cpu_seconds(args.watch_pid) if args.watch_pid else 0.0,
                brokers.host_busy_seconds(),
            )

        pub_task = asyncio.create_task(publisher())
        await asyncio.sleep(args.warmup)
        s0 = snapshot()
        await asyncio.sleep(args.duration - args.warmup)
        s1 = snapshot()
        stop.set()
        await pub_task
        deadline = time.monotonic() + args.drain
        last, last_change = -1, time.monotonic()
        while delivered < published and time.monotonic() < deadline:
            if delivered != last:
                last, last_change = delivered, time.monotonic()
            elif time.monotonic() - last_change > args.idle:
                break
            await asyncio.sleep(0.05)
        await queue.cancel(tag)
        await queue.delete(if_unused=False, if_empty=False)
    finally:
        await pub_conn.close()
        await sub_conn.close()

    window_s = (s1[0] - s0[0]) / 1e9
    lat = sorted(latencies)
    return {
        "mode": args.mode,
        "payload": args.payload,
        "window": args.window,
        "prefetch": args.prefetch,
        "duration_s": args.duration,
        "steady_window_s": round(window_s, 3),
        "pub_rate": round((s1[1] - s0[1]) / window_s),
        "deliver_rate": round((s1[2] - s0[2]) / window_s),
        "published": published,
        "delivered": delivered,
        "lost": max(0, published - delivered),
        "latency_samples": len(lat),
        "latency_ms": {
            "p50": percentile(lat, 50),
            "p99": percentile(lat, 99),
            "max": lat[-1] / 1e6 if lat else None,
            "mean": round(statistics.fmean(lat) / 1e6, 3) if lat else None,
        },
        "gen_cpu": round((s1[3] - s0[3]) / window_s, 3),
        "broker_cpu": round((s1[4] - s0[4]) / window_s, 3) if args.watch_pid else None,
        "other_cpu": round(((s1[5] - s0[5]) - (s1[3] - s0[3]) - (s1[4] - s0[4])) / window_s, 3),
        "host_cpus": os.cpu_count(),
        "broker_rss_kib": brokers.rss_kib(args.watch_pid) if args.watch_pid else None,
        "loop": type(asyncio.get_running_loop()).__module__.split(".")[0],
        "client": f"aio-pika {aio_pika.__version__}",
        **({"broker": args.label} if args.label else {}),
    }


def client_only(payload: int, seconds: float = 2.0) -> dict[str, Any]:
    """Codec cost of the client alone (no broker, no socket): pamqp marshal of publish frame sets and
    unmarshal of deliver frame sets, one core."""
    from pamqp import body, commands, frame, header

    data = bytes(payload)
    props = commands.Basic.Properties(delivery_mode=2)

    def marshal_one() -> bytes:
        return b"".join(
            (
                frame.marshal(commands.Basic.Publish(exchange="", routing_key="bench-q"), 1),
                frame.marshal(header.ContentHeader(0, len(data), props), 1),
                frame.marshal(body.ContentBody(data), 1),
            )
        )

    deliver = b"".join(
        (
            frame.marshal(commands.Basic.Deliver("ctag", 1, False, "", "bench-q"), 1),
            frame.marshal(header.ContentHeader(0, len(data), props), 1),
            frame.marshal(body.ContentBody(data), 1),
        )
    )

    def unmarshal_one() -> None:
        pos = 0
        while pos < len(deliver):
            consumed, _channel, _frame = frame.unmarshal(deliver[pos:])
            pos += consumed

    out: dict[str, Any] = {
        "mode": "client-only",
        "payload": payload,
        "client": f"pamqp (aio-pika {aio_pika.__version__})",
    }
    for name, fn in (("marshal_publish_per_s", marshal_one), ("unmarshal_deliver_per_s", unmarshal_one)):
        n = 0
        t0 = time.perf_counter()
        c0 = time.process_time()
        while time.perf_counter() - t0 < seconds:
            for _ in range(1000):
                fn()
            n += 1000
        out[name] = round(n / (time.process_time() - c0))
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        epilog="Prints one JSON object. Rates are msg/s; latencies ms; *_cpu in cores.",
    )
    p.add_argument("--url", default="amqp://guest:guest@127.0.0.1:5672/")
    p.add_argument("--mode", choices=["transient", "confirm"], default="transient")
    p.add_argument("--payload", type=int, default=64, help="body bytes, >= 16 (default 64)")
    p.add_argument("--duration", type=float, default=10.0)
    p.add_argument("--warmup", type=float, default=2.0)
    p.add_argument("--drain", type=float, default=20.0)
    p.add_argument("--idle", type=float, default=2.0)
    p.add_argument("--window", type=int, default=100, help="outstanding publishes (default 100)")
    p.add_argument("--prefetch", type=int, default=1000, help="consumer basic.qos prefetch (default 1000)")
    p.add_argument("--sample-every", type=int, default=16, help="latency of every k-th message")
    p.add_argument("--watch-pid", type=int, action="append", default=[], help="broker pid to measure CPU of")
    p.add_argument("--label", help="broker name to put in the result")
    p.add_argument("--client-only", action="store_true", help="measure the client codec alone, no broker")
    p.add_argument("--timeout", type=float, help="hard limit in seconds (default duration + drain + 40)")
    p.add_argument("--no-uvloop", action="store_true")
    args = p.parse_args(argv)
    if args.payload < STAMP.size:
        p.error(f"--payload must be at least {STAMP.size}")
    if args.warmup >= args.duration:
        p.error("--warmup must be shorter than --duration")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.client_only:
        print(json.dumps(client_only(args.payload)))
        return 0
    timeout = args.timeout or args.duration + args.drain + 40

    async def bounded() -> dict[str, Any]:
        async with asyncio.timeout(timeout):
            return await run(args)

    runner: Any = asyncio.run
    if not args.no_uvloop:
        try:
            import uvloop

            runner = uvloop.run
        except ImportError:
            pass
    try:
        result = runner(bounded())
    except (OSError, ConnectionError, TimeoutError, aio_pika.exceptions.AMQPError) as exc:
        print(json.dumps({"error": f"{type(exc).__name__}: {exc}", "mode": args.mode}))
        return 1
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
