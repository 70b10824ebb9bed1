"""The runtime's owner of connections: admission limits, one flush per loop iteration, one deadline
wheel, the task group for hull steps, memory watermarks, and the drain at shutdown.

Listeners are ``asyncio`` servers whose protocol is ``Conn``; the runner is the single place that
knows every open connection, so shutdown can ask each hull to close its protocol's way and wait for
them, and a limit is one check here rather than one per hull.
"""

from __future__ import annotations

import asyncio
import logging
import math
import socket
import ssl
import time
from collections import deque
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, cast

import anyio
from anyio.abc import TaskGroup, TaskStatus

from trimaran.config import LISTEN_BACKLOG
from trimaran.runtime import transport
from trimaran.runtime.deadlines import Deadlines
from trimaran.runtime.flow import Held
from trimaran.runtime.limits import RuntimeLimits, RuntimeStats
from trimaran.runtime.memory import Memory
from trimaran.runtime.poller import Poller, available
from trimaran.runtime.transport import GONE, Conn, HullFactory, Listening
from trimaran.tenant_limits import RATE, TenantLimits
from trimaran.traffic import Traffic
from trimaran.vhosts import DEFAULT_VHOST

log = logging.getLogger(__name__)


class _Bucket:
    """A token bucket: ``rate`` connections a second, ``burst`` at once."""

    __slots__ = ("at", "tokens")

    def __init__(self, tokens: float, at: float) -> None:
        self.tokens = tokens
        self.at = at


class Connections:
    """The runner's open connections: a list in which each holds its index (``Conn.slot``), as a
    set's table would cost every connection some 65 bytes and this 16 (issue #47)."""

    __slots__ = ("_all",)

    def __init__(self) -> None:
        self._all: list[Conn] = []

    def add(self, conn: Conn) -> None:
        if conn.slot < 0:
            conn.slot = len(self._all)
            self._all.append(conn)

    def discard(self, conn: Conn) -> None:
        at = conn.slot
        if at < 0:
            return
        last = self._all.pop()  # the last one takes its place
        if last is not conn:
            self._all[at] = last
            last.slot = at
        conn.slot = -1

    def __contains__(self, conn: Conn) -> bool:
        return conn.slot >= 0  # (a connection belongs to one runner)

    def __len__(self) -> int:
        return len(self._all)

    def __bool__(self) -> bool:
        return bool(self._all)

    def __iter__(self) -> Iterator[Conn]:
        return iter(self._all)


class Runner(transport.Runner):
    def __init__(self, limits: RuntimeLimits | None = None, tenants: TenantLimits | None = None) -> None:
        self.limits = limits or RuntimeLimits()
        self.tenants = tenants or TenantLimits()
        self.tenants.on_change = self.retune
        self.stats = RuntimeStats()
        self.traffic = Traffic()  # the broker's Stats, in a server (app.py)
        self.read_at_ms = time.time_ns() // 1_000_000
        self.conns = Connections()
        self.memory = Memory(
            self.limits.memory_high_watermark, self.limits.memory_low_watermark, self._publishers
        )
        self._per_address: dict[str, int] = {}
        # What the closed connections of each vhost but / moved: [messages in, out, bytes in, out].
        self._gone_traffic: dict[str, list[int]] = {}
        self._buckets: dict[str, _Bucket] = {}
        # limits.accept_rate: each listener's bucket, and the connections waiting their turn there
        self._turns: dict[str, _Bucket] = {}
        self._waiting: dict[str, deque[Conn]] = {}
        self._waiting_count = 0
        self._release_timer: asyncio.TimerHandle | None = None
        self._dirty: list[Conn] = []
        self._turn_end_scheduled = False
        self.read_work: list[Callable[[], None]] = []  # see after_read
        self._deadlines = Deadlines()
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = math.inf
        self._tasks: TaskGroup | None = None
        self._jobs: list[Callable[[], Coroutine[Any, Any, None]]] = []
        self._jobs_ready: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._empty: anyio.Event | None = None
        self._servers: list[asyncio.Server] = []  # TLS listeners (and any, where there is no epoll)
        self._poller: Poller | None = None  # plain TCP listeners and their connections
        # Whose frames are being acted on: a connection, or a bridge's remote (a gate holds it).
        self.current: Held | None = None

    # -- lifecycle -----------------------------------------------------------------------------------

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Own the task group that hull steps and connection clean-ups run in, until cancelled."""
        self._loop = asyncio.get_running_loop()
        self._jobs_ready = asyncio.Event()
        try:
            async with anyio.create_task_group() as tasks:
                self._tasks = tasks
                task_status.started()
                # Protocol callbacks run outside any task, where anyio cannot start one: they queue
                # their jobs, and this task starts them (one wake-up per batch, off the hot path).
                while True:
                    await self._jobs_ready.wait()
                    self._jobs_ready.clear()
                    jobs, self._jobs = self._jobs, []
                    for job in jobs:
                        tasks.start_soon(job)
        finally:
            self._tasks = None
            for server in self._servers:
                server.close()
            for conn in [*self.conns, *self._take_waiting()]:
                conn.abort()
            if self._poller is not None:
                self._poller.close()
                self._poller = None

    async def serve(
        self,
        name: str,
        host: str,
        port: int,
        factory: HullFactory,
        *,
        tls: ssl.SSLContext | None = None,
        backlog: int = LISTEN_BACKLOG,
    ) -> list[tuple[str, int]]:
        """Listen on ``host:port`` (every address it resolves to); returns the bound addresses."""
        loop = asyncio.get_running_loop()
        self._loop = loop
        sockets: list[socket.socket]

        listening = Listening(name, factory)

        def make() -> Conn:
            return Conn(self, listening)

        if available():
            if self._poller is None:
                self._poller = Poller(loop, nodelay=self.limits.tcp_nodelay, turns=self)
            sockets = self._poller.listen(host, port, backlog, make, tls)
        else:
            server = await loop.create_server(
                cast(Callable[[], asyncio.BaseProtocol], make),  # (a protocol by its methods: Conn)
                host=host,
                port=port,
                backlog=backlog,
                ssl=tls,
                ssl_handshake_timeout=self.limits.handshake_timeout_s if tls is not None else None,
                reuse_address=True,
            )
            self._servers.append(server)
            # uvloop's Server.sockets is a list, asyncio's (and typeshed's) a tuple: read untyped,
            # or the compiled module would insist on the tuple.
            sockets = list(cast(Any, server).sockets)
        bound: list[tuple[str, int]] = []
        for sock in sockets:
            address = sock.getsockname()
            bound.append((str(address[0]), int(address[1])))
        return bound

    def stop_accepting(self) -> None:
        for server in self._servers:
            server.close()
        if self._poller is not None:
            self._poller.stop_accepting()

    async def shutdown(self) -> None:
        """Ask every hull to close its protocol's way, and wait until every connection is gone."""
        self.stop_accepting()
        for waiting in self._take_waiting():
            waiting.abort()  # never started: nothing of its protocol to close
        for conn in list(self.conns):
            if conn.hull is None:
                conn.abort()
                continue
            conn.stop_waiting()
            try:
                conn.hull.shutdown()
            except Exception as exc:
                conn.crash(exc)
                continue
            conn.pump()
        if self.conns:
            self._empty = anyio.Event()
            await self._empty.wait()

    # -- admission -----------------------------------------------------------------------------------

    def admit(self, conn: Conn) -> str | None:
        """None to let the connection in, or why not (counted)."""
        limits = self.limits
        host = conn.peer_host
        reason = None
        if len(self.conns) + self._waiting_count >= limits.max_connections:
            reason = "max_connections"
        elif limits.max_connections_per_address and (
            self._per_address.get(host, 0) >= limits.max_connections_per_address
        ):
            reason = "max_connections_per_address"
        elif limits.accept_rate_per_address > 0 and not self._take_token(host):
            reason = "accept_rate_per_address"
        if reason is not None:
            self.stats.refuse(reason)
        return reason

    def _take_token(self, host: str) -> bool:
        limits = self.limits
        now = time.monotonic()
        bucket = self._buckets.get(host)
        if bucket is None:
            if len(self._buckets) > 10_000:
                self._forget_full_buckets(now)
            bucket = self._buckets[host] = _Bucket(limits.accept_burst_per_address, now)
        return _spend(bucket, now, limits.accept_rate_per_address, limits.accept_burst_per_address)

    def take_turn(self, conn: Conn) -> bool:
        """``limits.accept_rate``: True when ``conn`` may start now; False when it waits, unread,
        behind the connections its listener took before it, until the rate lets it in
        (:meth:`_release` then calls ``conn.admitted()``). A storm is taken at the rate, in order,
        and none of it is reset for coming too fast (the per-address rate refuses)."""
        limits = self.limits
        if limits.accept_rate <= 0:
            return True
        name = conn.listener
        bucket = self._turns.get(name)
        if bucket is None:
            bucket = self._turns[name] = _Bucket(limits.accept_burst, time.monotonic())
        waiting = self._waiting.get(name)
        if not waiting and _spend(bucket, time.monotonic(), limits.accept_rate, limits.accept_burst):
            return True
        if waiting is None:
            waiting = self._waiting[name] = deque()
        if not waiting:
            log.info("%s: over %g new connections a second: they wait their turn", name, limits.accept_rate)
        waiting.append(conn)
        self._waiting_count += 1
        self.stats.waited += 1
        if self._release_timer is None:
            self._release_timer = self.loop().call_later(1 / limits.accept_rate, self._release)
        return False

    def _release(self) -> None:
        """Let in, in order, the waiting connections the listeners' rates allow now."""
        self._release_timer = None
        limits = self.limits
        now = time.monotonic()
        for name, waiting in self._waiting.items():
            bucket = self._turns[name]
            while waiting:
                conn = waiting[0]
                if conn.state != GONE and not _spend(bucket, now, limits.accept_rate, limits.accept_burst):
                    break
                waiting.popleft()
                self._waiting_count -= 1
                if conn.state != GONE:  # (one that went while it waited takes no turn)
                    conn.admitted()
            if not waiting:
                log.info("%s: every waiting connection is in", name)
        if self._waiting_count:
            self._release_timer = self.loop().call_later(1 / limits.accept_rate, self._release)

    def _take_waiting(self) -> list[Conn]:
        """Every connection waiting its turn, no longer waiting (shutdown)."""
        gone = [conn for waiting in self._waiting.values() for conn in waiting]
        self._waiting.clear()
        self._waiting_count = 0
        if self._release_timer is not None:
            self._release_timer.cancel()
            self._release_timer = None
        return gone

    def _forget_full_buckets(self, now: float) -> None:
        limits = self.limits
        burst = limits.accept_burst_per_address
        for host, bucket in list(self._buckets.items()):
            if bucket.tokens + (now - bucket.at) * limits.accept_rate_per_address >= burst:
                del self._buckets[host]

    def opened(self, conn: Conn) -> None:
        self.conns.add(conn)
        self.stats.accepted += 1
        host = conn.peer_host
        self._per_address[host] = self._per_address.get(host, 0) + 1
        self.watch_deadline(conn)

    def enter(self, conn: Conn, user: str | None, vhost: str) -> str | None:
        """A hull's login of ``user`` into ``vhost`` on ``conn``: None when the vhost's and the
        user's connection limits let it in (it then counts until the connection goes, and its user's
        rate applies), else why not, for the hull to refuse its protocol's way."""
        if conn.entered:
            return None
        refusal = self.tenants.enter(user, vhost)
        if refusal is None:
            conn.entered = True
            conn.user, conn.vhost = user, vhost
            conn.rate = self.tenants.rate(user, time.monotonic())
        return refusal

    def retune(self) -> None:
        """The limits changed at run time: every connection that entered takes its user's rate."""
        now = time.monotonic()
        for conn in self.conns:
            if conn.entered:
                conn.rate = self.tenants.rate(conn.user, now)

    def throttled(self, conn: Conn) -> None:
        """``conn``'s user is over its rate: it is not read for a while (counted, said once)."""
        user = conn.user or ""
        self.tenants.bit(RATE, conn.vhost, user, "over its publish rate: reading its connections paused")

    def closed(self, conn: Conn) -> None:
        if conn not in self.conns:
            return
        self.conns.discard(conn)
        if conn.entered:
            self.tenants.leave(conn.user, conn.vhost)
        self._deadlines.closed(conn)  # (its entry would stay until its keep-alive passes)
        self.memory.changed(conn, 0)
        if conn.vhost != DEFAULT_VHOST:
            gone = self._gone_traffic.setdefault(conn.vhost, [0, 0, 0, 0])
            for i, value in enumerate(_moved(conn)):
                gone[i] += value
        host = conn.peer_host
        left = self._per_address.get(host, 1) - 1
        if left:
            self._per_address[host] = left
        else:
            self._per_address.pop(host, None)
        if self._empty is not None and not self.conns:
            self._empty.set()

    def traffic_by_vhost(self) -> dict[str, list[int]]:
        """Each vhost's (but /'s) ``[messages in, out, bytes in, out]`` since the start: its open
        connections' own counters plus those of the closed ones (a tenant's $SYS figures)."""
        totals = {vhost: list(moved) for vhost, moved in self._gone_traffic.items()}
        for conn in self.conns:
            if conn.vhost != DEFAULT_VHOST:
                total = totals.setdefault(conn.vhost, [0, 0, 0, 0])
                for i, value in enumerate(_moved(conn)):
                    total[i] += value
        return totals

    def forget_vhost(self, vhost: str) -> None:
        """A deleted vhost's figures go (one made again under its name starts from nothing)."""
        self._gone_traffic.pop(vhost, None)

    # -- writes: one flush per loop iteration --------------------------------------------------------

    def loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        return self._loop

    def mark_dirty(self, conn: Conn) -> None:
        if conn.dirty:
            return
        conn.dirty = True
        self._dirty.append(conn)
        if not self._turn_end_scheduled:
            self.end_turn_soon()

    def after_read(self, work: Callable[[], None]) -> None:
        """Run ``work`` at the end of the read being acted on (``Conn.data_received`` calls
        :meth:`run_read_work`), else at the end of this turn of the loop; before the turn's flush
        either way, so what it delivers leaves in the turn's writes. The queues' end of a turn (the
        journal's submission, the deliveries it made due, the flow control's look at the backlog)
        so comes after each read: a queue past its mark holds its publishers from the next read on."""
        self.read_work.append(work)
        if not self._turn_end_scheduled:
            self.end_turn_soon()

    def run_read_work(self) -> None:
        while self.read_work:  # work that asks for more runs in the same end
            jobs, self.read_work = self.read_work, []
            for job in jobs:
                try:
                    job()
                except Exception:  # not a connection's fault: they all stay open
                    log.exception("work at the end of a turn failed")

    def end_turn_soon(self) -> None:
        """Schedule the turn's end: by the first read or wake of a turn outside the poller's
        callback, or by the poller when reads are still to come this turn. Under uvloop it runs
        once every ready socket has been read, before the loop polls again (no extra poll): the
        reads of a turn share one write to each connection they fed."""
        self._turn_end_scheduled = True
        loop = self._loop or asyncio.get_running_loop()
        loop.call_soon(self.end_turn)

    def turn_begins(self) -> bool:
        """A callback that ends the turn itself begins: the poller, which calls :meth:`end_turn`
        once it has read every ready socket, saving a scheduled callback a wake-up. False: one is
        scheduled already, and ends the turn."""
        if self._turn_end_scheduled:
            return False
        self._turn_end_scheduled = True
        return True

    def end_turn(self) -> None:
        """The turn's reads are done: run what waited for its end, then write every dirty
        connection once."""
        if self.read_work:
            self.run_read_work()
        # A flush can make other connections dirty (a hull acting on late events); they are
        # written at the end of the next turn, not this one.
        self._turn_end_scheduled = False
        if not self._dirty:
            return
        dirty, self._dirty = self._dirty, []
        for conn in dirty:
            conn.flush()

    # -- deadlines: one wheel, one timer -----------------------------------------------------------

    def watch_deadline(self, conn: Conn) -> None:
        """Make sure ``conn``'s next deadline is held (``deadlines.py``: in steps of up to an eighth
        of its wait). A later deadline (a keep-alive pushed forward by traffic) needs no new
        entry: the due entry looks again before acting."""
        deadline = conn.next_deadline()
        if deadline is None or conn.scheduled <= deadline:
            return  # (every flush asks: no clock read here)
        deadlines = self._deadlines
        if deadlines.crowded(len(self.conns)):
            deadlines.compact()  # mostly deadlines that moved earlier
        at = deadlines.hold(conn, deadline, time.monotonic())
        if at < self._timer_at:
            self._arm(at)

    def _arm(self, at: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        loop = self._loop or asyncio.get_running_loop()
        self._timer_at = at
        # Timers coarser than 1 ms busy-loop under uvloop; deadlines here are seconds apart anyway.
        self._timer = loop.call_at(max(at, loop.time() + 0.001), self._fire)

    def _fire(self) -> None:
        self._timer = None
        self._timer_at = math.inf
        now = time.monotonic()
        for conn in self._deadlines.due(now):
            deadline = conn.next_deadline()
            if deadline is not None and deadline <= now:
                conn.tick(now)
            # A deadline still due (the close it caused is under way) is looked at in the next round.
            self.watch_deadline(conn)
        at = self._deadlines.next_at()
        if at < self._timer_at:
            self._arm(at)

    # -- tasks ---------------------------------------------------------------------------------------

    def spawn(self, job: Callable[[], Coroutine[Any, Any, object]], conn: Conn) -> None:
        """Run a hull's coroutine in the runtime's task group; an error closes its connection only."""

        async def guarded() -> None:
            try:
                await job()
            except Exception as exc:
                conn.crash(exc)

        if self._tasks is None or self._jobs_ready is None:
            log.debug("runtime not running; dropped a task of %s", conn.peer)
            return
        self._jobs.append(guarded)
        self._jobs_ready.set()

    # -- memory ----------------------------------------------------------------------------------------

    def memory_changed(self, conn: Conn) -> None:
        self.memory.changed(conn, conn.backlog())

    def alarm(self, why: str, on: bool) -> None:
        """An alarm from outside the runtime (``memory.DISK``) is raised or cleared: publishers are
        paused while it lasts, as at the memory watermark."""
        self.memory.alarm(why, on)

    def _publishers(self) -> list[Conn]:
        return [conn for conn in self.conns if conn.publisher]


def _spend(bucket: _Bucket, now: float, rate: float, burst: int) -> bool:
    """Take a token of ``bucket`` (``rate`` a second, at most ``burst`` kept) if it has one."""
    bucket.tokens = min(burst, bucket.tokens + (now - bucket.at) * rate)
    bucket.at = now
    if bucket.tokens < 1:
        return False
    bucket.tokens -= 1
    return True


def _moved(conn: Conn) -> tuple[int, int, int, int]:
    return conn.messages_in, conn.messages_out, conn.bytes_in, conn.bytes_out
