"""The shared user table and the registry of connected clients."""

from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace

import anyio
import pytest
from pydantic import SecretStr

from trimaran.broker.clients import ClientInfo, ClientRegistry, client_json, client_key
from trimaran.config import AuthSettings, UserSettings
from trimaran.security.guard import Login, Security
from trimaran.vhosts import prefix


def verdict(
    security: Security, user: str | None, password: str | bytes | None, host: str, *, mqtt: bool = False
) -> Login:
    """``mqtt``: as the MQTT hull asks (Mosquitto's rule for a name with no users configured)."""
    result = security.login(user, password, host, protocol="mqtt", anonymous_without_users=mqtt)
    if isinstance(result, Login):
        return result

    async def wait() -> Login:
        return await result

    return anyio.run(wait)


def test_one_user_table_and_who_may_be_anonymous() -> None:
    users = [UserSettings(name="alice", password=SecretStr("wonderland"))]
    open_door = Security(AuthSettings(allow_anonymous=True, users=users, login_delay_initial_s=0))
    assert verdict(open_door, None, None, "192.0.2.7").ok
    assert verdict(open_door, "alice", "wonderland", "127.0.0.1").user == "alice"
    assert verdict(open_door, "alice", b"wonderland", "::1").ok
    assert not verdict(open_door, "alice", "wrong", "127.0.0.1").ok
    assert not verdict(open_door, "alice", None, "127.0.0.1").ok
    assert not verdict(open_door, "bob", "wonderland", "127.0.0.1").ok
    closed = Security(AuthSettings(allow_anonymous=False, users=users))
    refused = verdict(closed, None, None, "127.0.0.1")
    assert not refused.ok and refused.not_authorized
    unset = Security(AuthSettings(users=users))  # the default: anonymous from loopback only
    assert verdict(unset, None, None, "127.0.0.1").ok and verdict(unset, None, None, "::ffff:127.0.0.1").ok
    assert not verdict(unset, None, None, "192.0.2.7").ok
    assert closed.stats["login_failures"] == 1


def test_a_user_name_with_no_users_is_anonymous_where_anonymous_clients_are() -> None:
    """Mosquitto's rule for MQTT (allow_anonymous, no password file): the name names nobody. The
    loopback-only default for anonymous clients and the loopback-only users still hold."""
    open_door = Security(AuthSettings(allow_anonymous=True, login_delay_initial_s=0))
    for name, password in (("", None), ("someone", None), ("someone", "anything")):
        login = verdict(open_door, name, password, "192.0.2.7", mqtt=True)
        assert login.ok and login.user is None, name
    assert not verdict(open_door, "guest", "guest", "192.0.2.7", mqtt=True).ok  # auth.loopback_users
    unset = Security(AuthSettings(login_delay_initial_s=0))  # anonymous from loopback only
    assert verdict(unset, "someone", "x", "127.0.0.1", mqtt=True).ok
    assert not verdict(unset, "someone", "x", "192.0.2.7", mqtt=True).ok
    closed = Security(AuthSettings(allow_anonymous=False, login_delay_initial_s=0))
    assert not verdict(closed, "someone", "x", "127.0.0.1", mqtt=True).ok
    users = [UserSettings(name="alice", password=SecretStr("wonderland"))]
    with_users = Security(AuthSettings(allow_anonymous=True, users=users, login_delay_initial_s=0))
    assert not verdict(with_users, "someone", "x", "127.0.0.1", mqtt=True).ok  # once users exist, names count


def test_a_user_name_with_no_users_is_refused_on_amqp() -> None:
    """RabbitMQ's rule for AMQP: a name of nobody, or guest with a wrong password, is refused and
    counted as a failed login; RabbitMQ's default guest/guest stands for the anonymous login."""
    open_door = Security(AuthSettings(allow_anonymous=True, login_delay_initial_s=0))
    for name, password in (("", None), ("someone", None), ("someone", "anything"), ("guest", "wrong")):
        login = verdict(open_door, name, password, "127.0.0.1")
        assert not login.ok and not login.not_authorized, name
    assert open_door.stats["login_failures"] == 4
    assert open_door.is_default_guest("guest", b"guest") and not open_door.is_default_guest("guest", "x")
    alias = open_door.login("guest", None, "127.0.0.1", protocol="amqp091", anonymous_alias=True)
    assert isinstance(alias, Login) and alias.ok and alias.user is None


def test_a_failed_login_is_one_warning_with_fields(caplog: pytest.LogCaptureFixture) -> None:
    users = [UserSettings(name="alice", password=SecretStr("wonderland"))]
    security = Security(AuthSettings(users=users, login_delay_initial_s=0))
    with caplog.at_level(logging.WARNING, logger="trimaran.security"):
        result = security.login(
            "alice", "guess", "127.0.0.1", protocol="mqtt", client_id="dev-1", peer="127.0.0.1:5000"
        )
        login = result if isinstance(result, Login) else anyio.run(lambda: result)
    assert not login.ok
    (record,) = caplog.records
    assert record.levelno == logging.WARNING
    assert record.getMessage() == (
        "mqtt: client 'dev-1' from 127.0.0.1:5000 refused (bad user name or password, user 'alice')"
    )
    fields = {k: getattr(record, k) for k in ("peer", "protocol", "client_id", "user", "reason")}
    assert fields == {
        "peer": "127.0.0.1:5000",
        "protocol": "mqtt",
        "client_id": "dev-1",
        "user": "alice",
        "reason": "bad user name or password",
    }


def test_client_registry() -> None:
    kicked: list[str] = []
    registry = ClientRegistry()
    a = ClientInfo("dev-1", "mqtt", None, lambda _: kicked.append("a"), SimpleNamespace(peer="1.2.3.4:5"))
    b = ClientInfo("app", "amqp091", "alice", lambda _: kicked.append("b"), SimpleNamespace(peer="1.2.3.4:6"))
    registry.add(a)
    registry.add(b)
    assert client_key(a) != client_key(b) and len(registry) == 2 and a.since_ms > 0
    assert registry.count_by_protocol() == {"mqtt": 1, "amqp091": 1}
    found = registry.get(client_key(b))
    assert found is b
    # A key names one client: another protocol's, a number never given, or no number name none.
    other = "mqtt" + client_key(b).removeprefix("amqp091")
    assert [registry.get(key) for key in (other, "amqp091-99", "amqp091-", "amqp091-x", "")] == [None] * 5
    found.kick()
    assert kicked == ["b"]
    shown = client_json(b)
    assert shown["user"] == "alice" and shown["id"] == client_key(b) and shown["address"] == "1.2.3.4:6"
    assert registry.remove(a) and b.slot == 0 and a.slot == -1  # the last one took its place
    assert not registry.remove(a)  # twice is harmless
    assert [c.client_id for c in registry] == ["app"]
    assert registry.count_by_protocol() == {"amqp091": 1}  # kept as they come and go, never below 0


def test_a_subscription_read_in_part_checks_each_key_of_its_vhost(tmp_path: Path) -> None:
    """Security.reading: True (every topic), False (none) or a check of each delivery's router key,
    the vhost prefix cut off first (the rules see the names clients use)."""
    rules = tmp_path / "acl"
    rules.write_text("user alice\ntopic deny public/secret\ntopic read public/#\n")
    security = Security(AuthSettings(acl_file=rules))
    alice = security.principal("mqtt", "alice", "c1", "127.0.0.1")
    assert security.reading(alice, "public/news") is True
    assert security.reading(alice, "bob/#") is False
    assert security.reading(alice, "public/secret") is False
    key_prefix = prefix("tenant-a")
    reads = security.reading(alice, "#", len(key_prefix))
    assert callable(reads)
    assert reads(key_prefix + "public/news") and not reads(key_prefix + "public/secret")
    assert not reads(key_prefix + "bob/x")
    plain = security.reading(alice, "#")
    assert callable(plain) and plain("public/news") and not plain("public/secret")
