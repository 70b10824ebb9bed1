"""Password files: one ``user:hash`` line per user, in the format ``mosquitto_passwd`` writes.

Hashes understood:

- ``$7$<iterations>$<salt>$<hash>``: PBKDF2-HMAC-SHA512 (Mosquitto 2's default), salt and hash in
  standard base64; what ``trimaran passwd add`` writes unless asked for scrypt.
- ``$6$<salt>$<hash>``: one SHA-512 of password + salt (Mosquitto 1.6 and earlier); read only.
- ``$scrypt$<log2 N>$<r>$<p>$<salt>$<hash>``: scrypt, Trimaran's own.

Blank lines and lines starting with ``#`` are ignored. Checking a hash is slow on purpose: callers run
:func:`verify` on a worker thread.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import secrets
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal

PBKDF2_ITERATIONS: Final = 210_000  # OWASP's figure for PBKDF2-HMAC-SHA512
SCRYPT_LOG_N: Final = 15
SCRYPT_R: Final = 8
SCRYPT_P: Final = 1
SALT_BYTES: Final = 12  # what mosquitto_passwd uses
Scheme = Literal["pbkdf2", "scrypt"]


class PasswordFileError(ValueError):
    """A password file that cannot be used; the message names the file and line."""


@dataclass(frozen=True, slots=True)
class PasswordHash:
    """One parsed hash: how to recompute it from a password, and what it must equal."""

    kind: Literal["pbkdf2", "sha512", "scrypt"]
    salt: bytes
    digest: bytes
    iterations: int = 0  # pbkdf2
    log_n: int = 0  # scrypt
    r: int = 0
    p: int = 0

    def matches(self, password: bytes) -> bool:
        """Recompute and compare in constant time (slow for pbkdf2 and scrypt)."""
        if self.kind == "pbkdf2":
            got = hashlib.pbkdf2_hmac("sha512", password, self.salt, self.iterations, len(self.digest))
        elif self.kind == "sha512":
            got = hashlib.sha512(password + self.salt).digest()
        else:
            got = hashlib.scrypt(
                password,
                salt=self.salt,
                n=1 << self.log_n,
                r=self.r,
                p=self.p,
                maxmem=256 * 1024 * 1024,
                dklen=len(self.digest),
            )
        return hmac.compare_digest(got, self.digest)


def _b64(text: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("not base64") from None


def parse_hash(text: str) -> PasswordHash:
    """A hash as stored after ``user:``; raises ``ValueError`` naming what is wrong."""
    parts = text.split("$")
    if len(parts) < 2 or parts[0] != "":
        raise ValueError("a hash starts with $7$, $6$ or $scrypt$")
    kind = parts[1]
    if kind == "7" and len(parts) == 5:
        if not parts[2].isdigit() or int(parts[2]) < 1:
            raise ValueError("$7$ needs a positive iteration count")
        digest = _b64(parts[4])
        if not digest:
            raise ValueError("empty hash")
        return PasswordHash("pbkdf2", _b64(parts[3]), digest, iterations=int(parts[2]))
    if kind == "6" and len(parts) == 4:
        return PasswordHash("sha512", _b64(parts[2]), _b64(parts[3]))
    if kind == "scrypt" and len(parts) == 7:
        log_n, r, p = parts[2:5]
        if not (log_n.isdigit() and r.isdigit() and p.isdigit()) or not 1 <= int(log_n) <= 22:
            raise ValueError("$scrypt$ needs log2(N) in 1-22, r and p")
        return PasswordHash("scrypt", _b64(parts[5]), _b64(parts[6]), log_n=int(log_n), r=int(r), p=int(p))
    raise ValueError(f"unknown hash type ${kind}$ (expected $7$, $6$ or $scrypt$)")


def make_hash(password: str, scheme: Scheme = "pbkdf2", *, iterations: int = PBKDF2_ITERATIONS) -> str:
    """A new salted hash of ``password`` in the file's text form."""
    salt = secrets.token_bytes(SALT_BYTES)
    raw = password.encode()
    if scheme == "pbkdf2":
        digest = hashlib.pbkdf2_hmac("sha512", raw, salt, iterations)
        return f"$7${iterations}${_text(salt)}${_text(digest)}"
    digest = hashlib.scrypt(
        raw, salt=salt, n=1 << SCRYPT_LOG_N, r=SCRYPT_R, p=SCRYPT_P, maxmem=256 * 1024 * 1024, dklen=64
    )
    return f"$scrypt${SCRYPT_LOG_N}${SCRYPT_R}${SCRYPT_P}${_text(salt)}${_text(digest)}"


def _text(data: bytes) -> str:
    return base64.b64encode(data).decode()


def verify(stored: PasswordHash, password: str | bytes) -> bool:
    raw = password.encode() if isinstance(password, str) else password
    return stored.matches(raw)


def read_lines(path: Path) -> list[tuple[str, str]]:
    """``(user, hash text)`` in file order; a missing file is empty."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    rows = []
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        user, sep, hashed = line.partition(":")
        if not sep or not user:
            raise PasswordFileError(f"{path}:{number}: expected 'user:hash'")
        rows.append((user, hashed))
    return rows


def load(path: Path) -> dict[str, PasswordHash]:
    """Every user of a password file with its parsed hash; ``PasswordFileError`` on a bad line."""
    if not path.is_file():
        raise PasswordFileError(f"password file {path} does not exist")
    users: dict[str, PasswordHash] = {}
    for user, hashed in read_lines(path):
        try:
            users[user] = parse_hash(hashed)
        except ValueError as exc:
            raise PasswordFileError(f"{path}: user {user!r}: {exc}") from None
    return users


def write_lines(path: Path, rows: list[tuple[str, str]]) -> None:
    """Replace the file atomically, readable by its owner only."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            for user, hashed in rows:
                out.write(f"{user}:{hashed}\n")
        os.chmod(temp, 0o600)
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise


def valid_username(name: str) -> bool:
    """A user name a password file can hold and an ACL pattern can substitute safely."""
    return bool(name) and not any(c in name for c in ":\n\r\x00") and name.strip() == name


def set_password(path: Path, user: str, password: str, scheme: Scheme = "pbkdf2") -> None:
    """Add ``user`` or change its password, keeping the other lines."""
    if not valid_username(user):
        raise PasswordFileError(f"user name {user!r} cannot contain ':', NUL or line breaks")
    hashed = make_hash(password, scheme)
    rows = [(u, h) for u, h in read_lines(path) if u != user]
    rows.append((user, hashed))
    write_lines(path, rows)


def remove_user(path: Path, user: str) -> bool:
    rows = read_lines(path)
    kept = [(u, h) for u, h in rows if u != user]
    if len(kept) == len(rows):
        return False
    write_lines(path, kept)
    return True
