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
which Mosquitto answers by sending it nothing it published itself. At 5.0 a message also carries the
links it went out through (``link.VIA``), so a loop through several brokers stops after one turn.
"""

from __future__ import annotations

import logging
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from trimaran.bridges.link import CONNECT_TIMEOUT_S, VIA, Link, tls_context
from trimaran.broker.core import Broker
from trimaran.broker.drops import LINK_AWAY, TOO_LARGE
from trimaran.broker.message import Message, now_ms
from trimaran.broker.router import Delivery, SubscriptionOptions
from trimaran.config import BridgeSettings, BridgeTopic
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
from trimaran.queue.manager import QueueManager
from trimaran.queue.policy import parse_queue_topic
from trimaran.runtime.confirms import InOrder
from trimaran.runtime.flow import Gate, Stalled
from trimaran.runtime.runner import Runner
from trimaran.vhosts import prefix

log = logging.getLogger("trimaran.bridges")

#: Local topics whose remote topic a bridge keeps (then it starts again): a few hundred KB at most.
REMOTE_TOPICS_KEPT = 4096
_UNMAPPED = "\x00"  # not yet looked up (no topic holds U+0000)

#: The note (``Message.extra``) of a retained message in the bridge's queue, which keeps no flag.
RETAINED = "bridge-retained"


@dataclass(slots=True)
class _Inbound:
    """A message from the remote, acknowledged to it once ``done`` (in arrival order)."""

    publish: Publish
    done: bool = False


class MqttBridge(Link):
    """One ``[[bridges]]`` table: its local subscriptions, its queue, its remote connection.

    ``runner``: whose frames are being acted on (a publisher the gate holds) and the loop;
    ``make_gate``: the runtime's gates (app.flow_gates), one for the bridge's queue.
    """

    kind = "bridge"

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
        super().__init__(
            settings.name,
            broker,
            node_name=node_name,
            vhost_prefix=prefix(settings.vhost),
            queue_bytes=settings.queue_bytes,
            runner=runner,
            make_gate=make_gate,
            queues=queues,
            stalled_timeout_s=stalled_timeout_s,
        )
        self.settings = settings
        self.topics = settings.topics
        self.level = MQTT_5 if settings.bridge_protocol_version == "mqttv50" else MQTT_3_1_1
        self.client_id = settings.remote_clientid or f"{node_name}.{settings.name}"
        self.protocol_version = settings.bridge_protocol_version
        self.vhost = settings.vhost
        self.configured_address = settings.address
        self.lines = tuple(settings.topic)
        self.session = ClientSession()
        self._waiting: deque[Publish] = deque()  # outbound QoS 0, not yet sent
        self._offsets: dict[int, tuple[ConsumerHandle, int]] = {}  # packet id -> its delivery
        self._remote_of: dict[str, str | None] = {}  # local topic -> remote topic (_outward)
        self._inbound: InOrder[_Inbound] = InOrder()
        self._machine: ClientConnection | None = None

    # -- the local side: a subscriber of the router ------------------------------------------------

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
        connected = machine is not None and machine.connected
        if not qos:
            if connected:
                mark = self._marked(message)
                if mark is not None:
                    self._waiting.append(self._outbound(message, remote, 0, mark))
                self._flush_soon()
            else:
                self._drop(LINK_AWAY)
            return
        if message.retain:  # a queue keeps no retain flag of its own: the bridge's note says it
            message = message.copy_with(qos=qos, retain=False, extra={**message.extra, RETAINED: True})
        elif message.qos != qos:
            message = message.copy_with(qos=qos)  # the queue keeps it at the QoS it leaves with
        self._keep(message, connected)

    def _outbound(self, message: Message, remote: str, qos: int, mark: str) -> Publish:
        """The PUBLISH of ``message`` to ``remote``: the retain flag as published, 5.0 properties
        (with the expiry left, and ``mark``, the links it went out through, in VIA)."""
        properties = NO_PROPERTIES
        if self.level == MQTT_5:
            properties = publish_properties(message)
            properties.message_expiry_interval = message.remaining_expiry_s(now_ms())
            kept = [(key, value) for key, value in message.user_properties if key != VIA]
            properties.user_properties = [*kept, (VIA, mark)]
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

    # -- the connection ---------------------------------------------------------------------------

    def _targets(self) -> list[tuple[str, int]]:
        return self.settings.addresses()

    def _delays(self) -> tuple[float, float]:
        return BridgeSettings.restart_times(self.settings.restart_timeout)

    async def _open(self) -> None:
        await self._open_own_queue()
        for line in self.topics:
            if line.direction == "out" and line.local_filter.startswith("$queue/"):
                # Read in a group of the bridge's own: the queue's other consumers go on as before.
                parsed = parse_queue_topic(self.vhost_prefix + line.local_filter)
                assert parsed is not None  # (the settings checked it)
                queue, routing_filter, _control = parsed
                self._consume(queue, f"bridge.{self.name}", routing_filter or None, line)

    async def _connect_once(self, host: str, port: int) -> None:
        settings = self.settings
        context = None
        if settings.bridge_cafile is not None:
            context = tls_context(
                str(settings.bridge_cafile),
                None if settings.bridge_certfile is None else str(settings.bridge_certfile),
                None if settings.bridge_keyfile is None else str(settings.bridge_keyfile),
                check_hostname=not settings.bridge_insecure,
            )
        await self._connect(host, port, context, host)
        self._machine = ClientConnection(
            self._connect_packet(),
            self.session,
            self._loop_time(),
            connect_timeout=CONNECT_TIMEOUT_S,
            max_inflight=settings.max_inflight_messages,
            bridge=settings.try_private and self.level != MQTT_5,
        )
        await self._keep_connection()

    def _down(self) -> None:
        self._machine = None
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

    def _is_up(self) -> bool:
        return self._machine is not None and self._machine.connected

    def _farewell(self) -> bytes:
        machine = self._machine
        if machine is None or not machine.connected:
            return b""
        machine.disconnect(self._loop_time())
        return machine.data_to_send()

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
        self._as_publisher(lambda: self._act_on(machine))
        if self._acked:
            self._settle_acked()
        self._flush()

    def _act_on(self, machine: ClientConnection) -> None:
        while (event := machine.next_event()) is not None:
            if isinstance(event, Received):
                self._received(machine, event.publish)
            elif isinstance(event, Acknowledged):
                self._acknowledged(event)
            elif isinstance(event, Connected):
                self._up(machine, event)
            elif isinstance(event, Subscribed):
                self._subscribed(event)
            elif isinstance(event, Closed):
                self._closed(event)

    def _up(self, machine: ClientConnection, event: Connected) -> None:
        if not event.session_present:
            # The remote forgot what it sent before: nothing from then is acknowledged (its packet
            # identifiers are new messages' now). What is in flight here still arrives.
            self._inbound = InOrder()
        self._connected()
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
        machine = self._machine
        self._close_socket(reason, b"" if machine is None else machine.data_to_send())

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
        if held is not None:
            code = event.reason_code
            self._settled_out(held[0], held[1], f"0x{code:02X}" if code >= 0x80 else None)

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
        mark = self._marked(message)
        if mark is None:  # it went out through this bridge before: a loop
            handle.ack_nowait(delivery.offset)
            handle.add_credit(1)
            return
        publish = self._outbound(message, remote, qos, mark)
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

    def _flush(self) -> None:
        """Send what the window lets go, write what the machine has, and keep its deadline."""
        self._flush_due = False
        machine = self._machine
        if machine is None or self._transport is None:
            return
        if machine.connected and self._writable and self._waiting:
            self._send_waiting(machine)
        self._write(machine)

    def _send_waiting(self, machine: ClientConnection) -> None:
        """The QoS 0 messages of this loop turn."""
        figures = self.figures
        now = self._loop_time()
        for publish in self._waiting:
            if machine.fits(publish):
                machine.publish(publish, now)
                figures.sent += 1
            else:
                self._drop(TOO_LARGE)
        self._waiting.clear()

    def _tick(self) -> None:
        machine = self._machine
        if machine is not None:
            machine.tick(self._loop_time())
            self._events(machine)

    # -- what is said about it ------------------------------------------------------------------------

    def _notify(self, up: bool) -> None:
        """Mosquitto's notifications, here only: 1 or 0 retained to $SYS/broker/connection/ID/state."""
        if self.settings.notifications:
            topic = f"{self.vhost_prefix}$SYS/broker/connection/{self.client_id}/state"
            self.broker.publish(Message(topic, b"1" if up else b"0", 0, True, publisher_id=self._id))
