"""The runtime's limits and counters: plain values the runner owns and each connection reads, in a
module below both (``runner.py`` and ``transport.py``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol


@dataclass(slots=True)
class RuntimeLimits:
    max_connections: int = 100_000
    max_connections_per_address: int = 0  # 0: no limit
    accept_rate_per_address: float = 0.0  # new connections per second and source address; 0: no limit
    accept_burst_per_address: int = 50
    handshake_timeout_s: float = 10.0  # until the protocol picks its own deadline
    tcp_nodelay: bool = True  # what the event loops set on every TCP transport (Conn._admit)
    memory_high_watermark: int = 0  # bytes waiting for slow readers; 0: off
    memory_low_watermark: int = 0
    hold_publishers_s: float = 1.0  # longest a QoS 0 reader whose socket is full holds its publishers
    stalled_consumer_timeout_s: float = 30.0  # a consumer that is behind and takes nothing is closed


class Traffic(Protocol):
    """Where the runtime counts the bytes of every connection (the broker's $SYS and metrics)."""

    bytes_received: int
    bytes_sent: int
    messages_received: int  # the hulls count each publish here (a user's rate is charged from it)


@dataclass(slots=True)
class RuntimeStats:
    accepted: int = 0
    bytes_received: int = 0  # what every connection read and wrote, when no other sink is given
    bytes_sent: int = 0
    messages_received: int = 0
    refused: dict[str, int] = field(default_factory=dict)  # reason -> count
    crashes: int = 0
    # Flow control (runtime/flow.py), counted when a gate begins holding and when a consumer is
    # closed, never per message: place -> times a gate began holding publishers; place -> consumers
    # closed for taking nothing (the queues count theirs, ``QueueFlow.closed``); connections not read
    # now because some gate holds them.
    holds: dict[str, int] = field(default_factory=dict)
    stalls: dict[str, int] = field(default_factory=dict)
    held: int = 0

    def refuse(self, reason: str) -> None:
        self.refused[reason] = self.refused.get(reason, 0) + 1

    def began(self, place: str) -> None:
        """A gate at ``place`` began holding publishers."""
        self.holds[place] = self.holds.get(place, 0) + 1

    def stalled(self, place: str) -> None:
        """A consumer at ``place`` was closed for taking nothing while it held publishers."""
        self.stalls[place] = self.stalls.get(place, 0) + 1
