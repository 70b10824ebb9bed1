"""A shovel between this broker and another AMQP broker, configured as RabbitMQ's Shovel plugin's
are (``[[shovels]]``): one side is this broker (``amqp://``), the other a remote speaking AMQP
0.9.1 (``amqp091.py``) or AMQP 1.0 (``amqp1.py``).

The local side is a :class:`~trimaran.bridges.link.Link`'s, and keeps its promises (link.py):

- **Out** (``src_uri = "amqp://"``): a queue here is consumed as any AMQP consumer does (its
  messages move), or ``amq.topic`` is, through the shovel's own durable queue (``$shovel.NAME``)
  bound with ``src_exchange_key``. With ``ack_mode = "on-confirm"`` a message leaves here only once
  the remote has confirmed it (a publisher confirm, an accepted outcome); one the remote refuses is
  dead-lettered; what was in flight when the connection went is sent again on the next.
- **In** (``dest_uri = "amqp://"``): the remote's queue is consumed with ``src_prefetch_count``
  unacknowledged at most, and each message acknowledged to the remote once it is here (routed to
  ``amq.topic``, committed to a queue), in order.

Loops: a message carries the links it went out through in a header (``link.VIA``); a shovel does
not send out again a message it sent before, so two shovels that feed each other through a remote
stop at one turn.
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from trimaran.bridges.amqp091 import Amqp091End
from trimaran.bridges.amqp1 import Amqp1End
from trimaran.bridges.ends import RemoteEnd
from trimaran.bridges.link import Link, tls_context
from trimaran.broker.core import Broker
from trimaran.broker.message import Message
from trimaran.broker.router import Delivery, SubscriptionOptions
from trimaran.config import ShovelSettings, ShovelUri
from trimaran.queue.groups import QueueDelivery
from trimaran.queue.handles import ConsumerHandle
from trimaran.queue.manager import QueueManager
from trimaran.runtime.confirms import InOrder
from trimaran.runtime.flow import Gate, Stalled
from trimaran.runtime.runner import Runner
from trimaran.topics import binding_key_to_filter, routing_key_to_topic
from trimaran.vhosts import prefix

log = logging.getLogger("trimaran.bridges")


def _end_text(settings: ShovelSettings, side: str) -> str:
    """A side of the shovel as the API shows it: ``amqp://host:5672 queue orders``."""
    uri = settings.source if side == "src" else settings.destination
    what = []
    for key in ("queue", "exchange", "address"):
        value = getattr(settings, f"{side}_{key}")
        if value is not None:
            what.append(f"{key} {value}")
    routing = settings.src_exchange_key if side == "src" else settings.dest_exchange_key
    if getattr(settings, f"{side}_exchange") is not None and routing is not None:
        what.append(f"key {routing}")
    return " ".join([uri.shown, *what])


@dataclass(slots=True)
class _Taken:
    """A message from the remote, acknowledged to it once ``done`` (in arrival order)."""

    tag: int
    done: bool = False


class Shovel(Link):
    """One ``[[shovels]]`` table: its local queue or topics, and its remote connection."""

    kind = "shovel"

    def __init__(
        self,
        settings: ShovelSettings,
        broker: Broker,
        *,
        node_name: str,
        runner: Runner,
        make_gate: Callable[[Stalled], Gate],
        queues: QueueManager,
        stalled_timeout_s: float = 30.0,
    ) -> None:
        local = settings.local
        super().__init__(
            settings.name,
            broker,
            node_name=node_name,
            vhost_prefix=prefix(local.vhost),
            queue_bytes=settings.queue_bytes,
            runner=runner,
            make_gate=make_gate,
            queues=queues,
            stalled_timeout_s=stalled_timeout_s,
        )
        self.settings = settings
        self.outward = settings.source.local  # this broker is the source
        self.protocol = settings.dest_protocol if self.outward else settings.src_protocol
        self.client_id = f"{node_name}.{settings.name}"
        self.protocol_version = self.protocol
        self.vhost = local.vhost
        self._remotes = settings.remotes()
        self.configured_address = " ".join(uri.shown for uri in self._remotes)
        self.lines = (f"{_end_text(settings, 'src')} -> {_end_text(settings, 'dest')}",)
        if self.outward and settings.src_queue is not None:
            self.queue = self.vhost_prefix + settings.src_queue  # the queue it empties toward the remote
        self.confirming = settings.ack_mode == "on-confirm"
        self._end: RemoteEnd | None = None
        self._sent: dict[int, tuple[ConsumerHandle, int]] = {}  # the remote's tag -> its delivery
        self._inbound: InOrder[_Taken] = InOrder()

    # -- the local side ---------------------------------------------------------------------------

    async def _open(self) -> None:
        settings = self.settings
        if not self.outward:
            if settings.dest_queue is not None:
                await self._declare(settings.dest_queue)
            return
        if settings.src_queue is not None:
            # Among the queue's other consumers, as RabbitMQ's shovel: its messages move.
            self._consume(await self._declare(settings.src_queue), None, None, None)
        else:
            await self._open_own_queue()

    async def _declare(self, name: str) -> str:
        """The local queue ``name`` (declared durable when absent); its key."""
        key = self.vhost_prefix + name
        if not self.queues.exists(key):
            await self.queues.declare(key)
        return key

    def subscribe_locally(self) -> None:
        if self.outward and self.settings.src_exchange is not None:
            topic_filter = binding_key_to_filter(self.settings.src_exchange_key)
            options = SubscriptionOptions(qos=1, no_local=True)
            self.broker.router.subscribe(self, self.vhost_prefix + topic_filter, options)

    def deliver(self, message: Message, _delivery: Delivery[Any]) -> None:
        """A message of ``amq.topic`` the source's key takes: into the shovel's queue."""
        end = self._end
        self._keep(message, end is not None and end.ready)

    def local_topic(self, routing_key: str) -> str:
        """Where a message from the remote goes here: a queue's topic, or amq.topic's."""
        settings = self.settings
        if settings.dest_queue is not None:
            return f"{self.vhost_prefix}$queue/{settings.dest_queue}"
        if settings.dest_exchange is not None:
            return self.vhost_prefix + routing_key_to_topic(settings.dest_exchange_key or routing_key)
        return f"{self.vhost_prefix}$queue/{settings.dest_exchange_key or routing_key}"

    # -- the connection ---------------------------------------------------------------------------

    def _targets(self) -> list[tuple[str, int]]:
        return [(uri.host, uri.port) for uri in self._remotes]

    def _delays(self) -> tuple[float, float]:
        delay = self.settings.reconnect_delay
        return delay, delay

    async def _connect_once(self, host: str, port: int) -> None:
        uri = next(uri for uri in self._remotes if (uri.host, uri.port) == (host, port))
        context = None
        if uri.tls:
            query = uri.query
            context = tls_context(
                query.get("cacertfile"),
                query.get("certfile"),
                query.get("keyfile"),
                check_hostname=query.get("verify") != "verify_none",
            )
            if query.get("verify") == "verify_none":
                context.verify_mode = ssl.CERT_NONE
        await self._connect(host, port, context, uri.query.get("server_name_indication", host))
        self._end = self._make_end(uri)
        await self._keep_connection()

    def _make_end(self, uri: ShovelUri) -> RemoteEnd:
        now = self._loop_time()
        if self.protocol == "amqp10":
            return Amqp1End(self, uri, now)
        return Amqp091End(self, uri, now)

    def _down(self) -> None:
        self._end = None
        # The remote sends again what it had not seen acknowledged; what was sent to it and not
        # confirmed goes back to the queue, to be sent again on the next connection.
        self._inbound = InOrder()
        for handle, offset in self._sent.values():
            handle.release_nowait(offset)
        self.figures.in_flight -= len(self._sent)
        self._sent.clear()

    def _is_up(self) -> bool:
        return self._end is not None and self._end.ready

    def _farewell(self) -> bytes:
        end = self._end
        if end is None:
            return b""
        end.close(self._loop_time())
        return end.data_to_send()

    def _data(self, data: bytes) -> None:
        end = self._end
        if end is None:
            return
        now = self._loop_time()
        self._as_publisher(lambda: end.receive(data, now))
        self._after(end)

    def _lost(self, exc: Exception | None) -> None:
        end = self._end
        if end is not None:
            end.eof(None if exc is None else f"connection lost: {exc}")
        if self._gone is not None:
            self._gone.set()

    def _tick(self) -> None:
        end = self._end
        if end is not None:
            end.tick(self._loop_time())
            self._after(end)

    def _after(self, end: RemoteEnd) -> None:
        """After what the remote said: settle, refill, write."""
        if self._acked:
            self._settle_acked()
        self._acknowledge_ready()
        self._refill(end)
        self._flush()

    def _flush(self) -> None:
        self._flush_due = False
        end = self._end
        if end is not None:
            self._write(end)

    # -- callbacks of the remote end (ends.Shoveller) ------------------------------------------------

    def loop_time(self) -> float:
        return self._loop_time()

    def end_ready(self) -> None:
        """The remote end is set up (connected, declared, consuming or confirming)."""
        self._connected()

    def end_closed(self, reason: str) -> None:
        """The remote end closed (``reason`` says why)."""
        end = self._end
        self._close_socket(reason, b"" if end is None else end.data_to_send())

    def end_took(self, message: Message, tag: int) -> None:
        """A message from the remote, its topic here set: routed or queued, and acknowledged once
        it is (``tag``: the remote's)."""
        self.figures.received += 1
        message.publisher_id = self.id
        entry = self._inbound.add(_Taken(tag))
        if message.topic[len(self.vhost_prefix) :].startswith("$queue/"):
            message.retain = False
            self._to_queue(message, entry if self.confirming else None)
            if not self.confirming:
                entry.done = True
        else:
            self.broker.publish(message)
            entry.done = True

    def end_settled(self, tag: int, outcome: str | None) -> None:
        """The remote settled a message sent to it: ``outcome`` None accepted, "released" to send
        again, else why it refused it."""
        held = self._sent.pop(tag, None)
        if held is None:
            return
        handle, offset = held
        if outcome == "released":
            self.figures.in_flight -= 1
            handle.release_nowait(offset)
            return
        self._settled_out(handle, offset, outcome)

    def _acknowledge_ready(self) -> None:
        ready = self._inbound.ready()
        end = self._end
        if ready and end is not None:
            end.accept([entry.tag for entry in ready], self._loop_time())

    # -- out: to the remote -------------------------------------------------------------------------

    def _refill(self, end: RemoteEnd) -> None:
        """The queue's credit (a shovel reads one): its window less what is in flight, within
        what the remote takes."""
        if not self.outward or not end.ready:
            return
        room = min(self.settings.src_prefetch_count - self.figures.in_flight, end.window())
        for handle in self._handles:
            handle.set_credit(max(0, room))

    def _from_queue(self, delivery: QueueDelivery, handle: ConsumerHandle, line: Any) -> None:
        end = self._end
        message = delivery.message
        if end is None or not end.ready or end.window() <= 0:
            handle.set_credit(0)  # (the connection went, or the remote's credit ran out)
            handle.release_nowait(delivery.offset)
            return
        mark = self._marked(message)
        if mark is None:
            handle.ack_nowait(delivery.offset)
            handle.add_credit(1)
            return
        tag = end.send(message, mark, self._loop_time())
        if self.confirming:
            self._sent[tag] = (handle, delivery.offset)
            self.figures.in_flight += 1
        else:
            self.figures.sent += 1
            handle.ack_nowait(delivery.offset)
            handle.add_credit(1)
        self._flush_soon()
