"""Counting the interpreter's work per message in a real server, the same on every host.

``InProcessServer`` runs the real ``App`` (all listeners on port 0, SQLite in a temporary
directory) on its own thread and event loop. Every thread the server starts from then on (the loop's,
the storage writer's, anyio's workers) is given a profile function that, while counting is on, adds
up the Python function calls (``call`` events: functions, and coroutines and generators each time
they resume) and the calls into C (``c_call``) it makes. The load comes from raw sockets in the
test's own thread, which is never profiled: only the server's work is counted.

Time plays no part in a count, but the way the kernel cuts a stream into reads, and the size of the
writer's group commits, can move it a little from run to run; the budgets leave a small margin
for that (tests/test_budgets.py).
"""

from __future__ import annotations

import gc
import socket
import sys
import threading
import time
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio

from trimaran.app import App, _backend_options
from trimaran.config import Endpoint, Settings

LOOP_THREAD = "trimaran budget loop"


@dataclass
class ThreadCounts:
    name: str
    python: int = 0
    c: int = 0


@dataclass
class Counts:
    """What the server's threads did between ``start`` and ``stop``."""

    threads: list[ThreadCounts] = field(default_factory=list)

    def loop(self) -> ThreadCounts:
        return next(t for t in self.threads if t.name == LOOP_THREAD)

    def others(self) -> ThreadCounts:
        total = ThreadCounts("others")
        for t in self.threads:
            if t.name != LOOP_THREAD:
                total.python += t.python
                total.c += t.c
        return total


class CallCounter:
    """One profile function per server thread; all of them count only while ``on``."""

    def __init__(self) -> None:
        self.on = False
        self._threads: list[ThreadCounts] = []
        self._lock = threading.Lock()

    def bootstrap(self, frame: types.FrameType, event: str, arg: object) -> None:
        """Installed with ``threading.setprofile``: the first event of each new thread swaps in the
        thread's own counting function, so the hot path touches no shared state but the flag."""
        counts = ThreadCounts(threading.current_thread().name)
        with self._lock:
            self._threads.append(counts)
        sys.setprofile(self._counting(counts))

    def _counting(self, counts: ThreadCounts) -> Callable[[types.FrameType, str, object], None]:
        def profile(frame: types.FrameType, event: str, arg: object) -> None:
            if self.on:
                if event == "call":
                    counts.python += 1
                elif event == "c_call":
                    counts.c += 1

        return profile

    def start(self) -> None:
        with self._lock:
            for t in self._threads:
                t.python = t.c = 0
        self.on = True

    def stop(self) -> Counts:
        self.on = False
        with self._lock:
            return Counts([ThreadCounts(t.name, t.python, t.c) for t in self._threads])


class _Server(App):
    """The real application; signals belong to the test process, not to this thread."""

    async def _watch_signals(self) -> None:
        await anyio.sleep_forever()


class InProcessServer:
    """``timed``: no profile function; instead :meth:`loop_cpu_ns` reads the loop thread's CPU
    clock (the time a message costs there, with the C work a count does not see)."""

    def __init__(self, data_dir: Path, *, timed: bool = False, **overrides: Any) -> None:
        local = Endpoint("127.0.0.1", 0)
        overrides.setdefault("http", {"bind": None})
        settings = Settings(
            listeners={"mqtt": local, "mqtt_ws": None, "amqp": local, **overrides.pop("listeners", {})},
            storage={"data_dir": data_dir, **overrides.pop("storage", {})},
            **overrides,
        )
        self.app = _Server(settings)
        self.counter = CallCounter()
        self._timed = timed
        self._clock: int | None = None  # the loop thread's CPU clock (timed)
        self._thread = threading.Thread(target=self._run, name=LOOP_THREAD, daemon=True)
        self._error: BaseException | None = None

    def _run(self) -> None:
        self._clock = time.pthread_getcpuclockid(threading.get_ident())
        try:
            anyio.run(self.app.run, backend="asyncio", backend_options=_backend_options())
        except BaseException as exc:  # reported by start() or stop()
            self._error = exc

    def start(self) -> InProcessServer:
        self._gc = (gc.get_threshold(), gc.isenabled())
        if not self._timed:
            threading.setprofile(self.counter.bootstrap)
        try:
            self._thread.start()
            deadline = time.monotonic() + 30
            while not self.app.ready:
                if self._error is not None or not self._thread.is_alive():
                    raise RuntimeError(f"server did not start: {self._error!r}")
                if time.monotonic() > deadline:
                    raise RuntimeError("server did not become ready in 30 s")
                time.sleep(0.01)
        finally:
            threading.setprofile(None)  # (the test's own threads stay unprofiled)
        return self

    def loop_cpu_ns(self) -> int:
        """The CPU time the server's loop thread has used so far."""
        assert self._clock is not None, "started"
        return time.clock_gettime_ns(self._clock)

    def port(self, name: str) -> int:
        for listener in self.app.listeners:
            if listener.name == name and listener.bound is not None:
                return listener.bound.port
        raise KeyError(name)

    def stop(self) -> None:
        self.app.request_stop()
        self._thread.join(30)
        # App.run freezes start-up objects and raises the collector's threshold for its process.
        gc.unfreeze()
        gc.set_threshold(*self._gc[0])
        assert not self._thread.is_alive(), "server did not stop in 30 s"
        if self._error is not None:
            raise self._error

    @contextmanager
    def counting(self, into: list[Counts]) -> Iterator[None]:
        self.counter.start()
        try:
            yield
        finally:
            into.append(self.counter.stop())


def connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock
