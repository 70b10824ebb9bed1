"""Permissions fail closed, on the three protocols with real clients: no permission, no entry.

A fresh install lets guest (and so anonymous clients and AMQP's guest/guest) into ``/`` and nowhere
else; a vhost made at run time grants nothing until a permission names it; clearing a permission
refuses the next login and closes the connections it let in; clearing the last one leaves an empty
table, and an empty table lets nobody in. The AMQP 0.9.1 refusals are RabbitMQ's, side by side.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from tests.interop.conftest import amqp_server_args
from tests.support import rabbitmq
from tests.support.paho import V5, V311, Endpoints, connect
from tests.support.server import RunningServer, serving

pika = pytest.importorskip("pika")
proton = pytest.importorskip("proton")
from pika.exceptions import ChannelClosedByBroker, ConnectionClosedByBroker, ProbableAccessDeniedError  # noqa: E402
from proton.utils import BlockingConnection  # noqa: E402

TOKEN = "fail-closed-token"
NEW = "t9"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    directory: Path = tmp_path_factory.mktemp("fail-closed")
    env = {"TRIMARAN_HTTP__TOKENS": json.dumps([TOKEN]), "TRIMARAN_AUTH__LOGIN_DELAY_INITIAL_S": "0"}
    args = [*amqp_server_args()[:-1], "127.0.0.1:0"]  # with the admin API
    with serving(RunningServer(args, cwd=directory, env=env).start()) as running:
        yield running
        assert "Traceback" not in running.output()


def _api(server: RunningServer, method: str, path: str, body: dict[str, str] | None = None) -> int:
    request = urllib.request.Request(
        f"http://127.0.0.1:{server.ports['http']}/api/v1{path}",
        method=method,
        headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
        data=None if body is None else json.dumps(body).encode(),
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as error:
        return int(error.code)


def _mqtt_enters(server: RunningServer, vhost: str, version: Any = V5) -> bool:
    """An anonymous MQTT client (a user name of nobody, with no users configured) into ``vhost``."""
    username = "someone" if vhost == "/" else f"{vhost}:someone"
    client = connect(
        Endpoints("127.0.0.1", server.ports["mqtt"]), version=version, username=username, expect_success=False
    )
    try:
        reason = client.connack.get(timeout=5)[1]
        if reason.is_failure:
            assert reason.value == 0x87  # not authorized (3.1.1's return code 5, as paho reports it)
        return not reason.is_failure
    finally:
        client.drop()


def _amqp091_enters(port: int, vhost: str) -> bool:
    """pika with RabbitMQ's default guest/guest; a refusal must be RabbitMQ's 530."""
    try:
        pika.BlockingConnection(
            pika.ConnectionParameters("127.0.0.1", port, vhost, connection_attempts=1)
        ).close()
    except ProbableAccessDeniedError as refused:
        assert f"NOT_ALLOWED - access to vhost '{vhost}' refused for user 'guest'" in str(refused)
        return False
    return True


def _amqp1_enters(server: RunningServer, vhost: str) -> bool:
    """An anonymous python-qpid-proton client (SASL ANONYMOUS) into ``vhost``."""
    try:
        connection = BlockingConnection(
            f"127.0.0.1:{server.ports['amqp']}", timeout=10, virtual_host=f"vhost:{vhost}"
        )
        connection.create_receiver("topic://probe", credit=1).close()
        connection.close()
    except proton.ConnectionException as refused:
        assert f"access to vhost '{vhost}' refused for user 'guest'" in str(refused)
        return False
    return True


def _enters(server: RunningServer, vhost: str) -> list[bool]:
    return [
        _mqtt_enters(server, vhost, V311),
        _mqtt_enters(server, vhost, V5),
        _amqp091_enters(server.ports["amqp"], vhost),
        _amqp1_enters(server, vhost),
    ]


def test_guest_and_anonymous_clients_are_granted_revoked_and_shut_out_by_an_empty_table(
    server: RunningServer,
) -> None:
    # A fresh install: / for guest, whose permissions anonymous clients have.
    assert _enters(server, "/") == [True] * 4
    # A vhost made at run time grants nothing.
    assert _api(server, "PUT", f"/vhosts/{NEW}") == 201
    assert _enters(server, NEW) == [False] * 4
    # Granted to guest: every protocol's anonymous client enters; revoked: none, and the open
    # connection in it is closed (RabbitMQ: 320 CONNECTION_FORCED).
    assert _api(server, "PUT", f"/permissions/{NEW}/guest") == 200
    assert _enters(server, NEW) == [True] * 4
    inside = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", server.ports["amqp"], NEW))
    assert _api(server, "DELETE", f"/permissions/{NEW}/guest") == 200
    with pytest.raises(ConnectionClosedByBroker) as closed:
        for _ in range(50):
            inside.process_data_events(0.1)
    assert closed.value.reply_code == 320
    assert _enters(server, NEW) == [False] * 4
    # The last permission cleared: an empty table lets nobody in anywhere, / included.
    assert _api(server, "DELETE", f"/permissions/{quote('/', safe='')}/guest") == 200
    assert _api(server, "GET", "/permissions") == 200
    assert _enters(server, "/") == [False] * 4
    assert _api(server, "PUT", f"/permissions/{quote('/', safe='')}/guest") == 200
    assert _enters(server, "/") == [True] * 4
    assert _enters(server, NEW) == [False] * 4


def test_a_publisher_through_an_exchange_follows_a_changed_write_permission(server: RunningServer) -> None:
    """The routes a connection keeps by routing key hold only under the rules they were asked under."""
    vhost = "t9-write"
    assert _api(server, "PUT", f"/vhosts/{vhost}") == 201
    assert _api(server, "PUT", f"/permissions/{vhost}/guest") == 200
    params = pika.ConnectionParameters("127.0.0.1", server.ports["amqp"], vhost)
    with pika.BlockingConnection(params) as connection:
        channel = connection.channel()
        channel.exchange_declare("readings", "topic")
        channel.queue_declare("meters")
        channel.queue_bind("meters", "readings", "m.#")
        channel.confirm_delivery()
        for _ in range(3):
            channel.basic_publish("readings", "m.1", b"kept")
        assert channel.queue_declare("meters", passive=True).method.message_count == 3
        rules = {"configure": ".*", "write": "^meters$", "read": ".*"}  # no longer the exchange
        assert _api(server, "PUT", f"/permissions/{vhost}/guest", rules) == 200
        with pytest.raises(ChannelClosedByBroker) as refused:
            channel.basic_publish("readings", "m.1", b"refused")
        assert refused.value.reply_code == 403
    assert _api(server, "DELETE", f"/vhosts/{vhost}") in (200, 204)


def test_rabbitmq_refuses_the_same_way(rabbitmq_port: int) -> None:
    """The AMQP 0.9.1 half against RabbitMQ 3.10: a new vhost refuses guest until granted."""
    vhost = "fail-closed"
    if vhost not in rabbitmq.rabbitmqctl(rabbitmq_port, "list_vhosts", "--quiet").split():
        rabbitmq.rabbitmqctl(rabbitmq_port, "add_vhost", vhost)
    assert not _amqp091_enters(rabbitmq_port, vhost)
    rabbitmq.rabbitmqctl(rabbitmq_port, "set_permissions", "-p", vhost, "guest", ".*", ".*", ".*")
    assert _amqp091_enters(rabbitmq_port, vhost)
    rabbitmq.rabbitmqctl(rabbitmq_port, "clear_permissions", "-p", vhost, "guest")
    assert not _amqp091_enters(rabbitmq_port, vhost)
