"""Python memory an idle MQTT connection holds in the broker (issue #47).

Measured with tracemalloc over a live in-process server: blocks allocated while N clients connect
and stay silent, minus the test's own client sockets. The runtime's own share is counted too: the
poller's transport and its entry (the event loop's transport was ~1.1 KB of it before). The bounds
sit a little above today's figures so a regression fails; issue #47's bars are 1.0 KB idle and
1.5 KB with one subscription, and these bounds come down as the per-connection objects shrink.
"""

from __future__ import annotations

import contextlib
import gc
import socket
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.budget import InProcessServer
from trimaran.mqtt.codec import encode
from trimaran.mqtt.packets import MQTT_3_1_1, Connect, Subscribe, SubscriptionOptions
from trimaran.runtime.poller import SocketTransport, _over

CONNECTIONS = 500
# Bytes per idle connection; measured 1,392 B from the source and 1,004 B compiled (2026-12-07 at
# 5559f7e: the client's limits shared, the machine's seldom-used fields in one object made when
# used, the principal made at the first check that remembers something, the runtime connection's
# flow control made when used, a session's queue bounds shared; 1,571 B and 1,201 B at 93d21d3: the
# MQTT machine its own decoder, the permission memo made at the first check, no __dict__ on the
# runtime's connection or the hull, four runtime fields and a hull one gone; 1,755 B and 1,413 B at
# 30c2f63: the session is the router's subscriber, five machine fields and a runtime one made when
# used or gone; 1,852 B and 1,516 B at 8a29a66: the hull is its own entry in a client registry kept
# as a list; 1,943 B and 1,667 B at 6159c15: no event list, peer text or set entry kept; 2,087 B and
# 1,842 B at 3fd9d4b, where an idle session shares one empty backlog; 2,129 B at fea0dba with a host
# string shared; 2,153 B with deadlines in a timing wheel, a client's registry number; 2,236 B
# before, 2,260 B with the poller, 3,378 B on uvloop's transports, 4,276 B before issue #47's cuts).
BOUND = 1_480
# The same with one QoS 1 subscription to a filter of its own (devices/<id>/+: held as its router
# Subscription in the dict of the devices level); measured 1,739 B from the source and 1,396 B
# compiled (2026-12-07 at ea7460c: a trie branch of one subscription held as it, not two levels;
# 1,883 B and 1,556 B at 5559f7e: the idle cuts above, no principal made by a subscription's
# checks without rules, a session's only subscription its subscriptions itself; 2,094 B and 1,779
# B at 93d21d3: a subscription its own Delivery, a session's only one held without a dict, no
# route count without a cluster, the trie's levels without a __dict__, and the idle cuts above;
# 2,436 B and 2,177 B at 30c2f63; 2,512 B and 2,281 B at 8a29a66; 2,623 B and 2,431 B at 6159c15;
# 2,750 B and 2,607 B at 3fd9d4b; 2,862 B with a trie level's only child held alone, and the cuts
# above; 3,158 B before, 3,669 B on 2026-12-05, 4,952 B on 2026-12-02, 6,261 B before that).
BOUND_SUBSCRIBED = 1_850


@pytest.fixture
def server(tmp_path: Path) -> Iterator[InProcessServer]:
    running = InProcessServer(tmp_path).start()
    try:
        yield running
    finally:
        running.stop()


def _connect(port: int, client_id: str, subscribe: bool = False) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(encode(Connect(keep_alive=600, client_id=client_id), MQTT_3_1_1))
    assert sock.recv(16)[:1] == b"\x20"  # CONNACK
    if subscribe:
        wanted = [(f"devices/{client_id}/+", SubscriptionOptions(qos=1))]
        sock.sendall(encode(Subscribe(packet_id=1, subscriptions=wanted), MQTT_3_1_1))
        assert sock.recv(16)[:1] == b"\x90"  # SUBACK
    return sock


def _server_side(snapshot: tracemalloc.Snapshot) -> tracemalloc.Snapshot:
    # The clients live in this process too: their socket objects are not the broker's.
    return snapshot.filter_traces(
        [tracemalloc.Filter(False, socket.__file__), tracemalloc.Filter(False, __file__)]
    )


@pytest.mark.parametrize(("subscribe", "bound"), [(False, BOUND), (True, BOUND_SUBSCRIBED)])
def test_idle_mqtt_connection_memory(server: InProcessServer, subscribe: bool, bound: int) -> None:
    port = server.port("mqtt")
    warm = [_connect(port, f"warm-{n}", subscribe) for n in range(50)]  # caches and first-time allocations
    clients: list[socket.socket] = []
    try:
        time.sleep(0.2)
        gc.collect()
        tracemalloc.start()
        try:
            before = _server_side(tracemalloc.take_snapshot())
            clients = [_connect(port, f"idle-{n}", subscribe) for n in range(CONNECTIONS)]
            time.sleep(0.3)
            gc.collect()
            after = _server_side(tracemalloc.take_snapshot())
        finally:
            tracemalloc.stop()
        grown = sum(stat.size_diff for stat in after.compare_to(before, "filename"))
        per_connection = grown / CONNECTIONS
        what = "subscribed" if subscribe else "idle"
        assert per_connection < bound, f"{per_connection:.0f} B per {what} MQTT connection"
    finally:
        for sock in warm + clients:
            sock.close()


@contextlib.contextmanager
def _broker_side(server: InProcessServer, sock: socket.socket) -> Iterator[socket.socket]:
    """The broker's socket of the connection ``sock`` is the client end of (the poller keeps only
    its descriptor)."""
    local = sock.getsockname()
    conns = [c for c in list(server.app.runner.conns) if c.peer == f"{local[0]}:{local[1]}"]
    assert len(conns) == 1 and isinstance(conns[0].transport, SocketTransport)
    with _over(conns[0].transport._fd) as theirs:
        yield theirs


def test_the_runtime_sets_tcp_nodelay(server: InProcessServer) -> None:
    """The poller sets TCP_NODELAY on what it accepts (the event loops, on their transports)."""
    sock = _connect(server.port("mqtt"), "nodelay")
    try:
        with _broker_side(server, sock) as theirs:
            assert theirs.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
    finally:
        sock.close()


def test_tcp_nodelay_false_turns_it_off(tmp_path: Path) -> None:
    """listeners.tcp_nodelay = false did nothing: the event loops set it and nothing cleared it."""
    running = InProcessServer(tmp_path, listeners={"tcp_nodelay": False}).start()
    try:
        sock = _connect(running.port("mqtt"), "nagle")
        try:
            with _broker_side(running, sock) as theirs:
                assert not theirs.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
        finally:
            sock.close()
    finally:
        running.stop()
