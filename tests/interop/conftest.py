"""A real Trimaran process with MQTT over TCP, TLS and WebSocket on port 0, certificates made here."""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import trustme

from tests.support import rabbitmq
from tests.support.paho import Endpoints
from tests.support.server import ALICE, ALICE_PERMISSIONS, RunningServer, serving

#: The interop servers' storage: "sqlite" (a file in the server's work directory) or "shared"
#: (PostgreSQL with ``queues.shared`` on, a fresh database per server, as several nodes run).
#: TRIMARAN_TEST_STORAGE=shared starts every server of the fixtures below that way;
#: ``@BOTH_STORAGES`` runs a test on each.
SHARED = pytest.param("shared", marks=pytest.mark.postgres, id="shared")
BOTH_STORAGES = pytest.mark.parametrize("server_storage", ["sqlite", SHARED], indirect=True, scope="module")
_databases = itertools.count()


@pytest.fixture(scope="module")
def server_storage(request: pytest.FixtureRequest) -> str:
    storage: str = getattr(request, "param", os.environ.get("TRIMARAN_TEST_STORAGE", "sqlite"))
    if storage not in ("sqlite", "shared"):
        raise ValueError(f"TRIMARAN_TEST_STORAGE={storage!r}: sqlite or shared")
    return storage


def storage_env(request: pytest.FixtureRequest, storage: str) -> dict[str, str]:
    """The environment that puts a server on ``storage`` (see :data:`SHARED`)."""
    if storage == "sqlite":
        return {}
    cluster = request.getfixturevalue("postgres_cluster")
    url = cluster.create_database(f"interop{os.getpid()}_{next(_databases)}")
    return {"TRIMARAN_STORAGE__URL": url, "TRIMARAN_QUEUES__SHARED": "true"}


@pytest.fixture(scope="session")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    directory = tmp_path_factory.mktemp("tls")
    ca = trustme.CA()
    cert = ca.issue_cert("localhost", "127.0.0.1")
    files = {"ca": directory / "ca.pem", "cert": directory / "cert.pem", "key": directory / "key.pem"}
    ca.cert_pem.write_to_path(files["ca"])
    cert.cert_chain_pems[0].write_to_path(files["cert"])
    cert.private_key_pem.write_to_path(files["key"])
    return {name: str(path) for name, path in files.items()}


def mqtt_server_args() -> list[str]:
    return [
        "--mqtt",
        "127.0.0.1:0",
        "--mqtt-tls",
        "127.0.0.1:0",
        "--mqtt-ws",
        "127.0.0.1:0",
        "--mqtt-wss",
        "127.0.0.1:0",
        "--amqp",
        "off",
        "--http",
        "127.0.0.1:0",
    ]


def start_server(
    workdir: Path,
    tls_files: dict[str, str],
    extra_env: dict[str, str] | None = None,
    args: list[str] | None = None,
) -> RunningServer:
    env = {
        "TRIMARAN_LISTENERS__TLS__CERT_FILE": tls_files["cert"],
        "TRIMARAN_LISTENERS__TLS__KEY_FILE": tls_files["key"],
        "TRIMARAN_LIMITS__SYS_INTERVAL": "1",
        "TRIMARAN_AUTH__USERS": ALICE,
        "TRIMARAN_AUTH__PERMISSIONS": ALICE_PERMISSIONS,
        **(extra_env or {}),
    }
    return RunningServer(args or mqtt_server_args(), cwd=workdir, env=env).start()


def endpoints_of(server: RunningServer, tls_files: dict[str, str]) -> Endpoints:
    return Endpoints(
        "127.0.0.1",
        server.ports["mqtt"],
        server.ports.get("mqtt-tls"),
        server.ports.get("mqtt-ws"),
        server.ports.get("mqtt-wss"),
        tls_files["ca"],
    )


@pytest.fixture(scope="module")
def mqtt_server(
    tmp_path_factory: pytest.TempPathFactory,
    tls_files: dict[str, str],
    request: pytest.FixtureRequest,
    server_storage: str,
) -> Iterator[RunningServer]:
    env = storage_env(request, server_storage)
    with serving(start_server(tmp_path_factory.mktemp("server"), tls_files, env)) as server:
        yield server


@pytest.fixture(scope="module")
def mqtt(mqtt_server: RunningServer, tls_files: dict[str, str]) -> Endpoints:
    return endpoints_of(mqtt_server, tls_files)


def amqp_server_args() -> list[str]:
    return ["--mqtt", "127.0.0.1:0", "--mqtt-ws", "off", "--amqp", "127.0.0.1:0", "--http", "off"]


@pytest.fixture(scope="module")
def amqp_server(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest, server_storage: str
) -> Iterator[RunningServer]:
    """A server with MQTT and AMQP on port 0 (AMQP 0.9.1 tests use ``ports["amqp"]``)."""
    env = {
        "TRIMARAN_AUTH__USERS": ALICE,
        "TRIMARAN_AUTH__PERMISSIONS": ALICE_PERMISSIONS,
        **storage_env(request, server_storage),
    }
    with serving(
        RunningServer(amqp_server_args(), cwd=tmp_path_factory.mktemp("amqp"), env=env).start()
    ) as server:
        yield server


def amqp1_server_args() -> list[str]:
    return amqp_server_args()


AMQP1_ENV = {
    "TRIMARAN_AUTH__USERS": ALICE,
    "TRIMARAN_AUTH__PERMISSIONS": ALICE_PERMISSIONS,
    "TRIMARAN_LIMITS__SYS_INTERVAL": "0",
    # Small numbers so that the tests see limits and retries quickly.
    "TRIMARAN_AMQP1__MAX_FRAME_SIZE": "4096",
    "TRIMARAN_AMQP1__MAX_MESSAGE_SIZE": "1000000",
    "TRIMARAN_QUEUES__DEFAULTS__BACKOFF_INITIAL_S": "0.05",
    "TRIMARAN_QUEUES__DEFAULTS__MAX_ATTEMPTS": "3",
    "TRIMARAN_QUEUES__DECLARE": '[{"name": "events", "mode": "stream"}]',
}


@pytest.fixture(scope="module")
def amqp1_server(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest, server_storage: str
) -> Iterator[RunningServer]:
    """Trimaran with AMQP (0.9.1 and 1.0) and MQTT on port 0; anonymous clients allowed; small
    frame and message size limits, quick retries and a stream queue ``events`` for AMQP 1.0 tests."""
    workdir = tmp_path_factory.mktemp("amqp1")
    env = {**AMQP1_ENV, **storage_env(request, server_storage)}
    with serving(RunningServer(amqp1_server_args(), cwd=workdir, env=env).start()) as server:
        yield server


@pytest.fixture(scope="module")
def amqp1_url(amqp1_server: RunningServer) -> str:
    return f"127.0.0.1:{amqp1_server.ports['amqp']}"


@pytest.fixture(scope="session")
def rabbitmq_port(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """A private RabbitMQ node's AMQP port (tests.support.rabbitmq); skipped when it cannot run."""
    why = rabbitmq.available()
    if why is not None:
        pytest.skip(why)
    try:
        with rabbitmq.rabbitmq_node(tmp_path_factory.mktemp("rabbitmq")) as port:
            yield port
    except RuntimeError as exc:
        pytest.skip(str(exc))


@pytest.fixture(params=["trimaran", "rabbitmq"])
def amqp_port(request: pytest.FixtureRequest) -> int:
    """The AMQP 0.9.1 port of this server, then of RabbitMQ: one test, both brokers."""
    if request.param == "rabbitmq":
        return int(request.getfixturevalue("rabbitmq_port"))
    server: RunningServer = request.getfixturevalue("amqp_server")
    return server.ports["amqp"]
