"""MQTT over TLS: handshakes a second, full and resumed, and memory per idle TLS connection (issue 47).

Each broker (`--brokers trimaran,mosquitto`) gets the same certificate and key (made here with
trustme: an ECDSA P-256 key under a throwaway CA) and negotiates what its OpenSSL and the client
prefer (TLS 1.3, TLS_AES_256_GCM_SHA384 here; each run records what it got). The broker is pinned
to CPU 0, and the generator's `--procs` processes to CPU 1, each opening connections one after
another: TCP connect, TLS handshake, MQTT 3.1.1 CONNECT and CONNACK, DISCONNECT, close.

- `full`: a new TLS session every time (what a device that restarted does).
- `resumed`: each process offers the session ticket of its last connection (TLS 1.3 resumption).
- `plain`: the same over plain TCP, for what a connection costs without TLS.
- `idle`: `--idle` connections held open over plain TCP, then over TLS, each on a freshly started
  broker; the broker's RSS growth per connection of each, once it settles.
- `publish`: messages through TLS both ways: `--publishers` connections each send `--messages`
  QoS 0 PUBLISHes of 64 bytes to 16 topics of their own in turn (written a thousand at a time), and
  one subscriber to all of them reads them; the rate they arrive at and the broker's CPU a message.

The broker's CPU per handshake comes from /proc (its process tree), over the handshakes' window;
`gen_cpu_pct` says how busy the generator's core was (near 100: the generator is the limit).

    python bench/tls_bench.py [--brokers trimaran,mosquitto] [--handshakes 3000] [--procs 3] [--idle 2000]
        [--publishers 4 --messages 250000]

Prints one JSON object per broker and kind of run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import socket
import ssl
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import brokers  # noqa: E402
from idle_bench import _read_exactly, connect_packet, settle_rss, subscribe_packet  # noqa: E402

from trimaran.mqtt.codec import encode  # noqa: E402
from trimaran.mqtt.packets import MQTT_3_1_1, Publish  # noqa: E402

BROKER_CPU, GEN_CPU = 0, 1
DISCONNECT = b"\xe0\x00"


def _mqtt_connect(sock: socket.socket | ssl.SSLSocket, client_id: str) -> None:
    sock.sendall(connect_packet(client_id, keep_alive=60))
    connack = _read_exactly(sock, 4)
    if connack[0] != 0x20 or connack[3] != 0:
        raise ConnectionError(f"CONNACK refused: {connack!r}")


def _handshakes(address: tuple[str, int], ca: str, count: int, kind: str, worker: int) -> dict[str, Any]:
    """One generator process: ``count`` connections in a row (``kind``: full, resumed or plain)."""
    os.sched_setaffinity(0, {GEN_CPU})
    context = ssl.create_default_context(cafile=ca)
    session: ssl.SSLSession | None = None
    resume = kind == "resumed"
    reused = 0
    started = time.perf_counter()
    for i in range(count):
        raw = socket.create_connection(address, timeout=30)
        raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if kind == "plain":
            with raw:
                _mqtt_connect(raw, f"plain-{worker}-{i}")
                raw.sendall(DISCONNECT)
            continue
        with context.wrap_socket(raw, server_hostname=address[0], session=session) as sock:
            _mqtt_connect(sock, f"tls-{worker}-{i}")
            reused += sock.session_reused
            if resume:
                session = sock.session  # read after CONNACK: the TLS 1.3 ticket came before it
            sock.sendall(DISCONNECT)
    return {"elapsed_s": time.perf_counter() - started, "reused": reused}


def _tls_client(
    address: tuple[str, int], context: ssl.SSLContext, client_id: str, timeout: float = 30
) -> ssl.SSLSocket:
    """A TLS connection with its MQTT CONNECT answered."""
    sock = context.wrap_socket(socket.create_connection(address, timeout=timeout), server_hostname=address[0])
    _mqtt_connect(sock, client_id)
    return sock


def _cipher(address: tuple[str, int], ca: str) -> str:
    with _tls_client(address, ssl.create_default_context(cafile=ca), "tls-probe") as sock:
        name, version, _bits = sock.cipher() or ("?", "?", 0)
        sock.sendall(DISCONNECT)
        return f"{version} {name}"


def rate(running: brokers.Running, ca: str, a: argparse.Namespace, kind: str) -> dict[str, Any]:
    assert running.tls is not None and running.mqtt is not None
    per = a.handshakes // a.procs
    address = running.mqtt if kind == "plain" else running.tls
    cpu0, gen0, wall0 = brokers.cpu_seconds([running.pid]), _core_busy(GEN_CPU), time.monotonic()
    with multiprocessing.get_context("spawn").Pool(a.procs) as pool:
        jobs = [(address, ca, per, kind, w) for w in range(a.procs)]
        results = pool.starmap(_handshakes, jobs)
    wall = time.monotonic() - wall0
    cpu, gen = brokers.cpu_seconds([running.pid]) - cpu0, _core_busy(GEN_CPU) - gen0
    total = per * a.procs
    return {
        "broker": running.name,
        "version": running.version,
        "kind": kind,
        "handshakes": total,
        "per_s": round(total / wall),
        "broker_cpu_us_per_handshake": round(cpu * 1e6 / total, 1),
        "broker_cpu_pct": round(100 * cpu / wall, 1),
        "gen_cpu_pct": round(100 * gen / wall, 1),
        "reused": sum(r["reused"] for r in results),
        "cipher": "none" if kind == "plain" else _cipher(running.tls, ca),
    }


def idle(running: brokers.Running, ca: str, count: int, wrap: bool) -> float:
    """The broker's RSS growth per connection held open over TLS (``wrap``) or plain TCP, measured
    on a broker that held no connection before (freed memory would be reused and hide the cost)."""
    address = running.tls if wrap else running.mqtt
    assert address is not None
    context = ssl.create_default_context(cafile=ca)
    before = settle_rss(running.pid, 5)
    held: list[socket.socket] = []
    try:
        for i in range(count):
            if wrap:
                sock: socket.socket = _tls_client(address, context, f"idle-{i}")
            else:
                sock = socket.create_connection(address, timeout=30)
                _mqtt_connect(sock, f"idle-{i}")
            held.append(sock)
        after = settle_rss(running.pid, 10)
    finally:
        for sock in held:
            with contextlib.suppress(OSError):
                sock.close()
    return round((after - before) / count, 2)


PAYLOAD = bytes(64)
BATCH = 1000  # PUBLISHes a write of the generator


def _publisher(address: tuple[str, int], ca: str, count: int, worker: int) -> None:
    os.sched_setaffinity(0, {GEN_CPU})
    sock = _tls_client(address, ssl.create_default_context(cafile=ca), f"pub-{worker}", timeout=60)
    # 16 topics in turn (a device's readings): no run of one topic forms to be routed at once.
    batch = b"".join(
        encode(Publish(topic=f"t/{worker}/{i % 16:02d}", payload=PAYLOAD), MQTT_3_1_1) for i in range(BATCH)
    )
    for _ in range(count // BATCH):
        sock.sendall(batch)
    sock.sendall(DISCONNECT)
    sock.close()


def _subscriber(address: tuple[str, int], ca: str, expected: int, ready: Any, out: Any) -> None:
    """Reads until ``expected`` bytes came or none came for 5 s; puts (bytes, first, last) times."""
    os.sched_setaffinity(0, {GEN_CPU})
    sock = _tls_client(address, ssl.create_default_context(cafile=ca), "sub", timeout=60)
    sock.sendall(subscribe_packet(1, "t/#"))
    _read_exactly(sock, 5)  # the SUBACK
    sock.settimeout(5)
    ready.set()
    got, first, last = 0, 0.0, 0.0
    buffer = bytearray(1 << 20)
    try:
        while got < expected:
            n = sock.recv_into(buffer)
            if not n:
                break
            last = time.monotonic()
            first = first or last
            got += n
    except TimeoutError:
        pass
    out.put((got, first, last))
    sock.close()


def publish(running: brokers.Running, ca: str, a: argparse.Namespace) -> dict[str, Any]:
    assert running.tls is not None
    assert a.publishers <= 10  # one digit each: every PUBLISH is the same size
    size = len(encode(Publish(topic="t/0/00", payload=PAYLOAD), MQTT_3_1_1))
    sent = a.publishers * (a.messages // BATCH) * BATCH
    spawn = multiprocessing.get_context("spawn")
    ready, out = spawn.Event(), spawn.Queue()
    reader = spawn.Process(target=_subscriber, args=(running.tls, ca, sent * size, ready, out))
    reader.start()
    ready.wait(30)
    cpu0, wall0 = brokers.cpu_seconds([running.pid]), time.monotonic()
    with spawn.Pool(a.publishers) as pool:
        pool.starmap(_publisher, [(running.tls, ca, a.messages, w) for w in range(a.publishers)])
    got, _first, last = out.get(timeout=120)
    cpu = brokers.cpu_seconds([running.pid]) - cpu0
    reader.join()
    delivered = got // size
    wall = (last if delivered else time.monotonic()) - wall0
    return {
        "broker": running.name,
        "version": running.version,
        "kind": "publish",
        "publishers": a.publishers,
        "sent": sent,
        "delivered": delivered,
        "per_s": round(delivered / wall) if wall > 0 else 0,
        "broker_cpu_us_per_message": round(cpu * 1e6 / max(delivered, 1), 2),
        "cipher": _cipher(running.tls, ca),
    }


def _core_busy(cpu: int) -> float:
    """Seconds core ``cpu`` has been busy (/proc/stat)."""
    with open("/proc/stat") as f:
        for line in f:
            if line.startswith(f"cpu{cpu} "):
                user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in line.split()[1:9])
                return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")
    return 0.0


@contextlib.contextmanager
def started(name: str, cert: str, key: str) -> Iterator[brokers.Running]:
    if name == "mosquitto":
        # TCP_NODELAY: with Nagle on (its default) every handshake waits out delayed ACKs, 67 a second
        with brokers.mosquitto(nodelay=True, tls=(cert, key)) as running:
            yield running
        return
    os.environ["TRIMARAN_LISTENERS__TLS__CERT_FILE"] = cert
    os.environ["TRIMARAN_LISTENERS__TLS__KEY_FILE"] = key
    python = str(HERE.parent / ".venv" / "bin" / "python")
    with brokers.trimaran(
        python=python if Path(python).exists() else sys.executable, extra_args=["--mqtt-tls", "127.0.0.1:0"]
    ) as running:
        yield running


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--brokers", default="trimaran,mosquitto")
    parser.add_argument("--handshakes", type=int, default=3000)
    parser.add_argument("--procs", type=int, default=3, help="generator processes, all on CPU 1")
    parser.add_argument(
        "--idle", type=int, default=2000, help="connections held for the memory run (0: none)"
    )
    parser.add_argument("--publishers", type=int, default=4, help="TLS publishers (0: no publish run)")
    parser.add_argument("--messages", type=int, default=250_000, help="QoS 0 PUBLISHes of each")
    parser.add_argument("--out", help="append every result as a JSON line here")
    a = parser.parse_args()
    import trustme

    os.sched_setaffinity(0, {BROKER_CPU})  # the brokers inherit it; the generator moves to CPU 1
    with tempfile.TemporaryDirectory(prefix="bench-tls-") as tmp:
        authority = trustme.CA()
        issued = authority.issue_cert("127.0.0.1", "localhost")
        ca, cert, key = (str(Path(tmp, n)) for n in ("ca.pem", "cert.pem", "key.pem"))
        authority.cert_pem.write_to_path(ca)
        issued.cert_chain_pems[0].write_to_path(cert)
        issued.private_key_pem.write_to_path(key)
        # Mosquitto started as root drops to its own user, which must read them (a throwaway key)
        os.chmod(tmp, 0o755)
        for path in (ca, cert, key):
            os.chmod(path, 0o644)
        for name in (n.strip() for n in a.brokers.split(",") if n.strip()):
            with started(name, cert, key) as running:
                if running.tls is None:
                    print(json.dumps({"broker": name, "error": "no TLS listener"}), flush=True)
                    continue
                results = [rate(running, ca, a, kind) for kind in ("plain", "full", "resumed")]
                if a.publishers:
                    results.append(publish(running, ca, a))
            if a.idle:
                memory: dict[str, Any] = {"broker": name, "kind": "idle", "connections": a.idle}
                for over, wrap in (("plain", False), ("tls", True)):  # a fresh broker for each
                    with started(name, cert, key) as running:
                        memory["version"] = running.version
                        memory[f"{over}_kib_per_connection"] = idle(running, ca, a.idle, wrap)
                plain = memory["plain_kib_per_connection"]
                memory["tls_over_plain"] = (
                    round(memory["tls_kib_per_connection"] / plain, 2) if plain > 0 else None
                )
                results.append(memory)
            for result in results:
                print(json.dumps(result), flush=True)
                if a.out:
                    with open(a.out, "a") as f:
                        f.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
