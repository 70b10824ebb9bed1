"""What the load generators share: latency percentiles, CPU accounting over the steady window, the
command-line options of a timed run, and the bounded run that prints one JSON object.

Imported as ``common`` (each bench puts this folder on ``sys.path``, as it does for ``brokers``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import brokers


def percentile(sorted_ns: list[int], q: float) -> float | None:
    """The ``q``-th percentile (nearest rank) of sorted nanosecond samples, in milliseconds."""
    if not sorted_ns:
        return None
    k = min(len(sorted_ns) - 1, max(0, round(q / 100 * (len(sorted_ns) - 1))))
    return sorted_ns[k] / 1e6


def latency_ms(sorted_ns: list[int], quantiles: dict[str, float]) -> dict[str, float | None]:
    """``{"p50": ..., ...}`` for the named percentiles, then the max and the mean, in milliseconds."""
    return {
        **{name: percentile(sorted_ns, q) for name, q in quantiles.items()},
        "max": sorted_ns[-1] / 1e6 if sorted_ns else None,
        "mean": round(statistics.fmean(sorted_ns) / 1e6, 3) if sorted_ns else None,
    }


@dataclass(frozen=True, slots=True)
class Mark:
    """One edge of the steady window: the clock, this process's CPU, the watched brokers' CPU and the
    whole host's busy time (all in seconds but ``ns``)."""

    ns: int
    gen: float
    broker: float
    host: float

    @classmethod
    def now(cls, watch: list[int]) -> Mark:
        return cls(
            time.monotonic_ns(),
            time.process_time(),
            brokers.cpu_seconds(watch) if watch else 0.0,
            brokers.host_busy_seconds(),
        )


def window_s(start: Mark, end: Mark) -> float:
    return (end.ns - start.ns) / 1e9


def cpu_fields(start: Mark, end: Mark, watch: list[int]) -> dict[str, Any]:
    """CPU per wall second (1.0 = one core) of this generator, the brokers, and everything else on
    the host (other jobs on a shared machine: above ~0.2 the run was disturbed), plus the brokers'
    RSS now."""
    seconds = window_s(start, end)
    gen, broker = end.gen - start.gen, end.broker - start.broker
    return {
        "gen_cpu": round(gen / seconds, 3),
        "broker_cpu": round(broker / seconds, 3) if watch else None,
        "other_cpu": round(((end.host - start.host) - gen - broker) / seconds, 3),
        "host_cpus": os.cpu_count(),
        "broker_rss_kib": brokers.rss_kib(watch) if watch else None,
    }


def add_timed_run_args(p: argparse.ArgumentParser, *, timeout_slack: int) -> None:
    """The options of a run with a steady window, a bounded drain and a hard timeout."""
    p.add_argument("--duration", type=float, default=10.0, help="seconds of publishing (default 10)")
    p.add_argument("--warmup", type=float, default=2.0, help="seconds excluded from the rates (default 2)")
    p.add_argument("--drain", type=float, default=20.0, help="max seconds to wait for deliveries afterwards")
    p.add_argument("--idle", type=float, default=2.0, help="stop draining after this long with no delivery")
    p.add_argument("--watch-pid", type=int, action="append", default=[], help="broker pid to measure CPU of")
    p.add_argument("--label", help="broker name to put in the result")
    p.add_argument(
        "--timeout", type=float, help=f"hard limit in seconds (default duration + drain + {timeout_slack})"
    )
    p.add_argument("--no-uvloop", action="store_true")


def check_timed_run_args(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.warmup >= args.duration:
        p.error("--warmup must be shorter than --duration")


def print_bounded_run(
    run: Callable[[], Coroutine[Any, Any, dict[str, Any]]],
    args: argparse.Namespace,
    *,
    timeout_slack: int,
    errors: tuple[type[BaseException], ...],
    describe: dict[str, Any],
) -> int:
    """Run ``run()`` on uvloop (unless --no-uvloop or not installed) within the hard timeout and print
    its result as one JSON line; on one of ``errors``, print ``{"error": ..., **describe}`` and
    return 1."""
    timeout = args.timeout or args.duration + args.drain + timeout_slack

    async def bounded() -> dict[str, Any]:
        async with asyncio.timeout(timeout):
            return await run()

    runner: Any = asyncio.run
    if not args.no_uvloop:
        try:
            import uvloop

            runner = uvloop.run
        except ImportError:
            pass
    try:
        result = runner(bounded())
    except errors as exc:
        print(json.dumps({"error": f"{type(exc).__name__}: {exc}", **describe}))
        return 1
    print(json.dumps(result))
    return 0
