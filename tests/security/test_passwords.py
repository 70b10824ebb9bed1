"""Password files: mosquitto_passwd's $7$ and $6$ read, $7$ and scrypt written, and
``trimaran passwd`` reading the password from stdin (never argv), readable by mosquitto_passwd."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.security.conftest import write_passwords
from trimaran.security import passwords


def test_reads_what_mosquitto_passwd_writes(tmp_path: Path) -> None:
    path = tmp_path / "pw"
    write_passwords(path, {"alice": "wonderland", "bob": "b:u:i:l:d"})
    tool = shutil.which("mosquitto_passwd")
    assert tool is not None
    subprocess.run([tool, "-H", "sha512", "-b", str(path), "carol", "old style"], check=True)
    users = passwords.load(path)
    assert users["alice"].kind == "pbkdf2" and users["carol"].kind == "sha512"
    assert passwords.verify(users["alice"], "wonderland")
    assert not passwords.verify(users["alice"], "wonderlan")
    assert passwords.verify(users["bob"], "b:u:i:l:d")
    assert passwords.verify(users["carol"], "old style")


@pytest.mark.parametrize("scheme", ["pbkdf2", "scrypt"])
def test_written_hashes_verify(tmp_path: Path, scheme: passwords.Scheme) -> None:
    path = tmp_path / "pw"
    passwords.set_password(path, "alice", "first", scheme)
    passwords.set_password(path, "bob", "second", scheme)
    passwords.set_password(path, "alice", "changed", scheme)
    users = passwords.load(path)
    assert list(users) == ["bob", "alice"]
    assert passwords.verify(users["alice"], "changed") and not passwords.verify(users["alice"], "first")
    assert path.stat().st_mode & 0o077 == 0  # readable by its owner only
    assert passwords.remove_user(path, "bob") and not passwords.remove_user(path, "bob")
    assert list(passwords.load(path)) == ["alice"]


def test_bad_lines_name_the_user() -> None:
    for text in ("$7$x$c2FsdA==$aGFzaA==", "$5$abc$def", "plain", "$7$10$!!$aGFzaA=="):
        with pytest.raises(ValueError):
            passwords.parse_hash(text)
    with pytest.raises(passwords.PasswordFileError):
        passwords.set_password(Path("unused"), "a:b", "x")


def test_cli_reads_the_password_from_stdin_and_mosquitto_can_use_the_file(tmp_path: Path) -> None:
    path = tmp_path / "pw"

    def passwd(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "trimaran", "passwd", *args]
        return subprocess.run(command, input=stdin, capture_output=True, text=True, timeout=60)

    added = passwd("add", str(path), "alice", stdin="s3cret pass\n")
    assert added.returncode == 0, added.stderr
    assert "s3cret" not in path.read_text() and path.read_text().startswith("alice:$7$")
    assert passwd("add", str(path), "bob", "--scheme", "scrypt", stdin="builder\n").returncode == 0
    assert passwd("add", str(path), "empty", stdin="\n").returncode == 2
    assert passwd("list", str(path)).stdout.split() == ["alice", "bob"]
    assert passwd("remove", str(path), "bob").returncode == 0
    assert passwd("remove", str(path), "bob").returncode == 1
    users = passwords.load(path)
    assert passwords.verify(users["alice"], "s3cret pass")
    tool = shutil.which("mosquitto_passwd")
    if tool is not None:  # Mosquitto's tool edits our file: it keeps our line and adds its own
        subprocess.run([tool, "-b", str(path), "carol", "singer"], check=True)
        users = passwords.load(path)
        assert passwords.verify(users["alice"], "s3cret pass") and passwords.verify(users["carol"], "singer")
