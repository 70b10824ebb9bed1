"""The admin API over a real socket against ``trimaran serve``, with real paho clients.

Every response a test receives is checked against the server's own OpenAPI document (status
documented, body valid against the documented schema) by ``Api.call``; ``jsonschema`` (a dev
dependency) does the schema validation.
"""

from __future__ import annotations

import base64
import http.client
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import jsonschema
import pytest

from tests.bridges.test_mqtt_bridge import remote_client
from tests.support.bridges import bridged_with_admin
from tests.support.paho import V5, Endpoints, PacketTypes, connect, props
from tests.support.server import RunningServer, serving
from trimaran import compiled
from trimaran.app import App
from trimaran.config import Settings

TOKEN = "secret-token"
SERVER_ENV = {
    "TRIMARAN_HTTP__TOKENS": json.dumps(["other", TOKEN]),
    "TRIMARAN_HTTP__MAX_BODY_BYTES": "4096",
    "TRIMARAN_LIMITS__SYS_INTERVAL": "0",
    "TRIMARAN_TELEMETRY__PER_OBJECT_METRICS": "true",  # the queue series below are per queue
    # Users a permission may name (RabbitMQ refuses one for a user that exists nowhere).
    "TRIMARAN_AUTH__USERS": json.dumps([{"name": n, "password": n} for n in ("alice", "bob", "carol")]),
}
ARGS = ["--mqtt", "127.0.0.1:0", "--mqtt-ws", "off", "--amqp", "off", "--http", "127.0.0.1:0"]


class Api:
    """A tiny HTTP client that checks each answer against the server's OpenAPI document."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.doc: dict[str, Any] | None = None
        self.checked = 0
        self.doc = self.call("GET", "/api/v1/openapi.json")[1]

    def raw(
        self, method: str, path: str, body: bytes | None = None, headers: dict[str, str] | None = None
    ) -> tuple[int, dict[str, str], bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            conn.request(method, path, body=body, headers=headers or {})
            response = conn.getresponse()
            return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
        finally:
            conn.close()

    def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        token: str | None = TOKEN,
        raw_body: bytes | None = None,
    ) -> tuple[int, Any, dict[str, str]]:
        headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
        data = raw_body if raw_body is not None else (json.dumps(body).encode() if body is not None else None)
        if data is not None:
            headers["Content-Type"] = "application/json"
        status, response_headers, content = self.raw(method, path, data, headers)
        ctype = response_headers.get("content-type", "")
        parsed: Any = json.loads(content) if ctype.startswith("application/json") else content.decode()
        if self.doc is not None:
            self.check(method, path, status, parsed, ctype)
        return status, parsed, response_headers

    def check(self, method: str, path: str, status: int, body: Any, ctype: str) -> None:
        """The answer's status is documented for this operation and its body fits the schema."""
        assert self.doc is not None
        operation = self.operation(method, path.split("?")[0])
        if operation is None:
            assert status in (404, 405), (method, path, status)
            assert set(body) == {"error"}
            return
        documented = operation["responses"]
        assert str(status) in documented, f"{method} {path} answered {status}, not documented"
        content = documented[str(status)].get("content", {})
        assert ctype.split(";")[0] in {c.split(";")[0] for c in content}, (method, path, ctype)
        media = content.get("application/json")
        if media is not None:
            schema = {**media["schema"], "components": self.doc["components"]}
            jsonschema.validate(body, schema, cls=jsonschema.Draft202012Validator)
        self.checked += 1

    def operation(self, method: str, path: str) -> dict[str, Any] | None:
        assert self.doc is not None
        segments = [s for s in path.split("/") if s]
        for template, operations in self.doc["paths"].items():
            pattern = [s for s in template.split("/") if s]
            if len(pattern) == len(segments) and all(
                p.startswith("{") or p == s for p, s in zip(pattern, segments, strict=True)
            ):
                found = operations.get(method.lower())
                if found is not None:
                    return dict(found)
        return None


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    running = RunningServer(ARGS, cwd=tmp_path_factory.mktemp("admin"), env=SERVER_ENV).start()
    try:
        yield running
    finally:
        assert running.stop() == 0, running.output()


@pytest.fixture(scope="module")
def api(server: RunningServer) -> Api:
    return Api(server.ports["http"])


@pytest.fixture(scope="module")
def mqtt(server: RunningServer) -> Endpoints:
    return Endpoints("127.0.0.1", server.ports["mqtt"])


def q(name: str) -> str:
    return quote(name, safe="")


def wait_for(predicate: Any, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


# -- auth -------------------------------------------------------------------------------------------


def test_the_status_says_which_build_runs(api: Api) -> None:
    """The server runs this checkout in this environment: compiled where a whole current build is."""
    build = "compiled" if compiled.why_interpreted() is None else "source"
    assert api.call("GET", "/api/v1/overview")[1]["build"] == build
    assert api.call("GET", "/healthz", token=None)[1]["build"] == build


def test_auth_refused_without_or_with_a_wrong_token(api: Api, server: RunningServer) -> None:
    status, body, headers = api.call("GET", "/api/v1/overview", token=None)
    assert status == 401 and body["error"]["code"] == "unauthorized"
    assert headers["www-authenticate"].startswith("Bearer")
    status, body, headers = api.call("GET", "/api/v1/queues", token="wrong")
    assert status == 401 and 'error="invalid_token"' in headers["www-authenticate"]
    status, _, _ = api.call("GET", "/api/v1/overview", token="secret-token-but-longer")
    assert status == 401
    status = api.raw("GET", "/api/v1/overview", headers={"Authorization": f"Basic {TOKEN}"})[0]
    assert status == 401
    # Both configured tokens work; the open routes need none.
    assert api.call("GET", "/api/v1/overview", token="other")[0] == 200
    assert api.call("GET", "/healthz", token=None)[0] == 200
    assert api.call("GET", "/readyz", token=None)[0] == 200
    assert api.call("GET", "/metrics", token=None)[0] == 200
    assert "admin API is locked" not in server.output()


def test_no_tokens_locks_the_api(tmp_path: Path) -> None:
    running = RunningServer(ARGS, cwd=tmp_path, env={"TRIMARAN_HTTP__TOKENS": "[]"}).start()
    try:
        locked = Api.__new__(Api)
        locked.port, locked.doc, locked.checked = running.ports["http"], None, 0
        status, body, headers = locked.call("GET", "/api/v1/overview", token="anything")
        assert status == 401 and body["error"]["code"] == "locked"
        assert "www-authenticate" in headers
        assert locked.call("GET", "/api/v1/openapi.json", token=None)[0] == 401
        assert locked.call("GET", "/healthz", token=None)[0] == 200
        assert locked.call("GET", "/metrics", token=None)[0] == 200
        assert running.output().count("admin API is locked") == 1
    finally:
        assert running.stop() == 0


# -- the OpenAPI document ------------------------------------------------------------------------


def test_openapi_lists_exactly_the_served_routes(api: Api) -> None:
    assert api.doc is not None
    assert api.doc["openapi"].startswith("3.1")
    documented = {(m.upper(), path) for path, ops in api.doc["paths"].items() for m in ops}
    routes = App(Settings()).http.routes
    served = {(r.method, "/" + "/".join(r.segments)) for r in routes if r.segments[:1] != ("ui",)}  # the page
    assert documented == served
    jsonschema.Draft202012Validator.check_schema({"$defs": api.doc["components"]["schemas"]})
    # Operations with a body document 400 and 413; authenticated ones 401.
    publish = api.doc["paths"]["/api/v1/publish"]["post"]
    assert {"200", "400", "401", "413"} <= set(publish["responses"])
    assert api.doc["paths"]["/healthz"]["get"]["security"] == []


def test_errors(api: Api) -> None:
    status, body, _ = api.call("GET", "/api/v1/queues/nope")
    assert status == 404 and body["error"]["code"] == "no_queue"
    for method, path in [("GET", "/api/v1/clients/mqtt-999"), ("DELETE", "/api/v1/clients/mqtt-999")]:
        status, body, _ = api.call(method, path)
        assert status == 404 and body["error"]["code"] == "no_client"
    assert api.call("DELETE", "/api/v1/sessions/ghost")[0] == 404
    assert api.call("POST", "/api/v1/queues/nope/purge")[0] == 404
    assert api.call("GET", "/api/v1/nothing-here")[0] == 404
    status, body, _ = api.call("PUT", "/api/v1/queues")
    assert status == 405 and body["error"]["code"] == "method_not_allowed"
    status, body, _ = api.call("POST", "/api/v1/publish", raw_body=b"{not json")
    assert status == 400 and body["error"]["code"] == "bad_json"
    status, body, _ = api.call("POST", "/api/v1/publish", {"topic": "a", "qos": 7})
    assert status == 400 and "qos" in body["error"]["message"]
    status, body, _ = api.call("POST", "/api/v1/publish", {"topic": "a", "surprise": 1})
    assert status == 400
    assert api.call("POST", "/api/v1/publish")[0] == 400  # no body at all
    assert api.call("POST", "/api/v1/publish", {"topic": "a/+"})[0] == 400
    assert (
        api.call("POST", "/api/v1/publish", {"topic": "a", "payload": "%%", "encoding": "base64"})[0] == 400
    )
    assert api.call("POST", "/api/v1/queues", {"name": "bad/name"})[0] == 400
    assert api.call("POST", "/api/v1/queues", {"name": "x", "mode": "sideways"})[0] == 400
    status, body, _ = api.call("POST", "/api/v1/publish", {"topic": "a", "payload": "x" * 5000})
    assert status == 413 and body["error"]["code"] == "too_large"
    assert api.call("GET", "/api/v1/queues?limit=0")[0] == 400
    assert api.call("GET", "/api/v1/queues?limit=ten")[0] == 400
    assert api.call("GET", "/api/v1/queues?cursor=!!!")[0] == 400


# -- pagination ---------------------------------------------------------------------------------


def test_pagination_follows_next_links(api: Api) -> None:
    names = [f"page-{i}" for i in range(5)]
    for name in names:
        status, body, _ = api.call("POST", "/api/v1/queues", {"name": name})
        assert status == 201 and body["name"] == name
    assert api.call("POST", "/api/v1/queues", {"name": "page-0"})[0] == 200  # exists: 200
    seen: list[str] = []
    path: str | None = "/api/v1/queues?limit=2"
    pages = 0
    while path is not None:
        status, body, _ = api.call("GET", path)
        assert status == 200 and len(body["items"]) <= 2
        seen += [item["name"] for item in body["items"]]
        path = body["next"]
        assert (path is None) == (body["next_cursor"] is None)
        pages += 1
    assert [n for n in seen if n.startswith("page-")] == names
    assert seen == sorted(seen) and len(seen) == len(set(seen))
    assert pages >= 3


# -- clients, sessions, subscriptions ----------------------------------------------------------------


def test_kick_a_real_paho_client(api: Api, mqtt: Endpoints) -> None:
    client = connect(mqtt, "kick-me", version=V5)
    try:
        status, body, _ = api.call("GET", "/api/v1/clients?protocol=mqtt")
        mine = [c for c in body["items"] if c["client_id"] == "kick-me"]
        assert status == 200 and len(mine) == 1
        assert mine[0]["protocol"] == "mqtt" and mine[0]["address"].startswith("127.0.0.1")
        key = mine[0]["id"]
        assert api.call("GET", f"/api/v1/clients/{key}")[1]["client_id"] == "kick-me"
        overview = api.call("GET", "/api/v1/overview")[1]
        assert overview["connections"]["mqtt"] >= 1
        status, body, _ = api.call("DELETE", f"/api/v1/clients/{key}")
        assert status == 200 and body["ok"]
        reason, _props = client.disconnects.get(timeout=5)
        assert reason.value == 0x98  # administrative action
        wait_for(lambda: api.call("GET", f"/api/v1/clients/{key}")[0] == 404)
    finally:
        client.client.loop_stop()


def test_sessions_and_subscriptions(api: Api, mqtt: Endpoints) -> None:
    keeper = connect(
        mqtt,
        "keeper",
        version=V5,
        clean=False,
        properties=props(PacketTypes.CONNECT, SessionExpiryInterval=300),
    )
    keeper.subscribe("sensors/+/temp", qos=1)
    keeper.subscribe("alerts/#", qos=0)
    status, body, _ = api.call("GET", "/api/v1/sessions/keeper")
    assert status == 200 and body["connected"] and body["expiry_interval_s"] == 300
    assert {s["topic_filter"] for s in body["subscriptions"]} == {"sensors/+/temp", "alerts/#"}
    keeper.disconnect()
    wait_for(lambda: api.call("GET", "/api/v1/sessions/keeper")[1]["connected"] is False)
    offline = api.call("GET", "/api/v1/sessions?connected=false")[1]["items"]
    assert "keeper" in [s["client_id"] for s in offline]

    status, body, _ = api.call("GET", "/api/v1/subscriptions?client=keeper")
    assert sorted(s["topic_filter"] for s in body["items"]) == ["alerts/#", "sensors/+/temp"]
    status, body, _ = api.call("GET", f"/api/v1/subscriptions?filter={q('sensors/+/temp')}")
    assert [(s["client_id"], s["qos"]) for s in body["items"]] == [("keeper", 1)]
    first = api.call("GET", "/api/v1/subscriptions?client=keeper&limit=1")[1]
    second = api.call("GET", first["next"])[1]
    assert len(first["items"]) == len(second["items"]) == 1 and second["next"] is None

    status, body, _ = api.call("DELETE", "/api/v1/sessions/keeper")
    assert status == 200
    assert api.call("GET", "/api/v1/sessions/keeper")[0] == 404
    assert api.call("GET", "/api/v1/subscriptions?client=keeper")[1]["items"] == []


def test_delete_a_connected_session(api: Api, mqtt: Endpoints) -> None:
    client = connect(
        mqtt,
        "live",
        version=V5,
        clean=False,
        properties=props(PacketTypes.CONNECT, SessionExpiryInterval=300),
    )
    try:
        client.subscribe("live/x")
        assert api.call("DELETE", "/api/v1/sessions/live")[0] == 200
        reason, _ = client.disconnects.get(timeout=5)
        assert reason.value == 0x98
        assert api.call("GET", "/api/v1/sessions/live")[0] == 404
    finally:
        client.client.loop_stop()


# -- publish ------------------------------------------------------------------------------------


def test_publish_reaches_a_real_paho_subscriber(api: Api, mqtt: Endpoints) -> None:
    sub = connect(mqtt, "listener", version=V5)
    try:
        sub.subscribe("api/#", qos=1)
        status, body, _ = api.call(
            "POST",
            "/api/v1/publish",
            {
                "topic": "api/text",
                "payload": "héllo",
                "qos": 1,
                "properties": {"content_type": "text/plain", "user_properties": [["k", "v"]]},
            },
        )
        assert status == 200 and body["delivered"] == 1
        got = sub.expect()
        assert (got.topic, got.payload, got.qos) == ("api/text", "héllo".encode(), 1)
        assert got.properties.ContentType == "text/plain"
        assert got.properties.UserProperty == [("k", "v")]
        raw = bytes(range(256))
        payload = base64.b64encode(raw).decode()
        body = {"topic": "api/bin", "payload": payload, "encoding": "base64", "retain": True}
        assert api.call("POST", "/api/v1/publish", body)[0] == 200
        assert sub.expect().payload == raw
        assert api.call("POST", "/api/v1/publish", {"topic": "$SYS/x"})[0] == 400
        assert api.call("POST", "/api/v1/publish", {"topic": "api/bin", "retain": True})[0] == 200  # clears
        assert sub.expect().payload == b""
    finally:
        sub.disconnect()


# -- queues -------------------------------------------------------------------------------------


def test_queue_peek_dead_letter_and_redrive(api: Api, mqtt: Endpoints) -> None:
    policy = {"name": "jobs", "max_attempts": 1, "backoff_initial_s": 0}
    assert api.call("POST", "/api/v1/queues", policy)[0] == 201
    for i in range(3):
        status, body, _ = api.call("POST", "/api/v1/publish", {"topic": "$queue/jobs", "payload": f"job{i}"})
        assert status == 200 and body["message_id"] == f"jobs:{i}"
    binary = base64.b64encode(b"\xff\x00").decode()
    api.call("POST", "/api/v1/publish", {"topic": "$queue/jobs", "payload": binary, "encoding": "base64"})

    page = api.call("GET", "/api/v1/queues/jobs/messages?limit=2")[1]
    assert [m["payload"] for m in page["items"]] == ["job0", "job1"]
    rest = api.call("GET", page["next"])[1]
    assert [m["encoding"] for m in rest["items"]] == ["text", "base64"]
    assert base64.b64decode(rest["items"][1]["payload"]) == b"\xff\x00"
    forced = api.call("GET", "/api/v1/queues/jobs/messages?encoding=base64&limit=1")[1]["items"][0]
    assert base64.b64decode(forced["payload"]) == b"job0"
    shown = api.call("GET", "/api/v1/queues/jobs")[1]
    assert shown["depth"] == 4 and shown["policy"]["max_attempts"] == 1  # peeking consumed nothing

    worker = connect(mqtt, "worker", version=V5, manual_ack=True)
    try:
        worker.subscribe("$queue/jobs", qos=1)
        first = worker.expect()
        message_id = dict(first.properties.UserProperty)["x-queue-message-id"]
        worker.publish(
            "$queue/jobs/$reject",
            b"",
            qos=1,
            properties=props(PacketTypes.PUBLISH, UserProperty=[("message-id", message_id)]),
        )
        wait_for(lambda: api.call("GET", "/api/v1/queues/jobs")[1]["dlq_depth"] == 1)
        listed = {x["name"]: x for x in api.call("GET", "/api/v1/queues")[1]["items"]}
        assert listed["jobs"]["dlq"] == "$dlq/jobs" and listed["jobs"]["dlq_depth"] == 1
        assert listed["jobs"]["groups"][0]["consumers"] == 1
        letters = api.call("GET", f"/api/v1/queues/{q('$dlq/jobs')}/messages")[1]["items"]
        assert [m["payload"] for m in letters] == ["job0"]
        assert ["x-dead-letter-queue", "jobs"] in letters[0]["user_properties"]

        status, body, _ = api.call("POST", "/api/v1/queues/jobs/redrive")
        assert status == 200 and body == {"count": 1}
        assert api.call("GET", "/api/v1/queues/jobs")[1]["dlq_depth"] == 0
        # The worker still holds job1..3 unacked; the redriven job0 arrives after them.
        payloads = [m.payload for m in worker.drain(4)]
        assert payloads[-1] == b"job0" and b"job0" not in payloads[:-1]
    finally:
        worker.disconnect()
    for i in range(2):
        api.call("POST", "/api/v1/publish", {"topic": "$queue/jobs", "payload": f"later{i}"})
    depth = api.call("GET", "/api/v1/queues/jobs")[1]["depth"]
    status, body, _ = api.call("POST", "/api/v1/queues/jobs/purge")
    assert status == 200 and body["count"] == depth >= 2
    assert api.call("GET", "/api/v1/queues/jobs")[1]["depth"] == 0
    assert api.call("DELETE", "/api/v1/queues/jobs")[0] == 200
    assert api.call("GET", "/api/v1/queues/jobs")[0] == 404


@pytest.mark.postgres
def test_queue_peek_reads_a_shared_work_queue(tmp_path: Path, postgres_url: str) -> None:
    """With ``queues.shared`` a node holds only its claims: the peek reads the stored rows, in
    offset order, paged, without what a consumer acked, claiming and delivering nothing."""
    env = {**SERVER_ENV, "TRIMARAN_STORAGE__URL": postgres_url, "TRIMARAN_QUEUES__SHARED": "true"}
    with serving(RunningServer(ARGS, cwd=tmp_path, env=env).start()) as server:
        api = Api(server.ports["http"])
        assert api.call("POST", "/api/v1/queues", {"name": "jobs"})[0] == 201
        for i in range(3):
            api.call("POST", "/api/v1/publish", {"topic": "$queue/jobs", "payload": f"job{i}"})

        def peek(path: str = "/api/v1/queues/jobs/messages") -> tuple[list[str], str | None]:
            status, page, _ = api.call("GET", path)
            assert status == 200, page
            return [m["payload"] for m in page["items"]], page["next"]

        first, more = peek("/api/v1/queues/jobs/messages?limit=2")
        assert first == ["job0", "job1"] and more is not None
        assert peek(more) == (["job2"], None)
        assert peek() == (["job0", "job1", "job2"], None)  # peeking took nothing

        worker = connect(Endpoints("127.0.0.1", server.ports["mqtt"]), "worker", version=V5, manual_ack=True)
        try:
            worker.subscribe("$queue/jobs", qos=1)
            got = worker.drain(3)
            assert [m.payload for m in got] == [b"job0", b"job1", b"job2"]
            assert not any(m.dup for m in got)  # first deliveries: the peeks delivered nothing
            assert peek()[0] == ["job0", "job1", "job2"]  # held, not finished
            message_id = dict(got[0].properties.UserProperty)["x-queue-message-id"]
            worker.publish(
                "$queue/jobs/$ack",
                b"",
                qos=1,
                properties=props(PacketTypes.PUBLISH, UserProperty=[("message-id", message_id)]),
            )
            wait_for(lambda: peek()[0] == ["job1", "job2"])
        finally:
            worker.disconnect()


def test_metrics_after_traffic(api: Api, mqtt: Endpoints) -> None:
    client = connect(mqtt, "metered", version=V5)
    try:
        client.subscribe("m/#")
        client.publish("m/1", b"x" * 100)
        client.expect()
        api.call("POST", "/api/v1/queues", {"name": "metered", "max_attempts": 1})
        api.call("POST", "/api/v1/publish", {"topic": "$queue/metered", "payload": "p"})
        holder = connect(mqtt, "holder", version=V5, manual_ack=True)
        holder.subscribe("$queue/metered", qos=1)
        holder.expect()  # delivered, not acknowledged
        status, text, headers = api.call("GET", "/metrics", token=None)
        holder.disconnect()
    finally:
        client.disconnect()
    assert status == 200 and headers["content-type"].startswith("text/plain; version=0.0.4")
    samples = {}  # prometheus_client writes labels sorted by name
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            samples[name] = float(value)
    assert samples["trimaran_messages_received_total"] >= 2
    assert samples["trimaran_messages_sent_total"] >= 1
    assert samples["trimaran_received_bytes_total"] > 100
    assert samples['trimaran_connections{protocol="mqtt"}'] >= 1
    assert samples['trimaran_queue_messages_total{event="published",queue="metered",vhost="/"}'] == 1
    assert samples['trimaran_queue_depth{queue="metered",vhost="/"}'] == 1
    assert samples["trimaran_storage_commit_seconds_count"] >= 1
    assert samples['trimaran_storage_commit_seconds_bucket{le="+Inf"}'] >= 1
    assert samples["trimaran_storage_commit_rows_sum"] >= 1
    assert samples['trimaran_queue_messages_total{event="delivered",queue="metered",vhost="/"}'] == 1
    assert samples['trimaran_queue_pending{group="$default",queue="metered",vhost="/"}'] == 1
    assert samples['trimaran_queue_lag{group="$default",queue="metered",vhost="/"}'] == 1
    assert samples['trimaran_queue_consumers{group="$default",queue="metered",vhost="/"}'] == 1


def test_webhooks_without_endpoints_is_an_empty_list(api: Api) -> None:
    status, page, _ = api.call("GET", "/api/v1/webhooks")
    assert status == 200 and page == {"items": [], "next_cursor": None, "next": None}


def test_limits_set_at_run_time_bite_at_once_and_go_when_cleared(api: Api, mqtt: Endpoints) -> None:
    status, limits, _ = api.call("GET", "/api/v1/limits")
    assert status == 200 and limits["default_user"]["max_messages_per_s"] == 0
    status, limits, _ = api.call("PUT", f"/api/v1/limits/vhosts/{q('/')}", {"max_connections": 1})
    assert status == 200 and limits["vhosts"]["/"]["max_connections"] == 1
    first = connect(mqtt, "limited-1", version=V5)
    try:
        refused = connect(mqtt, "limited-2", version=V5, expect_success=False)
        _flags, reason, _props = refused.connack.get(timeout=5)
        assert reason.value == 0x97  # Quota exceeded
        refused.disconnect()
        status, limits, _ = api.call("GET", "/api/v1/limits")
        assert limits["vhosts"]["/"]["connections"] == 1
        assert {"vhost": "/", "limit": "connections", "count": 1} in limits["bites"]
        assert api.call("DELETE", f"/api/v1/limits/vhosts/{q('/')}")[0] == 200
        connect(mqtt, "limited-2", version=V5).disconnect()
    finally:
        first.disconnect()
    assert api.call("DELETE", f"/api/v1/limits/vhosts/{q('/')}")[0] == 404
    assert api.call("PUT", "/api/v1/limits/vhosts/nowhere", {"max_queues": 1})[0] == 404
    body = {"max_connections": 5, "max_messages_per_s": 100.0, "max_bytes_per_s": 0}
    status, limits, _ = api.call("PUT", "/api/v1/limits/users/alice", body)
    assert status == 200 and limits["users"]["alice"] == {**body, "connections": 0}
    assert api.call("PUT", "/api/v1/limits/users/alice", {"max_connections": -1})[0] == 400
    assert api.call("PUT", "/api/v1/limits/default-user", {"max_bytes_per_s": 1e6})[0] == 200
    assert api.call("DELETE", "/api/v1/limits/users/alice")[0] == 200
    assert api.call("DELETE", "/api/v1/limits/users/alice")[0] == 404
    status, limits, _ = api.call("PUT", "/api/v1/limits/default-user", {})
    assert limits["users"] == {} and limits["default_user"]["max_bytes_per_s"] == 0


def test_vhosts_and_permissions_round_trip(api: Api) -> None:
    status, page, _ = api.call("GET", "/api/v1/vhosts")
    assert status == 200 and page["items"][0] == {"name": "/", "declared": True, "connections": 0}
    assert api.call("PUT", "/api/v1/vhosts/staging")[0] == 201
    assert api.call("PUT", "/api/v1/vhosts/staging")[0] == 200  # already there
    assert api.call("PUT", f"/api/v1/vhosts/{q('bad' + chr(1))}")[0] == 400
    names = [v["name"] for v in api.call("GET", "/api/v1/vhosts")[1]["items"]]
    assert names == ["/", "staging"]
    # A new vhost grants nothing: only guest's / (a fresh install's) is there.
    assert [(p["vhost"], p["user"]) for p in api.call("GET", "/api/v1/permissions")[1]["items"]] == [
        ("/", "guest")
    ]
    # RabbitMQ's no_such_user; a certificate identity no file names goes with ?force=true.
    status, refused, _ = api.call("PUT", "/api/v1/permissions/staging/nobody")
    assert status == 404 and refused["error"]["code"] == "no_such_user"
    assert api.call("PUT", "/api/v1/permissions/staging/CN=dev1?force=true")[0] == 200
    assert api.call("DELETE", "/api/v1/permissions/staging/CN=dev1")[0] == 200

    status, permission, _ = api.call("PUT", "/api/v1/permissions/staging/alice", {"read": "^orders"})
    assert status == 200
    assert permission == {
        "user": "alice",
        "vhost": "staging",
        "configure": ".*",
        "write": ".*",
        "read": "^orders",
    }
    assert api.call("PUT", "/api/v1/permissions/staging/bob")[0] == 200  # no body: RabbitMQ's ".*" x3
    assert api.call("PUT", "/api/v1/permissions/staging/carol", {"read": "("})[0] == 400
    assert api.call("PUT", "/api/v1/permissions/nowhere/alice")[0] == 404
    listed = api.call("GET", "/api/v1/permissions?vhost=staging")[1]["items"]
    assert [(p["vhost"], p["user"]) for p in listed] == [("staging", "alice"), ("staging", "bob")]
    assert api.call("DELETE", "/api/v1/permissions/staging/bob")[0] == 200
    assert api.call("DELETE", "/api/v1/permissions/staging/bob")[0] == 404

    # RabbitMQ's set_topic_permissions: keys per user, vhost and exchange.
    body = {"write": r"^{username}\.", "read": ".*"}
    status, topic, _ = api.call("PUT", "/api/v1/topic-permissions/staging/alice/amq.topic", body)
    assert status == 200
    assert topic == {"user": "alice", "vhost": "staging", "exchange": "amq.topic", **body}
    assert api.call("PUT", "/api/v1/topic-permissions/staging/alice/amq.topic", {"read": "("})[0] == 400
    assert api.call("PUT", "/api/v1/topic-permissions/staging/nobody/amq.topic")[0] == 404
    assert api.call("PUT", "/api/v1/topic-permissions/nowhere/alice/amq.topic")[0] == 404
    listed = api.call("GET", "/api/v1/topic-permissions?vhost=staging")[1]["items"]
    assert listed == [topic]
    assert api.call("DELETE", "/api/v1/topic-permissions/staging/alice/amq.topic")[0] == 200
    assert api.call("DELETE", "/api/v1/topic-permissions/staging/alice/amq.topic")[0] == 404

    assert api.call("DELETE", f"/api/v1/vhosts/{q('/')}")[0] == 409  # declared
    assert api.call("DELETE", "/api/v1/vhosts/staging")[0] == 200
    assert api.call("DELETE", "/api/v1/vhosts/staging")[0] == 404
    left = api.call("GET", "/api/v1/permissions")[1]["items"]
    assert [(p["vhost"], p["user"]) for p in left] == [("/", "guest")]  # alice's went with the vhost

    # A vhost made for a user grants that user .* .* .* on it (RabbitMQ's management), nobody else.
    assert api.call("PUT", "/api/v1/vhosts/made-for-bob?user=nobody")[0] == 404
    assert api.call("PUT", "/api/v1/vhosts/made-for-bob?user=bob")[0] == 201
    listed = api.call("GET", "/api/v1/permissions?vhost=made-for-bob")[1]["items"]
    assert listed == [
        {"user": "bob", "vhost": "made-for-bob", "configure": ".*", "write": ".*", "read": ".*"}
    ]
    assert api.call("DELETE", "/api/v1/vhosts/made-for-bob")[0] == 200


def test_bridges_listed_shown_metered_and_restarted(tmp_path: Path) -> None:
    """A bridge to a real Mosquitto: its figures in the list, the record and /metrics; a restart drops
    the connection and makes it again."""
    with bridged_with_admin(tmp_path, TOKEN, ["# out 1 edge/ cloud/"], SERVER_ENV) as (server, port):
        bridged = Api(server.ports["http"])

        def shown() -> Any:
            return bridged.call("GET", "/api/v1/bridges/cloud")[1]

        watcher = remote_client(port, "watcher")
        watcher.subscribe("cloud/#", 1)
        sensor = connect(Endpoints("127.0.0.1", server.ports["mqtt"]), "sensor", version=V5)
        try:
            sensor.publish("edge/t1", b"21.5", qos=1)
            assert watcher.expect().topic == "cloud/t1"
            wait_for(lambda: shown()["sent"] == 1)
            status, page, _ = bridged.call("GET", "/api/v1/bridges")
            assert status == 200 and page["next"] is None
            (cloud,) = page["items"]
            expected = {
                "name": "cloud",
                "address": f"127.0.0.1:{port}",
                "client_id": "trimaran.cloud",  # NODE_NAME.NAME
                "protocol_version": "mqttv311",
                "vhost": "/",
                "state": "connected",
                "last_error": None,
                "connects": 1,
                "received": 0,
                "in_flight": 0,
                "backlog_bytes": 0,
                "queue": "$bridge.cloud",
                "topics": ["# out 1 edge/ cloud/"],
            }
            assert {key: cloud[key] for key in expected} == expected and 0 <= cloud["state_for_s"] < 60
            assert bridged.call("GET", "/api/v1/bridges?vhost=t1")[1]["items"] == []
            # Its outbound queue is a queue like the others, named as the vhost's clients name it.
            assert bridged.call("GET", f"/api/v1/queues/{q('$bridge.cloud')}")[1]["depth"] == 0
            for method, path in [
                ("GET", "/api/v1/bridges/nowhere"),
                ("POST", "/api/v1/bridges/nowhere/restart"),
            ]:
                status, body, _ = bridged.call(method, path)
                assert status == 404 and body["error"]["code"] == "no_bridge"

            status, body, _ = bridged.call("POST", "/api/v1/bridges/reload")  # the same settings
            assert status == 200 and body == {"added": [], "removed": [], "changed": []}
            status, body, _ = bridged.call("POST", "/api/v1/bridges/cloud/restart")
            assert status == 202 and body == {"ok": True, "detail": "bridge 'cloud' reconnecting"}
            assert server.wait_for_log_count("bridge cloud: connected", 2), server.output()
            wait_for(lambda: shown()["connects"] == 2)
            assert shown()["state"] == "connected"
            sensor.publish("edge/t2", b"22.0", qos=1)
            assert watcher.expect().topic == "cloud/t2"  # over the new connection

            wait_for(lambda: shown()["sent"] == 2)
            text = bridged.call("GET", "/metrics", token=None)[1]
            metrics = dict(
                line.rsplit(" ", 1) for line in text.splitlines() if line.startswith("trimaran_bridge")
            )
            assert float(metrics['trimaran_bridge_up{bridge="cloud"}']) == 1
            assert float(metrics['trimaran_bridge_connects_total{bridge="cloud"}']) == 2
            assert float(metrics['trimaran_bridge_messages_total{bridge="cloud",direction="out"}']) == 2
            assert float(metrics['trimaran_bridge_backlog_bytes{bridge="cloud"}']) == 0
        finally:
            sensor.disconnect()
            watcher.disconnect()


def test_every_response_was_checked_against_the_document(api: Api) -> None:
    # Runs last in this module: the calls above went through Api.check.
    assert api.checked >= 50
