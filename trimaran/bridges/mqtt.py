"""A bridge to another MQTT broker, configured as Mosquitto's bridges are (``[[bridges]]``).

Locally the bridge is one more subscriber of the router (its ``out`` topics) and one more publisher
(its ``in`` topics, into the router or a ``$queue/``), in its vhost. Remotely it is an MQTT client
(``mqtt/client.py``) on one connection it keeps up, reconnecting with backoff.

Nothing acknowledged is let go early:

- **Out.** A QoS 1/2 message goes into the bridge's own durable queue, ``$bridge.NAME`` in its
  vhost (``queue/``: committed by the group-commit writer, kept across restarts, seen and peeked
  like any queue). The bridge consumes it with credit as wide as its window to the remote, and
  acknowledges a delivery there only once the remote has acknowledged the message (PUBACK,
  PUBREC); one the remote refuses (5.0) is dead-lettered to ``$dlq/$bridge.NAME``. A reconnect to a
  kept session sends again, with DUP, what was not acknowledged; after a restart of this server the
  queue hands it out again. The queue is bounded (``queue_bytes`` of payload): while the remote is
  connected and behind, the publishers feeding the bridge are held (the runtime's gate, as a slow
  subscriber holds them); while it is away, newer messages past the bound are dropped and counted,
  as an offline session's are. QoS 0 messages are sent while connected and not kept while away
  (Mosquitto's bridge keeps none either).
- **In.** A message from the remote is acknowledged to it only once it is here: routed, or committed
  to its ``$queue/``; the acknowledgements leave in the order the messages came (``InOrder``). While
  a local subscriber it feeds is behind, the bridge's socket is not read (it is one more publisher
  the gates hold).

Loops: the bridge's local subscriptions are No Local (it never takes back what it published here);
at the remote, MQTT 5 subscriptions are No Local too, and 3.1.1 announces a bridge (``try_private``),
which Mosquitto answers by sending it nothing it published itself.
"""

from __future__ import annotations

import asyncio
import logging
import random
import ssl
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import anyio

from trimaran.broker.core import Broker
from trimaran.broker.message import Message, now_ms
from trimaran.broker.router import Delivery, SubscriptionOptions
from trimaran.config import BridgeSettings, BridgeTopic, QueuePolicySettings
from trimaran.mqtt.client import (
    Acknowledged,
    ClientConnection,
    ClientSession,
    Closed,
    Connected,
    Received,
    Subscribed,
)
from trimaran.mqtt.codec import NO_PROPERTIES
from trimaran.mqtt.mapping import message_from_publish, publish_properties
from trimaran.mqtt.packets import MQTT_3_1_1, MQTT_5, Connect, Publish
from trimaran.mqtt.packets import SubscriptionOptions as RemoteOptions
from trimaran.queue.groups import QueueDelivery
from trimaran.queue.handles import ConsumerHandle
from trimaran.queue.manager import PublishResult, QueueManager
from trimaran.queue.outcomes import ACK
from trimaran.queue.policy import QueueError, parse_queue_topic
from trimaran.runtime.confirms import InOrder
from trimaran.runtime.flow import Gate, Stalled
from trimaran.runtime.runner import Runner
from trimaran.vhosts import prefix

log = logging.getLogger("trimaran.bridges")

CONNECT_TIMEOUT_S = 10.0
#: A delivery the remote has not acknowledged stays the bridge's however long the remote is away (a
#: reconnect sends it again itself); the queue must not hand it out again meanwhile.
HELD_FOR_S = 10 * 365 * 24 * 3600.0
#: Local topics whose remote topic a bridge keeps (then it starts again): a few hundred KB at most.
REMOTE_TOPICS_KEPT = 4096
_UNMAPPED = "\x00"  # not yet looked up (no topic holds U+0000)

#: The note (``Message.extra``) of a retained message in the bridge's queue, which keeps no flag.
RETAINED = "bridge-retained"
#: States, as the log, the API and the metrics name them.
CONNECTING, CONNECTED, WAITING, STOPPED = "connecting", "connected", "waiting", "stopped"


@dataclass(slots=True)
class BridgeFigures:
    """What an operator reads of one bridge (the API, metrics, ``trimaran bridges``)."""

    state: str = CONNECTING
    address: str = ""  # the remote's, of the current or last connection
    last_error: str | None = None
    connects: int = 0  # connections the remote accepted
    sent: int = 0  # outbound messages handed to the remote (QoS 1/2: acknowledged by it)
    received: int = 0  # inbound messages taken here
    dropped: int = 0  # outbound messages not kept (QoS 0 while away, past queue_bytes while away)
    refused: int = 0  # messages a side refused: the remote (5.0 reason codes) or a local queue
    in_flight: int = 0  # outbound messages sent and not yet acknowledged by the remote
    since: float = 0.0  # loop time of the last state change


@dataclass(slots=True)
class _Inbound:
    """A message from the remote, acknowledged to it once ``done`` (in arrival order)."""

    publish: Publish
    done: bool = False


class MqttBridge:
    """One ``[[bridges]]`` table: its local subscriptions, its queue, its remote connection.

    ``runner``: whose frames are being acted on (a publisher the gate holds) and the loop;
    ``make_gate``: the runtime's gates (app.flow_gates), one for the bridge's queue.
    """

    def __init__(
        self,
        settings: BridgeSettings,
        broker: Broker,
        *,
        node_name: str,
        runner: Runner,
        make_gate: Callable[[Stalled], Gate],
        queues: QueueManager,
        stalled_timeout_s: float = 30.0,
    ) -> None:
        self.settings = settings
        self.name = settings.name
        self.broker = broker
        self.queues = queues
        self.runner = runner
        self.topics = settings.topics
        self.level = MQTT_5 if settings.bridge_protocol_version == "mqttv50" else MQTT_3_1_1
        self.client_id = settings.remote_clientid or f"{node_name}.{settings.name}"
        self.vhost_prefix = prefix(settings.vhost)
        self.figures = BridgeFigures()
        self.session = ClientSession()
        self._id = f"$bridge/{settings.name}"
        self.queue = self.vhost_prefix + f"$bridge.{settings.name}"  # its outbound queue's key
        self._handle: ConsumerHandle | None = None  # its own queue's
        self._handles: list[ConsumerHandle] = []  # that one first, then each $queue/ out line's
        self._gate = make_gate(self._stalled)
        self._stalled_timeout_s = stalled_timeout_s
        self._waiting: deque[Publish] = deque()  # outbound QoS 0, not yet sent
        self._offsets: dict[int, tuple[ConsumerHandle, int]] = {}  # packet id -> its delivery
        self._remote_of: dict[str, str | None] = {}  # local topic -> remote topic (_outward)
        self._acked: dict[ConsumerHandle, list[int]] = {}  # what the remote acknowledged in this read
        self._inbound: InOrder[_Inbound] = InOrder()
        self._machine: ClientConnection | None = None
        self._transport: asyncio.Transport | None = None
        self._writable = True
        self._held_by = 0
        self._flush_due = False
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        self._gone: anyio.Event | None = None
        self._dropped_in_gap = 0
        self._sent_mark = 0
        self._restart = anyio.Event()  # set: connect again now (the operator's restart)
        self._restarting = False  # the connection is being closed for a restart

    # -- the local side: a subscriber of the router ------------------------------------------------

    @property
    def id(self) -> str:
        return self._id

    def subscribe_locally(self) -> None:
        for topic in self.topics:
            if topic.direction != "in" and not topic.local_filter.startswith("$queue/"):
                options = SubscriptionOptions(qos=topic.qos, no_local=True, retain_as_published=True)
                self.broker.router.subscribe(self, self.vhost_prefix + topic.local_filter, options)

    def deliver(self, message: Message, delivery: Delivery[Any]) -> None:
        remote = self._outward(message.topic[len(self.vhost_prefix) :])
        if remote is None:
            return
        qos = min(message.qos, delivery.qos)
        machine = self._machine
        figures = self.figures
        connected = machine is not None and machine.connected
        if not qos:
            if connected:
                self._waiting.append(self._outbound(message, remote, 0))
                self._flush_soon()
            else:
                figures.dropped += 1
                self._dropped_in_gap += 1
            return
        if message.retain:  # a queue keeps no retain flag of its own: the bridge's note says it
            message = message.copy_with(qos=qos, retain=False, extra={**message.extra, RETAINED: True})
        elif message.qos != qos:
            message = message.copy_with(qos=qos)  # the queue keeps it at the QoS it leaves with
        backlog = self.backlog_bytes
        if not connected and backlog + len(message.payload) > self.settings.queue_bytes:
            figures.dropped += 1  # the queue is full while the remote is away: as an offline session
            self._dropped_in_gap += 1
            return
        try:
            self.queues.publish_nowait(self.queue, message)
        except QueueError as exc:  # the storage refuses writes (disk full, PostgreSQL away)
            figures.dropped += 1
            self._dropped_in_gap += 1
            log.warning("bridge %s: a message for the remote was not queued: %s", self.name, exc)
            return
        if connected and backlog > self.settings.queue_bytes // 2:
            self._gate.hold()  # the remote is behind: the publisher waits for it

    @property
    def backlog_bytes(self) -> int:
        """Payload bytes of the outbound messages queued or in flight: the queue's own count."""
        state = self.queues.queues.get(self.queue)
        return 0 if state is None else state.bytes

    def _outbound(self, message: Message, remote: str, qos: int) -> Publish:
        """The PUBLISH of ``message`` to ``remote``: the retain flag as published, 5.0 properties
        (with the expiry left)."""
        properties = NO_PROPERTIES
        if self.level == MQTT_5:
            properties = publish_properties(message)
            properties.message_expiry_interval = message.remaining_expiry_s(now_ms())
        retain = message.retain or RETAINED in message.extra
        return Publish(remote, message.payload, qos, retain, properties=properties)

    def _outward(self, local: str) -> str | None:
        """The remote topic of ``local`` by the first out line that takes it (kept: a fleet's
        topics repeat, and each message is mapped on its way in and again on its way out)."""
        remote = self._remote_of.get(local, _UNMAPPED)
        if remote is _UNMAPPED:
            remote = next((r for line in self.topics if (r := line.outward(local)) is not None), None)
            if len(self._remote_of) >= REMOTE_TOPICS_KEPT:
                self._remote_of.clear()
            self._remote_of[local] = remote
        return remote

    # -- the flow control's view: a publisher held, and a place that holds ---------------------------

    def held(self, on: bool) -> None:
        """A local subscriber the bridge feeds is behind (``on``): the remote is not read."""
        self._held_by += 1 if on else -1
        transport = self._transport
        if transport is not None and not transport.is_closing():
            if self._held_by:
                transport.pause_reading()
            else:
                transport.resume_reading()

    def _stalled(self, idle_s: float) -> bool:
        """The remote has taken nothing for ``idle_s`` while publishers wait: past the stalled
        consumer time-out the connection is dropped (it is made again, and the queue sent again)."""
        if idle_s < self._stalled_timeout_s:
            return True
        log.warning(
            "bridge %s: the remote acknowledged nothing for %.0f s, %d messages in flight; reconnecting",
            self.name,
            idle_s,
            self.figures.in_flight,
        )
        self._gate.release()
        if self._transport is not None:
            self._transport.abort()
        return False

    # -- the connection ---------------------------------------------------------------------------

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Open the outbound queue, subscribe locally, then keep a connection to the remote until
        cancelled."""
        await self._open_queue()
        self.subscribe_locally()
        self.figures.since = self._loop_time()
        task_status.started()
        base, cap = BridgeSettings.restart_times(self.settings.restart_timeout)
        delay = base
        addresses = self.settings.addresses()
        turn = 0
        try:
            while True:
                host, port = addresses[turn % len(addresses)]
                turn += 1
                self.figures.address = f"{host}:{port}"
                self._set_state(CONNECTING, None)
                connects = self.figures.connects
                try:
                    await self._connect_once(host, port)
                except (OSError, TimeoutError, ssl.SSLError) as exc:
                    self._set_state(WAITING, f"cannot connect to {host}:{port}: {exc}")
                if self.figures.connects > connects:
                    delay = base  # it was up: start the backoff again
                else:
                    delay = min(cap, random.uniform(base, delay * 3)) if cap > base else base
                log.info("bridge %s: next try in %.1f s", self.name, delay)
                with anyio.move_on_after(delay):
                    await self._restart.wait()  # (at once when a restart was asked meanwhile)
                self._restart = anyio.Event()
        finally:
            # What the queue handed it stays held: at the next start (or on release()) it is
            # handed out again.
            self.broker.router.unsubscribe_all(self)
            self._set_state(STOPPED, None)

    async def _open_queue(self) -> None:
        # No max-length: the bridge bounds it (a limited queue's publishes each take their own
        # commit; these join the loop turn's), and paces its publishers itself.
        policy = QueuePolicySettings(visibility_timeout_s=HELD_FOR_S, max_attempts=1_000_000)
        self.queues.flow.ungated.add(self.queue)
        await self.queues.declare(self.queue, policy)
        own = _Outlet(self, None)
        self._handle = own.handle = self.queues.consume(self.queue, own, group="bridge")
        self._handles = [self._handle]
        for line in self.topics:
            if line.direction == "out" and line.local_filter.startswith("$queue/"):
                # Read in a group of the bridge's own: the queue's other consumers go on as before.
                parsed = parse_queue_topic(self.vhost_prefix + line.local_filter)
                assert parsed is not None  # (the settings checked it)
                queue, routing_filter, _control = parsed
                outlet = _Outlet(self, line)
                group = f"bridge.{self.name}"
                outlet.handle = self.queues.consume(
                    queue, outlet, group=group, routing_filter=routing_filter or None
                )
                self._handles.append(outlet.handle)

    async def _connect_once(self, host: str, port: int) -> None:
        loop = asyncio.get_running_loop()
        context = self._tls_context()
        with anyio.fail_after(CONNECT_TIMEOUT_S):
            transport, _wire = await loop.create_connection(
                lambda: _Wire(self), host, port, ssl=context, server_hostname=host if context else None
            )
        self._made(transport)  # (uvloop may call connection_made after this returns: the same)
        settings = self.settings
        self._machine = ClientConnection(
            self._connect_packet(),
            self.session,
            loop.time(),
            connect_timeout=CONNECT_TIMEOUT_S,
            max_inflight=settings.max_inflight_messages,
            bridge=settings.try_private and self.level != MQTT_5,
        )
        gone = self._gone = anyio.Event()
        self._flush()
        try:
            await gone.wait()
        finally:
            for handle in self._handles:
                handle.set_credit(0)
            self._gate.release()
            transport.abort()
            self._transport = None
            self._machine = None
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            self._notify(False)

    def _connect_packet(self) -> Connect:
        settings = self.settings
        connect = Connect(
            protocol_name="MQTT",
            protocol_level=self.level,
            clean_start=settings.cleansession,
            keep_alive=settings.keepalive_interval,
            client_id=self.client_id,
            username=settings.remote_username,
            password=(
                settings.remote_password.get_secret_value().encode()
                if settings.remote_password is not None
                else None
            ),
        )
        if self.level == MQTT_5 and not settings.cleansession:
            connect.properties.session_expiry_interval = settings.session_expiry_interval
        if connect.password is not None and connect.username is None:
            connect.username = ""
        return connect

    def _tls_context(self) -> ssl.SSLContext | None:
        settings = self.settings
        if settings.bridge_cafile is None:
            return None
        context = ssl.create_default_context(cafile=str(settings.bridge_cafile))
        if settings.bridge_certfile is not None:
            context.load_cert_chain(
                str(settings.bridge_certfile),
                str(settings.bridge_keyfile) if settings.bridge_keyfile is not None else None,
            )
        if settings.bridge_insecure:
            context.check_hostname = False
        return context

    def restart(self) -> None:
        """The operator's restart: the connection (if any) is closed and made again at once."""
        log.info("bridge %s: restart asked", self.name)
        if self._transport is not None:
            self._restarting = True
            self._transport.abort()
        self._restart.set()

    async def release(self) -> None:
        """Gone for good (a reload removed or changed it): what the remote has not acknowledged
        goes back to the queue, for the bridge that consumes it next."""
        with anyio.CancelScope(shield=True):
            for handle in self._handles:
                await handle.cancel()

    async def stop(self) -> None:
        """At shutdown: take nothing more from the queue, let the remote acknowledge what is in
        flight (the app bounds the wait), then DISCONNECT. What it has not acknowledged stays in
        the queue for the next start."""
        for handle in self._handles:
            handle.set_credit(0)
        while self._machine is not None and self._machine.connected and self.figures.in_flight:
            await anyio.sleep(0.02)
        machine = self._machine
        if machine is not None and machine.connected and self._transport is not None:
            machine.disconnect(self._loop_time())
            self._transport.write(machine.data_to_send())

    # -- what the socket brings ---------------------------------------------------------------------

    def _made(self, transport: asyncio.Transport) -> None:
        if transport is self._transport:
            return
        self._transport = transport
        self._writable = True
        if self._held_by:
            transport.pause_reading()

    def _data(self, data: bytes) -> None:
        machine = self._machine
        if machine is None:
            return
        machine.receive_data(data, self._loop_time())
        self._events(machine)

    def _lost(self, exc: Exception | None) -> None:
        machine = self._machine
        if machine is not None and not machine.closed:
            machine.receive_eof(None if exc is None else f"connection lost: {exc}")
            self._events(machine)
        if self._gone is not None:
            self._gone.set()

    def _events(self, machine: ClientConnection) -> None:
        runner = self.runner
        outer = runner.current
        runner.current = self  # a publisher the gates can hold
        try:
            while (event := machine.next_event()) is not None:
                if isinstance(event, Received):
                    self._received(machine, event.publish)
                elif isinstance(event, Acknowledged):
                    self._acknowledged(event)
                elif isinstance(event, Connected):
                    self._connected(machine, event)
                elif isinstance(event, Subscribed):
                    self._subscribed(event)
                elif isinstance(event, Closed):
                    self._closed(event)
        finally:
            runner.current = outer
        if self._acked:
            self._settle_acked()
        self._flush()

    def _connected(self, machine: ClientConnection, event: Connected) -> None:
        figures = self.figures
        figures.connects += 1
        if self._restart.is_set():  # asked while this connection was being made: it is the new one
            self._restart = anyio.Event()
        if not event.session_present:
            # The remote forgot what it sent before: nothing from then is acknowledged (its packet
            # identifiers are new messages' now). What is in flight here still arrives.
            self._inbound = InOrder()
        self._set_state(CONNECTED, None)
        if self._dropped_in_gap:
            log.warning(
                "bridge %s: %d outbound messages dropped while the remote was away (QoS 0, or past "
                "queue_bytes)",
                self.name,
                self._dropped_in_gap,
            )
            self._dropped_in_gap = 0
        remote = [
            (
                topic.remote_filter,
                RemoteOptions(
                    topic.qos,
                    no_local=self.level == MQTT_5,
                    retain_as_published=self.level == MQTT_5,
                    retain_handling=1 if event.session_present else 0,
                ),
            )
            for topic in self.topics
            if topic.direction != "out"
        ]
        if remote:
            machine.subscribe(remote, self._loop_time())
        self._notify(True)
        self._give_credit(machine)

    def _subscribed(self, event: Subscribed) -> None:
        wanted = [topic for topic in self.topics if topic.direction != "out"]
        for topic, code in zip(wanted, event.reason_codes, strict=False):
            if code >= 0x80:
                log.warning(
                    "bridge %s: the remote refused the subscription to %r (0x%02X)",
                    self.name,
                    topic.remote_filter,
                    code,
                )

    def _closed(self, event: Closed) -> None:
        reason = event.reason
        if event.unanswered and self.settings.try_private and self.level != MQTT_5:
            reason += " (a broker other than Mosquitto may refuse the bridge flag: try_private = false)"
        if self._restarting:  # this side closed it: not the remote's failure
            self._restarting = False
            self._set_state(WAITING, None)
        else:
            self._set_state(WAITING, reason)
        transport = self._transport
        machine = self._machine
        if transport is not None:
            if machine is not None:
                transport.write(machine.data_to_send())
            transport.close()
        if self._gone is not None:
            self._gone.set()

    # -- in: from the remote --------------------------------------------------------------------------

    def _received(self, machine: ClientConnection, publish: Publish) -> None:
        local = next((t for line in self.topics if (t := line.inward(publish.topic)) is not None), None)
        if local is None:
            log.warning("bridge %s: no in topic maps %r from the remote; dropped", self.name, publish.topic)
            self._acknowledge(machine, publish)
            return
        publish.topic = local
        message = message_from_publish(publish, self._id, None, self.vhost_prefix)
        self.figures.received += 1
        if local.startswith("$queue/"):
            message.retain = False  # a queue's messages are not retained
            self._to_queue(message, self._inbound.add(_Inbound(publish)) if publish.qos else None)
            return
        self.broker.publish(message)
        if publish.qos:
            self._inbound.add(_Inbound(publish, done=True))
            self._acknowledge_ready()

    def _to_queue(self, message: Message, entry: _Inbound | None) -> None:
        """Into a local queue; ``entry``: the QoS 1/2 message's, acknowledged once committed."""
        parsed = parse_queue_topic(message.topic)

        def done(_result: PublishResult | None, error: QueueError | None) -> None:
            if entry is None:
                return
            if error is not None:
                # The write failed: not acknowledged, and the connection goes, so that the remote
                # sends it (and what came after) again.
                log.error("bridge %s: a message for %r was not stored: %s", self.name, message.topic, error)
                if self._transport is not None:
                    self._transport.abort()
                return
            entry.done = True
            self._acknowledge_ready()
            self._flush()

        try:
            if parsed is None or parsed[2] is not None:
                raise QueueError("bad-topic", f"{message.topic!r} is not a queue to publish to")
            queue, routing_key, _control = parsed
            self.queues.publish_nowait(queue, message, routing_key, done, held=self)
        except QueueError as exc:
            log.warning("bridge %s: %s refused: %s", self.name, message.topic, exc)
            self.figures.refused += 1
            if entry is not None:
                entry.done = True  # refused here for good: the remote need not send it again
                self._acknowledge_ready()

    def _acknowledge_ready(self) -> None:
        machine = self._machine
        for entry in self._inbound.ready():
            if machine is not None:
                self._acknowledge(machine, entry.publish)

    def _acknowledge(self, machine: ClientConnection, publish: Publish) -> None:
        machine.acknowledge(publish, self._loop_time())

    # -- out: to the remote -----------------------------------------------------------------------------

    def _give_credit(self, machine: ClientConnection) -> None:
        """At a connection: the window to the remote, shared by the queues the bridge reads, less
        what each has in flight (the session sent it again)."""
        handles = self._handles
        if not handles:
            return
        share = max(1, machine.max_inflight // len(handles))
        held = Counter(handle for handle, _offset in self._offsets.values())
        for handle in handles:
            handle.set_credit(max(0, share - held[handle]))

    def _acknowledged(self, event: Acknowledged) -> None:
        held = self._offsets.pop(event.packet_id, None)
        if held is None:
            return
        handle, offset = held
        figures = self.figures
        figures.in_flight -= 1
        if event.reason_code >= 0x80:
            figures.refused += 1
            code = event.reason_code
            log.warning("bridge %s: the remote refused a message (0x%02X): dead-lettered", self.name, code)
            handle.reject_nowait(offset, f"the remote refused it (0x{code:02X})")
            handle.add_credit(1)
        else:
            figures.sent += 1
            # Settled, and its credit given back, once for the read.
            self._acked.setdefault(handle, []).append(offset)
        self._sent_mark += 1
        self._gate.saw(self._sent_mark)
        if self._gate.holding and self.backlog_bytes <= self.settings.queue_bytes // 4:
            self._gate.release()

    def _settle_acked(self) -> None:
        """The deliveries the remote acknowledged in one read: one change and one dispatch a queue."""
        for handle, offsets in self._acked.items():
            handle.settle_all_nowait(offsets, ACK)
            handle.add_credit(len(offsets))
        self._acked.clear()

    def _from_queue(self, delivery: QueueDelivery, handle: ConsumerHandle, line: BridgeTopic | None) -> None:
        """A queued message, with the credit given: to the remote. ``line``: the out line of the
        ``$queue/`` it comes from; None: the bridge's own queue."""
        machine = self._machine
        message = delivery.message
        if machine is None or not machine.can_publish:
            handle.set_credit(0)  # (the connection went as this was handed over)
            handle.release_nowait(delivery.offset)
            return
        local = message.topic[len(self.vhost_prefix) :]
        remote = self._outward(local) if line is None else line.outward(local)
        if remote is None:  # put in the queue by hand, to a topic no out line takes
            handle.reject_nowait(delivery.offset, "no out topic of the bridge takes it")
            handle.add_credit(1)
            return
        qos = message.qos if line is None else min(message.qos or line.qos, line.qos)
        publish = self._outbound(message, remote, qos)
        if not machine.fits(publish):
            log.warning("bridge %s: a message to %r is too large for the remote", self.name, publish.topic)
            self.figures.refused += 1
            handle.reject_nowait(delivery.offset, "larger than the remote's maximum packet size")
            handle.add_credit(1)
            return
        if not publish.qos:  # a queue's message at QoS 0: sent, and settled here
            machine.publish(publish, self._loop_time())
            self.figures.sent += 1
            handle.ack_nowait(delivery.offset)
            handle.add_credit(1)
            self._flush_soon()
            return
        packet_id = machine.publish(publish, self._loop_time())
        assert packet_id is not None
        self._offsets[packet_id] = (handle, delivery.offset)
        self.figures.in_flight += 1
        self._flush_soon()

    def _flush_soon(self) -> None:
        if not self._flush_due:
            self._flush_due = True
            self.runner.loop().call_soon(self._flush)

    def _flush(self) -> None:
        """Send what the window lets go, write what the machine has, and keep its deadline."""
        self._flush_due = False
        machine = self._machine
        transport = self._transport
        if machine is None or transport is None:
            return
        if machine.connected and self._writable and self._waiting:
            self._send_waiting(machine)
        data = machine.data_to_send()
        if data:
            transport.write(data)
        self._arm(machine)

    def _send_waiting(self, machine: ClientConnection) -> None:
        """The QoS 0 messages of this loop turn."""
        figures = self.figures
        now = self._loop_time()
        for publish in self._waiting:
            if machine.fits(publish):
                machine.publish(publish, now)
                figures.sent += 1
            else:
                figures.dropped += 1
        self._waiting.clear()

    def _writing(self, on: bool) -> None:
        self._writable = on
        if on:
            self._flush_soon()

    def _arm(self, machine: ClientConnection) -> None:
        deadline = machine.next_deadline()
        if deadline is None:
            return
        if self._timer is not None and self._timer_at <= deadline:
            return  # an earlier timer looks again when it fires
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = deadline
        self._timer = self.runner.loop().call_at(deadline, self._tick)

    def _tick(self) -> None:
        self._timer = None
        machine = self._machine
        if machine is not None:
            machine.tick(self._loop_time())
            self._events(machine)

    # -- what is said about it ------------------------------------------------------------------------

    def _set_state(self, state: str, error: str | None) -> None:
        figures = self.figures
        if error is not None:
            figures.last_error = error
        if state == figures.state and error is None:
            return
        figures.state = state
        figures.since = self._loop_time()
        if state == CONNECTED:
            log.info("bridge %s: connected to %s as %s", self.name, figures.address, self.client_id)
        elif state == WAITING:
            if error is None:
                log.info("bridge %s: disconnected for the restart", self.name)
            else:
                log.warning("bridge %s: %s", self.name, error)
        elif state == STOPPED:
            log.info("bridge %s: stopped", self.name)

    def _notify(self, up: bool) -> None:
        """Mosquitto's notifications, here only: 1 or 0 retained to $SYS/broker/connection/ID/state."""
        if self.settings.notifications:
            topic = f"{self.vhost_prefix}$SYS/broker/connection/{self.client_id}/state"
            self.broker.publish(Message(topic, b"1" if up else b"0", 0, True, publisher_id=self._id))

    def _loop_time(self) -> float:
        return self.runner.loop().time()


class _Wire(asyncio.Protocol):
    """The socket's callbacks, handed to the bridge."""

    __slots__ = ("_bridge",)

    def __init__(self, bridge: MqttBridge) -> None:
        self._bridge = bridge

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._bridge._made(cast(asyncio.Transport, transport))  # (uvloop's is not a subclass)

    def data_received(self, data: bytes) -> None:
        self._bridge._data(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self._bridge._lost(exc)

    def pause_writing(self) -> None:
        self._bridge._writing(False)

    def resume_writing(self) -> None:
        self._bridge._writing(True)


class _Outlet:
    """The bridge as a queue's consumer: its own queue's (``line`` None) or a ``$queue/`` out line's."""

    __slots__ = ("_bridge", "handle", "id", "line")

    def __init__(self, bridge: MqttBridge, line: BridgeTopic | None) -> None:
        self._bridge = bridge
        self.id = bridge.id
        self.line = line
        self.handle: ConsumerHandle | None = None  # set once consume() returns, before any credit

    def deliver(self, delivery: QueueDelivery) -> None:
        assert self.handle is not None
        self._bridge._from_queue(delivery, self.handle, self.line)

    def stalled(self, idle_s: float) -> None:
        """Not asked: the queue's flow leaves the bridge's queue to the bridge's gate."""
