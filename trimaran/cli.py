"""Command line: ``trimaran serve | config show | db upgrade | db current | audit | export | version``."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

from trimaran import __version__
from trimaran.config import ConfigError, Settings, load_settings, masked

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
    parser = argparse.ArgumentParser(prog="trimaran", description="Multi-protocol messaging server")
    parser.add_argument("--version", action="version", version=f"trimaran {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", parents=[common], help="run the server")
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

    config = commands.add_parser("config", help="inspect settings")
    config_commands = config.add_subparsers(dest="config_command", required=True)
    config_commands.add_parser("show", parents=[common], help="print the effective settings, secrets masked")

    db = commands.add_parser("db", help="database schema")
    db_commands = db.add_subparsers(dest="db_command", required=True)
    db_commands.add_parser("upgrade", parents=[common], help="apply migrations up to the newest")
    db_commands.add_parser("current", parents=[common], help="print the schema revision")

    from trimaran.analytics import export as analytics_export
    from trimaran.analytics import replay as analytics_replay

    audit = commands.add_parser(
        "audit",
        parents=[common],
        help="replay the queue tables with Spark and check every message (exit 1 when an invariant fails)",
    )
    analytics_replay.add_arguments(audit, master_default="local[*]")
    export = commands.add_parser(
        "export", parents=[common], help="copy the queue tables to Parquet for the audit"
    )
    analytics_export.add_arguments(export)

    commands.add_parser("version", help="print the version")

    passwd = commands.add_parser(
        "passwd", help="manage a password file (auth.password_file, mosquitto_passwd's format)"
    )
    passwd_commands = passwd.add_subparsers(dest="passwd_command", required=True)
    add = passwd_commands.add_parser(
        "add", help="add a user or change its password (read from the terminal, or stdin when piped)"
    )
    add.add_argument("file", type=Path)
    add.add_argument("user")
    add.add_argument("--scheme", choices=["pbkdf2", "scrypt"], default="pbkdf2", help="default: pbkdf2 ($7$)")
    remove = passwd_commands.add_parser("remove", help="remove a user")
    remove.add_argument("file", type=Path)
    remove.add_argument("user")
    listing = passwd_commands.add_parser("list", help="print the user names")
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
    args = build_parser().parse_args(argv)
    if args.command == "version":
        print(f"trimaran {__version__}")
        return 0
    if args.command == "passwd":
        from trimaran.security.cli import run_passwd

        return run_passwd(args)
    try:
        settings = load_settings(args.config, overrides_from(args))
    except ConfigError as exc:
        print(f"trimaran: {exc}", file=sys.stderr)
        return EXIT_CONFIG

    from trimaran import logs

    logs.configure(settings.log.level, settings.log.format)
    if args.command == "serve":
        return _serve(settings)
    if args.command == "config":
        print(json.dumps(masked(settings), indent=2))
        return 0
    if args.command == "db":
        return _db(settings, args.db_command)
    if args.command == "audit":
        from trimaran.analytics.replay import run_audit

        return run_audit(args, None if args.parquet else settings.storage.effective_url())
    if args.command == "export":
        from trimaran.analytics.export import run_export

        return run_export(args, settings.storage.effective_url())
    raise AssertionError(args.command)


def _serve(settings: Settings) -> int:
    from trimaran.app import run

    failed: list[BaseException] = []
    try:
        try:
            run(settings)
        except* OSError as group:  # e.g. a port already in use, raised from inside the task group
            failed.extend(group.exceptions)
    except ConfigError as exc:  # settings that only fail when used, e.g. an unreadable TLS key
        print(f"trimaran: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    for error in failed:
        logging.getLogger("trimaran").error("cannot start: %s", error)
    return 1 if failed else 0


def _db(settings: Settings, command: str) -> int:
    from trimaran.storage import migrate
    from trimaran.storage.store import Storage

    storage = Storage.from_url(
        settings.storage.effective_url(), sqlite_synchronous=settings.storage.sqlite_synchronous
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
