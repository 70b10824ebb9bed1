"""Command line: ``trimaran serve | config show|example | db upgrade|current | audit | export |
users list|add|delete|set-password | passwd add|remove|list | version`` and the admin API's client
(``status``, ``clients``, ``sessions``, ``queues``, ``webhooks``, ``bridges``, ``auth reload``, ``limits``,
``vhosts``, ``permissions``: trimaran/ctl.py).

Every failure a person can cause ends in one line on stderr and a non-zero status: 2 for settings,
files, ports and databases (and usage errors, with a "did you mean"), no traceback.
"""

from __future__ import annotations

import argparse
import difflib
import importlib.util
import json
import os
import re
import shutil
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NoReturn

from trimaran import __version__, ctl
from trimaran.config import ConfigError, Settings, load_settings, masked
from trimaran.errors import StartupError, startup_problem

EXIT_CONFIG = 2

# serve flag -> dotted settings key
_FLAG_KEYS = {
    "mqtt": "listeners.mqtt",
    "mqtt_tls": "listeners.mqtt_tls",
    "mqtt_ws": "listeners.mqtt_ws",
    "mqtt_wss": "listeners.mqtt_wss",
    "amqp": "listeners.amqp",
    "amqps": "listeners.amqps",
    "http": "http.bind",
    "storage": "storage.url",
    "data_dir": "storage.data_dir",
    "log_level": "log.level",
    "log_format": "log.format",
}


class Parser(argparse.ArgumentParser):
    """argparse that answers a usage error in one line, with a "did you mean" for a typo."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_CONFIG, f"{self.prog}: {message}{self._suggestion(message)} (see --help)\n")

    def _suggestion(self, message: str) -> str:
        choice = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
        if choice:
            wrong, options = choice.group(1), re.findall(r"'?([\w-]+)'?", choice.group(2))
        else:
            unknown = re.search(r"unrecognized arguments: (\S+)", message)
            if not unknown:
                return ""
            wrong, options = unknown.group(1).split("=")[0], sorted(set(_option_strings(self)))
        close = difflib.get_close_matches(wrong, options, n=1, cutoff=0.6)
        return f"; did you mean {close[0]!r}?" if close else ""


def _option_strings(parser: argparse.ArgumentParser) -> Iterator[str]:
    """Every --option of a parser and of its subcommands (an unknown option is reported by the top
    parser, which does not know the subcommand's)."""
    for action in parser._actions:
        yield from (option for option in action.option_strings if option.startswith("--"))
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _option_strings(sub)


def _command(commands: Any, name: str, summary: str, **kwargs: Any) -> argparse.ArgumentParser:
    """A subcommand whose summary is both its line in the parent's help and its own description."""
    parser: argparse.ArgumentParser = commands.add_parser(name, help=summary, description=summary, **kwargs)
    return parser


def _settings_flags() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--config",
        type=Path,
        metavar="FILE",
        help="TOML settings file (default: ./trimaran.toml when present)",
    )
    common.add_argument("--storage", metavar="URL", help="sqlite:///path or postgresql://user@host/db")
    common.add_argument("--data-dir", metavar="DIR", help="where the default SQLite database lives")
    common.add_argument("--log-level", choices=["debug", "info", "warning", "error"])
    common.add_argument("--log-format", choices=["text", "json"])
    return common


def build_parser() -> argparse.ArgumentParser:
    common = _settings_flags()
    parser = Parser(prog="trimaran", description="Multi-protocol messaging server")
    parser.add_argument("--version", action="version", version=f"trimaran {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)

    serve = _command(
        commands,
        "serve",
        "run the server until SIGINT or SIGTERM (SIGHUP reloads users and rules)",
        parents=[common],
    )
    bind_help = "[HOST:]PORT, or off (port 0 picks a free port)"
    serve.add_argument("--mqtt", metavar="ADDR", help=f"MQTT over TCP, default 1883; {bind_help}")
    serve.add_argument("--mqtt-tls", metavar="ADDR", help=f"MQTT over TLS, default off; {bind_help}")
    serve.add_argument("--mqtt-ws", metavar="ADDR", help=f"MQTT over WebSocket, default 8083; {bind_help}")
    serve.add_argument(
        "--mqtt-wss", metavar="ADDR", help=f"MQTT over secure WebSocket, default off; {bind_help}"
    )
    serve.add_argument("--amqp", metavar="ADDR", help=f"AMQP 0.9.1 and 1.0, default 5672; {bind_help}")
    serve.add_argument("--amqps", metavar="ADDR", help=f"AMQP over TLS, default off; {bind_help}")
    serve.add_argument("--http", metavar="ADDR", help=f"admin HTTP API, default 127.0.0.1:8080; {bind_help}")

    config = _command(commands, "config", "inspect settings")
    config_commands = config.add_subparsers(dest="config_command", required=True)
    _command(config_commands, "show", "print the effective settings, secrets masked", parents=[common])
    _command(
        config_commands, "example", "print a trimaran.toml with every setting, its default and its meaning"
    )

    db = _command(commands, "db", "database schema")
    db_commands = db.add_subparsers(dest="db_command", required=True)
    _command(db_commands, "upgrade", "apply migrations up to the newest", parents=[common])
    _command(db_commands, "current", "print the schema revision", parents=[common])

    from trimaran.analytics import export as analytics_export
    from trimaran.analytics import replay as analytics_replay

    audit = _command(
        commands,
        "audit",
        "replay the queue tables with Spark and check every message (exit 1 when an invariant fails)",
        parents=[common],
    )
    analytics_replay.add_arguments(audit, master_default=None)
    export = _command(commands, "export", "copy the queue tables to Parquet for the audit", parents=[common])
    analytics_export.add_arguments(export)

    _command(commands, "version", "print the version and the build that runs (compiled or source)")
    ctl.add_commands(commands, common, _command)

    from trimaran.security.cli import add_users_command

    add_users_command(commands, _command, [common, ctl.admin_options()])

    passwd = _command(
        commands, "passwd", "manage a password file (auth.password_file, mosquitto_passwd's format)"
    )
    passwd_commands = passwd.add_subparsers(dest="passwd_command", required=True)
    add = _command(
        passwd_commands,
        "add",
        "add a user or change its password (read from the terminal, or stdin when piped)",
    )
    add.add_argument("file", type=Path)
    add.add_argument("user")
    add.add_argument("--scheme", choices=["pbkdf2", "scrypt"], default="pbkdf2", help="default: pbkdf2 ($7$)")
    remove = _command(passwd_commands, "remove", "remove a user")
    remove.add_argument("file", type=Path)
    remove.add_argument("user")
    listing = _command(passwd_commands, "list", "print the user names")
    listing.add_argument("file", type=Path)
    return parser


def overrides_from(args: argparse.Namespace) -> dict[str, Any]:
    """CLI flags as a nested settings dict (only the flags given)."""
    nested: dict[str, Any] = {}
    for flag, key in _FLAG_KEYS.items():
        value = getattr(args, flag, None)
        if value is None:
            continue
        *parents, leaf = key.split(".")
        target = nested
        for part in parents:
            target = target.setdefault(part, {})
        target[leaf] = value
    return nested


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(argv)
    except BrokenPipeError:  # e.g. `trimaran config show | head`: the reader left, not an error of ours
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # so the interpreter's final flush does not fail again
        return 0
    except StartupError as exc:  # a database that cannot be opened, outside `serve`
        print(f"trimaran: {exc}", file=sys.stderr)
        return EXIT_CONFIG


def _main(argv: list[str] | None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "version":
        from trimaran import compiled

        # The release, then which build of it runs (trimaran/compiled.py).
        print(f"trimaran {__version__}\nbuild: {compiled.build()}, protocol machines {compiled.describe()}")
        return 0
    if args.command == "passwd":
        from trimaran.security.cli import run_passwd

        return run_passwd(args)
    if args.command == "config" and args.config_command == "example":
        from trimaran.config_example import example_toml

        sys.stdout.write(example_toml())
        return 0
    try:
        settings = load_settings(args.config, overrides_from(args))
    except ConfigError as exc:
        print(f"trimaran: {exc}", file=sys.stderr)
        return EXIT_CONFIG

    from trimaran import logs

    logs.configure(settings.log.level, settings.log.format)
    if args.command == "serve":
        return _serve(settings, lambda: load_settings(args.config, overrides_from(args)))
    if args.command == "config":
        print(json.dumps(masked(settings), indent=2))
        return 0
    if args.command == "db":
        return _db(settings, args.db_command)
    if args.command in ctl.COMMANDS:
        return ctl.run(args, settings)
    if args.command == "users":
        from trimaran.security.cli import Reloaded, run_users

        return run_users(
            args, settings.auth.password_file, lambda: Reloaded(*ctl.reload_auth(args, settings))
        )
    if args.command in ("audit", "export"):
        missing = _analytics_missing()
        if missing is not None:
            print(f"trimaran: {args.command} cannot run: {missing}", file=sys.stderr)
            return EXIT_CONFIG
    if args.command == "audit":
        return _audit(args, settings)
    if args.command == "export":
        from trimaran.analytics.export import run_export

        return run_export(args, settings.storage.effective_url())
    raise AssertionError(args.command)


def _analytics_missing() -> str | None:
    """Why the Spark commands cannot run here, or None."""
    if importlib.util.find_spec("pyspark") is None:
        return "PySpark is not installed (pip install 'trimaran[analytics]')"
    java_home = os.environ.get("JAVA_HOME")
    if not (java_home and (Path(java_home) / "bin" / "java").is_file()) and shutil.which("java") is None:
        return "Java is not installed (Spark needs a JRE: apt-get install default-jre-headless; or JAVA_HOME)"
    return None


def _serve(settings: Settings, reread: Callable[[], Settings]) -> int:
    from trimaran.app import run

    try:
        run(settings, reread)
    except Exception as exc:  # a port in use, a missing file, a database down: one line, no traceback
        problem = startup_problem(exc)
        if problem is None:
            raise
        print(f"trimaran: cannot start: {problem}", file=sys.stderr)
        return EXIT_CONFIG
    return 0


def _audit(args: argparse.Namespace, settings: Settings) -> int:
    """The flags over the ``[audit]`` settings (themselves from the environment or trimaran.toml)."""
    from trimaran.analytics.replay import run_audit

    audit = settings.audit
    args.master = args.master or audit.master
    args.jars = args.jars or (",".join(audit.jars) if audit.jars else None)
    args.conf = [f"{key}={value}" for key, value in audit.conf.items()] + (args.conf or [])
    args.executor_timeout_s = audit.executor_timeout_s
    return run_audit(args, None if args.parquet else settings.storage.effective_url())


def _db(settings: Settings, command: str) -> int:
    from trimaran.storage import migrate
    from trimaran.storage.store import Storage

    storage = Storage.from_url(
        settings.storage.effective_url(),
        sqlite_synchronous=settings.storage.sqlite_synchronous,
        statement_timeout_s=0,  # a migration of a big table may take its time; an operator watches it
    )
    try:
        if command == "upgrade":
            storage.migrate()
            print(f"schema at {migrate.current_revision(storage.engine)} (head)")
        else:
            current = migrate.current_revision(storage.engine)
            head = migrate.head_revision(storage.engine)
            state = "up to date" if current == head else f"head is {head}"
            print(f"{current or 'empty'} ({state})")
    finally:
        storage.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
