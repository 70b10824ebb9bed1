"""AMQP 0.9.1 permission refusals in RabbitMQ's words, next to RabbitMQ: one user allowed only her
own queues and topics, the same attacks, the same 403 reply texts (a queue, a topic through
``amq.topic`` on bind and on publish)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.interop.conftest import amqp_server_args
from tests.support import rabbitmq
from tests.support.server import RunningServer, serving

pika = pytest.importorskip("pika")
from pika.exceptions import ChannelClosedByBroker  # noqa: E402

# Trimaran's rule file and RabbitMQ's permissions saying the same: alice's queues, alice.* topics.
TOPIC = "exchange 'amq.topic'"
RULES = """\
user alice
topic all $queue/alice-q
topic readwrite alice/#
"""


@pytest.fixture(scope="module")
def trimaran_port(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    directory: Path = tmp_path_factory.mktemp("refusals")
    (directory / "acl").write_text(RULES)
    env = {
        "TRIMARAN_AUTH__USERS": '[{"name": "alice", "password": "wonderland"}]',
        "TRIMARAN_AUTH__PERMISSIONS": '[{"user": "alice"}]',
        "TRIMARAN_AUTH__ACL_FILE": str(directory / "acl"),
    }
    with serving(RunningServer(amqp_server_args(), cwd=directory, env=env).start()) as server:
        yield server.ports["amqp"]


@pytest.fixture(params=["trimaran", "rabbitmq"])
def port(request: pytest.FixtureRequest) -> int:
    if request.param == "trimaran":
        return int(request.getfixturevalue("trimaran_port"))
    amqp = int(request.getfixturevalue("rabbitmq_port"))
    own = r"^(alice-q|amq\.gen-.*|amq\.topic)$"
    rabbitmq.define(  # another module's alice may have another password
        amqp,
        {"alice": "wonderland"},
        permissions=[("alice", "/", own, own, own)],
        topic_permissions=[("alice", "/", "amq.topic", r"^alice\.", r"^alice\.")],
    )
    return amqp


def refused(call: Callable[[], object]) -> tuple[int, str]:
    with pytest.raises(ChannelClosedByBroker) as caught:
        call()
    return caught.value.reply_code, caught.value.reply_text


def test_refusals_name_the_resource_the_vhost_and_the_user(port: int) -> None:
    credentials = pika.PlainCredentials("alice", "wonderland")
    params = pika.ConnectionParameters("127.0.0.1", port, credentials=credentials)
    connection = pika.BlockingConnection(params)
    try:
        mine = connection.channel().queue_declare("", exclusive=True).method.queue
        attacks: list[tuple[Callable[[Any], object], str]] = [
            (lambda ch: ch.queue_declare("invoices"), "queue 'invoices'"),
            (lambda ch: ch.queue_bind(mine, "amq.topic", "bob.#"), f"topic 'bob.#' in {TOPIC}"),
            (lambda ch: ch.basic_publish("amq.topic", "bob.x", b"x"), f"topic 'bob.x' in {TOPIC}"),
        ]
        for attack, what in attacks:
            channel = connection.channel()
            channel.confirm_delivery()
            assert refused(lambda ch=channel, a=attack: a(ch)) == (
                403,
                f"ACCESS_REFUSED - access to {what} in vhost '/' refused for user 'alice'",
            )
        allowed = connection.channel()  # and what is hers works on both
        allowed.queue_declare("alice-q", auto_delete=True)
        allowed.queue_bind(mine, "amq.topic", "alice.#")
    finally:
        connection.close()
