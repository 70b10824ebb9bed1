"""Connections that come and go: does the broker's memory level off? (issue 47)

`--cycles` connect / subscribe / publish / disconnect cycles against Trimaran (pinned to CPU 0),
from `--procs` generator processes on CPU 1, each running `--concurrency` cycles at a time:

- `mqtt`: an MQTT 3.1.1 client with a clean session connects, subscribes to a filter of its own at
  QoS 0, publishes one message to it, reads it back and disconnects.
- `amqp091`: an AMQP 0.9.1 client opens a connection and a channel, declares an exclusive
  server-named queue, binds it to `amq.topic` with a key of its own, publishes one message there,
  and closes the connection.

Half the cycles use names (client ids, topics, keys) never seen before, half come back to the same
few. The broker's RSS is read after the first `--first` cycles and every `--every` after; the
result says how far the last reading is from the first (issue 47's bar: within 10%).

    python bench/churn_bench.py --protocol mqtt --cycles 1000000
    python bench/churn_bench.py --protocol amqp091 --cycles 1000000

Prints one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import sys
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import amqp091_load as amqp  # noqa: E402
import brokers  # noqa: E402
from storm_bench import BROKER_CPU, GEN_CPU, _connect, _packets, _publish, _subscribe  # noqa: E402

BATCH = 1000  # cycles a generator process runs between two reports


def _name(worker: int, loop: int, i: int) -> str:
    """New names on even cycles, the same four a loop again and again on odd ones (one loop's cycles
    run one after another, so a name is never in two cycles at once)."""
    return f"w{worker}-{i}" if i % 2 == 0 else f"w{worker}-{loop}-again-{i % 8}"


async def _mqtt_cycle(address: tuple[str, int], name: str) -> None:
    reader, writer = await asyncio.open_connection(*address)
    topic = f"churn/{name}"
    writer.write(_connect(name, 60, clean=True) + _subscribe(topic, qos=0))
    buffer = bytearray()
    published = False
    while True:
        data = await reader.read(65536)
        if not data:
            raise ConnectionError("broker closed the connection")
        buffer += data
        for first, _ in _packets(buffer):
            if first == 0x90 and not published:  # SUBACK: publish to ourselves
                writer.write(_publish(topic, b"churn"))
                published = True
            elif first >> 4 == 3:  # our message: done
                writer.write(b"\xe0\x00")
                writer.close()
                await writer.wait_closed()
                return


async def _amqp_cycle(address: tuple[str, int], name: str) -> None:
    p = await amqp.amqp_open(amqp.AmqpConn, *address)
    declared = await p.rpc(
        amqp.method(1, 50, 10, b"\x00\x00" + amqp.shortstr("") + bytes([0x04]) + amqp.table({})), 50, 11
    )
    queue = declared[1 : 1 + declared[0]].decode()
    key = f"churn.{name}"
    bind = b"\x00\x00" + amqp.shortstr(queue) + amqp.shortstr("amq.topic") + amqp.shortstr(key)
    await p.rpc(amqp.method(1, 50, 20, bind + b"\x00" + amqp.table({})), 50, 21)
    p.transport.write(amqp.publish_msg(1, key, b"churn", False, "amq.topic"))
    await amqp.amqp_close(p)


async def _run(
    pipe: Connection, worker: int, address: tuple[str, int], protocol: str, a: dict[str, Any]
) -> None:
    cycle = _mqtt_cycle if protocol == "mqtt" else _amqp_cycle
    next_i = 0
    failed = 0

    async def one_loop(loop: int, batch_end: int) -> None:
        nonlocal next_i, failed
        while next_i < batch_end:
            i = next_i
            next_i += 1
            try:
                await asyncio.wait_for(cycle(address, _name(worker, loop, i)), 30)
            except (TimeoutError, OSError):
                failed += 1

    while True:
        count = pipe.recv()
        if count == 0:
            return
        end = next_i + count
        await asyncio.gather(*(one_loop(loop, end) for loop in range(a["concurrency"])))
        pipe.send(failed)


def _worker(
    pipe: Connection, worker: int, address: tuple[str, int], protocol: str, a: dict[str, Any]
) -> None:
    os.sched_setaffinity(0, {GEN_CPU})
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    asyncio.run(_run(pipe, worker, address, protocol, a))


def measure(a: argparse.Namespace) -> dict[str, Any]:
    os.sched_setaffinity(0, {BROKER_CPU})  # the broker and its threads inherit it
    with brokers.start("trimaran") as running:
        os.sched_setaffinity(0, {GEN_CPU})
        address = running.mqtt if a.protocol == "mqtt" else running.amqp
        assert address is not None
        context = multiprocessing.get_context("spawn")
        pipes, workers = [], []
        for w in range(a.procs):
            here, there = context.Pipe()
            worker = context.Process(
                target=_worker, args=(there, w, address, a.protocol, vars(a)), daemon=True
            )
            worker.start()
            pipes.append(here)
            workers.append(worker)
        readings: list[tuple[int, int]] = [(0, brokers.rss_kib([running.pid]))]
        done = failed = 0
        paused = 0.0
        started = time.monotonic()
        cpu0 = brokers.cpu_seconds([running.pid])
        batch = -(-a.first // a.procs)  # the first reading after the first cycles, then every --every
        next_reading = a.every
        try:
            while done < a.cycles:
                for pipe in pipes:
                    pipe.send(batch)
                failed = sum(pipe.recv() for pipe in pipes)
                done += batch * a.procs
                if len(readings) == 1 or done >= next_reading or done >= a.cycles:
                    time.sleep(1.0)  # the last closes settle (not counted in the rate)
                    paused += 1.0
                    readings.append((done, brokers.rss_kib([running.pid])))
                    print(
                        json.dumps({"cycles": done, "rss_kib": readings[-1][1]}), file=sys.stderr, flush=True
                    )
                    if done >= next_reading:
                        next_reading += a.every
                batch = BATCH
        finally:
            for pipe in pipes:
                pipe.send(0)
            for worker in workers:
                worker.join(30)
        elapsed = time.monotonic() - started - paused
        cpu = brokers.cpu_seconds([running.pid]) - cpu0
        first = readings[1][1]
        return {
            "broker": "trimaran",
            "version": running.version,
            "protocol": a.protocol,
            "cycles": done,
            "failed": failed,
            "per_s": round(done / elapsed),
            "broker_cpu_us_per_cycle": round(cpu / done * 1e6, 1),
            "rss_start_kib": readings[0][1],
            "rss_after_first_kib": first,
            "first_cycles": readings[1][0],
            "rss_end_kib": readings[-1][1],
            "end_over_first": round(readings[-1][1] / first, 3),
            "readings": readings,
        }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--protocol", choices=("mqtt", "amqp091"), default="mqtt")
    parser.add_argument("--cycles", type=int, default=1_000_000)
    parser.add_argument("--first", type=int, default=10_000, help="cycles before the reference reading")
    parser.add_argument("--every", type=int, default=100_000, help="cycles between readings")
    parser.add_argument("--procs", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=8, help="cycles at a time per process")
    a = parser.parse_args()
    print(json.dumps(measure(a)), flush=True)


if __name__ == "__main__":
    main()
