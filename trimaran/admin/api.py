"""The admin HTTP API: one route table serves the requests and generates the OpenAPI document.

Each :class:`ApiRoute` names its method, path, summary, query parameters, request body model and
response models once; :meth:`AdminApi.register` puts the routes on the :class:`HttpServer` (with the
bearer-token check) and :func:`openapi_document` describes the very same list. Bodies and responses
are pydantic models, so the schemas in the document are the ones the code validates and serializes.

Auth: ``Authorization: Bearer <token>`` against ``http.tokens`` (constant-time compare). With no
token configured every authenticated route answers 401: the API is locked, never open by default.
``/healthz``, ``/readyz`` and ``/metrics`` need no token.

Names are the tenant's own: a queue, an MQTT session or a client of a vhost is named as its clients
name it, with a ``vhost`` field beside the name, never by the internal key (trimaran/vhosts.py). The
routes for one of them take ``?vhost=`` (default ``/``); the lists take it as a filter.

Lists are paginated by an opaque ``cursor`` (the key of the last item of the previous page, so a page
does not shift when items are added or removed before it) and ``limit``.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import json
import logging
import re
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, TypeVar
from urllib.parse import urlencode, urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model
from pydantic.json_schema import models_json_schema

from trimaran import __version__, compiled
from trimaran.admin.history import MAX_BRIDGES, MAX_QUEUES
from trimaran.admin.http import HttpError, HttpServer, Request, Response
from trimaran.admin.telemetry import PROMETHEUS_CONTENT_TYPE, Telemetry
from trimaran.admin.view import AdminView, BridgeStatus, NotReady, PermissionOps, QueueOps
from trimaran.broker.clients import client_json, client_key
from trimaran.broker.message import Message, now_ms
from trimaran.broker.sessions import SessionDirectory, SessionInfo
from trimaran.config import (
    DeclaredQueue,
    HttpSettings,
    QueuePolicySettings,
    UserLimitSettings,
    VhostLimitSettings,
)
from trimaran.queue.policy import QueueError, parse_queue_topic
from trimaran.security.permissions import PatternError
from trimaran.tenant_limits import TenantLimits, UserLimits, VhostLimits
from trimaran.topics import TopicError, validate_topic_name
from trimaran.vhosts import (
    DEFAULT_VHOST,
    Permission,
    TopicPermission,
    VHostError,
    describe,
    is_reserved,
    prefix,
    split_key,
    strip,
    validate_name,
    vhost_of,
)

if TYPE_CHECKING:
    from trimaran.broker.clients import Client, ClientRegistry
    from trimaran.queue.groups import StoredMessage
    from trimaran.queue.manager import QueueInfo

log = logging.getLogger(__name__)

PREFIX = "/api/v1"
DEFAULT_LIMIT = 100
MAX_LIMIT = 1000
REALM = 'Bearer realm="trimaran"'
M = TypeVar("M", bound=BaseModel)
T = TypeVar("T")


# -- models (request bodies and responses) ---------------------------------------------------------


class Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ErrorDetail(Model):
    code: str
    message: str


class ErrorBody(Model):
    error: ErrorDetail


BUILD = "compiled: the hot modules run compiled by mypyc (the release's build); source: interpreted"


class Health(Model):
    status: str
    version: str
    build: Literal["compiled", "source"] = Field(description=BUILD)
    uptime_s: float


class Readiness(Model):
    status: Literal["ready", "not ready"]
    checks: dict[str, Any]


class ClusterNodeOut(Model):
    name: str
    state: Literal["alive", "dead"] = Field(description="dead: heartbeat older than cluster.node_timeout_s")
    address: str
    started_at: int = Field(description="epoch ms")
    last_heartbeat: int = Field(description="epoch ms")
    routes: int = Field(description="filters this node's subscribers hold")
    self: bool = Field(description="the node that answered")


class ClusterOut(Model):
    node: str
    forwarded: int = Field(description="publishes this node forwarded to others")
    received: int = Field(description="publishes other nodes forwarded to this one")
    waiting: int = Field(description="forwards queued or in flight, not yet committed to PostgreSQL")
    holding: bool = Field(
        description="true while the forwards waiting are above cluster.forward_backpressure_messages or "
        "_bytes and their publishers are held"
    )
    dropped: int = Field(
        description="forwards dropped: past the last-resort bound of 100,000 waiting, or not encodable"
    )
    takeovers: int = Field(description="sessions this node took over from another")
    nodes: list[ClusterNodeOut]


class Overview(Model):
    version: str
    build: Literal["compiled", "source"] = Field(description=BUILD)
    node: str
    uptime_s: float
    started_at_ms: int
    connections: dict[str, int] = Field(description="open connections per protocol")
    sessions: int = Field(description="MQTT sessions, connected or not")
    subscriptions: int
    retained: int
    queues: int
    messages: dict[str, int] = Field(description="received, sent, dropped, routed")
    bytes: dict[str, int] = Field(description="received, sent")


class ClientOut(Model):
    id: str = Field(description="key for /clients/{id}, unique among connected clients")
    client_id: str
    protocol: str
    address: str
    user: str | None
    connected_at_ms: int
    vhost: str = Field(
        description="the vhost it belongs to (the vhost selector of the management page filters by it)"
    )


class SessionSubscription(Model):
    topic_filter: str
    qos: int
    no_local: bool
    retain_as_published: bool
    retain_handling: int
    subscription_identifier: int | None


class SessionOut(Model):
    client_id: str
    vhost: str = Field(
        description="the vhost it belongs to (the vhost selector of the management page filters by it)"
    )
    connected: bool
    protocol_level: int
    expiry_interval_s: int
    expires_in_s: float | None
    subscription_count: int
    inflight: int
    queued: int
    dropped: int


class SessionDetail(SessionOut):
    subscriptions: list[SessionSubscription]


class SubscriptionOut(Model):
    client_id: str
    vhost: str = Field(description="the vhost of the subscriber and of its filter")
    topic_filter: str
    share_group: str | None
    qos: int
    no_local: bool
    retain_as_published: bool
    subscription_identifier: int | None


class GroupOut(Model):
    name: str
    cursor: int
    committed: int
    pending: int
    waiting: int
    lag: int
    consumers: int


class QueueOut(Model):
    name: str
    vhost: str = Field(
        description="the vhost it belongs to (the vhost selector of the management page filters by it)"
    )
    mode: str
    durable: bool
    depth: int
    bytes: int
    pending: int
    lag: int
    groups: list[GroupOut]
    dlq: str | None
    dlq_depth: int


class QueueDetail(QueueOut):
    policy: QueuePolicySettings
    stats: dict[str, int]


class MessageOut(Model):
    offset: int
    message_id: str
    topic: str
    routing_key: str
    payload: str
    encoding: Literal["text", "base64"]
    size: int
    content_type: str | None
    response_topic: str | None
    correlation_data: str | None = Field(description="base64")
    user_properties: list[tuple[str, str]]
    published_at_ms: int
    expires_at_ms: int | None


class RedriveIn(Model):
    limit: int | None = Field(None, ge=1, description="move at most this many (default: all)")


class Count(Model):
    count: int


class Done(Model):
    ok: bool
    detail: str


class BridgesReloaded(Model):
    added: list[str] = Field(description="bridges started")
    removed: list[str] = Field(description="bridges stopped (their queues stay)")
    changed: list[str] = Field(description="bridges started again with new settings")


class VhostLimitsOut(VhostLimitSettings):
    connections: int = Field(description="connections logged in to the vhost now")


class UserLimitsOut(UserLimitSettings):
    connections: int = Field(description="the user's connections now")


class LimitBite(Model):
    vhost: str
    limit: str = Field(description="connections, user_connections, queues, stored_bytes or rate")
    count: int = Field(description="refusals (or paused reads, for rate) since the start")


class LimitsOut(Model):
    vhosts: dict[str, VhostLimitsOut] = Field(description="vhosts with limits or connections (0: no limit)")
    users: dict[str, UserLimitsOut] = Field(description="users with limits of their own")
    default_user: UserLimitSettings = Field(description="the limits of every other user")
    bites: list[LimitBite]


class VhostOut(Model):
    name: str
    declared: bool = Field(description="named in the settings (vhosts, amqp091.vhosts): cannot be deleted")
    connections: int = Field(description="connections logged in to it now")


class PermissionIn(Model):
    """RabbitMQ's set_permissions: the row lets the user enter the vhost (no row, no entry); each
    pattern is a regular expression searched for in a queue's or exchange's name (``^alice-`` anchors
    it; an empty pattern matches nothing; the default exchange is ``amq.default``)."""

    configure: str = Field(".*", description="queues and exchanges it may declare (not passive) and delete")
    write: str = Field(".*", description="exchanges it may publish to; queues and exchanges it may bind to")
    read: str = Field(".*", description="queues it may consume, get and purge; exchanges it may bind from")


class PermissionOut(PermissionIn):
    user: str
    vhost: str


class TopicPermissionIn(Model):
    """RabbitMQ's set_topic_permissions: regular expressions on the routing keys the user publishes
    with (write) and binds with (read) through a topic exchange; ``{username}``, ``{vhost}`` and
    ``{client_id}`` stand for the client's. MQTT and AMQP 1.0 topics go through ``amq.topic`` (``a/b``
    is the key ``a.b``). With no topic permission for an exchange, any key will do."""

    write: str = Field(".*", description="routing keys it may publish with")
    read: str = Field(".*", description="binding keys it may bind (subscribe) with")


class TopicPermissionOut(TopicPermissionIn):
    user: str
    vhost: str
    exchange: str


class PublishProperties(Model):
    content_type: str | None = None
    response_topic: str | None = None
    correlation_data: str | None = Field(None, description="text")
    message_expiry_interval: int | None = Field(None, ge=0, description="seconds")
    user_properties: list[tuple[str, str]] = []


class PublishIn(Model):
    topic: str = Field(min_length=1, description="a topic, or $queue/<name>[/<routing key>]")
    payload: str = ""
    encoding: Literal["text", "base64"] = "text"
    qos: int = Field(0, ge=0, le=2)
    retain: bool = False
    properties: PublishProperties = PublishProperties()


class PublishOut(Model):
    topic: str
    delivered: int | None = Field(None, description="subscribers reached (pub/sub topics)")
    queue: str | None = None
    offset: int | None = None
    message_id: str | None = None


class WebhookOut(Model):
    name: str = Field(description="webhook-<n>: the n-th [[webhooks.endpoints]] entry, from 0")
    url: str = Field(description="scheme://host[:port], and '/…' for a path (it may hold a secret)")
    events: list[str] = Field(description="event types or patterns, as configured")
    topics: list[str] = Field(description="topic filters for the message events")
    healthy: bool = Field(description="false from a failed request until one succeeds")
    breaker: Literal["closed", "open", "half_open"]
    consecutive_failures: int
    last_error: str | None
    last_error_at_ms: int | None
    last_success_at_ms: int | None
    queued: int = Field(description="events waiting to be sent")
    queue_size: int
    in_flight: int = Field(description="events in the request being sent")
    accepted: int
    sent: int = Field(description="events delivered (2xx)")
    dropped: int = Field(description="events given up: queue full, failed every retry, or at shutdown")
    dropped_queue_full: int
    dropped_failed: int
    dropped_shutdown: int
    requests: int
    failed: int = Field(description="requests without an answer or with a non-2xx status")
    retried: int
    connections: int = Field(description="connections opened to the endpoint (kept alive and reused)")


class BridgeOut(Model):
    name: str = Field(description="the [[bridges]] or [[shovels]] table's name")
    kind: Literal["bridge", "shovel"] = Field(description="bridge: to an MQTT broker; shovel: to an AMQP one")
    address: str = Field(description="the remote, HOST:PORT, of the current or last connection")
    client_id: str = Field(description="the bridge's client id at the remote (a shovel's connection name)")
    protocol_version: Literal["mqttv311", "mqttv50", "amqp091", "amqp10"] = Field(
        description="the protocol spoken to the remote"
    )
    vhost: str = Field(description="the local vhost it publishes into and subscribes in")
    state: Literal["connecting", "connected", "waiting", "stopped"] = Field(
        description="waiting: for the next try, after a failed or lost connection"
    )
    state_for_s: float = Field(description="seconds since the state last changed")
    last_error: str | None = Field(description="why the last connection failed or ended")
    connects: int = Field(description="connections the remote accepted")
    sent: int = Field(description="messages handed to the remote (QoS 1/2: once it acknowledged them)")
    received: int = Field(description="messages taken from the remote")
    dropped: int = Field(description="outbound messages not kept: QoS 0 while away, or past queue_bytes")
    refused: int = Field(description="messages refused by the remote (MQTT 5) or by a local queue")
    in_flight: int = Field(description="outbound messages sent and not yet acknowledged by the remote")
    backlog_bytes: int = Field(description="payload bytes of outbound QoS 1/2 messages queued or in flight")
    queue: str = Field(description="its outbound queue in its vhost (/api/v1/queues/{name}?vhost=)")
    topics: list[str] = Field(description="the topic lines, as configured; a shovel's: SOURCE -> DESTINATION")


class QueueSampleOut(Model):
    depth: int = Field(description="messages held when sampled")
    published_per_s: float | None = Field(description="per second since the sample before (null: none)")
    delivered_per_s: float | None
    acked_per_s: float | None


class BridgeSampleOut(Model):
    backlog_bytes: int = Field(description="payload bytes of outbound QoS 1/2 messages queued or in flight")
    sent_per_s: float | None = Field(
        description="messages handed to the remote per second since the sample before (null: none)"
    )
    received_per_s: float | None = Field(description="messages taken from the remote per second")


class SampleOut(Model):
    at_ms: int = Field(description="when sampled, epoch milliseconds")
    messages_in_per_s: float | None = Field(
        description="publishes received per second, every protocol (null: the first sample)"
    )
    messages_out_per_s: float | None = Field(description="deliveries sent per second, every protocol")
    dropped_per_s: float | None
    connections: dict[str, int] = Field(description="open connections per protocol")
    queues: dict[str, QueueSampleOut] = Field(
        description=f"the {MAX_QUEUES} deepest queues, by the name their clients use (a queue of another "
        'vhost than "/" as "<name> (vhost <vhost>)")'
    )
    bridges: dict[str, BridgeSampleOut] = Field(
        description=f"bridges to other MQTT brokers by name (/api/v1/bridges), the {MAX_BRIDGES} with the "
        "most backlog"
    )


class HistoryOut(Model):
    interval_s: float = Field(description="seconds between samples (telemetry.history_interval_s)")
    samples: list[SampleOut] = Field(description="oldest first, at most telemetry.history_samples")


def page_model(item: type[BaseModel]) -> type[BaseModel]:
    return create_model(
        f"{item.__name__}Page",
        __base__=Model,
        items=(list[item], ...),  # type: ignore[valid-type]
        next_cursor=(str | None, Field(None, description="pass as ?cursor= for the next page")),
        next=(str | None, Field(None, description="the next page's URL, if there is one")),
    )


ClientPage = page_model(ClientOut)
SessionPage = page_model(SessionOut)
SubscriptionPage = page_model(SubscriptionOut)
QueuePage = page_model(QueueOut)
MessagePage = page_model(MessageOut)
WebhookPage = page_model(WebhookOut)
BridgePage = page_model(BridgeOut)
VhostPage = page_model(VhostOut)
PermissionPage = page_model(PermissionOut)
TopicPermissionPage = page_model(TopicPermissionOut)


# -- the route table --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Param:
    name: str
    schema: dict[str, Any]
    description: str = ""


LIMIT = Param("limit", {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT}, "page size (default 100)")
CURSOR = Param("cursor", {"type": "string"}, "next_cursor of the previous page")
PAGED = (LIMIT, CURSOR)
#: a list's filter: only what belongs to this vhost (default: every vhost)
IN_VHOST = Param("vhost", {"type": "string"}, "only this vhost (default: every vhost)")
#: the vhost of the one queue, session or client a route names
OF_VHOST = (
    Param("vhost", {"type": "string", "default": DEFAULT_VHOST}, "the vhost it belongs to (default /)"),
)


@dataclass(frozen=True, slots=True)
class ApiRoute:
    method: str
    path: str
    summary: str
    handler: Callable[[Request], Awaitable[Response]]
    responses: dict[int, type[BaseModel] | str | None]  # model, a media type (text), or no body
    query: tuple[Param, ...] = ()
    body: type[BaseModel] | None = None
    body_required: bool = True
    auth: bool = True
    tags: tuple[str, ...] = field(default=())

    @property
    def path_params(self) -> list[str]:
        return [part[1:-1] for part in self.path.split("/") if part.startswith("{")]

    def error_statuses(self) -> list[int]:
        statuses = []
        if self.query or self.body is not None:
            statuses.append(400)
        if self.auth:
            statuses.append(401)
        if self.path_params:
            statuses.append(404)
        if self.body is not None:
            statuses.append(413)
        if self.auth:
            statuses.append(503)  # NotReady: the server is starting
        return statuses


class AdminApi:
    """The routes over a narrow view of the server (trimaran/admin/view.py), never the whole app."""

    def __init__(self, view: AdminView, settings: HttpSettings, telemetry: Telemetry) -> None:
        self.view = view
        self.telemetry = telemetry
        self.tokens = [t.get_secret_value().encode() for t in settings.tokens]
        self.routes = self._routes()

    # -- registration and auth ---------------------------------------------------------------------

    def register(self, server: HttpServer) -> None:
        for route in self.routes:
            server.route(route.method, route.path, self._guard(route) if route.auth else route.handler)

    @property
    def locked(self) -> bool:
        return not self.tokens

    def _guard(self, route: ApiRoute) -> Callable[[Request], Awaitable[Response]]:
        handler = route.handler

        async def guarded(request: Request) -> Response:
            refusal = self._refusal(request)
            if refusal is not None:
                return refusal
            try:
                return await handler(request)
            except NotReady:
                raise HttpError(503, "starting", "the broker is starting") from None

        return guarded

    def _refusal(self, request: Request) -> Response | None:
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if not self.tokens:
            return _unauthorized("locked", "the admin API is locked: no http.tokens are configured", "")
        if scheme.lower() != "bearer" or not token.strip():
            return _unauthorized("unauthorized", "a bearer token is required", "")
        given = token.strip().encode()
        ok = False
        for expected in self.tokens:  # every token compared, in constant time each
            ok |= hmac.compare_digest(given, expected)
        if not ok:
            log.warning(
                "http: %s %s from %s refused: wrong token",
                request.method,
                request.path,
                request.peer,
                extra={"peer": request.peer, "protocol": "http", "reason": "invalid_token"},
            )
            return _unauthorized("unauthorized", "the bearer token is not valid", ', error="invalid_token"')
        return None

    def _routes(self) -> list[ApiRoute]:
        p = PREFIX
        return [
            ApiRoute(
                "GET", "/healthz", "Liveness", self.healthz, {200: Health}, auth=False, tags=("health",)
            ),
            ApiRoute(
                "GET",
                "/readyz",
                "Readiness: storage reachable and listeners bound",
                self.readyz,
                {200: Readiness, 503: Readiness},
                auth=False,
                tags=("health",),
            ),
            ApiRoute(
                "GET",
                "/metrics",
                "Prometheus text exposition (OpenMetrics when Accept asks for it): the broker's "
                "OpenTelemetry instruments, process, platform and GC",
                self.metrics,
                {200: PROMETHEUS_CONTENT_TYPE, 404: ErrorBody},
                auth=False,
                tags=("health",),
            ),
            ApiRoute("GET", f"{p}/openapi.json", "This document", self.openapi, {200: "application/json"}),
            ApiRoute(
                "GET",
                f"{p}/overview",
                "Version, build, node, uptime and counts",
                self.overview,
                {200: Overview},
            ),
            ApiRoute(
                "GET",
                f"{p}/history",
                "The management page's charts: messages in and out per second, connections, the "
                "deepest queues' depth and rates, and the bridges' rates and backlog, sampled every "
                "telemetry.history_interval_s",
                self.history,
                {200: HistoryOut},
            ),
            ApiRoute(
                "GET",
                f"{p}/cluster",
                "The nodes sharing this database, with state, last heartbeat and routes (404 alone)",
                self.cluster,
                {200: ClusterOut, 404: ErrorBody},
            ),
            ApiRoute(
                "GET",
                f"{p}/clients",
                "Connected clients, every protocol",
                self.list_clients,
                {200: ClientPage},
                query=(*PAGED, Param("protocol", {"type": "string"}, "only this protocol"), IN_VHOST),
            ),
            ApiRoute(
                "GET",
                f"{p}/clients/{{id}}",
                "One connected client, by connection id or by its client id in the vhost",
                self.show_client,
                {200: ClientOut, 409: ErrorBody},
                query=OF_VHOST,
            ),
            ApiRoute(
                "DELETE",
                f"{p}/clients/{{id}}",
                "Disconnect a client, by connection id or by its client id in the vhost (MQTT 5: reason "
                "0x98)",
                self.kick_client,
                {200: Done, 409: ErrorBody},
                query=OF_VHOST,
            ),
            ApiRoute(
                "GET",
                f"{p}/sessions",
                "MQTT sessions",
                self.list_sessions,
                {200: SessionPage},
                query=(
                    *PAGED,
                    Param("connected", {"type": "boolean"}, "only connected (true) or offline"),
                    IN_VHOST,
                ),
            ),
            ApiRoute(
                "GET",
                f"{p}/sessions/{{client_id}}",
                "One MQTT session with its subscriptions",
                self.show_session,
                {200: SessionDetail},
                query=OF_VHOST,
            ),
            ApiRoute(
                "DELETE",
                f"{p}/sessions/{{client_id}}",
                "End a session (disconnects its client)",
                self.delete_session,
                {200: Done},
                query=OF_VHOST,
            ),
            ApiRoute(
                "GET",
                f"{p}/subscriptions",
                "Pub/sub subscriptions",
                self.list_subscriptions,
                {200: SubscriptionPage},
                query=(
                    *PAGED,
                    Param("filter", {"type": "string"}, "only this topic filter (exact)"),
                    Param("client", {"type": "string"}, "only this client id"),
                    IN_VHOST,
                ),
            ),
            ApiRoute(
                "GET",
                f"{p}/queues",
                "Durable queues",
                self.list_queues,
                {200: QueuePage},
                query=(*PAGED, IN_VHOST),
            ),
            ApiRoute(
                "POST",
                f"{p}/queues",
                "Create a queue in the vhost, or change its policy",
                self.create_queue,
                {200: QueueDetail, 201: QueueDetail, 409: ErrorBody},
                body=DeclaredQueue,
                query=OF_VHOST,
            ),
            ApiRoute(
                "GET",
                f"{p}/queues/{{name}}",
                "One queue (a DLQ is $dlq%2F<name>)",
                self.show_queue,
                {200: QueueDetail},
                query=OF_VHOST,
            ),
            ApiRoute(
                "DELETE",
                f"{p}/queues/{{name}}",
                "Delete a queue",
                self.delete_queue,
                {200: Done},
                query=OF_VHOST,
            ),
            ApiRoute(
                "POST",
                f"{p}/queues/{{name}}/purge",
                "Remove every message",
                self.purge_queue,
                {200: Count},
                query=OF_VHOST,
            ),
            ApiRoute(
                "GET",
                f"{p}/queues/{{name}}/messages",
                "Peek at messages without consuming them",
                self.peek_queue,
                {200: MessagePage},
                query=(
                    *PAGED,
                    Param(
                        "encoding", {"enum": ["auto", "text", "base64"]}, "payload encoding (default auto)"
                    ),
                    *OF_VHOST,
                ),
            ),
            ApiRoute(
                "POST",
                f"{p}/queues/{{name}}/redrive",
                "Move dead letters back from $dlq/<name>",
                self.redrive_queue,
                {200: Count},
                body=RedriveIn,
                body_required=False,
                query=OF_VHOST,
            ),
            ApiRoute(
                "GET",
                f"{p}/webhooks",
                "Webhook endpoints and their state: health, last error and success, queue, counters",
                self.list_webhooks,
                {200: WebhookPage},
                query=PAGED,
                tags=("webhooks",),
            ),
            *self._bridge_routes(),
            ApiRoute(
                "POST",
                f"{p}/auth/reload",
                "Read auth.password_file and auth.acl_file again (as SIGHUP does); no client is dropped",
                self.reload_auth,
                {200: Done, 409: ErrorBody},
                tags=("auth",),
            ),
            *self._vhost_routes(),
            *self._limit_routes(),
            ApiRoute(
                "POST",
                f"{p}/publish",
                "Publish to a topic or a $queue/",
                self.publish,
                {200: PublishOut, 409: ErrorBody},
                body=PublishIn,
                query=OF_VHOST,
            ),
        ]

    # -- health and metrics (open) -------------------------------------------------------------------

    async def healthz(self, _request: Request) -> Response:
        uptime = round(time.time() - self.view.started_at, 3)
        return _ok(Health(status="ok", version=__version__, build=_build(), uptime_s=uptime))

    async def readyz(self, _request: Request) -> Response:
        ready = await self.view.readiness()
        status: Literal["ready", "not ready"] = "ready" if ready.ok else "not ready"
        return _ok(Readiness(status=status, checks=ready.checks), 200 if ready.ok else 503)

    async def metrics(self, _request: Request) -> Response:
        telemetry = self.telemetry
        if not telemetry.enabled:
            raise HttpError(404, "not_found", "metrics are off (telemetry.metrics = false)")
        body, content_type = telemetry.exposition(_request.headers.get("accept", ""))
        return Response(200, body, content_type)

    async def openapi(self, _request: Request) -> Response:
        return Response.json(openapi_document(self.routes))

    async def history(self, _request: Request) -> Response:
        history = self.telemetry.history
        samples = [
            SampleOut(
                at_ms=sample.at_ms,
                messages_in_per_s=sample.messages_in,
                messages_out_per_s=sample.messages_out,
                dropped_per_s=sample.dropped,
                connections=sample.connections,
                queues={
                    _label(name): QueueSampleOut(
                        depth=queue.depth,
                        published_per_s=queue.rates["published"],
                        delivered_per_s=queue.rates["delivered"],
                        acked_per_s=queue.rates["acked"],
                    )
                    for name, queue in sample.queues.items()
                },
                bridges={
                    name: BridgeSampleOut(
                        backlog_bytes=bridge.backlog_bytes,
                        sent_per_s=bridge.rates["sent"],
                        received_per_s=bridge.rates["received"],
                    )
                    for name, bridge in sample.bridges.items()
                },
            )
            for sample in history.samples()
        ]
        return _ok(HistoryOut(interval_s=history.interval_s, samples=samples))

    # -- overview and clients -----------------------------------------------------------------------

    async def cluster(self, _request: Request) -> Response:
        nodes = await self.view.cluster_nodes()
        if nodes is None:
            raise HttpError(404, "not_found", "this node is not in a cluster (cluster.enabled = false)")
        return _ok(ClusterOut.model_validate(nodes))

    async def overview(self, _request: Request) -> Response:
        view = self.view
        counts = view.counts()
        return _ok(
            Overview(
                version=__version__,
                build=_build(),
                node=view.node,
                uptime_s=round(time.time() - view.started_at, 3),
                started_at_ms=int(view.started_at * 1000),
                connections=counts.connections,
                sessions=counts.sessions,
                subscriptions=counts.subscriptions,
                retained=counts.retained,
                queues=counts.queues,
                messages=counts.messages,
                bytes=counts.bytes,
            )
        )

    async def list_clients(self, request: Request) -> Response:
        protocol, vhost = request.arg("protocol"), _vhost_filter(request)
        clients = sorted(
            (
                c
                for c in self.view.clients()
                if (protocol is None or c.protocol == protocol) and (vhost is None or c.vhost == vhost)
            ),
            key=lambda c: (c.since_ms, client_key(c)),
        )
        items = [(c.since_ms, client_key(c)) for c in clients]
        return _page(request, ClientPage, clients, items, _client_out)

    async def show_client(self, request: Request) -> Response:
        client = self._client(request.params["id"], _vhost_arg(request))
        return _ok(_client_out(client))

    async def kick_client(self, request: Request) -> Response:
        client = self._client(request.params["id"], _vhost_arg(request))
        named = f"client '{_own_id(client)}' in vhost '{client.vhost}'"
        client.kick()
        return _ok(Done(ok=True, detail=f"{named} disconnected"))

    def _client(self, key: str, vhost: str) -> Client:
        """A client by its connection id (``mqtt-12``), or by its client id in ``vhost``, as people
        know it."""
        clients: ClientRegistry = self.view.clients()
        client = clients.get(key)
        if client is not None:
            return client
        named = [c for c in clients if c.vhost == vhost and _own_id(c) == key]
        if not named:
            raise HttpError(404, "no_client", f"no connected client '{key}' in vhost '{vhost}'")
        if len(named) > 1:  # AMQP connection names need not be unique
            ids = ", ".join(sorted(client_key(c) for c in named))
            raise HttpError(409, "ambiguous", f"{len(named)} connections are named {key}: {ids}; use one id")
        return named[0]

    # -- sessions and subscriptions -------------------------------------------------------------------

    async def list_sessions(self, request: Request) -> Response:
        connected, vhost = _bool_arg(request, "connected"), _vhost_filter(request)
        sessions = sorted(
            (
                s
                for s in self._sessions().sessions()
                if (connected is None or s.connected == connected)
                and (vhost is None or vhost_of(s.client_id) == vhost)
            ),
            key=lambda s: s.client_id,
        )
        return _page(request, SessionPage, sessions, [s.client_id for s in sessions], _session_out)

    async def show_session(self, request: Request) -> Response:
        key = _key(request, request.params["client_id"])
        session = self._sessions().session(key)
        if session is None:
            raise HttpError(404, "no_session", f"no {describe(key, 'session')}")
        cut = prefix(vhost_of(key))
        subscriptions = [
            SessionSubscription(
                topic_filter=strip(s.topic_filter, cut),
                qos=s.qos,
                no_local=s.no_local,
                retain_as_published=s.retain_as_published,
                retain_handling=s.retain_handling,
                subscription_identifier=s.subscription_identifier,
            )
            for s in session.subscriptions
        ]
        out = _session_out(session)
        return _ok(SessionDetail(**out.model_dump(), subscriptions=subscriptions))

    async def delete_session(self, request: Request) -> Response:
        key = _key(request, request.params["client_id"])
        if not self._sessions().delete_session(key):
            raise HttpError(404, "no_session", f"no {describe(key, 'session')}")
        return _ok(Done(ok=True, detail=f"{describe(key, 'session')} deleted"))

    async def list_subscriptions(self, request: Request) -> Response:
        wanted_filter = request.arg("filter")
        wanted_client = request.arg("client")
        wanted_vhost = _vhost_filter(request)
        rows = []
        for sub in self.view.subscriptions():
            vhost, topic_filter = split_key(sub.topic_filter)
            client_id = strip(str(sub.subscriber.id), prefix(vhost))
            if wanted_vhost is not None and vhost != wanted_vhost:
                continue
            if wanted_filter is not None and topic_filter != wanted_filter:
                continue
            if wanted_client is not None and client_id != wanted_client:
                continue
            o = sub.options
            rows.append(
                SubscriptionOut(
                    client_id=client_id,
                    vhost=vhost,
                    topic_filter=topic_filter,
                    share_group=o.share_group,
                    qos=o.qos,
                    no_local=o.no_local,
                    retain_as_published=o.retain_as_published,
                    subscription_identifier=o.subscription_identifier,
                )
            )
        rows.sort(key=lambda s: (s.vhost, s.client_id, s.topic_filter, s.share_group or ""))
        keys = [[s.vhost, s.client_id, s.topic_filter, s.share_group or ""] for s in rows]
        return _page(request, SubscriptionPage, rows, keys, lambda s: s)

    # -- queues -------------------------------------------------------------------------------------

    async def list_queues(self, request: Request) -> Response:
        queues, vhost = self._queues(), _vhost_filter(request)
        names = sorted(n for n in queues.queues if vhost is None or vhost_of(n) == vhost)
        return _page(request, QueuePage, names, names, lambda n: _queue_out(queues.info(n)))

    async def create_queue(self, request: Request) -> Response:
        declared = _body(request, DeclaredQueue)
        key = _key(request, declared.name)
        queues = self._queues()
        existed = queues.exists(key)
        policy = QueuePolicySettings(**declared.model_dump(exclude={"name"}))
        try:
            info = await queues.declare(key, policy)
        except QueueError as exc:
            raise _queue_error(exc) from None
        return _ok(_queue_detail(info), 200 if existed else 201)

    async def show_queue(self, request: Request) -> Response:
        return _ok(_queue_detail(self._queue_info(_key(request, request.params["name"]))))

    async def delete_queue(self, request: Request) -> Response:
        name = _key(request, request.params["name"])
        self._queue_info(name)
        await self._queues().delete(name)
        return _ok(Done(ok=True, detail=f"{describe(name)} deleted"))

    async def purge_queue(self, request: Request) -> Response:
        name = _key(request, request.params["name"])
        self._queue_info(name)
        try:
            count = await self._queues().purge(name)
        except QueueError as exc:
            raise _queue_error(exc) from None
        return _ok(Count(count=count))

    async def peek_queue(self, request: Request) -> Response:
        name = _key(request, request.params["name"])
        self._queue_info(name)
        limit = _limit(request)
        after = _decode_cursor(request.arg("cursor"))
        if after is None:
            after = -1
        if not isinstance(after, int):
            raise HttpError(400, "bad_cursor", "this cursor is not from this list")
        encoding = request.arg("encoding", "auto")
        if encoding not in ("auto", "text", "base64"):
            raise HttpError(400, "bad_parameter", "encoding must be auto, text or base64")
        try:
            stored = await self._queues().peek_stored(name, after, limit + 1)
        except QueueError as exc:
            raise _queue_error(exc) from None
        more = len(stored) > limit
        stored = stored[:limit]
        items = [_message_out(name, s, encoding) for s in stored]
        next_cursor = _encode_cursor(stored[-1].offset) if more and stored else None
        return _ok(MessagePage(items=items, next_cursor=next_cursor, next=_next_link(request, next_cursor)))

    async def redrive_queue(self, request: Request) -> Response:
        name = _key(request, request.params["name"])
        self._queue_info(name)
        body = _body(request, RedriveIn, required=False)
        try:
            moved = await self._queues().redrive(name, body.limit)
        except QueueError as exc:
            raise _queue_error(exc) from None
        return _ok(Count(count=moved))

    def _queue_info(self, name: str) -> QueueInfo:
        try:
            return self._queues().info(name)
        except QueueError:
            raise HttpError(404, "no_queue", f"{describe(name)} does not exist") from None

    # -- publish ------------------------------------------------------------------------------------

    async def publish(self, request: Request) -> Response:
        """To a topic or a queue of ``?vhost=`` (default ``/``), named as its clients name it."""
        body = _body(request, PublishIn)
        cut = prefix(_vhost_arg(request))
        if is_reserved(body.topic):
            raise HttpError(400, "bad_topic", "name the vhost with ?vhost= and the topic as its clients do")
        if body.encoding == "base64":
            try:
                payload = base64.b64decode(body.payload, validate=True)
            except (binascii.Error, ValueError):
                raise HttpError(400, "bad_payload", "payload is not valid base64") from None
        else:
            payload = body.payload.encode()
        props = body.properties
        now = now_ms()
        queued = body.topic.startswith("$queue/")
        message = Message(
            topic=cut + body.topic,  # behind the vhost's prefix, as the hulls store it (vhosts.py)
            payload=payload,
            qos=body.qos,
            retain=body.retain,
            content_type=props.content_type,
            response_topic=props.response_topic,
            correlation_data=props.correlation_data.encode() if props.correlation_data is not None else None,
            expires_at_ms=Message.expiry_from_interval(props.message_expiry_interval, now),
            user_properties=[(k, v) for k, v in props.user_properties],
            created_at_ms=now,
        )
        if queued:
            parsed = parse_queue_topic(body.topic)
            if parsed is None or parsed[2] is not None:
                raise HttpError(400, "bad_topic", f"{body.topic!r} is not a queue topic one can publish to")
            if body.retain:
                raise HttpError(400, "bad_request", "a queue message cannot be retained")
            queue, routing_key, _ = parsed
            try:
                result = await self.view.publish_to_queue(cut + queue, message, routing_key)
            except QueueError as exc:
                raise _queue_error(exc) from None
            shown = split_key(result.queue)[1]
            return _ok(
                PublishOut(
                    topic=body.topic,
                    queue=shown,
                    offset=result.offset,
                    message_id=f"{shown}:{result.offset}" if cut else result.message_id,
                )
            )
        try:
            validate_topic_name(body.topic)
        except TopicError as exc:
            raise HttpError(400, "bad_topic", str(exc)) from None
        if body.topic.startswith("$"):
            raise HttpError(400, "bad_topic", "topics starting with $ are the broker's own")
        delivered = self.view.publish(message)
        return _ok(PublishOut(topic=body.topic, delivered=delivered))

    # -- webhooks -------------------------------------------------------------------------------------

    async def list_webhooks(self, request: Request) -> Response:
        webhooks = self.view.webhooks
        if webhooks is None:
            raise NotReady("webhooks")
        states = webhooks.stats()
        return _page(request, WebhookPage, states, list(range(len(states))), _webhook_out)

    # -- bridges to other MQTT brokers ([[bridges]]) --------------------------------------------------

    def _bridge_routes(self) -> list[ApiRoute]:
        p, tags = f"{PREFIX}/bridges", ("bridges",)
        return [
            ApiRoute(
                "GET", p, "Bridges to other MQTT brokers: state, remote, last error, counters, backlog",
                self.list_bridges, {200: BridgePage}, query=(*PAGED, IN_VHOST), tags=tags,
            ),
            ApiRoute("GET", f"{p}/{{name}}", "One bridge", self.show_bridge, {200: BridgeOut}, tags=tags),
            ApiRoute(
                "POST", f"{p}/reload",
                "Read the [[bridges]] of the settings again, as SIGHUP does: new ones start, removed ones "
                "stop (their queues stay), changed ones start again; the others go on untouched",
                self.reload_bridges, {200: BridgesReloaded}, tags=tags,
            ),
            ApiRoute(
                "POST", f"{p}/{{name}}/restart",
                "Drop a bridge's connection and connect again at once (what is not acknowledged is sent "
                "again); answered before it reconnects",
                self.restart_bridge, {202: Done}, tags=tags,
            ),
        ]  # fmt: skip

    async def list_bridges(self, request: Request) -> Response:
        vhost = _vhost_filter(request)
        bridges = [b for b in self.view.bridge_statuses() if vhost is None or b.vhost == vhost]
        bridges.sort(key=lambda b: b.name)
        return _page(request, BridgePage, bridges, [b.name for b in bridges], _bridge_out)

    async def show_bridge(self, request: Request) -> Response:
        name = request.params["name"]
        bridge = next((b for b in self.view.bridge_statuses() if b.name == name), None)
        if bridge is None:
            raise HttpError(404, "no_bridge", f"no bridge {name!r}")
        return _ok(_bridge_out(bridge))

    async def restart_bridge(self, request: Request) -> Response:
        name = request.params["name"]
        if not self.view.restart_bridge(name):
            raise HttpError(404, "no_bridge", f"no bridge {name!r}")
        log.info("bridges: %r restarted through the admin API", name)
        return _ok(Done(ok=True, detail=f"bridge {name!r} reconnecting"), 202)

    async def reload_bridges(self, _request: Request) -> Response:
        done = await self.view.reload_bridges()
        if done is None:
            raise HttpError(
                409, "reload-failed", "the settings could not be read again; the bridges go on (see log)"
            )
        return _ok(BridgesReloaded(**done))

    async def reload_auth(self, _request: Request) -> Response:
        if not self.view.reload_security():
            raise HttpError(
                409, "reload-failed", "a file could not be read; the current rules stay (see log)"
            )
        return _ok(Done(ok=True, detail="users and rules reloaded"))

    # -- vhosts and permissions (trimaran/vhosts.py, the security's vhost permissions) ---------------

    def _vhost_routes(self) -> list[ApiRoute]:
        p, tags = PREFIX, ("vhosts",)
        vhost_query = (Param("vhost", {"type": "string"}, "only this vhost"),)
        return [
            ApiRoute(
                "GET", f"{p}/vhosts", "Virtual hosts", self.list_vhosts, {200: VhostPage}, query=PAGED,
                tags=tags,
            ),
            ApiRoute(
                "PUT", f"{p}/vhosts/{{vhost}}",
                "Create a vhost (200 if it exists; the default vhost is %2F); it grants nothing, but to "
                "the user named by ?user= (.* .* .*, as RabbitMQ's management grants its creator)",
                self.add_vhost, {200: VhostOut, 201: VhostOut, 400: ErrorBody, 404: ErrorBody},
                query=(Param("user", {"type": "string"}, "the user it is made for: gets .* .* .* on it"),),
                tags=tags,
            ),
            ApiRoute(
                "DELETE", f"{p}/vhosts/{{vhost}}", "Delete a vhost and what it holds (not a declared one)",
                self.delete_vhost, {200: Done, 409: ErrorBody}, tags=tags,
            ),
            ApiRoute(
                "GET", f"{p}/permissions", "Who may enter which vhost, and configure, write, read what there",
                self.list_permissions, {200: PermissionPage}, query=(*PAGED, *vhost_query), tags=tags,
            ),
            ApiRoute(
                "PUT", f"{p}/permissions/{{vhost}}/{{user}}",
                "Let a user enter a vhost and configure, write, read the queues and exchanges its patterns "
                "match (set_permissions; 404 no_such_user for a user the password file, auth.users and "
                "guest do not name, unless ?force=true, for certificate identities)",
                self.set_permission, {200: PermissionOut, 400: ErrorBody, 404: ErrorBody}, body=PermissionIn,
                body_required=False,
                query=(Param("force", {"type": "boolean"}, "accept a user no file names"),), tags=tags,
            ),
            ApiRoute(
                "DELETE", f"{p}/permissions/{{vhost}}/{{user}}", "Take a user's permission for a vhost away",
                self.clear_permission, {200: Done}, tags=tags,
            ),
            ApiRoute(
                "GET", f"{p}/topic-permissions", "Which routing keys users may publish and bind with",
                self.list_topic_permissions, {200: TopicPermissionPage}, query=(*PAGED, *vhost_query),
                tags=tags,
            ),
            ApiRoute(
                "PUT", f"{p}/topic-permissions/{{vhost}}/{{user}}/{{exchange}}",
                "Limit the routing keys a user publishes and binds with through a topic exchange "
                "(set_topic_permissions; MQTT and AMQP 1.0 topics: amq.topic)",
                self.set_topic_permission, {200: TopicPermissionOut, 400: ErrorBody, 404: ErrorBody},
                body=TopicPermissionIn, body_required=False,
                query=(Param("force", {"type": "boolean"}, "accept a user no file names"),), tags=tags,
            ),
            ApiRoute(
                "DELETE", f"{p}/topic-permissions/{{vhost}}/{{user}}/{{exchange}}",
                "Take a user's topic permission for an exchange away (clear_topic_permissions)",
                self.clear_topic_permission, {200: Done}, tags=tags,
            ),
        ]  # fmt: skip

    async def list_vhosts(self, request: Request) -> Response:
        vhosts = self.view.vhost_registry()
        connections = self._limits().connections
        names = vhosts.names()

        def render(name: str) -> VhostOut:
            return VhostOut(name=name, declared=name in vhosts.declared, connections=connections.get(name, 0))

        return _page(request, VhostPage, names, names, render)

    async def add_vhost(self, request: Request) -> Response:
        name = request.params["vhost"]
        vhosts = self.view.vhost_registry()
        creator = request.arg("user") or None
        if creator is not None and not self.view.permission_ops().user_exists(creator):
            raise HttpError(404, "no_such_user", f"no user {creator!r}")
        try:
            added = await vhosts.add(name)
        except VHostError as exc:
            raise HttpError(400, "bad_vhost", str(exc)) from None
        if added:
            log.info("vhosts: %r added through the admin API", name)
            if creator is not None:
                await self.view.permission_ops().set_permission(Permission(creator, name))
                log.info(
                    "vhosts: user %r, who %r was made for, may configure, write and read it", creator, name
                )
        connections = self._limits().connections.get(name, 0)
        out = VhostOut(name=name, declared=name in vhosts.declared, connections=connections)
        return _ok(out, 201 if added else 200)

    async def delete_vhost(self, request: Request) -> Response:
        name = request.params["vhost"]
        try:
            deleted = await self.view.vhost_registry().delete(name)
        except VHostError as exc:
            raise HttpError(409, "declared", str(exc)) from None
        if not deleted:
            raise HttpError(404, "not_found", f"no vhost {name!r}")
        log.info("vhosts: %r deleted through the admin API", name)
        return _ok(Done(ok=True, detail=f"vhost {name!r} deleted"))

    def _grantee_ops(self, request: Request, vhost: str, user: str) -> PermissionOps:
        """The permission operations, once the vhost exists and so does the user (RabbitMQ's
        ``no_such_user``; ``?force=true`` for a certificate identity no file names)."""
        if not self.view.vhost_registry().exists(vhost):
            raise HttpError(404, "not_found", f"no vhost {vhost!r}")
        ops = self.view.permission_ops()
        if not ops.user_exists(user) and not _bool_arg(request, "force"):
            raise HttpError(
                404, "no_such_user", f"no user {user!r} (not in the password file, auth.users, nor guest)"
            )
        return ops

    async def list_permissions(self, request: Request) -> Response:
        rows = self.view.permission_ops().permissions(request.arg("vhost") or None)
        keys = [(p.vhost, p.user) for p in rows]
        return _page(request, PermissionPage, rows, keys, _permission_out)

    async def set_permission(self, request: Request) -> Response:
        vhost, user = request.params["vhost"], request.params["user"]
        ops = self._grantee_ops(request, vhost, user)
        body = _body(request, PermissionIn, required=False)
        for name, pattern in body.model_dump().items():
            try:
                re.compile(pattern)
            except re.error as exc:
                raise HttpError(400, "bad_pattern", f"{name} pattern {pattern!r}: {exc}") from None
        permission = Permission(user, vhost, body.configure, body.write, body.read)
        await ops.set_permission(permission)
        log.info(
            "vhosts: user %r may enter %r, configure %r, write %r, read %r (set through the admin API)",
            user, vhost, permission.configure, permission.write, permission.read,
        )  # fmt: skip
        return _ok(_permission_out(permission))

    async def clear_permission(self, request: Request) -> Response:
        vhost, user = request.params["vhost"], request.params["user"]
        if not await self.view.permission_ops().clear_permission(user, vhost):
            raise HttpError(404, "not_found", f"user {user!r} has no permission for vhost {vhost!r}")
        log.info("vhosts: user %r may no longer enter %r (cleared through the admin API)", user, vhost)
        return _ok(Done(ok=True, detail=f"permission of user {user!r} for vhost {vhost!r} cleared"))

    async def list_topic_permissions(self, request: Request) -> Response:
        rows = self.view.permission_ops().topic_permissions(request.arg("vhost") or None)
        keys = [(t.vhost, t.user, t.exchange) for t in rows]
        return _page(request, TopicPermissionPage, rows, keys, _topic_permission_out)

    async def set_topic_permission(self, request: Request) -> Response:
        vhost, user, exchange = request.params["vhost"], request.params["user"], request.params["exchange"]
        ops = self._grantee_ops(request, vhost, user)
        body = _body(request, TopicPermissionIn, required=False)
        permission = TopicPermission(user, vhost, exchange, body.write, body.read)
        try:
            await ops.set_topic_permission(permission)
        except PatternError as exc:
            raise HttpError(400, "bad_pattern", str(exc)) from None
        log.info(
            "vhosts: user %r publishes with keys %r and binds with %r through %r in %r (admin API)",
            user, body.write, body.read, exchange, vhost,
        )  # fmt: skip
        return _ok(_topic_permission_out(permission))

    async def clear_topic_permission(self, request: Request) -> Response:
        vhost, user, exchange = request.params["vhost"], request.params["user"], request.params["exchange"]
        if not await self.view.permission_ops().clear_topic_permission(user, vhost, exchange):
            raise HttpError(
                404, "not_found", f"user {user!r} has no topic permission for {exchange!r} in {vhost!r}"
            )
        log.info("vhosts: topic permission of %r for %r in %r cleared (admin API)", user, exchange, vhost)
        return _ok(
            Done(ok=True, detail=f"topic permission of user {user!r} for {exchange!r} in {vhost!r} cleared")
        )

    # -- limits per vhost and per user (trimaran/tenant_limits.py) -------------------------------------------

    def _limit_routes(self) -> list[ApiRoute]:
        p, tags = f"{PREFIX}/limits", ("limits",)
        return [
            ApiRoute(
                "GET", p, "Limits per vhost and user, the counts and how often each bit", self.show_limits,
                {200: LimitsOut}, tags=tags,
            ),
            ApiRoute(
                "PUT", f"{p}/vhosts/{{vhost}}", "Set a vhost's limits (the default vhost is %2F)",
                self.set_vhost_limits, {200: LimitsOut}, body=VhostLimitSettings, tags=tags,
            ),
            ApiRoute(
                "DELETE", f"{p}/vhosts/{{vhost}}", "Remove a vhost's limits", self.clear_vhost_limits,
                {200: Done}, tags=tags,
            ),
            ApiRoute(
                "PUT", f"{p}/users/{{user}}", "Set a user's limits (connections, messages/s, bytes/s)",
                self.set_user_limits, {200: LimitsOut}, body=UserLimitSettings, tags=tags,
            ),
            ApiRoute(
                "DELETE", f"{p}/users/{{user}}", "Remove a user's own limits (the default's apply)",
                self.clear_user_limits, {200: Done}, tags=tags,
            ),
            ApiRoute(
                "PUT", f"{p}/default-user", "Set the limits of every user without limits of its own",
                self.set_default_user_limits, {200: LimitsOut}, body=UserLimitSettings, tags=tags,
            ),
        ]  # fmt: skip

    async def show_limits(self, _request: Request) -> Response:
        return _ok(LimitsOut.model_validate(self._limits().snapshot()))

    async def set_vhost_limits(self, request: Request) -> Response:
        body = _body(request, VhostLimitSettings)
        vhost = request.params["vhost"]
        if not self.view.vhost_registry().exists(vhost):  # as rabbitmqctl set_vhost_limits
            raise HttpError(404, "not_found", f"no vhost {vhost!r}")
        await self._limits().change_vhost(vhost, VhostLimits(**body.model_dump()))
        log.info("limits: vhost %r set to %s through the admin API", vhost, body.model_dump())
        return await self.show_limits(request)

    async def clear_vhost_limits(self, request: Request) -> Response:
        vhost = request.params["vhost"]
        if not await self._limits().change_vhost(vhost, None):
            raise HttpError(404, "not_found", f"vhost {vhost!r} has no limits")
        log.info("limits: vhost %r cleared through the admin API", vhost)
        return _ok(Done(ok=True, detail=f"limits of vhost {vhost!r} removed"))

    async def set_user_limits(self, request: Request) -> Response:
        body = _body(request, UserLimitSettings)
        user = request.params["user"]
        await self._limits().change_user(user, UserLimits(**body.model_dump()))
        log.info("limits: user %r set to %s through the admin API", user, body.model_dump())
        return await self.show_limits(request)

    async def clear_user_limits(self, request: Request) -> Response:
        user = request.params["user"]
        if not await self._limits().change_user(user, None):
            raise HttpError(404, "not_found", f"user {user!r} has no limits of its own")
        log.info("limits: user %r cleared through the admin API", user)
        return _ok(Done(ok=True, detail=f"limits of user {user!r} removed"))

    async def set_default_user_limits(self, request: Request) -> Response:
        body = _body(request, UserLimitSettings)
        await self._limits().change_default_user(UserLimits(**body.model_dump()))
        log.info("limits: default user set to %s through the admin API", body.model_dump())
        return await self.show_limits(request)

    # -- parts of the server (NotReady while starting: 503) ------------------------------------------

    def _limits(self) -> TenantLimits:
        return self.view.tenant_limits()

    def _sessions(self) -> SessionDirectory:
        return self.view.session_directory()

    def _queues(self) -> QueueOps:
        return self.view.queue_ops()


# -- helpers ----------------------------------------------------------------------------------------


def _build() -> Literal["compiled", "source"]:
    return "compiled" if compiled.build() == "compiled" else "source"


def _ok(model: BaseModel, status: int = 200) -> Response:
    return Response(status, model.model_dump_json().encode())


def _unauthorized(code: str, message: str, extra: str) -> Response:
    response = HttpError(401, code, message).response()
    response.headers.append(("www-authenticate", REALM + extra))
    return response


def _body(request: Request, model: type[M], required: bool = True) -> M:
    data = request.json()
    if data is None:
        if required:
            raise HttpError(400, "bad_body", "a JSON body is required")
        data = {}
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(x) for x in e['loc']) or 'body'}: {e['msg']}" for e in exc.errors()[:5]
        )
        raise HttpError(400, "bad_body", problems) from None


def _vhost_arg(request: Request) -> str:
    """The ``vhost`` a route's one queue, session or client belongs to (default ``/``)."""
    vhost = request.arg("vhost") or DEFAULT_VHOST
    try:
        return validate_name(vhost)
    except VHostError as exc:
        raise HttpError(400, "bad_vhost", str(exc)) from None


def _vhost_filter(request: Request) -> str | None:
    """A list's ``vhost`` filter (None: every vhost)."""
    return _vhost_arg(request) if request.arg("vhost") else None


def _key(request: Request, name: str) -> str:
    """The internal key of ``name`` in the request's vhost. A name in the internal spelling is
    refused: the vhost is a parameter of its own."""
    if is_reserved(name):
        raise HttpError(
            400,
            "bad_name",
            f"{name!r}: name the vhost with ?vhost= and the queue or client as its clients do",
        )
    return prefix(_vhost_arg(request)) + name


def _bool_arg(request: Request, name: str) -> bool | None:
    value = request.arg(name)
    if value is None:
        return None
    if value.lower() in ("true", "1", "yes"):
        return True
    if value.lower() in ("false", "0", "no"):
        return False
    raise HttpError(400, "bad_parameter", f"{name} must be true or false")


def _limit(request: Request) -> int:
    text = request.arg("limit")
    if text is None:
        return DEFAULT_LIMIT
    try:
        limit = int(text)
    except ValueError:
        raise HttpError(400, "bad_parameter", "limit must be an integer") from None
    if not 1 <= limit <= MAX_LIMIT:
        raise HttpError(400, "bad_parameter", f"limit must be between 1 and {MAX_LIMIT}")
    return limit


def _encode_cursor(key: Any) -> str:
    return base64.urlsafe_b64encode(json.dumps(key, separators=(",", ":")).encode()).decode().rstrip("=")


def _decode_cursor(text: str | None) -> Any:
    if text is None or text == "":
        return None
    try:
        return json.loads(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))
    except (ValueError, binascii.Error):
        raise HttpError(400, "bad_cursor", "cursor is not valid") from None


def _next_link(request: Request, cursor: str | None) -> str | None:
    if cursor is None:
        return None
    query = {k: v[-1] for k, v in request.query.items() if k != "cursor"}
    query["cursor"] = cursor
    return request.path + "?" + urlencode(query)  # the path as it came, already percent-encoded


def _page(
    request: Request,
    page: type[BaseModel],
    items: Sequence[T],
    keys: Sequence[Any],
    render: Callable[[T], BaseModel],
) -> Response:
    """One page of ``items`` (sorted by ``keys``): those whose key is past the cursor's."""
    limit = _limit(request)
    after = _decode_cursor(request.arg("cursor"))
    start = 0
    if after is not None:
        try:
            start = next((i for i, key in enumerate(keys) if key > after), len(keys))
        except TypeError:
            raise HttpError(400, "bad_cursor", "this cursor is not from this list") from None
    chosen = items[start : start + limit]
    more = start + limit < len(items)
    cursor = _encode_cursor(keys[start + limit - 1]) if more else None
    body = page(items=[render(i) for i in chosen], next_cursor=cursor, next=_next_link(request, cursor))
    return _ok(body)


def _topic_permission_out(t: TopicPermission) -> TopicPermissionOut:
    return TopicPermissionOut(user=t.user, vhost=t.vhost, exchange=t.exchange, write=t.write, read=t.read)


def _label(key: str) -> str:
    """A queue as a chart's legend shows it: its name, and its vhost unless it is ``/``."""
    vhost, name = split_key(key)
    return name if vhost == DEFAULT_VHOST else f"{name} (vhost {vhost})"


def _own_id(client: Client) -> str:
    """The client id as the client sent it (an MQTT client's is kept behind its vhost's prefix)."""
    return strip(client.client_id, prefix(client.vhost))


def _client_out(client: Client) -> ClientOut:
    return ClientOut(**client_json(client) | {"client_id": _own_id(client)})


def _permission_out(permission: Permission) -> PermissionOut:
    p = permission
    return PermissionOut(user=p.user, vhost=p.vhost, configure=p.configure, write=p.write, read=p.read)


def _session_out(session: SessionInfo) -> SessionOut:
    vhost, client_id = split_key(session.client_id)
    return SessionOut(
        client_id=client_id,
        vhost=vhost,
        connected=session.connected,
        protocol_level=session.protocol_level,
        expiry_interval_s=session.expiry_interval_s,
        expires_in_s=session.expires_in_s,
        subscription_count=session.subscription_count,
        inflight=session.inflight,
        queued=session.queued,
        dropped=session.dropped,
    )


def _bridge_out(bridge: BridgeStatus) -> BridgeOut:
    fields = {name: getattr(bridge, name) for name in BridgeOut.model_fields}
    return BridgeOut(**fields | {"state_for_s": round(bridge.state_for_s, 3), "topics": list(bridge.topics)})


def _webhook_out(state: dict[str, Any]) -> WebhookOut:
    fields = {name: state[name] for name in WebhookOut.model_fields if name in state}
    return WebhookOut(
        **fields | {"url": _shown_url(state["url"])},
        last_error_at_ms=state["last_error_ms"],
        last_success_at_ms=state["last_success_ms"],
    )


def _shown_url(url: str) -> str:
    """An endpoint's origin: its path and query may carry a secret (hook URLs often do)."""
    parts = urlsplit(url)
    origin = f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}"
    return origin + ("/…" if parts.path.strip("/") or parts.query else "")


def _queue_out(info: QueueInfo) -> QueueOut:
    return QueueOut(**_queue_fields(info))


def _queue_detail(info: QueueInfo) -> QueueDetail:
    return QueueDetail(**_queue_fields(info), policy=info.policy, stats=info.stats)


def _queue_fields(info: QueueInfo) -> dict[str, Any]:
    vhost, name = split_key(info.name)
    return {
        "name": name,
        "vhost": vhost,
        "mode": info.mode,
        "durable": info.durable,
        "depth": info.depth,
        "bytes": info.bytes,
        "pending": info.pending,
        "lag": info.lag,
        "groups": [
            GroupOut(
                name=g.name,
                cursor=g.cursor,
                committed=g.committed,
                pending=g.pending,
                waiting=g.waiting,
                lag=g.lag,
                consumers=g.consumers,
            )
            for g in info.groups.values()
        ],
        "dlq": None if info.dlq is None else split_key(info.dlq)[1],
        "dlq_depth": info.dlq_depth,
    }


def _message_out(key: str, stored: StoredMessage, encoding: str) -> MessageOut:
    """A stored message as the queue's clients see it: the queue's and the topic's own names."""
    vhost, queue = split_key(key)
    message = stored.message
    text: str | None = None
    if encoding != "base64":
        try:
            text = message.payload.decode()
        except UnicodeDecodeError:
            text = None  # not UTF-8: base64 whatever was asked
    correlation = message.correlation_data
    return MessageOut(
        offset=stored.offset,
        message_id=f"{queue}:{stored.offset}",
        topic=strip(message.topic, prefix(vhost)),
        routing_key=stored.routing_key,
        payload=text if text is not None else base64.b64encode(message.payload).decode(),
        encoding="text" if text is not None else "base64",
        size=stored.size,
        content_type=message.content_type,
        response_topic=message.response_topic,
        correlation_data=base64.b64encode(correlation).decode() if correlation is not None else None,
        user_properties=list(message.user_properties),
        published_at_ms=stored.published_at,
        expires_at_ms=stored.expires_at,
    )


def _queue_error(exc: QueueError) -> HttpError:
    status = {
        "no-queue": 404,
        "bad-name": 400,
        "bad-topic": 400,
        "retain": 400,
        "full": 409,
        "mode-mismatch": 409,
        "unsupported": 409,
        "stopped": 503,
        "storage": 503,
    }.get(exc.reason, 400)
    return HttpError(status, exc.reason.replace("-", "_"), str(exc))


# -- OpenAPI 3.1 ------------------------------------------------------------------------------------

REF_TEMPLATE = "#/components/schemas/{model}"


def openapi_document(routes: Sequence[ApiRoute]) -> dict[str, Any]:
    models: set[type[BaseModel]] = {ErrorBody}
    for route in routes:
        if route.body is not None:
            models.add(route.body)
        models.update(m for m in route.responses.values() if isinstance(m, type))
    ordered = sorted(models, key=lambda m: m.__name__)
    refs, defs = models_json_schema(
        [(m, "validation" if _is_body(m, routes) else "serialization") for m in ordered],
        ref_template=REF_TEMPLATE,
    )
    schemas: dict[str, Any] = dict(defs.get("$defs", {}))

    def ref(model: type[BaseModel], mode: str) -> dict[str, Any]:
        return dict(refs[(model, mode)])  # type: ignore[index]

    paths: dict[str, dict[str, Any]] = {}
    for route in routes:
        operation: dict[str, Any] = {
            "summary": route.summary,
            "operationId": f"{route.method.lower()}_{_operation_name(route.path)}",
            "tags": list(route.tags or ("admin",)),
        }
        parameters = [
            {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
            for name in route.path_params
        ]
        parameters += [
            {
                "name": q.name,
                "in": "query",
                "required": False,
                "schema": q.schema,
                "description": q.description,
            }
            for q in route.query
        ]
        if parameters:
            operation["parameters"] = parameters
        if route.body is not None:
            operation["requestBody"] = {
                "required": route.body_required,
                "content": {"application/json": {"schema": ref(route.body, "validation")}},
            }
        responses: dict[str, Any] = {}
        for status, what in route.responses.items():
            responses[str(status)] = _response(status, what, ref)
        for status in route.error_statuses():
            responses.setdefault(str(status), _response(status, ErrorBody, ref))
        operation["responses"] = responses
        if not route.auth:
            operation["security"] = []
        paths.setdefault(route.path, {})[route.method.lower()] = operation
    return {
        "openapi": "3.1.0",
        "info": {"title": "Trimaran admin API", "version": __version__},
        "servers": [{"url": "/"}],
        "security": [{"bearer": []}],
        "paths": paths,
        "components": {
            "schemas": schemas,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }


def _is_body(model: type[BaseModel], routes: Sequence[ApiRoute]) -> bool:
    return any(route.body is model for route in routes)


def _response(
    status: int, what: type[BaseModel] | str | None, ref: Callable[[type[BaseModel], str], dict[str, Any]]
) -> dict[str, Any]:
    description = _STATUS_TEXT.get(status, "response")
    if what is None:
        return {"description": description}
    if isinstance(what, str):
        return {"description": description, "content": {what: {"schema": {"type": "string"}}}}
    return {
        "description": description,
        "content": {"application/json": {"schema": ref(what, "serialization")}},
    }


def _operation_name(path: str) -> str:
    parts = [p.strip("{}") for p in path.split("/") if p and p not in ("api", "v1")]
    return "_".join(p.replace(".", "_") for p in parts) or "root"


_STATUS_TEXT = {
    200: "OK",
    201: "Created",
    202: "Accepted, under way",
    400: "Bad request (body, parameter or cursor)",
    401: "No token, or a wrong one (WWW-Authenticate says which)",
    404: "Not found",
    409: "Conflict",
    413: "Request body too large",
    503: "Not ready, or the server is starting",
}
