"""A shovel's rate against RabbitMQ's own shovel, moving the same messages between the same two
brokers (issue 48).

RabbitMQ 3.10 runs on core 1 with its shovel plugin, Trimaran on core 0. One of them holds a
durable queue ``src`` of N persistent messages (``in``: RabbitMQ; ``out``: Trimaran) and the
other is the destination, queue ``dst``. Either RabbitMQ's shovel (a dynamic one, set by
rabbitmqctl) or Trimaran's (a ``[[shovels]]`` table added by a reload) moves them, both with
ack-mode on-confirm and a prefetch of 1,000. The rate is what arrives in ``dst`` from its first message
to its last (a shovel's start is not its rate); the CPU is both brokers' over that time (the
shovel runs inside one of them), per message. The runs alternate between the two shovels, on the
same two broker processes.

    python bench/shovel_bench.py [--messages 100000] [--runs 3] [--directions in,out]
                                 [--python PATH | --checkout DIR] [--out FILE]

``--python``: the interpreter whose ``trimaran`` runs (an installed compiled wheel's venv, say);
by default the checkout's ``.venv``, from the source unless compiled in place.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pika

sys.path.insert(0, str(Path(__file__).resolve().parent))

import brokers
from tls_bench import BROKER_CPU, GEN_CPU

PAYLOAD = b"x" * 64
PREFETCH = 1000


def channel(port: int) -> pika.adapters.blocking_connection.BlockingChannel:
    return pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port)).channel()


def preload(port: int, count: int) -> None:
    """``count`` persistent messages in RabbitMQ's ``src``, all there before the clock starts."""
    ch = channel(port)
    ch.queue_declare("src", durable=True)
    ch.queue_purge("src")
    persistent = pika.BasicProperties(delivery_mode=2)
    for _ in range(count):
        ch.basic_publish("", "src", PAYLOAD, persistent)
    while ch.queue_declare("src", durable=True).method.message_count < count:
        time.sleep(0.05)
    ch.connection.close()


def rabbitmqctl(rabbit: brokers.Running, *args: str) -> None:
    ctl = Path(brokers.RABBITMQ_BIN, "rabbitmqctl")
    subprocess.run([str(ctl), *args], env=rabbit.env, check=True, capture_output=True, timeout=60)


def uris(direction: str, other: int) -> tuple[str, str]:
    """(source, destination) as a shovel names them, its own broker ``amqp://``; ``other``: the
    other broker's port; ``direction`` in: the other broker is the source."""
    remote = f"amqp://guest:guest@127.0.0.1:{other}"
    return (remote, "amqp://") if direction == "in" else ("amqp://", remote)


def one_run(
    which: str, direction: str, rabbit: brokers.Running, trim: brokers.Running, config: Path, count: int
) -> dict[str, object]:
    """``count`` messages moved by ``which`` shovel, RabbitMQ to Trimaran (``direction`` in) or
    back (out)."""
    assert rabbit.amqp is not None and trim.amqp is not None
    rabbit_port, trim_port = rabbit.amqp[1], trim.amqp[1]
    source, destination = (rabbit_port, trim_port) if direction == "in" else (trim_port, rabbit_port)
    watch = channel(destination)
    watch.queue_declare("dst", durable=True)
    watch.queue_purge("dst")
    preload(source, count)
    roots = [rabbit.pid, trim.pid]
    if which == "rabbitmq":  # RabbitMQ's "in" is our "out"
        src, dest = uris("out" if direction == "in" else "in", trim_port)
        definition = {
            "src-uri": src,
            "src-queue": "src",
            "dest-uri": dest,
            "dest-queue": "dst",
            "ack-mode": "on-confirm",
            "src-prefetch-count": PREFETCH,
        }
        rabbitmqctl(rabbit, "set_parameter", "shovel", "bench", json.dumps(definition))
    else:
        src, dest = uris(direction, rabbit_port)
        config.write_text(
            f'[[shovels]]\nname = "bench"\nsrc_uri = "{src}"\nsrc_queue = "src"\ndest_uri = "{dest}"\n'
            f'dest_queue = "dst"\nsrc_prefetch_count = {PREFETCH}\n'
        )
        os.kill(trim.pid, signal.SIGHUP)
    # The clock runs from the first message at the destination to the last: a shovel's start
    # (rabbitmqctl's own VM, a reload) is not its rate.
    moved = 0
    deadline = time.monotonic() + 300
    while moved == 0 and time.monotonic() < deadline:
        moved = watch.queue_declare("dst", durable=True).method.message_count
    first = moved
    started = time.monotonic()
    cpu0, busy0, mine0 = brokers.cpu_seconds(roots), brokers.host_busy_seconds(), time.process_time()
    while moved < count and time.monotonic() < deadline:
        time.sleep(0.02)
        moved = watch.queue_declare("dst", durable=True).method.message_count
    elapsed = time.monotonic() - started
    cpu = brokers.cpu_seconds(roots) - cpu0
    foreign = brokers.host_busy_seconds() - busy0 - cpu - (time.process_time() - mine0)
    if which == "rabbitmq":
        rabbitmqctl(rabbit, "clear_parameter", "shovel", "bench")
    else:
        config.write_text("")
        os.kill(trim.pid, signal.SIGHUP)
    time.sleep(1.0)  # the shovel gone before the next run's preload
    watch.queue_purge("dst")
    watch.connection.close()
    return {
        "shovel": which,
        "messages": count,
        "moved": moved,
        "seconds": round(elapsed, 3),
        "msgs_per_s": round((moved - first) / elapsed),
        "both_brokers_cpu_us_per_msg": round(cpu / max(moved - first, 1) * 1e6, 1),
        "foreign_cpu_pct": round(100 * foreign / elapsed, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--directions", default="in,out", help="in: RabbitMQ to Trimaran; out: back")
    parser.add_argument("--python", default=None, help="the interpreter that runs trimaran")
    parser.add_argument(
        "--checkout", default=None, help="run trimaran from this checkout (compiled in place)"
    )
    parser.add_argument("--out", default="", help="also append the lines to this file")
    a = parser.parse_args()
    directions = a.directions.split(",")
    results: dict[tuple[str, str], list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-shovel-") as tmp:
        config = Path(tmp, "trimaran.toml")
        config.write_text("")
        os.sched_setaffinity(0, {GEN_CPU})
        with brokers.rabbitmq(mqtt=False, shovel=True) as rabbit:
            os.sched_setaffinity(0, {BROKER_CPU})
            # An installed build runs outside the checkout (python -m would import its source first).
            cwd = Path(a.checkout) if a.checkout else Path(tmp) if a.python else None
            with brokers.trimaran(a.python, ["--config", str(config)], cwd=cwd) as trim:
                os.sched_setaffinity(0, {GEN_CPU})
                for turn in range(a.runs):
                    for direction in directions:
                        order = ("trimaran", "rabbitmq") if turn % 2 == 0 else ("rabbitmq", "trimaran")
                        for which in order:
                            line = {
                                **one_run(which, direction, rabbit, trim, config, a.messages),
                                "direction": direction,
                                "trimaran": trim.version.replace("\n", "; "),
                                "rabbitmq": rabbit.version,
                            }
                            results.setdefault((direction, which), []).append(float(str(line["msgs_per_s"])))
                            emit(line, a.out)
    for direction in directions:
        ours, theirs = results.get((direction, "trimaran")), results.get((direction, "rabbitmq"))
        if ours and theirs:
            summary = {
                "summary": True,
                "direction": direction,
                "median_msgs_per_s": {
                    "trimaran": statistics.median(ours),
                    "rabbitmq": statistics.median(theirs),
                },
                "ratio_trimaran_to_rabbitmq_shovel": round(
                    statistics.median(ours) / statistics.median(theirs), 2
                ),
            }
            emit(summary, a.out)


def emit(line: dict[str, object], out: str) -> None:
    print(json.dumps(line), flush=True)
    if out:
        with open(out, "a") as file:
            file.write(json.dumps(line) + "\n")


if __name__ == "__main__":
    main()
