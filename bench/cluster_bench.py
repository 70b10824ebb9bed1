"""One node, then two, on the same PostgreSQL, driven by the MQTT generator (mqtt_load.py).

    python bench/cluster_bench.py            # about 15 min on a quiet machine; results/<date>-cluster.jsonl
    python bench/cluster_bench.py --smoke    # one 1-second run: checks that everything starts and talks

Scenarios, each on one node and on two (``cluster.enabled`` both times, so only the second node differs):
  fanin QoS 0, closed loop (--e2e-window 5000)   8 publishers -> 1 subscriber; on two nodes the
  fanin QoS 1                                    publishers are on node a and the subscriber on node b,
  latency at 1,000 msg/s                         so every message crosses (NOTIFY) between the nodes
  durable queue, QoS 1 (--queue)                 8 publishers and 2 consumers; on two nodes half of
                                                 each on either node (shared claims)
The rules of docs/performance.md: nodes pinned by NODE_CPUS (default "0,1": node a on
CPU 0, node b on CPU 1), the generator on GEN_CPU (default 1; give it a core of its own where there is
one), 2 s warm-up, 10 s window, 3 clean runs, runs with more than 8% of a core used by others retried.
PostgreSQL (Debian's, started here, fsync on) runs unpinned: its commit and NOTIFY rate is what a cluster
is bound by. Broker CPU figures are node a's.

Environment: TRIMARAN_BIN (default: this interpreter's ``-m trimaran``), BENCH_PY (the generator's
interpreter, with uvloop; default the repository's .venv python), NODE_CPUS, GEN_CPU, RUNS.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.postgres import PostgresCluster, find_bindir  # noqa: E402

BENCH = ROOT / "bench"
PORTS = {"a": 29901, "b": 29902}


class Node:
    def __init__(self, name: str, url: str, cpu: str, log: Path) -> None:
        self.name = name
        self.port = PORTS[name]
        command = shlex.split(os.environ.get("TRIMARAN_BIN", f"{sys.executable} -m trimaran"))
        env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "TRIMARAN_NODE_NAME": name,
            "TRIMARAN_STORAGE__URL": url,
            "TRIMARAN_CLUSTER__ENABLED": "true",
        }
        args = [
            "serve",
            "--mqtt",
            f"127.0.0.1:{self.port}",
            "--mqtt-ws",
            "off",
            "--amqp",
            "off",
            "--http",
            "off",
        ]
        self.log = log
        self.process = subprocess.Popen(
            ["taskset", "-c", cpu, *command, *args], env=env, stdout=log.open("w"), stderr=subprocess.STDOUT
        )
        deadline = time.monotonic() + 60
        while "trimaran ready" not in log.read_text():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"node {name} did not start:\n{log.read_text()}")
            time.sleep(0.1)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def generate(
    label: str, scenario: list[str], pub: list[Node], sub: list[Node], common: list[str], out: Path
) -> dict:
    python = os.environ.get("BENCH_PY", str(ROOT / ".venv" / "bin" / "python"))
    gen_cpu = os.environ.get("GEN_CPU", "1")
    command = [
        "taskset", "-c", gen_cpu, python, str(BENCH / "cluster_load.py"), *scenario,
        "--port", str(pub[0].port), "--label", label,
        "--pub-ports", ",".join(str(n.port) for n in pub),
        "--sub-ports", ",".join(str(n.port) for n in sub),
        *common, "--out", str(out),
    ]  # fmt: skip
    print(f"--- {time.strftime('%T')} {label} {' '.join(scenario)}", flush=True)
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode or not lines:
        print(done.stdout[-2000:], done.stderr[-2000:], sep="\n")
        return {}
    last = json.loads(lines[-1])
    median = last.get("median", last)
    keys = ("msgs_per_s_received", "loss", "broker_cpu_pct", "lat_p50_us", "lat_p99_us", "foreign_cpu_pct")
    print("    " + ", ".join(f"{k}={median[k]}" for k in keys if k in median), flush=True)
    return last


SCENARIOS = [
    ("fanin-qos0-e2e", ["fanin", "--qos", "0", "--e2e-window", "5000"], "cross"),
    ("fanin-qos1", ["fanin", "--qos", "1"], "cross"),
    ("latency-1k", ["latency", "--rate", "1000"], "cross"),
    (
        "queue-qos1",
        ["fanin", "--qos", "1", "--queue", "-S", "2", "--pub-procs", "2", "--sub-procs", "2"],
        "spread",
    ),
]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--smoke", action="store_true", help="one short run of one scenario, nothing recorded"
    )
    options = parser.parse_args()
    runs = os.environ.get("RUNS", "3")
    common = ["--runs", runs, "--warmup", "2", "--duration", "10", "--quiet-pct", "15", "--quiet-wait", "60"]
    common += ["--max-foreign-pct", "8"]
    scenarios = SCENARIOS
    results = BENCH / "results"
    out = results / f"{datetime.date.today()}-cluster.jsonl"
    if options.smoke:
        common = ["--runs", "1", "--warmup", "0.3", "--duration", "1", "--drain-max", "2", "--idle", "0.5"]
        scenarios = SCENARIOS[:1]
        out = Path("/tmp/trimaran-cluster-bench-smoke.jsonl")
    bindir = find_bindir()
    if bindir is None:
        sys.exit("PostgreSQL is not installed (Debian package 'postgresql')")
    cpus = os.environ.get("NODE_CPUS", "0,1").split(",")
    postgres = PostgresCluster(bindir, fsync=not options.smoke).start()
    logs = Path(postgres.root)
    summary: dict[str, dict] = {}
    try:
        for count in (1, 2):
            for label, scenario, layout in scenarios:
                url = postgres.create_database(f"bench_{count}_{label.replace('-', '_')}")
                nodes = [
                    Node(name, url, cpus[i % len(cpus)], logs / f"{name}.log")
                    for i, name in enumerate("ab"[:count])
                ]
                try:
                    if layout == "cross":  # publishers on the first node, the subscriber on the last
                        pub, sub = nodes[:1], nodes[-1:]
                    else:
                        pub, sub = nodes, nodes
                    summary[f"{count}n-{label}"] = generate(
                        f"trimaran-{count}n-{label}", scenario, pub, sub, common, out
                    )
                finally:
                    for node in nodes:
                        node.stop()
    finally:
        postgres.stop()
    print(json.dumps({k: v.get("median", v).get("msgs_per_s_received") for k, v in summary.items() if v}))


if __name__ == "__main__":
    main()
