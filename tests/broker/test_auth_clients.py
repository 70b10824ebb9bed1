"""The shared user table and the registry of connected clients."""

from __future__ import annotations

import anyio
from pydantic import SecretStr

from trimaran.broker.clients import ClientInfo, ClientRegistry
from trimaran.config import AuthSettings, UserSettings
from trimaran.security.guard import Login, Security


def verdict(security: Security, user: str | None, password: str | bytes | None, host: str) -> Login:
    result = security.login(user, password, host, protocol="mqtt")
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


def test_client_registry() -> None:
    kicked: list[str] = []
    registry = ClientRegistry()
    a = registry.add(ClientInfo("dev-1", "mqtt", "1.2.3.4:5", None, lambda: kicked.append("a")))
    b = registry.add(ClientInfo("app", "amqp091", "1.2.3.4:6", "alice", lambda: kicked.append("b")))
    assert a.key != b.key and len(registry) == 2
    assert registry.count_by_protocol() == {"mqtt": 1, "amqp091": 1}
    found = registry.get(b.key)
    assert found is b
    found.kick()
    assert kicked == ["b"]
    assert b.to_json()["user"] == "alice" and b.to_json()["id"] == b.key
    registry.remove(a)
    registry.remove(a)  # twice is harmless
    assert [c.client_id for c in registry] == ["app"]
