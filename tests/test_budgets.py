"""The interpreter's work per message on each hot path, budgeted: the guard timing cannot be.

Throughput against C and Erlang peers moves with the host (one machine runs Python at half the speed
of another of the same kind), so a slowdown hides in benchmark noise. The number of Python function
calls and calls into C the server makes per message does not move with the host. Each path below
runs a few thousand messages through the real server in-process (tests/support/budget.py), from
raw-socket clients over loopback (tests/support/budget_load.py), and compares the server's calls
per message with its budget:

- the event loop's thread (protocol machines, hulls, router, queues): budgeted tightly;
- the other threads (the storage writer's group commits, whose size varies with timing): a looser
  budget, as a batch's fixed cost is shared by however many messages it happens to hold.

A change that adds work fails here with the path and the count. A change that removes work lowers
the budget in the same commit (the test says so when a count falls well below its budget), so the
budgets stay at today's counts and the next regression shows.

Run ``python -m tests.test_budgets [PATH-SUBSTRING]`` to print the counts of every path (or of the
paths whose name holds the substring). ``python -m tests.test_budgets --cpu [PATH-SUBSTRING ...]``
prints instead the loop thread's CPU time a message on each path, without counting (compiled or
from the source): what a change saves in allocations and copies that a count does not see.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.budget import Counts, InProcessServer
from tests.support.budget_load import Amqp091Load, Amqp1Load, Load, MqttLoad
from trimaran.compiled import ENV, compiled_modules

# The budgets count interpreted calls: a call inside a module compiled by mypyc never reaches the
# profile function, so under ``make compile`` the counts would fall and say nothing.
COMPILED = compiled_modules()
pytestmark = pytest.mark.skipif(
    bool(COMPILED), reason=f"the hot modules run compiled (make compile); {ENV}=1 counts their calls"
)

WARM_UP_ROUNDS = 5
ROUNDS = 20
# A measured count may exceed its budget by this much (the reads' cuts and the commits' sizes).
LOOP_SLACK = 0.03
OTHERS_SLACK = 0.25
# Below this share of the budget the test asks for the budget to come down.
TIGHT = 0.85


@dataclass(frozen=True)
class Budget:
    """Calls per message: (Python, C) on the loop thread, and on the others together."""

    loop: tuple[float, float]
    others: tuple[float, float] = (0.0, 0.0)


@dataclass(frozen=True)
class Path_:
    name: str
    load: Callable[[InProcessServer], Load]
    budget: Budget


def _mqtt(**kw: int | str) -> Callable[[InProcessServer], Load]:
    return lambda server: MqttLoad(server.port("mqtt"), **kw)  # type: ignore[arg-type]


PATHS = [
    Path_(
        "mqtt qos0 fan-in 4->1",
        _mqtt(publishers=4, subscribers=1, qos=0, topic="bench/t", batch=50),
        # A read's PUBLISHes to one topic are one run, routed once: the count is the read's.
        Budget(loop=(1.0, 0.55)),
    ),
    Path_(
        # No two PUBLISHes in a row share a topic (a fleet's shape): a read's run changes topic, and
        # is routed once a topic.
        "mqtt qos0 fan-in 4->1, alternating topics",
        _mqtt(publishers=4, subscribers=1, qos=0, topic="bench/t", batch=50, topics=2),
        Budget(loop=(1.6, 2.6)),
    ),
    Path_(
        # Each PUBLISH its own message: the path of one with retain or properties.
        "mqtt qos0 fan-in 4->1, a message at a time",
        _mqtt(publishers=4, subscribers=1, qos=0, topic="bench/t", batch=50, alone=True),
        Budget(loop=(30.0, 41.0)),
    ),
    Path_(
        # Paced publishers (a fleet's devices, a few messages a second each): every PUBLISH alone
        # in its turn of the loop, so the turn's fixed work (the machine, the flush of publisher and
        # subscriber, the deadlines) is the message's. Where a turn reads several, they share it.
        # 48 + 27 on uvloop's transports: the poller's wake, read and write are Python here
        # (runtime/poller.py, compiled in the build) where uvloop's were C. 52 + 30 while the
        # publisher was flushed after its read with nothing to write (Hull.quiet). 29 C calls since
        # a read is the bytes os.read makes, whose size is a len() (readv into a shared buffer
        # returned it, and the read was then copied out of the buffer: no call, more work).
        "mqtt qos0 fan-in 50->1, a message a turn",
        _mqtt(
            publishers=50, subscribers=1, qos=0, topic="bench/t", batch=1, topic_filter="bench/#", paced=True
        ),
        Budget(loop=(42.0, 29.0)),
    ),
    Path_(
        "mqtt qos0 fan-out 1->4",
        _mqtt(publishers=1, subscribers=4, qos=0, topic="bench/t", batch=50),
        Budget(loop=(2.1, 1.1)),
    ),
    Path_(
        "mqtt qos1 fan-in 4->1",
        # A read's QoS 1 PUBLISHes to one topic are one run: routed once, acknowledged in one
        # buffer; the subscriber's connection gives each its packet id in its inflight window (the
        # message is its own entry there: 3.1 Python calls when an entry was made around it); the
        # PUBACKs are made of the ids the decoder read (6.8 C calls when each packet was read again).
        _mqtt(publishers=4, subscribers=1, qos=1, topic="bench/t", batch=50),
        Budget(loop=(2.5, 6.5)),
    ),
    Path_(
        # Devices: each publisher subscribed to its own commands, which its QoS 1 publishes are
        # checked against (a client that hears itself gets each message before its PUBACK).
        "mqtt qos1 fan-in 4->1, publishers subscribed",
        _mqtt(publishers=4, subscribers=1, qos=1, topic="bench/t", batch=50, commands=True),
        Budget(loop=(2.5, 6.5)),
    ),
    Path_(
        "mqtt qos1 fan-in 4->1, alternating topics",
        _mqtt(publishers=4, subscribers=1, qos=1, topic="bench/t", batch=50, topics=16),
        Budget(loop=(4.0, 10.5)),
    ),
    Path_(
        # The fan-in generator's case: a subscriber slower than its publishers, most deliveries
        # queued behind its window, cut at their packet id (8.3 + 22.2 when a 5.0 subscriber's were
        # encoded again as the window made room).
        "mqtt qos1 fan-in 4->1, window 10",
        _mqtt(publishers=4, subscribers=1, qos=1, topic="bench/t", batch=50, receive_maximum=10),
        Budget(loop=(6.0, 18.5)),
    ),
    Path_(
        "mqtt qos1 fan-out 1->4",
        # The run's packets are cut once for the four (30.4 C calls when each cut them again), and
        # each takes one copy of the run with its packet ids written in.
        _mqtt(publishers=1, subscribers=4, qos=1, topic="bench/t", batch=50),
        Budget(loop=(8.5, 21.0)),
    ),
    Path_(
        "mqtt $queue/ qos1",
        _mqtt(publishers=1, subscribers=1, qos=1, topic="$queue/budget", batch=100),
        Budget(loop=(78.0, 123.5), others=(4.5, 2.0)),
    ),
    Path_(
        # A read's publishes to one queue are one run (ContentRun): asked the way once, built from
        # their properties once, handed to the queue's consumers together.
        "amqp091 transient",
        lambda s: Amqp091Load(s.port("amqp"), durable=False, batch=100),
        Budget(loop=(32.0, 51.0), others=(0.5, 0.5)),
    ),
    Path_(
        # The benchmark's transient row: a no-ack consumer without a prefetch limit.
        "amqp091 transient no-ack",
        lambda s: Amqp091Load(s.port("amqp"), durable=False, batch=100, no_ack=True),
        Budget(loop=(9.0, 27.5), others=(0.5, 0.5)),
    ),
    Path_(
        # The benchmark's amqp091-transient-keys row: through a topic exchange, 16 routing keys in turn.
        "amqp091 transient no-ack, 16 routing keys",
        # Each connection keeps its routes by key: the exchange and the rules are asked once a key.
        # No two publishes in a row share a key: no runs (asking costs a call a message).
        lambda s: Amqp091Load(s.port("amqp"), durable=False, batch=100, no_ack=True, keys=16),
        Budget(loop=(22.5, 35.5), others=(0.5, 0.5)),
    ),
    Path_(
        "amqp091 durable",
        lambda s: Amqp091Load(s.port("amqp"), durable=True, batch=100),
        Budget(loop=(75.0, 69.5), others=(5.0, 4.0)),
    ),
    Path_(
        # The benchmark's durable row: the consumer acks a hundred deliveries at a time.
        "amqp091 durable, ack multiple",
        lambda s: Amqp091Load(s.port("amqp"), durable=True, batch=100, ack_every=100),
        Budget(loop=(56.0, 58.5), others=(5.0, 4.0)),
    ),
    Path_(
        "amqp1 transfer-deliver-accept",
        lambda s: Amqp1Load(s.port("amqp"), batch=100),
        Budget(loop=(30.5, 29.0)),
    ),
    Path_(
        # The benchmark's amqp1-settled row: pre-settled both ways, as "amqp091 transient no-ack".
        "amqp1 settled",
        lambda s: Amqp1Load(s.port("amqp"), batch=100, settled=True),
        Budget(loop=(22.0, 19.5)),
    ),
    Path_(
        "amqp1 durable",
        lambda s: Amqp1Load(s.port("amqp"), batch=100, durable=True),
        Budget(loop=(51.0, 39.5), others=(7.0, 4.5)),
    ),
    Path_(
        "amqp1 proton-c send/receive",
        lambda s: Amqp1Load(s.port("amqp"), batch=100, like_proton_c=True),
        Budget(loop=(32.5, 31.5)),
    ),
]


@dataclass
class Measured:
    path: str
    messages: int
    counts: Counts

    def per_message(self) -> tuple[float, float, float, float]:
        loop, others = self.counts.loop(), self.counts.others()
        n = self.messages
        return loop.python / n, loop.c / n, others.python / n, others.c / n


@contextmanager
def warmed_up(server: InProcessServer, path: Path_) -> Iterator[Load]:
    """``path``'s load on ``server``, past its warm-up rounds; closed afterwards."""
    load = path.load(server)
    try:
        for _ in range(WARM_UP_ROUNDS):
            load.round()
        yield load
    finally:
        load.close()


def measure(server: InProcessServer, path: Path_) -> Measured:
    counts: list[Counts] = []
    with warmed_up(server, path) as load, server.counting(counts):
        for _ in range(ROUNDS):
            load.round()
    return Measured(path.name, ROUNDS * load.messages_per_round(), counts[0])


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessServer]:
    running = InProcessServer(tmp_path_factory.mktemp("budget")).start()
    yield running
    running.stop()


@pytest.mark.parametrize("path", PATHS, ids=[p.name for p in PATHS])
def test_calls_per_message_within_budget(server: InProcessServer, path: Path_) -> None:
    got = measure(server, path)
    loop_py, loop_c, others_py, others_c = got.per_message()
    report = (
        f"{path.name}: {loop_py:.1f} Python + {loop_c:.1f} C calls a message on the loop, "
        f"{others_py:.1f} + {others_c:.1f} on the other threads (budget {path.budget})"
    )
    checks = [
        ("loop Python", loop_py, path.budget.loop[0], LOOP_SLACK),
        ("loop C", loop_c, path.budget.loop[1], LOOP_SLACK),
        ("other threads' Python", others_py, path.budget.others[0], OTHERS_SLACK),
        ("other threads' C", others_c, path.budget.others[1], OTHERS_SLACK),
    ]
    for what, value, budget, slack in checks:
        assert value <= budget * (1 + slack) + 1, f"over budget ({what}): {report}"
    for what, value, budget, _ in checks:
        assert budget < 20 or value >= budget * TIGHT, f"well under budget ({what}), lower it: {report}"


# A tenant: the same loads in vhost t1, under a rule file with a deny inside the readable tree, so
# that the MQTT subscription is read in part (Mosquitto's rule: each topic decided once, cached).
TENANT_RULES = """\
topic deny bench/secret
topic readwrite bench/#
topic all $queue/budget-transient
"""
# Anonymous clients have guest's permissions: / from the first start, t1 granted here.
TENANT_GRANTS = [{"user": "guest", "vhost": "t1"}]
TENANT_COST = 0.05  # issue 33: rules and a non-default vhost cost at most 5% of a message's work
TENANT_PATHS = [
    (
        "mqtt qos0 fan-in 4->1",
        _mqtt(
            publishers=4,
            subscribers=1,
            qos=0,
            topic="bench/t",
            batch=50,
            topic_filter="bench/#",
            username="t1:budget",
        ),
    ),
    ("amqp091 transient", lambda s: Amqp091Load(s.port("amqp"), durable=False, batch=100, vhost="t1")),
]


@pytest.fixture(scope="module")
def tenant_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessServer]:
    data = tmp_path_factory.mktemp("budget-tenant")
    rules = data / "acl"
    rules.write_text(TENANT_RULES)
    running = InProcessServer(
        data, vhosts=["/", "t1"], auth={"acl_file": rules, "permissions": TENANT_GRANTS}
    ).start()
    yield running
    running.stop()


@pytest.mark.parametrize("name", [n for n, _ in TENANT_PATHS])
def test_a_tenant_under_rules_costs_at_most_5_percent_more(tenant_server: InProcessServer, name: str) -> None:
    """Against the budget of the same path in ``/`` without rules (which its own test holds to the
    count): the reads' cuts move a single count by a few percent, a budget does not."""
    plain = next(p for p in PATHS if p.name == name).budget
    tenant = measure(tenant_server, Path_(name, dict(TENANT_PATHS)[name], plain))
    tenant_py, tenant_c, _, _ = tenant.per_message()
    report = (
        f"{name}: in vhost t1 under rules {tenant_py:.1f} Python + {tenant_c:.1f} C calls a message, "
        f"the budget in / without rules {plain.loop[0]} + {plain.loop[1]}"
    )
    assert tenant_py <= plain.loop[0] * (1 + TENANT_COST), report
    assert tenant_c <= plain.loop[1] * (1 + TENANT_COST), report


def loop_time(server: InProcessServer, path: Path_, repeats: int = 5) -> list[float]:
    """Nanoseconds of the loop thread's CPU a message, for each of ``repeats`` times ROUNDS."""
    times = []
    with warmed_up(server, path) as load:
        for _ in range(repeats):
            before = server.loop_cpu_ns()
            for _ in range(ROUNDS):
                load.round()
            times.append((server.loop_cpu_ns() - before) / (ROUNDS * load.messages_per_round()))
    return times


def time_paths(names: list[str]) -> None:
    """``--cpu``: the loop's CPU time a message on each path, in this build (compiled or not). For
    an A/B of two trees run each in turn a few times and compare the least: the spread between runs
    of one tree is often 10-20%, where a count does not move."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        server = InProcessServer(Path(tmp), timed=True).start()
        try:
            build = "compiled" if COMPILED else "source"
            print(f"{'path':48} {'least':>8} {'median':>8}  ns of the loop's CPU a message ({build})")
            for path in [p for p in PATHS if not names or any(n in p.name for n in names)]:
                times = sorted(loop_time(server, path))
                print(f"{path.name:48} {times[0]:8.0f} {times[len(times) // 2]:8.0f}", flush=True)
        finally:
            server.stop()


def main() -> None:
    import tempfile

    args = sys.argv[1:]
    if args[:1] == ["--cpu"]:
        time_paths(args[1:])
        return
    if COMPILED:
        sys.exit(f"the hot modules run compiled: counts would miss their calls; run with {ENV}=1")

    with tempfile.TemporaryDirectory() as tmp:
        server = InProcessServer(Path(tmp)).start()
        try:
            print(f"{'path':32} {'loop py':>8} {'loop C':>8} {'other py':>9} {'other C':>8}")
            for path in PATHS if not args else [p for p in PATHS if args[0] in p.name]:
                got = measure(server, path)
                print(f"{path.name:32} " + " ".join(f"{v:8.1f}" for v in got.per_message()), flush=True)
        finally:
            server.stop()
        rules = Path(tmp) / "acl"
        rules.write_text(TENANT_RULES)
        tenant = InProcessServer(
            Path(tmp) / "tenant", vhosts=["/", "t1"], auth={"acl_file": rules, "permissions": TENANT_GRANTS}
        ).start()
        try:
            for name, load in TENANT_PATHS:
                got = measure(tenant, Path_(name, load, Budget(loop=(0, 0))))
                label = f"{name} (t1, rules)"
                print(f"{label:32} " + " ".join(f"{v:8.1f}" for v in got.per_message()), flush=True)
        finally:
            tenant.stop()


if __name__ == "__main__":
    main()
