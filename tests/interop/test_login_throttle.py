"""The login throttle (trimaran/security/throttle.py) with real clients over real sockets, on the
default numbers: eight wrong passwords in a row for one user, between hundreds of good logins from
the same address, each get the protocol's refusal (AMQP 0.9.1 403 ACCESS_REFUSED, MQTT CONNACK 0x86,
AMQP 1.0 the SASL outcome ``auth``) within 2 s, never a dropped socket, and the user's correct password
right after is accepted at once. aio-pika's own ``test_wrong_credentials`` (a random user and
password: ``ProbableAuthenticationError``) repeated eight times in a row, here and on RabbitMQ."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Callable, Iterator

import pytest

from tests.interop.conftest import amqp_server_args
from tests.support.paho import V5, V311, Endpoints, connect
from tests.support.server import RunningServer, serving
from trimaran.security.passwords import make_hash, write_lines

aio_pika = pytest.importorskip("aio_pika")
proton = pytest.importorskip("proton")
from proton.utils import BlockingConnection  # noqa: E402

USERS = {"alice": "wonderland", "bob": "builder", "carol": "singer", "dave": "diver"}
#: whose password each protocol's test guesses (the throttle's count is per user and address,
#: whatever the protocol): bob logs in between the guesses
GUESSED = {"amqp091": "alice", "mqtt": "carol", "amqp1": "dave"}
WRONG_IN_A_ROW = 8
GOOD_BETWEEN = 10  # good logins before each wrong one: 80 in all
REFUSED_WITHIN_S = 2.0
AT_ONCE_S = 0.5  # a correct password's answer: a login, not a throttle's wait (the default is 1 s)
BAD_CREDENTIALS = 0x86


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """Users in a password file, anonymous clients refused, the throttle's default numbers."""
    directory = tmp_path_factory.mktemp("throttle")
    passwords = directory / "passwords"
    write_lines(passwords, [(user, make_hash(word, iterations=1000)) for user, word in USERS.items()])
    env = {
        "TRIMARAN_AUTH__PASSWORD_FILE": str(passwords),
        "TRIMARAN_AUTH__ALLOW_ANONYMOUS": "false",
        "TRIMARAN_AUTH__PERMISSIONS": json.dumps([{"user": user} for user in USERS]),  # '/': all of it
    }
    with serving(RunningServer(amqp_server_args(), cwd=directory, env=env).start()) as running:
        yield running
        assert not [line for line in running.lines if "Traceback" in line], "a traceback in the server log"


# -- one login per protocol: None when accepted, else the refusal as the client reports it ----------


def amqp091_login(port: int, user: str, password: str) -> str | None:
    async def main() -> str | None:
        try:
            connection = await aio_pika.connect(f"amqp://{user}:{password}@127.0.0.1:{port}/", timeout=10)
        except aio_pika.exceptions.ProbableAuthenticationError as exc:
            return f"ProbableAuthenticationError: {exc}"
        await connection.close()
        return None

    return asyncio.run(main())


def mqtt_login(port: int, user: str, password: str) -> str | None:
    # The good logins alternate 3.1.1 and 5.0; the refusals are asked in 5.0 for its reason code.
    version = V5 if password != USERS.get(user) or port % 2 else V311
    client = connect(
        Endpoints("127.0.0.1", port), version=version, username=user, password=password, expect_success=False
    )
    try:
        _flags, reason, _props = client.connack.get(timeout=10)
        if not reason.is_failure:
            client.disconnect()
            return None
        return f"CONNACK 0x{int(reason.value):02x}"
    finally:
        client.client.loop_stop()


def amqp1_login(port: int, user: str, password: str) -> str | None:
    try:
        connection = BlockingConnection(
            f"amqp://{user}:{password}@127.0.0.1:{port}", timeout=10, allowed_mechs="PLAIN"
        )
    except proton.ConnectionException as exc:
        return f"ConnectionException: {exc}"
    connection.close()
    return None


Login = Callable[[int, str, str], "str | None"]
PROTOCOLS: dict[str, tuple[Login, str, str]] = {
    # protocol: (login, port name, what its refusal says)
    "amqp091": (
        amqp091_login,
        "amqp",
        "ACCESS_REFUSED - Login was refused using authentication mechanism PLAIN",
    ),
    "mqtt": (mqtt_login, "mqtt", f"CONNACK 0x{BAD_CREDENTIALS:02x}"),
    "amqp1": (amqp1_login, "amqp", "amqp:unauthorized-access"),
}


def timed(login: Login, port: int, user: str, password: str) -> tuple[str | None, float]:
    started = time.monotonic()
    answer = login(port, user, password)
    return answer, time.monotonic() - started


# AMQP 1.0's is the slowest (11 s: its SASL round trips): in the slow run, the others by default.
@pytest.mark.parametrize(
    "protocol", [pytest.param(p, marks=pytest.mark.slow) if p == "amqp1" else p for p in PROTOCOLS]
)
def test_eight_wrong_passwords_between_many_good_logins(server: RunningServer, protocol: str) -> None:
    login, port_name, refusal = PROTOCOLS[protocol]
    port = server.ports[port_name]
    victim = GUESSED[protocol]
    refusals: list[float] = []
    good = 0
    for _ in range(WRONG_IN_A_ROW):
        for _ in range(GOOD_BETWEEN):
            assert login(port, "bob", USERS["bob"]) is None
            good += 1
        answer, took = timed(login, port, victim, f"guess-{uuid.uuid4().hex}")
        assert answer is not None and refusal in answer, f"{protocol}: {answer!r}"
        assert took < REFUSED_WITHIN_S, f"{protocol}: refusal {len(refusals) + 1} took {took:.2f}s"
        refusals.append(took)
    # The waits grew (0.2 s for the first, the 1 s ceiling for the last) but stayed under 2 s.
    assert refusals[-1] > refusals[0] + 0.4, refusals
    assert good == WRONG_IN_A_ROW * GOOD_BETWEEN
    answer, took = timed(login, port, victim, USERS[victim])
    assert answer is None, f"{protocol}: {victim}'s correct password refused: {answer!r}"
    assert took < AT_ONCE_S, f"{protocol}: {victim}'s correct password took {took:.2f}s"
    # The success reset the count: the next wrong password waits the initial 0.2 s, not 1 s.
    answer, took = timed(login, port, victim, "guess-again")
    assert answer is not None and refusal in answer
    assert took < refusals[-1]


@pytest.fixture(params=["trimaran", "rabbitmq"])
def broker(request: pytest.FixtureRequest) -> tuple[int, str, str]:
    """The AMQP port of this server, then of RabbitMQ, with a login that works on it."""
    if request.param == "rabbitmq":
        return int(request.getfixturevalue("rabbitmq_port")), "guest", "guest"
    running: RunningServer = request.getfixturevalue("server")
    return running.ports["amqp"], "alice", USERS["alice"]


def test_aio_pikas_wrong_credentials_eight_times_in_a_row(broker: tuple[int, str, str]) -> None:
    """aio-pika's test_wrong_credentials (a user and password nobody has) eight times: the eighth
    is refused like the first, in time; the same name of nobody eight times too (its waits grow);
    then a login that works is accepted at once."""
    port, user, password = broker
    nobody = f"nobody-{uuid.uuid4().hex}"
    for name in [uuid.uuid4().hex for _ in range(WRONG_IN_A_ROW)] + [nobody] * WRONG_IN_A_ROW:
        answer, took = timed(amqp091_login, port, name, uuid.uuid4().hex)
        assert answer is not None and answer.startswith("ProbableAuthenticationError"), answer
        assert took < REFUSED_WITHIN_S, f"the refusal of {name} took {took:.2f}s"
    answer, took = timed(amqp091_login, port, user, password)
    assert answer is None and took < AT_ONCE_S, (answer, took)
