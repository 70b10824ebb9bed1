"""``trimaran passwd add|remove|list FILE``: the password file, never a password on the command line.

``add`` asks twice on a terminal; piped, it reads one line from stdin (``printf 's3cret\\n' |
trimaran passwd add users.txt alice``). The file keeps ``mosquitto_passwd``'s format, so either tool
can edit it.
"""

from __future__ import annotations

import argparse
import getpass
import sys

from trimaran.security import passwords

EXIT_USAGE = 2


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
