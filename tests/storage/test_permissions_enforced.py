"""Migration 0011 (permissions enforced): a database made before it keeps its users working.

The databases are made as main made them before this revision: the schema at 0010, a start recorded
(``last_start``), vhosts and permission rows written with that schema. Upgrading then starting (as
``Storage.migrate`` and ``Security.use_permissions`` do at a server's start) must let in everyone who
could enter before, say so once in the log, and from then on keep vhosts closed until granted.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from sqlalchemy import insert, select

from tests.support.budget import InProcessServer
from trimaran.config import AuthSettings
from trimaran.security.guard import Security
from trimaran.storage import migrate
from trimaran.storage.engine import now_ms
from trimaran.storage.schema import broker_meta, vhost_permissions, vhosts
from trimaran.storage.store import Storage
from trimaran.storage.vhost_store import UPGRADE_MARKER, VHostRows
from trimaran.vhosts import Permission

USERS = [{"name": "alice", "password": "a"}, {"name": "bob", "password": "b"}]


def _old_database(url: str, rows: list[Permission], started: bool = True) -> None:
    """A database as main at bb9c970 left it: schema 0010, a vhost ``t1`` made at run time, ``rows``."""
    storage = Storage.from_url(url)
    try:
        migrate.upgrade(storage.engine, "0010")
        with storage.engine.begin() as connection:
            connection.execute(insert(vhosts).values(name="t1", created_at=now_ms()))
            for p in rows:
                connection.execute(
                    insert(vhost_permissions).values(
                        user=p.user, vhost=p.vhost, configure=p.configure, write=p.write, read=p.read,
                        updated_at=now_ms(),
                    )
                )  # fmt: skip
            if started:
                connection.execute(insert(broker_meta).values(key="last_start", value="1", updated_at=1))
    finally:
        storage.close()


def _start(url: str, vhost_names: list[str]) -> Security:
    """What a start does: migrate, then read the permissions knowing the users and every vhost."""
    storage = Storage.from_url(url)
    try:
        storage.migrate()
        security = Security(AuthSettings(users=USERS))  # type: ignore[arg-type]
        security.use_permissions(VHostRows(storage.engine), vhost_names)
        return security
    finally:
        storage.close()


def _upgrade_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("permissions: upgraded")]


def test_with_no_permission_at_all_everyone_keeps_every_vhost(
    storage_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    _old_database(storage_url, [])
    caplog.set_level(logging.INFO, "trimaran")
    security = _start(storage_url, ["/", "t1", "t2"])  # t2: declared in the settings
    for user in ("alice", "bob", None, "guest"):
        for vhost in ("/", "t1", "t2"):
            assert security.may_enter(user, vhost), (user, vhost)
    assert security.permission_table.get("alice", "t1") == Permission("alice", "t1", ".*", ".*", ".*")
    (line,) = _upgrade_lines(caplog)
    assert "3 vhost(s) (/, t1, t2)" in line and "3 user(s) (alice, bob, guest" in line
    # Said once: the next start finds the rows and no marker; a vhost made now grants nothing.
    caplog.clear()
    again = _start(storage_url, ["/", "t1", "t2", "t3"])
    assert not _upgrade_lines(caplog)
    assert again.may_enter("alice", "t1") and not again.may_enter("alice", "t3")
    assert not again.may_enter(None, "t3")


def test_with_some_permissions_those_rows_and_guest_on_slash_stay(
    storage_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    _old_database(storage_url, [Permission("alice", "t1", "^alice-", "^alice-", "^alice-")])
    caplog.set_level(logging.INFO, "trimaran")
    security = _start(storage_url, ["/", "t1"])
    # Before: alice entered t1 only, guest and anonymous clients /; the same now.
    assert security.may_enter("alice", "t1") and not security.may_enter("alice", "/")
    assert security.may_enter(None, "/") and security.may_enter("guest", "/")
    assert not security.may_enter("bob", "/") and not security.may_enter(None, "t1")
    # Her patterns, ignored before, hold from now on (the log says so).
    assert security.permission_table.get("alice", "t1") == Permission(
        "alice", "t1", "^alice-", "^alice-", "^alice-"
    )
    (line,) = _upgrade_lines(caplog)
    assert "guest" in line and "now enforced" in line


def test_a_fresh_database_grants_guest_slash_only(storage_url: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "trimaran")
    security = _start(storage_url, ["/", "t1"])
    assert security.permissions() == [Permission("guest", "/")]
    assert not security.may_enter("alice", "/") and not security.may_enter(None, "t1")
    assert not _upgrade_lines(caplog)
    storage = Storage.from_url(storage_url)
    try:
        with storage.engine.connect() as connection:
            assert (
                connection.execute(select(broker_meta).where(broker_meta.c.key == UPGRADE_MARKER)).first()
                is None
            )
    finally:
        storage.close()


def test_a_server_started_on_an_old_database_lets_its_users_in(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The real server on a database main made, with pika as alice in / and in t1."""
    pika = pytest.importorskip("pika")
    _old_database(f"sqlite:///{tmp_path / 'trimaran.db'}", [])
    caplog.set_level(logging.INFO, "trimaran")
    server = InProcessServer(tmp_path, auth={"users": USERS}).start()
    try:
        for vhost in ("/", "t1"):
            credentials = pika.PlainCredentials("alice", "a")
            params = pika.ConnectionParameters(
                "127.0.0.1", server.port("amqp"), vhost, credentials, connection_attempts=1
            )
            connection = pika.BlockingConnection(params)
            channel = connection.channel()
            channel.queue_declare(f"kept-{vhost.strip('/') or 'root'}")
            connection.close()
    finally:
        server.stop()
    assert len(_upgrade_lines(caplog)) == 1


def test_the_upgrade_runs_once_per_database(storage_url: str) -> None:
    """The marker is taken by the first start; a database never started gets no grants to make."""
    _old_database(storage_url, [], started=False)
    security = _start(storage_url, ["/", "t1"])
    assert security.permissions() == [Permission("guest", "/")]  # nobody used it: a fresh install's


def test_the_settings_permissions_apply_over_the_stored_ones_at_every_start(storage_url: str) -> None:
    storage = Storage.from_url(storage_url)
    try:
        storage.migrate()
        declared = [{"user": "alice", "vhost": "t1", "read": "^alice-"}]
        security = Security(AuthSettings(users=USERS, permissions=declared))  # type: ignore[arg-type]
        security.use_permissions(VHostRows(storage.engine), ["/", "t1"])
        assert security.permissions() == [
            Permission("guest", "/"),
            Permission("alice", "t1", ".*", ".*", "^alice-"),
        ]
        assert security.may_enter("alice", "t1") and not security.may_enter("bob", "t1")
    finally:
        storage.close()
