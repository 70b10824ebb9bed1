"""The admin API over a view of a server that is not the application: what admin/view.py's protocols
promise is all the API needs. Answers are checked against the API's own OpenAPI document."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anyio
import jsonschema
from pydantic import SecretStr

from trimaran.admin.api import AdminApi, openapi_document
from trimaran.admin.http import HttpServer, Request, Response
from trimaran.admin.telemetry import Telemetry
from trimaran.admin.view import (
    AdminView,
    BridgeStatus,
    NotReady,
    PermissionOps,
    QueueOps,
    Readiness,
    ServerCounts,
)
from trimaran.admin.webhooks import Webhooks
from trimaran.broker.clients import ClientRegistry
from trimaran.broker.events import EventBus
from trimaran.broker.message import Message
from trimaran.broker.router import Subscription
from trimaran.broker.sessions import SessionDirectory, SessionInfo, SessionSubscriptionInfo
from trimaran.config import HttpSettings, TelemetrySettings, WebhookEndpoint, WebhookSettings
from trimaran.queue.manager import PublishResult
from trimaran.tenant_limits import TenantLimits
from trimaran.vhosts import VHosts

TOKEN = "view-token"


class Directory:
    """A session directory with one offline session (what the MQTT hull would hold)."""

    def __init__(self) -> None:
        self.info = SessionInfo(
            client_id="sensor/7",
            connected=False,
            protocol_level=5,
            expiry_interval_s=3600,
            expires_in_s=1200.5,
            subscription_count=1,
            inflight=0,
            queued=4,
            dropped=1,
            subscriptions=(SessionSubscriptionInfo("alarms/#", 1, True, False, 2, 9),),
        )
        self.deleted: list[str] = []

    def session_count(self) -> int:
        return 0 if self.deleted else 1

    def sessions(self) -> list[SessionInfo]:
        return [] if self.deleted else [self.info]

    def session(self, client_id: str) -> SessionInfo | None:
        return self.info if client_id == self.info.client_id and not self.deleted else None

    def delete_session(self, client_id: str) -> bool:
        if self.session(client_id) is None:
            return False
        self.deleted.append(client_id)
        return True


class View:
    """A server still starting (NotReady) but for its sessions and webhooks."""

    def __init__(self, webhooks: Webhooks | None, directory: SessionDirectory | None) -> None:
        self._webhooks = webhooks
        self._directory = directory
        self.bridges: list[BridgeStatus] = []
        self.restarted: list[str] = []  # the bridges restart_bridge was asked for

    @property
    def node(self) -> str:
        return "fake"

    @property
    def started_at(self) -> float:
        return 1_700_000_000.0

    @property
    def webhooks(self) -> Webhooks | None:
        return self._webhooks

    async def readiness(self) -> Readiness:
        return Readiness(False, {"accepting": False})

    def counts(self) -> ServerCounts:
        raise NotReady("broker")

    def clients(self) -> ClientRegistry:
        raise NotReady("broker")

    def subscriptions(self) -> Iterator[Subscription[Any]]:
        raise NotReady("broker")

    def publish(self, message: Message) -> int:
        raise NotReady("broker")

    async def publish_to_queue(self, queue: str, message: Message, routing_key: str) -> PublishResult:
        raise NotReady("queues")

    def queue_ops(self) -> QueueOps:
        raise NotReady("queues")

    def session_directory(self) -> SessionDirectory:
        if self._directory is None:
            raise NotReady("sessions")
        return self._directory

    def tenant_limits(self) -> TenantLimits:
        raise NotReady("runtime")

    def vhost_registry(self) -> VHosts:
        raise NotReady("broker")

    def permission_ops(self) -> PermissionOps:
        raise NotReady("security")

    def reload_security(self) -> bool:
        raise NotReady("security")

    async def cluster_nodes(self) -> dict[str, Any] | None:
        return self.nodes

    def bridge_statuses(self) -> list[BridgeStatus]:
        return self.bridges

    def restart_bridge(self, name: str) -> bool:
        if all(bridge.name != name for bridge in self.bridges):
            return False
        self.restarted.append(name)
        return True

    async def reload_bridges(self) -> dict[str, list[str]] | None:
        return {"added": [], "removed": [], "changed": []}

    nodes: dict[str, Any] | None = None


def serve(view: AdminView) -> tuple[HttpServer, dict[str, Any]]:
    api = AdminApi(view, HttpSettings(tokens=[SecretStr(TOKEN)]), Telemetry(TelemetrySettings()))
    server = HttpServer()
    api.register(server)
    return server, openapi_document(api.routes)


def call(server: HttpServer, doc: dict[str, Any], method: str, path: str) -> tuple[int, Any]:
    """One request in process; the answer must be documented and fit its schema."""
    target, _, query = path.partition("?")
    request = Request(
        method,
        target,
        {k: [v] for k, v in (p.split("=", 1) for p in query.split("&") if p)},
        {"authorization": f"Bearer {TOKEN}"},
        b"",
    )
    response: Response = anyio.run(server.dispatch, request)
    body = json.loads(response.body)
    template = next(
        t
        for t in doc["paths"]
        if len(t.split("/")) == len(target.split("/"))
        and all(a == b or a.startswith("{") for a, b in zip(t.split("/"), target.split("/"), strict=True))
    )
    documented = doc["paths"][template][method.lower()]["responses"]
    assert str(response.status) in documented, (method, path, response.status)
    schema = documented[str(response.status)]["content"]["application/json"]["schema"]
    validator = jsonschema.Draft202012Validator
    jsonschema.validate(body, {**schema, "components": doc["components"]}, cls=validator)
    return response.status, body


def test_a_part_not_built_yet_answers_503_starting() -> None:
    server, doc = serve(View(None, None))
    for method, path in [
        ("GET", "/api/v1/overview"),
        ("GET", "/api/v1/clients"),
        ("GET", "/api/v1/sessions"),
        ("GET", "/api/v1/queues"),
        ("GET", "/api/v1/webhooks"),
        ("POST", "/api/v1/auth/reload"),
    ]:
        status, body = call(server, doc, method, path)
        assert (status, body["error"]["code"]) == (503, "starting"), (method, path)


def test_sessions_come_from_the_session_directory_alone() -> None:
    directory = Directory()
    server, doc = serve(View(None, directory))
    status, page = call(server, doc, "GET", "/api/v1/sessions?connected=false")
    assert status == 200 and [s["client_id"] for s in page["items"]] == ["sensor/7"]
    assert page["items"][0]["queued"] == 4 and page["items"][0]["expires_in_s"] == 1200.5
    assert call(server, doc, "GET", "/api/v1/sessions?connected=true")[1]["items"] == []
    status, one = call(server, doc, "GET", "/api/v1/sessions/sensor%2F7")
    assert status == 200 and one["subscriptions"][0]["topic_filter"] == "alarms/#"
    assert one["subscriptions"][0]["subscription_identifier"] == 9
    assert call(server, doc, "DELETE", "/api/v1/sessions/sensor%2F7")[0] == 200
    assert directory.deleted == ["sensor/7"]
    assert call(server, doc, "GET", "/api/v1/sessions/sensor%2F7")[0] == 404


def test_webhooks_list_each_endpoint_with_its_state() -> None:
    settings = WebhookSettings(
        endpoints=[
            WebhookEndpoint(url="https://hooks.example.com/services/T0/B0/s3cret?x=1", events=["queue.*"]),
            WebhookEndpoint(url="http://user:pw@127.0.0.1:9/", topics=["sensors/#"]),
        ]
    )
    hooks = Webhooks(settings, EventBus(), "fake")
    failing = hooks.dispatchers[0]
    failing.consecutive_failures, failing.failed, failing.dropped = 3, 3, 2
    failing.last_error, failing.last_error_ms = "HTTP 503", 1_700_000_001_000
    failing.breaker.state = "open"
    server, doc = serve(View(hooks, None))

    status, page = call(server, doc, "GET", "/api/v1/webhooks")
    assert status == 200 and page["next"] is None
    first, second = page["items"]
    assert first["name"] == "webhook-0" and first["url"] == "https://hooks.example.com/…"  # no secret path
    assert first["events"] == ["queue.*"] and not first["healthy"] and first["breaker"] == "open"
    assert (first["consecutive_failures"], first["last_error"]) == (3, "HTTP 503")
    assert first["last_error_at_ms"] == 1_700_000_001_000 and first["last_success_at_ms"] is None
    assert first["dropped"] == 2 and first["queue_size"] == settings.queue_size
    assert second["url"] == "http://127.0.0.1:9" and second["healthy"] and second["topics"] == ["sensors/#"]
    assert "pw" not in json.dumps(page)

    status, paged = call(server, doc, "GET", "/api/v1/webhooks?limit=1")
    assert [w["name"] for w in paged["items"]] == ["webhook-0"] and paged["next_cursor"]
    rest = call(server, doc, "GET", f"/api/v1/webhooks?limit=1&cursor={paged['next_cursor']}")[1]
    assert [w["name"] for w in rest["items"]] == ["webhook-1"]


def test_the_cluster_lists_its_nodes_and_a_node_alone_answers_404() -> None:
    view = View(None, None)
    server, doc = serve(view)
    status, body = call(server, doc, "GET", "/api/v1/cluster")
    assert (status, body["error"]["code"]) == (404, "not_found")
    node = {"address": "h", "started_at": 1, "last_heartbeat": 2, "routes": 3}
    view.nodes = {
        "node": "a",
        "forwarded": 5,
        "waiting": 0,
        "holding": False,
        "received": 6,
        "dropped": 0,
        "takeovers": 1,
        "nodes": [
            {"name": "a", "state": "alive", "self": True, **node},
            {"name": "b", "state": "dead", "self": False, **node},
        ],
    }
    status, body = call(server, doc, "GET", "/api/v1/cluster")
    assert status == 200 and [(n["name"], n["state"]) for n in body["nodes"]] == [
        ("a", "alive"),
        ("b", "dead"),
    ]


def bridge(name: str, vhost: str = "/", **figures: Any) -> BridgeStatus:
    values: dict[str, Any] = {
        "kind": "bridge",
        "address": "cloud.example:8883",
        "client_id": f"edge-1.{name}",
        "protocol_version": "mqttv50",
        "vhost": vhost,
        "state": "waiting",
        "state_for_s": 12.34567,
        "last_error": "cannot connect to cloud.example:8883: refused",
        "connects": 2,
        "sent": 10,
        "received": 4,
        "dropped": 1,
        "refused": 0,
        "in_flight": 0,
        "backlog_bytes": 512,
        "queue": f"$bridge.{name}",
        "topics": ("sensors/# out 1 edge/ cloud/",),
    }
    return BridgeStatus(name=name, **values | figures)


def test_bridges_come_from_the_view_alone() -> None:
    view = View(None, None)
    view.bridges = [bridge("uplink", "t1", state="connected", last_error=None), bridge("cloud")]
    server, doc = serve(view)
    status, page = call(server, doc, "GET", "/api/v1/bridges")
    assert status == 200 and [b["name"] for b in page["items"]] == ["cloud", "uplink"]  # by name
    cloud = page["items"][0]
    assert (cloud["state"], cloud["state_for_s"], cloud["backlog_bytes"]) == ("waiting", 12.346, 512)
    assert cloud["topics"] == ["sensors/# out 1 edge/ cloud/"] and cloud["queue"] == "$bridge.cloud"
    only = call(server, doc, "GET", "/api/v1/bridges?vhost=t1")[1]["items"]
    assert [b["name"] for b in only] == ["uplink"]
    status, one = call(server, doc, "GET", "/api/v1/bridges/uplink")
    assert status == 200 and one["state"] == "connected" and one["last_error"] is None
    status, body = call(server, doc, "GET", "/api/v1/bridges/nowhere")
    assert (status, body["error"]["code"]) == (404, "no_bridge")
    status, body = call(server, doc, "POST", "/api/v1/bridges/cloud/restart")
    assert status == 202 and body["ok"] and view.restarted == ["cloud"]
    status, body = call(server, doc, "POST", "/api/v1/bridges/nowhere/restart")
    assert (status, body["error"]["code"]) == (404, "no_bridge") and view.restarted == ["cloud"]
