"""security/guard.py: a connection's Principal and its permission memo, without sockets. An idle
connection holds no memo (issue 47); the verdicts in it hold for one generation of the rules and
permissions, what the connection owns and was told outlives them."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from trimaran.config import AuthSettings
from trimaran.security.guard import READ, WRITE, Security
from trimaran.vhosts import Permission

RULES = """\
user alice
topic readwrite alice/#
pattern write clients/%c/#
"""


def _security(tmp_path: Path, rules: str = RULES) -> Security:
    (tmp_path / "acl").write_text(rules)
    return Security(AuthSettings(acl_file=tmp_path / "acl", login_delay_initial_s=0))


def test_an_idle_connection_holds_no_memo(tmp_path: Path) -> None:
    open_door = Security(AuthSettings(login_delay_initial_s=0))  # no rule file: nothing to remember
    alice = open_door.principal("mqtt", "alice", "c1", "127.0.0.1")
    assert alice.memo is None
    assert open_door.authorize(alice, WRITE, "anything/at/all")
    assert alice.memo is None
    # The verdicts are the memo's, not fields of every Principal (compiled, a class has no __slots__
    # to ask: its attributes are asked instead).
    for verdict in ("rules", "decisions", "last_write", "last_exchange", "keyed", "own_queues", "warned"):
        assert not hasattr(alice, verdict)


def test_a_verdict_is_asked_again_when_the_rules_move(tmp_path: Path) -> None:
    security = _security(tmp_path)
    alice = security.principal("mqtt", "alice", "c1", "127.0.0.1")
    assert security.allowed(alice, WRITE, "alice/notes")
    memo = alice.memo
    assert memo is not None and memo.generation == security.generation
    memo.last_write = "alice/notes"  # as a hull remembers a blessed publish
    (tmp_path / "acl").write_text(RULES.replace("readwrite alice/#", "read alice/#"))
    assert security.reload()
    assert memo.generation != security.generation  # a hull's inline check now asks
    assert not security.allowed(alice, WRITE, "alice/notes")
    assert alice.memo is memo and memo.generation == security.generation
    assert memo.last_write is None  # the blessing went with its generation


def test_a_permission_change_empties_the_memo_of_its_verdicts(tmp_path: Path) -> None:
    security = _security(tmp_path)
    alice = security.principal("amqp091", "alice", "c1", "127.0.0.1")
    memo = alice.memo_for(security.generation)
    memo.last_write, memo.last_exchange, memo.keyed = "q", "x", True
    assert alice.memo_for(security.generation) is memo and memo.last_exchange == "x"
    asyncio.run(security.set_permission(Permission("alice", "/", "", "", "")))
    assert alice.memo_for(security.generation) is memo
    assert (memo.last_write, memo.last_exchange, memo.keyed, memo.decisions) == (None, None, False, None)


def test_own_queues_and_warnings_outlive_a_generation(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    security = _security(tmp_path)
    alice = security.principal("amqp1", "alice", "c1", "127.0.0.1")
    alice.own("tmp-1")  # no rule names it: its maker may use it all the same
    assert security.allowed(alice, READ, "$queue/tmp-1")
    assert not security.allowed(alice, READ, "$queue/tmp-2")
    with caplog.at_level(logging.WARNING, "trimaran.security"):
        assert not security.authorize(alice, WRITE, "bob/notes")
        assert security.reload()
        assert security.allowed(alice, READ, "$queue/tmp-1")
        assert not security.authorize(alice, WRITE, "bob/notes")
    assert len([r for r in caplog.records if "bob/notes" in r.getMessage()]) == 1  # once a connection
    assert security.refusals["amqp1"] == 2  # each counted


def test_a_rename_looks_the_rules_up_again(tmp_path: Path) -> None:
    security = _security(tmp_path)
    alice = security.principal("amqp091", "alice", "127.0.0.1:5000", "127.0.0.1")
    assert not security.allowed(alice, WRITE, "clients/sensor-7/x")
    alice.memo_for(security.generation).last_write = "clients/other/x"
    alice.rename("sensor-7")  # AMQP's connection name: %c in the rules
    memo = alice.memo
    assert memo is not None and memo.generation != security.generation
    assert security.allowed(alice, WRITE, "clients/sensor-7/x")
    assert memo.last_write is None
