"""The shared user table and the registry of connected clients."""

from __future__ import annotations

from pydantic import SecretStr

from trimaran.broker.auth import Authenticator, AuthResult
from trimaran.broker.clients import ClientInfo, ClientRegistry
from trimaran.config import AuthSettings, UserSettings


def test_authenticator() -> None:
    users = [UserSettings(name="alice", password=SecretStr("wonderland"))]
    open_door = Authenticator(AuthSettings(allow_anonymous=True, users=users))
    assert open_door.check(None, None) is AuthResult.OK
    assert open_door.check("alice", "wonderland") is AuthResult.OK
    assert open_door.check("alice", b"wonderland") is AuthResult.OK
    assert open_door.check("alice", "wrong") is AuthResult.BAD_CREDENTIALS
    assert open_door.check("alice", None) is AuthResult.BAD_CREDENTIALS
    assert open_door.check("bob", "wonderland") is AuthResult.BAD_CREDENTIALS
    closed = Authenticator(AuthSettings(allow_anonymous=False, users=users))
    assert closed.check(None, None) is AuthResult.ANONYMOUS_REFUSED
    assert closed.check("alice", "wonderland") is AuthResult.OK


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
