#!/usr/bin/env python3
"""Raw-socket MQTT 3.1.1 load generator (asyncio + uvloop, multi-process).

Scenarios
  fanin    P publishers -> S subscribers on one wildcard filter (default 8 -> 1), QoS 0 or 1.
           Publishers send as fast as TCP back-pressure (QoS 0) or the in-flight window
           (QoS 1, --window un-PUBACKed messages per publisher) allows.  QoS 1 subscribers
           PUBACK every message (acks are built in bulk, one write per read).
  fanout   1 publisher -> N subscribers (default 16) on the exact topic, QoS 0 by default.
  latency  fixed offered rate (--rate msg/s over all publishers, paced in --tick-ms ticks);
           every payload carries CLOCK_MONOTONIC send time + sequence number;
           reports p50/p90/p99/p99.9/max one-way latency for messages sent inside the window.
  conns    open N idle connections (CONNECT with --keepalive, PINGREQ every keepalive/2),
           report broker RSS (VmRSS from /proc/PID/status, incl. child processes) before,
           with the connections open, and after they close; plus broker CPU while idle.

Packets are pre-encoded (QoS 0: one batch of --batch packets written per call; QoS 1: a
ring of packets with consecutive packet ids, written as zero-copy slices).  Receivers
verify framing in bulk: when every packet in a read has the expected fixed length the
header bytes are checked with strided slices (exact, C speed), otherwise a per-packet
parser runs.  One JSON line per run, then a summary line (median/min/max over --runs).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import struct
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib as bl

# --------------------------------------------------------------------------- codec
PINGREQ = b"\xc0\x00"
DISCONNECT = b"\xe0\x00"
TS = struct.Struct("<qq")  # send time ns (CLOCK_MONOTONIC), sequence


def remlen(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def mstr(s: str) -> bytes:
    b = s.encode()
    return struct.pack("!H", len(b)) + b


def connect_pkt(cid: str, keepalive: int, clean: bool = True) -> bytes:
    body = mstr("MQTT") + bytes([4, 0x02 if clean else 0]) + struct.pack("!H", keepalive) + mstr(cid)
    return b"\x10" + remlen(len(body)) + body


def subscribe_pkt(pid: int, filt: str, qos: int) -> bytes:
    body = struct.pack("!H", pid) + mstr(filt) + bytes([qos])
    return b"\x82" + remlen(len(body)) + body


def publish_pkt(topic: str, payload: bytes, qos: int = 0, pid: int = 0) -> bytes:
    body = mstr(topic) + (struct.pack("!H", pid) if qos else b"") + payload
    return bytes([0x30 | (qos << 1)]) + remlen(len(body)) + body


def split_packets(data, n: int):
    """Generic framing: list of (first_byte, body_start, body_end) and bytes consumed."""
    i = 0
    out = []
    while n - i >= 2:
        j = i + 1
        mul = 1
        rl = 0
        while True:
            if j >= n:
                return out, i
            b = data[j]
            j += 1
            rl += (b & 0x7F) * mul
            if b < 0x80:
                break
            mul <<= 7
            if mul > 0x200000:
                raise ValueError("malformed remaining length from broker")
        if j + rl > n:
            break
        out.append((data[i], j, j + rl))
        i = j + rl
    return out, i


# --------------------------------------------------------------------------- connections
class MqttConn(asyncio.Protocol):
    """Base: buffering, CONNACK/SUBACK waiters, flow control flags, keepalive pings."""

    def __init__(self):
        self.buf = b""
        self.transport = None
        self.waiter = None
        self.paused = False
        self.lost = False
        self.pings = 0
        self.ka_handle = None

    def connection_made(self, t):
        self.transport = t
        t.set_write_buffer_limits(high=256 * 1024)

    def connection_lost(self, exc):
        self.lost = True
        if self.ka_handle:
            self.ka_handle.cancel()
        if self.waiter and not self.waiter.done():
            self.waiter.set_exception(ConnectionError(f"connection lost: {exc}"))

    def pause_writing(self):
        self.paused = True

    def resume_writing(self):
        self.paused = False
        self.on_resume()

    def on_resume(self):
        pass

    def start_keepalive(self, keepalive: int, phase: float | None = None):
        if keepalive <= 0:
            return
        loop = asyncio.get_running_loop()
        period = keepalive / 2.0

        def ping():
            if self.lost:
                return
            self.transport.write(PINGREQ)
            self.pings += 1
            self.ka_handle = loop.call_later(period, ping)

        self.ka_handle = loop.call_later(period if phase is None else phase, ping)

    def data_received(self, data):
        if self.buf:
            data = self.buf + data
        used = self.on_data(data)
        self.buf = data[used:] if used < len(data) else b""

    def on_data(self, data) -> int:
        pkts, used = split_packets(data, len(data))
        for h, s, e in pkts:
            self.on_packet(h, data, s, e)
        return used

    def on_packet(self, h, data, s, e):
        t = h >> 4
        if t == 2:  # CONNACK
            if self.waiter and not self.waiter.done():
                self.waiter.set_result(data[s + 1])
        elif t == 9:  # SUBACK
            if self.waiter and not self.waiter.done():
                self.waiter.set_result(data[e - 1])
        elif t == 13:  # PINGRESP
            pass
        else:
            self.on_other(h, data, s, e)

    def on_other(self, h, data, s, e):
        pass


async def mqtt_connect(factory, host, port, cid, keepalive, timeout=30.0):
    loop = asyncio.get_running_loop()
    t, p = await loop.create_connection(factory, host, port)
    p.waiter = loop.create_future()
    t.write(connect_pkt(cid, keepalive))
    rc = await asyncio.wait_for(p.waiter, timeout)
    p.waiter = None
    if rc != 0:
        t.close()
        raise ConnectionError(f"CONNACK return code {rc}")
    return p


async def mqtt_subscribe(p, filt, qos, pid=1, timeout=30.0):
    p.waiter = asyncio.get_running_loop().create_future()
    p.transport.write(subscribe_pkt(pid, filt, qos))
    granted = await asyncio.wait_for(p.waiter, timeout)
    p.waiter = None
    if granted == 0x80:
        raise ConnectionError(f"SUBSCRIBE {filt!r} refused")
    return granted


class Sub(MqttConn):
    """Counts PUBLISH packets; PUBACKs QoS 1 ones; optionally extracts timestamps."""

    def __init__(self, topic_len: int, payload: int, qos: int):
        super().__init__()
        self.count = 0
        self.acks = 0
        self.last_rx = time.monotonic()
        self.qos = qos
        body = 2 + topic_len + (2 if qos else 0) + payload
        self.hdr = bytes([0x30 | (qos << 1)]) + remlen(body)  # exact fixed header of expected packets
        self.L = len(self.hdr) + body
        self.pid_off = len(self.hdr) + 2 + topic_len  # packet id offset inside a packet
        self.pay_off = self.pid_off + (2 if qos else 0)
        self.lat = None
        self.win_lo_ns = self.win_hi_ns = 0
        self.rx_interval = 0.0
        self.gaps: bl.GapMeter | None = None  # set at the start: the longest gap between deliveries

    def batch_reads(self, interval: float):
        """After each read stop reading for `interval` s so the kernel accumulates data
        (fewer wake-ups; only for throughput runs).  0 = read as soon as data arrives."""
        self.rx_interval = interval

    def data_received(self, data):
        MqttConn.data_received(self, data)
        if self.rx_interval and not self.lost:
            self.transport.pause_reading()
            asyncio.get_running_loop().call_later(self.rx_interval, self._resume_rx)

    def _resume_rx(self):
        if not self.lost and not self.transport.is_closing():
            self.transport.resume_reading()

    def measure_latency(self, lat: list, win):
        """Append one-way latencies (ns) of messages sent inside win=(lo, hi) to lat."""
        self.win_lo_ns = int(win[0] * 1e9)
        self.win_hi_ns = int(win[1] * 1e9)
        self.lat = lat

    def on_data(self, data) -> int:
        n = len(data)
        L = self.L
        k = n // L
        if k:
            kl = k * L
            ok = True
            for j, hb in enumerate(self.hdr):
                if data[j:kl:L].count(hb) != k:
                    ok = False
                    break
            if ok:  # k complete, identically framed PUBLISH packets
                self.count += k
                self.last_rx = t = time.monotonic()  # one clock read a read, not a message
                if self.gaps is not None:
                    self.gaps.mark(t)
                if self.qos:
                    o = self.pid_off
                    out = bytearray(4 * k)
                    out[0::4] = b"\x40" * k
                    out[1::4] = b"\x02" * k
                    out[2::4] = data[o:kl:L]
                    out[3::4] = data[o + 1 : kl : L]
                    self.transport.write(out)
                    self.acks += k
                if self.lat is not None:
                    now = time.monotonic_ns()
                    lo, hi, lat = self.win_lo_ns, self.win_hi_ns, self.lat
                    unpack = TS.unpack_from
                    for i in range(self.pay_off, kl, L):
                        ts = unpack(data, i)[0]
                        if lo <= ts < hi:
                            lat.append(now - ts)
                return kl
        # slow path: mixed packets (PINGRESP, DUP flag, other topic lengths...)
        pkts, used = split_packets(data, n)
        before = self.count
        acks = []
        now = time.monotonic_ns()
        for h, s, e in pkts:
            if h >> 4 == 3:
                self.count += 1
                q = (h >> 1) & 3
                tl = (data[s] << 8) | data[s + 1]
                po = s + 2 + tl
                if q:
                    acks.append(b"\x40\x02" + bytes(data[po : po + 2]))
                    po += 2
                if self.lat is not None and e - po >= 16:
                    ts = TS.unpack_from(data, po)[0]
                    if self.win_lo_ns <= ts < self.win_hi_ns:
                        self.lat.append(now - ts)
            else:
                self.on_packet(h, data, s, e)
        if pkts:
            self.last_rx = t = time.monotonic()
            if self.gaps is not None and self.count != before:  # a PUBLISH among them
                self.gaps.mark(t)
        if acks:
            self.acks += len(acks)
            self.transport.write(b"".join(acks))
        return used


class Pub(MqttConn):
    """Saturating (QoS 0 batches / QoS 1 window over a packet-id ring) or paced publisher."""

    def __init__(self):
        super().__init__()
        self.qos = 0
        self.sent = 0
        self.acked = 0
        self.running = False
        self.max_behind = 0
        self.e2e_window = 0
        self.e2e_timer = None

    def e2e(self, progress, slot, n_subs, window):
        """Closed loop: hold back while (all published) - (received per subscriber) >= window.
        progress is shared memory: [0:32] published per publisher process, [32:64] received
        per subscriber process."""
        self.progress, self.slot, self.n_subs, self.e2e_window = progress, slot, n_subs, window

    def e2e_blocked(self) -> bool:
        pr = self.progress
        if sum(pr[0:32]) - sum(pr[32:64]) / self.n_subs < self.e2e_window:
            return False
        if not self.e2e_timer:
            self.e2e_timer = self.loop.call_later(
                0.001, self._e2e_retry
            )  # uvloop timers have 1 ms resolution
        return True

    def _e2e_retry(self):
        self.e2e_timer = None
        self.pump()

    def configure(self, topic, payload_size, qos, batch, window, writes_per_turn, topics=1):
        """`topics` > 1: consecutive messages go to `topic`/000, /001, ... in turn (a fleet's shape:
        no two in a row to one topic), every topic the same length."""
        self.loop = asyncio.get_running_loop()
        self.qos = qos
        self.K = writes_per_turn

        def topic_of(i):
            return topic if topics <= 1 else f"{topic}/{i % topics:03d}"

        pay = bytes(random.randrange(65, 91) for _ in range(payload_size))  # 'A'..'Z'
        if qos == 0:
            self.B = batch
            self.batch = b"".join(publish_pkt(topic_of(i), pay, 0) for i in range(batch))
        else:
            self.window = window
            self.R = min(65535, max(8 * window, 4096))
            if topics > 1:
                self.R -= self.R % topics  # the ring wraps onto the same topic order
            pkts = [publish_pkt(topic_of(pid - 1), pay, qos, pid) for pid in range(1, self.R + 1)]
            self.Lp = len(pkts[0])
            self.ring = memoryview(b"".join(pkts))
            self.min_chunk = max(1, window // 16)

    # -- saturating
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
        if not self.running or self.lost:
            return
        if self.qos == 0:
            w = self.transport.write
            b = self.batch
            for _ in range(self.K):
                if self.paused:
                    return  # resume_writing() re-enters
                if self.e2e_window:
                    if self.e2e_blocked():
                        return  # timer re-enters
                    self.progress[self.slot] += self.B
                w(b)
                self.sent += self.B
            self.loop.call_soon(self.pump)
        else:
            if self.paused:
                return
            room = self.window - (self.sent - self.acked)
            if room < self.min_chunk:
                return  # the next PUBACKs re-enter
            if self.e2e_window:
                if self.e2e_blocked():
                    return
                self.progress[self.slot] += room
            R, Lp = self.R, self.Lp
            start = self.sent % R
            n = room
            while n:
                m = min(n, R - start)
                self.transport.write(self.ring[start * Lp : (start + m) * Lp])
                n -= m
                start = 0
            self.sent += room

    def on_data(self, data) -> int:
        n = len(data)
        k = n >> 2
        if k and data[0 : 4 * k : 4].count(0x40) == k and data[1 : 4 * k : 4].count(2) == k:
            self.acked += k
            used = 4 * k
        else:
            pkts, used = split_packets(data, n)
            for h, s, e in pkts:
                if h >> 4 == 4:
                    self.acked += 1
                else:
                    self.on_packet(h, data, s, e)
        if self.running and self.qos:
            self.pump()
        return used


class PacedPub(Pub):
    def configure_paced(self, topic, payload_size, qos):
        self.qos = qos
        payload_size = max(payload_size, TS.size)
        pay = bytes(payload_size)
        tmpl = bytearray(publish_pkt(topic, pay, qos, 1))
        self.tmpl = tmpl
        self.pay_off = len(tmpl) - payload_size
        self.pid_off = self.pay_off - 2

    def send_due(self, due: int) -> None:
        """``due`` messages in one write, stamped now."""
        tmpl, po, pido = self.tmpl, self.pay_off, self.pid_off
        parts = []
        ts = time.monotonic_ns()
        s = self.sent
        for seq in range(s, s + due):
            TS.pack_into(tmpl, po, ts, seq)
            if self.qos:
                struct.pack_into("!H", tmpl, pido, seq % 65535 + 1)
            parts.append(bytes(tmpl))
        self.transport.write(parts[0] if due == 1 else b"".join(parts))
        self.sent += due
        self.max_behind = max(self.max_behind, due)

    def pump(self):  # acks do not drive a paced publisher
        pass


class Pacer:
    """One process's paced publishers on one timer. Each publisher has its own random phase in
    its period, as a fleet's devices do (no burst of all at once); its message ``m`` is due at
    ``t0 + phase + m / rate``. In phase order the publishers' next due times rise around the
    cycle, so a wake-up walks from where the last one stopped and sends each publisher what came
    due (one write), until the next is not due yet. With a timer a publisher (10,000 timers at
    10,000 publishers) the messages left late, in clumps: p50 latency 2.1 ms there where it is
    0.8 ms with one, and the brokers' CPU a message lower for fewer reads. The generator's core is
    still full at 100,000 msg/s: most of a send is the kernel's loopback TCP, which runs in the
    sender's ``write`` (8.2 µs a message, 8.5 with the timers)."""

    def __init__(self, pubs: list[PacedPub], rate: float, tick: float) -> None:
        self.loop = asyncio.get_running_loop()
        self.period = 1 / rate
        self.tick_s = tick
        phased = sorted((random.uniform(0, self.period), i) for i in range(len(pubs)))
        self.phases = [phase for phase, _ in phased]
        self.order = [pubs[i] for _, i in phased]
        self.scheduled = [0] * len(pubs)  # messages each was due by its last visit (sent, or lost)
        self.at = 0  # the next publisher to visit, in phase order
        self.running = False
        self.t0 = 0.0

    def start(self, t0: float, t_stop: float) -> None:
        self.t0 = t0
        self.running = True
        bl.at(self.loop, t_stop, self.stop)
        bl.at(self.loop, t0, self.wake)

    def stop(self) -> None:
        self.running = False

    def wake(self) -> None:
        if not self.running:
            return
        now = time.monotonic()
        t0, period, phases, order, scheduled = self.t0, self.period, self.phases, self.order, self.scheduled
        n = len(order)
        j = self.at
        while t0 + phases[j] + scheduled[j] * period <= now:
            due = max(1, int((now - t0 - phases[j]) / period) + 1 - scheduled[j])
            scheduled[j] += due
            pub = order[j]
            if not pub.lost:
                pub.send_due(due)
            j = j + 1 if j + 1 < n else 0
        self.at = j
        next_due = t0 + phases[j] + scheduled[j] * period
        self.loop.call_later(max(self.tick_s, next_due - time.monotonic()), self.wake)


# --------------------------------------------------------------------------- worker roles
async def role_sub(wid, cfg, sync: bl.Sync):
    loop = asyncio.get_running_loop()
    subs = []

    def factory():
        return Sub(cfg["topic_len"], cfg["payload"], cfg["qos"])

    for i in range(cfg["n"]):
        p = await mqtt_connect(factory, cfg["host"], cfg["port"], f"{cfg['cid']}-{i}", cfg["keepalive"])
        await mqtt_subscribe(p, cfg["filter"], cfg["qos"])
        p.start_keepalive(cfg["keepalive"])
        subs.append(p)
    sync.ready(n=len(subs))
    t0, tws, twe, tstop = await sync.wait_go()
    # --stall: the first of them stop reading at the start (a consumer whose application hangs);
    # rates, the drain and the loss count the others
    stalled, subs = subs[: cfg["stall"]], subs[cfg["stall"] :]

    def stall():
        for p in stalled:
            if not p.lost:
                p.transport.pause_reading()

    bl.at(loop, t0, stall)
    lat = [] if cfg["latency"] else None
    for p in subs:
        p.gaps = bl.GapMeter(tws, tstop)
        if lat is not None:
            p.measure_latency(lat, (tws, twe))
        elif cfg["rx_batch_ms"]:
            p.batch_reads(cfg["rx_batch_ms"] / 1000.0)
    slot = 32 + cfg["index"]
    progress = sync.progress

    def report():  # receivers' progress for publishers running a closed loop (--e2e-window)
        progress[slot] = sum(p.count for p in subs)
        loop.call_later(0.001, report)  # >= 1 ms: uvloop rounds shorter delays to 0 (busy loop)

    if cfg["e2e"]:
        report()
    win = bl.Window(loop, tws, twe, lambda: sum(p.count for p in subs))
    # drain: until we have what publishers sent, or no traffic for --idle, or --drain-max
    end_reason = None
    while True:
        await asyncio.sleep(0.02)
        now = time.monotonic()
        if now < tstop + 0.05:
            continue
        for p in subs:  # stop batching reads: drain at full speed
            if p.rx_interval:
                p.rx_interval = 0.0
        got = sum(p.count for p in subs)
        exp = sync.expected()
        if exp >= 0 and got >= exp * len(subs):
            end_reason = "complete"
            break
        last = max(p.last_rx for p in subs)
        if now - last > cfg["idle"] and now - tstop > cfg["idle"]:
            end_reason = "idle"
            break
        if now - tstop > cfg["drain_max"]:
            end_reason = "deadline"
            break
        if any(p.lost for p in subs):
            end_reason = "connection_lost"
            break
    drain_s = time.monotonic() - tstop
    per_sub = [p.count for p in subs]
    if stalled:  # read again, to see whether the broker closed them
        for p in stalled:
            if not p.lost:
                p.transport.resume_reading()
        await asyncio.sleep(0.5)
    for p in subs + stalled:
        if not p.lost:
            p.transport.write(DISCONNECT)
            p.transport.close()
    out = dict(
        received=sum(per_sub),
        per_sub=per_sub,
        acks_sent=sum(p.acks for p in subs),
        drain_s=round(drain_s, 3),
        gap_max_s=max((p.gaps.finish() for p in subs if p.gaps is not None), default=0.0),
        end=end_reason,
        lost=sum(p.lost for p in subs),
        stalled_closed=sum(p.lost for p in stalled),
        **win.export(),
    )
    if lat is not None:
        out["lat"] = lat
    sync.result(**out)
    await asyncio.sleep(0.2)


async def role_pub(wid, cfg, sync: bl.Sync):
    loop = asyncio.get_running_loop()
    pubs = []
    for i, topic in enumerate(cfg["topics"]):
        cls = PacedPub if cfg["rate"] else Pub
        p = await mqtt_connect(cls, cfg["host"], cfg["port"], f"{cfg['cid']}-{i}", cfg["keepalive"])
        if cfg["rate"]:
            p.configure_paced(topic, cfg["payload"], cfg["qos"])
        else:
            p.configure(
                topic,
                cfg["payload"],
                cfg["qos"],
                cfg["batch"],
                cfg["window"],
                cfg["writes_per_turn"],
                cfg["topics_each"],
            )
            if cfg["e2e"]:
                p.e2e(sync.progress, cfg["index"], cfg["total_subs"], cfg["e2e"])
        p.start_keepalive(cfg["keepalive"])
        pubs.append(p)
    sync.ready(n=len(pubs))
    t0, tws, twe, tstop = await sync.wait_go()
    win = bl.Window(loop, tws, twe, lambda: sum(p.sent for p in pubs))
    if cfg["rate"]:
        Pacer(pubs, cfg["rate"] / cfg["total_pubs"], cfg["tick"]).start(t0, tstop)
    else:
        for p in pubs:
            bl.at(loop, t0, p.start, tstop)
    await asyncio.sleep(max(0.0, tstop - time.monotonic()) + 0.01)
    # QoS 1: wait for the outstanding PUBACKs
    deadline = time.monotonic() + cfg["drain_max"]
    while cfg["qos"] and time.monotonic() < deadline and any(p.acked < p.sent and not p.lost for p in pubs):
        await asyncio.sleep(0.01)
    # make sure everything left our user-space buffers
    while time.monotonic() < deadline and any(
        p.transport.get_write_buffer_size() for p in pubs if not p.lost
    ):
        await asyncio.sleep(0.01)
    sync.result(
        sent=sum(p.sent for p in pubs),
        acked=sum(p.acked for p in pubs),
        max_behind=max(getattr(p, "max_behind", 0) for p in pubs),
        lost=sum(p.lost for p in pubs),
        **win.export(),
    )
    # stay connected until the coordinator is done with the receivers
    while not sync.aborted():
        await asyncio.sleep(0.05)
    for p in pubs:
        if not p.lost:
            p.transport.write(DISCONNECT)
            p.transport.close()
    await asyncio.sleep(0.05)


async def role_idle(wid, cfg, sync: bl.Sync):
    loop = asyncio.get_running_loop()
    sem = asyncio.Semaphore(cfg["concurrency"])
    conns, errors = [], []

    async def one(i):
        async with sem:
            try:
                p = await mqtt_connect(
                    MqttConn, cfg["host"], cfg["port"], f"{cfg['cid']}-{i}", cfg["keepalive"]
                )
                if cfg["subscribe"]:
                    await mqtt_subscribe(p, f"bench/idle/{cfg['cid']}-{i}", cfg["qos"])
                conns.append(p)
            except Exception as e:  # count, keep going
                errors.append(f"{type(e).__name__}: {e}")

    t = time.monotonic()
    await asyncio.gather(*(one(i) for i in range(cfg["n"])))
    connect_s = time.monotonic() - t
    period = cfg["keepalive"] / 2.0
    for p in conns:
        p.start_keepalive(cfg["keepalive"], phase=random.uniform(0, period) if period else None)
    sync.ready(
        connected=len(conns),
        failed=len(errors),
        connect_s=connect_s,
        first_error=errors[0] if errors else None,
    )
    _t0, tws, twe, tstop = await sync.wait_go()
    win = bl.Window(loop, tws, twe, lambda: sum(p.pings for p in conns))
    await asyncio.sleep(max(0.0, tstop - time.monotonic()) + 0.05)
    alive = sum(not p.lost for p in conns)
    sync.result(alive=alive, pings=sum(p.pings for p in conns), **win.export())
    while not sync.aborted():
        await asyncio.sleep(0.05)
    for p in conns:
        if not p.lost:
            p.transport.write(DISCONNECT)
            p.transport.close()
    await asyncio.sleep(0.5)


# --------------------------------------------------------------------------- coordinator
def spread(items: list, nproc: int) -> list[list]:
    nproc = max(1, min(nproc, len(items)))
    return [items[i::nproc] for i in range(nproc)]


def scenario_defaults(a):
    sc = a.scenario
    if sc == "fanin":
        a.publishers = a.publishers or 8
        a.subscribers = a.subscribers or 1
    elif sc == "fanout":
        a.publishers = a.publishers or 1
        a.subscribers = a.subscribers or 16
    elif sc == "latency":
        a.publishers = a.publishers or 1
        a.subscribers = a.subscribers or 1
        a.rate = a.rate or 10000
    # a fresh 6-hex-digit segment per run: a broker's backlog from an earlier run (same topic length,
    # different topic) can never be counted by this run's subscribers
    prefix = f"{a.topic_prefix}/{random.getrandbits(24):06x}/{sc}"
    if a.queue:
        # a durable work queue per run: publishers append to $queue/<name>/p0000..., the subscribers
        # consume $queue/<name> (competing consumers; a QoS 1 PUBACK acks the delivery)
        prefix = f"$queue/{a.topic_prefix}-{random.getrandbits(24):06x}-{sc}"
        a.topics = [f"{prefix}/p{i:04d}" for i in range(a.publishers)]
        a.filter = a.filter or prefix
        return
    if sc == "fanout":
        a.topics = [f"{prefix}/t"] * a.publishers
        a.filter = a.filter or (a.topics[0] if a.topics_each <= 1 else f"{a.topics[0]}/+")
    else:
        a.topics = [f"{prefix}/p{i:04d}" for i in range(a.publishers)]
        a.filter = a.filter or f"{prefix}/#"


def run_pubsub(a, run_idx, broker_pid):
    base = dict(
        host=a.host,
        port=a.port,
        keepalive=a.keepalive,
        qos=a.qos,
        payload=a.payload,
        drain_max=a.drain_max,
        idle=a.idle,
    )
    latency = a.scenario == "latency"
    payload = max(a.payload, TS.size) if latency else a.payload
    base["payload"] = payload
    tl = len(a.topics[0].encode()) + (4 if a.topics_each > 1 else 0)  # (/000)
    coord = bl.Coordinator(broker_pid, storage_pid=a.storage_pid)
    coord.shared[bl.EXPECT] = -1
    try:
        sub_ids = list(range(a.subscribers))
        sub_groups = spread(sub_ids, a.sub_procs)
        sub_wids = [f"sub{i}" for i in range(len(sub_groups))]
        coord.spawn(
            role_sub,
            sub_wids,
            [
                dict(
                    base,
                    n=len(g),
                    cid=f"bs{run_idx}-{a.tag}-{i}",
                    filter=a.filter,
                    topic_len=tl,
                    latency=latency,
                    index=i,
                    e2e=a.e2e_window,
                    rx_batch_ms=0 if latency else a.rx_batch_ms_eff,
                    stall=sum(1 for j in g if j < a.stall),
                )
                for i, g in enumerate(sub_groups)
            ],
        )
        pub_groups = spread(list(range(a.publishers)), a.pub_procs)
        pub_wids = [f"pub{i}" for i in range(len(pub_groups))]
        coord.spawn(
            role_pub,
            pub_wids,
            [
                dict(
                    base,
                    topics=[a.topics[j] for j in g],
                    cid=f"bp{run_idx}-{a.tag}-{i}",
                    rate=a.rate if latency else 0,
                    total_pubs=a.publishers,
                    tick=a.tick_ms / 1000.0,
                    batch=a.batch,
                    window=a.window,
                    writes_per_turn=a.writes_per_turn,
                    topics_each=a.topics_each,
                    index=i,
                    e2e=0 if latency else a.e2e_window,
                    total_subs=a.subscribers,
                )
                for i, g in enumerate(pub_groups)
            ],
        )
        coord.start(a.warmup, a.duration)
        samples = coord.sample_window()
        pres = coord.collect(pub_wids, timeout=a.drain_max + 60)
        sent = sum(r["sent"] for r in pres.values() if r)
        coord.set_expected(sent)
        sres = coord.collect(sub_wids, timeout=a.drain_max + 60)
    finally:
        coord.close()
    received = sum(r["received"] for r in sres.values() if r)
    expected = sent * (a.subscribers - a.stall)
    rate_rx = sum(r["win_count"] / r["win_s"] for r in sres.values() if r and r["win_s"])
    rate_tx = sum(r["win_count"] / r["win_s"] for r in pres.values() if r and r["win_s"])
    sub_cpu = sum(r["win_cpu_s"] for r in sres.values() if r)
    pub_cpu = sum(r["win_cpu_s"] for r in pres.values() if r)
    gen_cpu = sub_cpu + pub_cpu + samples.get("coord_cpu_s", 0)
    out = dict(
        sent=sent,
        received=received,
        expected=expected,
        duration=samples["window_s"],
        msgs_per_s_received=round(rate_rx, 1),
        msgs_per_s_sent=round(rate_tx, 1),
        loss=round(1 - received / expected, 6) if expected else None,
        broker_cpu_pct=samples.get("broker_cpu_pct"),
        gen_cpu_pct=round(100.0 * gen_cpu / samples["window_s"], 1),
        gen_cpu_pub_pct=round(100.0 * pub_cpu / samples["window_s"], 1),
        gen_cpu_sub_pct=round(100.0 * sub_cpu / samples["window_s"], 1),
        pub_acked=sum(r["acked"] for r in pres.values() if r),
        sub_acks_sent=sum(r["acks_sent"] for r in sres.values() if r),
        drain_s=max((r["drain_s"] for r in sres.values() if r), default=None),
        # the longest stretch any subscriber went without a delivery in the window (at read granularity)
        gap_max_ms=max((round(r["gap_max_s"] * 1e3, 1) for r in sres.values() if r), default=None),
        drain_end=sorted({r["end"] for r in sres.values() if r}),
        conn_lost=sum(r["lost"] for r in list(sres.values()) + list(pres.values()) if r),
        stalled_closed=sum(r["stalled_closed"] for r in sres.values() if r),
        broker_rss_kb=samples.get("broker_rss_kb"),
    )
    out.update({k: v for k, v in samples.items() if k.startswith(("cpu", "other_", "storage_"))})
    if latency:
        lat = [x for r in sres.values() if r for x in r.get("lat", [])]
        out.update(bl.percentiles_us(lat))
        out["max_send_burst"] = max((r["max_behind"] for r in pres.values() if r), default=0)
    if coord.errors:
        out["error"] = coord.errors
    return out


def run_conns(a, run_idx, broker_pid):
    if not broker_pid:
        raise SystemExit("conns needs --broker-pid (or a broker listening on --port that we can find)")
    rss0 = bl.tree_rss_kb(broker_pid)
    ids = list(range(a.conns))
    groups = spread(ids, a.pub_procs)
    wids = [f"idle{i}" for i in range(len(groups))]
    coord = bl.Coordinator(broker_pid, ready_timeout=900, storage_pid=a.storage_pid)
    try:
        t = time.monotonic()
        coord.spawn(
            role_idle,
            wids,
            [
                dict(
                    host=a.host,
                    port=a.port,
                    keepalive=a.keepalive,
                    qos=a.qos,
                    n=len(g),
                    cid=f"bi{run_idx}-{a.tag}-{i}",
                    concurrency=a.connect_concurrency,
                    subscribe=a.subscribe,
                )
                for i, g in enumerate(groups)
            ],
        )
        connect_wall = time.monotonic() - t
        time.sleep(a.settle)
        rss1 = bl.tree_rss_kb(broker_pid)
        coord.start(0.0, a.duration)
        samples = coord.sample_window()
        rss2 = bl.tree_rss_kb(broker_pid)
        res = coord.collect(wids, timeout=60)
    finally:
        coord.close()
    time.sleep(a.settle)
    rss3 = bl.tree_rss_kb(broker_pid)
    info = coord.ready_info
    connected = sum(i["connected"] for i in info.values())
    errs = [i["first_error"] for i in info.values() if i.get("first_error")]
    gen_cpu = sum(r["win_cpu_s"] for r in res.values() if r)
    out = dict(
        connected=connected,
        failed=sum(i["failed"] for i in info.values()),
        alive_after_hold=sum(r["alive"] for r in res.values() if r),
        connect_s=round(connect_wall, 3),
        connect_rate=round(connected / connect_wall, 1),
        pings_sent=sum(r["pings"] for r in res.values() if r),
        duration=samples["window_s"],
        rss_before_kb=rss0,
        rss_connected_kb=rss1,
        rss_after_hold_kb=rss2,
        rss_after_close_kb=rss3,
        rss_per_conn_kb=round((rss1 - rss0) / connected, 2) if connected and rss1 and rss0 else None,
        broker_cpu_pct_idle_hold=samples.get("broker_cpu_pct"),
        broker_cpu_pct=samples.get("broker_cpu_pct"),
        gen_cpu_pct=round(100.0 * gen_cpu / samples["window_s"], 1),
    )
    out.update({k: v for k, v in samples.items() if k.startswith(("cpu", "other_", "storage_"))})
    if errs:
        out["first_error"] = errs[0]
    if coord.errors:
        out["error"] = coord.errors
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("scenario", choices=["fanin", "fanout", "latency", "conns"])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=1883)
    ap.add_argument("--label", default="", help="broker name recorded in the output")
    ap.add_argument(
        "--broker-pid",
        type=int,
        default=0,
        help="broker PID for CPU%%/RSS (default: find the listener of --port)",
    )
    ap.add_argument("--qos", type=int, default=0, choices=[0, 1])
    ap.add_argument("--publishers", "-P", type=int, default=0)
    ap.add_argument("--subscribers", "-S", type=int, default=0)
    ap.add_argument("--payload", type=int, default=64, help="payload bytes (latency: min 16)")
    ap.add_argument("--topic-prefix", default="bench")
    ap.add_argument(
        "--stall",
        type=int,
        default=0,
        help="fanin/fanout: this many subscribers stop reading at the start of the warm-up, for good "
        "(an application that hangs); rates and loss count the others, stalled_closed the ones the "
        "broker closed",
    )
    ap.add_argument(
        "--topics",
        dest="topics_each",
        type=int,
        default=1,
        help="fanin/fanout: each publisher sends to this many topics in turn (<its topic>/000, /001, ...), "
        "consecutive messages to different ones, as a fleet of devices does (at most 1000)",
    )
    ap.add_argument(
        "--filter", default="", help="subscription filter (default <prefix>/<scenario>/# ; fanout: the topic)"
    )
    ap.add_argument(
        "--queue",
        action="store_true",
        help="fanin/latency: durable queue topics (Trimaran's $queue/): "
        "publish to $queue/<prefix>-<hex>-<scenario>/p0000..., subscribe to $queue/<prefix>-<hex>-<scenario>",
    )
    ap.add_argument(
        "--rate", type=float, default=0, help="latency: offered msg/s over all publishers (default 10000)"
    )
    ap.add_argument("--tick-ms", type=float, default=1.0, help="latency: pacing tick")
    ap.add_argument("--window", type=int, default=100, help="QoS 1: max un-PUBACKed messages per publisher")
    ap.add_argument("--batch", type=int, default=128, help="QoS 0: packets per write")
    ap.add_argument(
        "--writes-per-turn", type=int, default=4, help="QoS 0: writes per publisher before yielding"
    )
    ap.add_argument(
        "--e2e-window",
        type=int,
        default=0,
        help="fanin/fanout: closed loop, publishers hold back while "
        "more than this many messages are published but not yet received (0 = open loop)",
    )
    ap.add_argument(
        "--rx-batch-ms",
        type=float,
        default=None,
        help="fanin/fanout: receivers pause this long after "
        "each read so reads are batched.  Default 1 for QoS 0 and 0 for QoS 1 (a delayed PUBACK stalls "
        "brokers with a small in-flight window); latency always uses 0",
    )
    ap.add_argument("--keepalive", type=int, default=60)
    ap.add_argument("--warmup", type=float, default=2.0)
    ap.add_argument("--duration", type=float, default=10.0, help="measurement window (conns: hold time)")
    ap.add_argument(
        "--drain-max",
        type=float,
        default=30.0,
        help="max seconds to wait for in-flight messages after the window",
    )
    ap.add_argument("--idle", type=float, default=2.0, help="receivers stop after this long without traffic")
    ap.add_argument(
        "--pub-procs", type=int, default=1, help="processes for publishers (conns: for idle clients)"
    )
    ap.add_argument("--sub-procs", type=int, default=1, help="processes for subscribers")
    ap.add_argument("--conns", type=int, default=5000)
    ap.add_argument("--connect-concurrency", type=int, default=100)
    ap.add_argument(
        "--subscribe", action="store_true", help="conns: each idle client also subscribes to its own topic"
    )
    ap.add_argument("--settle", type=float, default=3.0, help="conns: seconds before reading RSS")
    bl.add_series_args(ap)
    a = ap.parse_args(argv)
    if a.queue and a.scenario not in ("fanin", "latency"):
        ap.error("--queue works with fanin and latency (queue consumers compete; fanout has no meaning)")
    a.rx_batch_ms_eff = a.rx_batch_ms if a.rx_batch_ms is not None else (1.0 if a.qos == 0 else 0.0)
    a.tag = f"{os.getpid()}"
    a.filter_arg = a.filter
    if a.scenario != "conns":
        scenario_defaults(a)  # again before every run (fresh topic segment)
    broker_pid = a.broker_pid or bl.find_listener_pid(a.port)
    common = ["host", "port", "keepalive", "duration", "pub_procs"]
    if a.scenario == "conns":
        keys = [*common, "conns", "subscribe", "qos", "connect_concurrency", "settle"]
    else:
        keys = (
            common
            + [
                "qos",
                "publishers",
                "subscribers",
                "payload",
                "topics",
                "topics_each",
                "stall",
                "filter",
                "warmup",
                "drain_max",
                "sub_procs",
            ]
            + (["queue"] if a.queue else [])
        )
        keys += (
            ["rate", "tick_ms"]
            if a.scenario == "latency"
            else ["batch", "writes_per_turn", "e2e_window", "rx_batch_ms"]
        )
        if a.qos:
            keys.append("window")
    params = {k: getattr(a, k) for k in keys}
    if "rx_batch_ms" in params:
        params["rx_batch_ms"] = a.rx_batch_ms_eff
    if "topics" in params:
        t = params.pop("topics")
        params["topic0"] = t[0]
    state = {"broker_pid": broker_pid}

    def one_run(r):
        bp = state["broker_pid"]
        rec = dict(
            scenario=a.scenario,
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
            if a.scenario != "conns":
                a.filter = a.filter_arg
                scenario_defaults(a)
                rec["params"] = dict(params, topic0=a.topics[0], filter=a.filter)
            rec.update(run_conns(a, r, bp) if a.scenario == "conns" else run_pubsub(a, r, bp))
        except Exception as e:
            rec["error"] = f"{type(e).__name__}: {e}"
        return rec

    bl.run_series(a, one_run)


if __name__ == "__main__":
    main()
