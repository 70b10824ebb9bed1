"""The login throttle (trimaran/security/throttle.py) on a hand-driven clock, and through the guard
(trimaran/security/guard.py): keyed by user and address, reset by a success, a correct password never
delayed, the wait capped inside the handshake deadline, memory bounded. The same with real clients
over real sockets: tests/interop/test_login_throttle.py."""

from __future__ import annotations

import time
from pathlib import Path

import anyio
import pytest
from pydantic import SecretStr

from trimaran.config import AuthSettings, UserSettings
from trimaran.security import throttle as throttle_module
from trimaran.security.guard import Login, Security
from trimaran.security.passwords import make_hash, write_lines
from trimaran.security.throttle import FORGET_S, HANDSHAKE_SHARE, Throttle, ceiling


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_each_failure_doubles_the_wait_up_to_the_ceiling() -> None:
    throttle = Throttle(0.2, 1.0, Clock())
    waits = [throttle.failed("alice", "10.0.0.1") for _ in range(8)]
    assert waits == [0.2, 0.4, 0.8, 1.0, 1.0, 1.0, 1.0, 1.0]
    assert throttle.failures("alice", "10.0.0.1") == 8


def test_keyed_by_user_and_address_together() -> None:
    throttle = Throttle(0.2, 1.0, Clock())
    for _ in range(5):
        throttle.failed("alice", "10.0.0.1")
    # Another user behind the same address, and the same user from elsewhere, start afresh.
    assert throttle.failed("bob", "10.0.0.1") == 0.2
    assert throttle.failed("alice", "10.0.0.2") == 0.2
    assert throttle.failures("alice", "10.0.0.1") == 5


def test_a_success_resets_only_its_own_key() -> None:
    throttle = Throttle(0.2, 1.0, Clock())
    for _ in range(4):
        throttle.failed("alice", "10.0.0.1")
        throttle.failed("bob", "10.0.0.1")
    throttle.succeeded("alice", "10.0.0.1")
    assert throttle.failures("alice", "10.0.0.1") == 0
    assert throttle.failed("alice", "10.0.0.1") == 0.2
    assert throttle.failed("bob", "10.0.0.1") == 1.0


def test_a_quiet_minute_forgets_and_the_table_empties_itself() -> None:
    clock = Clock()
    throttle = Throttle(0.2, 1.0, clock)
    for number in range(100):
        throttle.failed(f"user{number}", "10.0.0.1")
    clock.now += FORGET_S - 1
    assert throttle.failures("user0", "10.0.0.1") == 1  # not quiet long enough yet
    clock.now += 2
    assert throttle.failures("user0", "10.0.0.1") == 0
    assert throttle.failed("mallory", "10.0.0.9") == 0.2
    assert len(throttle) == 1  # the hundred quiet keys went with the next failure


def test_the_number_of_keys_is_capped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(throttle_module, "MAX_KEYS", 50)
    throttle = Throttle(0.2, 1.0, Clock())
    for number in range(80):
        throttle.failed(f"user{number}", "10.0.0.1")
    assert len(throttle) == 50
    assert throttle.failures("user0", "10.0.0.1") == 0  # the oldest went first
    assert throttle.failures("user79", "10.0.0.1") == 1


def test_no_initial_delay_means_no_wait() -> None:
    throttle = Throttle(0.0, 1.0, Clock())
    assert [throttle.failed("alice", "h") for _ in range(3)] == [0.0, 0.0, 0.0]


def test_the_ceiling_leaves_room_inside_the_handshake_deadline() -> None:
    assert ceiling(1.0, None) == 1.0
    assert ceiling(1.0, 10.0) == 1.0
    assert ceiling(10.0, 10.0) == 10.0 * HANDSHAKE_SHARE
    assert ceiling(1.0, 1.0) == HANDSHAKE_SHARE
    security = Security(AuthSettings(login_delay_max_s=30.0), handshake_s=2.0)
    assert security.throttle.max_s == 2.0 * HANDSHAKE_SHARE


def test_the_default_ceiling_answers_well_inside_the_default_handshake() -> None:
    settings = AuthSettings()
    assert settings.login_delay_max_s <= 2.0
    assert Security(settings, handshake_s=10.0).throttle.max_s == settings.login_delay_max_s


PLAIN = [
    UserSettings(name="alice", password=SecretStr("wonderland")),
    UserSettings(name="bob", password=SecretStr("builder")),
]


async def answer(verdict: Login | object) -> tuple[Login, float]:
    """The login's answer and how long it took (an answer known at once took 0)."""
    if isinstance(verdict, Login):
        return verdict, 0.0
    started = time.monotonic()
    login = await verdict  # type: ignore[misc]
    return login, time.monotonic() - started


def test_wrong_passwords_wait_and_a_correct_one_never_does() -> None:
    security = Security(AuthSettings(users=PLAIN, login_delay_initial_s=0.05, login_delay_max_s=0.2))

    async def main() -> None:
        waits = []
        for _ in range(6):
            login, took = await answer(security.login("alice", "guess", "10.0.0.1", protocol="mqtt"))
            assert not login.ok and login.reason == "bad user name or password"
            waits.append(took)
        assert waits[0] >= 0.04 and waits[-1] >= 0.19
        assert max(waits) < 0.2 + 0.15  # the ceiling, not the doubling's 1.6 s
        # The same user's correct password from the same address: answered at once, and it resets.
        verdict = security.login("alice", "wonderland", "10.0.0.1", protocol="mqtt")
        assert isinstance(verdict, Login) and verdict.ok
        assert security.throttle.failures("alice", "10.0.0.1") == 0
        # Another user behind the same address never waited.
        verdict = security.login("bob", "builder", "10.0.0.1", protocol="mqtt")
        assert isinstance(verdict, Login) and verdict.ok

    anyio.run(main)
    assert security.stats["login_failures"] == 6


def test_a_hashed_password_is_checked_before_any_wait(tmp_path: Path) -> None:
    path = tmp_path / "passwords"
    write_lines(path, [("carol", make_hash("singer", iterations=1000))])
    security = Security(
        AuthSettings(password_file=path, login_delay_initial_s=0.5, login_delay_max_s=0.5, login_cache_s=0)
    )

    async def main() -> None:
        for _ in range(4):
            login, took = await answer(security.login("carol", "guess", "10.0.0.1", protocol="amqp1"))
            assert not login.ok and took >= 0.45
        login, took = await answer(security.login("carol", "singer", "10.0.0.1", protocol="amqp1"))
        assert login.ok and took < 0.4  # verified, not made to wait the 0.5 s
        login, took = await answer(security.login("carol", "guess", "10.0.0.1", protocol="amqp1"))
        assert not login.ok and took >= 0.45  # the count started again: the initial wait

    anyio.run(main)


def test_refusals_for_who_it_is_are_not_throttled() -> None:
    security = Security(AuthSettings(allow_anonymous=False))
    for _ in range(10):
        login = security.login(None, None, "10.0.0.1", protocol="mqtt")
        assert isinstance(login, Login) and not login.ok and login.not_authorized
    assert len(security.throttle) == 0
