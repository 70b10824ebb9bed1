"""Backpressure from a queue's consumers to its publishers: a queue read by an online consumer that
has fallen behind holds the publishers feeding it, instead of growing without bound.

A work queue with at least one consumer that takes what comes (no routing filter, no selector) is
*behind* while the messages it has not yet handed to the group furthest back are above
``limits.queue_backpressure_messages`` or their payloads above ``limits.queue_backpressure_bytes``;
it is no longer behind once both are below half, or it has no such consumer, or it is purged or
deleted. While it is behind, every publish into it holds its publisher through the queue's gate
(the runtime's ``flow.Gate``, made by the ``MakeGate`` the app wires in): a connection is not read,
an AMQP 1.0 sending link gets no new credit. So a publisher goes at the pace of the queues it feeds,
and one feeding only queues that keep up is never slowed by a slow one elsewhere.

Left out: queues nobody reads (holding publishers would wait for nobody: what bounds them is their
max-length, and for a durable one the disk watermark), queues with a max-length (their policy says
what happens past it), streams (retention: reading one frees nothing) and a shared node's work
queues (their memory holds only claims).

A queue that holds publishers and sees no settlement (ack, nack, reject) for
``limits.stalled_consumer_timeout_s`` has consumers that take nothing: each is closed its protocol's
way (``QueueConsumer.stalled``: AMQP 0.9.1 closes the channel, AMQP 1.0 detaches the link, MQTT
disconnects), what they held goes back to the queue, and the publishers go on.

The manager calls :meth:`QueueFlow.look` after a dispatch that left messages behind (one comparison
on its way, no call) and wherever the backlog may have gone (a settlement, a consumer leaving, a
purge, a delete, the expiry sweep); a publish asks :attr:`QueueState.behind`, one attribute.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol

from trimaran.queue.groups import QueueState
from trimaran.queue.work import WorkGroup
from trimaran.vhosts import describe

log = logging.getLogger(__name__)


class Held(Protocol):
    """A publisher as a gate holds it (the runtime's connection, or an AMQP 1.0 sending link)."""

    def held(self, on: bool) -> None: ...


class Gate(Protocol):
    """What holds a queue's publishers: the runtime's ``flow.Gate``."""

    stuck: bool

    @property
    def holding(self) -> bool: ...

    def hold(self, source: Held | None = None) -> None: ...

    def saw(self, mark: int) -> None: ...

    def idle_s(self) -> float: ...

    def release(self) -> None: ...


#: ``stalled(idle_s)`` as the gate asks it (``flow.Stalled``): True to keep holding.
Stalled = Callable[[float], bool]
#: Makes a queue's gate, given what it asks when it sees no progress (the app's: the runtime's Gate).
MakeGate = Callable[[Stalled], Gate]

#: The marks when nothing makes gates (a manager without the runtime): never behind.
OFF = 1 << 62


class QueueFlow:
    __slots__ = (
        "_gates",
        "closed",
        "high_bytes",
        "high_messages",
        "make_gate",
        "shared",
        "stalls",
        "timeout_s",
        "times_held",
        "ungated",
    )

    def __init__(
        self,
        make_gate: MakeGate | None = None,
        *,
        high_messages: int = OFF,
        high_bytes: int = OFF,
        timeout_s: float = 30.0,
        shared: bool = False,
    ) -> None:
        self.make_gate = make_gate
        # Read by the manager on a dispatch's way (one comparison each): OFF without gates.
        self.high_messages = high_messages if make_gate is not None else OFF
        self.high_bytes = high_bytes if make_gate is not None else OFF
        self.timeout_s = timeout_s
        self.shared = shared  # durable work queues are claimed from the database: not gated here
        self._gates: dict[QueueState, Gate] = {}
        # Queues whose reader paces their publishers itself (a bridge's, bridges/mqtt.py: it holds
        # them while its remote is connected and behind, and keeps what comes while it is away).
        self.ungated: set[str] = set()
        self.times_held = 0  # queues that began holding their publishers (counted, for the metrics)
        self.stalls = 0  # queues whose consumers were closed for taking nothing
        self.closed = 0  # consumers closed for taking nothing (the metrics' stalled consumers)

    # -- what the manager calls ----------------------------------------------------------------------

    def backlog(self, state: QueueState) -> tuple[int, int] | None:
        """The messages and payload bytes not yet handed to the group furthest back of those read by
        a consumer that takes what comes; None when the queue is not gated (nobody reads it that
        way, a max-length, a stream, a shared node's work queue, one in ``ungated``, deleted)."""
        if state.deleted or state.policy.mode != "work" or (self.shared and state.durable):
            return None
        if state.name in self.ungated:
            return None
        policy = state.policy
        if policy.max_length is not None or policy.max_length_bytes is not None:
            return None
        most = -1
        high = state.high
        for group in state.groups.values():
            if type(group) is not WorkGroup or not _read(group):
                continue
            # Past the cursor (a gap where a message left early is counted: bounded below by what
            # the queue holds), and what waits to come back.
            waiting = high - group.cursor + len(group.ready)
            if waiting > most:
                most = waiting
        if most < 0:
            return None
        held = len(state.messages)
        count = min(most, held)
        return count, (state.bytes * count // held if held else 0)

    def look(self, state: QueueState) -> None:
        """The queue's backlog may have crossed a mark: become behind (its next publishes hold
        their publishers), or stop being behind (they go on)."""
        if self.make_gate is None:
            return
        backlog = self.backlog(state)
        if state.behind:
            if backlog is None or (
                backlog[0] <= self.high_messages >> 1 and backlog[1] <= self.high_bytes >> 1
            ):
                self._release(state)
        elif backlog is not None and (backlog[0] > self.high_messages or backlog[1] > self.high_bytes):
            state.behind = True
            gate = self._gates.get(state)
            if gate is None or not gate.stuck:
                self.times_held += 1
                log.debug("%s is behind (%d messages, %d bytes not delivered): its publishers are held",
                          describe(state.name), backlog[0], backlog[1])  # fmt: skip

    def hold(self, state: QueueState, source: Held | None) -> None:
        """A publish into a queue that is behind: its publisher (``source``, by default the
        connection whose frames are being acted on) waits until the queue is no longer behind."""
        gate = self._gates.get(state)
        if gate is None:
            if self.make_gate is None:
                return
            gate = self._gates[state] = self.make_gate(lambda idle_s: self._stalled(state, idle_s))
        first = not gate.holding
        gate.hold(source)
        if first and gate.holding:
            gate.saw(progress(state))  # the settlements so far: the first look compares with these

    def joined(self, state: QueueState) -> None:
        """A consumer attached to a queue that is behind: if its earlier consumers were closed for
        taking nothing, the publishers are held again, for it to catch up (or to stall in turn)."""
        gate = self._gates.get(state)
        if gate is not None:
            gate.stuck = False

    def forget(self, state: QueueState) -> None:
        """The queue is deleted: its publishers go on, its gate goes."""
        if state.behind:
            self._release(state)
        self._gates.pop(state, None)

    # -- inside -----------------------------------------------------------------------------------------

    def _release(self, state: QueueState) -> None:
        state.behind = False
        gate = self._gates.get(state)
        if gate is not None:
            gate.stuck = False
            gate.release()

    def _stalled(self, state: QueueState, idle_s: float) -> bool:
        """The gate has held publishers a while: keep holding while the consumers settle something;
        once nothing was settled for ``timeout_s``, close them and let the publishers go."""
        gate = self._gates.get(state)
        if gate is None:
            return False
        gate.saw(progress(state))
        idle_s = gate.idle_s()
        if idle_s < self.timeout_s:
            return True
        # Stuck until the queue is no longer behind: its next publishes hold nobody, while the
        # consumers' channels and links close and what they held comes back.
        gate.stuck = True
        gate.release()
        self.stalls += 1
        for group in list(state.groups.values()):
            if type(group) is not WorkGroup or not _read(group):
                continue
            for handle in list(group.consumers):
                if handle.closed:
                    continue
                self.closed += 1
                try:
                    handle.consumer.stalled(idle_s)
                except Exception:
                    log.exception("consumer %s failed to close", handle.consumer.id)
        return False


def _read(group: WorkGroup) -> bool:
    """Some open consumer of ``group`` takes what comes (no routing filter, no selector): its
    backlog is one a consumer is behind on, not what nobody there asked for."""
    return any(h.routing_filter is None and h.selects is None and not h.closed for h in group.consumers)


def progress(state: QueueState) -> int:
    """The queue's settlements so far: it moves while its consumers take something."""
    stats = state.stats
    return stats["acked"] + stats["nacked"] + stats["rejected"]
