"""Load for the crash series: real MQTT (paho) and AMQP 0.9.1 (pika) publishers and consumers, each
on its own thread, writing what the broker acknowledged and delivered into one :class:`Ledger`.

Every client stops by itself when the server goes away (``kill -9``): a lost connection ends its
thread, and what it had recorded until then is what the checks after the restart rely on.
"""

from __future__ import annotations

import abc
import contextlib
import logging
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import pika
import pika.exceptions
from paho.mqtt.client import MQTTMessage

from tests.support.paho import V5, Client, Endpoints, connect

MQTT_QUEUE = "crash-mqtt"  # published by MQTT
AMQP_QUEUE = "crash-amqp"  # published by AMQP 0.9.1
QUEUES = (MQTT_QUEUE, AMQP_QUEUE)

# How a client sees the server vanish: pika's lost stream or a channel/connection already closed,
# paho's failed write, a refused reconnect.
CUT_OFF = (
    pika.exceptions.AMQPConnectionError,
    pika.exceptions.ChannelWrongStateError,
    pika.exceptions.ConnectionWrongStateError,
    ConnectionError,
    OSError,
)

# pika logs every connection the kill cuts as an error, with its traceback: expected here.
logging.getLogger("pika").setLevel(logging.CRITICAL)


@dataclass(frozen=True, slots=True)
class Receipt:
    """One delivery as a consumer saw it."""

    life: int  # which server process delivered it (0 = the first start)
    consumer: str
    flagged: bool  # MQTT DUP / AMQP ``redelivered``


@dataclass
class Ledger:
    """What every client saw, across the series; payloads (``m/<life>/<n>``, ``a/<life>/<n>``) are
    the message ids."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    published_in: dict[str, int] = field(default_factory=dict)  # payload -> life it was sent in
    confirmed: set[str] = field(default_factory=set)  # PUBACK 0 / basic.ack from the broker
    acked: set[str] = field(default_factory=set)  # a consumer is sending its ack (it may not land)
    receipts: dict[str, list[Receipt]] = field(default_factory=lambda: defaultdict(list))

    def sent(self, payload: str, life: int) -> None:
        with self.lock:
            self.published_in[payload] = life

    def confirm(self, payload: str) -> None:
        with self.lock:
            self.confirmed.add(payload)

    def received(self, payload: str, receipt: Receipt) -> None:
        with self.lock:
            self.receipts[payload].append(receipt)

    def ack_sent(self, payloads: list[str]) -> None:
        with self.lock:
            self.acked.update(payloads)

    def owed(self) -> set[str]:
        """Confirmed messages no consumer has acked: the broker must deliver each after a restart."""
        with self.lock:
            return self.confirmed - self.acked

    def received_in(self, life: int) -> set[str]:
        with self.lock:
            return {p for p, rs in self.receipts.items() if any(r.life == life for r in rs)}

    def counts(self) -> dict[str, int]:
        with self.lock:
            every = [r for rs in self.receipts.values() for r in rs]
            return {
                "published": len(self.published_in),
                "confirmed": len(self.confirmed),
                "deliveries": len(every),
                "redelivered": sum(r.flagged for r in every),
                "acked": len(self.acked),
            }


class Worker(abc.ABC):
    """A client on its own thread until :meth:`stop` or until its connection is lost."""

    name = "worker"

    def __init__(self, ledger: Ledger, life: int) -> None:
        self.ledger = ledger
        self.life = life
        self.stopping = threading.Event()
        self.error: BaseException | None = None  # what ended it, if not stop()
        self.cut_off = False  # it ended because its connection went away (expected after a kill)
        self.thread = threading.Thread(target=self._main, name=self.name, daemon=True)

    def start(self) -> Worker:
        self.thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        self.stopping.set()
        self.thread.join(timeout)

    def _main(self) -> None:
        try:
            self.run()
        except CUT_OFF as exc:
            self.error = exc
            self.cut_off = True
        except BaseException as exc:  # reported by the test, not lost in a thread
            self.error = exc
        if not self.stopping.is_set() and self.error is None:
            self.cut_off = True  # a paho loop that saw its connection end

    def failure(self, *, killed: bool) -> str | None:
        """Why this client failed: anything, before the kill; after it, anything but being cut off."""
        if killed and self.cut_off:
            return None
        if self.error is not None:
            return repr(self.error)
        if not killed and not self.thread.is_alive() and not self.stopping.is_set():
            return "ended by itself"
        return None

    @abc.abstractmethod
    def run(self) -> None:
        """The client's work, on its thread."""


class MqttPublisher(Worker):
    """QoS 1 to ``$queue/crash-mqtt``, up to ``window`` PUBLISHes awaiting their PUBACK."""

    name = "mqtt-publisher"

    def __init__(self, ledger: Ledger, life: int, endpoints: Endpoints, window: int = 64) -> None:
        super().__init__(ledger, life)
        self.endpoints = endpoints
        self.window = threading.Semaphore(window)

    def run(self) -> None:
        client = connect(self.endpoints, f"crash-pub-{self.life}", version=V5)
        paho = client.client
        # A PUBACK can arrive before publish() has returned the mid: whichever of the two comes
        # second matches them (paho calls on_publish holding its own locks, so none is held here
        # across publish()).
        lock = threading.Lock()
        by_mid: dict[int, str] = {}
        early: dict[int, bool] = {}  # mid -> PUBACK said success

        def settle(payload: str, ok: bool) -> None:
            if ok:
                self.ledger.confirm(payload)
            self.window.release()

        def on_publish(_c: Any, _u: Any, mid: int, reason: Any, _p: Any) -> None:
            ok = not getattr(reason, "is_failure", False)
            with lock:
                payload = by_mid.pop(mid, None)
                if payload is None:
                    early[mid] = ok
                    return
            settle(payload, ok)

        paho.on_publish = on_publish
        n = 0
        try:
            while not self.stopping.is_set() and paho.is_connected():
                if not self.window.acquire(timeout=0.1):
                    continue
                payload = f"m/{self.life}/{n}"
                n += 1
                self.ledger.sent(payload, self.life)
                info = paho.publish(f"$queue/{MQTT_QUEUE}", payload.encode(), qos=1)
                with lock:
                    ok = early.pop(info.mid, None)
                    if ok is None:
                        by_mid[info.mid] = payload
                if ok is not None:
                    settle(payload, ok)
        finally:
            with contextlib.suppress(Exception):
                client.disconnect()


class AmqpPublisher(Worker):
    """Persistent messages to the durable queue ``crash-amqp`` with publisher confirms: a publish
    that returns was confirmed (basic.ack after the commit)."""

    name = "amqp-publisher"

    def __init__(self, ledger: Ledger, life: int, port: int, tag: str) -> None:
        super().__init__(ledger, life)
        self.port = port
        self.tag = tag

    def run(self) -> None:
        connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", self.port))
        try:
            channel = connection.channel()
            channel.queue_declare(AMQP_QUEUE, durable=True)
            channel.confirm_delivery()
            persistent = pika.BasicProperties(delivery_mode=pika.DeliveryMode.Persistent)
            n = 0
            while not self.stopping.is_set():
                payload = f"a/{self.life}/{self.tag}{n}"
                n += 1
                self.ledger.sent(payload, self.life)
                channel.basic_publish("", AMQP_QUEUE, payload.encode(), persistent, mandatory=True)
                self.ledger.confirm(payload)  # returned without NackError or UnroutableError
        finally:
            with contextlib.suppress(Exception):
                connection.close()


class MqttConsumer(Worker):
    """Subscribes to both queues at QoS 1 and PUBACKs what it got every ``ack_every`` seconds, so
    that at any moment some deliveries are held unacknowledged."""

    name = "mqtt-consumer"

    def __init__(self, ledger: Ledger, life: int, endpoints: Endpoints, ack_every: float = 0.05) -> None:
        super().__init__(ledger, life)
        self.endpoints = endpoints
        self.ack_every = ack_every
        self.held: list[tuple[int, str]] = []
        self.held_lock = threading.Lock()

    def run(self) -> None:
        client = connect(self.endpoints, f"crash-sub-{self.life}", version=V5, manual_ack=True)

        def on_message(_c: Any, _u: Any, msg: MQTTMessage) -> None:
            payload = bytes(msg.payload).decode()
            self.ledger.received(payload, Receipt(self.life, self.name, bool(msg.dup)))
            with self.held_lock:
                self.held.append((msg.mid, payload))

        client.client.on_message = on_message
        try:
            for queue in QUEUES:
                client.subscribe(f"$queue/{queue}", qos=1)
            while client.client.is_connected():
                self._ack(client)
                if self.stopping.is_set():
                    break
                time.sleep(self.ack_every)
        finally:
            with contextlib.suppress(Exception):
                client.disconnect()

    def _ack(self, client: Client) -> None:
        with self.held_lock:
            batch, self.held = self.held, []
        for mid, payload in batch:
            # Recorded before it is sent: the kill can land between the PUBACKs of one batch, and
            # one the broker read and committed is rightly not delivered again.
            self.ledger.ack_sent([payload])
            if client.client.ack(mid, 1) != 0:
                raise ConnectionError("PUBACK not sent")


class AmqpConsumer(Worker):
    """basic.consume on both queues (prefetch 100), acking in batches with ``multiple``."""

    name = "amqp-consumer"

    def __init__(self, ledger: Ledger, life: int, port: int, ack_every: float = 0.05) -> None:
        super().__init__(ledger, life)
        self.port = port
        self.ack_every = ack_every

    def run(self) -> None:
        connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", self.port))
        try:
            channel = connection.channel()
            channel.basic_qos(prefetch_count=100)
            held: list[str] = []
            last_tag = 0

            def on_message(_ch: Any, method: Any, _props: Any, body: bytes) -> None:
                nonlocal last_tag
                payload = body.decode()
                self.ledger.received(payload, Receipt(self.life, self.name, bool(method.redelivered)))
                held.append(payload)
                last_tag = method.delivery_tag

            for queue in QUEUES:
                channel.queue_declare(queue, durable=True)
                channel.basic_consume(queue, on_message)
            while True:
                connection.process_data_events(time_limit=self.ack_every)
                if held:
                    # Recorded first: pika may have written the ack when the kill makes it raise.
                    self.ledger.ack_sent(held)
                    channel.basic_ack(last_tag, multiple=True)
                    held = []
                if self.stopping.is_set():
                    break
        finally:
            with contextlib.suppress(Exception):
                connection.close()
