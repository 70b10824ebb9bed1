"""amqp091/access.py over real sockets: the rule file applies inside a vhost to the names the client
uses, and a queue the connection declared exclusive needs no rule there either (its key carries the
vhost's prefix, the client's name does not: trimaran/vhosts.py)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from tests.security.conftest import PASSWORDS, SERVER_ARGS, secure_env
from tests.support.server import RunningServer, serving

pika = pytest.importorskip("pika")
from pika.exceptions import ChannelClosedByBroker  # noqa: E402


@pytest.fixture(scope="module")
def tenant_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    directory = tmp_path_factory.mktemp("access")
    env = secure_env(directory, grants=(("alice", "t1"),), TRIMARAN_VHOSTS='["/", "t1"]')
    with serving(RunningServer(SERVER_ARGS, cwd=directory, env=env).start()) as server:
        yield server


def _open(server: RunningServer, vhost: str, user: str = "alice") -> Any:
    credentials = pika.PlainCredentials(user, PASSWORDS[user])
    params = pika.ConnectionParameters(
        "127.0.0.1", server.ports["amqp"], vhost, credentials, connection_attempts=1
    )
    return pika.BlockingConnection(params)


@pytest.mark.parametrize("vhost", ["/", "t1"])
def test_an_exclusive_queue_needs_no_rule_in_any_vhost(tenant_server: RunningServer, vhost: str) -> None:
    connection = _open(tenant_server, vhost)
    try:
        channel = connection.channel()
        # No rule names it: the queue is alice's because this connection declared it (server-named,
        # exclusive), so every method on it needs no rule, in her vhost as in /.
        mine = channel.queue_declare("", exclusive=True).method.queue
        channel.queue_declare(mine, passive=True)
        channel.queue_bind(mine, "amq.topic", "alice.#")  # her rules let her read alice/#
        channel.confirm_delivery()
        channel.basic_publish("", mine, b"to myself")  # the default exchange: write needs no rule
        channel.basic_publish("amq.topic", "alice.news", b"news")
        got = [channel.basic_get(mine, auto_ack=True)[2] for _ in range(2)]
        assert sorted(got) == [b"news", b"to myself"]
        channel.basic_publish("", mine, b"purged")
        channel.queue_purge("")  # a nameless method means the channel's last queue: hers
        channel.queue_unbind(mine, "amq.topic", "alice.#")
        channel.queue_delete(mine)
        # A queue that is not hers and no rule grants stays refused.
        with pytest.raises(ChannelClosedByBroker) as refused:
            channel.queue_declare(f"not-hers-{uuid.uuid4().hex[:6]}")
        assert refused.value.reply_code == 403
    finally:
        if connection.is_open:
            connection.close()
