"""A bridge's rate against Mosquitto's own bridge, between the same two brokers (issue 48).

A remote Mosquitto (the "cloud") runs beside the generator on core 1. The bridging broker, on core
0, is either Mosquitto with a bridge (``connection``/``topic bench/# out 1``) or Trimaran with a
``[[bridges]]`` table saying the same. The MQTT generator (``cluster_load.py``, i.e. mqtt_load.py
with its subscribers on another port) publishes QoS 1 fan-in into the bridging broker, and its
subscriber reads at the remote: the rate is what crossed the bridge, and the CPU is the bridging
broker's (the generator finds it from ``--port``; the remote's is ``storage_cpu_pct``). Closed loop
by default: in open loop Mosquitto's bridge drops what passes its 1,000 queued messages.

    python bench/bridge_bench.py [--brokers trimaran,mosquitto] [--runs 3] [--out FILE]

Each prints the generator's summary line with ``bridge`` set; the ratio is Trimaran's
``msgs_per_s_received`` over Mosquitto's. Both bridges run with their own defaults (Mosquitto:
20 messages in flight, 1,000 queued; Trimaran: 1,024 in flight, a durable queue on SQLite).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import brokers
from tls_bench import BROKER_CPU, GEN_CPU

HERE = Path(__file__).resolve().parent
TOPICS = "bench/# out 1"


@contextlib.contextmanager
def bridging(name: str, remote_port: int) -> Iterator[brokers.Running]:
    """The bridging broker ``name`` on core 0, bridged to the remote on ``remote_port``."""
    os.sched_setaffinity(0, {BROKER_CPU})  # the broker and every thread it starts inherit it
    try:
        with tempfile.TemporaryDirectory(prefix="bench-bridge-") as tmp:
            if name == "mosquitto":
                bridge = [
                    "connection cloud",
                    f"address 127.0.0.1:{remote_port}",
                    f"topic {TOPICS}",
                    "cleansession false",
                ]
                with brokers.mosquitto(nodelay=True, extra_conf=bridge) as running:
                    os.sched_setaffinity(0, {GEN_CPU})
                    yield running
            else:
                config = Path(tmp, "trimaran.toml")
                config.write_text(
                    "[[bridges]]\n"
                    'name = "cloud"\n'
                    f'address = "127.0.0.1:{remote_port}"\n'
                    f'topic = ["{TOPICS}"]\n'
                    'restart_timeout = "0.5 2"\n'
                )
                with brokers.trimaran(extra_args=["--config", str(config)]) as running:
                    os.sched_setaffinity(0, {GEN_CPU})
                    yield running
    finally:
        os.sched_setaffinity(0, {BROKER_CPU, GEN_CPU})


def measure(name: str, a: argparse.Namespace) -> dict[str, object]:
    os.sched_setaffinity(0, {GEN_CPU})
    with brokers.mosquitto(nodelay=True, tuned=True) as remote:  # the cloud: not what is measured
        assert remote.mqtt is not None
        with bridging(name, remote.mqtt[1]) as local:
            assert local.mqtt is not None
            cmd = [
                sys.executable,
                str(HERE / "cluster_load.py"),
                "fanin",
                "--qos", "1",
                "-P", str(a.publishers),
                "-S", "1",
                "--port", str(local.mqtt[1]),
                "--sub-ports", str(remote.mqtt[1]),
                "--storage-pid", str(remote.pid),  # the remote's CPU: storage_cpu_pct, not foreign
                "--e2e-window", str(a.e2e_window),
                "--label", f"{name}-bridge",
                "--runs", str(a.runs),
                "--duration", str(a.duration),
                "--quiet-pct", "15",
                "--max-foreign-pct", "8",
            ]  # fmt: skip
            if a.out:
                cmd += ["--out", a.out]
            out = subprocess.run(cmd, capture_output=True, text=True, check=False)
            summary = next(
                (json.loads(line) for line in out.stdout.splitlines() if '"summary": true' in line), None
            )
            if summary is None:
                return {"bridge": name, "error": (out.stdout + out.stderr)[-2000:]}
            result: dict[str, object] = {**summary, "bridge": name, "bridge_version": local.version}
            return result


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--brokers", default="trimaran,mosquitto")
    parser.add_argument("--publishers", type=int, default=8)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument(
        "--e2e-window",
        type=int,
        default=2000,
        help="closed loop: publishers hold back while this many messages are not yet at the remote "
        "(Mosquitto's bridge drops past its 1,000 queued in open loop; 0 = open loop)",
    )
    parser.add_argument("--out", default="", help="also append the generator's lines to this file")
    a = parser.parse_args()
    rates: dict[str, float] = {}
    for name in a.brokers.split(","):
        try:
            result = measure(name.strip(), a)
        except brokers.BrokerUnavailable as exc:
            result = {"bridge": name, "error": str(exc)}
        median = result.get("median")
        if isinstance(median, dict):
            rates[name] = float(median["msgs_per_s_received"])
        print(json.dumps(result), flush=True)
    if "trimaran" in rates and rates.get("mosquitto"):
        print(
            json.dumps(
                {"ratio_trimaran_to_mosquitto_bridge": round(rates["trimaran"] / rates["mosquitto"], 2)}
            )
        )


if __name__ == "__main__":
    main()
