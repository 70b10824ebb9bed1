"""Start and stop the brokers under test on free loopback ports, as context managers.

Every broker runs as our own child process in its own session, on 127.0.0.1 only, with its state in a
temporary directory that is removed afterwards. Each context manager yields a `Running` that says which
protocol ports answer; a protocol the broker does not offer (yet) is `None`, never an exception.

    with brokers.start("mosquitto") as b:      # or "rabbitmq", "trimaran"
        print(b.mqtt, b.amqp, b.pid)

`BrokerUnavailable` is raised when a broker cannot be started at all (binary missing, start failed);
`compare.py` reports that broker as "not available" and goes on with the others.

Also here: CPU accounting of a process tree from /proc (`cpu_seconds`), used to show that the load
generator is not the bottleneck.

Run `python bench/brokers.py [name ...]` to start each broker, print what answers, and stop it.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "BROKERS",
    "BrokerUnavailable",
    "Running",
    "cpu_seconds",
    "free_port",
    "host_busy_seconds",
    "mosquitto",
    "rabbitmq",
    "start",
    "tree_pids",
    "trimaran",
]

HOST = "127.0.0.1"
REPO = Path(__file__).resolve().parent.parent
MOSQUITTO_BIN = "/usr/sbin/mosquitto"
RABBITMQ_BIN = "/usr/lib/rabbitmq/bin"  # the real scripts; /usr/sbin's wrapper would `su rabbitmq`
_CLK_TCK = os.sysconf("SC_CLK_TCK")


class BrokerUnavailable(Exception):
    """The broker cannot be started here; the message says why."""


@dataclass
class Running:
    name: str
    version: str
    pid: int
    mqtt: tuple[str, int] | None = None
    amqp: tuple[str, int] | None = None
    notes: list[str] = field(default_factory=list)
    tls: tuple[str, int] | None = None  # MQTT over TLS, where asked for (tls_bench.py)
    env: dict[str, str] | None = None  # what its own command-line tools need (rabbitmqctl)


# --------------------------------------------------------------------------------------------- helpers


def free_port() -> int:
    """A port that was free on 127.0.0.1 a moment ago (the broker binds it right after)."""
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def port_answers(port: int, host: str = HOST) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def _wait_ports(proc: subprocess.Popen[bytes], ports: list[int], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    pending = list(ports)
    while pending:
        if proc.poll() is not None:
            raise BrokerUnavailable(f"{what} exited with code {proc.returncode} before listening")
        if time.monotonic() > deadline:
            raise BrokerUnavailable(f"{what}: ports {pending} not answering after {timeout:.0f}s")
        if port_answers(pending[0]):
            pending.pop(0)
        else:
            time.sleep(0.1)


def _stop(proc: subprocess.Popen[bytes], grace: float = 20.0) -> None:
    """SIGTERM our child's process group, then SIGKILL it if it does not go within `grace` seconds."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)
    # Leftovers of the group (e.g. erl_child_setup) when the leader went first.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


# ------------------------------------------------------------------------------------------ CPU usage


def _stat(pid: int) -> tuple[int, float] | None:
    """(ppid, user+system CPU seconds) of a live process, from /proc/<pid>/stat."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    fields = raw[raw.rindex(b")") + 2 :].split()  # after "pid (comm) "
    # fields[0] is field 3 (state): ppid is field 4, utime 14, stime 15.
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / _CLK_TCK


def tree_pids(root: int) -> list[int]:
    """`root` and all its live descendants."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            st = _stat(int(entry))
            if st is not None:
                parents.setdefault(st[0], []).append(int(entry))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(parents.get(pid, ()))
    return out


def cpu_seconds(roots: list[int]) -> float:
    """CPU seconds (user + system) used so far by the live processes under each root pid."""
    total = 0.0
    for root in roots:
        for pid in tree_pids(root):
            st = _stat(pid)
            if st is not None:
                total += st[1]
    return total


def host_busy_seconds() -> float:
    """CPU seconds all CPUs of the host spent busy (not idle/iowait) since boot, from /proc/stat."""
    with open("/proc/stat") as f:
        parts = f.readline().split()  # "cpu user nice system idle iowait irq softirq steal ..."
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in parts[1:9])
    return (user + nice + system + irq + softirq + steal) / _CLK_TCK


def rss_kib(roots: list[int]) -> int:
    total = 0
    for root in roots:
        for pid in tree_pids(root):
            with contextlib.suppress(OSError):
                for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1])
    return total


# ---------------------------------------------------------------------------------------- Mosquitto


@contextlib.contextmanager
def mosquitto(
    nodelay: bool = False,
    tuned: bool = False,
    timeout: float = 15.0,
    tls: tuple[str, str] | None = None,
    extra_conf: list[str] | None = None,
) -> Iterator[Running]:
    """Debian's Mosquitto with its default limits, on a free port.

    `nodelay=True` adds `set_tcp_nodelay true` (Mosquitto's default is Nagle on). `tuned=True` raises
    the per-client QoS 1/2 limits (20 in flight, 1000 queued, then dropped) to 100 and 100000.
    `tls=(certfile, keyfile)` adds an MQTT over TLS listener on another free port (``Running.tls``).
    `extra_conf`: more lines at the end of mosquitto.conf (a bridge's, bridge_bench.py).
    """
    if not os.access(MOSQUITTO_BIN, os.X_OK):
        raise BrokerUnavailable(f"{MOSQUITTO_BIN} not installed (apt-get install mosquitto)")
    version = subprocess.run([MOSQUITTO_BIN, "-h"], capture_output=True, text=True).stdout.split("\n")[0]
    with tempfile.TemporaryDirectory(prefix="bench-mosquitto-") as tmp:
        port = free_port()
        conf = Path(tmp, "mosquitto.conf")
        lines = [
            f"listener {port} {HOST}",
            "allow_anonymous true",
            "persistence false",
            "log_dest stderr",
            "log_type error",
            "log_type warning",
        ]
        if nodelay:
            lines.append("set_tcp_nodelay true")
        if tuned:
            lines += ["max_inflight_messages 100", "max_queued_messages 100000"]
        tls_port = free_port() if tls else None
        if tls:
            lines += [f"listener {tls_port} {HOST}", f"certfile {tls[0]}", f"keyfile {tls[1]}"]
        lines += extra_conf or []
        conf.write_text("\n".join(lines) + "\n")
        log = Path(tmp, "mosquitto.log")
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [MOSQUITTO_BIN, "-c", str(conf)],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        try:
            try:
                _wait_ports(proc, [port] if tls_port is None else [port, tls_port], timeout, "mosquitto")
            except BrokerUnavailable as exc:
                raise BrokerUnavailable(f"{exc}\n{_tail(log)}") from None
            notes = (
                ["max_inflight_messages 100, max_queued_messages 100000"]
                if tuned
                else ["defaults (max_inflight_messages 20, max_queued_messages 1000)"]
            )
            notes.append("TCP_NODELAY on" if nodelay else "Nagle on (Mosquitto default)")
            yield Running(
                "mosquitto",
                version.removeprefix("mosquitto version "),
                proc.pid,
                mqtt=(HOST, port),
                notes=notes,
                tls=None if tls_port is None else (HOST, tls_port),
            )
        finally:
            _stop(proc)


# ----------------------------------------------------------------------------------------- RabbitMQ


@contextlib.contextmanager
def rabbitmq(
    mqtt: bool = True, timeout: float = 90.0, amqp1: bool = False, shovel: bool = False
) -> Iterator[Running]:
    """Debian's RabbitMQ as root from /usr/lib/rabbitmq/bin, with its own node name, epmd port,
    cookie and mnesia directory in a temporary directory, and the rabbitmq_mqtt plugin when `mqtt`.
    `amqp1` enables the rabbitmq_amqp1_0 plugin (RabbitMQ 3.x; 4.x speaks AMQP 1.0 natively),
    `shovel` the rabbitmq_shovel plugin (shovel_bench.py).
    """
    server = Path(RABBITMQ_BIN, "rabbitmq-server")
    if not server.exists():
        raise BrokerUnavailable(f"{server} not installed (apt-get install rabbitmq-server)")
    epmd = shutil.which("epmd") or "/usr/bin/epmd"
    with tempfile.TemporaryDirectory(prefix="bench-rabbitmq-") as tmp:
        amqp_port, dist_port, epmd_port = free_port(), free_port(), free_port()
        mqtt_port = free_port() if mqtt else None
        conf = Path(tmp, "rabbitmq.conf")
        lines = [
            f"listeners.tcp.default = {HOST}:{amqp_port}",
            "loopback_users = none",
            "log.console = false",
            "log.file.level = warning",
        ]
        plugins = []
        if mqtt_port is not None:
            lines += [f"mqtt.listeners.tcp.default = {HOST}:{mqtt_port}", "mqtt.allow_anonymous = true"]
            plugins.append("rabbitmq_mqtt")
        if amqp1:
            plugins.append("rabbitmq_amqp1_0")
        if shovel:
            plugins.append("rabbitmq_shovel")
        conf.write_text("\n".join(lines) + "\n")
        enabled = Path(tmp, "enabled_plugins")
        enabled.write_text(f"[{','.join(plugins)}].\n")
        home = Path(tmp, "home")
        home.mkdir()
        cookie = home / ".erlang.cookie"
        cookie.write_text(f"BENCH{os.getpid()}{amqp_port}")
        cookie.chmod(0o400)
        env = dict(os.environ)
        env.update(
            HOME=str(home),
            RABBITMQ_NODENAME=f"bench{amqp_port}@localhost",
            RABBITMQ_NODE_IP_ADDRESS=HOST,
            RABBITMQ_NODE_PORT=str(amqp_port),
            RABBITMQ_DIST_PORT=str(dist_port),
            RABBITMQ_CONFIG_FILE=str(conf),
            RABBITMQ_ENABLED_PLUGINS_FILE=str(enabled),
            RABBITMQ_MNESIA_BASE=str(Path(tmp, "mnesia")),
            RABBITMQ_LOG_BASE=str(Path(tmp, "log")),
            RABBITMQ_PID_FILE=str(Path(tmp, "rabbit.pid")),
            ERL_EPMD_ADDRESS=HOST,
            ERL_EPMD_PORT=str(epmd_port),
        )
        log = Path(tmp, "startup.log")
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [str(server)],
                env=env,
                cwd=tmp,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        try:
            ports = [amqp_port] + ([mqtt_port] if mqtt_port is not None else [])
            try:
                _wait_ports(proc, ports, timeout, "rabbitmq-server")
            except BrokerUnavailable as exc:
                raise BrokerUnavailable(f"{exc}\n{_tail(log)}") from None
            version = _rabbitmq_version()
            yield Running(
                "rabbitmq",
                version,
                proc.pid,
                mqtt=(HOST, mqtt_port) if mqtt_port is not None else None,
                amqp=(HOST, amqp_port),
                notes=[
                    "defaults",
                    "rabbitmq_mqtt plugin" if mqtt_port is not None else "no MQTT plugin",
                    *(["rabbitmq_amqp1_0 plugin"] if amqp1 else []),
                    *(["rabbitmq_shovel plugin"] if shovel else []),
                ],
                env=env,
            )
        finally:
            _stop(proc, grace=30.0)
            # The epmd that our node started on its private port.
            subprocess.run(
                [epmd, "-port", str(epmd_port), "-kill"],
                env=env,
                capture_output=True,
                timeout=10,
                check=False,
            )


def _rabbitmq_version() -> str:
    with contextlib.suppress(OSError):
        for app_file in Path("/usr/lib/rabbitmq/lib").glob("rabbitmq_server-*"):
            return app_file.name.removeprefix("rabbitmq_server-")
    return "?"


# ----------------------------------------------------------------------------------------- Trimaran

_READY = re.compile(r"\b(?P<name>[\w-]+) listener ready on \[?(?P<host>[^\s\]]+?)\]?:(?P<port>\d+)\b")


@contextlib.contextmanager
def trimaran(
    python: str | None = None,
    extra_args: list[str] | None = None,
    timeout: float = 30.0,
    cwd: Path | None = None,
) -> Iterator[Running]:
    """`python -m trimaran serve` with MQTT and AMQP on port 0 and SQLite in a temporary directory.

    The listener ports are read from the `<name> listener ready on HOST:PORT` log lines, up to the
    `trimaran ready` line. A listener that never reports (e.g. the MQTT front end not merged yet) is
    `None` in the result, with a note. ``cwd``: where it runs (the checkout by default, whose
    source ``python -m`` then imports before an installed package).
    """
    if python is None:
        venv = REPO / ".venv" / "bin" / "python"
        python = str(venv) if venv.exists() else sys.executable
    with tempfile.TemporaryDirectory(prefix="bench-trimaran-") as tmp:
        cmd = [python, "-m", "trimaran", "serve", "--mqtt", f"{HOST}:0", "--mqtt-ws", "off"]
        cmd += ["--amqp", f"{HOST}:0", "--http", "off", "--data-dir", tmp, *(extra_args or [])]
        proc = subprocess.Popen(
            cmd,
            cwd=cwd or REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        lines: list[str] = []
        listeners: dict[str, tuple[str, int]] = {}
        ready = threading.Event()

        def pump() -> None:  # keeps reading so the server never blocks on a full pipe
            assert proc.stdout is not None
            for raw in proc.stdout:
                line = raw.decode(errors="replace").rstrip()
                if not ready.is_set():
                    lines.append(line)
                    m = _READY.search(line)
                    if m:
                        listeners[m["name"].lower()] = (m["host"], int(m["port"]))
                    if "trimaran ready" in line:
                        ready.set()
            ready.set()

        reader = threading.Thread(target=pump, name="trimaran-log", daemon=True)
        reader.start()
        try:
            if not ready.wait(timeout) or proc.poll() is not None:
                tail = "\n".join(lines[-15:])
                raise BrokerUnavailable(f"trimaran did not become ready (exit {proc.poll()})\n{tail}")
            version = _trimaran_version(python, cwd or REPO)
            notes = []
            mqtt = listeners.get("mqtt")
            amqp = listeners.get("amqp")
            if mqtt is None:
                notes.append("no MQTT listener reported (front end not merged yet?)")
            if amqp is None:
                notes.append("no AMQP listener reported (front end not merged yet?)")
            yield Running(
                "trimaran",
                version,
                proc.pid,
                mqtt=mqtt,
                amqp=amqp,
                notes=notes,
                tls=listeners.get("mqtt-tls"),
            )
        finally:
            _stop(proc)
            reader.join(5)


def _trimaran_version(python: str, cwd: Path = REPO) -> str:
    """What ``trimaran version`` says where the server runs (its build: compiled or source)."""
    out = subprocess.run(
        [python, "-m", "trimaran", "version"], cwd=cwd, capture_output=True, text=True, check=False
    )
    return out.stdout.strip().removeprefix("trimaran ") or "?"


BROKERS: dict[str, Callable[[], contextlib.AbstractContextManager[Running]]] = {
    "trimaran": trimaran,
    "mosquitto": mosquitto,
    "mosquitto-nodelay": lambda: mosquitto(nodelay=True),
    "mosquitto-tuned": lambda: mosquitto(nodelay=True, tuned=True),
    "rabbitmq": rabbitmq,
    "rabbitmq-amqp1": lambda: rabbitmq(mqtt=False, amqp1=True),
}


def start(name: str) -> contextlib.AbstractContextManager[Running]:
    try:
        factory = BROKERS[name]
    except KeyError:
        raise ValueError(f"unknown broker {name!r}; known: {', '.join(BROKERS)}") from None
    return factory()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("names", nargs="*", metavar="BROKER", help=f"default: all ({', '.join(BROKERS)})")
    args = parser.parse_args(argv)
    for name in args.names or list(BROKERS):
        t0 = time.monotonic()
        try:
            with start(name) as b:
                print(
                    f"{b.name} {b.version} pid {b.pid}: mqtt={b.mqtt} amqp={b.amqp} "
                    f"(up in {time.monotonic() - t0:.1f}s) {'; '.join(b.notes)}"
                )
        except BrokerUnavailable as exc:
            print(f"{name}: not available: {exc}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
