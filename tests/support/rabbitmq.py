"""A private RabbitMQ node for side-by-side tests: the same client test against RabbitMQ and us.

Debian's ``rabbitmq-server`` is started on free loopback ports with all its state (Erlang cookie,
mnesia, logs) in a temporary directory, with its own epmd, and stopped by the process ids started
here. Tests that use it are skipped with a reason when the package is not installed or the node
does not come up.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from tempfile import TemporaryDirectory

from tests.support.server import unused_port

SERVER = Path("/usr/lib/rabbitmq/bin/rabbitmq-server")
CTL = Path("/usr/lib/rabbitmq/bin/rabbitmqctl")
START_TIMEOUT_S = 90.0
# AMQP port -> the environment its node was started with (rabbitmqctl needs the same one).
_NODES: dict[int, dict[str, str]] = {}


def rabbitmqctl(port: int, *args: str) -> str:
    """Run ``rabbitmqctl`` against the node started here on AMQP ``port`` (e.g. ``add_vhost``)."""
    env = _NODES[port]
    result = subprocess.run(
        [str(CTL), "-n", env["RABBITMQ_NODENAME"], *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(f"rabbitmqctl {' '.join(args)}: {result.stderr.strip() or result.stdout.strip()}")
    return result.stdout


def ensure_user(port: int, user: str, password: str) -> None:
    """``user`` with ``password`` on the node, whether an earlier test module made it or not (the
    node lives for the session; each module says the users it needs)."""
    if user in rabbitmqctl(port, "list_users", "--quiet").split():
        rabbitmqctl(port, "change_password", user, password)
    else:
        rabbitmqctl(port, "add_user", user, password)


def _password_hash(password: str) -> str:
    """RabbitMQ's stored form of ``password`` (rabbit_password_hashing_sha256): base64 of a 4-byte
    salt followed by SHA-256 of the salt and the password."""
    salt = os.urandom(4)
    return base64.b64encode(salt + hashlib.sha256(salt + password.encode()).digest()).decode()


def define(
    port: int,
    users: dict[str, str],
    vhosts: Iterable[str] = (),
    permissions: Iterable[tuple[str, str, str, str, str]] = (),
    topic_permissions: Iterable[tuple[str, str, str, str, str]] = (),
) -> None:
    """Users (name: password, set whether an earlier module made them or not), vhosts (made when
    missing), permissions ``(user, vhost, configure, write, read)`` and topic permissions ``(user,
    vhost, exchange, write, read)`` on the node, in one ``rabbitmqctl import_definitions``: what a
    ``rabbitmqctl`` call per item does, without an Erlang VM's start per item."""
    definitions = {
        "users": [
            {
                "name": name,
                "password_hash": _password_hash(password),
                "hashing_algorithm": "rabbit_password_hashing_sha256",
                "tags": [],
            }
            for name, password in users.items()
        ],
        "vhosts": [{"name": vhost} for vhost in vhosts],
        "permissions": [
            {"user": user, "vhost": vhost, "configure": configure, "write": write, "read": read}
            for user, vhost, configure, write, read in permissions
        ],
        "topic_permissions": [
            {"user": user, "vhost": vhost, "exchange": exchange, "write": write, "read": read}
            for user, vhost, exchange, write, read in topic_permissions
        ],
    }
    with TemporaryDirectory() as directory:
        path = Path(directory) / "definitions.json"
        path.write_text(json.dumps(definitions))
        rabbitmqctl(port, "import_definitions", str(path))


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def available() -> str | None:
    """None when a node can be started here, else why not."""
    if not SERVER.exists():
        return "RabbitMQ is not installed (apt-get install rabbitmq-server)"
    if shutil.which("epmd") is None:
        return "epmd (erlang-base) is not installed"
    return None


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(20)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(5)


@contextmanager
def rabbitmq_node(
    base: Path, plugins: tuple[str, ...] = (), config: str = "", port: int | None = None
) -> Iterator[int]:
    """Start a node with its state under ``base`` and ``plugins`` enabled (e.g.
    ``rabbitmq_amqp1_0``, which serves AMQP 1.0 on the same port) and ``config``'s lines added to
    its rabbitmq.conf (e.g. ``consumer_timeout = 2000``); yields its AMQP port. The same ``base``
    and ``port`` again: the same node again, with its durable queues and messages."""
    why = available()
    if why is not None:
        raise RuntimeError(why)
    amqp, dist, epmd_port = port or unused_port(), unused_port(), unused_port()
    for sub in ("home", "mnesia", "log"):
        (base / sub).mkdir(parents=True, exist_ok=True)
    (base / "enabled_plugins").write_text(f"[{','.join(plugins)}].\n")
    (base / "rabbitmq.conf").write_text(
        f"listeners.tcp.default = 127.0.0.1:{amqp}\nlog.console = false\nlog.file.level = warning\n{config}"
    )
    env = {
        **os.environ,
        "HOME": str(base / "home"),
        "RABBITMQ_NODENAME": f"trimaran-test-{amqp}@localhost",
        "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
        "RABBITMQ_NODE_PORT": str(amqp),
        "RABBITMQ_DIST_PORT": str(dist),
        "ERL_EPMD_PORT": str(epmd_port),
        "ERL_EPMD_ADDRESS": "127.0.0.1",
        "RABBITMQ_MNESIA_BASE": str(base / "mnesia"),
        "RABBITMQ_LOG_BASE": str(base / "log"),
        "RABBITMQ_PID_FILE": str(base / "rabbit.pid"),
        "RABBITMQ_CONFIG_FILE": str(base / "rabbitmq.conf"),
        "RABBITMQ_ENABLED_PLUGINS_FILE": str(base / "enabled_plugins"),
        "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": "+S 1:1",
    }
    epmd = subprocess.Popen(
        ["epmd", "-port", str(epmd_port), "-address", "127.0.0.1"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    node: subprocess.Popen[bytes] | None = None
    try:
        time.sleep(0.3)
        with (base / "server.log").open("wb") as log:
            node = subprocess.Popen([str(SERVER)], env=env, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + START_TIMEOUT_S
        while not _listening(amqp):
            if node.poll() is not None or time.monotonic() > deadline:
                tail = (base / "server.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"RabbitMQ did not start:\n{tail}")
            time.sleep(0.2)
        _NODES[amqp] = env
        yield amqp
    finally:
        _NODES.pop(amqp, None)
        if node is not None:
            _stop(node)
        _stop(epmd)
