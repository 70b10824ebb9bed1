"""The load generators' library (the same for every generator of the manual's numbers).

Shared plumbing for the load generators: worker processes, the shared
clock, CPU/RSS sampling from /proc, percentiles and the JSON output.

No third-party imports except uvloop (optional).  Linux only (/proc).

Timeline of one run (all times are CLOCK_MONOTONIC, shared by processes):

    workers connect  -> 'ready'            (coordinator waits for all)
    T0               -> load starts        (publishers begin sending)
    TWS = T0+warmup  -> window start       (every process snapshots counters + CPU)
    TWE = TWS+dur    -> window end         (snapshot again; publishers stop)
    drain            -> receivers wait until they have everything or go idle
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing as mp
import os
import queue as _queue
import resource
import statistics
import sys
import time
import traceback

CLK_TCK = os.sysconf("SC_CLK_TCK")

# indexes into the shared double array
T0, TWS, TWE, TSTOP, EXPECT, ABORT = range(6)
NSHARED = 8


# --------------------------------------------------------------------------- /proc helpers
def proc_cpu_seconds(pid: int, tree: bool = True) -> float:
    """utime+stime of pid (all its threads) and, if tree, of all its descendants."""
    pids = [pid]
    if tree:
        kids: dict[int, list[int]] = {}
        for d in os.listdir("/proc"):
            if not d.isdigit():
                continue
            try:
                with open(f"/proc/{d}/stat", "rb") as f:
                    s = f.read()
                ppid = int(s[s.rindex(b")") + 2 :].split()[1])
                kids.setdefault(ppid, []).append(int(d))
            except (OSError, ValueError):
                pass
        todo = [pid]
        while todo:
            p = todo.pop()
            for c in kids.get(p, ()):
                pids.append(c)
                todo.append(c)
    total = 0
    for p in pids:
        try:
            with open(f"/proc/{p}/stat", "rb") as f:
                s = f.read()
            fields = s[s.rindex(b")") + 2 :].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime
        except (OSError, ValueError, IndexError):
            pass
    return total / CLK_TCK


def proc_status_kb(pid: int, key: str = "VmRSS") -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def tree_rss_kb(pid: int) -> int | None:
    """VmRSS of pid plus its descendants (RabbitMQ: beam.smp + helpers)."""
    base = proc_status_kb(pid)
    if base is None:
        return None
    total = base
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == pid:
            continue
        try:
            with open(f"/proc/{d}/stat", "rb") as f:
                s = f.read()
            ppid = int(s[s.rindex(b")") + 2 :].split()[1])
        except (OSError, ValueError):
            continue
        if ppid == pid:
            total += tree_rss_kb(int(d)) or 0
    return total


def cpu_times_all() -> dict[str, tuple[int, int, int]]:
    """Per-cpu (busy, idle, steal, irq+softirq) jiffies from /proc/stat."""
    out = {}
    with open("/proc/stat") as f:
        for line in f:
            if not line.startswith("cpu") or line.startswith("cpu "):
                continue
            p = line.split()
            v = [int(x) for x in p[1:]]
            idle = v[3] + v[4]
            steal = v[7] if len(v) > 7 else 0
            busy = sum(v[:8]) - idle - steal
            out[p[0]] = (busy, idle, steal, v[5] + v[6])  # irq + softirq are part of busy
    return out


def all_proc_cpu() -> dict[int, tuple[str, int, float]]:
    """pid -> (comm, ppid, utime+stime seconds) for every process."""
    out = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat", "rb") as f:
                s = f.read()
            r = s.rindex(b")")
            comm = s[s.index(b"(") + 1 : r].decode(errors="replace")
            fields = s[r + 2 :].split()
            out[int(d)] = (comm, int(fields[1]), (int(fields[11]) + int(fields[12])) / CLK_TCK)
        except (OSError, ValueError, IndexError):
            pass
    return out


def descendants(snap: dict, roots) -> set[int]:
    kids: dict[int, list[int]] = {}
    for pid, (_, ppid, _) in snap.items():
        kids.setdefault(ppid, []).append(pid)
    seen = set()
    todo = [r for r in roots if r]
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        todo.extend(kids.get(p, ()))
    return seen


def top_other(a: dict, b: dict, mine: set[int], dt: float, min_pct=2.0, n=4):
    """Processes not in `mine` that used >= min_pct of a core between snapshots a and b."""
    rows = []
    for pid, (comm, _, cpu) in b.items():
        if pid in mine:
            continue
        pct = 100.0 * (cpu - a[pid][2]) / dt if pid in a else 0.0
        if pct >= min_pct:
            rows.append((round(pct, 1), comm, pid))
    rows.sort(reverse=True)
    return [[c, p, pct] for pct, c, p in rows[:n]]


def wait_quiet(threshold_pct: float, max_wait: float, sample_s: float = 1.0) -> float:
    """Wait (up to max_wait s) until total busy CPU, in % of one core, is below threshold
    over a sample_s interval.  Returns the last measurement."""
    deadline = time.monotonic() + max_wait
    while True:
        a = cpu_times_all()
        time.sleep(sample_s)
        b = cpu_times_all()
        busy = sum(b[k][0] - a[k][0] for k in b)
        tot = sum(sum(b[k][:3]) - sum(a[k][:3]) for k in b)
        pct = 100.0 * busy / tot * len(b) if tot else 0.0
        if pct < threshold_pct or time.monotonic() >= deadline:
            return round(pct, 1)


def cpu_busy_pct(a, b) -> dict[str, float]:
    out = {}
    for k in b:
        if k not in a:
            continue
        db = b[k][0] - a[k][0]
        di = b[k][1] - a[k][1]
        ds = b[k][2] - a[k][2]
        tot = db + di + ds
        out[k + "_busy_pct"] = round(100.0 * db / tot, 1) if tot else 0.0
        dirq = b[k][3] - a[k][3]
        if dirq and tot:
            out[k + "_irq_pct"] = round(100.0 * dirq / tot, 1)
        if ds:
            out[k + "_steal_pct"] = round(100.0 * ds / tot, 1)
    return out


def self_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def find_listener_pid(port: int) -> int | None:
    """PID of the process that has a LISTEN socket on `port` (needs root or same user)."""
    inodes = set()
    for fn in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(fn) as f:
                next(f)
                for line in f:
                    p = line.split()
                    if p[3] == "0A" and int(p[1].rsplit(":", 1)[1], 16) == port:
                        inodes.add(p[9])
        except OSError:
            pass
    if not inodes:
        return None
    targets = {f"socket:[{i}]" for i in inodes}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            for fd in os.listdir(f"/proc/{d}/fd"):
                try:
                    if os.readlink(f"/proc/{d}/fd/{fd}") in targets:
                        return int(d)
                except OSError:
                    pass
        except OSError:
            pass
    return None


def affinity(pid: int = 0):
    try:
        return sorted(os.sched_getaffinity(pid))
    except OSError:
        return None


def percentiles_us(samples_ns: list[int]) -> dict:
    if not samples_ns:
        return {}
    s = sorted(samples_ns)
    n = len(s)

    def q(p):
        return round(s[min(n - 1, int(p * n))] / 1000.0, 1)

    return {
        "lat_n": n,
        "lat_min_us": round(s[0] / 1000.0, 1),
        "lat_p50_us": q(0.50),
        "lat_p90_us": q(0.90),
        "lat_p99_us": q(0.99),
        "lat_p999_us": q(0.999),
        "lat_max_us": round(s[-1] / 1000.0, 1),
        "lat_mean_us": round(sum(s) / n / 1000.0, 1),
    }


# --------------------------------------------------------------------------- worker plumbing
def new_loop():
    try:
        import uvloop  # type: ignore

        loop = uvloop.new_event_loop()
        kind = "uvloop"
    except ImportError:  # pragma: no cover
        loop = asyncio.new_event_loop()
        kind = "asyncio"
    asyncio.set_event_loop(loop)
    return loop, kind


class Sync:
    """Handle a worker uses to talk to the coordinator."""

    def __init__(self, wid, shared, go, resq, progress):
        self.wid = wid
        self.shared = shared
        self.go = go
        self.resq = resq
        self.progress = progress  # RawArray('q', 64): [0:32] publisher slots, [32:64] receiver slots

    def ready(self, **info):
        self.resq.put(("ready", self.wid, info))

    def result(self, **data):
        self.resq.put(("result", self.wid, data))

    async def wait_go(self):
        loop = asyncio.get_running_loop()
        while not await loop.run_in_executor(None, self.go.wait, 1.0):
            if self.shared[ABORT]:
                raise SystemExit("aborted")
        s = self.shared
        return s[T0], s[TWS], s[TWE], s[TSTOP]

    def expected(self) -> float:
        return self.shared[EXPECT]

    def aborted(self) -> bool:
        return bool(self.shared[ABORT])


def at(loop, t_mono: float, fn, *args):
    """Schedule fn at an absolute CLOCK_MONOTONIC time."""
    return loop.call_later(max(0.0, t_mono - time.monotonic()), fn, *args)


class GapMeter:
    """The longest stretch without a delivery inside the window [lo, hi] at one receiver.

    Receivers call mark(now) once per read that delivered anything (not once per message: one
    monotonic read per read batch is what the hot path can afford), so a gap is measured at the
    granularity of the reads; a batch of messages is one instant.  A stretch that starts before lo
    or ends after hi counts only its part inside the window; the window's start counts as a
    delivery (a receiver that gets nothing from lo on has a gap from lo), and finish() counts the
    stretch from the last delivery to hi."""

    __slots__ = ("gap", "hi", "lo", "prev")

    def __init__(self, lo: float, hi: float):
        self.lo, self.hi = lo, hi
        self.prev = lo
        self.gap = 0.0

    def mark(self, now: float) -> None:
        start = self.prev if self.prev > self.lo else self.lo
        end = now if now < self.hi else self.hi
        if end - start > self.gap:
            self.gap = end - start
        self.prev = now

    def finish(self) -> float:
        """The longest gap in seconds, once the window is over."""
        self.mark(self.hi)
        return self.gap


def max_gap(times, lo: float, hi: float) -> float:
    """GapMeter over a sequence of delivery times: the longest gap (s) inside [lo, hi]."""
    meter = GapMeter(lo, hi)
    for t in times:
        meter.mark(t)
    return meter.finish()


class Window:
    """Snapshots a counter function and own CPU at TWS and TWE."""

    def __init__(self, loop, tws, twe, counter):
        self.counter = counter
        self.c0 = self.c1 = None
        self.t0 = self.t1 = None
        self.cpu0 = self.cpu1 = None
        at(loop, tws, self._snap0)
        at(loop, twe, self._snap1)

    def _snap0(self):
        self.t0 = time.monotonic()
        self.c0 = self.counter()
        self.cpu0 = self_cpu()

    def _snap1(self):
        self.t1 = time.monotonic()
        self.c1 = self.counter()
        self.cpu1 = self_cpu()

    def export(self):
        if self.c1 is None or self.c0 is None:
            return {"win_count": 0, "win_s": 0.0, "win_cpu_s": 0.0}
        return {
            "win_count": self.c1 - self.c0,
            "win_s": self.t1 - self.t0,
            "win_cpu_s": self.cpu1 - self.cpu0,
        }


def _worker_entry(fn, wid, cfg, shared, go, resq, progress):
    sync = Sync(wid, shared, go, resq, progress)
    try:
        loop, _ = new_loop()
        loop.run_until_complete(fn(wid, cfg, sync))
    except BaseException as e:  # report and die
        resq.put(("error", wid, f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))
    finally:
        try:
            resq.close()
            resq.join_thread()
        except Exception:
            pass
        os._exit(0)


class Coordinator:
    """Starts worker processes in groups, hands them a common timeline and
    samples broker CPU / per-core busy% over the measurement window.

    ``storage_pid``: a server the broker stores in (PostgreSQL's postmaster; its backends are its
    children), on the broker's core.  Its CPU over the window is ``storage_cpu_pct``; it is the
    broker's cost, not another tenant's, so it is left out of ``other_procs`` / ``other_cpu_pct``
    and ``annotate_foreign`` takes it out of ``foreign_cpu_pct`` before the contamination rule."""

    def __init__(self, broker_pid: int | None, ready_timeout=120.0, storage_pid: int | None = None):
        self.ctx = mp.get_context("fork")
        self.shared = self.ctx.Array("d", NSHARED, lock=False)
        self.go = self.ctx.Event()
        self.resq = self.ctx.Queue()
        self.progress = self.ctx.RawArray("q", 64)
        self.procs = []
        self.broker_pid = broker_pid
        self.storage_pid = storage_pid or None
        self.ready_timeout = ready_timeout
        self.ready_info: dict[str, dict] = {}
        self.results: dict[str, dict] = {}
        self.errors: list[str] = []
        self.samples: dict = {}

    def spawn(self, fn, wids: list[str], cfgs: list[dict]):
        """Start one process per wid and wait until all of them said ready."""
        for wid, cfg in zip(wids, cfgs, strict=True):
            p = self.ctx.Process(
                target=_worker_entry,
                args=(fn, wid, cfg, self.shared, self.go, self.resq, self.progress),
                daemon=True,
            )
            p.start()
            self.procs.append(p)
        pending = set(wids)
        deadline = time.monotonic() + self.ready_timeout
        while pending:
            msg = self._get(deadline)
            if msg is None:
                raise RuntimeError(f"workers not ready: {sorted(pending)}")
            kind, wid, data = msg
            if kind == "ready":
                self.ready_info[wid] = data
                pending.discard(wid)
            elif kind == "error":
                self.errors.append(f"{wid}: {data}")
                raise RuntimeError(f"worker {wid} failed during setup:\n{data}")
            elif kind == "result":
                self.results[wid] = data
                pending.discard(wid)

    def _get(self, deadline):
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            try:
                return self.resq.get(timeout=min(left, 1.0))
            except _queue.Empty:
                if all(not p.is_alive() for p in self.procs) and self.resq.empty():
                    return None

    def start(self, warmup: float, duration: float, lead: float = 0.3):
        t0 = time.monotonic() + lead
        self.shared[T0] = t0
        self.shared[TWS] = t0 + warmup
        self.shared[TWE] = t0 + warmup + duration
        self.shared[TSTOP] = t0 + warmup + duration
        self.go.set()
        return t0

    def sample_window(self):
        """Block until TWE, sampling broker CPU and /proc/stat at TWS and TWE."""
        tws, twe = self.shared[TWS], self.shared[TWE]
        time.sleep(max(0.0, tws - time.monotonic()))
        a_t = time.monotonic()
        a_b = proc_cpu_seconds(self.broker_pid) if self.broker_pid else None
        a_st = proc_cpu_seconds(self.storage_pid) if self.storage_pid else None
        a_s = cpu_times_all()
        a_me = self_cpu()
        a_all = all_proc_cpu()
        time.sleep(max(0.0, twe - time.monotonic()))
        b_t = time.monotonic()
        b_b = proc_cpu_seconds(self.broker_pid) if self.broker_pid else None
        b_st = proc_cpu_seconds(self.storage_pid) if self.storage_pid else None
        b_s = cpu_times_all()
        b_me = self_cpu()
        b_all = all_proc_cpu()
        dt = b_t - a_t
        out = {"window_s": round(dt, 3), "coord_cpu_s": b_me - a_me}
        mine = descendants(b_all, [os.getpid(), self.broker_pid, self.storage_pid])
        out["other_procs"] = top_other(a_all, b_all, mine, dt)
        out["other_cpu_pct"] = round(
            sum(r[2] for r in top_other(a_all, b_all, mine, dt, min_pct=0.5, n=1000)), 1
        )
        if a_b is not None and b_b is not None:
            out["broker_cpu_pct"] = round(100.0 * (b_b - a_b) / dt, 1)
        if a_st is not None and b_st is not None:
            out["storage_cpu_pct"] = round(100.0 * (b_st - a_st) / dt, 1)
        out.update(cpu_busy_pct(a_s, b_s))
        if self.broker_pid:
            out["broker_rss_kb"] = tree_rss_kb(self.broker_pid)
        self.samples = out
        return out

    def set_expected(self, v: float):
        self.shared[EXPECT] = v

    def collect(self, wids: list[str], timeout: float):
        deadline = time.monotonic() + timeout
        pending = set(w for w in wids if w not in self.results)
        while pending:
            msg = self._get(deadline)
            if msg is None:
                self.errors.append(f"no result from {sorted(pending)} within {timeout:.0f}s")
                break
            kind, wid, data = msg
            if kind == "result":
                self.results[wid] = data
                pending.discard(wid)
            elif kind == "error":
                self.errors.append(f"{wid}: {data}")
                pending.discard(wid)
        return {w: self.results.get(w) for w in wids}

    def close(self):
        self.shared[ABORT] = 1
        self.go.set()
        for p in self.procs:
            p.join(timeout=5)
        for p in self.procs:
            if p.is_alive():
                p.terminate()
                p.join(timeout=2)
        self.resq.close()


# --------------------------------------------------------------------------- output
SUMMARY_KEYS = (
    "msgs_per_s_received",
    "msgs_per_s_sent",
    "loss",
    "lat_p50_us",
    "lat_p99_us",
    "lat_p999_us",
    "lat_max_us",
    "broker_cpu_pct",
    "gen_cpu_pct",
    "cpu0_busy_pct",
    "cpu1_busy_pct",
    "connected",
    "connect_s",
    "rss_before_kb",
    "rss_connected_kb",
    "rss_per_conn_kb",
    "rss_after_close_kb",
    "broker_cpu_pct_idle_hold",
    "confirm_rate",
    "other_cpu_pct",
    "foreign_cpu_pct",
    "drain_s",
    "gap_max_ms",
    "storage_cpu_pct",
)


def annotate_foreign(rec: dict, max_foreign_pct: float) -> dict:
    """foreign_cpu_pct = CPU time of both cores during the window that was neither the broker, its
    storage server (``storage_cpu_pct``: PostgreSQL, see Coordinator), the generator nor irq/softirq:
    other tenants, including short-lived processes that a /proc snapshot misses.  Runs above
    max_foreign_pct (if > 0) are marked contaminated."""
    busy = sum(v for k, v in rec.items() if k.startswith("cpu") and k.endswith("_busy_pct"))
    irq = sum(v for k, v in rec.items() if k.startswith("cpu") and k.endswith("_irq_pct"))
    if busy:
        f = busy - irq - (rec.get("broker_cpu_pct") or 0) - (rec.get("gen_cpu_pct") or 0)
        f -= rec.get("storage_cpu_pct") or 0
        rec["foreign_cpu_pct"] = round(max(0.0, f), 1)
        if max_foreign_pct and f > max_foreign_pct:
            rec["contaminated"] = True
    return rec


def run_series(a, one_run):
    """Run until a.runs clean runs (no error, not contaminated) or a.max_attempts attempts.
    one_run(attempt) -> record.  Every record is emitted; the summary uses the clean ones."""
    runs, clean, attempt = [], 0, 0
    max_attempts = a.max_attempts or 3 * a.runs
    while clean < a.runs and attempt < max_attempts:
        attempt += 1
        rec = one_run(attempt)
        annotate_foreign(rec, a.max_foreign_pct)
        emit(rec, a.out)
        runs.append(rec)
        if not rec.get("error") and not rec.get("contaminated"):
            clean += 1
        if clean < a.runs and attempt < max_attempts:
            time.sleep(a.pause)
    emit(summarize(runs), a.out)


def add_series_args(ap):
    ap.add_argument("--runs", type=int, default=3, help="clean runs wanted (median reported)")
    ap.add_argument(
        "--storage-pid",
        type=int,
        default=0,
        help="the server the broker stores in (PostgreSQL's postmaster): its CPU (and its children's) "
        "in the window is reported as storage_cpu_pct and not counted as foreign",
    )
    ap.add_argument(
        "--max-foreign-pct",
        type=float,
        default=0,
        help="discard (and retry) a run if other tenants "
        "used more than this %% of a core during its window (0 = keep every run)",
    )
    ap.add_argument(
        "--max-attempts", type=int, default=0, help="give up after this many attempts (default 3 x runs)"
    )
    ap.add_argument("--pause", type=float, default=2.0, help="seconds between runs")
    ap.add_argument(
        "--quiet-pct",
        type=float,
        default=0,
        help="before each run wait until the whole machine uses "
        "less than this %% of one core (0 = don't wait); see --quiet-wait",
    )
    ap.add_argument("--quiet-wait", type=float, default=120.0, help="max seconds to wait for --quiet-pct")
    ap.add_argument(
        "--before-run",
        default="",
        help="shell command run before every run (e.g. "
        "'./brokers.sh restart amqtt'); the broker PID is looked up again afterwards",
    )
    ap.add_argument("--out", default=None, help="append the JSON lines to this file too")


def summarize(runs: list[dict]) -> dict:
    ok = [r for r in runs if not r.get("error") and not r.get("contaminated")]
    out = {
        "summary": True,
        "runs": len(runs),
        "ok_runs": len(ok),
        "discarded_contaminated": sum(1 for r in runs if r.get("contaminated")),
        "errors": sum(1 for r in runs if r.get("error")),
    }
    if not ok:
        return out
    for k in ("scenario", "label", "params", "gen_affinity", "broker_affinity", "broker_pid"):
        if k in ok[0]:
            out[k] = ok[0][k]
    med, lo, hi = {}, {}, {}
    for k in SUMMARY_KEYS:
        vals = [r[k] for r in ok if isinstance(r.get(k), (int, float))]
        if not vals:
            continue
        med[k] = round(statistics.median(vals), 4)
        lo[k] = round(min(vals), 4)
        hi[k] = round(max(vals), 4)
    out["median"] = med
    out["min"] = lo
    out["max"] = hi
    return out


def emit(obj: dict, out_path: str | None):
    line = json.dumps(obj, sort_keys=False)
    print(line, flush=True)
    if out_path:
        with open(out_path, "a") as f:
            f.write(line + "\n")


def host_info() -> dict:
    return {
        "gen_affinity": affinity(0),
        "python": sys.version.split()[0],
        "ts": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
