"""Run the same benchmarks against several brokers in one session and print a Markdown table.

Each broker is started by `brokers.py` on free loopback ports, the scenarios run one after another as
separate processes (`mqtt_bench.py`, `amqp_bench.py`) with the broker's pid watched for CPU, then the
broker is stopped. With --repeat N the whole broker sequence runs N times, interleaved (A B C, A B C,
...), so slow drifts and other jobs on the machine hit every broker alike; the table shows the median
run (by its headline number) and, in the details, every run.

The headline is the delivered rate (msg/s, higher is better) for throughput scenarios and the p50 / p99
end-to-end latency (ms, lower is better) for latency scenarios. Ratios are Trimaran / other broker. A
broker that is not installed, or a protocol it does not offer yet (e.g. Trimaran before its MQTT front
end lands), is shown as "n/a" with the reason; nothing is ever estimated.

Scenarios:
  mqtt-fan-in-q0 / -q1    --clients publishers -> 1 subscriber, QoS 0 / 1
  mqtt-fan-out-q0 / -q1   1 publisher -> --clients subscribers, QoS 0 / 1
  mqtt-latency-q0 / -q1   1 -> 1 at a fixed --rate
  amqp-transient          publish -> consume (aio-pika's aiormq), transient queue, no confirms
  amqp-confirm            durable queue, persistent messages, publisher confirms
  amqp-client-only        aio-pika's codec alone, no broker (shown once, as the client ceiling)

Example (about 4 minutes):
  .venv/bin/python bench/compare.py --brokers trimaran,mosquitto,rabbitmq --duration 8 --repeat 2
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import brokers

HERE = Path(__file__).resolve().parent
MQTT_SCENARIOS = {
    "mqtt-fan-in-q0": ("fan-in", 0),
    "mqtt-fan-in-q1": ("fan-in", 1),
    "mqtt-fan-out-q0": ("fan-out", 0),
    "mqtt-fan-out-q1": ("fan-out", 1),
    "mqtt-latency-q0": ("latency", 0),
    "mqtt-latency-q1": ("latency", 1),
}
AMQP_SCENARIOS = {"amqp-transient": "transient", "amqp-confirm": "confirm"}
ALL_SCENARIOS = [*MQTT_SCENARIOS, *AMQP_SCENARIOS, "amqp-client-only"]
DEFAULT_SCENARIOS = [s for s in ALL_SCENARIOS if s != "mqtt-latency-q1"]


@dataclass
class Cell:
    runs: list[dict[str, Any]] = field(default_factory=list)
    unavailable: str | None = None


def headline(scenario: str, run: dict[str, Any]) -> float:
    if scenario.startswith("mqtt-latency"):
        p99 = run["latency_ms"]["p99"]
        return -(p99 if p99 is not None else float("inf"))  # higher is better everywhere below
    return float(run.get("deliver_rate", 0))


def median_run(scenario: str, runs: list[dict[str, Any]]) -> dict[str, Any]:
    ranked = sorted(runs, key=lambda r: headline(scenario, r))
    return ranked[(len(ranked) - 1) // 2]


def wait_quiet(limit_s: float, threshold: float = 0.3) -> float:
    """Wait (at most `limit_s`) until the host's busy CPU over 1 s is below `threshold` cores."""
    deadline = time.monotonic() + limit_s
    while True:
        b0 = brokers.host_busy_seconds()
        time.sleep(1.0)
        busy = brokers.host_busy_seconds() - b0
        if busy < threshold or time.monotonic() > deadline:
            return busy


def settle(pid: int, limit_s: float = 30.0, threshold: float = 0.05) -> float:
    """Wait (at most `limit_s`) until the broker is idle (< `threshold` cores over 1 s), so that the
    backlog of one run (e.g. queued QoS 0 messages) does not slow down the next."""
    deadline = time.monotonic() + limit_s
    while True:
        c0 = brokers.cpu_seconds([pid])
        time.sleep(1.0)
        used = brokers.cpu_seconds([pid]) - c0
        if used < threshold or time.monotonic() > deadline:
            return used


def run_json(cmd: list[str], timeout: float) -> dict[str, Any]:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=HERE.parent)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f}s"}
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if not lines:
        return {"error": f"exit {proc.returncode}: {proc.stderr.strip()[-500:]}"}
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def bench_cmd(args: argparse.Namespace, scenario: str, b: brokers.Running) -> list[str] | str:
    """The command for one scenario against a running broker, or why it cannot run."""
    py = sys.executable
    common = ["--duration", str(args.duration), "--warmup", str(args.warmup), "--payload", str(args.payload)]
    common += ["--watch-pid", str(b.pid), "--label", b.name]
    if scenario in MQTT_SCENARIOS:
        if b.mqtt is None:
            return "; ".join(n for n in b.notes if "MQTT" in n) or "no MQTT listener"
        kind, qos = MQTT_SCENARIOS[scenario]
        cmd = [py, str(HERE / "mqtt_bench.py"), "--host", b.mqtt[0], "--port", str(b.mqtt[1])]
        cmd += [
            "--scenario",
            kind,
            "--qos",
            str(qos),
            "--clients",
            str(args.clients),
            "--rate",
            str(args.rate),
        ]
        return cmd + common
    if b.amqp is None:
        return "; ".join(n for n in b.notes if "AMQP" in n) or "no AMQP listener"
    url = f"amqp://guest:guest@{b.amqp[0]}:{b.amqp[1]}/"
    cmd = [py, str(HERE / "amqp_bench.py"), "--url", url, "--mode", AMQP_SCENARIOS[scenario]]
    return [*cmd, "--client", args.amqp_client, *common]


def fmt_num(x: float | None, digits: int = 0) -> str:
    if x is None:
        return "-"
    return f"{x:,.{digits}f}"


def cell_text(scenario: str, cell: Cell | None) -> str:
    if cell is None:
        return "not run"
    if cell.unavailable:
        return f"n/a ({cell.unavailable})"
    ok = [r for r in cell.runs if "error" not in r]
    if not ok:
        return f"error: {cell.runs[-1]['error'][:80]}" if cell.runs else "not run"
    r = median_run(scenario, ok)
    if scenario.startswith("mqtt-latency"):
        lat = r["latency_ms"]
        text = f"{fmt_num(lat['p50'], 2)} / {fmt_num(lat['p99'], 2)}"
        if len(ok) > 1:
            p99s = [x["latency_ms"]["p99"] or 0 for x in ok]
            text += f" (p99 {fmt_num(min(p99s), 1)}-{fmt_num(max(p99s), 1)})"
        return text
    text = fmt_num(r["deliver_rate"])
    if len(ok) > 1:
        rates = [x["deliver_rate"] for x in ok]
        text += f" ({fmt_num(min(rates))}-{fmt_num(max(rates))})"
    if r.get("lost"):
        text += f", {r['lost']:,} lost"
    return text


def cost_us(run: dict[str, Any]) -> float | None:
    """Broker CPU microseconds per delivered message: robust to a busy host, unlike the rates."""
    if not run.get("broker_cpu") or not run.get("deliver_rate"):
        return None
    return float(run["broker_cpu"]) / float(run["deliver_rate"]) * 1e6


def cost_text(scenario: str, cell: Cell | None) -> tuple[str, float | None]:
    if cell is None or cell.unavailable:
        return "n/a", None
    costs = sorted(c for r in cell.runs if "error" not in r and (c := cost_us(r)) is not None)
    if not costs:
        return "n/a", None
    mid = statistics.median(costs)
    return f"{mid:.1f}", mid


def ratio_text(scenario: str, mine: Cell | None, other: Cell | None) -> str:
    def best(c: Cell | None) -> dict[str, Any] | None:
        if c is None or c.unavailable:
            return None
        ok = [r for r in c.runs if "error" not in r]
        return median_run(scenario, ok) if ok else None

    a, b = best(mine), best(other)
    if a is None or b is None:
        return "n/a"
    if scenario.startswith("mqtt-latency"):
        la, lb = a["latency_ms"], b["latency_ms"]
        if not (la["p50"] and lb["p50"] and la["p99"] and lb["p99"]):
            return "n/a"
        return f"{la['p50'] / lb['p50']:.2f} / {la['p99'] / lb['p99']:.2f}"
    if not b["deliver_rate"]:
        return "n/a"
    return f"{a['deliver_rate'] / b['deliver_rate']:.2f}"


def trimaran_revision() -> str:
    """The commit being measured, and uncommitted changes under trimaran/ (others work in this tree)."""

    def git(*cmd: str) -> str:
        out = subprocess.run(["git", *cmd], cwd=HERE.parent, capture_output=True, text=True, check=False)
        return out.stdout.strip()

    head = git("log", "-1", "--format=%h %s")[:80] or "unknown"
    dirty = git("status", "--short", "--", "trimaran").splitlines()
    return f"{head}" + (f" + uncommitted: {', '.join(d.split()[-1] for d in dirty)}" if dirty else "")


def machine_facts() -> list[str]:
    model = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return [
        f"- trimaran source: {trimaran_revision()}",
        f"- date: {dt.datetime.now(dt.UTC).strftime('%Y-%m-%d %H:%M UTC')}",
        f"- host: {os.cpu_count()} CPUs ({model}), {mem_gib:.0f} GiB RAM, Linux {platform.release()}",
        f"- generator: CPython {platform.python_version()}, one process per run, all on 127.0.0.1",
        f"- load average before the run: {' '.join(f'{x:.2f}' for x in os.getloadavg())}",
    ]


def render(
    args: argparse.Namespace,
    cells: dict[tuple[str, str], Cell],
    versions: dict[str, str],
    notes: dict[str, str],
    facts: list[str],
) -> str:
    names = args.brokers
    others = [n for n in names if n != "trimaran"]
    out = ["## Trimaran side by side", "", *facts]
    for n in names:
        out.append(f"- {n}: {versions.get(n, '?')}{' — ' + notes[n] if notes.get(n) else ''}")
    out += [
        f"- runs: {args.duration:g} s each (rates over the last {args.duration - args.warmup:g} s), "
        f"payload {args.payload} B, {args.clients} clients in fan-in/fan-out, "
        f"latency at {args.rate:g} msg/s, MQTT throughput closed-loop with at most {args.e2e_window} "
        f"messages undelivered (0 = flood), median of {args.repeat}",
        "",
        "Throughput: delivered msg/s (higher is better), median run (the lower middle one for an even "
        "count) and (min-max). Latency: p50 / p99 ms (lower is better). Ratios: trimaran / other.",
        "",
    ]
    header = ["scenario", *names] + [f"trimaran/{o}" for o in others if "trimaran" in names]
    out.append("| " + " | ".join(header) + " |")
    out.append("|" + "---|" * len(header))
    for sc in args.scenarios:
        if sc == "amqp-client-only":
            continue
        row = [sc] + [cell_text(sc, cells.get((sc, n))) for n in names]
        if "trimaran" in names:
            row += [ratio_text(sc, cells.get((sc, "trimaran")), cells.get((sc, o))) for o in others]
        out.append("| " + " | ".join(row) + " |")
    out += [
        "",
        "Broker CPU per delivered message (µs, median; lower is better). Less sensitive to other jobs on "
        "the host than the rates; ratios trimaran / other.",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
    ]
    for sc in args.scenarios:
        if sc == "amqp-client-only":
            continue
        texts = {n: cost_text(sc, cells.get((sc, n))) for n in names}
        row = [sc] + [texts[n][0] for n in names]
        if "trimaran" in names:
            mine = texts["trimaran"][1]
            for o in others:
                theirs = texts[o][1]
                row.append(f"{mine / theirs:.2f}" if mine and theirs else "n/a")
        out.append("| " + " | ".join(row) + " |")
    client = cells.get(("amqp-client-only", "-"))
    if client and client.runs and "error" not in client.runs[0]:
        r = client.runs[0]
        out += [
            "",
            f"AMQP client ceiling (no broker, one core): {r['client']} marshals "
            f"{r['marshal_publish_per_s']:,} publish frame sets/s and unmarshals "
            f"{r['unmarshal_deliver_per_s']:,} deliver frame sets/s.",
        ]
    out += [
        "",
        "Details (every run): pub = published msg/s, del = delivered msg/s, CPU in cores over the steady "
        "window: gen = load generator, broker, other = everything else on the host. gen ceiling = del / gen "
        "CPU: what the generator could drive with one whole core at its measured cost per message; when it "
        "is near del, the generator was the limit.",
        "",
        "| scenario | broker | pub | del | lost | p50 ms | p99 ms | gen CPU | broker CPU | other CPU "
        "| gen ceiling | broker µs/msg |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for sc in args.scenarios:
        for n in names:
            cell = cells.get((sc, n))
            if cell is None or cell.unavailable:
                continue
            for r in cell.runs:
                if "error" in r:
                    out.append(f"| {sc} | {n} | error: {r['error'][:100]} |||||||||")
                    continue
                lat = r.get("latency_ms", {})
                out.append(
                    f"| {sc} | {n} | {fmt_num(r['pub_rate'])} | {fmt_num(r['deliver_rate'])} | {r['lost']:,} "
                    f"| {fmt_num(lat.get('p50'), 2)} | {fmt_num(lat.get('p99'), 2)} | {r['gen_cpu']:.2f} "
                    f"| {fmt_num(r.get('broker_cpu'), 2)} | {r['other_cpu']:.2f} "
                    f"| {fmt_num(r['deliver_rate'] / r['gen_cpu'] if r['gen_cpu'] > 0 else None)} "
                    f"| {fmt_num(cost_us(r), 1)} |"
                )
    return "\n".join(out)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="compare.py",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        epilog=__doc__.split("\n\n", 1)[1] if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--brokers",
        default="trimaran,mosquitto,rabbitmq",
        help=f"comma-separated, from: {', '.join(brokers.BROKERS)} (default trimaran,mosquitto,rabbitmq)",
    )
    p.add_argument(
        "--scenarios",
        default=",".join(DEFAULT_SCENARIOS),
        help=f"comma-separated, from: {', '.join(ALL_SCENARIOS)} (default: all but mqtt-latency-q1)",
    )
    p.add_argument("--duration", type=float, default=10.0, help="seconds per run (default 10)")
    p.add_argument("--warmup", type=float, default=2.0, help="seconds left out of the rates (default 2)")
    p.add_argument("--payload", type=int, default=64, help="payload bytes (default 64)")
    p.add_argument("--clients", type=int, default=4, help="publishers in fan-in, subscribers in fan-out")
    p.add_argument("--rate", type=float, default=5000.0, help="latency scenarios: msg/s (default 5000)")
    p.add_argument("--repeat", type=int, default=1, help="rounds over all brokers; the median is shown")
    p.add_argument(
        "--wait-quiet",
        type=float,
        default=10.0,
        help="before each run wait up to this many seconds for other jobs to leave the CPUs (default 10)",
    )
    p.add_argument(
        "--e2e-window",
        type=int,
        default=500,
        help="MQTT throughput runs: max published-but-undelivered messages, 0 = flood (default 500)",
    )
    p.add_argument(
        "--amqp-client",
        choices=["aiormq", "aio-pika"],
        default="aiormq",
        help="AMQP client API: aiormq (aio-pika's engine, cheaper) or aio-pika's own (default aiormq)",
    )
    p.add_argument("--json", type=Path, help="also write every raw result to this file")
    p.add_argument(
        "--render",
        type=Path,
        metavar="JSON",
        help="run nothing: print the tables again from a file written by --json (same --brokers/--scenarios)",
    )
    args = p.parse_args(argv)
    args.brokers = [b.strip() for b in args.brokers.split(",") if b.strip()]
    args.scenarios = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    for b in args.brokers:
        if b not in brokers.BROKERS:
            p.error(f"unknown broker {b!r}")
    for s in args.scenarios:
        if s not in ALL_SCENARIOS:
            p.error(f"unknown scenario {s!r}")
    if args.warmup >= args.duration:
        p.error("--warmup must be shorter than --duration")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.render:
        saved = json.loads(args.render.read_text())
        for key in ("duration", "warmup", "rate"):  # describe the runs as they were made
            if key in saved.get("args", {}):
                setattr(args, key, float(saved["args"][key]))
        for key in ("payload", "clients", "repeat", "e2e_window"):
            if key in saved.get("args", {}):
                setattr(args, key, int(saved["args"][key]))
        loaded = {
            (key.split("|")[0], key.split("|")[1]): Cell(runs=c["runs"], unavailable=c["unavailable"])
            for key, c in saved["cells"].items()
        }
        facts = saved.get("facts") or [*machine_facts()[1:4], "- (machine facts at render time)"]
        print(render(args, loaded, saved.get("versions", {}), saved.get("notes", {}), facts))
        return 0
    cells: dict[tuple[str, str], Cell] = {}
    versions: dict[str, str] = {}
    notes: dict[str, str] = {}
    facts_before = machine_facts()
    if "amqp-client-only" in args.scenarios:
        r = run_json(
            [sys.executable, str(HERE / "amqp_bench.py"), "--client-only", "--payload", str(args.payload)], 60
        )
        cells[("amqp-client-only", "-")] = Cell(runs=[r])
    for round_no in range(args.repeat):
        for name in args.brokers:
            print(f"[round {round_no + 1}/{args.repeat}] starting {name}", file=sys.stderr)
            try:
                with brokers.start(name) as b:
                    versions[name] = b.version
                    notes[name] = "; ".join(b.notes)
                    for sc in args.scenarios:
                        if sc == "amqp-client-only":
                            continue
                        cell = cells.setdefault((sc, name), Cell())
                        cmd = bench_cmd(args, sc, b)
                        if isinstance(cmd, str):
                            cell.unavailable = cmd
                            continue
                        idle = settle(b.pid)
                        busy = wait_quiet(args.wait_quiet) if args.wait_quiet > 0 else 0.0
                        result = run_json(cmd, args.duration + 90)
                        result["busy_before"] = round(busy, 2)
                        result["broker_cpu_before"] = round(idle, 3)
                        cell.runs.append(result)
                        summary = result.get("error") or (
                            f"del {result['deliver_rate']:,}/s p50 {result['latency_ms']['p50']} ms "
                            f"gen {result['gen_cpu']} broker {result['broker_cpu']} "
                            f"other {result['other_cpu']}"
                        )
                        print(f"  {sc} on {name}: {summary}", file=sys.stderr)
            except brokers.BrokerUnavailable as exc:
                reason = str(exc).splitlines()[0]
                notes[name] = f"not available: {reason}"
                for sc in args.scenarios:
                    cells.setdefault((sc, name), Cell()).unavailable = f"{name} not available"
    print(render(args, cells, versions, notes, facts_before))
    if args.json:
        raw = {f"{sc}|{n}": {"unavailable": c.unavailable, "runs": c.runs} for (sc, n), c in cells.items()}
        args.json.write_text(
            json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "cells": raw}, indent=1)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
