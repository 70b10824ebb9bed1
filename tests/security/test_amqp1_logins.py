"""AMQP 1.0 logins (python-qpid-proton) on a server with no users configured: a user name that names
nobody, or ``guest`` with a wrong password, gets the SASL outcome ``auth``; RabbitMQ's default
``guest``/``guest`` and SASL ANONYMOUS log in from loopback."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.interop.conftest import amqp_server_args
from tests.support.server import RunningServer, serving

proton = pytest.importorskip("proton")
from proton.utils import BlockingConnection  # noqa: E402


@pytest.fixture(scope="module")
def bare_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    with serving(RunningServer(amqp_server_args(), cwd=tmp_path_factory.mktemp("bare")).start()) as server:
        yield server


def connect(server: RunningServer, credentials: str, mechanism: str) -> BlockingConnection:
    url = f"amqp://{credentials}127.0.0.1:{server.ports['amqp']}"
    return BlockingConnection(url, timeout=10, allowed_mechs=mechanism)


@pytest.mark.parametrize("credentials", ["nobody:secret@", "guest:wrong@"])
def test_names_of_nobody_and_wrong_passwords_fail_sasl(bare_server: RunningServer, credentials: str) -> None:
    with pytest.raises(proton.ConnectionException) as caught:
        connect(bare_server, credentials, "PLAIN").create_receiver("topic://x")
    # proton's words for the SASL outcome 'auth' (authentication failed)
    assert "amqp:unauthorized-access" in str(caught.value)
    assert "Authentication failed" in str(caught.value)


@pytest.mark.parametrize(("credentials", "mechanism"), [("guest:guest@", "PLAIN"), ("", "ANONYMOUS")])
def test_guest_and_anonymous_log_in_from_loopback(
    bare_server: RunningServer, credentials: str, mechanism: str
) -> None:
    connection = connect(bare_server, credentials, mechanism)
    try:
        connection.create_receiver("topic://logins/x").close()
    finally:
        connection.close()
