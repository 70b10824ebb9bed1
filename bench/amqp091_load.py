#!/usr/bin/env python3
"""Raw AMQP 0.9.1 load generator (own minimal framing; asyncio + uvloop, multi-process).

Scenarios
  transient  non-durable queue, non-persistent messages, no confirms; consumer with
             --ack auto (no-ack) by default.  Publishers send as fast as TCP allows.
  durable    durable queue, persistent messages (delivery-mode 2), publisher confirms
             (confirm.select; at most --confirm-window unconfirmed per publisher) and a
             consumer that acks with basic.ack multiple=1 every --ack-every deliveries
             (prefetch --prefetch).  Publish and consume run concurrently.
  latency    fixed offered --rate msg/s (paced in --tick-ms ticks), CLOCK_MONOTONIC send time
             in the body; p50/p99/p99.9 one-way latency.  Add --durable for the durable path.

Publishes go to the default exchange with routing key = queue name; with --keys N, to the topic
exchange `bench.topic` with N routing keys in turn (<queue>.k0000 ...), the queue bound with
<queue>.#.  Frames are pre-encoded (method + content header + body per message, --batch messages per write).
One JSON line per run, then a summary line (median/min/max over --runs).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import struct
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import contextlib

import benchlib as bl

FRAME_END = b"\xce"
TS = struct.Struct("<qq")
HDR = struct.Struct("!BHI")
U32 = struct.Struct("!I")
U64 = struct.Struct("!Q")
DELIVER = (60 << 16) | 60
BASIC_ACK = (60 << 16) | 80
BASIC_NACK = (60 << 16) | 120


# --------------------------------------------------------------------------- codec
def shortstr(s: str) -> bytes:
    b = s.encode()
    return bytes([len(b)]) + b


def longstr(b: bytes) -> bytes:
    return U32.pack(len(b)) + b


def table(d: dict) -> bytes:
    out = b""
    for k, v in d.items():
        out += shortstr(k)
        if isinstance(v, bool):
            out += b"t" + bytes([v])
        elif isinstance(v, dict):
            out += b"F" + table(v)
        elif isinstance(v, int):
            out += b"I" + struct.pack("!i", v)
        else:
            out += b"S" + longstr(str(v).encode())
    return U32.pack(len(out)) + out


def frame(ftype: int, ch: int, payload: bytes) -> bytes:
    return HDR.pack(ftype, ch, len(payload)) + payload + FRAME_END


def method(ch: int, cls: int, mth: int, args: bytes = b"") -> bytes:
    return frame(1, ch, struct.pack("!HH", cls, mth) + args)


def publish_msg(ch: int, routing_key: str, body: bytes, persistent: bool, exchange: str = "") -> bytes:
    m = method(ch, 60, 40, b"\x00\x00" + shortstr(exchange) + shortstr(routing_key) + b"\x00")
    if persistent:
        props = struct.pack("!HHQH", 60, 0, len(body), 0x1000) + b"\x02"  # delivery-mode = 2
    else:
        props = struct.pack("!HHQH", 60, 0, len(body), 0)
    return m + frame(2, ch, props) + frame(3, ch, body)


def parse_frames(data, n):
    """list of (type, channel, payload_start, payload_end), bytes consumed."""
    i = 0
    out = []
    while n - i >= 8:
        t, ch, size = HDR.unpack_from(data, i)
        end = i + 7 + size
        if end >= n:
            break
        if data[end] != 0xCE:
            raise ValueError(f"bad frame end at {end}")
        out.append((t, ch, i + 7, end))
        i = end + 1
    return out, i


# --------------------------------------------------------------------------- connection
class AmqpConn(asyncio.Protocol):
    """Handshake/RPC via waiters; subclasses override on_fast() for the hot path."""

    def __init__(self):
        self.buf = b""
        self.transport = None
        self.lost = False
        self.paused = False
        self.waiters: list = []  # [(cls<<16|mth, future)]
        self.closed_reason = None
        self.channel_closed = False
        self.frame_max = 131072

    def connection_made(self, t):
        self.transport = t
        t.set_write_buffer_limits(high=256 * 1024)

    def connection_lost(self, exc):
        self.lost = True
        for _, f in self.waiters:
            if not f.done():
                f.set_exception(ConnectionError(self.closed_reason or f"connection lost: {exc}"))

    def pause_writing(self):
        self.paused = True

    def resume_writing(self):
        self.paused = False
        self.on_resume()

    def on_resume(self):
        pass

    def data_received(self, data):
        if self.buf:
            data = self.buf + data
        used = self.on_data(data)
        self.buf = data[used:] if used < len(data) else b""

    def on_data(self, data) -> int:
        frames, used = parse_frames(data, len(data))
        for t, ch, s, e in frames:
            self.on_frame(t, ch, data, s, e)
        return used

    def on_frame(self, t, ch, data, s, e):
        if t == 1:
            cm = U32.unpack_from(data, s)[0]
            self.on_method(ch, cm, bytes(data[s + 4 : e]))
        elif t == 8:
            self.transport.write(frame(8, 0, b""))

    def on_method(self, ch, cm, args):
        if cm == (10 << 16) | 50 or cm == (20 << 16) | 40:  # connection.close / channel.close
            code = struct.unpack_from("!H", args)[0]
            text = args[3 : 3 + args[2]].decode(errors="replace")
            self.closed_reason = (
                f"server closed {'connection' if cm >> 16 == 10 else 'channel'}: {code} {text}"
            )
            if cm >> 16 == 10:
                self.transport.write(method(0, 10, 51))
            else:
                self.transport.write(method(ch, 20, 41))  # channel.close-ok
            self.channel_closed = True
            for _, f in self.waiters:
                if not f.done():
                    f.set_exception(ConnectionError(self.closed_reason))
            self.waiters.clear()
            return
        for i, (want, f) in enumerate(self.waiters):
            if want == cm:
                del self.waiters[i]
                if not f.done():
                    f.set_result(args)
                return
        self.on_async_method(ch, cm, args)

    def on_async_method(self, ch, cm, args):
        pass

    async def rpc(self, data: bytes | None, cls: int, mth: int, timeout=30.0):
        if self.channel_closed and cls != 10:
            raise ConnectionError(self.closed_reason)
        f = asyncio.get_running_loop().create_future()
        self.waiters.append(((cls << 16) | mth, f))
        if data:
            self.transport.write(data)
        return await asyncio.wait_for(f, timeout)


async def amqp_open(factory, host, port, vhost="/", user="guest", password="guest"):
    loop = asyncio.get_running_loop()
    t, p = await loop.create_connection(factory, host, port)
    start = p.rpc(b"AMQP\x00\x00\x09\x01", 10, 10)
    await start
    props = table({"product": "trimaran-bench", "capabilities": {"publisher_confirms": True}})
    tune = await p.rpc(
        method(
            0,
            10,
            11,
            props + shortstr("PLAIN") + longstr(f"\0{user}\0{password}".encode()) + shortstr("en_US"),
        ),
        10,
        30,
    )
    ch_max, frame_max, _hb = struct.unpack("!HIH", tune[:8])
    p.frame_max = frame_max or 131072
    t.write(method(0, 10, 31, struct.pack("!HIH", ch_max or 2047, p.frame_max, 0)))  # heartbeat off
    await p.rpc(method(0, 10, 40, shortstr(vhost) + shortstr("") + b"\x00"), 10, 41)
    await p.rpc(method(1, 20, 10, shortstr("")), 20, 11)
    return p


async def amqp_close(p):
    if p.lost:
        return
    with contextlib.suppress(Exception):
        await p.rpc(
            method(0, 10, 50, struct.pack("!H", 200) + shortstr("bye") + struct.pack("!HH", 0, 0)),
            10,
            51,
            timeout=5,
        )
    p.transport.close()


async def declare(p, queue, durable, purge=False):
    bits = 0x02 if durable else 0
    await p.rpc(method(1, 50, 10, b"\x00\x00" + shortstr(queue) + bytes([bits]) + table({})), 50, 11)
    if purge:
        await p.rpc(method(1, 50, 30, b"\x00\x00" + shortstr(queue) + b"\x00"), 50, 31)


TOPIC_EXCHANGE = "bench.topic"


async def bind_topics(p, queue):
    """The topic exchange --keys publishes to, and the queue bound to every key of its own."""
    args = b"\x00\x00" + shortstr(TOPIC_EXCHANGE) + shortstr("topic") + b"\x00" + table({})
    await p.rpc(method(1, 40, 10, args), 40, 11)
    args = (
        b"\x00\x00"
        + shortstr(queue)
        + shortstr(TOPIC_EXCHANGE)
        + shortstr(queue + ".#")
        + b"\x00"
        + table({})
    )
    await p.rpc(method(1, 50, 20, args), 50, 21)


def keyed(queue, keys, count, body, persistent):
    """count messages to the topic exchange, the routing key changing message to message (keys of
    one width, so that every message has the same length)."""
    return b"".join(
        publish_msg(1, f"{queue}.k{i % keys:04d}", body, persistent, TOPIC_EXCHANGE) for i in range(count)
    )


class Consumer(AmqpConn):
    def __init__(self):
        super().__init__()
        self.count = 0
        self.last_tag = 0
        self.acked_tag = 0
        self.ack_every = 0  # 0 = no-ack consumer
        self.lat = None
        self.win_lo_ns = self.win_hi_ns = 0
        self.last_rx = time.monotonic()
        self.rx_interval = 0.0
        self.consuming = False
        self.gaps: bl.GapMeter | None = None  # set at the start: the longest gap between deliveries

    def data_received(self, data):
        AmqpConn.data_received(self, data)
        if self.rx_interval and not self.lost:
            self.transport.pause_reading()
            asyncio.get_running_loop().call_later(self.rx_interval, self._resume_rx)

    def _resume_rx(self):
        if not self.lost and not self.transport.is_closing():
            self.transport.resume_reading()

    def on_data(self, data) -> int:
        if not self.consuming:
            return AmqpConn.on_data(self, data)
        n = len(data)
        i = 0
        cnt = 0
        tag = self.last_tag
        lat = self.lat
        now = time.monotonic_ns() if lat is not None else 0
        unpack_hdr = HDR.unpack_from
        while n - i >= 8:
            t, ch, size = unpack_hdr(data, i)
            s = i + 7
            end = s + size
            if end >= n:
                break
            if t == 1:
                cm = U32.unpack_from(data, s)[0]
                if cm == DELIVER:
                    tag = U64.unpack_from(data, s + 5 + data[s + 4])[0]
                    cnt += 1
                else:
                    self.on_frame(t, ch, data, s, end)
            elif t == 3:
                if lat is not None and size >= 16:
                    ts = TS.unpack_from(data, s)[0]
                    if self.win_lo_ns <= ts < self.win_hi_ns:
                        lat.append(now - ts)
            elif t != 2:
                self.on_frame(t, ch, data, s, end)
            i = end + 1
        if cnt:
            self.count += cnt
            self.last_tag = tag
            self.last_rx = t = time.monotonic()  # one clock read a read, not a message
            if self.gaps is not None:
                self.gaps.mark(t)
            if self.ack_every and tag - self.acked_tag >= self.ack_every:
                self.ack()
        return i

    def ack(self):
        if self.ack_every and self.last_tag > self.acked_tag and not self.lost:  # never on a no-ack consumer
            self.transport.write(method(1, 60, 80, U64.pack(self.last_tag) + b"\x01"))  # multiple=1
            self.acked_tag = self.last_tag


class Publisher(AmqpConn):
    def __init__(self):
        super().__init__()
        self.sent = 0
        self.running = False
        self.confirm = False
        self.conf_upto = 0  # every tag <= this is confirmed
        self.conf_single = set()  # confirmed tags > conf_upto
        self.nacked = 0
        self.max_behind = 0
        self.e2e_window = 0
        self.e2e_timer = None

    @property
    def confirmed(self):
        return self.conf_upto + len(self.conf_single)

    def configure(self, queue, payload, persistent, batch, writes_per_turn, confirm_window, keys=0):
        self.loop = asyncio.get_running_loop()
        body = bytes((65 + i % 26) for i in range(payload))
        self.one = (
            keyed(queue, keys, 1, body, persistent) if keys else publish_msg(1, queue, body, persistent)
        )
        self.B = batch
        self.batch = keyed(queue, keys, batch, body, persistent) if keys else self.one * batch
        self.K = writes_per_turn
        self.window = confirm_window
        if confirm_window:
            self.confirm = True
            self.min_chunk = max(1, confirm_window // 16)
            ring = keyed(queue, keys, confirm_window, body, persistent) if keys else self.one * confirm_window
            self.ring = memoryview(ring)

    def e2e(self, progress, slot, n_cons, window):
        self.progress, self.slot, self.n_cons, self.e2e_window = progress, slot, n_cons, window

    def e2e_blocked(self) -> bool:
        pr = self.progress
        if sum(pr[0:32]) - sum(pr[32:64]) < self.e2e_window:
            return False
        if not self.e2e_timer:
            self.e2e_timer = self.loop.call_later(0.001, self._e2e_retry)
        return True

    def _e2e_retry(self):
        self.e2e_timer = None
        self.pump()

    def on_async_method(self, ch, cm, args):
        if cm in (BASIC_ACK, BASIC_NACK):
            tag = U64.unpack_from(args)[0]
            multiple = args[8] & 1
            if cm == BASIC_NACK:
                self.nacked += 1
            if multiple:
                if tag > self.conf_upto:
                    self.conf_upto = tag
                    self.conf_single = {x for x in self.conf_single if x > tag}
            elif tag == self.conf_upto + 1:
                self.conf_upto = tag
                while self.conf_upto + 1 in self.conf_single:
                    self.conf_upto += 1
                    self.conf_single.discard(self.conf_upto)
            elif tag > self.conf_upto:
                self.conf_single.add(tag)
            if self.running:
                self.pump()

    def start(self, t_stop):
        self.running = True
        bl.at(self.loop, t_stop, self.stop)
        self.pump()

    def stop(self):
        self.running = False

    def on_resume(self):
        if self.running:
            self.pump()

    def pump(self):
        if not self.running or self.lost or self.paused:
            return
        if not self.confirm:
            w = self.transport.write
            for _ in range(self.K):
                if self.paused:
                    return
                if self.e2e_window:
                    if self.e2e_blocked():
                        return
                    self.progress[self.slot] += self.B
                w(self.batch)
                self.sent += self.B
            self.loop.call_soon(self.pump)
        else:
            room = self.window - (self.sent - self.confirmed)
            if room < self.min_chunk:
                return
            if self.e2e_window:
                if self.e2e_blocked():
                    return
                self.progress[self.slot] += room
            self.transport.write(self.ring[: room * len(self.one)])
            self.sent += room


class PacedPublisher(Publisher):
    def configure_paced(self, queue, payload, persistent, rate, tick, confirm):
        self.loop = asyncio.get_running_loop()
        payload = max(payload, TS.size)
        self.tmpl = bytearray(publish_msg(1, queue, bytes(payload), persistent))
        self.body_off = len(self.tmpl) - 1 - payload
        self.rate = rate
        self.tick_s = tick
        self.confirm = confirm

    def start(self, t0, t_stop):
        self.t0 = t0
        self.running = True
        bl.at(self.loop, t_stop, self.stop)
        bl.at(self.loop, t0, self.tick)

    def pump(self):
        pass

    def tick(self):
        if not self.running or self.lost:
            return
        now = time.monotonic()
        due = int((now - self.t0) * self.rate) - self.sent
        if due > 0:
            self.max_behind = max(self.max_behind, due)
            tmpl, off = self.tmpl, self.body_off
            parts = []
            ts = time.monotonic_ns()
            for seq in range(self.sent, self.sent + due):
                TS.pack_into(tmpl, off, ts, seq)
                parts.append(bytes(tmpl))
            self.transport.write(b"".join(parts))
            self.sent += due
        self.loop.call_later(self.tick_s, self.tick)


# --------------------------------------------------------------------------- worker roles
async def role_consumer(wid, cfg, sync: bl.Sync):
    loop = asyncio.get_running_loop()
    cons = []
    for i, q in enumerate(cfg["queues"]):
        p = await amqp_open(Consumer, cfg["host"], cfg["port"], cfg["vhost"], cfg["user"], cfg["password"])
        await declare(p, q, cfg["durable"], purge=cfg["owner"][i])
        manual = cfg["ack"] == "multiple"
        if manual:
            await p.rpc(method(1, 60, 10, struct.pack("!IH", 0, cfg["prefetch"]) + b"\x00"), 60, 11)
            p.ack_every = cfg["ack_every"]
        flags = 0 if manual else 0x02  # no-ack
        await p.rpc(
            method(
                1, 60, 20, b"\x00\x00" + shortstr(q) + shortstr(f"c-{wid}-{i}") + bytes([flags]) + table({})
            ),
            60,
            21,
        )
        p.consuming = True
        cons.append(p)
    sync.ready(n=len(cons))
    _t0, tws, twe, tstop = await sync.wait_go()
    lat = [] if cfg["latency"] else None
    for p in cons:
        p.gaps = bl.GapMeter(tws, tstop)
        if lat is not None:
            p.lat = lat
            p.win_lo_ns, p.win_hi_ns = int(tws * 1e9), int(twe * 1e9)
        elif cfg["rx_batch_ms"] and not p.ack_every:  # only for no-ack consumers: never delay acks
            p.rx_interval = cfg["rx_batch_ms"] / 1000.0
    slot = 32 + cfg["index"]
    progress = sync.progress

    def report():
        progress[slot] = sum(p.count for p in cons)
        for p in cons:  # make sure a trickle still gets acked (prefetch would stall otherwise)
            if p.ack_every and p.last_tag > p.acked_tag and time.monotonic() - p.last_rx > 0.005:
                p.ack()
        loop.call_later(0.001, report)

    report()
    win = bl.Window(loop, tws, twe, lambda: sum(p.count for p in cons))
    end_reason = None
    while True:
        await asyncio.sleep(0.02)
        now = time.monotonic()
        if now < tstop + 0.05:
            continue
        for p in cons:
            p.rx_interval = 0.0
        got = sum(p.count for p in cons)
        exp = sync.expected()
        if exp >= 0 and got >= exp:
            end_reason = "complete"
            break
        last = max(p.last_rx for p in cons)
        if now - last > cfg["idle"] and now - tstop > cfg["idle"]:
            end_reason = "idle"
            break
        if now - tstop > cfg["drain_max"]:
            end_reason = "deadline"
            break
        if any(p.lost for p in cons):
            end_reason = "connection_lost: " + str([p.closed_reason for p in cons if p.lost])
            break
    drain_s = time.monotonic() - tstop
    for p in cons:
        p.ack()
    if any(p.closed_reason for p in cons):
        end_reason = f"{end_reason}; server: {[p.closed_reason for p in cons if p.closed_reason]}"
    out = dict(
        received=sum(p.count for p in cons),
        drain_s=round(drain_s, 3),
        gap_max_s=max(p.gaps.finish() for p in cons if p.gaps is not None),
        end=end_reason,
        lost=sum(p.lost for p in cons),
        **win.export(),
    )
    if lat is not None:
        out["lat"] = lat
    sync.result(**out)
    while not sync.aborted():
        await asyncio.sleep(0.05)
    for i, (p, q) in enumerate(zip(cons, cfg["queues"], strict=False)):
        if cfg["owner"][i] and not p.lost and cfg["delete"]:
            with contextlib.suppress(Exception):
                await p.rpc(method(1, 50, 40, b"\x00\x00" + shortstr(q) + b"\x00"), 50, 41, timeout=10)
        await amqp_close(p)


async def role_publisher(wid, cfg, sync: bl.Sync):
    loop = asyncio.get_running_loop()
    pubs = []
    for _i, q in enumerate(cfg["queues"]):
        cls = PacedPublisher if cfg["rate"] else Publisher
        p = await amqp_open(cls, cfg["host"], cfg["port"], cfg["vhost"], cfg["user"], cfg["password"])
        await declare(p, q, cfg["durable"])
        if cfg["keys"]:
            await bind_topics(p, q)
        if cfg["confirm"]:
            await p.rpc(method(1, 85, 10, b"\x00"), 85, 11)
        if cfg["rate"]:
            p.configure_paced(
                q,
                cfg["payload"],
                cfg["durable"],
                cfg["rate"] / cfg["total_pubs"],
                cfg["tick"],
                cfg["confirm"],
            )
        else:
            p.configure(
                q,
                cfg["payload"],
                cfg["durable"],
                cfg["batch"],
                cfg["writes_per_turn"],
                cfg["confirm_window"] if cfg["confirm"] else 0,
                cfg["keys"],
            )
            if cfg["e2e"]:
                p.e2e(sync.progress, cfg["index"], 1, cfg["e2e"])
        pubs.append(p)
    sync.ready(n=len(pubs))
    t0, tws, twe, tstop = await sync.wait_go()
    win = bl.Window(loop, tws, twe, lambda: sum(p.sent for p in pubs))
    cwin = bl.Window(loop, tws, twe, lambda: sum(p.confirmed for p in pubs))
    for p in pubs:
        if cfg["rate"]:
            p.start(t0, tstop)
        else:
            bl.at(loop, t0, p.start, tstop)
    await asyncio.sleep(max(0.0, tstop - time.monotonic()) + 0.01)
    deadline = time.monotonic() + cfg["drain_max"]
    while (
        cfg["confirm"]
        and time.monotonic() < deadline
        and any(p.confirmed < p.sent and not p.lost for p in pubs)
    ):
        await asyncio.sleep(0.01)
    while time.monotonic() < deadline and any(
        p.transport.get_write_buffer_size() for p in pubs if not p.lost
    ):
        await asyncio.sleep(0.01)
    c = cwin.export()
    sync.result(
        sent=sum(p.sent for p in pubs),
        confirmed=sum(p.confirmed for p in pubs),
        nacked=sum(p.nacked for p in pubs),
        max_behind=max(p.max_behind for p in pubs),
        lost=sum(p.lost for p in pubs),
        closed=[p.closed_reason for p in pubs if p.closed_reason],
        confirm_rate=c["win_count"] / c["win_s"] if c["win_s"] else 0.0,
        **win.export(),
    )
    while not sync.aborted():
        await asyncio.sleep(0.05)
    for p in pubs:
        await amqp_close(p)


# --------------------------------------------------------------------------- coordinator
def spread(items, nproc):
    nproc = max(1, min(nproc, len(items)))
    return [items[i::nproc] for i in range(nproc)]


def run_once(a, run_idx, broker_pid):
    latency = a.scenario == "latency"
    durable = a.scenario == "durable" or (latency and a.durable)
    confirm = durable if a.confirm is None else a.confirm
    queues = [f"{a.queue_prefix}.{a.scenario}.{i}" for i in range(a.queues)]
    base = dict(
        host=a.host,
        port=a.port,
        vhost=a.vhost,
        user=a.user,
        password=a.password,
        durable=durable,
        payload=max(a.payload, TS.size) if latency else a.payload,
        drain_max=a.drain_max,
        idle=a.idle,
    )
    cons_q = [queues[i % len(queues)] for i in range(a.consumers)]
    owner = [
        i < len(queues) for i in range(a.consumers)
    ]  # first consumer of each queue declares/purges/deletes
    cgroups = spread(list(range(a.consumers)), a.sub_procs)
    cwids = [f"cons{i}" for i in range(len(cgroups))]
    pub_q = [queues[i % len(queues)] for i in range(a.publishers)]
    pgroups = spread(list(range(a.publishers)), a.pub_procs)
    pwids = [f"pub{i}" for i in range(len(pgroups))]
    coord = bl.Coordinator(broker_pid, storage_pid=a.storage_pid)
    coord.shared[bl.EXPECT] = -1
    try:
        coord.spawn(
            role_consumer,
            cwids,
            [
                dict(
                    base,
                    queues=[cons_q[j] for j in g],
                    owner=[owner[j] for j in g],
                    ack=a.ack,
                    prefetch=a.prefetch,
                    ack_every=a.ack_every,
                    latency=latency,
                    index=i,
                    rx_batch_ms=0 if latency else a.rx_batch_ms,
                    delete=not a.keep_queues,
                )
                for i, g in enumerate(cgroups)
            ],
        )
        coord.spawn(
            role_publisher,
            pwids,
            [
                dict(
                    base,
                    queues=[pub_q[j] for j in g],
                    confirm=confirm,
                    confirm_window=a.confirm_window,
                    batch=a.batch,
                    writes_per_turn=a.writes_per_turn,
                    rate=a.rate if latency else 0,
                    total_pubs=a.publishers,
                    keys=a.keys,
                    tick=a.tick_ms / 1000.0,
                    index=i,
                    e2e=0 if latency else a.e2e_window,
                )
                for i, g in enumerate(pgroups)
            ],
        )
        coord.start(a.warmup, a.duration)
        samples = coord.sample_window()
        pres = coord.collect(pwids, timeout=a.drain_max + 60)
        sent = sum(r["sent"] for r in pres.values() if r)
        coord.set_expected(sent)  # each message is consumed once (competing consumers)
        cres = coord.collect(cwids, timeout=a.drain_max + 60)
    finally:
        coord.close()
    received = sum(r["received"] for r in cres.values() if r)
    dt = samples["window_s"]
    c_cpu = sum(r["win_cpu_s"] for r in cres.values() if r)
    p_cpu = sum(r["win_cpu_s"] for r in pres.values() if r)
    out = dict(
        sent=sent,
        received=received,
        expected=sent,
        duration=dt,
        msgs_per_s_received=round(
            sum(r["win_count"] / r["win_s"] for r in cres.values() if r and r["win_s"]), 1
        ),
        msgs_per_s_sent=round(sum(r["win_count"] / r["win_s"] for r in pres.values() if r and r["win_s"]), 1),
        loss=round(1 - received / sent, 6) if sent else None,
        confirmed=sum(r["confirmed"] for r in pres.values() if r) if confirm else None,
        confirm_rate=round(sum(r["confirm_rate"] for r in pres.values() if r), 1) if confirm else None,
        nacked=sum(r["nacked"] for r in pres.values() if r),
        broker_cpu_pct=samples.get("broker_cpu_pct"),
        gen_cpu_pct=round(100.0 * (c_cpu + p_cpu + samples.get("coord_cpu_s", 0)) / dt, 1),
        gen_cpu_pub_pct=round(100.0 * p_cpu / dt, 1),
        gen_cpu_sub_pct=round(100.0 * c_cpu / dt, 1),
        drain_s=max((r["drain_s"] for r in cres.values() if r), default=None),
        # the longest stretch any consumer went without a delivery in the window (at read granularity)
        gap_max_ms=max((round(r["gap_max_s"] * 1e3, 1) for r in cres.values() if r), default=None),
        drain_end=sorted({r["end"] for r in cres.values() if r}),
        conn_lost=sum(r["lost"] for r in list(cres.values()) + list(pres.values()) if r),
        broker_rss_kb=samples.get("broker_rss_kb"),
    )
    closed = [c for r in pres.values() if r for c in r["closed"]]
    if closed:
        out["server_closed"] = closed
    out.update({k: v for k, v in samples.items() if k.startswith(("cpu", "other_", "storage_"))})
    if latency:
        out.update(bl.percentiles_us([x for r in cres.values() if r for x in r.get("lat", [])]))
        out["max_send_burst"] = max((r["max_behind"] for r in pres.values() if r), default=0)
    if coord.errors:
        out["error"] = coord.errors
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("scenario", choices=["transient", "durable", "latency"])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=5672)
    ap.add_argument("--vhost", default="/")
    ap.add_argument("--user", default="guest")
    ap.add_argument("--password", default="guest")
    ap.add_argument("--label", default="")
    ap.add_argument("--broker-pid", type=int, default=0)
    ap.add_argument("--publishers", "-P", type=int, default=1)
    ap.add_argument("--consumers", "-C", type=int, default=1)
    ap.add_argument("--queues", "-Q", type=int, default=1)
    ap.add_argument("--queue-prefix", default="bench")
    ap.add_argument(
        "--keys",
        type=int,
        default=0,
        help="transient/durable: publish to a topic exchange with this many routing keys in turn",
    )
    ap.add_argument("--payload", type=int, default=64)
    ap.add_argument(
        "--durable",
        action="store_true",
        help="latency: use the durable path (durable queue, persistent messages, confirms, manual acks)",
    )
    ap.add_argument(
        "--confirm",
        type=lambda s: s.lower() in ("1", "true", "yes"),
        default=None,
        help="override publisher confirms (default: on for durable)",
    )
    ap.add_argument("--confirm-window", type=int, default=1000, help="max unconfirmed messages per publisher")
    ap.add_argument(
        "--ack",
        choices=["auto", "multiple"],
        default=None,
        help="consumer acks: auto = no-ack; multiple = basic.ack multiple (default: auto for transient, "
        "multiple for durable)",
    )
    ap.add_argument("--ack-every", type=int, default=100)
    ap.add_argument("--prefetch", type=int, default=1000)
    ap.add_argument("--rate", type=float, default=10000)
    ap.add_argument("--tick-ms", type=float, default=1.0)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--writes-per-turn", type=int, default=4)
    ap.add_argument(
        "--e2e-window",
        type=int,
        default=0,
        help="closed loop: publishers hold back while more than this "
        "many messages are published but not yet consumed (0 = open loop)",
    )
    ap.add_argument(
        "--rx-batch-ms",
        type=float,
        default=1.0,
        help="no-ack consumers pause this long after each read "
        "so reads are batched (0 = wake per segment; manual-ack and latency runs always use 0)",
    )
    ap.add_argument("--warmup", type=float, default=2.0)
    ap.add_argument("--duration", type=float, default=10.0)
    ap.add_argument("--drain-max", type=float, default=30.0)
    ap.add_argument("--idle", type=float, default=2.0)
    ap.add_argument("--pub-procs", type=int, default=1)
    ap.add_argument("--sub-procs", type=int, default=1)
    ap.add_argument("--keep-queues", action="store_true")
    bl.add_series_args(ap)
    a = ap.parse_args(argv)
    if a.ack is None:
        durable = a.scenario == "durable" or (a.scenario == "latency" and a.durable)
        a.ack = "multiple" if durable else "auto"
    broker_pid = a.broker_pid or bl.find_listener_pid(a.port)
    keys = [
        "host",
        "port",
        "publishers",
        "consumers",
        "queues",
        "payload",
        "ack",
        "warmup",
        "duration",
        "drain_max",
        "pub_procs",
        "sub_procs",
    ]
    if a.ack == "multiple":
        keys += ["ack_every", "prefetch"]
    if a.scenario == "latency":
        keys += ["rate", "tick_ms", "durable"]
    else:
        keys += ["batch", "writes_per_turn", "e2e_window", "rx_batch_ms"]
    if a.keys:
        keys.append("keys")
    params = {k: getattr(a, k) for k in keys}
    durable = a.scenario == "durable" or (a.scenario == "latency" and a.durable)
    params["confirm"] = durable if a.confirm is None else a.confirm
    if params["confirm"]:
        params["confirm_window"] = a.confirm_window
    state = {"broker_pid": broker_pid}

    def one_run(r):
        bp = state["broker_pid"]
        rec = dict(
            scenario=f"amqp091-{a.scenario}",
            label=a.label,
            run=r,
            params=params,
            broker_pid=bp,
            broker_affinity=bl.affinity(bp) if bp else None,
            **bl.host_info(),
        )
        if a.before_run:
            subprocess.run(a.before_run, shell=True, check=True, stdout=subprocess.DEVNULL)
            if not a.broker_pid:
                bp = state["broker_pid"] = bl.find_listener_pid(a.port)
                rec.update(broker_pid=bp, broker_affinity=bl.affinity(bp) if bp else None)
        if a.quiet_pct:
            rec["pre_run_busy_pct"] = bl.wait_quiet(a.quiet_pct, a.quiet_wait)
        try:
            rec.update(run_once(a, r, bp))
        except Exception as e:
            rec["error"] = f"{type(e).__name__}: {e}"
        return rec

    bl.run_series(a, one_run)


if __name__ == "__main__":
    main()
