"""A publisher and a flow-control gate (``runtime/flow.py``'s ``Gate``) as the owners of gates see
them, without a loop: the queues' and the cluster node's tests hold and release publishers through
this one, and say themselves how long it has seen no progress."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol


class Publisher:
    """A connection (or link) as a gate holds it: how many gates hold it now."""

    def __init__(self) -> None:
        self.holds = 0

    def held(self, on: bool) -> None:
        self.holds += 1 if on else -1


class Runner:
    """The runtime's runner as a gate sees it: the publisher acted on (the test sets it), its loop."""

    def __init__(self) -> None:
        self.current: Publisher | None = None

    def loop(self) -> asyncio.AbstractEventLoop:
        return asyncio.get_running_loop()


class Held(Protocol):
    """What a gate holds (``flow.Held``)."""

    def held(self, on: bool) -> None: ...


class Acted(Protocol):
    """The runner as a gate sees it: the publisher whose frames are being acted on."""

    @property
    def current(self) -> Held | None: ...


class FakeGate:
    """Holds the publisher it is given, or else the runner's current one (``runner``); ``check``
    is the gate's timer: ``idle`` more seconds without progress, and what the owner answers."""

    def __init__(self, stalled: Callable[[float], bool], runner: Acted | None = None) -> None:
        self.stalled = stalled
        self.runner = runner
        self.stuck = False
        self.held: set[Held] = set()
        self.began = 0  # times it began holding
        self.mark = 0
        self.idle = 0.0

    @property
    def holding(self) -> bool:
        return bool(self.held)

    def hold(self, source: Held | None = None) -> None:
        if source is None and self.runner is not None:
            source = self.runner.current
        if source is None or self.stuck or source in self.held:
            return
        if not self.held:
            self.began += 1
        self.held.add(source)
        source.held(True)

    def saw(self, mark: int) -> None:
        if mark != self.mark:
            self.mark = mark
            self.idle = 0.0

    def idle_s(self) -> float:
        return self.idle

    def release(self) -> None:
        held, self.held = self.held, set()
        for source in held:
            source.held(False)

    def check(self, idle: float) -> bool:
        self.idle += idle
        return self.stalled(self.idle)
