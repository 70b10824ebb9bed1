"""``trimaran users list|add|delete|set-password``: the password file of the settings, a password
never on the command line, and a running server that takes the change at once (its admin API's
reload), checked with real MQTT logins; without a server, the change waits for the next start."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.security.conftest import SERVER_ARGS, secure_env
from tests.security.test_guard import connack
from tests.support.paho import V5, Endpoints
from tests.support.server import RunningServer, serving, unused_port
from trimaran.security import passwords

TOKEN = "users-test-token"
Users = Callable[..., subprocess.CompletedProcess[str]]


def users_command(cwd: Path, env: dict[str, str]) -> Users:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("TRIMARAN_")}

    def run(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "trimaran", "users", *args],
            input=stdin,
            capture_output=True,
            text=True,
            cwd=cwd,
            env={**clean, **env},
            timeout=60,
        )

    return run


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    directory = tmp_path_factory.mktemp("users")
    # erin, added at run time, needs a permission to enter (no permission, no entry).
    env = secure_env(directory, grants=(("erin", "/"),), TRIMARAN_HTTP__TOKENS=json.dumps([TOKEN]))
    with serving(RunningServer(SERVER_ARGS, cwd=directory, env=env).start()) as running:
        yield running


@pytest.fixture(scope="module")
def users(server: RunningServer) -> Users:
    directory = Path(server.cwd)
    return users_command(
        directory,
        {
            "TRIMARAN_AUTH__PASSWORD_FILE": str(directory / "passwords"),
            "TRIMARAN_HTTP__BIND": f"127.0.0.1:{server.ports['http']}",  # as the server's settings say
            "TRIMARAN_HTTP__TOKENS": json.dumps([TOKEN]),
        },
    )


def logs_in(server: RunningServer, user: str, password: str) -> bool:
    return connack(Endpoints("127.0.0.1", server.ports["mqtt"]), V5, username=user, password=password) == 0


def test_add_set_password_and_delete_take_effect_on_the_running_server(
    server: RunningServer, users: Users
) -> None:
    assert not logs_in(server, "erin", "first pass")
    added = users("add", "erin", "--password-stdin", stdin="first pass\n")
    assert added.returncode == 0, added.stderr
    assert added.stdout.startswith("added erin in ") and "reloaded (users and rules reloaded)" in added.stdout
    assert logs_in(server, "erin", "first pass")  # no restart, no SIGHUP

    changed = users("set-password", "erin", "--password-stdin", "--scheme", "scrypt", stdin="second pass\n")
    assert changed.returncode == 0, changed.stderr
    assert not logs_in(server, "erin", "first pass") and logs_in(server, "erin", "second pass")

    listed = users("list")
    assert listed.returncode == 0, listed.stderr
    rows = dict(line.split(None, 1) for line in listed.stdout.splitlines())
    assert rows["USER"] == "HASH" and rows["alice"] == "pbkdf2-sha512 ($7$)" and rows["erin"] == "scrypt"
    as_json = json.loads(users("list", "--json").stdout)
    assert {"user": "erin", "hash": "scrypt"} in as_json

    deleted = users("delete", "erin")
    assert deleted.returncode == 0, deleted.stderr
    assert not logs_in(server, "erin", "second pass")
    assert "erin" not in users("list").stdout


def test_mistakes_end_in_one_line(server: RunningServer, users: Users) -> None:
    exists = users("add", "alice", "--password-stdin", stdin="x\n")
    assert exists.returncode == 1
    assert (
        exists.stderr
        == f"trimaran: user 'alice' exists in {Path(server.cwd) / 'passwords'} (use set-password)\n"
    )
    missing = users("set-password", "nobody", "--password-stdin", stdin="x\n")
    assert missing.returncode == 1 and "no user 'nobody'" in missing.stderr and "use add" in missing.stderr
    assert users("delete", "nobody").returncode == 1
    empty = users("add", "frank", "--password-stdin", stdin="\n")
    assert empty.returncode == 2 and empty.stderr == "trimaran: empty password on stdin\n"
    no_terminal = users("add", "frank", stdin="piped but not asked for\n")  # stdin is no terminal
    assert no_terminal.returncode == 2 and "pass --password-stdin" in no_terminal.stderr
    bad_name = users("add", "fr:ank", "--password-stdin", stdin="x\n")
    assert bad_name.returncode == 2 and "cannot contain ':'" in bad_name.stderr
    assert "frank" not in users("list").stdout and "fr:ank" not in users("list").stdout
    assert logs_in(server, "alice", "wonderland")  # nothing else changed


def test_a_server_that_refuses_the_reload_is_said_and_fails(server: RunningServer, tmp_path: Path) -> None:
    copy = tmp_path / "passwords"
    shutil.copy(Path(server.cwd) / "passwords", copy)
    users = users_command(
        tmp_path,
        {
            "TRIMARAN_AUTH__PASSWORD_FILE": str(copy),
            "TRIMARAN_HTTP__BIND": f"127.0.0.1:{server.ports['http']}",
            "TRIMARAN_HTTP__TOKENS": json.dumps(["not-the-servers"]),
        },
    )
    result = users("add", "gina", "--password-stdin", stdin="pw\n")
    assert result.returncode == 1
    assert result.stdout.startswith("added gina in ")  # on disk: the running server has not read it
    assert "did not reload" in result.stderr and "SIGHUP" in result.stderr
    assert len(result.stderr.splitlines()) == 1


def test_without_a_running_server_the_change_waits_for_the_next_start(tmp_path: Path) -> None:
    file = tmp_path / "etc" / "passwords"
    users = users_command(
        tmp_path,
        {"TRIMARAN_AUTH__PASSWORD_FILE": str(file), "TRIMARAN_HTTP__BIND": f"127.0.0.1:{unused_port()}"},
    )
    missing = users("list")
    assert missing.returncode == 2 and missing.stderr == f"trimaran: password file {file} does not exist\n"
    started = time.monotonic()
    result = users("add", "hank", "--password-stdin", stdin="hammer\n")
    assert result.returncode == 0, result.stderr
    assert "no server answers at http://127.0.0.1:" in result.stdout and "next start" in result.stdout
    assert time.monotonic() - started < 20
    assert oct(file.stat().st_mode & 0o777) == "0o600"
    stored = passwords.load(file)
    assert passwords.verify(stored["hank"], "hammer") and stored["hank"].kind == "pbkdf2"
    skipped = users("add", "ivy", "--password-stdin", "--no-reload", stdin="vine\n")
    assert skipped.returncode == 0 and "next start or SIGHUP" in skipped.stdout
    other = tmp_path / "other"
    assert (
        users("add", "jo", "--file", str(other), "--password-stdin", "--no-reload", stdin="j\n").returncode
        == 0
    )
    assert list(passwords.load(other)) == ["jo"] and list(passwords.load(file)) == ["hank", "ivy"]
    if shutil.which("mosquitto_passwd") is not None:  # the file stays mosquitto_passwd's to edit too
        subprocess.run(["mosquitto_passwd", "-b", str(file), "kim", "k"], check=True, capture_output=True)
        listed = users("list").stdout.splitlines()[1:]
        assert [line.split()[0] for line in listed] == ["hank", "ivy", "kim"]


def test_no_password_file_is_a_usage_error(tmp_path: Path) -> None:
    result = users_command(tmp_path, {})("list")
    assert result.returncode == 2
    assert result.stderr == "trimaran: no password file: pass --file, or set auth.password_file\n"


def test_every_subcommand_has_a_description(tmp_path: Path) -> None:
    users = users_command(tmp_path, {})
    top = users("--help")
    assert top.returncode == 0 and "users of the password file" in top.stdout
    for name, words in [
        ("list", "print each user"),
        ("add", "add a user"),
        ("delete", "remove a user"),
        ("set-password", "change the password"),
    ]:
        helped = users(name, "--help")
        assert helped.returncode == 0 and words in helped.stdout, name
        assert name in top.stdout
    assert "--password-stdin" in users("add", "--help").stdout
