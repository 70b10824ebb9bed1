"""Does compiling the hot modules pay? The server's CPU time per message, interpreted against compiled.

No wall clock: each variant runs the real server in-process (tests/support/budget.py, without the
call counter) under the per-message budgets' closed-loop loads (tests/support/budget_load.py), and
reads the CPU time the server's threads spent (their own CPU clocks, so the load generator in the
main thread is not counted) over a fixed number of messages. The two variants are separate
processes, the same source tree, one with ``TRIMARAN_INTERPRETED=1`` (trimaran/compiled.py), run in
alternating order ``--rounds`` times; the table gives each path's median and the saving.

    make compile && python bench/compiled_cost.py [--rounds 5] [--messages 20000]

CPU time moves far less than throughput with what else runs on the host, but a busy host still
moves it some: alternate, take medians, and read a difference under a few percent as none.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PATHS = (
    "mqtt qos0 fan-in 4->1",
    "mqtt qos1 fan-in 4->1",
    "amqp091 transient",
    "amqp091 transient no-ack",
    "amqp1 transfer-deliver-accept",
    "amqp091 durable, ack multiple",
    "mqtt $queue/ qos1",
)
WARM_UP_ROUNDS = 5


def _server_cpu() -> float:
    """CPU seconds of every thread but this one (the server's loop, writer and workers)."""
    me = threading.get_ident()
    total = 0.0
    for thread in threading.enumerate():
        if thread.ident is not None and thread.ident != me:
            with contextlib.suppress(OSError):  # ended meanwhile
                total += time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
    return total


def child(messages: int) -> None:
    """One variant (whichever this process imports): µs of server CPU a message, per path, as JSON."""
    sys.path.insert(0, str(ROOT))
    from tests.support.budget import InProcessServer
    from tests.test_budgets import PATHS as BUDGET_PATHS
    from trimaran.compiled import describe

    out: dict[str, float] = {"build": describe()}  # type: ignore[dict-item]
    with tempfile.TemporaryDirectory() as tmp:
        server = InProcessServer(Path(tmp))
        # No call counting here: each new server thread drops the profile hook at its first event.
        server.counter.bootstrap = lambda *_: sys.setprofile(None)  # type: ignore[method-assign]
        server.start()
        try:
            for path in (p for p in BUDGET_PATHS if p.name in PATHS):
                load = path.load(server)
                try:
                    for _ in range(WARM_UP_ROUNDS):
                        load.round()
                    rounds = max(1, messages // load.messages_per_round())
                    before = _server_cpu()
                    for _ in range(rounds):
                        load.round()
                    spent = _server_cpu() - before
                finally:
                    load.close()
                out[path.name] = spent / (rounds * load.messages_per_round()) * 1e6
        finally:
            server.stop()
    print(json.dumps(out))


def run_variant(interpreted: bool, messages: int) -> dict[str, float]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("TRIMARAN_INTERPRETED", None)
    if interpreted:
        env["TRIMARAN_INTERPRETED"] = "1"
    command = [sys.executable, __file__, "--child", "--messages", str(messages)]
    done = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True, timeout=600, check=True)
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="pairs of runs, in alternating order")
    parser.add_argument("--messages", type=int, default=20000, help="messages a path, a run")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.messages)
        return
    runs: dict[bool, list[dict[str, float]]] = {True: [], False: []}
    for i in range(args.rounds):
        for interpreted in (True, False) if i % 2 == 0 else (False, True):
            got = run_variant(interpreted, args.messages)
            if not interpreted and got["build"] != "compiled (mypyc)":
                sys.exit(f"the build does not run: {got['build']}")
            runs[interpreted].append(got)
            print(f"round {i + 1} {got.pop('build')}: " + ", ".join(f"{k} {v:.1f}" for k, v in got.items()))
    print(f"\nserver CPU µs a message, median of {args.rounds} (interpreted / compiled / saving):")
    for name in PATHS:
        pure = statistics.median(r[name] for r in runs[True])
        native = statistics.median(r[name] for r in runs[False])
        print(f"  {name:32} {pure:7.1f} {native:7.1f}  {(1 - native / pure) * 100:5.1f}%")


if __name__ == "__main__":
    main()
