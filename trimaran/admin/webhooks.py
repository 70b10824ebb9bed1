"""Webhooks: the broker's events POSTed as signed JSON to HTTP endpoints. The broker never waits.

One :class:`WebhookDispatcher` per configured endpoint listens on the broker's event bus. Its
listener (``offer``) runs inline in the broker: it filters by topic and appends to a bounded queue
(the oldest event goes, counted, when it is full) and returns. The dispatcher's own task takes
batches from that queue (up to ``batch_max`` events, waiting at most ``batch_wait_ms`` for them)
and POSTs each as ``{"events": [envelope, ...]}`` where an envelope is
``{"id", "type", "time" (epoch ms), "node", "data"}``.

Delivery: one HTTP/1.1 connection per endpoint (h11 over anyio, http or https), kept alive and
reused; each request bounded by ``timeout_s``. A 2xx answer is success. A network error, a
timeout, a 5xx, 408 or 429 is retried after ``random(0, min(backoff_max_s, backoff_initial_s *
2**n))`` (exponential backoff with full jitter), ``max_retries`` times, then the batch is dropped
and counted. Any other status is a refusal that no retry would change: dropped and counted at once.

A circuit breaker per endpoint opens after ``breaker_threshold`` consecutive failures; while it is
open nothing is sent and events queue up (within the bound). After ``breaker_cooldown_s`` one probe
request goes out (half-open): success closes the breaker, failure opens it for another cooldown.

Signature: with a ``secret``, each request carries ``X-Trimaran-Timestamp: <unix seconds>`` and
``X-Trimaran-Signature: sha256=<hex HMAC-SHA256(secret, timestamp + "." + body)>``; receivers
recompute it and refuse old timestamps (replays). The timestamp is fresh on every attempt.

Vhosts: the bus carries keys (``$vhost/<v>/`` in front of a tenant's topics, client ids and queues:
trimaran/vhosts.py). A receiver gets the names as the clients know them and the vhost in a field of
its own (``data.vhost``), and an endpoint's ``topics`` filters match those names in every vhost:
``#`` is every vhost's topics (but the ``$`` ones), ``a/#`` each vhost's ``a/...``.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import json
import logging
import random
import secrets
import ssl
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Final
from urllib.parse import urlsplit

import anyio
import h11
from anyio.abc import ByteStream, TaskStatus

from trimaran import __version__
from trimaran.broker.events import BusEvent, EventBus, expand_patterns
from trimaran.broker.message import now_ms
from trimaran.config import WebhookEndpoint, WebhookSettings
from trimaran.topics import topic_matches
from trimaran.vhosts import DEFAULT_VHOST, TENANT, split_key

log = logging.getLogger(__name__)

READ_CHUNK: Final = 65536
MAX_RESPONSE_BODY: Final = 64 * 1024  # an answer's body is read (to reuse the connection) and ignored
RETRY_STATUSES: Final = frozenset({408, 429})
# The fields of an event's data that hold keys: a receiver sees them without the vhost's prefix.
KEY_FIELDS: Final = (
    "topic",
    "client_id",
    "queue",
    "dead_letter_queue",
    "topic_filter",
    "subscriber",
    "consumer",
)

CLOSED: Final = "closed"
OPEN: Final = "open"
HALF_OPEN: Final = "half_open"


def sign(secret: bytes, timestamp: str, body: bytes) -> str:
    """The signature header's value: ``sha256=`` and the hex HMAC of ``timestamp + "." + body``."""
    digest = hmac.new(secret, timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()
    return f"sha256={digest}"


class CircuitBreaker:
    """Closed -> open after ``threshold`` consecutive failures -> half-open after ``cooldown_s``."""

    def __init__(
        self, threshold: int, cooldown_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.threshold = threshold
        self.cooldown_s = cooldown_s
        self.clock = clock
        self.state = CLOSED
        self.failures = 0  # consecutive
        self.opened = 0  # how many times it opened
        self._opened_at = 0.0

    def wait_s(self) -> float:
        """Seconds before a request may go; 0 means now (an open breaker turns half-open here)."""
        if self.state != OPEN:
            return 0.0
        left = self._opened_at + self.cooldown_s - self.clock()
        if left > 0:
            return left
        self.state = HALF_OPEN
        return 0.0

    def success(self) -> None:
        self.failures = 0
        self.state = CLOSED

    def failure(self) -> None:
        self.failures += 1
        if self.state == HALF_OPEN or (self.state == CLOSED and self.failures >= self.threshold):
            self.state = OPEN
            self.opened += 1
            self._opened_at = self.clock()


class TransportError(Exception):
    """The request did not get an answer (connect, TLS, send, receive, timeout, bad HTTP)."""


class HttpClient:
    """POST over one kept-alive HTTP/1.1 connection: h11 for the protocol, anyio for the socket."""

    def __init__(self, url: str, timeout_s: float, ssl_context: ssl.SSLContext | None = None) -> None:
        parts = urlsplit(url)
        self.tls = parts.scheme == "https"
        if parts.hostname is None:
            raise ValueError(f"no host in {url!r}")
        self.host = parts.hostname
        self.port = parts.port or (443 if self.tls else 80)
        self.host_header = parts.netloc.rpartition("@")[2]
        self.target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        self.timeout_s = timeout_s
        self.ssl_context = ssl_context if ssl_context is not None else ssl.create_default_context()
        self._stream: ByteStream | None = None
        self._conn: h11.Connection | None = None
        self.connections = 0  # opened so far (connection reuse shows as few)

    async def post(self, body: bytes, headers: list[tuple[str, str]]) -> int:
        """Send the request; returns the answer's status. Raises :class:`TransportError`."""
        reused = self._stream is not None
        try:
            return await self._post_once(body, headers)
        except _Stale:
            # A kept-alive connection the server had closed: nothing was answered, so try a new one.
            if not reused:
                raise TransportError("connection closed before an answer") from None
            return await self._post_once(body, headers)

    async def _post_once(self, body: bytes, headers: list[tuple[str, str]]) -> int:
        answered = False
        try:
            with anyio.fail_after(self.timeout_s):
                if self._stream is None:
                    await self._connect()
                assert self._stream is not None and self._conn is not None
                stream, conn = self._stream, self._conn
                request = h11.Request(
                    method="POST",
                    target=self.target,
                    headers=[
                        ("Host", self.host_header),
                        ("User-Agent", f"trimaran/{__version__}"),
                        ("Content-Type", "application/json"),
                        ("Content-Length", str(len(body))),
                        *headers,
                    ],
                )
                await stream.send(
                    conn.send(request) + conn.send(h11.Data(data=body)) + conn.send(h11.EndOfMessage())
                )
                status = 0
                received = 0
                while True:
                    event = conn.next_event()
                    if event is h11.NEED_DATA:
                        try:
                            data = await stream.receive(READ_CHUNK)
                        except anyio.EndOfStream:
                            data = b""
                        answered = answered or bool(data)
                        conn.receive_data(data)
                    elif isinstance(event, h11.Response):
                        status = event.status_code
                    elif isinstance(event, h11.Data):
                        received += len(event.data)
                        if received > MAX_RESPONSE_BODY:
                            raise TransportError("answer body too large")
                    elif isinstance(event, h11.EndOfMessage):
                        break
                    elif isinstance(event, h11.ConnectionClosed):
                        raise _Stale if not answered else TransportError("connection closed mid-answer")
            if conn.our_state is h11.DONE and conn.their_state is h11.DONE:
                conn.start_next_cycle()
            else:
                await self.aclose()
            return status
        except _Stale:
            await self.aclose()
            raise
        except TimeoutError:
            await self.aclose()
            raise TransportError(f"no answer within {self.timeout_s}s") from None
        except h11.RemoteProtocolError as exc:
            await self.aclose()
            if not answered:
                raise _Stale from None
            raise TransportError(f"bad HTTP answer: {exc}") from None
        except (OSError, anyio.BrokenResourceError, anyio.ClosedResourceError, ssl.SSLError) as exc:
            await self.aclose()
            if not answered and isinstance(exc, (anyio.BrokenResourceError, ConnectionError)):
                raise _Stale from None
            raise TransportError(f"{type(exc).__name__}: {exc}") from None
        except TransportError:
            await self.aclose()
            raise

    async def _connect(self) -> None:
        try:
            if self.tls:
                stream: ByteStream = await anyio.connect_tcp(
                    self.host,
                    self.port,
                    tls=True,
                    ssl_context=self.ssl_context,
                    tls_hostname=self.host,
                    tls_standard_compatible=False,
                )
            else:
                stream = await anyio.connect_tcp(self.host, self.port)
        except (OSError, ssl.SSLError) as exc:
            raise TransportError(f"cannot connect to {self.host}:{self.port}: {exc}") from None
        self._stream = stream
        self._conn = h11.Connection(h11.CLIENT)
        self.connections += 1

    async def aclose(self) -> None:
        stream, self._stream, self._conn = self._stream, None, None
        if stream is not None:
            with anyio.move_on_after(1, shield=True):
                with contextlib.suppress(OSError, anyio.BrokenResourceError, ssl.SSLError):
                    await stream.aclose()


class _Stale(Exception):
    """The connection ended before any byte of an answer (a stale keep-alive connection)."""


def client_view(data: dict[str, Any]) -> dict[str, Any]:
    """A copy of an event's data as a receiver sees it: the names without their vhost's prefix and
    the vhost in ``vhost`` (given by the emitter, else read from the first key that names one)."""
    view = dict(data)
    vhost = data.get("vhost")
    for field in KEY_FIELDS:
        value = data.get(field)
        if isinstance(value, str) and value.startswith(TENANT):
            owner, view[field] = split_key(value)
            vhost = vhost or owner
    view["vhost"] = vhost or DEFAULT_VHOST
    return view


class WebhookDispatcher:
    """One endpoint: its filters, bounded queue, batching, HTTP client, retries and breaker."""

    def __init__(
        self, endpoint: WebhookEndpoint, settings: WebhookSettings, node: str, boot_id: str, name: str
    ) -> None:
        self.name = name
        self.url = endpoint.url
        parts = urlsplit(endpoint.url)
        self.display_url = endpoint.url.replace(parts.netloc, parts.netloc.rpartition("@")[2], 1)
        self.events = tuple(endpoint.events)  # as configured: patterns such as "queue.*"
        self.types = expand_patterns(endpoint.events)
        self.topics = tuple(endpoint.topics)
        self._any_topic = "#" in self.topics
        self.include_payload = endpoint.include_payload
        self.headers = list(endpoint.headers.items())
        self.secret = endpoint.secret.get_secret_value().encode() if endpoint.secret else None
        self.settings = settings
        self.node = node
        self.boot_id = boot_id
        context = None
        if endpoint.ca_file is not None:
            context = ssl.create_default_context(cafile=str(endpoint.ca_file))
        self.client = HttpClient(endpoint.url, settings.timeout_s, context)
        self.breaker = CircuitBreaker(settings.breaker_threshold, settings.breaker_cooldown_s)
        self.queue: deque[BusEvent] = deque()
        self.queue_size = settings.queue_size
        # Counters (events unless said otherwise), read by telemetry and the admin API.
        self.accepted = 0  # taken into the queue
        self.sent = 0  # delivered (a 2xx answer)
        self.dropped = 0  # lost: dropped_queue_full + dropped_failed
        self.dropped_queue_full = 0  # pushed out of a full queue (oldest first)
        self.dropped_failed = 0  # in a batch that failed every retry, or was refused
        self.dropped_shutdown = 0  # still queued or in flight when the shutdown flush ran out of time
        self.in_flight = 0  # events in the batch being sent
        self.requests = 0  # HTTP requests made
        self.failed = 0  # requests that failed (no answer, or not 2xx)
        self.retried = 0  # requests that were retries
        # Health, for the admin API and the management page: failing from the first request that
        # fails (no answer, or not 2xx) until one succeeds, whatever the breaker says.
        self.consecutive_failures = 0
        self.last_error: str | None = None
        self.last_error_ms: int | None = None
        self.last_success_ms: int | None = None
        self._wake = anyio.Event()
        self._closing = False
        self.finished = anyio.Event()

    # -- in the broker: never blocks -------------------------------------------------------------

    def offer(self, event: BusEvent) -> None:
        """The event bus listener: filter, then queue (the oldest goes when full)."""
        topic = event.topic
        if topic is not None and not self._topic_wanted(topic):
            return
        queue = self.queue
        if len(queue) >= self.queue_size:
            queue.popleft()
            self.dropped += 1
            self.dropped_queue_full += 1
        queue.append(event)
        self.accepted += 1
        self._wake.set()

    def _topic_wanted(self, topic: str) -> bool:
        if topic[:1] == "$":
            topic = split_key(topic)[1]  # a tenant's topic, as its clients name it
        if self._any_topic and not topic.startswith("$"):
            return True  # '#' matches every topic but the $ ones (the MQTT rule)
        return any(topic_matches(topic_filter, topic) for topic_filter in self.topics)

    # -- the dispatcher's task ---------------------------------------------------------------------

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        try:
            while True:
                batch = await self._next_batch()
                if batch is None:
                    return
                await self._deliver(batch)
        finally:
            self.finished.set()
            await self.client.aclose()

    def close(self) -> None:
        """Stop waiting to fill batches; the task ends once the queue is empty."""
        self._closing = True
        self._wake.set()

    async def _wait(self, timeout: float) -> None:
        with anyio.move_on_after(timeout):
            await self._wake.wait()
        if self._wake.is_set():
            self._wake = anyio.Event()

    async def _next_batch(self) -> list[BusEvent] | None:
        queue = self.queue
        while not queue:
            if self._closing:
                return None
            await self._wait(float("inf"))
        batch_max = self.settings.batch_max
        wait_ms = self.settings.batch_wait_ms
        while len(queue) < batch_max and not self._closing:
            # No event waits longer than batch_wait_ms (from when it happened) for others to join it.
            left = (queue[0].time_ms + wait_ms - now_ms()) / 1000
            if left <= 0:
                break
            await self._wait(left)
        return [queue.popleft() for _ in range(min(batch_max, len(queue)))]

    def encode(self, batch: list[BusEvent]) -> bytes:
        """The request body: ``{"events": [envelope, ...]}``."""
        envelopes = []
        for event in batch:
            data = client_view(event.data)
            if self.include_payload and event.payload is not None:
                data["payload_base64"] = base64.b64encode(event.payload).decode("ascii")
                with contextlib.suppress(UnicodeDecodeError):
                    data["payload_text"] = event.payload.decode("utf-8")
            envelopes.append(
                {
                    "id": f"{self.boot_id}-{event.seq}",
                    "type": event.type,
                    "time": event.time_ms,
                    "node": self.node,
                    "data": data,
                }
            )
        return json.dumps({"events": envelopes}, separators=(",", ":"), default=str).encode()

    async def _deliver(self, batch: list[BusEvent]) -> None:
        self.in_flight = len(batch)
        try:
            await self._deliver_batch(batch)
        finally:
            self.in_flight = 0

    async def _deliver_batch(self, batch: list[BusEvent]) -> None:
        body = self.encode(batch)
        settings = self.settings
        attempt = 0
        while True:
            wait = self.breaker.wait_s()
            if wait > 0:
                await anyio.sleep(wait)
                continue
            outcome = await self._request(body)
            if outcome is None:
                self.breaker.success()
                self.sent += len(batch)
                self.consecutive_failures = 0
                self.last_success_ms = now_ms()
                return
            retryable, why = outcome
            self.failed += 1
            self.consecutive_failures += 1
            self.last_error, self.last_error_ms = why, now_ms()
            if not retryable:
                self.breaker.success()  # the endpoint answers; it refuses this batch
                self._drop(batch, why)
                return
            self.breaker.failure()
            if attempt >= settings.max_retries:
                self._drop(batch, f"{why}, after {attempt} retries")
                return
            attempt += 1
            self.retried += 1
            ceiling = min(settings.backoff_max_s, settings.backoff_initial_s * 2 ** (attempt - 1))
            log.debug("webhook %s: %s; retry %d in up to %.2fs", self.display_url, why, attempt, ceiling)
            await anyio.sleep(random.uniform(0, ceiling))

    async def _request(self, body: bytes) -> tuple[bool, str] | None:
        """None on success, else (retryable, why)."""
        headers = list(self.headers)
        if self.secret is not None:
            timestamp = str(int(time.time()))
            headers.append((self.settings.timestamp_header, timestamp))
            headers.append((self.settings.signature_header, sign(self.secret, timestamp, body)))
        self.requests += 1
        try:
            status = await self.client.post(body, headers)
        except TransportError as exc:
            return True, str(exc)
        if 200 <= status < 300:
            return None
        retryable = status >= 500 or status in RETRY_STATUSES
        return retryable, f"HTTP {status}"

    def _drop(self, batch: list[BusEvent], why: str) -> None:
        self.dropped += len(batch)
        self.dropped_failed += len(batch)
        log.warning("webhook %s: %d events dropped (%s)", self.display_url, len(batch), why)

    def lost_at_shutdown(self) -> None:
        lost = len(self.queue) + self.in_flight
        self.dropped += lost
        self.dropped_shutdown += lost
        log.warning(
            "webhook %s: %d events not sent at shutdown (%d queued, %d in flight)",
            self.display_url,
            lost,
            len(self.queue),
            self.in_flight,
        )

    @property
    def healthy(self) -> bool:
        return self.consecutive_failures == 0

    def stats(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "url": self.display_url,
            "events": list(self.events),
            "topics": list(self.topics),
            "healthy": self.healthy,
            "consecutive_failures": self.consecutive_failures,
            "last_error": self.last_error,
            "last_error_ms": self.last_error_ms,
            "last_success_ms": self.last_success_ms,
            "queued": len(self.queue),
            "queue_size": self.queue_size,
            "in_flight": self.in_flight,
            "accepted": self.accepted,
            "sent": self.sent,
            "dropped": self.dropped,
            "dropped_queue_full": self.dropped_queue_full,
            "dropped_failed": self.dropped_failed,
            "dropped_shutdown": self.dropped_shutdown,
            "requests": self.requests,
            "failed": self.failed,
            "retried": self.retried,
            "connections": self.client.connections,
            "breaker": self.breaker.state,
            "breaker_opened": self.breaker.opened,
        }


class Webhooks:
    """Every configured endpoint's dispatcher, joined to the broker's event bus."""

    def __init__(self, settings: WebhookSettings, bus: EventBus, node: str) -> None:
        self.settings = settings
        self.bus = bus
        boot_id = secrets.token_hex(6)  # event ids: unique across restarts as well
        self.dispatchers = [
            WebhookDispatcher(endpoint, settings, node, boot_id, f"webhook-{index}")
            for index, endpoint in enumerate(settings.endpoints)
        ]
        self._unsubscribe: list[Callable[[], None]] = []

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        async with anyio.create_task_group() as tg:
            for dispatcher in self.dispatchers:
                await tg.start(dispatcher.run, name=dispatcher.name)
                self._unsubscribe.append(self.bus.subscribe(dispatcher.offer, dispatcher.types))
                log.info(
                    "webhook %s: %s, %d event types",
                    dispatcher.name,
                    dispatcher.display_url,
                    len(dispatcher.types),
                )
            task_status.started()

    async def flush(self) -> None:
        """At shutdown: stop listening, then send what is queued within ``flush_timeout_s``."""
        for unsubscribe in self._unsubscribe:
            unsubscribe()
        self._unsubscribe.clear()
        for dispatcher in self.dispatchers:
            dispatcher.close()
        with anyio.move_on_after(self.settings.flush_timeout_s):
            for dispatcher in self.dispatchers:
                await dispatcher.finished.wait()
        for dispatcher in self.dispatchers:
            if not dispatcher.finished.is_set():
                dispatcher.lost_at_shutdown()

    def stats(self) -> list[dict[str, Any]]:
        return [dispatcher.stats() for dispatcher in self.dispatchers]
