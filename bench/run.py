#!/usr/bin/env python3
"""`make bench`: every row of the README's performance table in one sitting, from this repository alone.

    python bench/run.py [--install] [--rounds 3] [--rows mqtt-qos0-fanin,...] [--ab C1 C2 [C3 ...]]
    python bench/run.py --table bench/results/<file>.jsonl        # print a recorded sitting again

What it does (run as root on a machine with at least 2 CPUs, as quiet as you can make it):
- checks what it needs and says what is missing (`--install`: apt-get and pip install it): Debian's
  `mosquitto`, `rabbitmq-server` (with the rabbitmq_amqp1_0 plugin it ships), qpid-proton's C examples
  (`libqpid-proton11-dev-examples`, built here with `gcc` against `libqpid-proton11-dev`), uvloop in the venv;
- starts Trimaran (this checkout, or each commit of `--ab` from a temporary git worktree, with the venv's
  python and PYTHONPATH on the tree) and the peers with `brokers.sh`, every server pinned to CPU 0 and
  restarted before each of its rows (`--restart round`: all at the start of each round, which is
  quicker); the generators run pinned to CPU 1;
- runs the rows of `table.ROWS` in alternating rounds (round 1: each row for Trimaran then its peers,
  round 2 the same, ...), each run discarded and retried when other processes used more than
  `--max-foreign-pct` of a core in its window (`foreign_cpu_pct`, benchlib's rule);
- writes every run as a JSON line (first line: the host, versions and commits) to
  `bench/results/<date>-<commit>.jsonl` and prints the table (`table.format_table`).

The generators are `mqtt_load.py`, `amqp091_load.py` and `amqp1_load.py` (raw sockets, not the bottleneck:
see README.md); the AMQP 1.0 transient row times proton's C `send` and `receive` examples through a
transient queue (declared first over AMQP 0.9.1; the proton C broker makes its queues on demand), and the
durable row runs `amqp1_load.py unsettled --durable` (proton's C `send` does not mark messages durable).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import resource
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO / "scripts"))

import amqp1_load  # noqa: E402
import benchlib as bl  # noqa: E402
import pgdb  # noqa: E402
import table  # noqa: E402
import wheel_suites  # noqa: E402

PEER_PORTS = {
    "mosquitto": 29883,
    "mosquitto-nodelay": 29888,
    "relay": 29885,
    "mosquitto-bridge": 29886,
    "rabbitmq": 29672,
    "proton-broker": 29695,
}
PROTON_EXAMPLES = Path("/usr/share/proton/examples/c")
RABBITMQ_SERVER = Path("/usr/lib/rabbitmq/bin/rabbitmq-server")
# "mqtt-bridge": mqtt_load.py with its subscribers on another port (the bridge row's remote)
GENERATORS = {
    "mqtt": "mqtt_load.py",
    "mqtt-bridge": "cluster_load.py",
    "amqp091": "amqp091_load.py",
    "amqp1-load": "amqp1_load.py",
}
# What a generator needs to know of a peer: amqp1_load.py declares RabbitMQ's queues over AMQP 0.9.1
# and addresses them as the 3.x plugin does, and logs in with PLAIN.
SERVER_ARGS = {("amqp1-load", "rabbitmq"): ("--broker", "rabbitmq")}


@dataclass(frozen=True)
class Build:
    """One Trimaran to measure: its name in the table and the records, its tree and its ports."""

    name: str
    commit: str
    src: Path
    index: int  # its port block: 29893/29692/29890, 100 higher for each build after the first
    interpreted: bool = False  # run the source even where the tree has a mypyc build (compiled.py)
    cpu_share: float = (
        1.0  # of its core (brokers.sh's CPU cgroup): 0.5 is a host where Python runs at half speed
    )
    # A fresh venv holding the tree's wheel, built as pip builds it (the "wheel" flag): what a user
    # who installs Trimaran runs, started from there with no checkout on its path.
    venv: Path | None = None

    @property
    def mqtt_port(self) -> int:
        return 29893 + 100 * self.index

    @property
    def amqp_port(self) -> int:
        return 29692 + 100 * self.index

    def env(self, python: str) -> dict[str, str]:
        return {
            "TRIMARAN_SRC": str(self.src),
            "TRIMARAN_PY": python,
            "TRIMARAN_MQTT_PORT": str(self.mqtt_port),
            "TRIMARAN_AMQP_PORT": str(self.amqp_port),
            "TRIMARAN_HTTP_PORT": str(29890 + 100 * self.index),
            "TRIMARAN_INTERPRETED": "1" if self.interpreted else "0",
            "TRIMARAN_CPU_SHARE": "" if self.cpu_share == 1.0 else f"{self.cpu_share:g}",
        } | (
            {}
            if self.venv is None
            # brokers.sh runs it from TRIMARAN_SRC, on its PYTHONPATH: the venv's top holds no package
            else {"TRIMARAN_BIN": str(self.venv / "bin" / "trimaran"), "TRIMARAN_SRC": str(self.venv)}
        )

    def prepare(self, python: str, log: Path) -> str:
        """Build the tree's hot modules with mypyc where it can (scripts/compile.py, from the commit
        that added it on) unless this build is the interpreted one; returns the start log's phrase
        for what runs (trimaran/compiled.py), or "interpreted" for a tree from before the build."""
        if self.venv is not None:
            return installed_mode(self.venv)
        env = {
            **os.environ,
            "PYTHONPATH": str(self.src),
            "TRIMARAN_INTERPRETED": self.env(python)["TRIMARAN_INTERPRETED"],
        }
        if not (self.src / "scripts" / "compile.py").exists():
            return "interpreted"
        if not self.interpreted and self.src not in _COMPILED and not self.built(python, env):
            _COMPILED.add(self.src)
            print(f"bench: compiling {self.name} with mypyc (log: {log})", flush=True)
            with log.open("w") as out:
                subprocess.run(
                    [python, "scripts/compile.py"], cwd=self.src, env=env, stdout=out, stderr=out, check=True
                )
        mode = subprocess.run(
            [python, "-c", "import trimaran.compiled as c; print(c.describe())"],
            cwd=self.src,
            env=env,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        if not self.interpreted and not mode.startswith("compiled"):
            sys.exit(f"bench: {self.name} was compiled but runs {mode}")
        return mode if self.cpu_share == 1.0 else f"{mode} on {self.cpu_share:g} of its core"

    def built(self, python: str, env: dict[str, str]) -> bool:
        """The tree holds a current build of every hot module (``compiled.why_interpreted``): a
        second sitting from the same tree does not build it again (~7 minutes)."""
        check = "import trimaran.compiled as c; print(c.why_interpreted() is None)"
        out = subprocess.run([python, "-c", check], cwd=self.src, env=env, capture_output=True, text=True)
        return out.stdout.strip() == "True"


_COMPILED: set[Path] = set()  # trees built in this sitting (builds of one commit share a tree)
FLAGS = {
    "interpreted": "its source, not its mypyc build",
    "half": "half of its core: Python at half speed",
    "wheel": "its wheel as python -m build makes it, installed alone in a fresh venv",
}


def install_wheel(tree: Path, into: Path) -> Path:
    """The tree's wheel as a user's pip builds it, installed alone in a fresh venv under ``into``
    (scripts/wheel_suites.py, without the test extras); returns the venv."""
    wheel = wheel_suites.build(into / "dist", tree, log=into / "build.log")
    wheel_suites.install(wheel, into / "venv", extras="")
    return into / "venv"


def installed_mode(venv: Path) -> str:
    """What the venv's Trimaran runs, checked to be its own package and compiled."""
    return f"{wheel_suites.installed(venv / 'bin' / 'python', venv, venv)}, installed from its wheel"


# --------------------------------------------------------------------------- what the sitting needs
def missing(python: str, postgres: bool = False) -> tuple[list[str], list[str]]:
    """(Debian packages, pip packages) that are not there yet. PostgreSQL itself is not among them:
    its package starts a system cluster of its own, so rows that need it are skipped where it is
    not installed (pgdb.unavailable) rather than installed for; ``postgres``: Trimaran's driver is."""
    apt = []
    if not shutil.which("mosquitto", path=os.environ.get("PATH", "") + ":/usr/sbin"):
        apt.append("mosquitto")
    plugins = list(Path("/usr/lib/rabbitmq/lib").glob("rabbitmq_server-*/plugins/rabbitmq_amqp1_0*"))
    if not RABBITMQ_SERVER.exists() or not plugins:
        apt.append("rabbitmq-server")
    if not (PROTON_EXAMPLES / "send.c").exists():
        apt.append("libqpid-proton11-dev-examples")
    if subprocess.run(["pkg-config", "--exists", "libqpid-proton"], capture_output=True).returncode:
        apt.append("libqpid-proton11-dev")
    for tool, package in (("gcc", "gcc"), ("pkg-config", "pkg-config"), ("taskset", "util-linux")):
        if not shutil.which(tool) and package not in apt:
            apt.append(package)
    if not shutil.which("ss"):
        apt.append("iproute2")
    # uvloop runs Trimaran as `make run` does; mypy brings mypyc, which builds the hot modules.
    pip = [package for package in ("uvloop", "mypy") if not _run_ok([python, "-c", f"import {package}"])]
    if postgres and not _run_ok([python, "-c", "import psycopg"]):
        pip.append("psycopg[binary]")  # pyproject's `postgres` extra: Trimaran's PostgreSQL driver
    return apt, pip


def _run_ok(cmd: list[str]) -> bool:
    try:
        return subprocess.run(cmd, capture_output=True).returncode == 0
    except OSError:
        return False


def ensure_deps(python: str, install: bool, postgres: bool = False) -> None:
    apt, pip = missing(python, postgres)
    if (apt or pip) and install:
        if apt:
            if os.geteuid() != 0:
                sys.exit(f"bench: needs root to install {' '.join(apt)} (sudo make bench)")
            subprocess.run(["apt-get", "update", "-qq"], check=True)
            subprocess.run(["apt-get", "install", "-y", *apt], check=True)
        if pip:
            subprocess.run([python, "-m", "pip", "install", "--quiet", *pip], check=True)
        apt, pip = missing(python, postgres)
    if apt or pip:
        lines = ["bench: missing, install them or run `make bench` (it passes --install):"]
        if apt:
            lines.append(f"  apt-get install -y {' '.join(apt)}")
        if pip:
            lines.append(f"  {python} -m pip install {' '.join(pip)}")
        sys.exit("\n".join(lines))
    if (os.cpu_count() or 1) < 2:
        sys.exit("bench: needs 2 CPUs (the broker on CPU 0, the generator on CPU 1)")


def build_proton(dest: Path) -> None:
    """proton's C examples `send`, `receive` and `broker`, compiled once into dest."""
    dest.mkdir(parents=True, exist_ok=True)
    flags = subprocess.run(
        ["pkg-config", "--cflags", "--libs", "libqpid-proton"], capture_output=True, text=True, check=True
    ).stdout.split()
    for name in ("send", "receive", "broker"):
        exe = dest / name
        if not exe.exists():
            src = PROTON_EXAMPLES / f"{name}.c"
            subprocess.run(["gcc", "-O2", "-o", str(exe), str(src), *flags, "-lpthread"], check=True)
    certs = dest / "ssl-certs"
    if not certs.exists() and (PROTON_EXAMPLES / "ssl-certs").exists():
        shutil.copytree(PROTON_EXAMPLES / "ssl-certs", certs)


def versions() -> dict[str, str]:
    def deb(package: str) -> str:
        out = subprocess.run(
            ["dpkg-query", "-W", "-f", "${Version}", package], capture_output=True, text=True
        )
        return out.stdout.strip() or "not installed"

    return {
        "Mosquitto": deb("mosquitto"),
        "RabbitMQ": deb("rabbitmq-server"),
        "Erlang": deb("erlang-base"),
        "qpid-proton C": deb("libqpid-proton11"),
    }


def cpu_model() -> str:
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def git(*args: str, cwd: Path = REPO) -> str:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True).stdout.strip()


def head_commit() -> str:
    sha = git("rev-parse", "--short", "HEAD")
    dirty = subprocess.run(["git", "diff", "--quiet", "HEAD", "--", "trimaran"], cwd=REPO).returncode
    return sha + ("-dirty" if dirty else "")


@contextlib.contextmanager
def builds_for(ab: list[str] | None, python: str, interpreted: bool = False) -> Iterator[list[Build]]:
    """This checkout, or each A/B commit checked out into a temporary worktree (removed afterwards;
    one per commit). A ref's flags (FLAGS) follow it after colons: ``HEAD:interpreted HEAD`` measures
    what the mypyc build is worth, ``HEAD HEAD:half`` what a host where Python runs at half speed
    would show against the same peers."""
    if not ab:
        yield [Build("trimaran", head_commit(), REPO, 0, interpreted)]
        return
    trees: dict[str, Path] = {}
    venvs: dict[str, Path] = {}  # a commit's installed wheel, for its "wheel" builds
    try:
        builds = []
        for i, spec in enumerate(ab):
            ref, *flags = spec.split(":")
            if any(f not in FLAGS for f in flags):
                sys.exit(f"bench: {spec}: a ref, then any of :{' :'.join(FLAGS)}")
            sha = git("rev-parse", "--short", f"{ref}^{{commit}}")
            if sha not in trees:
                trees[sha] = Path(tempfile.mkdtemp(prefix=f"bench-{sha}-"))
                git("worktree", "add", "--detach", str(trees[sha]), sha)
            commit = "-".join([sha, *flags])
            if "wheel" in flags and sha not in venvs:
                venvs[sha] = install_wheel(trees[sha], Path(tempfile.mkdtemp(prefix=f"bench-wheel-{sha}-")))
            builds.append(
                Build(
                    f"trimaran@{commit}",
                    commit,
                    trees[sha],
                    i,
                    "interpreted" in flags,
                    0.5 if "half" in flags else 1.0,
                    venvs[sha] if "wheel" in flags else None,
                )
            )
        for b in builds:
            if b.venv is not None:
                continue  # installed_mode checks what it imports
            env = {**os.environ, "PYTHONPATH": str(b.src)}
            where = subprocess.run(
                [python, "-c", "import trimaran; print(trimaran.__file__)"],
                env=env,
                cwd=b.src,
                capture_output=True,
                text=True,
                check=True,
            ).stdout.strip()
            if not where.startswith(str(b.src)):
                sys.exit(f"bench: {b.name} imports trimaran from {where}, not from {b.src}")
        yield builds
    finally:
        for tree in trees.values():
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=REPO, capture_output=True)
        for venv in venvs.values():
            shutil.rmtree(venv.parent, ignore_errors=True)


# --------------------------------------------------------------------------- servers
class Servers:
    """brokers.sh with this sitting's environment."""

    def __init__(self, run_dir: Path, python: str, builds: list[Build], broker_cpu: int) -> None:
        self.env = {
            **os.environ,
            "BENCH_RUN": str(run_dir),
            "BENCH_PY": python,
            "PROTON_C": str(run_dir / "proton-c"),
            "BROKER_CPU": str(broker_cpu),
        }
        self.python = python
        self.builds = {b.name: b for b in builds}
        self.settings: dict[str, dict[str, str]] = {}  # each server's TRIMARAN_* settings as it runs

    def _sh(self, *args: str, extra: dict[str, str] | None = None) -> None:
        out = subprocess.run(
            [str(HERE / "brokers.sh"), *args],
            env={**self.env, **(extra or {})},
            capture_output=True,
            text=True,
        )
        if out.returncode:
            raise RuntimeError(f"brokers.sh {' '.join(args)}: {out.stdout.strip()} {out.stderr.strip()}")

    def restart(self, name: str, settings: dict[str, str] | None = None) -> None:
        """Start ``name`` again; a Trimaran build with ``settings`` (TRIMARAN_* variables, which
        brokers.sh passes on: the storage URL and queues.shared of the PostgreSQL rows)."""
        if name in self.builds:
            b = self.builds[name]
            self._sh("restart", f"trimaran-{b.index}", extra={**b.env(self.python), **(settings or {})})
            self.settings[name] = dict(settings or {})
        else:
            self._sh("restart", name)

    def pid(self, name: str) -> int:
        out = subprocess.run(
            [str(HERE / "brokers.sh"), "pid", name], env=self.env, capture_output=True, text=True, check=True
        )
        return int(out.stdout)

    def stop_all(self) -> None:
        self._sh("stop-all")


# --------------------------------------------------------------------------- one measurement
@dataclass(frozen=True)
class Settings:
    python: str
    runs: int
    warmup: float
    duration: float
    quiet_pct: float
    quiet_wait: float
    max_foreign_pct: float
    max_attempts: int
    gen_cpu: int
    amqp1_count: int


def run_generator(
    row: table.Row, server: str, port: int, s: Settings, storage_pid: int | None = None
) -> list[dict]:
    """The row's generator against one server: its run lines (the summary line left out).
    ``storage_pid``: the PostgreSQL the server stores in, whose CPU the generator measures apart."""
    warmup = max(s.warmup, row.warmup or 0.0)
    cmd = [
        "taskset",
        "-c",
        str(s.gen_cpu),
        s.python,
        str(HERE / GENERATORS[row.tool]),
        *row.args,
        *SERVER_ARGS.get((row.tool, server), ()),
        "--port",
        str(port),
        "--label",
        server,
        *("--runs", str(s.runs), "--warmup", str(warmup), "--duration", str(s.duration)),
        *("--quiet-pct", str(s.quiet_pct), "--quiet-wait", str(s.quiet_wait)),
        *("--max-foreign-pct", str(s.max_foreign_pct), "--max-attempts", str(s.max_attempts)),
        *(("--storage-pid", str(storage_pid)) if storage_pid else ()),
    ]
    budget = (warmup + s.duration + 60 + s.quiet_wait) * s.max_attempts + 60
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=budget)
    except subprocess.TimeoutExpired:
        return [{"error": f"generator timed out after {budget:.0f} s"}]
    lines = []
    for line in out.stdout.splitlines():
        with contextlib.suppress(ValueError):
            rec = json.loads(line)
            if isinstance(rec, dict) and not rec.get("summary"):
                lines.append(rec)
    if not lines:
        lines.append({"error": f"generator exited {out.returncode}: {out.stderr.strip()[-400:]}"})
    return lines


def amqp1_once(server: str, port: int, s: Settings, proton: Path) -> dict:
    """proton C `receive` then `send` of amqp1_count messages through a transient queue, timed from the
    sender's start to the last message received, with the broker's CPU and the host's CPU over that span."""
    q = f"bench-{secrets.token_hex(3)}"
    declared = server != "proton-broker"
    address = f"/amq/queue/{q}" if server == "rabbitmq" else q
    rec: dict = {
        "scenario": "amqp1_send_receive",
        "label": server,
        "params": {"count": s.amqp1_count, "address": address, "transient": True},
        "gen_affinity": [s.gen_cpu],
    }
    if declared:
        amqp1_load.rabbitmq_queues("127.0.0.1", port, "guest", "guest", "/", [q], "declare")
    broker_pid = bl.find_listener_pid(port)
    rec["broker_pid"] = broker_pid
    if s.quiet_pct:
        rec["quiet_pct_before"] = bl.wait_quiet(s.quiet_pct, s.quiet_wait)
    pin = ["taskset", "-c", str(s.gen_cpu)]
    args = ["127.0.0.1", str(port), address, str(s.amqp1_count)]
    timeout = max(60.0, s.amqp1_count / 500)
    receiver = subprocess.Popen([*pin, str(proton / "receive"), *args], stdout=subprocess.DEVNULL)
    try:
        time.sleep(0.5)  # attached and credit granted before the first message
        r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        a_t, a_s = time.monotonic(), bl.cpu_times_all()
        a_b = bl.proc_cpu_seconds(broker_pid) if broker_pid else None
        sender = subprocess.run([*pin, str(proton / "send"), *args], capture_output=True, timeout=timeout)
        code = receiver.wait(timeout=timeout)
        b_t, b_s = time.monotonic(), bl.cpu_times_all()
        b_b = bl.proc_cpu_seconds(broker_pid) if broker_pid else None
        r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    except subprocess.TimeoutExpired:
        receiver.kill()
        receiver.wait()
        return {**rec, "error": f"send/receive did not finish within {timeout:.0f} s"}
    finally:
        if declared:
            with contextlib.suppress(OSError, ConnectionError):
                amqp1_load.rabbitmq_queues("127.0.0.1", port, "guest", "guest", "/", [q], "delete")
    if sender.returncode or code:
        return {**rec, "error": f"send exited {sender.returncode}, receive {code}: {sender.stderr[-300:]!r}"}
    dt = b_t - a_t
    gen = (r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime)
    rec.update(
        sent=s.amqp1_count,
        received=s.amqp1_count,
        expected=s.amqp1_count,
        duration=round(dt, 3),
        msgs_per_s_received=round(s.amqp1_count / dt, 1),
        loss=0.0,
        gen_cpu_pct=round(100 * gen / dt, 1),
    )
    if a_b is not None and b_b is not None:
        rec["broker_cpu_pct"] = round(100 * (b_b - a_b) / dt, 1)
    rec.update(bl.cpu_busy_pct(a_s, b_s))
    return bl.annotate_foreign(rec, s.max_foreign_pct)


def run_amqp1(server: str, port: int, s: Settings, proton: Path) -> list[dict]:
    """benchlib's rule for the proton row: retry contaminated runs until s.runs clean or s.max_attempts."""
    lines: list[dict] = []
    for attempt in range(1, s.max_attempts + 1):
        try:
            rec = amqp1_once(server, port, s, proton)
        except (OSError, ConnectionError, RuntimeError) as e:
            rec = {"scenario": "amqp1_send_receive", "label": server, "error": f"{type(e).__name__}: {e}"}
        rec["run"] = attempt
        lines.append(rec)
        if sum(1 for r in lines if not r.get("error") and not r.get("contaminated")) >= s.runs:
            break
    return lines


# --------------------------------------------------------------------------- the sitting
def contenders(row: table.Row, builds: list[Build], peers_only: bool = False) -> list[str]:
    """Who runs this row: the builds (unless the row takes their figure from another, or is in the
    sitting only for its peers) and its peers (unless they are measured on row.peers_from)."""
    mine = [] if row.trimaran_from or peers_only else [b.name for b in builds]
    return [*mine, *([] if row.peers_from else row.peers)]


def plan(keys: list[str] | None) -> tuple[list[table.Row], set[str], str | None]:
    """The sitting's rows, the keys of those in it only for their peers (a selected row's
    peers_from), and why the PostgreSQL rows were left out (None when they were not)."""
    rows = [table.ROW_BY_KEY[k] for k in keys] if keys else list(table.ROWS)
    skipped = None
    if any(r.postgres for r in rows):
        skipped = pgdb.unavailable()
        if skipped:
            print(f"bench: skipping {', '.join(r.key for r in rows if r.postgres)}: {skipped}", flush=True)
            rows = [r for r in rows if not r.postgres]
    keys = [r.key for r in rows]
    extra = [k for k in dict.fromkeys(r.peers_from for r in rows if r.peers_from) if k not in keys]
    return [*(table.ROW_BY_KEY[k] for k in extra), *rows], set(extra), skipped


def measure_pg(
    db: pgdb.Database, url: str, row: table.Row, server: str, port: int, s: Settings
) -> list[dict]:
    """The generator against a Trimaran storing in ``url``: its CPU in the window apart from the
    broker's (--storage-pid), and the rows and WAL it wrote over the call a message (pgdb)."""
    rows0, wal0 = db.stats(url)
    lines = run_generator(row, server, port, s, storage_pid=db.postmaster())
    rows1, wal1 = db.stats(url)
    pgdb.annotate(lines, rows1 - rows0, wal1 - wal0)
    return lines


def port_for(row: table.Row, server: str, builds: dict[str, Build]) -> int:
    if server in builds:
        return builds[server].mqtt_port if row.tool.startswith("mqtt") else builds[server].amqp_port
    return PEER_PORTS[server]


def sitting(a: argparse.Namespace, builds: list[Build], out: Path, meta: dict) -> list[dict]:
    rows, peers_only, pg_skipped = plan(a.rows)
    by_name = {b.name: b for b in builds}
    needed = list(dict.fromkeys(c for row in rows for c in contenders(row, builds, row.key in peers_only)))
    run_dir = Path(a.run_dir).resolve()
    proton = run_dir / "proton-c"
    if any(r.tool == "amqp1" for r in rows) or "proton-broker" in needed:
        build_proton(proton)
    s = Settings(
        python=a.python,
        runs=a.runs,
        warmup=a.warmup,
        duration=a.duration,
        quiet_pct=a.quiet_pct,
        quiet_wait=a.quiet_wait,
        max_foreign_pct=a.max_foreign_pct,
        max_attempts=a.max_attempts or 3 * a.runs,
        gen_cpu=a.gen_cpu,
        amqp1_count=a.amqp1_count or max(500, int(a.duration * 10_000)),
    )
    servers = Servers(run_dir, a.python, builds, a.broker_cpu)
    meta["run_dir"] = str(run_dir)
    if pg_skipped:
        meta["postgres"] = f"rows skipped: {pg_skipped}"
    records: list[dict] = []
    # One cluster for the sitting (fsync on, on the broker's core), a fresh database per Trimaran run
    db = pgdb.Database(cpu=a.broker_cpu) if any(r.postgres for r in rows) else None
    try:
        if db is not None:
            meta["postgres"] = (
                f"PostgreSQL {db.version()}, fsync on, on CPU {a.broker_cpu} with the broker, a fresh "
                "database for each Trimaran run; its CPU is not counted as foreign"
            )
        with out.open("a") as f:
            f.write(json.dumps(meta) + "\n")
            try:
                for rnd in range(1, a.rounds + 1):
                    print(f"=== round {rnd}/{a.rounds} {time.strftime('%H:%M:%S')}", flush=True)
                    if a.restart == "round":
                        for name in needed:
                            servers.restart(name)
                    for row in rows:
                        for server in contenders(row, builds, row.key in peers_only):
                            settings = dict(row.settings) if server in by_name else {}
                            url = None
                            if row.postgres and server in by_name and db is not None:
                                url = db.new()  # every Trimaran run starts on empty tables
                                settings["TRIMARAN_STORAGE__URL"] = url
                            remote = None
                            if row.remote:  # a fresh remote, then the bridging server connecting to it
                                servers.restart("mosquitto-remote")
                                remote = servers.pid("mosquitto-remote")
                            # a fresh database needs a fresh start, and so does leaving one for SQLite
                            if (
                                a.restart == "row"
                                or url
                                or remote
                                or servers.settings.get(server, {}) != settings
                            ):
                                servers.restart(server, settings)
                            port = port_for(row, server, by_name)
                            if row.tool == "amqp1":
                                lines = run_amqp1(server, port, s, proton)
                            elif url is not None and db is not None:
                                lines = measure_pg(db, url, row, server, port, s)
                            else:
                                lines = run_generator(row, server, port, s, storage_pid=remote)
                            for rec in lines:
                                rec.update(row=row.key, server=server, round=rnd)
                                if server in by_name:
                                    rec["commit"] = by_name[server].commit
                                f.write(json.dumps(rec) + "\n")
                                f.flush()
                                records.append(rec)
                            when = time.strftime("%H:%M:%S")
                            print(f"--- {when} {row.key} {server}: {brief(lines)}", flush=True)
            finally:
                servers.stop_all()
    finally:
        if db is not None:
            db.stop()  # after stop_all: no Trimaran is connected to it any more
    return records


def brief(lines: list[dict]) -> str:
    parts = []
    for r in lines:
        if r.get("error"):
            parts.append(f"error {r['error'][:200]}")
            continue
        v = r.get("lat_p50_us") and f"p50 {r['lat_p50_us']:.0f} p99 {r.get('lat_p99_us', 0):.0f} µs"
        v = v or f"{r.get('msgs_per_s_received', 0):,.0f} msg/s"
        parts.append(f"{v}, broker {r.get('broker_cpu_pct')}%, foreign {r.get('foreign_cpu_pct')}%")
        if "storage_cpu_pct" in r:
            parts[-1] += (
                f", PostgreSQL {r['storage_cpu_pct']}% ({r.get('pg_us_per_msg')} µs/msg), "
                f"drain {r.get('drain_s')} s, gap {r.get('gap_max_ms')} ms"
            )
        if r.get("contaminated"):
            parts[-1] += " (contaminated, retried)"
    return "; ".join(parts)


def print_recorded(paths: list[str]) -> None:
    for path in paths:
        meta: dict = {}
        records = []
        with open(path) as f:
            for line in f:
                if line.strip():
                    rec = json.loads(line)
                    if rec.get("meta"):
                        meta = rec
                    else:
                        records.append(rec)
        print(table.format_table(records, meta))


def results_path(results: Path, builds: list[Build]) -> Path:
    name = f"{time.strftime('%Y-%m-%d')}-{'-'.join(b.commit for b in builds)}"
    if len(builds) > 1:
        name = f"{time.strftime('%Y-%m-%d')}-ab-{'-'.join(b.commit for b in builds)}"
    path, n = results / f"{name}.jsonl", 2
    while path.exists():
        path, n = results / f"{name}-{n}.jsonl", n + 1
    return path


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--table", nargs="+", metavar="JSONL", help="print the table of recorded sittings and exit"
    )
    ap.add_argument("--install", action="store_true", help="apt-get / pip install what is missing")
    ap.add_argument(
        "--ab",
        nargs="+",
        metavar="REF",
        help="two or more commits in one sitting, each against the first (REF, REF:interpreted, REF:half)",
    )
    ap.add_argument(
        "--interpreted", action="store_true", help="run this checkout's source, not its mypyc build"
    )
    ap.add_argument(
        "--rows", type=lambda v: v.split(","), help=f"only these rows: {','.join(table.ROW_BY_KEY)}"
    )
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds (median of them; 3)")
    ap.add_argument(
        "--restart",
        choices=["row", "round"],
        default="row",
        help="restart each server before each of its rows (default), or all at the start of each round",
    )
    ap.add_argument("--runs", type=int, default=1, help="clean runs per contender per round (1)")
    ap.add_argument("--warmup", type=float, default=2.0)
    ap.add_argument("--duration", type=float, default=10.0, help="window of each run, s (10)")
    ap.add_argument("--quiet-pct", type=float, default=15.0, help="wait until the host is this quiet (15)")
    ap.add_argument("--quiet-wait", type=float, default=60.0)
    ap.add_argument(
        "--max-foreign-pct",
        type=float,
        default=8.0,
        help="discard and retry a run if other processes used more than this %% of a core (8; 0 keeps all)",
    )
    ap.add_argument("--max-attempts", type=int, default=0, help="per contender and round (3 x runs)")
    ap.add_argument(
        "--amqp1-count", type=int, default=0, help="messages per AMQP 1.0 run (10,000 x duration)"
    )
    ap.add_argument(
        "--python", default=str(REPO / ".venv" / "bin" / "python"), help="runs Trimaran and generators"
    )
    ap.add_argument("--broker-cpu", type=int, default=0)
    ap.add_argument("--gen-cpu", type=int, default=1)
    ap.add_argument(
        "--run-dir", default=os.environ.get("BENCH_RUN", "/tmp/bench-run"), help="pid files, logs"
    )
    ap.add_argument("--results", default=str(HERE / "results"), help="where the JSONL goes")
    a = ap.parse_args(argv)
    if a.ab is not None and len(a.ab) < 2:
        ap.error("--ab takes two or more refs")
    if a.table:
        print_recorded(a.table)
        return
    for k in a.rows or ():
        if k not in table.ROW_BY_KEY:
            ap.error(f"unknown row {k}; rows: {', '.join(table.ROW_BY_KEY)}")
    ensure_deps(
        a.python, a.install, postgres=any(table.ROW_BY_KEY[k].postgres for k in a.rows or table.ROW_BY_KEY)
    )
    uvloop_version = subprocess.run(
        [a.python, "-c", "import uvloop; print(uvloop.__version__)"], capture_output=True, text=True
    ).stdout.strip()
    python_version = subprocess.run(
        [a.python, "-c", "import platform; print(platform.python_version())"], capture_output=True, text=True
    ).stdout.strip()
    with builds_for(a.ab, a.python, a.interpreted) as builds:
        run_dir = Path(a.run_dir).resolve()
        run_dir.mkdir(parents=True, exist_ok=True)
        modes = {b.name: b.prepare(a.python, run_dir / f"compile-{b.index}.log") for b in builds}
        meta = {
            "meta": True,
            "ts": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "commit": head_commit(),
            "builds": [b.name for b in builds],
            "modes": modes,
            "ab": {b.name: b.commit for b in builds} if a.ab else {},
            "cpu_model": cpu_model(),
            "cpus": os.cpu_count(),
            "kernel": platform.release(),
            "python": python_version,
            "uvloop": uvloop_version,
            "versions": versions(),
            "broker_cpu": a.broker_cpu,
            "gen_cpu": a.gen_cpu,
            "rounds": a.rounds,
            "restart": a.restart,
            "runs": a.runs,
            "warmup": a.warmup,
            "duration": a.duration,
            "max_foreign_pct": a.max_foreign_pct,
            "rows": a.rows or [r.key for r in table.ROWS],
        }
        results = Path(a.results)
        results.mkdir(parents=True, exist_ok=True)
        out = results_path(results, builds)
        print(f"bench: {', '.join(f'{b.name} ({b.commit})' for b in builds)}; raw lines -> {out}", flush=True)
        records = sitting(a, builds, out, meta)
    print()
    print(table.format_table(records, meta))
    print(f"\nraw lines: {out}")


if __name__ == "__main__":
    main()
