"""bench/: the modules import, the table is right on recorded lines, the scripts parse, and nothing
points outside the repository. No load is generated here (that is `make bench`)."""

from __future__ import annotations

import importlib
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))

import benchlib  # noqa: E402
import pgdb  # noqa: E402
import run  # noqa: E402
import table  # noqa: E402


@pytest.mark.parametrize(
    "module",
    [
        "benchlib",
        "mqtt_load",
        "amqp091_load",
        "amqp1_load",
        "relay_ceiling",
        "table",
        "run",
        "pgdb",
        "pg_bench",
        "tls_bench",
        "storm_bench",
        "churn_bench",
    ],
)
def test_bench_modules_import(module: str) -> None:
    assert importlib.import_module(module).__doc__


def test_the_storm_and_churn_generators_read_mqtt_packets_split_anywhere() -> None:
    import storm_bench

    stream = storm_bench._connect("c", 60) + b"\xd0\x00" + storm_bench._subscribe("t/" + "x" * 200)
    buffer, got = bytearray(), []
    for i in range(len(stream)):  # a byte at a time: every split of the stream
        buffer += stream[i : i + 1]
        got += storm_bench._packets(buffer)
    assert [first for first, _ in got] == [0x10, 0xD0, 0x82] and not buffer
    assert len(got[2][1]) == 2 + 2 + 202 + 1  # packet id, topic, options: a two-byte length


def test_the_pacer_sends_each_publisher_its_messages_in_order_and_on_time() -> None:
    """mqtt_load's paced publishers share one timer: each sends at its rate, from its own phase,
    its sequence numbers in order, none ahead of its schedule."""
    import asyncio
    import time

    import mqtt_load

    rate, seconds, pubs = 40.0, 0.5, []

    class Transport:
        def __init__(self) -> None:
            self.writes: list[tuple[float, bytes]] = []

        def write(self, data: bytes) -> None:
            self.writes.append((time.monotonic(), data))

    async def run_pacer() -> float:
        for n in range(50):
            pub = mqtt_load.PacedPub()
            pub.transport = Transport()
            pub.configure_paced(f"t/{n}", 16, 0)
            pubs.append(pub)
        pacer = mqtt_load.Pacer(pubs, rate, 0.001)
        t0 = time.monotonic()
        pacer.start(t0, t0 + seconds)
        await asyncio.sleep(seconds + 0.05)
        return t0

    t0 = asyncio.run(run_pacer())
    for pub in pubs:
        packets = [data for _, data in pub.transport.writes]
        seqs = [mqtt_load.TS.unpack_from(p, len(p) - 16)[1] for p in packets]
        assert seqs == list(range(len(seqs))) and pub.sent == len(seqs)
        assert rate * seconds - 1 <= len(seqs) <= rate * seconds + 1
        first = pub.transport.writes[0][0]
        for m, (when, _) in enumerate(pub.transport.writes):
            assert when >= first + m / rate - 0.002  # never ahead of its schedule
    firsts = sorted(pub.transport.writes[0][0] - t0 for pub in pubs)
    assert firsts[-1] - firsts[0] > 0.5 / rate  # phases spread over the period, not one burst


def test_every_peer_has_a_port_and_a_name() -> None:
    for row in table.ROWS:
        for peer in row.peers:
            assert peer in run.PEER_PORTS, row.key
            assert peer in table.PEER_NAMES, row.key
        for other in (row.trimaran_from, row.ref_row, row.peers_from):
            assert other is None or other in table.ROW_BY_KEY
        if row.peers_from:  # the peers' figures are that row's: the same generator, arguments and peers
            source = table.ROW_BY_KEY[row.peers_from]
            assert row.peers == source.peers and not source.peers_from, row.key
        assert row.tool in ("amqp1", *run.GENERATORS)


def rec(row: str, server: str, rnd: int, rate: float, cpu: float = 50.0, **extra: object) -> dict:
    return {
        "row": row,
        "server": server,
        "round": rnd,
        "msgs_per_s_received": rate,
        "broker_cpu_pct": cpu,
        "foreign_cpu_pct": 0.0,
        **extra,
    }


def cells(text: str, title: str) -> list[str]:
    line = next(x for x in text.splitlines() if x.startswith(f"| {title} |"))
    return [c.strip() for c in line.strip("|").split("|")]


def test_table_takes_medians_of_clean_runs_and_ratios_from_the_same_sitting() -> None:
    fanin = "MQTT QoS 0 fan-in 8 -> 1, closed loop"
    records = [
        rec("mqtt-qos0-fanin", "trimaran", 1, 100_000),
        rec("mqtt-qos0-fanin", "trimaran", 2, 120_000),
        rec("mqtt-qos0-fanin", "trimaran", 3, 110_000, cpu=55.0),
        rec("mqtt-qos0-fanin", "trimaran", 3, 900_000, contaminated=True, foreign_cpu_pct=40.0),
        rec("mqtt-qos0-fanin", "mosquitto", 1, 100_000, cpu=40.0),
        rec("mqtt-qos0-fanin", "mosquitto", 2, 100_000, cpu=40.0),
        rec("mqtt-qos0-fanin", "mosquitto", 3, 90_000, cpu=40.0),
        {"row": "mqtt-qos0-fanin", "server": "mosquitto", "round": 3, "error": "generator exited 1"},
        rec("relay", "relay", 1, 440_000, cpu=44.0),
        rec("mqtt-latency", "trimaran", 1, 10_000, lat_p50_us=120.0, lat_p99_us=300.0),
        rec("mqtt-latency", "mosquitto", 1, 10_000, lat_p50_us=100.0, lat_p99_us=200.0),
        rec("mqtt-latency", "mosquitto-nodelay", 1, 10_000, lat_p50_us=80.0, lat_p99_us=400.0),
        rec("amqp091-durable", "trimaran", 1, 20_000, cpu=80.0),
        rec("mqtt-queue", "trimaran", 1, 25_000, cpu=80.0),
        rec("amqp091-transient", "trimaran", 1, 30_000, contaminated=True, foreign_cpu_pct=20.0),
    ]
    meta = {
        "meta": True,
        "builds": ["trimaran"],
        "cpu_model": "Test CPU",
        "versions": {"Mosquitto": "2.0.11"},
    }
    text = table.format_table(records, meta)
    assert "Host: Test CPU" in text and "Mosquitto 2.0.11" in text
    assert "(2 discarded, 1 failed)" in text
    # medians 110,000 and 100,000; the contaminated 900,000 is left out; rounds 1.00, 1.20, 1.22
    row = cells(text, fanin)
    assert row[1:4] == ["110,000", "Mosquitto 100,000", "1.10"]
    # broker µs per message: 50% of a core at 100k msg/s is 5 µs; medians of 5.0, 4.17, 5.0 and of 4, 4, 4.44
    assert row[4] == ">= 1.5: **missed**"
    assert row[5] == "5.00 / 4.00"
    assert row[6] == "1.00, 1.20, 1.22"
    lat = cells(text, "MQTT latency at 10k msg/s (p50 / p99 µs)")
    assert lat[1] == "120.0 / 300.0"
    assert lat[3:5] == ["1.20 / 1.50; 1.50 / 0.75", "<= 1 (p50 and p99): **missed**"]
    # the relay row takes Trimaran's fan-in figure; $queue/ is against Trimaran's own AMQP durable rate
    relay = cells(text, "Host speed: MQTT QoS 0 fan-in 8 -> 1 against the uvloop relay")
    assert relay[1:5] == ["110,000", "relay 440,000", "0.25", ">= 0.5: **missed**"]
    queue = cells(text, table.ROW_BY_KEY["mqtt-queue"].title)
    assert queue[1:5] == ["25,000", "trimaran's AMQP 0.9.1 durable 20,000", "1.25", ">= 1: met"]
    # a row whose every run was discarded shows no figure; rows nobody measured are left out
    assert cells(text, "AMQP 0.9.1 transient queue, closed loop")[1:4] == ["-", "RabbitMQ -", "-"]
    assert "AMQP 1.0" not in text


def test_ab_table_has_both_builds_and_their_ratio(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a, b = "trimaran@aaaaaaa", "trimaran@bbbbbbb"
    meta = {"meta": True, "builds": [a, b], "ab": {a: "aaaaaaa", b: "bbbbbbb"}, "max_foreign_pct": 8.0}
    lines = [meta]
    for rnd, (ra, rb, rr) in enumerate([(50_000, 40_000, 100_000), (60_000, 45_000, 90_000)], start=1):
        lines += [
            rec("amqp091-transient", a, rnd, ra),
            rec("amqp091-transient", b, rnd, rb),
            rec("amqp091-transient", "rabbitmq", rnd, rr),
        ]
    path = tmp_path / "sitting.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    run.main(["--table", str(path)])
    text = capsys.readouterr().out
    assert f"| msg/s delivered (latency: p50 / p99 µs) | {a} | {b} | {b} / {a} | peer |" in text
    row = cells(text, "AMQP 0.9.1 transient queue, closed loop")
    # medians 55,000, 42,500 and 95,000; per round B/A: 0.80, 0.75
    assert row[1:8] == [
        "55,000",
        "42,500",
        "0.77",
        "RabbitMQ 95,000",
        "0.58",
        "0.45",
        ">= 1: **missed** / **missed**",
    ]
    assert row[-1] == "0.80, 0.75"


def test_three_builds_are_each_against_the_first() -> None:
    """`AB="168878f HEAD:interpreted HEAD"`: an old commit, the source and the build in one sitting."""
    a, b, c = "trimaran@aaaaaaa", "trimaran@bbbbbbb-interpreted", "trimaran@bbbbbbb"
    meta = {"meta": True, "builds": [a, b, c], "ab": {a: "aaaaaaa", b: "bbbbbbb-interpreted", c: "bbbbbbb"}}
    records = []
    for rnd, (ra, rb, rc) in enumerate([(40_000, 50_000, 80_000), (40_000, 60_000, 100_000)], start=1):
        records += [rec("mqtt-qos1-fanin", a, rnd, ra), rec("mqtt-qos1-fanin", b, rnd, rb)]
        records += [rec("mqtt-qos1-fanin", c, rnd, rc), rec("mqtt-qos1-fanin", "mosquitto", rnd, 50_000)]
    text = table.format_table(records, meta)
    assert f"| {a} | {b} | {c} | {b} / {a} | {c} / {a} | peer |" in text
    row = cells(text, table.ROW_BY_KEY["mqtt-qos1-fanin"].title)
    # medians 40,000, 55,000 and 90,000; per round, the last build against the first: 2.00, 2.50
    assert row[1:10] == [
        "40,000",
        "55,000",
        "90,000",
        "1.38",
        "2.25",
        "Mosquitto 50,000",
        "0.80",
        "1.10",
        "1.80",
    ]
    assert row[10] == ">= 1.5: **missed** / **missed** / met"
    assert row[-1] == "2.00, 2.50"
    assert run.results_path(
        Path("/nonexistent"), [run.Build(n, n[9:], Path("."), i) for i, n in enumerate((a, b, c))]
    ).name.endswith("-ab-aaaaaaa-bbbbbbb-interpreted-bbbbbbb.jsonl")


def test_a_build_on_half_a_core_is_held_to_the_slow_host_bar() -> None:
    """Issue 32: a host where Python runs at half speed still shows every ratio at or above 1.0."""
    a, b = "trimaran@bbbbbbb", "trimaran@bbbbbbb-half"
    meta = {"meta": True, "builds": [a, b], "ab": {a: "bbbbbbb", b: "bbbbbbb-half"}}
    records = [
        rec("amqp091-durable", a, 1, 30_000),
        rec("amqp091-durable", b, 1, 18_000),
        rec("amqp091-durable", "rabbitmq", 1, 15_000),
        rec("mqtt-qos0-fanin", a, 1, 200_000),
        rec("mqtt-qos0-fanin", b, 1, 140_000),
        rec("relay", "relay", 1, 400_000),
    ]
    text = table.format_table(records, meta)
    durable = cells(text, table.ROW_BY_KEY["amqp091-durable"].title)
    assert durable[5:8] == ["2.00", "1.20", ">= 1.5 (half a core: >= 1): met / met"]
    # the relay is Python too: its row keeps its own bar for both
    relay = cells(text, table.ROW_BY_KEY["relay"].title)
    assert relay[5:8] == ["0.50", "0.35", ">= 0.5: met / **missed**"]


def test_builds_of_one_commit_share_a_worktree_and_keep_their_flags() -> None:
    with run.builds_for(["HEAD:interpreted", "HEAD", "HEAD:half"], sys.executable) as builds:
        assert len({b.src for b in builds}) == 1
        assert [(b.interpreted, b.cpu_share, b.index) for b in builds] == [
            (True, 1.0, 0),
            (False, 1.0, 1),
            (False, 0.5, 2),
        ]
        assert (
            builds[2].name.endswith("-half") and builds[2].env(sys.executable)["TRIMARAN_CPU_SHARE"] == "0.5"
        )
        assert builds[1].env(sys.executable)["TRIMARAN_CPU_SHARE"] == ""
        tree = builds[0].src
    assert not tree.exists()
    with pytest.raises(SystemExit), run.builds_for(["HEAD:fast", "HEAD"], sys.executable):
        pass


def test_a_wheel_build_runs_the_installed_package_from_its_venv(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``REF:wheel`` measures what a user installs (issue #45: within 5% of the ``make run`` build):
    the commit's wheel installed alone in a fresh venv, started from there with no checkout on its
    path; the venv goes with the sitting."""
    built: list[Path] = []

    def install_wheel(tree: Path, into: Path) -> Path:
        built.append(tree)
        venv = into / "venv"
        venv.mkdir()
        return venv

    monkeypatch.setattr(run, "install_wheel", install_wheel)
    with run.builds_for(["HEAD", "HEAD:wheel"], sys.executable) as builds:
        plain, wheel = builds
        assert built == [plain.src] and plain.venv is None and wheel.venv is not None
        assert "TRIMARAN_BIN" not in plain.env(sys.executable)
        env = wheel.env(sys.executable)
        assert env["TRIMARAN_BIN"] == str(wheel.venv / "bin" / "trimaran")
        assert env["TRIMARAN_SRC"] == str(wheel.venv) and wheel.name.endswith("-wheel")
        venv = wheel.venv
    assert not venv.exists()


@pytest.mark.parametrize("script", sorted(p.name for p in BENCH.glob("*.sh")))
def test_bench_scripts_parse(script: str) -> None:
    subprocess.run(["bash", "-n", str(BENCH / script)], check=True)


def test_bench_stands_alone() -> None:
    """Nothing the bench runs reaches outside the repository (the team's shared directory)."""
    root = BENCH.parent
    files = [
        *BENCH.glob("*.py"),
        *BENCH.glob("*.sh"),
        *BENCH.glob("conf/*"),
        BENCH / "README.md",
        root / "Makefile",
    ]
    for f in files:
        assert not re.search(r"\.\./shared\b", f.read_text()), f.name


def test_amqp1_rows_set_trimaran_cpu_against_its_own_amqp091_rows() -> None:
    records = [
        rec("amqp1-durable", "trimaran", 1, 40_000, cpu=80.0),  # 20 µs a message
        rec("amqp1-durable", "rabbitmq", 1, 10_000, cpu=90.0),
        rec("amqp091-durable", "trimaran", 1, 20_000, cpu=50.0),  # 25 µs
        rec("amqp1-transient", "trimaran", 1, 20_000, cpu=100.0),  # 50 µs
        rec("amqp1-transient", "rabbitmq", 1, 15_000, cpu=100.0),
        rec("amqp091-transient", "trimaran", 1, 50_000, cpu=100.0),  # 20 µs
    ]
    text = table.format_table(records, {"meta": True, "builds": ["trimaran"]})
    durable = cells(text, table.ROW_BY_KEY["amqp1-durable"].title)
    assert durable[1:4] == ["40,000", "RabbitMQ 10,000", "4.00"]
    assert durable[4] == ">= 2: met; CPU <= amqp091-durable: met"
    assert durable[5] == "20.00 / 90.00; trimaran's amqp091-durable 25.00"
    transient = cells(text, table.ROW_BY_KEY["amqp1-transient"].title)
    assert transient[4] == "CPU <= amqp091-transient: **missed**"
    assert transient[5].endswith("; trimaran's amqp091-transient 20.00")


def test_amqp1_load_is_told_which_server_it_talks_to(monkeypatch: pytest.MonkeyPatch) -> None:
    """RabbitMQ's queues are declared over AMQP 0.9.1 and addressed as its plugin does; Trimaran's not."""
    cmds: list[list[str]] = []

    def fake_run(cmd: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
        cmds.append(cmd)
        return subprocess.CompletedProcess(cmd, 0, stdout='{"msgs_per_s_received": 1.0}\n', stderr="")

    monkeypatch.setattr(run.subprocess, "run", fake_run)
    s = run.Settings("python", 1, 0.5, 1.0, 0.0, 1.0, 0.0, 1, 1, 500)
    row = table.ROW_BY_KEY["amqp1-durable"]
    for server, port in (("trimaran", 29692), ("rabbitmq", 29672)):
        assert run.run_generator(row, server, port, s) == [{"msgs_per_s_received": 1.0}]
    trimaran, rabbitmq = cmds
    assert trimaran[4:8] == [str(BENCH / "amqp1_load.py"), "unsettled", "--durable", "--e2e-window"]
    assert "--broker" not in trimaran
    assert rabbitmq[rabbitmq.index("--broker") + 1] == "rabbitmq"


def test_gap_is_the_longest_stretch_without_a_delivery_inside_the_window() -> None:
    """Issue 46's consumer gap, from the times of the reads that delivered (benchlib.GapMeter)."""
    # the stretch 1.5 -> 2.5 is cut at the window's end (2.0); the one before the window does not count
    assert benchlib.max_gap([0.0, 0.9, 1.0, 1.1, 1.5, 2.5], 1.0, 2.0) == pytest.approx(0.5)
    assert benchlib.max_gap([0.5, 1.05, 1.1, 1.9, 2.0], 1.0, 2.0) == pytest.approx(0.8)
    # a receiver that gets nothing from the window's start on has a gap from there
    assert benchlib.max_gap([1.3, 1.4, 1.5, 1.6, 1.7, 1.8, 1.9, 2.0], 1.0, 2.0) == pytest.approx(0.3)
    # and one that stops before the end has a gap to the end; nothing at all is the whole window
    assert benchlib.max_gap([1.0, 1.1, 1.2], 1.0, 2.0) == pytest.approx(0.8)
    assert benchlib.max_gap([], 1.0, 2.0) == pytest.approx(1.0)
    assert benchlib.max_gap([0.1, 2.5], 1.0, 2.0) == pytest.approx(1.0)
    # steady reads every 10 ms: 10 ms
    assert benchlib.max_gap([1.0 + i / 100 for i in range(101)], 1.0, 2.0) == pytest.approx(0.01)


def test_storage_cpu_is_not_foreign() -> None:
    """PostgreSQL on the broker's core is the broker's cost: the contamination rule sees the rest."""
    run_line = {"cpu0_busy_pct": 100.0, "cpu1_busy_pct": 60.0, "broker_cpu_pct": 70.0, "gen_cpu_pct": 55.0}
    assert benchlib.annotate_foreign(dict(run_line), 8.0)["contaminated"]  # 35% foreign
    clean = benchlib.annotate_foreign({**run_line, "storage_cpu_pct": 29.0}, 8.0)
    assert clean["foreign_cpu_pct"] == 6.0 and "contaminated" not in clean


def test_postgres_cost_a_message_over_the_call() -> None:
    lines = [
        {"received": 300_000, "msgs_per_s_received": 25_000.0, "storage_cpu_pct": 25.0},
        {"received": 100_000, "msgs_per_s_received": 20_000.0, "storage_cpu_pct": 30.0, "contaminated": True},
    ]
    pgdb.annotate(lines, rows=600_000, wal_bytes=200_000_000)
    assert [r["pg_us_per_msg"] for r in lines] == [10.0, 15.0]  # the window's CPU over the delivered rate
    assert {r["rows_per_msg"] for r in lines} == {1.5}  # every attempt wrote its messages
    assert {r["wal_bytes_per_msg"] for r in lines} == {500}


PG_ROWS = ["amqp091-durable-pg", "amqp091-durable-pg-shared", "mqtt-queue-pg-shared"]


def pg_sitting() -> list[dict]:
    """Recorded lines of a sitting of the PostgreSQL rows: RabbitMQ from amqp091-durable."""
    lines = []
    for rnd, (rabbit, unshared, shared, mqtt) in enumerate(
        [(20_000, 44_000, 32_000, 31_000), (24_000, 46_000, 36_000, 29_000)], start=1
    ):
        pg = {"storage_cpu_pct": 20.0, "rows_per_msg": 1.5, "wal_bytes_per_msg": 400}
        lines += [
            rec("amqp091-durable", "rabbitmq", rnd, rabbit, cpu=90.0, drain_s=0.1, gap_max_ms=5.0),
            rec(PG_ROWS[0], "trimaran", rnd, unshared, drain_s=0.05, gap_max_ms=9.0, pg_us_per_msg=5.0, **pg),
            rec(
                PG_ROWS[1],
                "trimaran",
                rnd,
                shared,
                drain_s=0.2 * rnd,
                gap_max_ms=30.0 * rnd,
                pg_us_per_msg=10.0,
            ),
            rec(
                PG_ROWS[2], "trimaran", rnd, mqtt, drain_s=2.5, gap_max_ms=150.0, pg_us_per_msg=12.0, loss=0.0
            ),
        ]
    return lines


def test_postgres_rows_show_postgres_cpu_drain_and_gap_beside_the_broker() -> None:
    meta = {"meta": True, "builds": ["trimaran"], "postgres": "PostgreSQL 15.18, fsync on"}
    text = table.format_table(pg_sitting(), meta)
    assert "PostgreSQL: PostgreSQL 15.18, fsync on" in text
    head = "| target (issue 32) | broker CPU µs per message | PostgreSQL CPU µs per message | drain s, gap ms"
    assert head in text
    # RabbitMQ's median 22,000 from amqp091-durable; the unshared node's 45,000 is 2.05x
    unshared = cells(text, table.ROW_BY_KEY[PG_ROWS[0]].title)
    assert unshared[1:5] == ["45,000", "RabbitMQ (amqp091-durable) 22,000", "2.05", ">= 2: met"]
    assert unshared[6:9] == ["5.00", "0.05 s, 9 ms", "2.20, 1.92"]
    # shared: 34,000 is 1.55x RabbitMQ and 0.76x the unshared node; the longest drain and gap count
    shared = cells(text, table.ROW_BY_KEY[PG_ROWS[1]].title)
    assert shared[1:3] == ["34,000", "RabbitMQ (amqp091-durable) 22,000; trimaran's queues.shared off 45,000"]
    assert shared[3] == "1.55; 0.76"
    assert shared[4] == (
        ">= 1.5: met; >= 0.8 x queues.shared off: **missed**; drain <= 2 s: met; gap <= 200 ms: met"
    )
    assert shared[6:8] == ["10.00", "0.40 s, 60 ms"]
    # the MQTT $queue/ row against RabbitMQ's AMQP 0.9.1 durable, held to the same drain and gap
    mqtt = cells(text, table.ROW_BY_KEY[PG_ROWS[2]].title)
    assert mqtt[1:5] == [
        "30,000",
        "RabbitMQ (amqp091-durable) 22,000",
        "1.36",
        ">= 1.5: **missed**; drain <= 2 s: **missed**; gap <= 200 ms: met",
    ]
    assert mqtt[7] == "2.50 s, 150 ms"
    # amqp091-durable ran for RabbitMQ only: its row has no PostgreSQL figures
    durable = cells(text, table.ROW_BY_KEY["amqp091-durable"].title)
    assert durable[1] == "-" and durable[6:8] == ["-", ""]


def test_a_lost_confirmed_message_misses_the_shared_rows_bar() -> None:
    lines = [*pg_sitting(), rec(PG_ROWS[1], "trimaran", 3, 40_000, loss=0.001, drain_s=0.1, gap_max_ms=1.0)]
    shared = cells(table.format_table(lines, {"builds": ["trimaran"]}), table.ROW_BY_KEY[PG_ROWS[1]].title)
    assert shared[1] == "36,000 (lost 0.1%)"
    assert shared[4].startswith(">= 1.5: **missed**; >= 0.8 x queues.shared off: **missed**")


def test_postgres_rows_take_rabbitmq_from_the_durable_row(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(run.pgdb, "unavailable", lambda: None)
    rows, peers_only, skipped = run.plan(PG_ROWS)
    assert [r.key for r in rows] == ["amqp091-durable", *PG_ROWS] and peers_only == {"amqp091-durable"}
    builds = [run.Build("trimaran", "abc", Path("."), 0)]
    assert run.contenders(rows[0], builds, peers_only=True) == ["rabbitmq"]
    assert [run.contenders(r, builds) for r in rows[1:]] == [["trimaran"]] * 3
    # with the durable row in the sitting, RabbitMQ runs there once, and Trimaran too
    rows, peers_only, _ = run.plan(["amqp091-durable", PG_ROWS[1]])
    assert [r.key for r in rows] == ["amqp091-durable", PG_ROWS[1]] and not peers_only
    # without PostgreSQL the rows are left out, and the sitting says why
    monkeypatch.setattr(
        run.pgdb, "unavailable", lambda: "PostgreSQL is not installed (apt-get install postgresql)"
    )
    rows, peers_only, skipped = run.plan(["mqtt-qos0-fanin", *PG_ROWS])
    assert [r.key for r in rows] == ["mqtt-qos0-fanin"] and not peers_only
    assert skipped is not None and "apt-get install postgresql" in skipped
    text = table.format_table(
        [rec("mqtt-qos0-fanin", "trimaran", 1, 1.0)], {"postgres": f"rows skipped: {skipped}"}
    )
    assert "PostgreSQL: rows skipped: PostgreSQL is not installed" in text
    assert "PostgreSQL CPU" not in text  # no PostgreSQL row, no PostgreSQL columns


def test_generator_is_told_the_postmaster(monkeypatch: pytest.MonkeyPatch) -> None:
    cmds: list[list[str]] = []

    def fake_run(cmd: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
        cmds.append(cmd)
        return subprocess.CompletedProcess(cmd, 0, stdout='{"received": 10}\n', stderr="")

    monkeypatch.setattr(run.subprocess, "run", fake_run)
    s = run.Settings("python", 1, 0.5, 1.0, 0.0, 1.0, 0.0, 1, 1, 500)
    run.run_generator(table.ROW_BY_KEY[PG_ROWS[1]], "trimaran", 29692, s, storage_pid=4321)
    run.run_generator(table.ROW_BY_KEY["amqp091-durable"], "rabbitmq", 29672, s)
    assert cmds[0][cmds[0].index("--storage-pid") + 1] == "4321" and "--storage-pid" not in cmds[1]
