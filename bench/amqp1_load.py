#!/usr/bin/env python3
"""Raw AMQP 1.0 load generator (own minimal framing; asyncio + uvloop, multi-process).

The sibling of mqtt_load.py and amqp091_load.py (same timeline, CPU accounting,
JSON lines and options; see bench/README.md). Every sender and every receiver has its own connection,
session (channel 0) and link (handle 0); senders and receivers run in separate processes.

Scenarios
  settled    the sender attaches with snd-settle-mode settled and sends pre-settled transfers
             whenever it has link credit and session window; the receiver attaches with
             snd-settle-mode settled (the broker sends pre-settled: at most once).
  unsettled  the sender keeps at most --window unsettled deliveries and counts the broker's
             dispositions (accepted = confirmed; rejected/released/modified = nacked), like publisher
             confirms; the receiver (rcv-settle-mode first) settles with `accepted` in dispositions
             over ranges [first, last], one per --ack-every deliveries or per 1 ms tick.

Receivers grant --credit link credit and top it up when half is used. Transfers are pre-encoded: a
batch of --batch frames is encoded once, and per write only the delivery-id and delivery-tag of each
frame are patched with strided slice assignments (C speed, no per-message Python).

Addresses (--broker): trimaran `queue://bench-<hex>-<i>`; rabbitmq `/amq/queue/bench-<hex>-<i>` (the
3.x rabbitmq_amqp1_0 plugin). On both the coordinator declares the queues first and deletes them after,
over a tiny AMQP 0.9.1 exchange on the same port: durable with --durable, else transient (Trimaran's
in-memory queue, RabbitMQ's classic transient one), so both servers hold the same kind of queue.
`--address` overrides the format ({q} is the queue name) and declares nothing. --durable also sets the
message header's durable flag.

One JSON line per run, then a summary line (median/min/max over --runs).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import socket
import struct
import subprocess
import sys
import time
from array import array
from collections import deque

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib as bl

U16 = struct.Struct("!H")
U32 = struct.Struct("!I")
FH = struct.Struct("!IBBH")  # frame size, doff, type, channel
SASL_HDR = b"AMQP\x03\x01\x00\x00"
AMQP_HDR = b"AMQP\x00\x01\x00\x00"
EMPTY_FRAME = FH.pack(8, 2, 0, 0)
# performative and section descriptors (smallulong codes)
OPEN, BEGIN, ATTACH, FLOW, TRANSFER, DISPOSITION, DETACH, END, CLOSE = range(0x10, 0x19)
ERROR, ACCEPTED, SOURCE, TARGET = 0x1D, 0x24, 0x28, 0x29
SASL_MECHANISMS, SASL_INIT, SASL_OUTCOME = 0x40, 0x41, 0x44
HEADER, DATA = 0x70, 0x75
NAMES = {
    OPEN: "open",
    BEGIN: "begin",
    ATTACH: "attach",
    FLOW: "flow",
    TRANSFER: "transfer",
    DISPOSITION: "disposition",
    DETACH: "detach",
    END: "end",
    CLOSE: "close",
    SASL_MECHANISMS: "sasl-mechanisms",
    SASL_OUTCOME: "sasl-outcome",
}
SESSION_WINDOW = 1 << 20


# --------------------------------------------------------------------------- encoder (only what we send)
NULL, TRUE, FALSE = b"\x40", b"\x41", b"\x42"


def e_uint(v: int) -> bytes:
    return b"\x70" + U32.pack(v)


def e_ubyte(v: int) -> bytes:
    return b"\x50" + bytes([v])


def e_ushort(v: int) -> bytes:
    return b"\x60" + U16.pack(v)


def _var(small: int, big: int, b: bytes) -> bytes:
    return (bytes([small, len(b)]) if len(b) < 256 else bytes([big]) + U32.pack(len(b))) + b


def e_str(s: str) -> bytes:
    return _var(0xA1, 0xB1, s.encode())


def e_sym(s: str) -> bytes:
    return _var(0xA3, 0xB3, s.encode())


def e_bin(b: bytes) -> bytes:
    return _var(0xA0, 0xB0, b)


def e_list(items: list[bytes]) -> bytes:
    while items and items[-1] == NULL:  # trailing nulls are implied
        items = items[:-1]
    if not items:
        return b"\x45"
    body = b"".join(items)
    if len(body) < 255 and len(items) < 256:
        return bytes([0xC0, len(body) + 1, len(items)]) + body
    return b"\xd0" + U32.pack(len(body) + 4) + U32.pack(len(items)) + body


def described(code: int, items: list[bytes]) -> bytes:
    return bytes([0x00, 0x53, code]) + e_list(items)


def frame(body: bytes, ch: int = 0, ftype: int = 0) -> bytes:
    return FH.pack(8 + len(body), 2, ftype, ch) + body


# --------------------------------------------------------------------------- decoder (handshake, slow path)
class Described(tuple):
    """(descriptor, value)"""


_FIXED = {
    0x50: 1,
    0x51: 1,
    0x52: 1,
    0x53: 1,
    0x54: 1,
    0x55: 1,
    0x56: 1,
    0x60: 2,
    0x61: 2,
    0x70: 4,
    0x71: 4,
    0x72: 4,
    0x73: 4,
    0x74: 4,
    0x80: 8,
    0x81: 8,
    0x82: 8,
    0x83: 8,
    0x84: 8,
    0x94: 16,
    0x98: 16,
}
_UNSIGNED = {0x50, 0x52, 0x53, 0x60, 0x70, 0x80, 0x83}
_SIGNED = {0x51, 0x54, 0x55, 0x61, 0x71, 0x81}


def _body(c: int, d, i: int):
    if c == 0x40:
        return None, i
    if c in (0x41, 0x42):
        return c == 0x41, i
    if c in (0x43, 0x44):
        return 0, i
    if c == 0x45:
        return [], i
    if c in _FIXED:
        w = _FIXED[c]
        raw = bytes(d[i : i + w])
        if c == 0x56:
            return raw[0] != 0, i + w
        if c in _UNSIGNED:
            return int.from_bytes(raw, "big"), i + w
        if c in _SIGNED:
            return int.from_bytes(raw, "big", signed=True), i + w
        return raw, i + w
    if c in (0xA0, 0xA1, 0xA3, 0xB0, 0xB1, 0xB3):
        if c < 0xB0:
            n, i = d[i], i + 1
        else:
            n, i = U32.unpack_from(d, i)[0], i + 4
        raw = bytes(d[i : i + n])
        return (raw if c in (0xA0, 0xB0) else raw.decode(errors="replace")), i + n
    if c in (0xC0, 0xC1, 0xD0, 0xD1):
        if c < 0xD0:
            count, i = d[i + 1], i + 2
        else:
            count, i = U32.unpack_from(d, i + 4)[0], i + 8
        items = []
        for _ in range(count):
            v, i = decode(d, i)
            items.append(v)
        if c in (0xC1, 0xD1):
            return dict(zip(items[::2], items[1::2], strict=True)), i
        return items, i
    if c in (0xE0, 0xF0):
        if c == 0xE0:
            count, i = d[i + 1], i + 2
        else:
            count, i = U32.unpack_from(d, i + 4)[0], i + 8
        ec = d[i]
        i += 1
        desc = None
        if ec == 0:
            desc, i = decode(d, i)
            ec, i = d[i], i + 1
        items = []
        for _ in range(count):
            v, i = _body(ec, d, i)
            items.append(Described((desc, v)) if desc is not None else v)
        return items, i
    raise ValueError(f"unknown AMQP 1.0 constructor 0x{c:02x}")


def decode(d, i: int):
    c = d[i]
    if c == 0x00:
        desc, i = decode(d, i + 1)
        val, i = decode(d, i)
        return Described((desc, val)), i
    return _body(c, d, i + 1)


def field(fields: list, n: int, default=None):
    return fields[n] if len(fields) > n and fields[n] is not None else default


def error_text(fields: list, n: int = 0) -> str:
    err = field(fields, n)
    if isinstance(err, Described) and isinstance(err[1], list):
        return f"{field(err[1], 0)}: {field(err[1], 1, '')}"
    return "no error"


def rd_uint(d, j: int) -> tuple[int | None, int]:
    """A uint-ish field of a hot-path performative."""
    c = d[j]
    if c == 0x52:
        return d[j + 1], j + 2
    if c == 0x70:
        return U32.unpack_from(d, j + 1)[0], j + 5
    if c == 0x43:
        return 0, j + 1
    if c == 0x40:
        return None, j + 1
    raise ValueError(f"unexpected constructor 0x{c:02x} for a uint")


def list_start(d, j: int) -> tuple[int, int]:
    """(field count, offset of the first field) of the list at j."""
    c = d[j]
    if c == 0xC0:
        return d[j + 2], j + 3
    if c == 0xD0:
        return U32.unpack_from(d, j + 5)[0], j + 9
    return 0, j + 1  # list0


# --------------------------------------------------------------------------- connection
class Amqp1Conn(asyncio.Protocol):
    """SASL + open/begin/attach via an inbox of decoded performatives; subclasses take the hot path."""

    def __init__(self):
        self.buf = b""
        self.transport = None
        self.lost = False
        self.paused = False
        self.inbox: deque = deque()
        self.waiter: asyncio.Future | None = None
        self.closed_reason = None
        self.hot = False
        self.remote_max_frame = 512
        self.heartbeat = None

    def connection_made(self, t):
        self.transport = t
        t.set_write_buffer_limits(high=256 * 1024)

    def connection_lost(self, exc):
        self.lost = True
        if self.heartbeat:
            self.heartbeat.cancel()
        if not self.closed_reason:
            self.closed_reason = f"connection lost: {exc}"
        self._wake()

    def pause_writing(self):
        self.paused = True

    def resume_writing(self):
        self.paused = False
        self.on_resume()

    def on_resume(self):
        pass

    def _wake(self):
        if self.waiter and not self.waiter.done():
            self.waiter.set_result(None)

    def data_received(self, data):
        if self.buf:
            data = self.buf + data
        used = self.on_data(data) if self.hot else self.slow_data(data)
        self.buf = data[used:] if used < len(data) else b""

    def slow_data(self, data) -> int:
        i, n = 0, len(data)
        while n - i >= 8:
            if data[i : i + 4] == b"AMQP":
                self.inbox.append(("header", bytes(data[i : i + 8])))
                i += 8
                continue
            size = U32.unpack_from(data, i)[0]
            if n - i < size:
                break
            self.slow_frame(data, i, size)
            i += size
        self._wake()
        return i

    def slow_frame(self, data, i: int, size: int):
        s = i + data[i + 4] * 4
        if s >= i + size:
            return  # empty frame (heartbeat)
        perf, _ = decode(data, s)
        code, fields = perf[0], perf[1]
        if code == TRANSFER:
            self.on_transfer_slow(fields)
            return
        if code == FLOW:
            self.on_flow(fields)
            return
        if code == DISPOSITION:
            self.on_disposition_slow(fields)
            return
        if code in (DETACH, END, CLOSE):
            err = error_text(fields, 2 if code == DETACH else 0)
            self.closed_reason = f"broker sent {NAMES[code]}: {err}"
            if code == CLOSE and not self.lost:
                self.transport.write(frame(described(CLOSE, [])))
        self.inbox.append((code, fields))

    def on_flow(self, fields):
        pass

    def on_transfer_slow(self, fields):
        pass

    def on_disposition_slow(self, fields):
        pass

    async def expect(self, code, timeout=30.0):
        deadline = time.monotonic() + timeout
        while True:
            for k, (c, v) in enumerate(self.inbox):
                if c == code:
                    del self.inbox[k]
                    return v
                if c in (DETACH, END, CLOSE):
                    raise ConnectionError(self.closed_reason)
            if self.lost:
                raise ConnectionError(self.closed_reason)
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no {NAMES.get(code, code)} within {timeout:g}s")
            self.waiter = asyncio.get_running_loop().create_future()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.waiter, left)

    def start_heartbeat(self, idle_ms):
        if not idle_ms:
            return
        loop = asyncio.get_running_loop()

        def beat():
            if not self.lost:
                self.transport.write(EMPTY_FRAME)
                self.heartbeat = loop.call_later(idle_ms / 2000.0, beat)

        self.heartbeat = loop.call_later(idle_ms / 2000.0, beat)

    def close(self):
        if not self.lost:
            self.transport.write(frame(described(CLOSE, [])))
            self.transport.close()


async def amqp1_open(factory, cfg, wid: str, role: str, address: str, settled: bool):
    """Connect, authenticate, open, begin and attach one link (handle 0 on channel 0)."""
    loop = asyncio.get_running_loop()
    t, p = await loop.create_connection(factory, cfg["host"], cfg["port"])
    t.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    t.write(SASL_HDR)
    await p.expect("header")
    mechs = field(await p.expect(SASL_MECHANISMS), 0, [])
    mechs = [mechs] if isinstance(mechs, str) else list(mechs)
    if cfg["sasl"] == "plain" and "PLAIN" in mechs:
        init = [e_sym("PLAIN"), e_bin(f"\0{cfg['user']}\0{cfg['password']}".encode())]
    elif "ANONYMOUS" in mechs:
        init = [e_sym("ANONYMOUS"), e_bin(b"bench")]
    else:
        raise ConnectionError(f"no usable SASL mechanism in {mechs}")
    t.write(frame(described(SASL_INIT, init), ftype=1))
    outcome = await p.expect(SASL_OUTCOME)
    if field(outcome, 0, 0) != 0:
        raise ConnectionError(f"SASL {init[0][2:].decode()} refused: code {field(outcome, 0)}")
    p.inbox.clear()
    name = f"bench-{role}-{wid}-{os.getpid()}-{id(p) & 0xFFFF:x}"
    open_ = described(OPEN, [e_str(name), NULL, e_uint(1 << 20), e_ushort(0)])
    begin = described(BEGIN, [NULL, e_uint(0), e_uint(SESSION_WINDOW), e_uint(SESSION_WINDOW)])
    sender = role == "sender"
    terminus = [described(SOURCE, [e_str(name)]), described(TARGET, [e_str(address)])]
    if not sender:
        terminus = [described(SOURCE, [e_str(address)]), described(TARGET, [e_str(name)])]
    attach = described(
        ATTACH,
        [
            e_str(name),
            e_uint(0),
            FALSE if sender else TRUE,
            e_ubyte(1 if settled else 0),
            e_ubyte(0),
            *terminus,
            NULL,
            FALSE,
            e_uint(0) if sender else NULL,
        ],
    )
    t.write(AMQP_HDR + frame(open_) + frame(begin) + frame(attach))
    await p.expect("header")
    ropen = await p.expect(OPEN)
    p.remote_max_frame = field(ropen, 2, 1 << 32) or (1 << 32)
    p.start_heartbeat(field(ropen, 4, 0))
    rbegin = await p.expect(BEGIN)
    rattach = await p.expect(ATTACH)
    node = field(rattach, 6 if sender else 5)
    if node is None:  # a refused link: null terminus, then detach with the reason
        with contextlib.suppress(ConnectionError, TimeoutError):
            await p.expect(DETACH, timeout=2)
        raise ConnectionError(f"{role} link to {address!r} refused: {p.closed_reason}")
    p.setup(rbegin, rattach)
    return p


class Sender(Amqp1Conn):
    def __init__(self):
        super().__init__()
        self.sent = 0  # == next delivery-id == next transfer-id == delivery-count (one link per session)
        self.credit = 0  # link credit left
        self.rwin = 0  # broker's session incoming window left
        self.running = False
        self.settled = True
        self.confirmed = 0
        self.nacked = 0
        self.e2e_window = 0
        self.e2e_timer = None

    def setup(self, rbegin, rattach):
        self.rwin = field(rbegin, 2, 0)
        self.hot = True

    def configure(self, payload, durable, settled, batch, writes_per_turn, window):
        self.loop = asyncio.get_running_loop()
        self.settled = settled
        body = bytes((65 + i % 26) for i in range(payload))
        msg = (
            (bytes([0, 0x53, HEADER]) + e_list([TRUE]) if durable else b"")
            + bytes([0, 0x53, DATA])
            + e_bin(body)
        )
        head = bytes([0, 0x53, TRANSFER, 0xC0, 0, 5, 0x43, 0x70, 0, 0, 0, 0, 0xA0, 4, 0, 0, 0, 0, 0x43])
        perf = head + (TRUE if settled else FALSE)
        perf = perf[:4] + bytes([len(perf) - 5]) + perf[5:]  # list8 size: count byte + fields
        one = frame(perf + msg)
        if len(one) > self.remote_max_frame:
            raise ValueError(
                f"a {len(one)} B transfer exceeds the broker's max-frame-size {self.remote_max_frame}"
            )
        self.rec = len(one)
        self.off_id = 8 + 8  # frame header, descriptor + list8 header, handle, 0x70
        self.off_tag = self.off_id + 4 + 2  # delivery-id, 0xa0 0x04
        assert one[self.off_id - 1] == 0x70 and one[self.off_tag - 2 : self.off_tag] == b"\xa0\x04"
        self.B = batch
        self.tmpl = bytearray(one * batch)
        self.K = writes_per_turn
        self.window = 0 if settled else window
        self.min_chunk = max(1, window // 16)

    def encode(self, n: int) -> bytes:
        """n transfers with delivery-ids (and tags) sent, sent+1, ..."""
        ids = array("I", range(self.sent, self.sent + n))
        if sys.byteorder == "little":
            ids.byteswap()
        raw = ids.tobytes()
        buf, end, r = self.tmpl, n * self.rec, self.rec
        for k in range(4):
            col = raw[k::4]
            buf[self.off_id + k : end : r] = col
            buf[self.off_tag + k : end : r] = col
        return bytes(buf[:end])

    def on_flow(self, fields):
        self.rwin = field(fields, 0, 0) + field(fields, 1, 0) - self.sent
        if field(fields, 4) is not None:  # link flow: credit relative to the broker's delivery-count
            self.credit = field(fields, 5, 0) + field(fields, 6, 0) - self.sent
            if field(fields, 9):
                self.transport.write(self.flow_frame())
        if self.running:
            self.pump()

    def flow_frame(self) -> bytes:
        return frame(
            described(
                FLOW,
                [
                    e_uint(0),
                    e_uint(SESSION_WINDOW),
                    e_uint(self.sent),
                    e_uint(SESSION_WINDOW),
                    e_uint(0),
                    e_uint(self.sent),
                    e_uint(self.credit),
                ],
            )
        )

    def on_data(self, data) -> int:
        i, n = 0, len(data)
        conf = nack = 0
        unpack = U32.unpack_from
        while n - i >= 8:
            size = unpack(data, i)[0]
            if n - i < size:
                break
            s = i + data[i + 4] * 4
            if s + 3 <= i + size and data[s + 2] == DISPOSITION and data[s + 1] == 0x53:
                cnt, j = list_start(data, s + 3)
                j += 1 if data[j] != 0x56 else 2  # role
                first, j = rd_uint(data, j)
                last = first
                if cnt >= 3:
                    last, j = rd_uint(data, j)
                    last = first if last is None else last
                    j += 1 if data[j] != 0x56 else 2  # settled
                ok = cnt < 5 or (data[j] == 0 and data[j + 1] == 0x53 and data[j + 2] == ACCEPTED)
                if ok:
                    conf += last - first + 1
                else:
                    nack += last - first + 1
            elif s < i + size:
                self.slow_frame(data, i, size)
            i += size
        if conf or nack:
            self.confirmed += conf + nack
            self.nacked += nack
            if self.running:
                self.pump()
        return i

    def on_disposition_slow(self, fields):
        first = field(fields, 1, 0)
        n = field(fields, 2, first) - first + 1
        self.confirmed += n
        st = field(fields, 4)
        if st is not None and not (isinstance(st, Described) and st[0] == ACCEPTED):
            self.nacked += n

    def e2e(self, progress, slot, window):
        self.progress, self.slot, self.e2e_window = progress, slot, window

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
        w = self.transport.write
        for _ in range(self.K):
            room = min(self.credit, self.rwin, self.B)
            if self.window:
                room = min(room, self.window - (self.sent - self.confirmed))
                if room < self.min_chunk and room < self.credit and room < self.rwin:
                    return  # wait for dispositions
            if room <= 0 or self.paused:
                return  # wait for flow / resume_writing
            if self.e2e_window:
                if self.e2e_blocked():
                    return
                self.progress[self.slot] += room
            w(self.encode(room))
            self.sent += room
            self.credit -= room
            self.rwin -= room
        self.loop.call_soon(self.pump)


class Receiver(Amqp1Conn):
    def __init__(self):
        super().__init__()
        self.count = 0  # deliveries (== transfers: one frame per message)
        self.last_id = -1
        self.acked_to = -1  # every delivery-id <= this is settled
        self.ack_every = 0  # 0 = pre-settled deliveries, nothing to settle
        self.last_rx = time.monotonic()
        self.rx_interval = 0.0
        self.credit = 0
        self.granted_at = 0

    def setup(self, rbegin, rattach):
        self.next_in0 = field(rbegin, 1, 0)  # the broker's first transfer-id
        self.dc0 = field(rattach, 9, 0)  # the broker's initial delivery-count
        self.hot = True

    def grant(self, credit):
        self.credit = credit
        self._flow()

    def _flow(self):
        self.granted_at = self.count
        self.transport.write(
            frame(
                described(
                    FLOW,
                    [
                        e_uint((self.next_in0 + self.count) & 0xFFFFFFFF),
                        e_uint(SESSION_WINDOW),
                        e_uint(0),
                        e_uint(SESSION_WINDOW),
                        e_uint(0),
                        e_uint((self.dc0 + self.count) & 0xFFFFFFFF),
                        e_uint(self.credit),
                    ],
                )
            )
        )

    def data_received(self, data):
        Amqp1Conn.data_received(self, data)
        if self.rx_interval and not self.lost:
            self.transport.pause_reading()
            asyncio.get_running_loop().call_later(self.rx_interval, self._resume_rx)

    def _resume_rx(self):
        if not self.lost and not self.transport.is_closing():
            self.transport.resume_reading()

    def on_data(self, data) -> int:
        i, n = 0, len(data)
        cnt = 0
        first = last = -1
        unpack = U32.unpack_from
        while n - i >= 8:
            size = unpack(data, i)[0]
            if n - i < size:
                break
            s = i + data[i + 4] * 4
            if s + 3 <= i + size and data[s + 2] == TRANSFER and data[s + 1] == 0x53:
                cnt += 1
                if cnt == 1:
                    first = s
                last = s
            elif s < i + size:
                self.slow_frame(data, i, size)
            i += size
        if cnt:
            self.count += cnt
            self.last_rx = time.monotonic()
            if self.ack_every:
                if self.last_id < 0:  # the broker's first delivery-id: settle from there
                    self.acked_to = self.delivery_id(data, first) - 1
                self.last_id = self.delivery_id(data, last)
                if self.last_id - self.acked_to >= self.ack_every:
                    self.ack()
            if self.count - self.granted_at >= self.credit // 2:
                self._flow()
        return i

    @staticmethod
    def delivery_id(data, s: int) -> int:
        _, j = list_start(data, s + 3)
        _, j = rd_uint(data, j)  # handle
        return rd_uint(data, j)[0]

    def on_transfer_slow(self, fields):
        self.count += 1
        if field(fields, 1) is not None:
            self.last_id = fields[1]

    def ack(self):
        if self.ack_every and self.last_id > self.acked_to and not self.lost:
            first = self.acked_to + 1
            self.transport.write(
                frame(
                    described(
                        DISPOSITION,
                        [TRUE, e_uint(first), e_uint(self.last_id), TRUE, described(ACCEPTED, [])],
                    )
                )
            )
            self.acked_to = self.last_id


# --------------------------------------------------------------------------- worker roles
async def role_receiver(wid, cfg, sync: bl.Sync):
    loop = asyncio.get_running_loop()
    settled = cfg["settled"]
    recs = []
    for addr in cfg["addresses"]:
        p = await amqp1_open(Receiver, cfg, wid, "receiver", addr, settled)
        if not settled:
            p.ack_every = cfg["ack_every"]
        p.grant(cfg["credit"])
        recs.append(p)
    sync.ready(n=len(recs))
    _, tws, twe, tstop = await sync.wait_go()
    if settled and cfg["rx_batch_ms"]:
        for p in recs:
            p.rx_interval = cfg["rx_batch_ms"] / 1000.0
    slot = 32 + cfg["index"]
    progress = sync.progress

    def report():
        progress[slot] = sum(p.count for p in recs)
        for p in recs:  # settle a trickle too
            if p.ack_every and p.last_id > p.acked_to and time.monotonic() - p.last_rx > 0.001:
                p.ack()
        loop.call_later(0.001, report)

    report()
    win = bl.Window(loop, tws, twe, lambda: sum(p.count for p in recs))
    end_reason = None
    while True:
        await asyncio.sleep(0.02)
        now = time.monotonic()
        if now < tstop + 0.05:
            continue
        for p in recs:
            p.rx_interval = 0.0
        got = sum(p.count for p in recs)
        exp = sync.expected()
        if exp >= 0 and got >= exp:
            end_reason = "complete"
            break
        if now - max(p.last_rx for p in recs) > cfg["idle"] and now - tstop > cfg["idle"]:
            end_reason = "idle"
            break
        if now - tstop > cfg["drain_max"]:
            end_reason = "deadline"
            break
        if any(p.lost or p.closed_reason for p in recs):
            end_reason = "closed: " + str([p.closed_reason for p in recs if p.closed_reason])
            break
    drain_s = time.monotonic() - tstop
    for p in recs:
        p.ack()
    sync.result(
        received=sum(p.count for p in recs),
        drain_s=round(drain_s, 3),
        end=end_reason,
        lost=sum(p.lost for p in recs),
        closed=[p.closed_reason for p in recs if p.closed_reason],
        **win.export(),
    )
    while not sync.aborted():
        await asyncio.sleep(0.05)
    for p in recs:
        p.close()


async def role_sender(wid, cfg, sync: bl.Sync):
    loop = asyncio.get_running_loop()
    settled = cfg["settled"]
    snds = []
    for addr in cfg["addresses"]:
        p = await amqp1_open(Sender, cfg, wid, "sender", addr, settled)
        p.configure(
            cfg["payload"], cfg["durable"], settled, cfg["batch"], cfg["writes_per_turn"], cfg["window"]
        )
        if cfg["e2e"]:
            p.e2e(sync.progress, cfg["index"], cfg["e2e"])
        snds.append(p)
    sync.ready(n=len(snds))
    t0, tws, twe, tstop = await sync.wait_go()
    win = bl.Window(loop, tws, twe, lambda: sum(p.sent for p in snds))
    cwin = bl.Window(loop, tws, twe, lambda: sum(p.confirmed for p in snds))
    for p in snds:
        bl.at(loop, t0, p.start, tstop)
    await asyncio.sleep(max(0.0, tstop - time.monotonic()) + 0.01)
    deadline = time.monotonic() + cfg["drain_max"]
    while (
        not settled and time.monotonic() < deadline and any(p.confirmed < p.sent and not p.lost for p in snds)
    ):
        await asyncio.sleep(0.01)
    while time.monotonic() < deadline and any(
        p.transport.get_write_buffer_size() for p in snds if not p.lost
    ):
        await asyncio.sleep(0.01)
    c = cwin.export()
    sync.result(
        sent=sum(p.sent for p in snds),
        confirmed=sum(p.confirmed for p in snds),
        nacked=sum(p.nacked for p in snds),
        lost=sum(p.lost for p in snds),
        closed=[p.closed_reason for p in snds if p.closed_reason],
        confirm_rate=c["win_count"] / c["win_s"] if c["win_s"] else 0.0,
        **win.export(),
    )
    while not sync.aborted():
        await asyncio.sleep(0.05)
    for p in snds:
        p.close()


# --------------------------------------------------------------------------- queues on RabbitMQ (AMQP 0.9.1)
def _short(s: str) -> bytes:
    b = s.encode()
    return bytes([len(b)]) + b


def _method(ch: int, cls: int, mth: int, args: bytes = b"") -> bytes:
    payload = struct.pack("!HH", cls, mth) + args
    return struct.pack("!BHI", 1, ch, len(payload)) + payload + b"\xce"


def rabbitmq_queues(host, port, user, password, vhost, names, op, durable=False, timeout=10.0):
    """Declare (op='declare') or delete (op='delete') queues with a minimal AMQP 0.9.1 client (RabbitMQ
    and Trimaran alike)."""
    with socket.create_connection((host, port), timeout=timeout) as s:
        f = s.makefile("rb")

        def expect(cls, mth):
            while True:
                t, _ch, size = struct.unpack("!BHI", f.read(7))
                payload = f.read(size + 1)[:-1]
                if t != 1:
                    continue
                got = struct.unpack_from("!HH", payload)
                if got in ((10, 50), (20, 40)):
                    code = struct.unpack_from("!H", payload, 4)[0]
                    raise ConnectionError(f"RabbitMQ closed: {code} {payload[7 : 7 + payload[6]].decode()}")
                if got == (cls, mth):
                    return payload[4:]

        s.sendall(b"AMQP\x00\x00\x09\x01")
        expect(10, 10)
        resp = f"\0{user}\0{password}".encode()
        s.sendall(
            _method(0, 10, 11, U32.pack(0) + _short("PLAIN") + U32.pack(len(resp)) + resp + _short("en_US"))
        )
        ch_max, frame_max, _ = struct.unpack("!HIH", expect(10, 30)[:8])
        s.sendall(_method(0, 10, 31, struct.pack("!HIH", ch_max or 2047, frame_max or 131072, 0)))
        s.sendall(_method(0, 10, 40, _short(vhost) + _short("") + b"\x00"))
        expect(10, 41)
        s.sendall(_method(1, 20, 10, _short("")))
        expect(20, 11)
        for q in names:
            if op == "declare":
                s.sendall(
                    _method(
                        1, 50, 10, b"\x00\x00" + _short(q) + bytes([0x02 if durable else 0]) + U32.pack(0)
                    )
                )
                expect(50, 11)
            else:
                s.sendall(_method(1, 50, 40, b"\x00\x00" + _short(q) + b"\x00"))
                expect(50, 41)
        s.sendall(_method(0, 10, 50, struct.pack("!H", 200) + _short("bye") + struct.pack("!HH", 0, 0)))
        expect(10, 51)


# --------------------------------------------------------------------------- coordinator
def spread(items, nproc):
    nproc = max(1, min(nproc, len(items)))
    return [items[i::nproc] for i in range(nproc)]


def run_once(a, run_idx, broker_pid):
    settled = a.scenario == "settled"
    tag = os.urandom(3).hex()
    queues = [f"bench-{tag}-{i}" for i in range(a.queues)]
    fmt = a.address or ("/amq/queue/{q}" if a.broker == "rabbitmq" else "queue://{q}")
    addrs = [fmt.format(q=q) for q in queues]
    sasl = a.sasl or ("plain" if a.broker == "rabbitmq" else "anonymous")
    base = dict(
        host=a.host,
        port=a.port,
        user=a.user,
        password=a.password,
        sasl=sasl,
        settled=settled,
        durable=a.durable,
        payload=a.payload,
        drain_max=a.drain_max,
        idle=a.idle,
    )
    declare = not a.address
    if declare:
        rabbitmq_queues(a.host, a.port, a.user, a.password, a.vhost, queues, "declare", durable=a.durable)
    rgroups = spread(list(range(a.receivers)), a.sub_procs)
    rwids = [f"rcv{i}" for i in range(len(rgroups))]
    sgroups = spread(list(range(a.senders)), a.pub_procs)
    swids = [f"snd{i}" for i in range(len(sgroups))]
    coord = bl.Coordinator(broker_pid, storage_pid=a.storage_pid)
    coord.shared[bl.EXPECT] = -1
    try:
        coord.spawn(
            role_receiver,
            rwids,
            [
                dict(
                    base,
                    addresses=[addrs[j % len(addrs)] for j in g],
                    index=i,
                    credit=a.credit,
                    ack_every=a.ack_every,
                    rx_batch_ms=a.rx_batch_ms,
                )
                for i, g in enumerate(rgroups)
            ],
        )
        coord.spawn(
            role_sender,
            swids,
            [
                dict(
                    base,
                    addresses=[addrs[j % len(addrs)] for j in g],
                    index=i,
                    batch=a.batch,
                    writes_per_turn=a.writes_per_turn,
                    window=a.window,
                    e2e=a.e2e_window,
                )
                for i, g in enumerate(sgroups)
            ],
        )
        coord.start(a.warmup, a.duration)
        samples = coord.sample_window()
        sres = coord.collect(swids, timeout=a.drain_max + 60)
        sent = sum(r["sent"] for r in sres.values() if r)
        coord.set_expected(sent)  # competing receivers: each message is received once
        rres = coord.collect(rwids, timeout=a.drain_max + 60)
    finally:
        coord.close()
        if declare and not a.keep_queues:
            with contextlib.suppress(OSError, ConnectionError):
                rabbitmq_queues(a.host, a.port, a.user, a.password, a.vhost, queues, "delete")
    received = sum(r["received"] for r in rres.values() if r)
    dt = samples["window_s"]
    r_cpu = sum(r["win_cpu_s"] for r in rres.values() if r)
    s_cpu = sum(r["win_cpu_s"] for r in sres.values() if r)
    out = dict(
        sent=sent,
        received=received,
        expected=sent,
        duration=dt,
        msgs_per_s_received=round(
            sum(r["win_count"] / r["win_s"] for r in rres.values() if r and r["win_s"]), 1
        ),
        msgs_per_s_sent=round(sum(r["win_count"] / r["win_s"] for r in sres.values() if r and r["win_s"]), 1),
        loss=round(1 - received / sent, 6) if sent else None,
        confirmed=None if settled else sum(r["confirmed"] for r in sres.values() if r),
        confirm_rate=None if settled else round(sum(r["confirm_rate"] for r in sres.values() if r), 1),
        nacked=sum(r["nacked"] for r in sres.values() if r),
        broker_cpu_pct=samples.get("broker_cpu_pct"),
        gen_cpu_pct=round(100.0 * (r_cpu + s_cpu + samples.get("coord_cpu_s", 0)) / dt, 1),
        gen_cpu_pub_pct=round(100.0 * s_cpu / dt, 1),
        gen_cpu_sub_pct=round(100.0 * r_cpu / dt, 1),
        drain_s=max((r["drain_s"] for r in rres.values() if r), default=None),
        drain_end=sorted({r["end"] for r in rres.values() if r}),
        conn_lost=sum(r["lost"] for r in list(rres.values()) + list(sres.values()) if r),
        broker_rss_kb=samples.get("broker_rss_kb"),
    )
    closed = [c for r in list(sres.values()) + list(rres.values()) if r for c in r["closed"]]
    if closed:
        out["server_closed"] = closed
    out.update({k: v for k, v in samples.items() if k.startswith(("cpu", "other_", "storage_"))})
    if coord.errors:
        out["error"] = coord.errors
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("scenario", choices=["settled", "unsettled"])
    ap.add_argument(
        "--broker",
        choices=["trimaran", "rabbitmq"],
        default="trimaran",
        help="address format and default SASL mechanism",
    )
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=5672)
    ap.add_argument(
        "--address", default="", help="address format with {q} for the queue name (overrides --broker's)"
    )
    ap.add_argument(
        "--sasl",
        choices=["plain", "anonymous"],
        default="",
        help="default: plain (guest/guest) for rabbitmq, anonymous for trimaran",
    )
    ap.add_argument("--user", default="guest")
    ap.add_argument("--password", default="guest")
    ap.add_argument("--vhost", default="/", help="rabbitmq: vhost of the AMQP 0.9.1 queue declaration")
    ap.add_argument("--label", default="")
    ap.add_argument("--broker-pid", type=int, default=0)
    ap.add_argument("--senders", "-P", type=int, default=1)
    ap.add_argument("--receivers", "-C", type=int, default=1)
    ap.add_argument("--queues", "-Q", type=int, default=1)
    ap.add_argument("--payload", type=int, default=64)
    ap.add_argument(
        "--durable", action="store_true", help="durable header on every message; rabbitmq: durable queue"
    )
    ap.add_argument("--window", type=int, default=1000, help="unsettled: max unsettled deliveries per sender")
    ap.add_argument("--credit", type=int, default=2000, help="link credit per receiver (topped up at half)")
    ap.add_argument(
        "--ack-every", type=int, default=100, help="unsettled: a disposition per this many deliveries"
    )
    ap.add_argument("--batch", type=int, default=128, help="transfers per write")
    ap.add_argument("--writes-per-turn", type=int, default=4)
    ap.add_argument(
        "--e2e-window",
        type=int,
        default=0,
        help="closed loop: senders hold back while more than this "
        "many messages are sent but not yet received (0 = open loop)",
    )
    ap.add_argument(
        "--rx-batch-ms",
        type=float,
        default=1.0,
        help="settled receivers pause this long after each "
        "read so reads are batched (0 = wake per segment; unsettled receivers never pause)",
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
    broker_pid = a.broker_pid or bl.find_listener_pid(a.port)
    keys = [
        "broker",
        "host",
        "port",
        "senders",
        "receivers",
        "queues",
        "payload",
        "durable",
        "credit",
        "warmup",
        "duration",
        "drain_max",
        "pub_procs",
        "sub_procs",
        "batch",
        "writes_per_turn",
        "e2e_window",
    ]
    keys += ["window", "ack_every"] if a.scenario == "unsettled" else ["rx_batch_ms"]
    params = {k: getattr(a, k) for k in keys}
    params["address"] = a.address or None
    state = {"broker_pid": broker_pid}

    def one_run(r):
        bp = state["broker_pid"]
        rec = dict(
            scenario=f"amqp1-{a.scenario}",
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
