"""Webhook dispatchers against a real HTTP receiver on port 0: signature, envelope, batching, retries,
breaker, drops, filters, TLS, shutdown flush."""

from __future__ import annotations

import base64
import itertools
import ssl
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest
import trustme

from tests.support.server import refused_port
from tests.support.webhook_receiver import Receiver, verify
from trimaran.admin.webhooks import CLOSED, OPEN, CircuitBreaker, Webhooks
from trimaran.broker.events import CLIENT_CONNECTED, MESSAGE_PUBLISHED, QUEUE_DEAD_LETTERED, EventBus
from trimaran.broker.message import PROTOCOL_MQTT, Message
from trimaran.config import WebhookEndpoint, WebhookSettings
from trimaran.vhosts import prefix

pytestmark = pytest.mark.anyio

SECRET = "s3cret"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with Receiver() as running:
        yield running


def settings(url: str, **overrides: Any) -> WebhookSettings:
    endpoint: dict[str, Any] = {"url": url, "secret": SECRET}
    for key in ("events", "topics", "include_payload", "headers", "ca_file"):
        if key in overrides:
            endpoint[key] = overrides.pop(key)
    values: dict[str, Any] = {
        "batch_max": 10,
        "batch_wait_ms": 0,
        "timeout_s": 2.0,
        "max_retries": 3,
        "backoff_initial_s": 0.01,
        "backoff_max_s": 0.05,
        "breaker_threshold": 5,
        "breaker_cooldown_s": 0.2,
        "flush_timeout_s": 2.0,
        **overrides,
    }
    return WebhookSettings(endpoints=[WebhookEndpoint(**endpoint)], **values)


@asynccontextmanager
async def running(config: WebhookSettings) -> AsyncIterator[tuple[EventBus, Webhooks]]:
    bus = EventBus()
    hooks = Webhooks(config, bus, "node-a")
    async with anyio.create_task_group() as tg:
        await tg.start(hooks.run)
        try:
            yield bus, hooks
        finally:
            with anyio.CancelScope(shield=True):
                await hooks.flush()
            tg.cancel_scope.cancel()


def connected(bus: EventBus, client_id: str) -> None:
    bus.client(CLIENT_CONNECTED, client_id, PROTOCOL_MQTT, "127.0.0.1:1234", "alice", session_present=False)


def published(bus: EventBus, topic: str, payload: bytes = b"hello") -> None:
    bus.message(MESSAGE_PUBLISHED, Message(topic, payload, qos=1, publisher_id="pub", protocol=PROTOCOL_MQTT))


async def wait_until(condition: Any, timeout: float = 5.0) -> None:
    with anyio.fail_after(timeout):
        while not condition():
            await anyio.sleep(0.01)


async def test_signature_and_envelope(receiver: Receiver) -> None:
    config = settings(receiver.url, include_payload=True, headers={"X-Tenant": "blue"})
    async with running(config) as (bus, hooks):
        connected(bus, "c1")
        published(bus, "a/b", "héllo".encode())
        published(bus, "a/bin", b"\xff\x00")
        await anyio.to_thread.run_sync(receiver.wait_for, 1)
        await wait_until(lambda: hooks.dispatchers[0].sent == 3)
    request = receiver.requests[0]
    assert request.path == "/hooks"
    assert request.headers["content-type"] == "application/json"
    assert request.headers["x-tenant"] == "blue"
    assert verify(SECRET.encode(), request.headers, request.body)
    assert not verify(b"wrong", request.headers, request.body)
    assert not verify(SECRET.encode(), request.headers, request.body + b" ")
    events = receiver.events()
    assert [e["type"] for e in events] == ["client.connected", "message.published", "message.published"]
    for event in events:
        assert set(event) == {"id", "type", "time", "node", "data"}
        assert event["node"] == "node-a"
        assert abs(event["time"] - time.time() * 1000) < 10_000
    assert len({e["id"] for e in events}) == 3
    assert events[0]["data"] == {
        "client_id": "c1",
        "protocol": "mqtt",
        "address": "127.0.0.1:1234",
        "user": "alice",
        "session_present": False,
        "vhost": "/",
    }
    text = events[1]["data"]
    assert text["topic"] == "a/b" and text["qos"] == 1 and text["client_id"] == "pub"
    assert text["payload_text"] == "héllo"
    assert base64.b64decode(text["payload_base64"]) == "héllo".encode()
    binary = events[2]["data"]
    assert "payload_text" not in binary and base64.b64decode(binary["payload_base64"]) == b"\xff\x00"


async def test_payload_left_out_unless_configured(receiver: Receiver) -> None:
    async with running(settings(receiver.url)) as (bus, hooks):
        published(bus, "a/b")
        await wait_until(lambda: hooks.dispatchers[0].sent == 1)
    data = receiver.events()[0]["data"]
    assert "payload_base64" not in data and "payload_text" not in data and data["size"] == 5


async def test_batches_fill_up_to_max_and_reuse_one_connection(receiver: Receiver) -> None:
    async with running(settings(receiver.url, batch_max=3, batch_wait_ms=5000)) as (bus, hooks):
        for i in range(7):
            connected(bus, f"c{i}")
        # 3 + 3 leave at once (full batches); the seventh waits for more, up to the flush at exit.
        requests = await anyio.to_thread.run_sync(receiver.wait_for, 2)
        assert [len(r.events) for r in requests] == [3, 3]
        await anyio.sleep(0.2)
        assert len(receiver.requests) == 2
    assert [len(r.events) for r in receiver.requests] == [3, 3, 1]  # the shutdown flush sent the last
    assert [e["data"]["client_id"] for e in receiver.events()] == [f"c{i}" for i in range(7)]
    assert hooks.dispatchers[0].client.connections == 1
    assert receiver.connections == 1


async def test_a_kept_alive_connection_the_server_closed_is_replaced_without_a_failure(
    receiver: Receiver,
) -> None:
    receiver.close_silently = True
    async with running(settings(receiver.url, max_retries=0)) as (bus, hooks):
        for i in range(3):
            connected(bus, f"c{i}")
            await wait_until(lambda i=i: hooks.dispatchers[0].sent == i + 1)
            await anyio.sleep(0.05)  # the server's close arrives while the connection is idle
    stats = hooks.stats()[0]
    assert stats["failed"] == 0 and stats["dropped"] == 0 and stats["requests"] == 3
    assert stats["connections"] == 3 and receiver.connections == 3


async def test_a_lone_event_waits_at_most_batch_wait(receiver: Receiver) -> None:
    async with running(settings(receiver.url, batch_max=100, batch_wait_ms=150)) as (bus, _hooks):
        started = time.monotonic()
        connected(bus, "c1")
        connected(bus, "c2")
        request = (await anyio.to_thread.run_sync(receiver.wait_for, 1))[0]
        waited = request.at - started
    assert len(request.events) == 2  # gathered into one request
    assert 0.13 <= waited < 1.0, waited


async def test_retry_after_500_then_success(receiver: Receiver) -> None:
    receiver.statuses.extend([500, 503])
    async with running(settings(receiver.url)) as (bus, hooks):
        connected(bus, "c1")
        await wait_until(lambda: hooks.dispatchers[0].sent == 1)
        stats = hooks.stats()[0]
    assert [r.status for r in receiver.requests] == [500, 503, 200]
    assert len({r.body for r in receiver.requests}) == 1  # the same batch, ids and all
    assert all(verify(SECRET.encode(), r.headers, r.body) for r in receiver.requests)
    assert stats["requests"] == 3 and stats["failed"] == 2 and stats["retried"] == 2
    assert stats["dropped"] == 0 and stats["breaker"] == CLOSED


async def test_health_fails_with_the_last_error_and_recovers_on_success(receiver: Receiver) -> None:
    receiver.statuses.extend([500, 502])
    config = settings(receiver.url, breaker_threshold=2, breaker_cooldown_s=0.5, max_retries=5)
    async with running(config) as (bus, hooks):
        dispatcher = hooks.dispatchers[0]
        assert dispatcher.healthy and hooks.stats()[0]["last_success_ms"] is None
        connected(bus, "c1")
        await wait_until(lambda: dispatcher.breaker.state == OPEN)  # cooling down: nothing is sent
        failing = hooks.stats()[0]
        assert not failing["healthy"] and failing["consecutive_failures"] == 2
        assert failing["last_error"] == "HTTP 502" and failing["last_success_ms"] is None
        assert failing["in_flight"] == 1 and failing["events"] == ["*"]
        await wait_until(lambda: dispatcher.sent == 1)
        recovered = hooks.stats()[0]
    assert recovered["healthy"] and recovered["consecutive_failures"] == 0
    assert recovered["last_error"] == "HTTP 502"  # kept: when it last failed, and why
    assert recovered["last_success_ms"] >= recovered["last_error_ms"] >= failing["last_error_ms"]


async def test_a_refusal_is_not_retried(receiver: Receiver) -> None:
    receiver.statuses.append(400)
    async with running(settings(receiver.url)) as (bus, hooks):
        connected(bus, "c1")
        await wait_until(lambda: hooks.dispatchers[0].dropped == 1)
        connected(bus, "c2")
        await wait_until(lambda: hooks.dispatchers[0].sent == 1)
    assert [r.status for r in receiver.requests] == [400, 200]
    assert hooks.stats()[0]["dropped_failed"] == 1


async def test_breaker_opens_after_repeated_failures_and_recovers(receiver: Receiver) -> None:
    receiver.statuses.extend([500] * 4)
    config = settings(receiver.url, breaker_threshold=2, breaker_cooldown_s=0.3, max_retries=10)
    async with running(config) as (bus, hooks):
        dispatcher = hooks.dispatchers[0]
        connected(bus, "c1")
        await wait_until(lambda: dispatcher.breaker.state == OPEN)
        assert len(receiver.requests) == 2  # nothing goes out while it is open
        connected(bus, "c2")  # queued meanwhile
        await wait_until(lambda: dispatcher.sent == 2, timeout=10)
        assert dispatcher.breaker.state == CLOSED
    times = [r.at for r in receiver.requests]
    assert [r.status for r in receiver.requests] == [500, 500, 500, 500, 200, 200]
    # Opened after the 2nd failure, again after each failed half-open probe (3rd and 4th).
    assert dispatcher.breaker.opened == 3
    for before, after in itertools.pairwise(times[1:5]):
        assert after - before >= 0.25, times
    assert [e["data"]["client_id"] for e in receiver.events()[-2:]] == ["c1", "c2"]


async def test_drops_counted_when_receiver_is_down_and_queue_full() -> None:
    url = f"http://127.0.0.1:{refused_port()}/hooks"
    config = settings(url, queue_size=5, batch_max=5, max_retries=1, breaker_threshold=100)
    async with running(config) as (bus, hooks):
        dispatcher = hooks.dispatchers[0]
        for i in range(20):  # all before the dispatcher's task runs: the queue keeps the newest 5
            connected(bus, f"c{i}")
        assert [e.data["client_id"] for e in dispatcher.queue] == [f"c{i}" for i in range(15, 20)]
        assert dispatcher.dropped_queue_full == 15
        await wait_until(lambda: dispatcher.dropped == 20)
    stats = hooks.stats()[0]
    assert stats["sent"] == 0 and stats["dropped_failed"] == 5 and stats["accepted"] == 20
    assert stats["requests"] == 2 and stats["failed"] == 2 and stats["retried"] == 1


async def test_filters_by_type_and_topic(receiver: Receiver) -> None:
    config = settings(receiver.url, events=["message.*"], topics=["sensors/+/temp", "alerts/#"])
    async with running(config) as (bus, hooks):
        assert not bus.wants(CLIENT_CONNECTED) and bus.publishing
        connected(bus, "c1")
        for topic in ["sensors/a/temp", "sensors/a/hum", "alerts", "alerts/x/y", "other", "$SYS/x"]:
            published(bus, topic)
        await wait_until(lambda: hooks.dispatchers[0].sent == 3)
    assert [e["data"]["topic"] for e in receiver.events()] == ["sensors/a/temp", "alerts", "alerts/x/y"]
    assert not bus.publishing  # the flush unsubscribed


async def test_a_tenants_events_carry_its_names_and_its_vhost(receiver: Receiver) -> None:
    """The bus carries keys ($vhost/<v>/ in front); a receiver gets the names the clients use, the
    vhost in a field of its own, and ``#`` matches every vhost's topics but their $ ones."""
    config = settings(receiver.url, topics=["#"])
    key = prefix("team/eu")
    async with running(config) as (bus, hooks):
        connected(bus, key + "device-1")  # an MQTT session's key
        published(bus, key + "sensors/temp")
        published(bus, key + "$SYS/broker/uptime")  # the tenant's $ topics: not under its '#'
        published(bus, "sensors/temp")
        bus.queue(QUEUE_DEAD_LETTERED, key + "jobs", group="g", dead_letter_queue=key + "$dlq/jobs")
        await wait_until(lambda: hooks.dispatchers[0].sent == 4)
    connect, tenant, root, dead = (e["data"] for e in receiver.events())
    assert (connect["client_id"], connect["vhost"]) == ("device-1", "team/eu")
    assert (tenant["topic"], tenant["vhost"]) == ("sensors/temp", "team/eu")
    assert (root["topic"], root["vhost"]) == ("sensors/temp", "/")
    assert (dead["queue"], dead["dead_letter_queue"], dead["vhost"]) == ("jobs", "$dlq/jobs", "team/eu")


async def test_a_receiver_that_never_answers_times_out() -> None:
    with Receiver() as receiver:
        receiver.hang = True
        config = settings(receiver.url, timeout_s=0.2, max_retries=1, flush_timeout_s=0.1)
        async with running(config) as (bus, hooks):
            started = time.monotonic()
            connected(bus, "c1")  # returns at once whatever the receiver does
            assert time.monotonic() - started < 0.05
            await wait_until(lambda: hooks.dispatchers[0].dropped == 1)
        stats = hooks.stats()[0]
        assert stats["failed"] == 2 and stats["retried"] == 1 and len(receiver.requests) == 2


async def test_https_endpoint(tmp_path: Any) -> None:
    ca = trustme.CA()
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(server_context)
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    with Receiver(tls=server_context) as receiver:
        async with running(settings(receiver.url, ca_file=ca_file)) as (bus, hooks):
            connected(bus, "c1")
            connected(bus, "c2")
            await wait_until(lambda: hooks.dispatchers[0].sent == 2)
            connected(bus, "c3")
            await wait_until(lambda: hooks.dispatchers[0].sent == 3)
        assert hooks.dispatchers[0].client.connections == 1
    assert [e["data"]["client_id"] for e in receiver.events()] == ["c1", "c2", "c3"]


async def test_https_with_an_unknown_certificate_fails_and_is_counted(tmp_path: Any) -> None:
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    trustme.CA().issue_cert("127.0.0.1").configure_cert(server_context)
    with Receiver(tls=server_context) as receiver:
        async with running(settings(receiver.url, max_retries=0)) as (bus, hooks):
            connected(bus, "c1")
            await wait_until(lambda: hooks.dispatchers[0].dropped == 1)
    assert hooks.stats()[0]["failed"] == 1


def test_breaker_states_with_a_fake_clock() -> None:
    now = [100.0]
    breaker = CircuitBreaker(threshold=3, cooldown_s=10, clock=lambda: now[0])
    breaker.failure()
    breaker.failure()
    assert breaker.state == CLOSED and breaker.wait_s() == 0
    breaker.failure()
    assert breaker.state == OPEN and breaker.wait_s() == 10
    now[0] += 10
    assert breaker.wait_s() == 0 and breaker.state == "half_open"
    breaker.failure()  # the probe failed: open for another cooldown
    assert breaker.state == OPEN and breaker.wait_s() == 10
    now[0] += 10
    breaker.wait_s()
    breaker.success()
    assert breaker.state == CLOSED and breaker.failures == 0 and breaker.opened == 2


def test_config_refuses_unknown_events_and_bad_filters() -> None:
    with pytest.raises(ValueError, match="unknown event type"):
        WebhookEndpoint(url="http://x/", events=["client.kicked"])
    with pytest.raises(ValueError, match="last level"):
        WebhookEndpoint(url="http://x/", topics=["a/#/b"])
    with pytest.raises(ValueError, match="http"):
        WebhookEndpoint(url="ftp://x/")
