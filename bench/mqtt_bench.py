"""MQTT load generator: fan-in, fan-out and fixed-rate latency runs against any MQTT broker.

The client side is Trimaran's own sans-IO codec (`trimaran.mqtt.codec`) over raw asyncio streams, on
uvloop when installed, so that the generator costs as little as Python allows:

- reads are 64 KiB chunks fed to one `Decoder` per connection; every whole packet is decoded;
- a connection's outgoing packets (PUBLISH batches, PUBACKs for a chunk) go out in one write;
- PUBLISH bytes come from a template that `encode()` produced once (checked by decoding it back);
  per message only the packet identifier and the 16-byte stamp (publisher, sequence, send time in
  CLOCK_MONOTONIC ns) change; PUBACKs are encoded once for every packet identifier;
- QoS 1 publishers keep a window of unacknowledged PUBLISHes (default 100) instead of waiting for each.

Scenarios (one run per invocation, bounded by --duration plus a bounded drain, and a hard timeout):

  fan-in   --clients N publishers -> 1 subscriber, all on one topic, as fast as allowed
  fan-out  1 publisher -> --clients N subscribers
  latency  1 publisher -> 1 subscriber at a fixed --rate; p50/p99 end to end (all messages sampled)

Throughput runs are closed-loop by default: publishers pause while more than --e2e-window messages
(default 500) are published but not yet delivered to the slowest subscriber, so the number is what the
broker sustains, not how it behaves while drowning; --e2e-window 0 floods instead.

Rates are counted over the steady window [--warmup, --duration] after the publishers start. Then the
publishers stop, QoS 1 publishers wait for their PUBACKs, and the subscribers drain until every
message arrived or nothing came for --idle seconds; what never arrived is `lost`. `gen_cpu` and
`broker_cpu` are CPU seconds per wall second over the steady window (1.0 = one core busy): a generator
near 1.0 means the number measures the generator, not the broker. `other_cpu` is what the rest of the
host used meanwhile (other jobs on a shared machine): above ~0.2 the run was disturbed.

Prints one JSON object on stdout. Example:

  python bench/mqtt_bench.py --port 1883 --scenario fan-in --qos 1 --clients 4 --watch-pid 1234
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import struct
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # `trimaran` from this checkout

from trimaran.mqtt.codec import NEED_DATA, Decoder, encode
from trimaran.mqtt.packets import (
    MQTT_3_1_1,
    MQTT_5,
    ConnAck,
    Connect,
    Disconnect,
    Packet,
    PubAck,
    Publish,
    SubAck,
    Subscribe,
    SubscriptionOptions,
)

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common

TIMEOUT_SLACK = 30  # seconds beyond duration + drain before the run is cut off
T = TypeVar("T", bound=Packet)
CHUNK = 64 * 1024
STAMP = struct.Struct("!IIQ")  # publisher index, sequence number, send time (monotonic ns)
MAX_PACKET = 1 << 24
monotonic_ns = time.monotonic_ns


@dataclass
class Counter:
    published: int = 0  # publishers: PUBLISHes written
    acked: int = 0  # QoS 1 publishers: PUBACKs received
    delivered: int = 0  # subscribers: PUBLISHes received
    first_ns: int = 0
    last_ns: int = 0
    latencies_ns: list[int] = field(default_factory=list)


class Flow:
    """End-to-end flow control, possible because this process runs both ends: publishers pause while more
    than `limit` messages are published but not yet delivered to the slowest subscriber, so a run
    measures what the broker sustains instead of how it drowns (0 = no limit, flood). A gap that does
    not close for `forgive_s` is taken as dropped by the broker and stops counting against the limit.
    """

    def __init__(self, limit: int, pubs: list[Counter], subs: list[Counter], forgive_s: float = 0.2) -> None:
        self.limit = limit
        self.pubs = pubs
        self.subs = subs
        self.forgive_s = forgive_s
        self.forgiven = 0
        self.waiting = False
        self.event = asyncio.Event()

    def _gap(self) -> int:
        return sum(c.published for c in self.pubs) - min(c.delivered for c in self.subs) - self.forgiven

    def room(self) -> int:
        return self.limit - self._gap() if self.limit else 1 << 30

    async def wait(self) -> None:
        self.waiting = True
        self.event.clear()
        try:
            async with asyncio.timeout(self.forgive_s):
                await self.event.wait()
        except TimeoutError:
            self.forgiven += max(0, self._gap())
        finally:
            self.waiting = False

    def progress(self) -> None:
        if self.waiting:
            self.event.set()


class Conn:
    """One client connection: asyncio streams plus a codec `Decoder` over its own buffer."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, level: int) -> None:
        self.reader = reader
        self.writer = writer
        self.level = level
        self.decoder = Decoder(MAX_PACKET, protocol_level=level)

    @classmethod
    async def open(cls, host: str, port: int, client_id: str, level: int, clean: bool = True) -> Conn:
        reader, writer = await asyncio.open_connection(host, port, limit=4 * CHUNK)
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        writer.transport.set_write_buffer_limits(high=256 * 1024)
        conn = cls(reader, writer, level)
        # keep_alive 0: a subscriber that only reads must not be dropped in a long run.
        connect = Connect(protocol_level=level, client_id=client_id, keep_alive=0, clean_start=clean)
        writer.write(encode(connect, level))
        ack = await conn.expect(ConnAck)
        if ack.reason_code:
            raise ConnectionError(f"CONNACK refused {client_id}: reason 0x{ack.reason_code:02X}")
        return conn

    async def expect(self, kind: type[T], timeout: float = 10.0) -> T:
        """Read until a packet of `kind` arrives (setup only: anything else is an error)."""
        async with asyncio.timeout(timeout):
            while True:
                packet = self.decoder.next_packet()
                if packet is NEED_DATA:
                    data = await self.reader.read(CHUNK)
                    if not data:
                        raise ConnectionError(f"closed while waiting for {kind.__name__}")
                    self.decoder.feed(data)
                    continue
                if isinstance(packet, kind):
                    return packet
                raise ConnectionError(f"expected {kind.__name__}, got {packet!r}")

    async def subscribe(self, topic: str, qos: int) -> None:
        self.writer.write(encode(Subscribe(1, [(topic, SubscriptionOptions(qos=qos))]), self.level))
        ack = await self.expect(SubAck)
        if ack.reason_codes != [qos]:
            raise ConnectionError(f"SUBACK {ack.reason_codes} for QoS {qos}")

    async def close(self) -> None:
        try:
            self.writer.write(encode(Disconnect(), self.level))
            self.writer.close()
            async with asyncio.timeout(2):
                await self.writer.wait_closed()
        except (OSError, TimeoutError):
            pass


class Template:
    """PUBLISH bytes from one `encode()`: head + [packet id] + mid + stamp + padding."""

    def __init__(self, topic: str, qos: int, payload_size: int, level: int) -> None:
        if payload_size < STAMP.size:
            raise ValueError(f"payload must be at least {STAMP.size} bytes (the stamp)")
        raw = encode(Publish(topic, bytes(payload_size), qos, packet_id=1 if qos else None), level)
        self.mid = b"\x00" if level == MQTT_5 else b""  # empty property length
        self.head = raw[: len(raw) - payload_size - len(self.mid) - (2 if qos else 0)]
        self.pad = bytes(payload_size - STAMP.size)
        self.qos = qos
        # Check the shortcut against the codec once.
        sample = self.build(7, 3, 123456789, 42)
        decoder = Decoder(MAX_PACKET, protocol_level=level)
        decoder.feed(sample)
        got = decoder.next_packet()
        want_payload = STAMP.pack(7, 3, 123456789) + self.pad
        want = Publish(topic, want_payload, qos, packet_id=42 if qos else None)
        if got != want or decoder.buffered:
            raise AssertionError(f"PUBLISH template does not round-trip: {got!r}")

    def build(self, pub: int, seq: int, ts: int, packet_id: int = 0) -> bytes:
        if self.qos:
            return b"".join(
                (self.head, packet_id.to_bytes(2, "big"), self.mid, STAMP.pack(pub, seq, ts), self.pad)
            )
        return b"".join((self.head, self.mid, STAMP.pack(pub, seq, ts), self.pad))


# ---------------------------------------------------------------------------------------- subscriber


async def subscriber(conn: Conn, counter: Counter, sample_every: int, acks: list[bytes], flow: Flow) -> None:
    """Count every PUBLISH, sample latencies, answer QoS 1 with one write of PUBACKs per chunk."""
    read = conn.reader.read
    decoder = conn.decoder
    next_packet = decoder.next_packet
    write = conn.writer.write
    unpack = STAMP.unpack_from
    lat = counter.latencies_ns
    while True:
        data = await read(CHUNK)
        if not data:
            return
        now = monotonic_ns()
        decoder.feed(data)
        out = []
        n = 0
        while True:
            packet = next_packet()
            if packet is NEED_DATA:
                break
            if type(packet) is Publish:
                n += 1
                if packet.packet_id:
                    out.append(acks[packet.packet_id])
                _pub, seq, ts = unpack(packet.payload)
                if seq % sample_every == 0:
                    lat.append(now - ts)
        if out:
            write(b"".join(out))
        if n:
            if not counter.first_ns:
                counter.first_ns = now
            counter.last_ns = now
            counter.delivered += n
            flow.progress()


# ----------------------------------------------------------------------------------------- publisher


async def publisher(
    conn: Conn,
    index: int,
    template: Template,
    counter: Counter,
    stop: asyncio.Event,
    flow: Flow,
    window: int,
    batch: int,
    rate: float | None,
) -> None:
    """Publish until `stop`; as fast as flow control allows, or at `rate` msg/s when given.

    QoS 1 keeps at most `window` PUBLISHes unacknowledged; the PUBACK reader runs alongside.
    """
    writer = conn.writer
    write = writer.write
    build = template.build
    qos = template.qos
    room = asyncio.Event()
    room.set()
    seq = 0
    packet_id = 0
    reader_task = asyncio.create_task(_puback_reader(conn, counter, room, window)) if qos else None
    t0 = monotonic_ns()
    try:
        while not stop.is_set():
            n = batch
            if rate is not None:
                due = int((monotonic_ns() - t0) * rate / 1e9) + 1
                n = min(due - seq, batch)
                if n <= 0:
                    # At least 1 ms: a wake-up per message would cost the generator more than the broker.
                    await asyncio.sleep(max(0.001, (seq + 1 - due + 1) / rate))
                    continue
            if flow.limit:
                n = min(n, flow.room())
                if n <= 0:
                    await flow.wait()
                    continue
            if qos:
                n = min(n, window - (counter.published - counter.acked))
                if n <= 0:
                    room.clear()
                    await room.wait()
                    continue
            ts = monotonic_ns()
            parts = []
            for _ in range(n):
                if qos:
                    packet_id = packet_id % 65535 + 1
                parts.append(build(index, seq, ts, packet_id))
                seq += 1
            write(b"".join(parts))
            counter.published += n
            await writer.drain()  # waits only above the write buffer's high-water mark
            await asyncio.sleep(0)  # let readers run even when the buffer never fills
    finally:
        if reader_task is not None:
            # Give the broker a bounded time to acknowledge what is in flight.
            try:
                async with asyncio.timeout(10):
                    while counter.acked < counter.published:
                        room.clear()
                        await room.wait()
            except TimeoutError:
                pass
            reader_task.cancel()


async def _puback_reader(conn: Conn, counter: Counter, room: asyncio.Event, window: int) -> None:
    read = conn.reader.read
    decoder = conn.decoder
    next_packet = decoder.next_packet
    while True:
        data = await read(CHUNK)
        if not data:
            return
        decoder.feed(data)
        n = 0
        while True:
            packet = next_packet()
            if packet is NEED_DATA:
                break
            if type(packet) is PubAck:
                n += 1
        if n:
            counter.acked += n
            room.set()


# --------------------------------------------------------------------------------------------- a run


async def run(args: argparse.Namespace) -> dict[str, Any]:
    level = args.level
    run_id = f"{os.getpid()}-{int(time.time() * 1000) % 100000}"
    # --durable: a `$queue/` topic (Trimaran: a durable SQL queue, PUBACK after the commit) consumed by
    # persistent-session subscribers (RabbitMQ: a durable queue; QoS 1 publishes are persistent and
    # PUBACKed on the publisher confirm).
    topic = f"$queue/bench-{run_id}" if args.durable else f"bench/{run_id}/t"
    if args.scenario == "fan-in":
        n_pub, n_sub = args.clients, 1
    elif args.scenario == "fan-out":
        n_pub, n_sub = 1, args.clients
    else:
        n_pub, n_sub = 1, 1
    rate = args.rate if args.scenario == "latency" else None
    sample_every = 1 if args.scenario == "latency" else args.sample_every
    acks = [b""] + [encode(PubAck(pid), level) for pid in range(1, 65536)]
    template = Template(topic, args.qos, args.payload, level)

    subs = [
        await Conn.open(args.host, args.port, f"bench-{run_id}-s{i}", level, clean=not args.durable)
        for i in range(n_sub)
    ]
    for s in subs:
        await s.subscribe(topic, args.qos)
    pubs = [await Conn.open(args.host, args.port, f"bench-{run_id}-p{i}", level) for i in range(n_pub)]
    sub_counters = [Counter() for _ in subs]
    pub_counters = [Counter() for _ in pubs]
    stop = asyncio.Event()
    flow = Flow(args.e2e_window if rate is None else 0, pub_counters, sub_counters)
    sub_tasks = [
        asyncio.create_task(subscriber(s, c, sample_every, acks, flow))
        for s, c in zip(subs, sub_counters, strict=True)
    ]
    per_pub_rate = rate / n_pub if rate is not None else None
    t_start = monotonic_ns()
    pub_tasks = [
        asyncio.create_task(publisher(p, i, template, c, stop, flow, args.window, args.batch, per_pub_rate))
        for i, (p, c) in enumerate(zip(pubs, pub_counters, strict=True))
    ]

    def snapshot() -> tuple[common.Mark, int, int]:
        return (
            common.Mark.now(args.watch_pid),
            sum(c.published for c in pub_counters),
            sum(c.delivered for c in sub_counters),
        )

    await asyncio.sleep(args.warmup)
    s0 = snapshot()
    await asyncio.sleep(args.duration - args.warmup)
    s1 = snapshot()
    stop.set()
    await asyncio.gather(*pub_tasks)
    t_pub_end = monotonic_ns()
    published = sum(c.published for c in pub_counters)
    expected = published * n_sub
    # Drain: until everything arrived, or nothing arrived for --idle seconds, or --drain seconds.
    drain_deadline = time.monotonic() + args.drain
    last_total, last_change = -1, time.monotonic()
    while time.monotonic() < drain_deadline:
        total = sum(c.delivered for c in sub_counters)
        if total >= expected:
            break
        if total != last_total:
            last_total, last_change = total, time.monotonic()
        elif time.monotonic() - last_change > args.idle:
            break
        await asyncio.sleep(0.05)
    delivered = sum(c.delivered for c in sub_counters)
    for t in sub_tasks:
        t.cancel()
    await asyncio.gather(*sub_tasks, return_exceptions=True)
    for c in subs + pubs:
        await c.close()

    window_s = common.window_s(s0[0], s1[0])
    lat = sorted(x for c in sub_counters for x in c.latencies_ns)
    last_ns = max((c.last_ns for c in sub_counters), default=0)
    result: dict[str, Any] = {
        "scenario": args.scenario,
        "qos": args.qos,
        "durable": args.durable,
        "level": level,
        "publishers": n_pub,
        "subscribers": n_sub,
        "payload": args.payload,
        "window": args.window if args.qos else None,
        "e2e_window": flow.limit,
        "forgiven": flow.forgiven,
        "target_rate": rate,
        "duration_s": args.duration,
        "steady_window_s": round(window_s, 3),
        "pub_rate": round((s1[1] - s0[1]) / window_s),
        "deliver_rate": round((s1[2] - s0[2]) / window_s),
        "published": published,
        "acked": sum(c.acked for c in pub_counters) if args.qos else None,
        "expected": expected,
        "delivered": delivered,
        "lost": max(0, expected - delivered),
        "drain_s": round(max(0, last_ns - t_pub_end) / 1e9, 3),
        "overall_deliver_rate": round(delivered / ((last_ns - t_start) / 1e9)) if last_ns > t_start else 0,
        "latency_samples": len(lat),
        "latency_ms": common.latency_ms(lat, {"p50": 50, "p90": 90, "p99": 99, "p999": 99.9}),
        **common.cpu_fields(s0[0], s1[0], args.watch_pid),
        "loop": type(asyncio.get_running_loop()).__module__.split(".")[0],
    }
    if args.label:
        result["broker"] = args.label
    return result


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        epilog="Prints one JSON object. Rates are msg/s; latencies ms; *_cpu in cores.",
    )
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--scenario", choices=["fan-in", "fan-out", "latency"], default="fan-in")
    p.add_argument("--qos", type=int, choices=[0, 1], default=0)
    p.add_argument(
        "--clients", type=int, default=4, help="publishers (fan-in) or subscribers (fan-out); default 4"
    )
    p.add_argument("--payload", type=int, default=64, help="payload bytes, >= 16 (default 64)")
    p.add_argument(
        "--durable",
        action="store_true",
        help="topic $queue/bench-<id> and persistent-session subscribers: a durable queue on both brokers",
    )
    common.add_timed_run_args(p, timeout_slack=TIMEOUT_SLACK)
    p.add_argument("--rate", type=float, default=5000.0, help="latency scenario: msg/s (default 5000)")
    p.add_argument("--window", type=int, default=100, help="QoS 1 unacknowledged PUBLISHes per publisher")
    p.add_argument(
        "--e2e-window",
        type=int,
        default=500,
        help="throughput runs: max published-but-undelivered messages (slowest subscriber); 0 = flood; "
        "default 500, below Mosquitto's default per-client queue of 1000",
    )
    p.add_argument("--batch", type=int, default=100, help="max PUBLISHes per write (default 100)")
    p.add_argument("--sample-every", type=int, default=64, help="throughput runs: latency of every k-th msg")
    p.add_argument("--level", type=int, choices=[MQTT_3_1_1, MQTT_5], default=MQTT_3_1_1, help="4 or 5")
    args = p.parse_args(argv)
    common.check_timed_run_args(p, args)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return common.print_bounded_run(
        lambda: run(args),
        args,
        timeout_slack=TIMEOUT_SLACK,
        errors=(OSError, ConnectionError, TimeoutError),
        describe={"scenario": args.scenario},
    )


if __name__ == "__main__":
    sys.exit(main())
