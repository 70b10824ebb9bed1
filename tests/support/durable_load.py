"""Steady durable load on all three protocols that outlives faults: each client reconnects and goes
on when the broker refuses or drops it, and writes what the broker acknowledged and what the
consumers received into one :class:`Ledger`.

- MQTT 5 (paho): QoS 1 to ``$queue/<q>``, a PUBACK with a success code is the acknowledgement; a
  consumer on ``$queue/<q>`` PUBACKs each delivery as it arrives.
- AMQP 0.9.1 (pika): persistent messages into a durable queue with publisher confirms (a
  ``basic_publish`` that returns was confirmed); a consumer with manual acks.
- AMQP 1.0 (python-qpid-proton's blocking API): durable messages, a send that returns was settled
  ``accepted``; a receiver that accepts each message.

Payloads are ``<protocol>/<connection>/<n>``, unique across the run: a publish that was not
acknowledged is never sent again under its number (the next one gets a new number), so a payload
received twice was delivered twice by the broker.
"""

from __future__ import annotations

import abc
import bisect
import contextlib
import logging
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import paho.mqtt.client as mqtt
import pika
import pika.exceptions
from paho.mqtt.enums import CallbackAPIVersion

logging.getLogger("pika").setLevel(logging.CRITICAL)

PROTOCOLS = ("mqtt", "amqp091", "amqp1")
RETRY_S = 0.2  # a client's pause before it connects again


@dataclass(frozen=True, slots=True)
class Receipt:
    consumer: str
    flagged: bool  # MQTT DUP, AMQP 0.9.1 redelivered, AMQP 1.0 delivery-count > 0
    at: float  # time.monotonic()


@dataclass
class Ledger:
    lock: threading.Lock = field(default_factory=threading.Lock)
    sent_at: dict[str, float] = field(default_factory=dict)  # payload -> when it was published
    acknowledged: set[str] = field(default_factory=set)  # PUBACK success, confirm, accepted
    # protocol -> when its publisher was acknowledged, in order
    acks: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    refused: dict[str, int] = field(default_factory=lambda: defaultdict(int))  # protocol -> count
    receipts: dict[str, list[Receipt]] = field(default_factory=lambda: defaultdict(list))
    # protocol -> (receipt time, payload's publish time, payload), in receipt order
    deliveries: dict[str, list[tuple[float, float, str]]] = field(default_factory=lambda: defaultdict(list))
    connects: dict[str, int] = field(default_factory=lambda: defaultdict(int))  # worker -> connections

    def sent(self, payload: str) -> None:
        with self.lock:
            self.sent_at[payload] = time.monotonic()

    def acknowledge(self, payload: str) -> None:
        now = time.monotonic()
        with self.lock:
            self.acknowledged.add(payload)
            self.acks[payload.split("/", 1)[0]].append(now)

    def first_ack(self, protocol: str, since: float) -> float | None:
        """When ``protocol``'s publisher was first acknowledged after ``since``."""
        with self.lock:
            rows = self.acks[protocol]
            i = bisect.bisect_left(rows, since)
            return rows[i] if i < len(rows) else None

    def refuse(self, protocol: str) -> None:
        with self.lock:
            self.refused[protocol] += 1

    def connected(self, worker: str) -> None:
        with self.lock:
            self.connects[worker] += 1

    def received(self, protocol: str, payload: str, consumer: str, flagged: bool) -> None:
        now = time.monotonic()
        with self.lock:
            self.receipts[payload].append(Receipt(consumer, flagged, now))
            self.deliveries[protocol].append((now, self.sent_at.get(payload, now), payload))

    def missing(self) -> set[str]:
        """Acknowledged and never received."""
        with self.lock:
            return {p for p in self.acknowledged if p not in self.receipts}

    def resumed(self, protocol: str, since: float) -> float | None:
        """When ``protocol``'s consumer first received a message published after ``since`` that its
        publisher was acknowledged for (a queue may hand a message to a consumer before its commit:
        only the acknowledgement says the commit happened)."""
        with self.lock:
            rows = self.deliveries[protocol]
            start = bisect.bisect_left(rows, (since, 0.0, ""))
            for at, published, payload in rows[start:]:
                if published >= since and payload in self.acknowledged:
                    return at
        return None

    def duplicates(self) -> tuple[dict[str, int], list[str]]:
        """Payloads received more than once, per protocol, and those of the repeats that did not
        carry their protocol's redelivery mark."""
        counts: dict[str, int] = dict.fromkeys(PROTOCOLS, 0)
        unmarked: list[str] = []
        with self.lock:
            for payload, receipts in self.receipts.items():
                if len(receipts) > 1:
                    counts[payload.split("/", 1)[0]] += len(receipts) - 1
                    unmarked += [payload for r in receipts[1:] if not r.flagged]
        return counts, unmarked

    def counts(self) -> dict[str, Any]:
        with self.lock:
            per: dict[str, dict[str, int]] = {}
            for protocol in PROTOCOLS:
                prefix = protocol + "/"
                per[protocol] = {
                    "sent": sum(p.startswith(prefix) for p in self.sent_at),
                    "acknowledged": sum(p.startswith(prefix) for p in self.acknowledged),
                    "refused": self.refused[protocol],
                    "received": sum(p.startswith(prefix) for p in self.receipts),
                }
            return per


class Worker(abc.ABC):
    """A client on its own thread; it connects again after every failure until :meth:`stop`."""

    protocol = ""
    role = ""

    def __init__(self, ledger: Ledger, host: str, port: int, queue: str, tag: str = "") -> None:
        self.ledger = ledger
        self.host = host
        self.port = port
        self.queue = queue
        self.name = f"{self.protocol}-{self.role}{tag}"
        self.stopping = threading.Event()
        self.failures: list[str] = []  # why each connection ended, for the report
        self.thread = threading.Thread(target=self._main, name=self.name, daemon=True)
        self.lives = 0

    def start(self) -> Worker:
        self.thread.start()
        return self

    def stop(self, timeout: float = 15.0) -> None:
        self.stopping.set()
        self.thread.join(timeout)
        assert not self.thread.is_alive(), f"{self.name} does not stop"

    def _main(self) -> None:
        while not self.stopping.is_set():
            self.lives += 1
            try:
                self.run(self.lives)
            except Exception as exc:  # any failure: note it, pause, connect again
                self.failures.append(f"{type(exc).__name__}: {exc}"[:200])
            if not self.stopping.is_set():
                time.sleep(RETRY_S)

    @abc.abstractmethod
    def run(self, life: int) -> None:
        """One connection's work; returns or raises when it ends."""


# -- MQTT -------------------------------------------------------------------------------------------


def _paho(client_id: str, *, manual_ack: bool = False) -> mqtt.Client:
    client = mqtt.Client(
        CallbackAPIVersion.VERSION2,
        client_id=client_id,
        protocol=mqtt.MQTTv5,
        reconnect_on_failure=False,
        manual_ack=manual_ack,
    )
    return client


def _mqtt_connect(client: mqtt.Client, host: str, port: int) -> None:
    connected = threading.Event()
    outcome: list[Any] = []

    def on_connect(_c: Any, _u: Any, _flags: Any, reason: Any, _props: Any) -> None:
        outcome.append(reason)
        connected.set()

    client.on_connect = on_connect
    client.connect(host, port, keepalive=10, clean_start=True)
    client.loop_start()
    if not connected.wait(10) or outcome[0].is_failure:
        client.loop_stop()
        raise ConnectionError(f"CONNACK {outcome[:1]}")


class MqttPublisher(Worker):
    protocol, role = "mqtt", "publisher"

    def __init__(
        self, ledger: Ledger, host: str, port: int, queue: str, window: int = 16, rate: float | None = None
    ) -> None:
        super().__init__(ledger, host, port, queue)
        self.window = window
        self.rate = rate  # messages a second at most (None: as fast as the PUBACKs come)

    def run(self, life: int) -> None:
        client = _paho(f"dbf-pub-{life}")
        client.max_inflight_messages_set(self.window)
        free = threading.Semaphore(self.window)
        lock = threading.Lock()
        by_mid: dict[int, str] = {}
        early: dict[int, bool] = {}

        def settle(payload: str, ok: bool) -> None:
            if ok:
                self.ledger.acknowledge(payload)
            else:
                self.ledger.refuse(self.protocol)
            free.release()

        def on_publish(_c: Any, _u: Any, mid: int, reason: Any, _p: Any) -> None:
            ok = not getattr(reason, "is_failure", False)
            with lock:
                payload = by_mid.pop(mid, None)
                if payload is None:
                    early[mid] = ok
                    return
            settle(payload, ok)

        client.on_publish = on_publish
        _mqtt_connect(client, self.host, self.port)
        self.ledger.connected(self.name)
        n = 0
        next_at = time.monotonic()
        try:
            while not self.stopping.is_set() and client.is_connected():
                if self.rate is not None:
                    next_at += 1 / self.rate
                    time.sleep(max(0.0, next_at - time.monotonic()))
                if not free.acquire(timeout=0.1):
                    continue
                payload = f"mqtt/{life}/{n}"
                n += 1
                self.ledger.sent(payload)
                info = client.publish(f"$queue/{self.queue}", payload.encode(), qos=1)
                if info.rc != mqtt.MQTT_ERR_SUCCESS:
                    raise ConnectionError(f"publish rc {info.rc}")
                with lock:
                    ok = early.pop(info.mid, None)
                    if ok is None:
                        by_mid[info.mid] = payload
                if ok is not None:
                    settle(payload, ok)
            if not self.stopping.is_set():
                raise ConnectionError("disconnected")
            # Stopping: give the PUBACKs of what is in flight a moment.
            deadline = time.monotonic() + 5
            while by_mid and client.is_connected() and time.monotonic() < deadline:
                time.sleep(0.02)
        finally:
            with contextlib.suppress(Exception):
                client.disconnect()
            client.loop_stop()


class MqttConsumer(Worker):
    protocol, role = "mqtt", "consumer"

    def run(self, life: int) -> None:
        client = _paho(f"dbf-sub-{life}", manual_ack=True)
        subscribed = threading.Event()

        def on_message(c: mqtt.Client, _u: Any, msg: mqtt.MQTTMessage) -> None:
            self.ledger.received(self.protocol, bytes(msg.payload).decode(), self.name, bool(msg.dup))
            c.ack(msg.mid, msg.qos)

        client.on_message = on_message
        client.on_subscribe = lambda *_a: subscribed.set()
        _mqtt_connect(client, self.host, self.port)
        self.ledger.connected(self.name)
        try:
            client.subscribe(f"$queue/{self.queue}", qos=1)
            if not subscribed.wait(10):
                raise ConnectionError("no SUBACK")
            while not self.stopping.is_set() and client.is_connected():
                time.sleep(0.05)
            if not self.stopping.is_set():
                raise ConnectionError("disconnected")
        finally:
            with contextlib.suppress(Exception):
                client.disconnect()
            client.loop_stop()


# -- AMQP 0.9.1 -------------------------------------------------------------------------------------


def _pika(host: str, port: int) -> pika.BlockingConnection:
    params = pika.ConnectionParameters(host, port, heartbeat=10, blocked_connection_timeout=30)
    return pika.BlockingConnection(params)


class AmqpPublisher(Worker):
    protocol, role = "amqp091", "publisher"

    def run(self, life: int) -> None:
        connection = _pika(self.host, self.port)
        self.ledger.connected(self.name)
        try:
            channel = connection.channel()
            channel.queue_declare(self.queue, durable=True)
            channel.confirm_delivery()
            persistent = pika.BasicProperties(delivery_mode=pika.DeliveryMode.Persistent)
            n = 0
            while not self.stopping.is_set():
                payload = f"amqp091/{life}/{n}"
                n += 1
                self.ledger.sent(payload)
                try:
                    channel.basic_publish("", self.queue, payload.encode(), persistent, mandatory=True)
                except (pika.exceptions.NackError, pika.exceptions.UnroutableError):
                    self.ledger.refuse(self.protocol)
                    continue
                self.ledger.acknowledge(payload)
        finally:
            with contextlib.suppress(Exception):
                connection.close()


class AmqpConsumer(Worker):
    protocol, role = "amqp091", "consumer"

    def run(self, life: int) -> None:
        connection = _pika(self.host, self.port)
        self.ledger.connected(self.name)
        try:
            channel = connection.channel()
            channel.basic_qos(prefetch_count=50)
            channel.queue_declare(self.queue, durable=True)

            def on_message(ch: Any, method: Any, _props: Any, body: bytes) -> None:
                self.ledger.received(self.protocol, body.decode(), self.name, bool(method.redelivered))
                ch.basic_ack(method.delivery_tag)

            channel.basic_consume(self.queue, on_message)
            while not self.stopping.is_set():
                connection.process_data_events(time_limit=0.05)
        finally:
            with contextlib.suppress(Exception):
                connection.close()


# -- AMQP 1.0 ---------------------------------------------------------------------------------------


class Amqp1Publisher(Worker):
    protocol, role = "amqp1", "publisher"

    def run(self, life: int) -> None:
        from proton import Message
        from proton.utils import BlockingConnection, SendException

        connection = BlockingConnection(f"{self.host}:{self.port}", timeout=10)
        self.ledger.connected(self.name)
        try:
            sender = connection.create_sender(self.queue)
            n = 0
            while not self.stopping.is_set():
                payload = f"amqp1/{life}/{n}"
                n += 1
                self.ledger.sent(payload)
                try:
                    sender.send(Message(body=payload, durable=True))  # waits for the outcome
                except SendException:  # rejected, released or modified: not accepted
                    self.ledger.refuse(self.protocol)
                    continue
                self.ledger.acknowledge(payload)
        finally:
            with contextlib.suppress(Exception):
                connection.close()


class Amqp1Consumer(Worker):
    protocol, role = "amqp1", "consumer"

    def run(self, life: int) -> None:
        from proton import Timeout
        from proton.utils import BlockingConnection

        connection = BlockingConnection(f"{self.host}:{self.port}", timeout=10)
        self.ledger.connected(self.name)
        try:
            receiver = connection.create_receiver(self.queue, credit=50)
            while not self.stopping.is_set():
                try:
                    message = receiver.receive(timeout=0.2)
                except Timeout:
                    continue
                body: object = message.body
                assert isinstance(body, str), body
                flagged = bool(message.delivery_count)
                self.ledger.received(self.protocol, body, self.name, flagged)
                receiver.accept()
        finally:
            with contextlib.suppress(Exception):
                connection.close()


def load(
    ledger: Ledger,
    publish_to: dict[str, int],
    consume_from: dict[str, int],
    queues: dict[str, str],
    *,
    mqtt_rate: float | None = None,
) -> list[Worker]:
    """Publishers and consumers of the three protocols, consumers first. ``publish_to`` and
    ``consume_from``: the ports (``mqtt``, and ``amqp`` which AMQP 0.9.1 and 1.0 share) the two sides
    use, on one node or two; ``queues``: protocol -> queue name; ``mqtt_rate``: the MQTT publisher's
    pace (its window of PUBACKs can outrun a consumer, and a backlog delays what follows it)."""
    host = "127.0.0.1"
    pub_mqtt, pub_amqp = publish_to["mqtt"], publish_to["amqp"]
    sub_mqtt, sub_amqp = consume_from["mqtt"], consume_from["amqp"]
    return [
        MqttConsumer(ledger, host, sub_mqtt, queues["mqtt"]),
        AmqpConsumer(ledger, host, sub_amqp, queues["amqp091"]),
        Amqp1Consumer(ledger, host, sub_amqp, queues["amqp1"]),
        MqttPublisher(ledger, host, pub_mqtt, queues["mqtt"], rate=mqtt_rate),
        AmqpPublisher(ledger, host, pub_amqp, queues["amqp091"]),
        Amqp1Publisher(ledger, host, pub_amqp, queues["amqp1"]),
    ]
