"""AMQP 0.9.1 logins that refuse, next to RabbitMQ: a wrong password or a user name that names
nobody gets 403 ACCESS_REFUSED after start-ok (aiormq's ``test_bad_credentials``, aio-pika's
``test_wrong_credentials``), also on a server with no users configured; ``guest``/``guest`` from
loopback logs in, as with RabbitMQ's default user."""

from __future__ import annotations

import asyncio
import socket
import uuid
from collections.abc import Iterator

import pytest
from pamqp import commands, frame

from tests.interop.conftest import amqp_server_args
from tests.support.server import RunningServer, serving

aiormq = pytest.importorskip("aiormq")
aio_pika = pytest.importorskip("aio_pika")

REFUSAL = (
    "ACCESS_REFUSED - Login was refused using authentication mechanism PLAIN. "
    "For details see the broker logfile."
)


@pytest.fixture(scope="module")
def bare_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """No users configured at all (the default): only guest/guest, from loopback, logs in."""
    with serving(RunningServer(amqp_server_args(), cwd=tmp_path_factory.mktemp("bare")).start()) as server:
        yield server


@pytest.fixture(params=["trimaran-no-users", "trimaran", "rabbitmq"])
def port(request: pytest.FixtureRequest) -> int:
    if request.param == "rabbitmq":
        return int(request.getfixturevalue("rabbitmq_port"))
    name = "bare_server" if request.param == "trimaran-no-users" else "amqp_server"
    server: RunningServer = request.getfixturevalue(name)
    return server.ports["amqp"]


def test_bad_password_is_probably_an_authentication_error(port: int) -> None:
    """aiormq's test_bad_credentials: guest with a wrong password."""

    async def main() -> None:
        with pytest.raises(aiormq.exceptions.ProbableAuthenticationError) as caught:
            await aiormq.connect(f"amqp://guest:{uuid.uuid4().hex}@127.0.0.1:{port}/")
        assert REFUSAL in str(caught.value)

    asyncio.run(main())


def test_unknown_user_is_probably_an_authentication_error(port: int) -> None:
    """aio-pika's test_wrong_credentials: a user and password nobody has."""

    async def main() -> None:
        url = f"amqp://{uuid.uuid4().hex}:{uuid.uuid4().hex}@127.0.0.1:{port}/"
        with pytest.raises(aio_pika.exceptions.ProbableAuthenticationError):
            await aio_pika.connect(url)

    asyncio.run(main())


def test_guest_from_loopback_logs_in(port: int) -> None:
    async def main() -> None:
        connection = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{port}/")
        channel = await connection.channel()
        queue = await channel.declare_queue(exclusive=True)
        assert queue.name.startswith("amq.gen-")
        await connection.close()

    asyncio.run(main())


def refusal_on_the_wire(port: int, capability: bool) -> list[object]:
    """The frames a raw client gets after a start-ok with a wrong password (not answering a close),
    up to the server's end of stream."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    try:
        sock.sendall(b"AMQP\x00\x00\x09\x01")
        properties = {"capabilities": {"authentication_failure_close": capability}}
        start_ok = commands.Connection.StartOk(
            client_properties=properties, mechanism="PLAIN", response=f"\0nobody-{uuid.uuid4().hex}\0x"
        )
        buffer, got = b"", []
        sent = False
        while True:
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                return got
            if not chunk:
                return got
            buffer += chunk
            while len(buffer) >= 8:
                try:
                    used, _channel, method = frame.unmarshal(buffer)
                except Exception:
                    break
                buffer = buffer[used:]
                got.append(method)
            if not sent and got:
                sock.sendall(frame.marshal(start_ok, 0))
                sent = True
    finally:
        sock.close()


@pytest.mark.parametrize("capability", [True, False])
def test_refusal_frames_are_rabbitmqs(port: int, capability: bool) -> None:
    """With ``authentication_failure_close`` the refusal is a connection.close naming no method;
    without it the server just ends the connection."""
    got = refusal_on_the_wire(port, capability)
    assert isinstance(got[0], commands.Connection.Start)
    rest = got[1:]
    if not capability:
        assert rest == []
        return
    assert len(rest) == 1
    close = rest[0]
    assert isinstance(close, commands.Connection.Close)
    assert (close.reply_code, close.reply_text, close.class_id, close.method_id) == (403, REFUSAL, 0, 0)
