"""rhea (the npm AMQP 1.0 library) against a real server: its ``filter.selector`` on a topic and on
a queue, a broken selector refused with a readable error, and a durable subscription that keeps
what was published while rhea was away. rhea is installed with npm into a temporary directory
once per session; the tests skip, saying why, without node, npm or the registry."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import cast

import pytest

proton = pytest.importorskip("proton")

from proton import Message  # noqa: E402
from proton.utils import BlockingConnection  # noqa: E402

from tests.support.amqp1 import body_str  # noqa: E402
from tests.support.names import unique  # noqa: E402
from tests.support.server import RunningServer  # noqa: E402

SCRIPT = Path(__file__).resolve().parent.parent / "support" / "rhea_client.js"


@pytest.fixture(scope="session")
def rhea_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.skip("node and npm are needed for the rhea tests")
    home = tmp_path_factory.mktemp("rhea")
    try:
        done = subprocess.run(
            [npm, "install", "--no-audit", "--no-fund", "--silent", "rhea@3"],
            cwd=home,
            capture_output=True,
            text=True,
            timeout=180,
        )
    except subprocess.TimeoutExpired:
        pytest.skip("npm install rhea took over three minutes")
    if done.returncode != 0 or not (home / "node_modules" / "rhea").exists():
        pytest.skip(f"npm could not install rhea: {done.stderr.strip()[-300:]}")
    return home


def rhea(home: Path, *args: str) -> list[str]:
    node = shutil.which("node")
    assert node is not None  # rhea_home skipped otherwise
    done = subprocess.run(
        [node, str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "NODE_PATH": str(home / "node_modules")},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout.splitlines()


def test_rhea_selector_on_a_topic_and_a_queue(
    rhea_home: Path, amqp1_server: RunningServer, amqp1_url: str
) -> None:
    port = str(amqp1_server.ports["amqp"])
    topic = f"topic://{unique('rhea')}"
    assert rhea(rhea_home, "selector", "127.0.0.1", port, topic, "colour = 'green' AND n > 2") == [
        "message green 4",
        "message green 6",
    ]
    queue = f"$queue/{unique('rheaq')}"
    assert rhea(rhea_home, "selector", "127.0.0.1", port, queue, "colour = 'red'") == [
        "message red 1",
        "message red 3",
        "message red 5",
    ]
    conn = BlockingConnection(amqp1_url, timeout=10)
    try:
        receiver = conn.create_receiver(queue, credit=10)
        left = []
        while True:
            try:
                left.append(body_str(receiver.receive(timeout=0.5)))
            except proton.Timeout:
                break
            receiver.accept()
    finally:
        conn.close()
    assert left == ["green 2", "green 4", "green 6"]  # the receiver with the selector left them


def test_rhea_broken_selector_is_refused_readably(rhea_home: Path, amqp1_server: RunningServer) -> None:
    port = str(amqp1_server.ports["amqp"])
    lines = rhea(rhea_home, "selector", "127.0.0.1", port, f"topic://{unique('bad')}", "colour IN ('red'")
    assert lines[0].startswith("error amqp:invalid-field selector error at column 17: expected ')'")


def test_rhea_durable_subscription_resumes(
    rhea_home: Path, amqp1_server: RunningServer, amqp1_url: str
) -> None:
    port = str(amqp1_server.ports["amqp"])
    topic = f"topic://{unique('rdur')}"
    client = unique("rhea-client")
    assert rhea(rhea_home, "durable", "127.0.0.1", port, topic, client, "sub", "detach", "300") == []
    conn = BlockingConnection(amqp1_url, timeout=10)
    try:
        sender = conn.create_sender(topic)
        for body in ("away 1", "away 2"):
            sender.send(Message(body=body))
        cast(Callable[[], None], sender.close)()
    finally:
        conn.close()
    lines = rhea(rhea_home, "durable", "127.0.0.1", port, topic, client, "sub", "close", "800")
    assert lines == ["message away 1", "message away 2"]
    assert rhea(rhea_home, "durable", "127.0.0.1", port, topic, client, "sub", "close", "300") == []
