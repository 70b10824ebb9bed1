"""A shovel's remote end over AMQP 0.9.1 (``amqp091/client.py``), one channel: as a source it
consumes a queue with a prefetch and acknowledges in order; as a destination it publishes with
publisher confirms. Set up as RabbitMQ's shovel does: a source or destination queue is declared
durable; an exchange source is read through a durable queue of the shovel's own
(``trimaran.shovel.CLIENT-ID``, kept across gaps) bound with the source's key."""

from __future__ import annotations

import logging
from collections import deque

from trimaran.amqp091.client import (
    ClientConnection,
    ClientParams,
    Closed,
    Confirmed,
    ConfirmsSelected,
    ConsumerCancelled,
    ConsumeStarted,
    Delivered,
    Opened,
    QueueDeclared,
)
from trimaran.amqp091.mapping import delivery_address, message_from_content, properties_from_message
from trimaran.bridges.ends import MachineEnd, Shoveller
from trimaran.bridges.link import CONNECT_TIMEOUT_S, VIA
from trimaran.broker.message import Message
from trimaran.config import ShovelUri

log = logging.getLogger("trimaran.bridges")

#: What a destination takes when it is not blocked: the shovel's own window bounds it.
OPEN = 1 << 30


class Amqp091End(MachineEnd):
    """One connection's worth of a shovel's AMQP 0.9.1 end."""

    machine: ClientConnection

    def __init__(self, shovel: Shoveller, uri: ShovelUri, now: float) -> None:
        self.shovel = shovel
        self.settings = settings = shovel.settings
        self.outward = shovel.outward
        self.ready = False
        self._no_ack = settings.ack_mode == "no-ack"
        self._unconfirmed: deque[int] = deque()  # publish sequence numbers, in order
        params = ClientParams(
            username=uri.username if uri.username is not None else "guest",
            password=uri.password if uri.password is not None else "guest",
            vhost=uri.vhost,
            heartbeat=int(uri.query.get("heartbeat", "60")),
            connection_name=shovel.client_id,
            connect_timeout=CONNECT_TIMEOUT_S,
        )
        self.machine = ClientConnection(params, now)

    # -- the shovel's calls -------------------------------------------------------------------------

    def window(self) -> int:
        return 0 if not self.ready or self.machine.blocked else OPEN

    def send(self, message: Message, mark: str, now: float) -> int:
        properties = properties_from_message(message)
        properties.headers = {**(properties.headers or {}), VIA: mark}
        settings = self.settings
        if settings.dest_queue is not None:
            exchange, key = "", settings.dest_queue
        else:
            exchange = settings.dest_exchange or ""
            key = settings.dest_exchange_key or delivery_address(message)[1]
        sequence = self.machine.publish(exchange, key, properties, message.payload)
        if self.shovel.confirming:
            self._unconfirmed.append(sequence)
        return sequence

    def accept(self, tags: list[int], now: float) -> None:
        if not self._no_ack and self.machine.opened:
            self.machine.ack(tags[-1], multiple=True)  # the ones before are acknowledged already

    def close(self, now: float) -> None:
        self.machine.close(now)

    # -- what the remote says -----------------------------------------------------------------------

    def _events(self) -> None:
        machine = self.machine
        shovel = self.shovel
        while (event := machine.next_event()) is not None:
            if isinstance(event, Delivered):
                message = message_from_content(
                    event.properties,
                    event.body,
                    shovel.local_topic(event.routing_key),
                    exchange=event.exchange,
                    routing_key=event.routing_key,
                    publisher_id=shovel.id,
                )
                shovel.end_took(message, event.delivery_tag)
            elif isinstance(event, Confirmed):
                self._confirmed(event)
            elif isinstance(event, Opened):
                self._set_up()
            elif isinstance(event, (ConsumeStarted, ConfirmsSelected, QueueDeclared)):
                if not isinstance(event, QueueDeclared) or (self.outward and not shovel.confirming):
                    self._up()  # the last reply of the set-up
            elif isinstance(event, ConsumerCancelled):
                # The remote deleted the queue: connect again, which declares it again.
                machine.close(shovel.loop_time(), 200, "the queue was deleted")
            elif isinstance(event, Closed):
                self.ready = False
                shovel.end_closed(event.reason)

    def _set_up(self) -> None:
        """Declare, then consume (a source) or select confirms (a destination); pipelined."""
        machine = self.machine
        settings = self.settings
        if self.outward:
            if settings.dest_queue is not None:
                machine.declare_queue(settings.dest_queue, durable=True)
            if self.shovel.confirming:
                machine.select_confirms()
            elif settings.dest_queue is None:
                self._up()
            return
        machine.qos(settings.src_prefetch_count)
        queue = settings.src_queue
        if queue is None:
            assert settings.src_exchange is not None  # (the settings checked it)
            queue = f"trimaran.shovel.{self.shovel.client_id}"
            machine.declare_queue(queue, durable=True)
            machine.bind_queue(queue, settings.src_exchange, settings.src_exchange_key)
        else:
            machine.declare_queue(queue, durable=True)
        machine.consume(queue, no_ack=self._no_ack)

    def _up(self) -> None:
        self.ready = True
        self.shovel.end_ready()

    def _confirmed(self, event: Confirmed) -> None:
        outcome = None if event.ok else "nacked by the remote"
        unconfirmed = self._unconfirmed
        shovel = self.shovel
        if event.multiple:
            while unconfirmed and unconfirmed[0] <= event.sequence:
                shovel.end_settled(unconfirmed.popleft(), outcome)
        elif unconfirmed and unconfirmed[0] == event.sequence:
            shovel.end_settled(unconfirmed.popleft(), outcome)
        elif event.sequence in unconfirmed:
            unconfirmed.remove(event.sequence)
            shovel.end_settled(event.sequence, outcome)
