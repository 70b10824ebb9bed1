"""``trimaran status|clients|sessions|queues|webhooks|bridges|auth`` against a real server, and the admin API
fixes they rely on: kick by client id, ``next`` links under names with '/', reason phrases."""

from __future__ import annotations

import contextlib
import http.client
import io
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from tests.support.bridges import bridged_with_admin
from tests.support.paho import V5, Endpoints, connect
from tests.support.server import RunningServer, refused_port, unused_port
from trimaran import cli, logs
from trimaran.ctl import table

TOKEN = "ctl-token"
ARGS = ["--mqtt", "127.0.0.1:0", "--mqtt-ws", "off", "--amqp", "off", "--http", "127.0.0.1:0"]


# Nobody listens here: the endpoint fails from the first client.connected event.
WEBHOOK_URL = f"http://127.0.0.1:{refused_port()}/hook"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    env = {
        "TRIMARAN_HTTP__TOKENS": json.dumps([TOKEN]),
        "TRIMARAN_LIMITS__SYS_INTERVAL": "0",
        "TRIMARAN_WEBHOOKS__ENDPOINTS": json.dumps([{"url": WEBHOOK_URL, "events": ["client.connected"]}]),
        "TRIMARAN_WEBHOOKS__FLUSH_TIMEOUT_S": "0.2",
        # Users a permission may name (RabbitMQ refuses one for a user that exists nowhere); alice
        # also logs a tenant's MQTT clients in (vhost:user).
        "TRIMARAN_AUTH__USERS": json.dumps(
            [{"name": "alice", "password": "wonderland"}, {"name": "bob", "password": "bob"}]
        ),
    }
    running = RunningServer(ARGS, cwd=tmp_path_factory.mktemp("ctl"), env=env).start()
    try:
        yield running
    finally:
        assert running.stop() == 0, running.output()


@pytest.fixture(scope="module")
def mqtt(server: RunningServer) -> Endpoints:
    return Endpoints("127.0.0.1", server.ports["mqtt"])


Ctl = Callable[..., subprocess.CompletedProcess[str]]


def in_process(server: RunningServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Ctl:
    """The command line against ``server``, run in this process (a new interpreter's start for each
    of a hundred commands cost the default run a minute); test_wrong_token_and_unreachable_server
    runs the installed command itself."""
    url = f"http://127.0.0.1:{server.ports['http']}"
    for key in [k for k in os.environ if k.startswith("TRIMARAN_")]:
        monkeypatch.delenv(key)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(logs, "configure", lambda *_: None)  # pytest's log capture stays as it is

    def run(*args: str, token: str | None = TOKEN) -> subprocess.CompletedProcess[str]:
        command = [*args, "--url", url] + (["--token", token] if token is not None else [])
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = cli.main(command)
            except SystemExit as exc:  # argparse's refusals
                code = exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 2
        return subprocess.CompletedProcess(["trimaran", *command], code, out.getvalue(), err.getvalue())

    return run


@pytest.fixture
def ctl(server: RunningServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Ctl:
    return in_process(server, tmp_path, monkeypatch)


def request(server: RunningServer, method: str, path: str, body: Any = None) -> tuple[int, str, Any]:
    conn = http.client.HTTPConnection("127.0.0.1", server.ports["http"], timeout=10)
    try:
        headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
        conn.request(method, path, body=None if body is None else json.dumps(body), headers=headers)
        response = conn.getresponse()
        return response.status, response.reason, json.loads(response.read() or b"null")
    finally:
        conn.close()


def wait_for(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


# -- the API fixes ----------------------------------------------------------------------------------


def test_status_lines_carry_reason_phrases(server: RunningServer) -> None:
    assert request(server, "GET", "/api/v1/overview")[:2] == (200, "OK")
    assert request(server, "GET", "/api/v1/queues/nothing-here")[:2] == (404, "Not Found")
    assert request(server, "PUT", "/api/v1/overview")[:2] == (405, "Method Not Allowed")


def test_next_link_of_a_name_with_a_slash_is_followable(server: RunningServer) -> None:
    name = "$dlq/orders eu"  # a dead-letter queue: '/', and a space, both percent-encoded in the path
    assert request(server, "POST", "/api/v1/queues", {"name": name})[0] in (200, 201)
    for n in range(3):
        assert (
            request(server, "POST", "/api/v1/publish", {"topic": f"$queue/{name}", "payload": f"m{n}"})[0]
            == 200
        )
    status, _, first = request(server, "GET", "/api/v1/queues/%24dlq%2Forders%20eu/messages?limit=2")
    assert status == 200 and first["next"].startswith("/api/v1/queues/%24dlq%2Forders%20eu/messages?")
    status, _, second = request(server, "GET", first["next"])
    assert status == 200
    assert [m["payload"] for m in first["items"] + second["items"]] == ["m0", "m1", "m2"]
    assert request(server, "DELETE", "/api/v1/queues/%24dlq%2Forders%20eu")[0] == 200


def test_kick_by_client_id_and_by_connection_id(server: RunningServer, mqtt: Endpoints) -> None:
    by_name = connect(mqtt, "kick/by name", version=V5)
    by_key = connect(mqtt, "kick-by-key", version=V5)
    try:
        status, _, body = request(server, "DELETE", "/api/v1/clients/kick%2Fby%20name")
        assert status == 200 and body["detail"] == "client 'kick/by name' in vhost '/' disconnected"
        assert by_name.disconnects.get(timeout=5)[0].value == 0x98
        clients = request(server, "GET", "/api/v1/clients")[2]["items"]
        key = next(c["id"] for c in clients if c["client_id"] == "kick-by-key")
        assert key.startswith("mqtt-")
        assert request(server, "DELETE", f"/api/v1/clients/{key}")[0] == 200
        assert by_key.disconnects.get(timeout=5)[0].value == 0x98
        status, _, body = request(server, "DELETE", "/api/v1/clients/nobody")
        assert status == 404 and body["error"]["code"] == "no_client"
    finally:
        by_name.client.loop_stop()
        by_key.client.loop_stop()


# -- the CLI ----------------------------------------------------------------------------------------


def test_status(ctl: Callable[..., subprocess.CompletedProcess[str]]) -> None:
    result = ctl("status")
    assert result.returncode == 0, result.stderr
    lines = dict(line.split(None, 1) for line in result.stdout.splitlines())
    assert lines["ready"] == "ready" and lines["node"] == "trimaran"
    assert lines["version"].startswith("0.")
    as_json = json.loads(ctl("status", "--json").stdout)
    assert as_json["ready"]["status"] == "ready" and "connections" in as_json["overview"]


def test_clients_list_and_kick(ctl: Callable[..., subprocess.CompletedProcess[str]], mqtt: Endpoints) -> None:
    client = connect(mqtt, "shell-kick", version=V5)
    try:
        result = ctl("clients", "list", "--protocol", "mqtt")
        assert result.returncode == 0, result.stderr
        header, *rows = result.stdout.splitlines()
        assert header.split()[:3] == ["ID", "CLIENT", "ID"]
        assert any(row.split()[1:3] == ["shell-kick", "/"] for row in rows)
        listed = json.loads(ctl("clients", "list", "--json").stdout)
        assert "shell-kick" in [c["client_id"] for c in listed]
        result = ctl("clients", "kick", "shell-kick")
        assert result.returncode == 0 and result.stdout == "client 'shell-kick' in vhost '/' disconnected\n"
        assert client.disconnects.get(timeout=5)[0].value == 0x98
        result = ctl("clients", "kick", "shell-kick")
        assert result.returncode == 1
        assert result.stderr == "trimaran: no connected client 'shell-kick' in vhost '/' (404)\n"
    finally:
        client.client.loop_stop()


def test_sessions_list_show_delete(
    ctl: Callable[..., subprocess.CompletedProcess[str]], mqtt: Endpoints
) -> None:
    from tests.support.paho import PacketTypes, props

    keeper = connect(
        mqtt,
        "shell-keeper",
        version=V5,
        clean=False,
        properties=props(PacketTypes.CONNECT, SessionExpiryInterval=300),
    )
    keeper.subscribe("plant/+/temp", qos=1)
    keeper.disconnect()
    wait_for(lambda: '"connected": false' in ctl("sessions", "show", "shell-keeper", "--json").stdout)
    offline = ctl("sessions", "list", "--offline")
    assert any(row.split()[:3] == ["shell-keeper", "/", "no"] for row in offline.stdout.splitlines()[1:])
    shown = ctl("sessions", "show", "shell-keeper")
    assert "plant/+/temp" in shown.stdout and "expiry_interval_s" in shown.stdout
    assert ctl("sessions", "delete", "shell-keeper").stdout == "session 'shell-keeper' in vhost '/' deleted\n"
    assert ctl("sessions", "show", "shell-keeper").returncode == 1


def test_queues_list_show_peek_purge_delete(
    ctl: Callable[..., subprocess.CompletedProcess[str]], server: RunningServer
) -> None:
    name = "jobs-shell"
    request(server, "POST", "/api/v1/queues", {"name": name})
    for n in range(4):
        request(server, "POST", "/api/v1/publish", {"topic": f"$queue/{name}", "payload": f"job {n}"})
    listing = ctl("queues", "list")
    row = next(line.split() for line in listing.stdout.splitlines() if line.startswith(name))
    assert row[:4] == [name, "/", "work", "4"]
    shown = ctl("queues", "show", name)
    assert shown.returncode == 0 and "policy" in shown.stdout
    peek = ctl("queues", "peek", name, "--limit", "2")
    assert [line.split()[0] for line in peek.stdout.splitlines()] == ["OFFSET", "0", "1"]
    assert "job 0" in peek.stdout
    assert ctl("queues", "purge", name).stdout == f"purged 4 messages from queue '{name}' in vhost '/'\n"
    assert json.loads(ctl("queues", "show", name, "--json").stdout)["depth"] == 0
    assert ctl("queues", "delete", name).returncode == 0
    missing = ctl("queues", "show", name)
    assert missing.returncode == 1
    assert missing.stderr.startswith(f"trimaran: queue '{name}' in vhost '/' does not exist")


def test_wrong_token_and_unreachable_server(
    ctl: Callable[..., subprocess.CompletedProcess[str]], tmp_path: Path
) -> None:
    refused = ctl("status", token="wrong")
    assert refused.returncode == 2
    assert refused.stderr.startswith("trimaran: the admin API refused the token")
    result = subprocess.run(
        [sys.executable, "-m", "trimaran", "queues", "list", "--http", "127.0.0.1:1"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=60,
    )
    # `queues list` takes the address from the settings (here the --http flag is not one of its
    # flags, so argparse refuses it with a hint); with a config file it reads http.bind.
    assert result.returncode == 2
    (tmp_path / "trimaran.toml").write_text('[http]\nbind = "127.0.0.1:1"\ntokens = ["t"]\n')
    result = subprocess.run(
        [sys.executable, "-m", "trimaran", "queues", "list"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=60,
    )
    assert result.returncode == 2
    assert result.stderr.startswith("trimaran: cannot reach the admin API at http://127.0.0.1:1: ")


def test_a_fresh_install_is_locked_until_a_token_is_set(tmp_path: Path) -> None:
    """docs/getting-started.md's admin section, from a fresh install: no http.tokens, every admin
    command exits 2 saying how to set one; with one in ./trimaran.toml, no flag is needed."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRIMARAN_")}
    port = unused_port()
    args = ["--mqtt", "127.0.0.1:0", "--mqtt-ws", "off", "--amqp", "off"]

    def admin(*command: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "trimaran", *command],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            env=env,
            timeout=60,
        )

    (tmp_path / "trimaran.toml").write_text(f'[http]\nbind = "127.0.0.1:{port}"\n')
    locked = RunningServer(args, cwd=tmp_path, env=env).start()
    try:
        refused = admin("status")
        assert refused.returncode == 2
        assert refused.stderr.startswith("trimaran: the admin API is locked: the server has no http.tokens")
        assert "TRIMARAN_HTTP__TOKENS" in refused.stderr and "Traceback" not in refused.stderr
    finally:
        assert locked.stop() == 0
    (tmp_path / "trimaran.toml").write_text(f'[http]\nbind = "127.0.0.1:{port}"\ntokens = ["s3cret"]\n')
    opened = RunningServer(args, cwd=tmp_path, env=env).start()
    try:
        status = admin("status")
        assert status.returncode == 0, status.stderr
        assert admin("queues", "list").returncode == 0
    finally:
        assert opened.stop() == 0


def test_auth_reload(ctl: Callable[..., subprocess.CompletedProcess[str]], server: RunningServer) -> None:
    result = ctl("auth", "reload")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "users and rules reloaded"
    assert json.loads(ctl("auth", "reload", "--json").stdout)["ok"] is True
    wait_for(lambda: "auth: reloaded" in server.output())


def test_limits_set_list_clear(ctl: Callable[..., subprocess.CompletedProcess[str]], mqtt: Endpoints) -> None:
    result = ctl("limits", "set-vhost", "-p", "/", "--max-connections", "10", "--max-queues", "5")
    assert result.returncode == 0, result.stderr
    client = connect(mqtt, "counted")
    try:
        listed = ctl("limits", "list")
        assert listed.returncode == 0, listed.stderr
        lines = listed.stdout.splitlines()
        assert lines[0].split() == [
            "VHOST",
            "CONNECTIONS",
            "MAX",
            "CONNECTIONS",
            "MAX",
            "QUEUES",
            "MAX",
            "STORED",
            "BYTES",
        ]
        assert lines[1].split() == ["/", "1", "10", "5", "0"]
    finally:
        client.disconnect()
    assert ctl("limits", "set-user", "alice", "--max-messages-per-s", "50").returncode == 0
    assert ctl("limits", "set-default-user", "--max-connections", "100").returncode == 0
    answer = json.loads(ctl("limits", "list", "--json").stdout)
    assert answer["users"]["alice"]["max_messages_per_s"] == 50
    assert answer["default_user"]["max_connections"] == 100
    table_lines = ctl("limits", "list").stdout.splitlines()
    assert ["(default)", "-", "100", "0.0", "0.0"] in [line.split() for line in table_lines]
    assert ctl("limits", "clear-user", "alice").stdout.strip() == "limits of user 'alice' removed"
    assert ctl("limits", "clear-vhost").stdout.strip() == "limits of vhost '/' removed"
    missing = ctl("limits", "clear-vhost", "-p", "nowhere")
    assert missing.returncode == 1 and "has no limits" in missing.stderr
    assert ctl("limits", "set-default-user").returncode == 0


def test_vhosts_and_permissions(ctl: Callable[..., subprocess.CompletedProcess[str]]) -> None:
    added = ctl("vhosts", "add", "team-a")
    assert added.returncode == 0, added.stderr
    assert added.stdout.strip() == "vhost 'team-a' ready"
    rows = [line.split() for line in ctl("vhosts", "list").stdout.splitlines()]
    assert rows == [["NAME", "DECLARED", "CONNECTIONS"], ["/", "yes", "0"], ["team-a", "no", "0"]]

    granted = ctl("permissions", "set", "-p", "team-a", "alice", ".*", "^out", "^in")
    assert granted.returncode == 0, granted.stderr
    assert granted.stdout.strip() == "user 'alice' may enter vhost 'team-a'"
    assert ctl("permissions", "set", "-p", "team-a", "bob").returncode == 0
    rows = [line.split() for line in ctl("permissions", "list", "-p", "team-a").stdout.splitlines()]
    assert rows == [
        ["VHOST", "USER", "CONFIGURE", "WRITE", "READ"],
        ["team-a", "alice", ".*", "^out", "^in"],
        ["team-a", "bob", ".*", ".*", ".*"],
    ]
    assert json.loads(ctl("permissions", "list", "--json").stdout)[2]["user"] == "bob"  # after guest on /
    assert ctl("permissions", "clear", "-p", "team-a", "bob").returncode == 0
    missing = ctl("permissions", "clear", "-p", "team-a", "bob")
    assert missing.returncode == 1 and "has no permission" in missing.stderr
    assert ctl("permissions", "set", "-p", "nowhere", "alice").returncode == 1
    # RabbitMQ's set_topic_permissions / list_topic_permissions / clear_topic_permissions.
    assert (
        ctl(
            "permissions", "set-topic", "-p", "team-a", "alice", "amq.topic", "^{username}\\.", "^a"
        ).returncode
        == 0
    )
    rows = [line.split() for line in ctl("permissions", "list-topic", "-p", "team-a").stdout.splitlines()]
    assert rows == [
        ["VHOST", "USER", "EXCHANGE", "WRITE", "READ"],
        ["team-a", "alice", "amq.topic", "^{username}\\.", "^a"],
    ]
    assert ctl("permissions", "clear-topic", "-p", "team-a", "alice").returncode == 0
    assert ctl("permissions", "list-topic", "--json").stdout.strip() == "[]"
    gone = ctl("permissions", "clear-topic", "-p", "team-a", "alice")
    assert gone.returncode == 1 and "no topic permission" in gone.stderr
    nobody = ctl("permissions", "set", "-p", "team-a", "nobody")
    assert nobody.returncode == 1 and "no user 'nobody'" in nobody.stderr
    assert ctl("permissions", "set", "-p", "team-a", "CN=dev1", "--force").returncode == 0
    assert ctl("permissions", "clear", "-p", "team-a", "CN=dev1").returncode == 0

    declared = ctl("vhosts", "delete", "/")
    assert declared.returncode == 1 and "cannot be deleted" in declared.stderr
    assert ctl("vhosts", "delete", "team-a").stdout.strip() == "vhost 'team-a' deleted"
    left = json.loads(ctl("permissions", "list", "--json").stdout)
    assert [(p["vhost"], p["user"]) for p in left] == [("/", "guest")]  # a fresh install's
    assert ctl("vhosts", "add", "team-b", "--user", "alice").returncode == 0
    rows = [line.split() for line in ctl("permissions", "list", "-p", "team-b").stdout.splitlines()]
    assert rows[1:] == [["team-b", "alice", ".*", ".*", ".*"]]  # made for alice: hers, nobody else's
    assert ctl("vhosts", "delete", "team-b").returncode == 0


def test_webhooks_list(ctl: Callable[..., subprocess.CompletedProcess[str]], mqtt: Endpoints) -> None:
    client = connect(mqtt, "shell-hook", version=V5)  # one client.connected event for the endpoint
    client.client.loop_stop()

    def listed() -> list[dict[str, Any]]:
        result = ctl("webhooks", "list", "--json")
        assert result.returncode == 0, result.stderr
        items: list[dict[str, Any]] = json.loads(result.stdout)
        return items

    wait_for(lambda: not listed()[0]["healthy"])
    (hook,) = listed()
    assert hook["name"] == "webhook-0" and hook["url"] == WEBHOOK_URL.removesuffix("hook") + "…"
    assert hook["events"] == ["client.connected"] and "cannot connect" in hook["last_error"]
    result = ctl("webhooks", "list")
    assert result.returncode == 0, result.stderr
    header, row = result.stdout.splitlines()
    assert header.split()[:4] == ["NAME", "URL", "STATE", "BREAKER"]
    assert row.startswith("webhook-0") and "failing (" in row and "cannot connect" in row and "never" in row


def test_bridges_list_show_restart(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with bridged_with_admin(tmp_path, TOKEN, ["# out 1 edge/ cloud/"]) as (server, port):
        ctl = in_process(server, tmp_path, monkeypatch)
        listing = ctl("bridges")  # alone: the list
        assert listing.returncode == 0, listing.stderr
        header, row = listing.stdout.splitlines()
        assert header.split() == ["NAME", "KIND", "STATE", "ADDRESS", "SENT", "RECEIVED", "BACKLOG", "BYTES"]
        name, kind, state, _for, _seconds, address, sent, received, backlog = row.split()
        assert (name, kind, state, address) == ("cloud", "bridge", "connected", f"127.0.0.1:{port}")
        assert (sent, received, backlog) == ("0", "0", "0")
        assert ctl("bridges", "list").stdout == listing.stdout
        (listed,) = json.loads(ctl("bridges", "list", "--json").stdout)
        assert listed["client_id"] == "trimaran.cloud" and listed["connects"] == 1

        shown = ctl("bridges", "show", "cloud")
        assert shown.returncode == 0, shown.stderr
        lines = dict(line.split(None, 1) for line in shown.stdout.splitlines())
        assert lines["state"] == "connected" and lines["queue"] == "$bridge.cloud"
        assert lines["protocol_version"] == "mqttv311" and lines["last_error"] == "-"
        assert json.loads(lines["topics"]) == ["# out 1 edge/ cloud/"]

        restarted = ctl("bridges", "restart", "cloud")
        assert (restarted.returncode, restarted.stdout) == (0, "bridge 'cloud' reconnecting\n")
        assert server.wait_for_log_count("bridge cloud: connected", 2), server.output()

        for action in ("show", "restart"):
            missing = ctl("bridges", action, "nowhere")
            assert (missing.returncode, missing.stderr) == (1, "trimaran: no bridge 'nowhere' (404)\n")
        assert ctl("bridges", "show").returncode == 2  # no name: a usage error


# -- a tenant's queues, sessions and clients, as its clients name them (-p VHOST) -----------------------


def rows_of(result: subprocess.CompletedProcess[str]) -> list[list[str]]:
    assert result.returncode == 0, result.stderr
    assert "$vhost" not in result.stdout  # the internal spelling never shows
    return [line.split() for line in result.stdout.splitlines()[1:]]


def test_queues_in_a_vhost(
    ctl: Callable[..., subprocess.CompletedProcess[str]], server: RunningServer
) -> None:
    assert ctl("vhosts", "add", "t-ops").returncode == 0
    try:
        for vhost, count in (("t-ops", 2), ("/", 1)):
            query = f"?vhost={quote(vhost, safe='')}"
            status, _, body = request(server, "POST", f"/api/v1/queues{query}", {"name": "orders"})
            assert status == 201 and (body["name"], body["vhost"]) == ("orders", vhost)
            for n in range(count):
                status, _, body = request(
                    server, "POST", f"/api/v1/publish{query}", {"topic": "$queue/orders", "payload": f"{n}"}
                )
                assert status == 200 and (body["queue"], body["message_id"]) == ("orders", f"orders:{n}")
        listed = [row[:4] for row in rows_of(ctl("queues", "list")) if row[0] == "orders"]
        assert sorted(listed) == [["orders", "/", "work", "1"], ["orders", "t-ops", "work", "2"]]
        assert [row[:2] for row in rows_of(ctl("queues", "list", "-p", "t-ops"))] == [["orders", "t-ops"]]
        shown = json.loads(ctl("queues", "show", "orders", "-p", "t-ops", "--json").stdout)
        assert (shown["name"], shown["vhost"], shown["depth"]) == ("orders", "t-ops", 2)
        assert shown["dlq"] == "$dlq/orders"  # its dead letters, named as its clients name them
        peek = ctl("queues", "peek", "orders", "--vhost", "t-ops")
        assert [row[:2] for row in rows_of(peek)] == [["0", "$queue/orders"], ["1", "$queue/orders"]]
        purged = ctl("queues", "purge", "orders", "-p", "t-ops")
        assert purged.stdout == "purged 2 messages from queue 'orders' in vhost 't-ops'\n"
        assert json.loads(ctl("queues", "show", "orders", "--json").stdout)["depth"] == 1  # '/' untouched
        missing = ctl("queues", "show", "orders", "-p", "t-nowhere")
        assert missing.returncode == 1
        assert missing.stderr == "trimaran: queue 'orders' in vhost 't-nowhere' does not exist (404)\n"
        # The internal spelling is not a way in: the vhost is a parameter of its own.
        status, _, body = request(server, "GET", "/api/v1/queues/%24vhost%2Ft-ops%2Forders")
        assert status == 400 and body["error"]["code"] == "bad_name"
        assert ctl("queues", "delete", "orders", "-p", "t-ops").returncode == 0
        assert [row for row in rows_of(ctl("queues", "list", "-p", "t-ops"))] == []
        assert ctl("queues", "delete", "orders").returncode == 0
    finally:
        ctl("vhosts", "delete", "t-ops")


def test_sessions_and_clients_in_a_vhost(
    ctl: Callable[..., subprocess.CompletedProcess[str]], server: RunningServer, mqtt: Endpoints
) -> None:
    from tests.support.paho import PacketTypes, props

    assert ctl("vhosts", "add", "t-ops").returncode == 0
    assert ctl("permissions", "set", "-p", "t-ops", "alice").returncode == 0
    keep = props(PacketTypes.CONNECT, SessionExpiryInterval=300)
    tenant = {"username": "t-ops:alice", "password": "wonderland"}
    mine = connect(mqtt, "ops-keeper", version=V5, clean=False, properties=keep)  # the same id in '/'
    theirs = connect(mqtt, "ops-keeper", version=V5, clean=False, properties=keep, **tenant)
    live = connect(mqtt, "ops-live", version=V5, **tenant)
    try:
        theirs.subscribe("plant/#", qos=1)
        theirs.disconnect()
        wait_for(lambda: ["ops-keeper", "t-ops", "no"] in [r[:3] for r in rows_of(ctl("sessions", "list"))])
        listed = [row[:3] for row in rows_of(ctl("sessions", "list")) if row[0] == "ops-keeper"]
        assert sorted(listed) == [["ops-keeper", "/", "yes"], ["ops-keeper", "t-ops", "no"]]
        in_tenant = sorted(row[:2] for row in rows_of(ctl("sessions", "list", "-p", "t-ops")))
        assert in_tenant == [["ops-keeper", "t-ops"], ["ops-live", "t-ops"]]
        shown = json.loads(ctl("sessions", "show", "ops-keeper", "-p", "t-ops", "--json").stdout)
        assert (shown["client_id"], shown["vhost"], shown["connected"]) == ("ops-keeper", "t-ops", False)
        assert [s["topic_filter"] for s in shown["subscriptions"]] == ["plant/#"]
        _, _, body = request(server, "GET", "/api/v1/subscriptions?vhost=t-ops")
        assert [(s["client_id"], s["vhost"], s["topic_filter"]) for s in body["items"]] == [
            ("ops-keeper", "t-ops", "plant/#")
        ]
        clients = rows_of(ctl("clients", "list", "-p", "t-ops"))
        assert [row[1:3] for row in clients] == [["ops-live", "t-ops"]]
        refused = ctl("clients", "kick", "ops-live")  # no such client in '/'
        assert refused.returncode == 1
        assert refused.stderr == "trimaran: no connected client 'ops-live' in vhost '/' (404)\n"
        kicked = ctl("clients", "kick", "ops-live", "-p", "t-ops")
        assert kicked.stdout == "client 'ops-live' in vhost 't-ops' disconnected\n"
        assert live.disconnects.get(timeout=5)[0].value == 0x98
        deleted = ctl("sessions", "delete", "ops-keeper", "-p", "t-ops")
        assert deleted.stdout == "session 'ops-keeper' in vhost 't-ops' deleted\n"
        assert ctl("sessions", "show", "ops-keeper", "-p", "t-ops").returncode == 1
        assert json.loads(ctl("sessions", "show", "ops-keeper", "--json").stdout)["connected"] is True
    finally:
        mine.disconnect()
        live.client.loop_stop()
        ctl("sessions", "delete", "ops-keeper")
        ctl("vhosts", "delete", "t-ops")


def test_table_aligns_columns() -> None:
    text = table(
        [{"a": "x", "b": None}, {"a": "longer", "b": True}],
        [("A", lambda r: r["a"]), ("B", lambda r: r["b"])],
    )
    assert text.splitlines() == ["A       B", "x       -", "longer  yes"]
