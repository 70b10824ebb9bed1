#!/usr/bin/env python3
"""Trivial MQTT 3.1.1 QoS 0 relay: the "ceiling" for a Python broker's hot path.

Not a broker.  CONNECT -> CONNACK, SUBSCRIBE -> SUBACK (granted QoS 0), PINGREQ ->
PINGRESP, DISCONNECT -> close, PUBLISH (QoS 0) forwarded byte-for-byte to every
connection with a filter equal to the topic, '#', or 'prefix/#' matching it.  No
sessions, retained messages, QoS 1/2, auth, will, or validation worth the name.

Hot path: BufferedProtocol over a 64 KiB receive buffer, packets parsed in place,
a per-topic cache of destinations, and one write per destination per read.  If a
destination's transport passes its high-water mark the publishing connection stops
reading until it drains (so memory stays bounded).

    python relay_ceiling.py --port 29885            # uvloop if importable
"""

import argparse
import asyncio
import os
import signal

RBUF = 64 * 1024
subs_exact: dict = {}  # topic bytes -> set(conn)
subs_prefix: dict = {}  # b'' for '#', b'a/b/' for 'a/b/#' -> set(conn)
route_cache: dict = {}  # topic bytes -> tuple(conn)


def route(topic):
    dst = set(subs_exact.get(topic, ()))
    for pre, conns in subs_prefix.items():
        if topic.startswith(pre) and not topic.startswith(b"$"):
            dst |= conns
    r = route_cache[topic] = tuple(dst)
    return r


class Conn(asyncio.BufferedProtocol):
    def connection_made(self, t):
        self.t = t
        self.buf = bytearray(RBUF)
        self.n = 0
        self.filters = []
        self.paused = False
        self.blocked = set()  # publishers we stopped reading from because we were full
        t.set_write_buffer_limits(high=1 << 20)

    def get_buffer(self, hint):
        if len(self.buf) - self.n < 4096:  # packet larger than the buffer: grow
            nb = bytearray(2 * len(self.buf))
            nb[: self.n] = self.buf[: self.n]
            self.buf = nb
        return memoryview(self.buf)[self.n :]

    def buffer_updated(self, nbytes):
        buf = self.buf
        n = self.n + nbytes
        i = 0
        out = {}
        while n - i >= 2:
            j = i + 1
            rl = 0
            shift = 0
            while True:
                if j >= n:
                    rl = -1
                    break
                b = buf[j]
                j += 1
                rl |= (b & 0x7F) << shift
                if b < 0x80:
                    break
                shift += 7
                if shift > 21:
                    self.t.close()
                    return
            if rl < 0 or j + rl > n:
                break
            end = j + rl
            h = buf[i] >> 4
            if h == 3:
                tl = (buf[j] << 8) | buf[j + 1]
                topic = bytes(buf[j + 2 : j + 2 + tl])
                dst = route_cache.get(topic)
                if dst is None:
                    dst = route(topic)
                if dst:
                    pkt = bytes(buf[i:end]) if not buf[i] & 0x07 else self.downgrade(buf, i, j, end, tl)
                    for c in dst:
                        lst = out.get(c)
                        if lst is None:
                            out[c] = [pkt]
                        else:
                            lst.append(pkt)
            elif h == 1:
                self.t.write(b"\x20\x02\x00\x00")
            elif h == 8:
                self.subscribe(buf, j, end)
            elif h == 12:
                self.t.write(b"\xd0\x00")
            elif h == 14:
                self.t.close()
            i = end
        if i:
            buf[: n - i] = buf[i:n]
        self.n = n - i
        for c, pkts in out.items():
            c.t.write(b"".join(pkts))
            if c.paused and self not in c.blocked:
                c.blocked.add(self)
                self.t.pause_reading()

    def downgrade(self, buf, i, j, end, tl):
        """QoS>0 in: PUBACK it if QoS 1 and forward as QoS 0 (packet id removed)."""
        pid = bytes(buf[j + 2 + tl : j + 4 + tl])
        if buf[i] & 0x06 == 0x02:
            self.t.write(b"\x40\x02" + pid)
        body = bytes(buf[j : j + 2 + tl]) + bytes(buf[j + 4 + tl : end])
        rl = bytearray()
        x = len(body)
        while True:
            rl.append((x & 0x7F) | (0x80 if x > 0x7F else 0))
            x >>= 7
            if not x:
                break
        return b"\x30" + bytes(rl) + body

    def subscribe(self, buf, j, end):
        pid = bytes(buf[j : j + 2])
        k = j + 2
        codes = bytearray()
        while k < end:
            fl = (buf[k] << 8) | buf[k + 1]
            f = bytes(buf[k + 2 : k + 2 + fl])
            k += 3 + fl
            if f == b"#" or f.endswith(b"/#"):
                subs_prefix.setdefault(f[:-1], set()).add(self)
            else:
                subs_exact.setdefault(f, set()).add(self)
            self.filters.append(f)
            codes.append(0)
        route_cache.clear()
        self.t.write(b"\x90" + bytes([2 + len(codes)]) + pid + bytes(codes))

    def pause_writing(self):
        self.paused = True

    def resume_writing(self):
        self.paused = False
        for p in self.blocked:
            if not p.t.is_closing():
                p.t.resume_reading()
        self.blocked.clear()

    def connection_lost(self, exc):
        for f in self.filters:
            d = subs_prefix if f == b"#" or f.endswith(b"/#") else subs_exact
            key = f[:-1] if d is subs_prefix else f
            d.get(key, set()).discard(self)
        route_cache.clear()
        self.resume_writing()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=1883)
    ap.add_argument("--no-uvloop", action="store_true")
    a = ap.parse_args()
    if not a.no_uvloop:
        try:
            import uvloop

            asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
        except ImportError:
            pass
    loop = asyncio.new_event_loop()
    srv = loop.run_until_complete(loop.create_server(Conn, a.host, a.port, backlog=4096))
    loop.add_signal_handler(signal.SIGTERM, loop.stop)
    loop.add_signal_handler(signal.SIGINT, loop.stop)
    print(
        f"relay_ceiling pid={os.getpid()} listening {a.host}:{a.port} loop={type(loop).__module__}",
        flush=True,
    )
    loop.run_forever()
    srv.close()


if __name__ == "__main__":
    main()
