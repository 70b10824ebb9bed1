"""A shovel's remote end over AMQP 1.0 (``amqp1/client.py``), one session and one link: as a
source a receiver on ``src_address`` with ``src_prefetch_count`` credit, settling each message
accepted once it is here; as a destination a sender to ``dest_address`` whose transfers are
unsettled until the remote's outcome."""

from __future__ import annotations

import logging

from trimaran.amqp1.client import (
    Attached,
    ClientConnection,
    ClientParams,
    Closed,
    Detached,
    Opened,
    Outcome,
    Received,
)
from trimaran.amqp1.mapping import EXTRA_KEY, from_amqp1, from_wire, to_amqp1
from trimaran.amqp1.messages import decode_message
from trimaran.amqp1.types import DecodeError
from trimaran.bridges.ends import MachineEnd, Shoveller
from trimaran.bridges.link import CONNECT_TIMEOUT_S, VIA, via
from trimaran.broker.message import Message
from trimaran.config import ShovelUri
from trimaran.vhosts import DEFAULT_VHOST

log = logging.getLogger("trimaran.bridges")


class Amqp1End(MachineEnd):
    """One connection's worth of a shovel's AMQP 1.0 end."""

    machine: ClientConnection

    def __init__(self, shovel: Shoveller, uri: ShovelUri, now: float) -> None:
        self.shovel = shovel
        self.settings = shovel.settings
        self.outward = shovel.outward
        self.ready = False
        self._handle = -1
        self._unsettled = 0  # received and not yet settled (a source's credit is the rest)
        self._presettled: set[int] = set()  # received settled by the remote: nothing to say
        params = ClientParams(
            container_id=shovel.client_id,
            # RabbitMQ's AMQP 1.0 plugin reads the vhost here; others the host.
            hostname=uri.host if uri.vhost == DEFAULT_VHOST else f"vhost:{uri.vhost}",
            username=uri.username,
            password=uri.password,
            idle_timeout_s=float(uri.query.get("heartbeat", "60")),
            connect_timeout=CONNECT_TIMEOUT_S,
        )
        self.machine = ClientConnection(params, now)

    # -- the shovel's calls -------------------------------------------------------------------------

    def window(self) -> int:
        return self.machine.credit(self._handle) if self.ready else 0

    def send(self, message: Message, mark: str, now: float) -> int:
        # The message as it came is not sent as is: its application-properties take the mark.
        kept = message.user_properties
        if via(message):
            kept = [(key, value) for key, value in kept if key != VIA]
        extra = message.extra
        if EXTRA_KEY in extra:
            extra = {key: value for key, value in extra.items() if key != EXTRA_KEY}
        marked = message.copy_with(user_properties=[*kept, (VIA, mark)], extra=extra)
        payload = to_amqp1(marked, cut=len(self.shovel.vhost_prefix))
        return self.machine.send(self._handle, payload, settled=not self.shovel.confirming)

    def accept(self, tags: list[int], now: float) -> None:
        machine = self.machine
        if not machine.opened:
            return
        presettled = self._presettled
        for tag in tags:
            if tag in presettled:
                presettled.discard(tag)
            else:
                machine.settle(tag, "accepted")
        self._unsettled -= len(tags)
        machine.flow(self._handle, self.settings.src_prefetch_count - self._unsettled)

    def close(self, now: float) -> None:
        self.machine.close(now)

    # -- what the remote says -----------------------------------------------------------------------

    def _events(self) -> None:
        machine = self.machine
        shovel = self.shovel
        while (event := machine.next_event()) is not None:
            if isinstance(event, Received):
                self._received(event)
            elif isinstance(event, Outcome):
                if event.outcome == "accepted":
                    shovel.end_settled(event.delivery_id, None)
                elif event.outcome in ("released", "modified"):
                    shovel.end_settled(event.delivery_id, "released")
                else:
                    why = event.outcome
                    if event.description is not None:
                        why += f": {event.description}"
                    shovel.end_settled(event.delivery_id, why)
            elif isinstance(event, Opened):
                settings = self.settings
                if self.outward:
                    assert settings.dest_address is not None  # (the settings checked it)
                    self._handle = machine.attach_sender(shovel.client_id, settings.dest_address)
                else:
                    assert settings.src_address is not None
                    self._handle = machine.attach_receiver(
                        shovel.client_id, settings.src_address, credit=settings.src_prefetch_count
                    )
            elif isinstance(event, Attached):
                self.ready = True
                shovel.end_ready()
            elif isinstance(event, Detached):
                why = event.description or event.condition or "no reason given"
                machine.close(shovel.loop_time(), None, None)
                log.warning("shovel %s: the remote detached the link: %s", shovel.name, why)
            elif isinstance(event, Closed):
                self.ready = False
                shovel.end_closed(event.reason)

    def _received(self, event: Received) -> None:
        shovel = self.shovel
        settings = self.settings
        key = settings.dest_exchange_key or settings.src_address or ""
        topic = shovel.local_topic(key)
        message = from_wire(event.message, topic, shovel.id, settled=event.settled)
        if message is None:
            try:
                message = from_amqp1(
                    decode_message(event.message), topic, shovel.id, settled=event.settled, raw=event.message
                )
            except DecodeError as exc:
                log.warning("shovel %s: a malformed message from the remote, rejected: %s", shovel.name, exc)
                self.machine.settle(event.delivery_id, "rejected", description=f"malformed message: {exc}")
                return
        self._unsettled += 1
        if event.settled:
            self._presettled.add(event.delivery_id)
        shovel.end_took(message, event.delivery_id)
