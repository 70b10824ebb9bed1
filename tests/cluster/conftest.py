"""Several ``trimaran serve`` processes on one throwaway PostgreSQL database."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest

from tests.support.server import RunningServer

# Short heartbeats so a killed node is found dead within about a second.
HEARTBEAT_S = 0.2
NODE_TIMEOUT_S = 1.0
TOKEN = "cluster-test-token"


class Nodes:
    """Starts nodes on one database and stops them all at the end."""

    def __init__(self, url: str, root: Path) -> None:
        self.url = url
        self.root = root
        self.started: list[RunningServer] = []

    def start(
        self, name: str, *, check: bool = True, http: bool = False, settings: dict[str, str] | None = None
    ) -> RunningServer:
        workdir = self.root / name
        workdir.mkdir(exist_ok=True)
        env = {
            "TRIMARAN_NODE_NAME": name,
            "TRIMARAN_STORAGE__URL": self.url,
            "TRIMARAN_CLUSTER__ENABLED": "true",
            "TRIMARAN_CLUSTER__HEARTBEAT_S": str(HEARTBEAT_S),
            "TRIMARAN_CLUSTER__NODE_TIMEOUT_S": str(NODE_TIMEOUT_S),
            "TRIMARAN_CLUSTER__TAKEOVER_TIMEOUT_S": "3",
            "TRIMARAN_LIMITS__SYS_INTERVAL": "0",
            "TRIMARAN_SHUTDOWN_GRACE_S": "2",
        }
        args = ["--mqtt", "127.0.0.1:0", "--mqtt-ws", "off", "--amqp", "127.0.0.1:0"]
        args += ["--http", "127.0.0.1:0"] if http else ["--http", "off"]
        if http:
            env["TRIMARAN_HTTP__TOKENS"] = f'["{TOKEN}"]'
        env.update(settings or {})  # TRIMARAN_... variables of this node

        server = RunningServer(args, cwd=workdir, env=env)
        if check:
            server.start()
            self.started.append(server)
        return server

    def routes(self, node: str) -> set[str]:
        with psycopg.connect(self.url) as connection:
            rows = connection.execute("SELECT topic_filter FROM cluster_routes WHERE node = %s", (node,))
            return {str(row[0]) for row in rows}

    def alive(self) -> set[str]:
        with psycopg.connect(self.url) as connection:
            return {str(row[0]) for row in connection.execute("SELECT name FROM cluster_nodes")}

    def stop_all(self) -> list[str]:
        """Stop every node still running; the logs of those that did not exit cleanly."""
        failures = []
        for server in self.started:
            running = server.process is not None and server.process.poll() is None
            if running and server.stop() != 0:
                failures.append(server.output())
        return failures


def wait_until(condition: Callable[[], object], timeout: float = 5.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def wait_route(nodes: Nodes, node: str, topic_filter: str) -> None:
    """A route is visible to the other nodes once its row is committed (the NOTIFY leaves with the
    same commit); a short pause lets the notification arrive."""
    wait_until(lambda: topic_filter in nodes.routes(node), what=f"route {topic_filter} of {node}")
    time.sleep(0.1)


@pytest.fixture
def nodes(postgres_url: str, tmp_path: Path) -> Iterator[Nodes]:
    cluster = Nodes(postgres_url, tmp_path)
    try:
        yield cluster
    finally:
        failures = cluster.stop_all()
        with contextlib.suppress(Exception):
            for server in cluster.started:
                server.kill()
    assert not failures, failures[0]
