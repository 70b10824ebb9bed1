"""The README's performance table: its rows, and the table printed from the JSON lines of one sitting.

`run.py` measures each row's contenders (Trimaran, one or two builds of it, and the row's peers) in
alternating rounds and writes one JSON line per run; this module only reads such lines, so a recorded
sitting prints the same table again (`python bench/run.py --table results/<file>.jsonl`).

A figure is the median of the clean runs of all rounds (no error, not contaminated); the broker's CPU
per message is each run's `broker_cpu_pct` over its delivered rate, medianed the same way; a ratio is
Trimaran's median over the peer's median from the same sitting.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Row:
    key: str
    title: str
    # the generator: "mqtt" (mqtt_load.py), "amqp091" (amqp091_load.py), "amqp1" (proton C),
    # "amqp1-load" (amqp1_load.py)
    tool: str
    args: tuple[str, ...]  # the generator's scenario arguments
    peers: tuple[str, ...]
    latency: bool = False
    trimaran_from: str | None = None  # Trimaran's figure is that row's (the scenario is the same)
    ref_row: str | None = None  # no peer: the ratio is against Trimaran's own figure on that row
    ref_name: str = "AMQP 0.9.1 durable"  # how the table names ref_row's figure
    # issue 32's bar for the ratio against every peer: at least this, or for latency at most this
    target: float | None = None
    # issue 34's CPU bar: Trimaran's broker CPU per message here no more than its own on that row
    cpu_row: str | None = None
    # issue 44's bar: an open-loop row where what was acknowledged must all arrive (loss 0)
    lossless: bool = False
    warmup: float | None = None  # this row's warm-up, when longer than the sitting's
    # Trimaran stores in a fresh database of the sitting's PostgreSQL (fsync on, on the broker's core)
    postgres: bool = False
    settings: tuple[tuple[str, str], ...] = ()  # Trimaran's settings on this row (TRIMARAN_* variables)
    peers_from: str | None = None  # the peers' figures are that row's (the same generator and arguments)
    ref_target: float | None = None  # with peers as well as ref_row: the bar against ref_row's figure
    # issue 46's bars: every confirmed message delivered within drain_max_s of the publishers stopping
    # (drain_s, with lossless), no receiver without a delivery for longer than gap_max_ms in the window
    drain_max_s: float | None = None
    gap_max_ms: float | None = None
    # issue 48's row: the subscribers read at a remote Mosquitto (brokers.sh mosquitto-remote, started
    # afresh before each server's runs), to which the server under test bridges what it is sent
    remote: bool = False


# Trimaran's side of the bridge row: the [[bridges]] table conf/mosquitto-bridge.conf's bridge says.
BENCH_BRIDGE = {
    "name": "cloud",
    "address": "127.0.0.1:29887",
    "topic": ["bench/# out 1"],
    "restart_timeout": "1",
}

ROWS: tuple[Row, ...] = (
    Row(
        "mqtt-qos0-fanin",
        "MQTT QoS 0 fan-in 8 -> 1, closed loop",
        "mqtt",
        ("fanin", "--qos", "0", "--e2e-window", "5000"),
        ("mosquitto",),
        target=1.5,
    ),
    Row(
        "mqtt-qos1-fanin",
        "MQTT QoS 1 fan-in 8 -> 1, window 100, closed loop",
        "mqtt",
        ("fanin", "--qos", "1", "--e2e-window", "5000"),
        ("mosquitto",),
        target=1.5,
    ),
    Row(
        "mqtt-qos1-fanin-open",
        "MQTT QoS 1 fan-in 8 -> 1, window 100, open loop (loss must be 0)",
        "mqtt",
        ("fanin", "--qos", "1"),
        ("mosquitto",),
        target=1.5,
        lossless=True,
    ),
    Row(
        "mqtt-qos1-fanin-open-topics",
        "MQTT QoS 1 fan-in 8 -> 1, window 100, open loop, 16 topics per publisher in turn (loss must be 0)",
        "mqtt",
        ("fanin", "--qos", "1", "--topics", "16"),
        ("mosquitto",),
        target=1.5,
        lossless=True,
    ),
    Row(
        "mqtt-qos0-fanin-topics",
        "MQTT QoS 0 fan-in 8 -> 1, closed loop, 16 topics per publisher in turn (a fleet's traffic)",
        "mqtt",
        ("fanin", "--qos", "0", "--topics", "16", "--e2e-window", "5000"),
        ("mosquitto",),
        target=1.5,  # issue 45: 1.5x from the source, 3x compiled
    ),
    Row(
        "mqtt-paced-2000",
        "MQTT 2,000 publishers at 10 msg/s each -> 1 wildcard subscriber (p50 / p99 µs)",
        "mqtt",
        ("latency", "--publishers", "2000", "--rate", "20000", "--pub-procs", "2"),
        ("mosquitto",),
        latency=True,
        target=1.0,
    ),
    Row(
        "mqtt-paced-10000",
        "MQTT 10,000 publishers at 10 msg/s each -> 1 wildcard subscriber (p50 / p99 µs)",
        "mqtt",
        ("latency", "--publishers", "10000", "--rate", "100000", "--pub-procs", "4"),
        ("mosquitto",),
        latency=True,
        target=1.0,
    ),
    Row(
        "mqtt-qos1-fanout-open",
        "MQTT QoS 1 fan-out 1 -> 16, open loop",
        "mqtt",
        ("fanout", "--qos", "1"),
        ("mosquitto",),
    ),
    Row(
        "mqtt-qos1-fanout-stalled",
        "MQTT QoS 1 fan-out 1 -> 16, one subscriber stops reading; the 15 others after the stalled-consumer "
        "timeout (30 s), against all 16 reading",
        "mqtt",
        ("fanout", "--qos", "1", "--stall", "1"),
        (),
        warmup=35.0,  # the window starts after the stalled one was closed
        ref_row="mqtt-qos1-fanout-open",
        ref_name="QoS 1 fan-out, all reading,",
        target=0.9 * 15 / 16,  # each of the 15 keeps 90% of its rate
        lossless=True,
    ),
    Row(
        "mqtt-qos0-fanout",
        "MQTT QoS 0 fan-out 1 -> 16, closed loop",
        "mqtt",
        ("fanout", "--qos", "0", "--e2e-window", "5000"),
        ("mosquitto",),
        target=1.5,
    ),
    Row(
        "mqtt-latency",
        "MQTT latency at 10k msg/s (p50 / p99 µs)",
        "mqtt",
        ("latency", "--rate", "10000"),
        ("mosquitto", "mosquitto-nodelay"),
        latency=True,
        target=1.0,
    ),
    Row(
        "amqp091-transient",
        "AMQP 0.9.1 transient queue, closed loop",
        "amqp091",
        ("transient", "--e2e-window", "5000"),
        ("rabbitmq",),
        target=1.0,
    ),
    Row(
        "amqp091-transient-keys",
        "AMQP 0.9.1 transient queue through a topic exchange, 16 routing keys in turn, closed loop",
        "amqp091",
        ("transient", "--keys", "16", "--e2e-window", "5000"),
        ("rabbitmq",),
        target=1.5,
    ),
    Row(
        "amqp091-durable",
        "AMQP 0.9.1 durable queue, persistent, confirms + acks",
        "amqp091",
        ("durable",),
        ("rabbitmq",),
        target=1.5,
    ),
    Row(
        "amqp091-latency",
        "AMQP 0.9.1 latency at 10k msg/s (p50 / p99 µs)",
        "amqp091",
        ("latency", "--rate", "10000"),
        ("rabbitmq",),
        latency=True,
        target=1.0,
    ),
    Row(
        "amqp1-transient",
        "AMQP 1.0, proton C send -> receive, transient queue",
        "amqp1",
        (),
        ("rabbitmq", "proton-broker"),
        cpu_row="amqp091-transient",
    ),
    Row(
        "amqp1-settled",
        "AMQP 1.0 transient queue, pre-settled both ways (0.9.1 transient's twin), closed loop",
        "amqp1-load",
        ("settled", "--e2e-window", "5000"),
        ("rabbitmq",),
        target=2.0,
        cpu_row="amqp091-transient",
    ),
    Row(
        "amqp1-durable",
        "AMQP 1.0 durable queue, durable messages, accepted after the commit + range settles, closed loop",
        "amqp1-load",
        ("unsettled", "--durable", "--e2e-window", "5000"),
        ("rabbitmq",),
        target=2.0,
        cpu_row="amqp091-durable",
    ),
    Row(
        "mqtt-queue",
        "MQTT `$queue/` QoS 1 fan-in 8 -> 1, closed loop (against Trimaran's AMQP 0.9.1 durable)",
        "mqtt",
        ("fanin", "--qos", "1", "--queue", "--e2e-window", "5000"),
        (),
        ref_row="amqp091-durable",
        target=1.0,
    ),
    # Issue 46: durable queues on PostgreSQL with fsync on, RabbitMQ's figure from amqp091-durable (the
    # same generator and arguments, in the same round); PostgreSQL's CPU a message beside the broker's.
    Row(
        "amqp091-durable-pg",
        "AMQP 0.9.1 durable queue on PostgreSQL (fsync on), queues.shared off, against RabbitMQ durable",
        "amqp091",
        ("durable",),
        ("rabbitmq",),
        target=2.0,
        postgres=True,
        peers_from="amqp091-durable",
    ),
    Row(
        "amqp091-durable-pg-shared",
        "AMQP 0.9.1 durable queue on PostgreSQL (fsync on), queues.shared on, against RabbitMQ durable "
        "and the same node with queues.shared off",
        "amqp091",
        ("durable",),
        ("rabbitmq",),
        target=1.5,
        postgres=True,
        settings=(("TRIMARAN_QUEUES__SHARED", "true"),),
        peers_from="amqp091-durable",
        ref_row="amqp091-durable-pg",
        ref_name="queues.shared off",
        ref_target=0.8,
        lossless=True,
        drain_max_s=2.0,
        gap_max_ms=200.0,
    ),
    Row(
        "mqtt-queue-pg-shared",
        "MQTT `$queue/` QoS 1 fan-in 8 -> 1, window 100, open loop, on PostgreSQL (fsync on), "
        "queues.shared on, against RabbitMQ's AMQP 0.9.1 durable",
        "mqtt",
        ("fanin", "--qos", "1", "--queue"),
        ("rabbitmq",),
        target=1.5,
        postgres=True,
        settings=(("TRIMARAN_QUEUES__SHARED", "true"),),
        peers_from="amqp091-durable",
        lossless=True,
        drain_max_s=2.0,
        gap_max_ms=200.0,
    ),
    Row(
        "mqtt-bridge-qos1",
        "MQTT QoS 1 fan-in 8 -> 1 across a bridge to a remote Mosquitto, closed loop",
        "mqtt-bridge",
        ("fanin", "--qos", "1", "--e2e-window", "2000", "--sub-ports", "29887"),
        ("mosquitto-bridge",),
        target=0.8,  # issue 48: against Mosquitto's own bridge between the same two brokers
        remote=True,
        settings=(("TRIMARAN_BRIDGES", json.dumps([BENCH_BRIDGE])),),
    ),
    Row(
        "relay",
        "Host speed: MQTT QoS 0 fan-in 8 -> 1 against the uvloop relay",
        "mqtt",
        ("fanin", "--qos", "0", "--e2e-window", "5000"),
        ("relay",),
        trimaran_from="mqtt-qos0-fanin",
        target=0.5,
    ),
    Row(
        "relay-topics",
        "Host speed on a fleet's traffic: MQTT QoS 0 fan-in 8 -> 1, 16 topics each, against the relay",
        "mqtt",
        ("fanin", "--qos", "0", "--topics", "16", "--e2e-window", "5000"),
        ("relay",),
        trimaran_from="mqtt-qos0-fanin-topics",
        target=1.0,  # issue 45: compiled
    ),
)
ROW_BY_KEY = {r.key: r for r in ROWS}

RESTARTS = {"row": "before each row", "round": "at the start of each round"}

PEER_NAMES = {
    "mosquitto": "Mosquitto",
    "mosquitto-bridge": "Mosquitto's bridge",
    "mosquitto-nodelay": "Mosquitto TCP_NODELAY",
    "rabbitmq": "RabbitMQ",
    "proton-broker": "proton C broker",
    "relay": "relay",
}


def clean(records: Iterable[dict]) -> list[dict]:
    """The run lines that count: measured (not the meta line), no error, not contaminated."""
    return [
        r
        for r in records
        if "row" in r and not r.get("meta") and not r.get("error") and not r.get("contaminated")
    ]


def us_per_message(rec: dict) -> float | None:
    cpu, rate = rec.get("broker_cpu_pct"), rec.get("msgs_per_s_received")
    if not isinstance(cpu, int | float) or not rate:
        return None
    return cpu / 100 * 1e6 / rate


def _median(values: Iterable[float | None]) -> float | None:
    vals = [v for v in values if isinstance(v, int | float)]
    return statistics.median(vals) if vals else None


@dataclass(frozen=True)
class Figure:
    """One contender's medians on one row."""

    rate: float | None
    p50: float | None
    p99: float | None
    us: float | None
    loss: float | None  # the largest of its runs (1 - received / acknowledged after the drain)
    runs: int
    per_round: dict[int, float]  # round -> median rate (latency rows: p50)
    pg_us: float | None = None  # PostgreSQL's CPU µs a delivered message (median)
    drain: float | None = None  # the longest drain_s of its runs
    gap: float | None = None  # the longest gap_max_ms of its runs


def figure(records: Sequence[dict], row: str, server: str, latency: bool) -> Figure | None:
    mine = [r for r in records if r["row"] == row and r["server"] == server]
    if not mine:
        return None
    key = "lat_p50_us" if latency else "msgs_per_s_received"
    rounds: dict[int, list[float]] = {}
    for r in mine:
        if isinstance(r.get(key), int | float):
            rounds.setdefault(r.get("round", 0), []).append(r[key])
    return Figure(
        rate=None if latency else _median(r.get("msgs_per_s_received") for r in mine),
        p50=_median(r.get("lat_p50_us") for r in mine) if latency else None,
        p99=_median(r.get("lat_p99_us") for r in mine) if latency else None,
        us=_median(us_per_message(r) for r in mine),
        loss=max((r["loss"] for r in mine if isinstance(r.get("loss"), int | float)), default=None),
        runs=len(mine),
        per_round={n: statistics.median(v) for n, v in sorted(rounds.items())},
        pg_us=_median(r.get("pg_us_per_msg") for r in mine),
        drain=_largest(r.get("drain_s") for r in mine),
        gap=_largest(r.get("gap_max_ms") for r in mine),
    )


def _largest(values: Iterable[object]) -> float | None:
    """The worst of the runs: issue 46's drain and gap bars hold for every run, not for the median."""
    return max((v for v in values if isinstance(v, int | float)), default=None)


def _num(v: float | None, nd: int = 0) -> str:
    return "-" if v is None else f"{v:,.{nd}f}"


def _value(f: Figure | None) -> str:
    if f is None:
        return "-"
    if f.rate is None:
        return f"{_num(f.p50, 1)} / {_num(f.p99, 1)}"
    lost = f" (lost {f.loss:.1%})" if f.loss else ""
    return _num(f.rate) + lost


def _drain_gap(f: Figure | None) -> str:
    return "-" if f is None else f"{_num(f.drain, 2)} s, {_num(f.gap)} ms"


def _ratio(a: float | None, b: float | None) -> str:
    return "-" if a is None or not b else f"{a / b:.2f}"


def _ratios(a: Figure | None, b: Figure | None) -> str:
    if a is None or b is None:
        return "-"
    if a.rate is None:
        return f"{_ratio(a.p50, b.p50)} / {_ratio(a.p99, b.p99)}"
    return _ratio(a.rate, b.rate)


def _per_round(a: Figure | None, b: Figure | None) -> str:
    if a is None or b is None:
        return "-"
    common = [n for n in a.per_round if n in b.per_round]
    return ", ".join(_ratio(a.per_round[n], b.per_round[n]) for n in common) or "-"


def _meets(a: Figure | None, b: Figure | None, target: float) -> bool | None:
    if a is None or b is None:
        return None
    if a.rate is None:
        if a.p50 is None or a.p99 is None or not b.p50 or not b.p99:
            return None
        return a.p50 / b.p50 <= target and a.p99 / b.p99 <= target
    return None if a.rate is None or not b.rate else a.rate / b.rate >= target


def _said(each: Sequence[bool | None]) -> str:
    return "-" if None in each or not each else "met" if all(each) else "**missed**"


# A build on half of its core (run.py's REF:half) stands for a host where Python runs at half speed;
# issue 32 asks that such a host still show every ratio at or above 1.0, whatever the row's own target.
SLOW_HOST_TARGET = 1.0


def _verdict(
    row: Row,
    pairs: Sequence[tuple[Figure | None, Sequence[Figure | None]]],
    half: Sequence[bool] = (),
    bar_of: tuple[float, str] | None = None,
) -> str:
    """Issue 32's bar for each build (with what it is compared to): met when every ratio meets it.
    ``bar_of``: (target, what) for a second comparison of the row (against its own ref_row), which
    holds on half a core too: it compares two runs of the same build."""
    own = row.target if bar_of is None else bar_of[0]
    if own is None:
        return "reported"
    bar = f"<= {own:g} (p50 and p99)" if row.latency else f">= {own:g}"
    if bar_of is not None:
        bar += f" x {bar_of[1]}"
    half = [False] * len(pairs) if bar_of is not None or not half else list(half)
    said = []
    for (m, theirs), slow in zip(pairs, half, strict=True):
        slowed = slow and not row.latency and "relay" not in row.peers  # the relay is Python too
        target = SLOW_HOST_TARGET if slowed else own
        lost = row.lossless and m is not None and bool(m.loss)
        said.append(_said([False if lost else _meets(m, t, target) for t in theirs]))
    if any(half) and not row.latency and "relay" not in row.peers:
        bar += f" (half a core: >= {SLOW_HOST_TARGET:g})"
    return f"{bar}: {' / '.join(said)}"


def _drain_verdict(row: Row, mine: Sequence[Figure | None]) -> str:
    """Issue 46's bars for each build: its longest drain, and its longest gap, at or under the row's."""
    said = []
    for name, bar, unit, values in (
        ("drain", row.drain_max_s, "s", [None if f is None else f.drain for f in mine]),
        ("gap", row.gap_max_ms, "ms", [None if f is None else f.gap for f in mine]),
    ):
        if bar is not None:
            each = [_said([None if v is None else v <= bar]) for v in values]
            said.append(f"{name} <= {bar:g} {unit}: {' / '.join(each)}")
    return "; ".join(said)


def _cpu_verdict(row: Row, pairs: Sequence[tuple[Figure | None, Figure | None]]) -> str:
    """Issue 34's CPU bar for each build: its µs per message here no more than on row.cpu_row."""
    each = [
        _said([None if m is None or r is None or m.us is None or r.us is None else m.us <= r.us])
        for m, r in pairs
    ]
    return f"CPU <= {row.cpu_row}: {' / '.join(each)}"


def format_table(records: Sequence[dict], meta: dict) -> str:
    """The Markdown table of one sitting, with the host, versions and commits above it."""
    runs = clean(records)
    attempted = {r.get("row") for r in records}
    builds: list[str] = meta.get("builds") or ["trimaran"]
    ab = len(builds) > 1  # each build after the first against the first
    half = [b.endswith("-half") for b in builds]
    head = ["msg/s delivered (latency: p50 / p99 µs)", *builds]
    head += [f"{b} / {builds[0]}" for b in builds[1:]]
    head += ["peer", *(f"{b} / peer" for b in builds), "target (issue 32)", "broker CPU µs per message"]
    # the PostgreSQL rows' own columns, only in a sitting that has them (the table of others is unchanged)
    pg = any(ROW_BY_KEY[k].postgres for k in attempted if k in ROW_BY_KEY)
    if pg:
        head += ["PostgreSQL CPU µs per message", "drain s, gap ms (the longest)"]
    head.append("ratio per round")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in ROWS:
        source = row.trimaran_from or row.key
        mine = [figure(runs, source, b, row.latency) for b in builds]
        if row.key not in attempted:
            continue  # not in this sitting; a row whose every run was discarded shows "-"
        compared: list[str] = []
        ratios: list[list[str]] = [[] for _ in builds]  # each build's, against the peers and ref_row
        verdicts: list[str] = []
        peers = [(p, figure(runs, row.peers_from or row.key, p, row.latency)) for p in row.peers]
        first = peers[0][1] if peers else None
        if peers or not row.ref_row:
            via = f" ({row.peers_from})" if row.peers_from else ""
            compared.append("; ".join(f"{PEER_NAMES.get(p, p)}{via} {_value(f)}" for p, f in peers))
            for mine_ratios, m in zip(ratios, mine, strict=True):
                mine_ratios.append("; ".join(_ratios(m, f) for _, f in peers))
            verdicts.append(_verdict(row, [(m, [f for _, f in peers]) for m in mine], half))
        if row.ref_row:
            theirs = [figure(runs, row.ref_row, b, False) for b in builds]
            compared.append(
                "; ".join(f"{b}'s {row.ref_name} {_value(f)}" for b, f in zip(builds, theirs, strict=True))
            )
            for mine_ratios, m, t in zip(ratios, mine, theirs, strict=True):
                mine_ratios.append(_ratios(m, t))
            first = first or theirs[0]
            pairs = [(m, [t]) for m, t in zip(mine, theirs, strict=True)]
            bar_of = (row.ref_target, row.ref_name) if peers and row.ref_target is not None else None
            verdicts.append(_verdict(row, pairs, half, bar_of))
        peer = "; ".join(compared)
        verdict = "; ".join(verdicts)
        if row.drain_max_s is not None or row.gap_max_ms is not None:
            verdict += "; " + _drain_verdict(row, mine)
        us = " / ".join(_num(f.us, 2) if f else "-" for f in mine)
        if peers:
            us = " / ".join([us, *(_num(f.us, 2) if f else "-" for _, f in peers)])
        if row.cpu_row:
            own = [figure(runs, row.cpu_row, b, False) for b in builds]
            us += "; " + "; ".join(
                f"{b}'s {row.cpu_row} {_num(f.us, 2) if f else '-'}" for b, f in zip(builds, own, strict=True)
            )
            cpu = _cpu_verdict(row, list(zip(mine, own, strict=True)))
            verdict = cpu if verdict == "reported" else f"{verdict}; {cpu}"
        cells = [row.title, *(_value(f) for f in mine)]
        cells += [_ratios(m, mine[0]) for m in mine[1:]]
        rounds = _per_round(mine[-1], mine[0]) if ab else _per_round(mine[0], first)
        cells += [peer, *("; ".join(r) for r in ratios), verdict, us]
        if pg:
            cells.append(" / ".join(_num(f.pg_us, 2) if f and row.postgres else "-" for f in mine))
            cells.append(" / ".join(_drain_gap(f) for f in mine) if row.postgres else "")
        cells.append(rounds)
        lines.append("| " + " | ".join(cells) + " |")
    discarded = sum(1 for r in records if r.get("contaminated"))
    errors = [r for r in records if r.get("error")]
    m = {k: meta.get(k, "?") for k in ("ts", "commit", "cpu_model", "cpus", "python", "uvloop")}
    m.update({k: meta.get(k, "?") for k in ("rounds", "runs", "warmup", "duration", "max_foreign_pct")})
    restart = RESTARTS.get(meta.get("restart", ""), "?")
    ab_of = ", ".join(f"{b} = {c}" for b, c in meta.get("ab", {}).items())
    about = [
        f"Sitting of {m['ts']}, this checkout at {m['commit']}" + (f"; A/B: {ab_of}" if ab else ""),
        f"Host: {m['cpu_model']}, {m['cpus']} CPUs; broker on CPU {meta.get('broker_cpu', 0)}, generator on "
        f"CPU {meta.get('gen_cpu', 1)}; Python {m['python']} (uvloop {m['uvloop']})",
        "Peers: " + ", ".join(f"{k} {v}" for k, v in meta.get("versions", {}).items()),
        "Trimaran's protocol machines: "
        + (
            ", ".join(f"{b} {how}" for b, how in meta["modes"].items())
            if meta.get("modes")
            else "interpreted"
        ),
        f"{m['rounds']} alternating rounds, {m['runs']} clean run(s) per contender per round, servers "
        f"restarted {restart}, {m['warmup']} s warm-up + {m['duration']} s window, runs with more than "
        f"{m['max_foreign_pct']}% of a core used by other processes discarded and retried ({discarded} "
        f"discarded, {len(errors)} failed); medians of the rounds.",
    ]
    if meta.get("postgres"):
        about.append(f"PostgreSQL: {meta['postgres']}")
    if meta.get("max_foreign_pct") == 0:
        about.append("**Contamination check off (--max-foreign-pct 0): a smoke run, not a measurement.**")
    for r in errors[:5]:
        about.append(f"failed: {r.get('row')} {r.get('server')} round {r.get('round')}: {r.get('error')}")
    return "\n".join([*about, "", *lines])
