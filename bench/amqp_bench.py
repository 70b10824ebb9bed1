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
import contextlib
import json
import os
import struct
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aio_pika
import aiormq
import aiormq.abc
from aio_pika.abc import AbstractIncomingMessage
from pamqp.commands import Basic

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common

TIMEOUT_SLACK = 40  # seconds beyond duration + drain before the run is cut off
STAMP = struct.Struct("!QQ")  # sequence, send time (CLOCK_MONOTONIC ns)
monotonic_ns = time.monotonic_ns


class Client:
    """The two client stacks behind one small interface: `aio-pika` (its public API) or `aiormq` (the
    engine under aio-pika, without aio-pika's Message and robust-channel layers: less client CPU)."""

    def __init__(self, kind: str, url: str) -> None:
        self.kind = kind
        self.url = url
        self.conns: list[Any] = []
        self.queue_name = ""
        self.publish: Callable[[bytes], Awaitable[None]] = self._not_set_up

    async def _not_set_up(self, body: bytes) -> None:
        raise RuntimeError("setup() first")

    def describe(self) -> str:
        return f"aio-pika {aio_pika.__version__}" + (" (aiormq API)" if self.kind == "aiormq" else "")

    async def open(self) -> None:
        connect = aio_pika.connect if self.kind == "aio-pika" else aiormq.connect
        self.conns = [await connect(self.url), await connect(self.url)]  # publisher, consumer

    async def setup(
        self, queue: str, durable: bool, confirm: bool, prefetch: int, on_body: Callable[[bytes], bool]
    ) -> None:
        pub_conn, sub_conn = self.conns
        self.queue_name = queue
        persistent = 2 if confirm else 1
        if self.kind == "aio-pika":
            sub_ch = await sub_conn.channel()
            await sub_ch.set_qos(prefetch_count=prefetch)
            self._queue = await sub_ch.declare_queue(queue, durable=durable, auto_delete=False)

            async def on_message(message: AbstractIncomingMessage) -> None:
                if on_body(message.body):
                    await message.ack(multiple=True)

            self._tag = await self._queue.consume(on_message, no_ack=False)
            pub_ch = await pub_conn.channel(publisher_confirms=confirm)
            exchange = pub_ch.default_exchange
            mode = aio_pika.DeliveryMode(persistent)

            async def publish_pika(body: bytes) -> None:
                await exchange.publish(aio_pika.Message(body, delivery_mode=mode), routing_key=queue)

            self.publish = publish_pika
            return
        sub_ch = await sub_conn.channel()
        await sub_ch.basic_qos(prefetch_count=prefetch)
        await sub_ch.queue_declare(queue, durable=durable, auto_delete=False)

        async def on_delivered(message: aiormq.abc.DeliveredMessage) -> None:
            if on_body(message.body):
                await sub_ch.basic_ack(message.delivery_tag, multiple=True)

        self._sub_ch = sub_ch
        self._tag = (await sub_ch.basic_consume(queue, on_delivered, no_ack=False)).consumer_tag
        pub_ch = await pub_conn.channel(publisher_confirms=confirm)
        props = Basic.Properties(delivery_mode=persistent)

        async def publish_rmq(body: bytes) -> None:
            result = await pub_ch.basic_publish(body, routing_key=queue, properties=props)
            if isinstance(result, Basic.Nack):
                raise ConnectionError("publish nacked by the broker")

        self.publish = publish_rmq

    async def teardown(self, queue: str) -> None:
        if self.kind == "aio-pika":
            await self._queue.cancel(self._tag)
            await self._queue.delete(if_unused=False, if_empty=False)
        else:
            await self._sub_ch.basic_cancel(self._tag)
            await self._sub_ch.queue_delete(queue)

    async def close(self) -> None:
        for conn in self.conns:
            await conn.close()


async def run(args: argparse.Namespace) -> dict[str, Any]:
    confirm = args.mode == "confirm"
    queue_name = f"bench-{os.getpid()}-{int(time.time() * 1000) % 100000}"
    pad = bytes(args.payload - STAMP.size)
    delivered = 0
    latencies: list[int] = []
    ack_every = max(1, args.prefetch // 4)
    published = 0
    stop = asyncio.Event()
    client = Client(args.client, args.url)
    await client.open()
    try:

        def on_body(body: bytes) -> bool:
            """Count one delivery; True when it is time for a cumulative ack."""
            nonlocal delivered
            now = monotonic_ns()
            delivered += 1
            seq, ts = STAMP.unpack_from(body)
            if seq % args.sample_every == 0:
                latencies.append(now - ts)
            return bool(delivered % ack_every == 0)

        await client.setup(
            queue_name, durable=confirm, confirm=confirm, prefetch=args.prefetch, on_body=on_body
        )

        async def publisher() -> None:
            # A done-callback per publish, not asyncio.wait() over the pending set: that re-registers
            # a callback on every pending future per wake-up, O(window) per message.
            nonlocal published
            publish = client.publish
            room = asyncio.Event()
            inflight = 0
            errors: list[BaseException] = []

            def done(fut: asyncio.Future[Any]) -> None:
                nonlocal inflight, published
                inflight -= 1
                if fut.cancelled():
                    errors.append(asyncio.CancelledError())
                elif (exc := fut.exception()) is not None:
                    errors.append(exc)
                else:
                    published += 1
                room.set()

            seq = 0
            while not stop.is_set():
                if errors:
                    raise errors[0]  # a nack or a closed channel must fail the run
                while inflight < args.window:
                    body = STAMP.pack(seq, monotonic_ns()) + pad
                    seq += 1
                    inflight += 1
                    asyncio.ensure_future(publish(body)).add_done_callback(done)
                room.clear()
                await room.wait()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(10):
                    while inflight:
                        room.clear()
                        await room.wait()

        def snapshot() -> tuple[common.Mark, int, int]:
            return common.Mark.now(args.watch_pid), published, delivered

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
        await client.teardown(queue_name)
    finally:
        await client.close()

    window_s = common.window_s(s0[0], s1[0])
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
        "latency_ms": common.latency_ms(lat, {"p50": 50, "p99": 99}),
        **common.cpu_fields(s0[0], s1[0], args.watch_pid),
        "loop": type(asyncio.get_running_loop()).__module__.split(".")[0],
        "client": client.describe(),
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
    p.add_argument(
        "--client",
        choices=["aio-pika", "aiormq"],
        default="aio-pika",
        help="aio-pika's public API, or aiormq (the engine under it, less client CPU)",
    )
    p.add_argument("--payload", type=int, default=64, help="body bytes, >= 16 (default 64)")
    common.add_timed_run_args(p, timeout_slack=TIMEOUT_SLACK)
    p.add_argument("--window", type=int, default=100, help="outstanding publishes (default 100)")
    p.add_argument("--prefetch", type=int, default=1000, help="consumer basic.qos prefetch (default 1000)")
    p.add_argument("--sample-every", type=int, default=16, help="latency of every k-th message")
    p.add_argument("--client-only", action="store_true", help="measure the client codec alone, no broker")
    args = p.parse_args(argv)
    if args.payload < STAMP.size:
        p.error(f"--payload must be at least {STAMP.size}")
    common.check_timed_run_args(p, args)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.client_only:
        print(json.dumps(client_only(args.payload)))
        return 0
    return common.print_bounded_run(
        lambda: run(args),
        args,
        timeout_slack=TIMEOUT_SLACK,
        errors=(OSError, ConnectionError, TimeoutError, aio_pika.exceptions.AMQPError),
        describe={"mode": args.mode},
    )


if __name__ == "__main__":
    sys.exit(main())
