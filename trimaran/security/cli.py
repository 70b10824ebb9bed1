"""The password file from the shell, never a password on the command line.

``trimaran users list|add|delete|set-password``: the file of the settings (``auth.password_file``)
or ``--file``; a password is asked twice on a terminal, or read as one line of stdin with
``--password-stdin`` (``printf 's3cret\\n' | trimaran users add alice --password-stdin``). After a
change the running server is asked to reload (the caller passes how: trimaran/cli.py reaches the
admin API), so the new password works at once without dropping a connection.

``trimaran passwd add|remove|list FILE``: the older form on an explicit file, without the reload;
``add`` reads stdin whenever it is not a terminal.

The file keeps ``mosquitto_passwd``'s format, so either tool can edit it.
"""

from __future__ import annotations

import argparse
import getpass
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trimaran.security import passwords

EXIT_USAGE = 2
EXIT_FAILED = 1
HASH_NAMES = {"pbkdf2": "pbkdf2-sha512 ($7$)", "sha512": "sha512 ($6$, old)", "scrypt": "scrypt"}


def read_password(prompt: str = "Password: ") -> str | None:
    """From the terminal (asked twice) or one line of stdin; None when empty or not confirmed."""
    if sys.stdin.isatty():
        first = getpass.getpass(prompt)
        if getpass.getpass("Reenter password: ") != first:
            print("trimaran: passwords do not match", file=sys.stderr)
            return None
        password = first
    else:
        password = sys.stdin.readline().rstrip("\r\n")
    if not password:
        print("trimaran: empty password", file=sys.stderr)
        return None
    return password


def run_passwd(args: argparse.Namespace) -> int:
    command = args.passwd_command
    try:
        if command == "list":
            for user, _hash in passwords.read_lines(args.file):
                print(user)
            return 0
        if command == "remove":
            if not passwords.remove_user(args.file, args.user):
                print(f"trimaran: no user {args.user!r} in {args.file}", file=sys.stderr)
                return 1
            print(f"removed {args.user} from {args.file} (send SIGHUP to the server to reload)")
            return 0
        password = read_password()
        if password is None:
            return EXIT_USAGE
        passwords.set_password(args.file, args.user, password, args.scheme)
        print(f"set the password of {args.user} in {args.file} (send SIGHUP to the server to reload)")
        return 0
    except passwords.PasswordFileError as exc:
        print(f"trimaran: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as exc:
        print(f"trimaran: {args.file}: {exc.strerror}", file=sys.stderr)
        return 1


# -- trimaran users -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Reloaded:
    """What asking the running server to read the file again came to."""

    ok: bool  # False: a server answered and did not reload (the change waits on disk)
    message: str


Reload = Callable[[], Reloaded]
AddCommand = Callable[..., argparse.ArgumentParser]


def add_users_command(commands: Any, command: AddCommand, parents: list[argparse.ArgumentParser]) -> None:
    users = command(
        commands,
        "users",
        "users of the password file (auth.password_file); a running server reloads it after a change",
    )
    sub = users.add_subparsers(dest="users_command", required=True)
    file_option = argparse.ArgumentParser(add_help=False)
    file_option.add_argument(
        "--file", type=Path, metavar="FILE", help="the password file (default: auth.password_file)"
    )
    change = argparse.ArgumentParser(add_help=False)
    change.add_argument(
        "--no-reload", action="store_true", help="do not ask the running server to read the file again"
    )
    password = argparse.ArgumentParser(add_help=False)
    password.add_argument(
        "--password-stdin",
        action="store_true",
        help="read the password as one line of stdin (default: ask twice on the terminal)",
    )
    password.add_argument(
        "--scheme", choices=["pbkdf2", "scrypt"], default="pbkdf2", help="hash (default: pbkdf2, $7$)"
    )
    mine = [*parents, file_option]
    command(sub, "list", "print each user and the hash its password is kept as", parents=mine)
    add = command(
        sub, "add", "add a user (refused if it exists: see set-password)", parents=[*mine, change, password]
    )
    add.add_argument("user")
    delete = command(
        sub,
        "delete",
        "remove a user; its connected clients stay until they reconnect",
        parents=[*mine, change],
    )
    delete.add_argument("user")
    reset = command(
        sub, "set-password", "change the password of an existing user", parents=[*mine, change, password]
    )
    reset.add_argument("user")


def run_users(args: argparse.Namespace, configured: Path | None, reload: Reload) -> int:
    """0 done; 1 no such user, the user exists, or a running server did not reload; 2 a usage or
    file error (no password file named, a bad line, no terminal to ask on)."""
    path: Path | None = args.file or configured
    command = args.users_command
    if path is None:
        print("trimaran: no password file: pass --file, or set auth.password_file", file=sys.stderr)
        return EXIT_USAGE
    try:
        if command == "list" and not path.is_file():
            print(f"trimaran: password file {path} does not exist", file=sys.stderr)
            return EXIT_USAGE
        rows = passwords.read_lines(path)
        if command == "list":
            return _list_users(path, rows, getattr(args, "json", False))
        known = {user for user, _ in rows}
        if command == "delete":
            if not passwords.remove_user(path, args.user):
                print(f"trimaran: no user {args.user!r} in {path}", file=sys.stderr)
                return EXIT_FAILED
            done = f"deleted {args.user} from {path}"
        else:
            if command == "add" and args.user in known:
                print(f"trimaran: user {args.user!r} exists in {path} (use set-password)", file=sys.stderr)
                return EXIT_FAILED
            if command == "set-password" and args.user not in known:
                print(f"trimaran: no user {args.user!r} in {path} (use add)", file=sys.stderr)
                return EXIT_FAILED
            if not passwords.valid_username(args.user):
                print(
                    f"trimaran: user name {args.user!r} cannot contain ':', NUL or line breaks",
                    file=sys.stderr,
                )
                return EXIT_USAGE
            password = _password(args.password_stdin)
            if password is None:
                return EXIT_USAGE
            passwords.set_password(path, args.user, password, args.scheme)
            done = f"{'added' if command == 'add' else 'changed the password of'} {args.user} in {path}"
    except passwords.PasswordFileError as exc:
        print(f"trimaran: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as exc:
        print(f"trimaran: {path}: {exc.strerror}", file=sys.stderr)
        return EXIT_USAGE
    if args.no_reload:
        print(f"{done}; read by the server at its next start or SIGHUP")
        return 0
    outcome = reload()
    if not outcome.ok:
        print(done)
        print(f"trimaran: {outcome.message}", file=sys.stderr)
        return EXIT_FAILED
    print(f"{done}; {outcome.message}")
    return 0


def _list_users(path: Path, rows: list[tuple[str, str]], as_json: bool) -> int:
    listed = []
    for user, hashed in rows:
        try:
            kind = HASH_NAMES[passwords.parse_hash(hashed).kind]
        except ValueError as exc:
            kind = f"unreadable: {exc}"
        listed.append({"user": user, "hash": kind})
    if as_json:
        import json

        print(json.dumps(listed, indent=2))
        return 0
    if not listed:
        print(f"no users in {path}")
        return 0
    width = max(len("USER"), *(len(row["user"]) for row in listed))
    print(f"{'USER'.ljust(width)}  HASH")
    for row in listed:
        print(f"{row['user'].ljust(width)}  {row['hash']}")
    return 0


def _password(from_stdin: bool) -> str | None:
    if from_stdin:
        password = sys.stdin.readline().rstrip("\r\n")
        if not password:
            print("trimaran: empty password on stdin", file=sys.stderr)
            return None
        return password
    if not sys.stdin.isatty():
        print("trimaran: no terminal to ask for the password on: pass --password-stdin", file=sys.stderr)
        return None
    return read_password()
