"""How a consumer settles a delivery, as one typed value whatever the protocol.

RabbitMQ's queue types settle ``complete | requeue | discard | modify``; these are ours:

- :class:`Ack`: done; the message leaves the group's pending entries (work) or is acknowledged.
- :class:`Retry`: not done. ``failed=True`` (a nack, AMQP 1.0 ``modified`` with delivery-failed)
  counts as an attempt and comes back after ``delay_s`` (``None``: the queue's backoff), or is
  dead-lettered once ``max_attempts`` is reached. ``failed=False`` (AMQP 1.0 ``released``) hands it
  back unprocessed: available again at once, not an attempt. ``sent=False`` (the hull never put it
  on the wire: its channel closed as it was handed over) also keeps the next delivery from being
  flagged redelivered.
- :class:`DeadLetter`: never retried; moved to the dead-letter queue with ``reason``.
- :class:`Commit`: a stream group's position moves past ``offset``.

Each hull turns its protocol's settlement into one of these in one function (MQTT
``mqtt.queues.puback_outcome``, and ``mqtt.queues.control_outcome`` for its ``$ack``/``$nack``/
``$reject``/``$commit`` topics; AMQP 0.9.1 ``amqp091.channels.BASIC_OUTCOMES``; AMQP 1.0
``amqp1.links.disposition_outcome``) and hands it to ``ConsumerHandle.settle_nowait``. The groups
(``work.py``, ``stream.py``) settle with nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Ack:
    pass


@dataclass(frozen=True, slots=True)
class Retry:
    delay_s: float | None = None
    failed: bool = True
    sent: bool = True


@dataclass(frozen=True, slots=True)
class DeadLetter:
    reason: str = "rejected"


@dataclass(frozen=True, slots=True)
class Commit:
    offset: int


Outcome = Ack | Retry | DeadLetter | Commit

ACK = Ack()
RETRY_NOW = Retry(0.0)  # AMQP 0.9.1 requeue: back at once, an attempt
RELEASED = Retry(0.0, failed=False)
UNSENT = Retry(0.0, failed=False, sent=False)
