"""The runtime's limits and counters: plain values the runner owns and each connection reads, in a
module below both (``runner.py`` and ``transport.py``)."""

from __future__ import annotations

from dataclasses import dataclass, field

# Descriptors a server keeps besides its connections: listeners, the database's files and sockets,
# the event loop's own, webhook clients, log files.
RESERVED_FILES = 256


@dataclass(slots=True)
class RuntimeLimits:
    max_connections: int = 100_000
    max_connections_per_address: int = 0  # 0: no limit
    accept_rate_per_address: float = 0.0  # new connections per second and source address; 0: no limit
    accept_burst_per_address: int = 50
    # New connections a second per listener; those beyond wait their turn unread (Runner.take_turn)
    accept_rate: float = 0.0  # 0: no limit
    accept_burst: int = 100
    handshake_timeout_s: float = 10.0  # until the protocol picks its own deadline
    tcp_nodelay: bool = True  # what the event loops set on every TCP transport (Conn._admit)
    memory_high_watermark: int = 0  # bytes waiting for slow readers; 0: off
    memory_low_watermark: int = 0
    hold_publishers_s: float = 1.0  # longest a QoS 0 reader whose socket is full holds its publishers
    stalled_consumer_timeout_s: float = 30.0  # a consumer that is behind and takes nothing is closed


@dataclass(slots=True)
class RuntimeStats:
    accepted: int = 0
    refused: dict[str, int] = field(default_factory=dict)  # reason -> count
    crashes: int = 0
    # Flow control (runtime/flow.py), counted when a gate begins holding and when a consumer is
    # closed, never per message: place -> times a gate began holding publishers; place -> consumers
    # closed for taking nothing (the queues count theirs, ``QueueFlow.closed``); connections not read
    # now because some gate holds them.
    holds: dict[str, int] = field(default_factory=dict)
    stalls: dict[str, int] = field(default_factory=dict)
    held: int = 0
    waited: int = 0  # connections that waited for their turn (limits.accept_rate)

    def refuse(self, reason: str) -> None:
        self.refused[reason] = self.refused.get(reason, 0) + 1

    def began(self, place: str) -> None:
        """A gate at ``place`` began holding publishers."""
        self.holds[place] = self.holds.get(place, 0) + 1

    def stalled(self, place: str) -> None:
        """A consumer at ``place`` was closed for taking nothing while it held publishers."""
        self.stalls[place] = self.stalls.get(place, 0) + 1


def raise_open_files(wanted: int) -> tuple[int, int]:
    """Raise this process's soft limit on open files towards ``wanted``, as far as the hard limit
    lets it: (the soft limit before, the soft limit now).

    Each connection is a descriptor. Past the soft limit, libuv accepts a connection and closes it at
    once (its answer to EMFILE), which the server never sees; shells and systemd start processes at
    1,024 by default, with a far higher hard limit a process may take for itself."""
    try:
        import resource
    except ImportError:  # not a POSIX system: nothing to ask
        return wanted, wanted
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= wanted:
        return soft, soft
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if target <= soft:
        return soft, soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError):  # above the kernel's nr_open: keep what there is
        return soft, soft
    return soft, target
