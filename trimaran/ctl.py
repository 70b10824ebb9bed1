"""The admin API from the shell, as ``rabbitmqctl`` and ``emqx ctl`` are: ``trimaran status``,
``clients list|show|kick``, ``sessions list|show|delete``, ``queues list|show|peek|purge|redrive|delete``,
``webhooks list``, ``bridges [list]|show|restart|reload``, ``auth reload``,
``limits list|set-vhost|clear-vhost|set-user|clear-user|set-default-user``, ``vhosts list|add|delete``,
``permissions list|set|clear``.

Each command is one or a few calls to ``/api/v1`` on a running server (stdlib ``urllib``, nothing
to install). The address and the token default to the settings the server reads (``http.bind``,
the first of ``http.tokens``), so on the server's own machine ``trimaran clients list`` just works;
``--url`` and ``--token`` (or ``TRIMARAN_ADMIN_TOKEN``) reach another one. Output is a table for a
person, or the API's JSON with ``--json``.

Queues, sessions and clients are named as their clients name them, with ``-p VHOST`` (default
``/``) for the vhost, as ``rabbitmqctl`` does; the lists show every vhost in a column of its own,
or only one with ``-p``. The internal spelling (``$vhost/...``, trimaran/vhosts.py) never shows.

Exit status: 0 done; 1 the server answered with an error (no such client, queue, ...); 2 the server
cannot be reached, or the token is refused.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Sequence
from typing import Any
from urllib.parse import quote, urlencode, urljoin

from trimaran.config import Settings

COMMANDS = (
    "status",
    "clients",
    "sessions",
    "queues",
    "webhooks",
    "bridges",
    "auth",
    "limits",
    "vhosts",
    "permissions",
)
TOKEN_ENV = "TRIMARAN_ADMIN_TOKEN"
EXIT_ANSWERED_ERROR = 1
EXIT_UNREACHABLE = 2
TIMEOUT_S = 10.0

AddCommand = Callable[..., argparse.ArgumentParser]


class CtlError(Exception):
    def __init__(self, message: str, status: int, *, answered: bool = True) -> None:
        super().__init__(message)
        self.status = status
        self.answered = answered  # False: no server answered at all


# -- the command line -------------------------------------------------------------------------------


def admin_options() -> argparse.ArgumentParser:
    """--url, --token and --json: how a command reaches a running server's admin API."""
    admin = argparse.ArgumentParser(add_help=False)
    admin.add_argument("--url", help="the admin API's base URL (default: from http.bind)")
    admin.add_argument("--token", help=f"bearer token (default: ${TOKEN_ENV}, then the first http.tokens)")
    admin.add_argument("--json", action="store_true", help="print the API's JSON instead of a table")
    return admin


def in_vhost() -> argparse.ArgumentParser:
    """-p VHOST of a command that names one queue, session or client (default /)."""
    options = argparse.ArgumentParser(add_help=False)
    options.add_argument("-p", "--vhost", default="/", help="the vhost it belongs to (default /)")
    return options


def vhost_filter() -> argparse.ArgumentParser:
    """-p VHOST of a list: only that vhost (default: every vhost)."""
    options = argparse.ArgumentParser(add_help=False)
    options.add_argument("-p", "--vhost", help="only this vhost (default: every vhost)")
    return options


def add_commands(commands: Any, common: argparse.ArgumentParser, command: AddCommand) -> None:
    parents = [common, admin_options()]
    one = [*parents, in_vhost()]  # a command that names one queue, session or client
    many = [*parents, vhost_filter()]  # a list

    command(commands, "status", "a running server's version, uptime, readiness and counts", parents=parents)

    clients = command(commands, "clients", "connected clients of every protocol")
    sub = clients.add_subparsers(dest="action", required=True)
    listing = command(sub, "list", "list connected clients", parents=many)
    listing.add_argument("--protocol", choices=["mqtt", "amqp091", "amqp1"], help="only this protocol")
    command(sub, "show", "one client", parents=one).add_argument("id", help="client id or connection id")
    kick = command(sub, "kick", "disconnect a client (MQTT 5: reason 0x98)", parents=one)
    kick.add_argument("id", help="client id (MQTT client id, AMQP container id) or connection id (mqtt-12)")

    sessions = command(commands, "sessions", "MQTT sessions, connected or not")
    sub = sessions.add_subparsers(dest="action", required=True)
    listing = command(sub, "list", "list MQTT sessions", parents=many)
    state = listing.add_mutually_exclusive_group()
    state.add_argument("--connected", action="store_true", help="only sessions with a connected client")
    state.add_argument("--offline", action="store_true", help="only sessions without one")
    command(sub, "show", "one session and its subscriptions", parents=one).add_argument("client_id")
    command(sub, "delete", "end a session (its client is disconnected)", parents=one).add_argument(
        "client_id"
    )

    queues = command(commands, "queues", "durable queues")
    sub = queues.add_subparsers(dest="action", required=True)
    command(sub, "list", "list queues with depth, pending, lag and consumers", parents=many)
    command(sub, "show", "one queue: policy, groups, counters", parents=one).add_argument("name")
    peek = command(sub, "peek", "look at messages without consuming them", parents=one)
    peek.add_argument("name")
    peek.add_argument("--limit", type=int, default=20, help="how many (default 20)")
    command(sub, "purge", "remove every message of a queue", parents=one).add_argument("name")
    redrive = command(sub, "redrive", "move dead letters from $dlq/<name> back to <name>", parents=one)
    redrive.add_argument("name")
    redrive.add_argument("--limit", type=int, help="move at most this many (default: all)")
    command(sub, "delete", "delete a queue and its messages", parents=one).add_argument("name")

    webhooks = command(commands, "webhooks", "webhook endpoints of a running server")
    sub = webhooks.add_subparsers(dest="action", required=True)
    command(
        sub,
        "list",
        "each endpoint: healthy or failing, last error, last success, queued, sent, dropped",
        parents=parents,
    )

    # `trimaran bridges` alone lists them, so the group takes the admin options as each action does.
    # Given before an action they are lost (argparse lets the action's defaults win): they go after it.
    bridges = command(
        commands, "bridges", "bridges and shovels to other brokers of a running server (alone: list them)",
        parents=parents,
    )  # fmt: skip
    sub = bridges.add_subparsers(dest="action")
    bridges.set_defaults(action="list")  # after add_subparsers, whose own default is None
    command(sub, "list", "each bridge: state, address, messages sent and received, backlog", parents=parents)
    command(sub, "show", "one bridge: every figure and its topic lines", parents=parents).add_argument("name")
    restart = command(sub, "restart", "drop a bridge's connection and connect again at once", parents=parents)
    restart.add_argument("name")
    command(sub, "reload", "read the [[bridges]] of the settings again, as SIGHUP does", parents=parents)

    auth = command(commands, "auth", "users and access rules of a running server")
    sub = auth.add_subparsers(dest="action", required=True)
    command(sub, "reload", "read auth.password_file and auth.acl_file again, as SIGHUP does", parents=parents)

    _add_vhost_commands(commands, command, parents)
    _add_limits_command(commands, command, parents)


def _add_vhost_commands(commands: Any, command: AddCommand, parents: list[argparse.ArgumentParser]) -> None:
    """``trimaran vhosts`` and ``trimaran permissions``: rabbitmqctl's add_vhost / delete_vhost /
    list_vhosts and set_permissions / clear_permissions / list_permissions."""
    vhosts = command(commands, "vhosts", "virtual hosts of a running server")
    sub = vhosts.add_subparsers(dest="action", required=True)
    command(sub, "list", "each vhost, whether the settings declare it, its connections", parents=parents)
    add = command(
        sub,
        "add",
        "create a vhost; it grants nothing (trimaran permissions set -p VHOST USER)",
        parents=parents,
    )
    add.add_argument("vhost")
    add.add_argument("--user", help="the user it is made for: gets .* .* .* on it (RabbitMQ's management)")
    delete = command(sub, "delete", "delete a vhost and everything in it", parents=parents)
    delete.add_argument("vhost")

    permissions = command(
        commands, "permissions", "who may enter which vhost and configure, write, read what there"
    )
    sub = permissions.add_subparsers(dest="action", required=True)
    listing = command(sub, "list", "permissions, of every vhost or of one", parents=parents)
    listing.add_argument("-p", "--vhost", help="only this vhost")
    grant = command(
        sub, "set",
        "let a user enter a vhost and configure (declare, delete), write (publish to, bind to) and read "
        "(consume, get, purge, bind from) the queues and exchanges each regular expression matches "
        "(rabbitmqctl set_permissions -p VHOST USER CONF WRITE READ; '' matches nothing, the default "
        "exchange is amq.default; no permission, no entry)",
        parents=parents,
    )  # fmt: skip
    grant.add_argument("-p", "--vhost", default="/", help="the vhost (default /)")
    grant.add_argument(
        "user", help="a user of the password file or auth.users, or guest (also anonymous clients)"
    )
    for pattern, what in (
        ("configure", "queues and exchanges it may declare and delete"),
        ("write", "exchanges it may publish to, queues and exchanges it may bind to"),
        ("read", "queues it may consume, get, purge; exchanges it may bind from"),
    ):
        grant.add_argument(pattern, nargs="?", default=".*", help=f"{what} (default .*)")
    grant.add_argument(
        "--force", action="store_true", help="accept a user no file names (a certificate identity)"
    )
    clear = command(sub, "clear", "take a user's permission for a vhost away", parents=parents)
    clear.add_argument("-p", "--vhost", default="/", help="the vhost (default /)")
    clear.add_argument("user")
    topics = command(
        sub, "list-topic", "topic permissions, of every vhost or of one (rabbitmqctl list_topic_permissions)",
        parents=parents,
    )  # fmt: skip
    topics.add_argument("-p", "--vhost", help="only this vhost")
    set_topic = command(
        sub, "set-topic",
        "limit the routing keys a user publishes (WRITE) and binds or subscribes (READ) with through a "
        "topic exchange: regular expressions, {username} {vhost} {client_id} stand for the client's; "
        "MQTT and AMQP 1.0 topics go through amq.topic, a/b as the key a.b "
        "(rabbitmqctl set_topic_permissions -p VHOST USER EXCHANGE WRITE READ)",
        parents=parents,
    )  # fmt: skip
    set_topic.add_argument("-p", "--vhost", default="/", help="the vhost (default /)")
    set_topic.add_argument("user")
    set_topic.add_argument("exchange", help="a topic exchange (amq.topic for MQTT and AMQP 1.0 topics)")
    set_topic.add_argument(
        "write", nargs="?", default=".*", help="routing keys it may publish with (default .*)"
    )
    set_topic.add_argument("read", nargs="?", default=".*", help="binding keys it may bind with (default .*)")
    set_topic.add_argument("--force", action="store_true", help="accept a user no file names")
    clear_topic = command(
        sub, "clear-topic", "take a user's topic permissions away (of one exchange, or all in the vhost)",
        parents=parents,
    )  # fmt: skip
    clear_topic.add_argument("-p", "--vhost", default="/", help="the vhost (default /)")
    clear_topic.add_argument("user")
    clear_topic.add_argument("exchange", nargs="?", help="only this exchange's")


def _add_limits_command(commands: Any, command: AddCommand, parents: list[argparse.ArgumentParser]) -> None:
    """``trimaran limits``: rabbitmqctl's set_vhost_limits / set_user_limits and their clear_."""
    limits = command(commands, "limits", "limits per vhost and per user of a running server")
    sub = limits.add_subparsers(dest="action", required=True)
    command(sub, "list", "each vhost's and user's limits, connections, times each bit", parents=parents)
    vhost = command(
        sub, "set-vhost", "set a vhost's limits (replacing them all; an option left out is no limit)",
        parents=parents,
    )  # fmt: skip
    vhost.add_argument("-p", "--vhost", default="/", help="the vhost (default /)")
    vhost.add_argument("--max-connections", type=int, default=0, help="open connections, all protocols")
    vhost.add_argument("--max-queues", type=int, default=0, help="queues; a declare beyond is refused")
    vhost.add_argument(
        "--max-stored-bytes", type=int, default=0, help="bytes its queues store; a publish beyond is refused"
    )
    clear = command(sub, "clear-vhost", "remove a vhost's limits", parents=parents)
    clear.add_argument("-p", "--vhost", default="/", help="the vhost (default /)")
    user = command(sub, "set-user", "set a user's limits (replacing them all)", parents=parents)
    user.add_argument("user")
    _user_limit_options(user)
    clear_user = command(sub, "clear-user", "remove a user's own limits", parents=parents)
    clear_user.add_argument("user")
    default = command(
        sub, "set-default-user", "set the limits of every user without its own (anonymous too)",
        parents=parents,
    )  # fmt: skip
    _user_limit_options(default)


def _user_limit_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--max-connections", type=int, default=0, help="the user's open connections")
    parser.add_argument(
        "--max-messages-per-s", type=float, default=0, help="messages a second; beyond, read slower"
    )
    parser.add_argument(
        "--max-bytes-per-s", type=float, default=0, help="bytes a second; beyond, read slower"
    )


def run(args: argparse.Namespace, settings: Settings) -> int:
    try:
        client = AdminClient(_base_url(args, settings), _token(args, settings))
        return _dispatch(client, args)
    except CtlError as exc:
        print(f"trimaran: {exc}", file=sys.stderr)
        return exc.status


def reload_auth(args: argparse.Namespace, settings: Settings) -> tuple[bool, str]:
    """Ask a running server to read its password and rule files again (``trimaran users`` after a
    change). (True, what happened) when it did, or when no server answers: that is no failure, the
    file is read at the next start. (False, why) when a server answered and did not reload."""
    try:
        url = _base_url(args, settings)
    except CtlError:
        return True, "no admin API in these settings (http.bind is off): send the server SIGHUP"
    try:
        answer = AdminClient(url, _token(args, settings)).call("POST", "/api/v1/auth/reload")
    except CtlError as exc:
        if not exc.answered:
            return True, f"no server answers at {url}: the file is read at its next start, or on SIGHUP"
        return False, f"the server at {url} did not reload: {exc}; send it SIGHUP"
    return True, f"the server at {url} reloaded ({answer.get('detail', 'done')})"


def _base_url(args: argparse.Namespace, settings: Settings) -> str:
    if args.url:
        return str(args.url).rstrip("/")
    bind = settings.http.bind
    if bind is None:
        raise CtlError("http.bind is off in these settings: pass --url", EXIT_UNREACHABLE)
    host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(bind.host, bind.host)
    return f"http://{f'[{host}]' if ':' in host else host}:{bind.port}"


def _token(args: argparse.Namespace, settings: Settings) -> str | None:
    if args.token:
        return str(args.token)
    if os.environ.get(TOKEN_ENV):
        return os.environ[TOKEN_ENV]
    tokens = settings.http.tokens
    return tokens[0].get_secret_value() if tokens else None


# -- HTTP -------------------------------------------------------------------------------------------


class AdminClient:
    def __init__(self, base_url: str, token: str | None) -> None:
        self.base_url = base_url
        self.token = token

    def call(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.base_url + path, data=data, method=method)
        request.add_header("accept", "application/json")
        if data is not None:
            request.add_header("content-type", "application/json")
        if self.token:
            request.add_header("authorization", f"Bearer {self.token}")
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
                return json.loads(response.read() or b"null")
        except urllib.error.HTTPError as error:
            raise _answered(error) from None
        except (urllib.error.URLError, OSError) as error:
            reason = getattr(error, "reason", error)
            raise CtlError(
                f"cannot reach the admin API at {self.base_url}: {reason}", EXIT_UNREACHABLE, answered=False
            ) from None

    def pages(self, path: str, query: dict[str, str] | None = None) -> list[dict[str, Any]]:
        """Every item of a paginated list, following the ``next`` links."""
        url: str | None = path + (f"?{urlencode(query)}" if query else "")
        items: list[dict[str, Any]] = []
        while url is not None:
            page = self.call("GET", url)
            items.extend(page["items"])
            url = page.get("next")
            if url is not None and url.startswith("http"):  # an absolute link: keep our base
                url = urljoin("/", url.split("/", 3)[-1])
        return items


def _answered(error: urllib.error.HTTPError) -> CtlError:
    try:
        body = json.loads(error.read())["error"]
        detail, code = body["message"], body.get("code")
    except (ValueError, KeyError, TypeError):
        detail, code = error.reason, None
    if error.code == 401 and code == "locked":
        return CtlError(
            "the admin API is locked: the server has no http.tokens; give it one ([http] tokens = "
            '["..."] in trimaran.toml, or TRIMARAN_HTTP__TOKENS=\'["..."]\') and start it again',
            EXIT_UNREACHABLE,
        )
    if error.code == 401:
        return CtlError(f"the admin API refused the token: {detail} (pass --token)", EXIT_UNREACHABLE)
    return CtlError(f"{detail} ({error.code})", EXIT_ANSWERED_ERROR)


def _segment(value: str) -> str:
    """One path segment: a queue or client id may hold '/', '#' or '$'."""
    return quote(value, safe="")


# -- the commands -----------------------------------------------------------------------------------


def _dispatch(client: AdminClient, args: argparse.Namespace) -> int:
    command, action = args.command, getattr(args, "action", None)
    as_json: bool = args.json
    if command == "status":
        overview = client.call("GET", "/api/v1/overview")
        ready = _readiness(client)
        if as_json:
            _print_json({"overview": overview, "ready": ready})
        else:
            _print_status(client.base_url, overview, ready)
        return 0
    if command == "clients":
        if action == "list":
            query = _in(args, {"protocol": args.protocol} if args.protocol else {})
            return _show_list(client.pages("/api/v1/clients", query), as_json, CLIENT_COLUMNS)
        path = f"/api/v1/clients/{_segment(args.id)}{_of(args)}"
        if action == "show":
            return _show_record(client.call("GET", path), as_json)
        return _show_done(client.call("DELETE", path), as_json)
    if command == "sessions":
        if action == "list":
            query = _in(
                args,
                {"connected": "true"} if args.connected else {"connected": "false"} if args.offline else {},
            )
            return _show_list(client.pages("/api/v1/sessions", query), as_json, SESSION_COLUMNS)
        path = f"/api/v1/sessions/{_segment(args.client_id)}"
        if action == "show":
            return _show_record(
                client.call("GET", path + _of(args)), as_json, nested=("subscriptions", SUBSCRIPTION_COLUMNS)
            )
        return _show_done(client.call("DELETE", path + _of(args)), as_json)
    if command == "queues":
        if action == "list":
            return _show_list(client.pages("/api/v1/queues", _in(args, {})), as_json, QUEUE_COLUMNS)
        path, of = f"/api/v1/queues/{_segment(args.name)}", _of(args)
        named = _named(args.name, args.vhost)
        if action == "show":
            return _show_record(client.call("GET", path + of), as_json, nested=("groups", GROUP_COLUMNS))
        if action == "peek":
            limit = urlencode({"limit": max(1, args.limit), "vhost": args.vhost})
            page = client.call("GET", f"{path}/messages?{limit}")
            return _show_list(page["items"], as_json, MESSAGE_COLUMNS)
        if action == "purge":
            answer = client.call("POST", f"{path}/purge{of}")
            return _show_count(answer, as_json, f"purged {answer['count']} messages from {named}")
        if action == "redrive":
            answer = client.call("POST", f"{path}/redrive{of}", {"limit": args.limit})
            return _show_count(answer, as_json, f"moved {answer['count']} messages back to {named}")
        return _show_done(client.call("DELETE", path + of), as_json)
    if command == "webhooks":
        return _show_list(client.pages("/api/v1/webhooks"), as_json, WEBHOOK_COLUMNS)
    if command == "bridges":
        if action == "list":
            return _show_list(client.pages("/api/v1/bridges"), as_json, BRIDGE_COLUMNS)
        if action == "reload":
            answer = client.call("POST", "/api/v1/bridges/reload")
            if as_json:
                return _show_record(answer, as_json)
            changes = [
                f"{what} {', '.join(answer[what])}"
                for what in ("added", "removed", "changed")
                if answer[what]
            ]
            print("bridges reloaded: " + ("; ".join(changes) or "nothing changed"))
            return 0
        path = f"/api/v1/bridges/{_segment(args.name)}"
        if action == "show":
            return _show_record(client.call("GET", path), as_json)
        return _show_done(client.call("POST", f"{path}/restart"), as_json)
    if command == "auth":
        return _show_done(client.call("POST", "/api/v1/auth/reload"), as_json)
    if command == "limits":
        return _limits(client, args, action, as_json)
    if command == "vhosts":
        if action == "list":
            return _show_list(client.pages("/api/v1/vhosts"), as_json, VHOST_COLUMNS)
        path = f"/api/v1/vhosts/{_segment(args.vhost)}"
        if action == "add":
            if args.user:
                path += "?" + urllib.parse.urlencode({"user": args.user})
            return _show_count(client.call("PUT", path), as_json, f"vhost {args.vhost!r} ready")
        return _show_done(client.call("DELETE", path), as_json)
    if command == "permissions":
        if action == "list":
            query = {"vhost": args.vhost} if args.vhost else None
            return _show_list(client.pages("/api/v1/permissions", query), as_json, PERMISSION_COLUMNS)
        if action in ("list-topic", "set-topic", "clear-topic"):
            return _topic_permissions(client, args, action, as_json)
        path = f"/api/v1/permissions/{_segment(args.vhost)}/{_segment(args.user)}"
        if action == "set":
            body = {"configure": args.configure, "write": args.write, "read": args.read}
            answer = client.call("PUT", path + ("?force=true" if args.force else ""), body)
            return _show_count(answer, as_json, f"user {args.user!r} may enter vhost {args.vhost!r}")
        return _show_done(client.call("DELETE", path), as_json)
    raise AssertionError(command)


def _topic_permissions(client: AdminClient, args: argparse.Namespace, action: str, as_json: bool) -> int:
    """``permissions list-topic|set-topic|clear-topic``: rabbitmqctl's *_topic_permissions."""
    base = "/api/v1/topic-permissions"
    if action == "list-topic":
        query = {"vhost": args.vhost} if args.vhost else None
        return _show_list(client.pages(base, query), as_json, TOPIC_PERMISSION_COLUMNS)
    user = f"{_segment(args.vhost)}/{_segment(args.user)}"
    if action == "set-topic":
        path = f"{base}/{user}/{_segment(args.exchange)}" + ("?force=true" if args.force else "")
        answer = client.call("PUT", path, {"write": args.write, "read": args.read})
        return _show_count(answer, as_json, f"user {args.user!r}'s keys through {args.exchange!r} limited")
    exchanges = [args.exchange] if args.exchange else [
        row["exchange"] for row in client.pages(base, {"vhost": args.vhost}) if row["user"] == args.user
    ]  # fmt: skip
    if not exchanges:
        missing = f"user {args.user!r} has no topic permission in vhost {args.vhost!r}"
        raise CtlError(missing, EXIT_ANSWERED_ERROR)
    answer = {}
    for exchange in exchanges:
        answer = client.call("DELETE", f"{base}/{user}/{_segment(exchange)}")
    return _show_done(answer, as_json)


def _in(args: argparse.Namespace, query: dict[str, str]) -> dict[str, str] | None:
    """A list's query with its ``-p`` filter, if one was given."""
    if args.vhost:
        query = {**query, "vhost": args.vhost}
    return query or None


def _of(args: argparse.Namespace) -> str:
    """The query naming the vhost of the one queue, session or client a command names."""
    return f"?{urlencode({'vhost': args.vhost})}"


def _named(name: str, vhost: str) -> str:
    return f"queue '{name}' in vhost '{vhost}'"


def _limits(client: AdminClient, args: argparse.Namespace, action: str | None, as_json: bool) -> int:
    base = "/api/v1/limits"
    if action == "list":
        return _show_limits(client.call("GET", base), as_json)
    if action == "clear-vhost":
        return _show_done(client.call("DELETE", f"{base}/vhosts/{_segment(args.vhost)}"), as_json)
    if action == "clear-user":
        return _show_done(client.call("DELETE", f"{base}/users/{_segment(args.user)}"), as_json)
    if action == "set-vhost":
        body: dict[str, float] = {
            "max_connections": args.max_connections,
            "max_queues": args.max_queues,
            "max_stored_bytes": args.max_stored_bytes,
        }
        return _show_limits(client.call("PUT", f"{base}/vhosts/{_segment(args.vhost)}", body), as_json)
    body = {
        "max_connections": args.max_connections,
        "max_messages_per_s": args.max_messages_per_s,
        "max_bytes_per_s": args.max_bytes_per_s,
    }
    path = f"{base}/users/{_segment(args.user)}" if action == "set-user" else f"{base}/default-user"
    return _show_limits(client.call("PUT", path, body), as_json)


def _show_limits(answer: dict[str, Any], as_json: bool) -> int:
    if as_json:
        _print_json(answer)
        return 0
    vhosts = [{"vhost": name, **values} for name, values in answer["vhosts"].items()]
    print(table(vhosts, VHOST_LIMIT_COLUMNS))
    print()
    users = [{"user": "(default)", **answer["default_user"], "connections": None}]
    users += [{"user": name, **values} for name, values in answer["users"].items()]
    print(table(users, USER_LIMIT_COLUMNS))
    if answer["bites"]:
        print()
        print(table(answer["bites"], BITE_COLUMNS))
    return 0


def _readiness(client: AdminClient) -> dict[str, Any]:
    try:
        return dict(client.call("GET", "/readyz"))
    except CtlError as exc:  # 503 still carries the checks; report it as not ready
        return {"status": "not ready", "checks": {}, "detail": str(exc)}


# -- output -----------------------------------------------------------------------------------------

Column = tuple[str, Callable[[dict[str, Any]], object]]


def _field(name: str) -> Callable[[dict[str, Any]], object]:
    return lambda item: item.get(name)


def _age(name: str) -> Callable[[dict[str, Any]], object]:
    return lambda item: _since(item[name]) if item.get(name) else None


def _since(epoch_ms: int) -> str:
    return _duration(time.time() - epoch_ms / 1000)


CLIENT_COLUMNS: list[Column] = [
    ("ID", _field("id")),
    ("CLIENT ID", _field("client_id")),
    ("VHOST", _field("vhost")),
    ("PROTOCOL", _field("protocol")),
    ("ADDRESS", _field("address")),
    ("USER", _field("user")),
    ("CONNECTED FOR", _age("connected_at_ms")),
]
SESSION_COLUMNS: list[Column] = [
    ("CLIENT ID", _field("client_id")),
    ("VHOST", _field("vhost")),
    ("CONNECTED", lambda s: "yes" if s["connected"] else "no"),
    ("MQTT", lambda s: {3: "3.1", 4: "3.1.1", 5: "5.0"}.get(s["protocol_level"], s["protocol_level"])),
    ("SUBSCRIPTIONS", _field("subscription_count")),
    ("INFLIGHT", _field("inflight")),
    ("QUEUED", _field("queued")),
    ("DROPPED", _field("dropped")),
    ("EXPIRES IN", lambda s: None if s["expires_in_s"] is None else _duration(s["expires_in_s"])),
]
SUBSCRIPTION_COLUMNS: list[Column] = [
    ("FILTER", _field("topic_filter")),
    ("QOS", _field("qos")),
    ("NO LOCAL", _field("no_local")),
    ("RETAIN AS PUBLISHED", _field("retain_as_published")),
]
QUEUE_COLUMNS: list[Column] = [
    ("NAME", _field("name")),
    ("VHOST", _field("vhost")),
    ("MODE", _field("mode")),
    ("DEPTH", _field("depth")),
    ("BYTES", _field("bytes")),
    ("PENDING", _field("pending")),
    ("LAG", _field("lag")),
    ("CONSUMERS", lambda q: sum(g["consumers"] for g in q["groups"])),
    ("DLQ DEPTH", _field("dlq_depth")),
]
GROUP_COLUMNS: list[Column] = [
    ("GROUP", _field("name")),
    ("CURSOR", _field("cursor")),
    ("PENDING", _field("pending")),
    ("LAG", _field("lag")),
    ("CONSUMERS", _field("consumers")),
]
WEBHOOK_COLUMNS: list[Column] = [
    ("NAME", _field("name")),
    ("URL", _field("url")),
    ("STATE", lambda w: "healthy" if w["healthy"] else f"failing ({w['consecutive_failures']} in a row)"),
    ("BREAKER", _field("breaker")),
    ("LAST ERROR", lambda w: _clip(w["last_error"], 40) if w["last_error"] else None),
    (
        "LAST SUCCESS",
        lambda w: f"{_since(w['last_success_at_ms'])} ago" if w["last_success_at_ms"] else "never",
    ),
    ("QUEUED", _field("queued")),
    ("SENT", _field("sent")),
    ("DROPPED", _field("dropped")),
]
BRIDGE_COLUMNS: list[Column] = [
    ("NAME", _field("name")),
    ("KIND", _field("kind")),
    ("STATE", lambda b: f"{b['state']} for {_duration(b['state_for_s'])}"),
    ("ADDRESS", _field("address")),
    ("SENT", _field("sent")),
    ("RECEIVED", _field("received")),
    ("BACKLOG BYTES", _field("backlog_bytes")),
]
VHOST_COLUMNS: list[Column] = [
    ("NAME", _field("name")),
    ("DECLARED", _field("declared")),
    ("CONNECTIONS", _field("connections")),
]
PERMISSION_COLUMNS: list[Column] = [
    ("VHOST", _field("vhost")),
    ("USER", _field("user")),
    ("CONFIGURE", _field("configure")),
    ("WRITE", _field("write")),
    ("READ", _field("read")),
]
TOPIC_PERMISSION_COLUMNS: list[Column] = [
    ("VHOST", _field("vhost")),
    ("USER", _field("user")),
    ("EXCHANGE", _field("exchange")),
    ("WRITE", _field("write")),
    ("READ", _field("read")),
]
VHOST_LIMIT_COLUMNS: list[Column] = [
    ("VHOST", _field("vhost")),
    ("CONNECTIONS", _field("connections")),
    ("MAX CONNECTIONS", _field("max_connections")),
    ("MAX QUEUES", _field("max_queues")),
    ("MAX STORED BYTES", _field("max_stored_bytes")),
]
USER_LIMIT_COLUMNS: list[Column] = [
    ("USER", _field("user")),
    ("CONNECTIONS", _field("connections")),
    ("MAX CONNECTIONS", _field("max_connections")),
    ("MAX MESSAGES/S", _field("max_messages_per_s")),
    ("MAX BYTES/S", _field("max_bytes_per_s")),
]
BITE_COLUMNS: list[Column] = [
    ("VHOST", _field("vhost")),
    ("LIMIT", _field("limit")),
    ("TIMES", _field("count")),
]
MESSAGE_COLUMNS: list[Column] = [
    ("OFFSET", _field("offset")),
    ("TOPIC", _field("topic")),
    ("SIZE", _field("size")),
    ("PAYLOAD", lambda m: _clip(m["payload"] if m["encoding"] == "text" else f"base64:{m['payload']}", 60)),
]


def table(rows: Iterable[dict[str, Any]], columns: Sequence[Column]) -> str:
    """Rows as aligned text columns under a header, as ``rabbitmqctl list_queues`` prints them."""
    cells = [[name for name, _ in columns]]
    cells += [[_cell(get(row)) for _, get in columns] for row in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() for line in cells
    )


def _cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


def _clip(text: str, width: int) -> str:
    text = text.replace("\n", "\\n")
    return text if len(text) <= width else text[: width - 1] + "…"


def _duration(seconds: float) -> str:
    seconds = max(0, int(seconds))
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d{hours}h"
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"


def _print_json(data: Any) -> None:
    print(json.dumps(data, indent=2))


def _show_list(items: list[dict[str, Any]], as_json: bool, columns: Sequence[Column]) -> int:
    if as_json:
        _print_json(items)
    else:
        print(table(items, columns))
    return 0


def _show_record(
    record: dict[str, Any], as_json: bool, nested: tuple[str, Sequence[Column]] | None = None
) -> int:
    """A record as ``key  value`` lines; ``nested`` names a list field shown as a table below."""
    if as_json:
        _print_json(record)
        return 0
    width = max(len(key) for key in record)
    for key, value in record.items():
        if nested is not None and key == nested[0]:
            continue
        shown = json.dumps(value) if isinstance(value, (dict, list)) else _cell(value)
        print(f"{key.ljust(width)}  {shown}")
    if nested is not None:
        print()
        print(table(record.get(nested[0], []), nested[1]))
    return 0


def _show_done(answer: dict[str, Any], as_json: bool) -> int:
    if as_json:
        _print_json(answer)
    else:
        print(answer.get("detail", "done"))
    return 0


def _show_count(answer: dict[str, Any], as_json: bool, sentence: str) -> int:
    if as_json:
        _print_json(answer)
    else:
        print(sentence)
    return 0


def _print_status(url: str, overview: dict[str, Any], ready: dict[str, Any]) -> None:
    connections = overview["connections"]
    rows = [
        ("server", url),
        ("version", overview["version"]),
        ("node", overview["node"]),
        ("uptime", _duration(overview["uptime_s"])),
        ("ready", ready.get("status", "unknown")),
        (
            "connections",
            ", ".join(f"{k} {v}" for k, v in connections.items()) + f" (total {sum(connections.values())})",
        ),
        ("sessions", overview["sessions"]),
        ("subscriptions", overview["subscriptions"]),
        ("retained", overview["retained"]),
        ("queues", overview["queues"]),
        ("messages", ", ".join(f"{k} {v}" for k, v in overview["messages"].items())),
        ("bytes", ", ".join(f"{k} {v}" for k, v in overview["bytes"].items())),
    ]
    listeners = ready.get("checks", {}).get("listeners")
    if isinstance(listeners, dict):
        rows.append(("listeners", ", ".join(f"{k} {v or 'not bound'}" for k, v in listeners.items())))
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"{name.ljust(width)}  {value}")
