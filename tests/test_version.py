"""One version, written once (``trimaran.__version__``), and every place that reports it agrees: the
command line, ``/healthz``, ``$SYS/broker/version``, AMQP 0.9.1 server-properties, the AMQP 1.0 open
and the metrics' build info. A real server on port 0, read by real clients."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest
from proton.utils import BlockingConnection

import trimaran
from tests.support import paho
from tests.support.server import RunningServer, serving

TOKEN = "version-token"
# Labels in any order (prometheus_client sorts them; python= is there too); the value 1 or 1.0.
BUILD_INFO = re.compile(r'^trimaran_build_info\{(?:[^}]*,)?version="([^"]*)"[^}]*\} 1(?:\.0)?$', re.MULTILINE)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    args = ["--mqtt", "127.0.0.1:0", "--mqtt-ws", "off", "--amqp", "127.0.0.1:0", "--http", "127.0.0.1:0"]
    env = {"TRIMARAN_HTTP__TOKENS": json.dumps([TOKEN])}
    started = RunningServer(args, cwd=tmp_path_factory.mktemp("version"), env=env).start()
    with serving(started):
        yield started


def named(text: str) -> str:
    """``trimaran 1.2.3`` -> ``1.2.3`` (the form of ``--version`` and ``$SYS/broker/version``)."""
    product, _, version = text.strip().partition(" ")
    assert product == "trimaran", text
    return version


def cli_version() -> str:
    done = subprocess.run(
        [sys.executable, "-m", "trimaran", "--version"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return named(done.stdout)


def http_text(port: int, path: str) -> str:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}", headers={"Authorization": f"Bearer {TOKEN}"}
    )
    with urllib.request.urlopen(request, timeout=5) as response:
        text: str = response.read().decode()
        return text


def sys_version(port: int) -> str:
    client = paho.connect(paho.Endpoints("127.0.0.1", port), "version-reader")
    try:
        client.subscribe("$SYS/broker/version")
        message = client.expect(timeout=10)  # retained, so it arrives at once
        assert message.topic == "$SYS/broker/version"
        return named(message.payload.decode())
    finally:
        client.disconnect()


def amqp091_version(port: int) -> tuple[str, str]:
    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
    try:
        properties = connection._impl.server_properties  # what connection.start carried
        assert properties is not None
        return properties["product"], properties["version"]
    finally:
        connection.close()


def amqp1_version(port: int) -> tuple[str, str]:
    connection = BlockingConnection(f"127.0.0.1:{port}", timeout=10)
    try:
        assert connection.conn is not None
        properties = connection.conn.remote_properties  # the server's open
        assert properties is not None
        return properties["product"], properties["version"]
    finally:
        connection.close()


def test_every_surface_reports_the_package_version(server: RunningServer) -> None:
    http, mqtt, amqp = server.ports["http"], server.ports["mqtt"], server.ports["amqp"]
    build_info = BUILD_INFO.findall(http_text(http, "/metrics"))
    assert len(build_info) == 1, "one trimaran_build_info sample in /metrics"
    product091, version091 = amqp091_version(amqp)
    product1, version1 = amqp1_version(amqp)
    assert product091 == product1 == "Trimaran"
    reported = {
        "trimaran --version": cli_version(),
        "/healthz": json.loads(http_text(http, "/healthz"))["version"],
        "/api/v1/overview": json.loads(http_text(http, "/api/v1/overview"))["version"],
        "/api/v1/openapi.json": json.loads(http_text(http, "/api/v1/openapi.json"))["info"]["version"],
        "$SYS/broker/version": sys_version(mqtt),
        "AMQP 0.9.1 server-properties": version091,
        "AMQP 1.0 open properties": version1,
        "trimaran_build_info": build_info[0],
    }
    assert reported == dict.fromkeys(reported, trimaran.__version__)


def test_the_version_is_written_once() -> None:
    """pyproject.toml takes the version from the package, so no second copy can drift."""
    pyproject = tomllib.loads((Path(__file__).resolve().parent.parent / "pyproject.toml").read_text())
    assert "version" not in pyproject["project"]
    assert "version" in pyproject["project"]["dynamic"]
    assert pyproject["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "trimaran.__version__"}
