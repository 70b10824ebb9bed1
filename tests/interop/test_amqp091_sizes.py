"""Messages of every size from 0 past frame_max on one channel arrive intact, in order, promptly
(issue 18): each one alone within a quarter of a second, and all of them back to back. The same
pika test against us and RabbitMQ."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator

import pika
import pytest
from pika.adapters.blocking_connection import BlockingChannel

FRAME_MAX = 4096
BODY_MAX = FRAME_MAX - 8  # a body frame's payload: frame_max less the frame header and end octet


def sizes() -> list[int]:
    """0 to a few frames, every size around each frame boundary and a stride in between."""
    chosen = set(range(0, 40)) | set(range(0, 3 * BODY_MAX + 200, 97))
    for k in range(1, 4):
        chosen |= set(range(k * BODY_MAX - 5, k * BODY_MAX + 6))
    chosen |= {FRAME_MAX, 2 * FRAME_MAX, 100_000, 300_000}
    return sorted(chosen)


def body(size: int) -> bytes:
    seed = hashlib.sha256(str(size).encode()).digest()
    return (seed * (size // len(seed) + 1))[:size]


@pytest.fixture
def channel(amqp_port: int) -> Iterator[tuple[pika.BlockingConnection, BlockingChannel]]:
    params = pika.ConnectionParameters("127.0.0.1", amqp_port, frame_max=FRAME_MAX)
    conn = pika.BlockingConnection(params)
    try:
        yield conn, conn.channel()
    finally:
        if conn.is_open:
            conn.close()


def test_each_size_arrives_alone_and_promptly(
    channel: tuple[pika.BlockingConnection, BlockingChannel],
) -> None:
    conn, ch = channel
    queue = ch.queue_declare("", exclusive=True).method.queue
    got: list[bytes] = []
    ch.basic_consume(queue, lambda _c, _m, _p, b: got.append(b), auto_ack=True)
    slow = []
    for size in sizes():
        sent = body(size)
        start = time.monotonic()
        ch.basic_publish("", queue, sent)
        while not got and time.monotonic() - start < 5:
            conn.process_data_events(time_limit=0.01)
        took = time.monotonic() - start
        assert got == [sent], f"size {size}: {[len(b) for b in got]}"
        got.clear()
        if took > 0.25:
            slow.append((size, round(took, 3)))
    assert not slow, f"took more than 0.25 s: {slow}"


def test_all_sizes_back_to_back_arrive_in_order(
    channel: tuple[pika.BlockingConnection, BlockingChannel],
) -> None:
    conn, ch = channel
    queue = ch.queue_declare("", exclusive=True).method.queue
    got: list[bytes] = []
    ch.basic_consume(queue, lambda _c, _m, _p, b: got.append(b), auto_ack=True)
    wanted = [body(size) for size in sizes()]
    for sent in wanted:
        ch.basic_publish("", queue, sent)
    deadline = time.monotonic() + 20
    while len(got) < len(wanted) and time.monotonic() < deadline:
        conn.process_data_events(time_limit=0.05)
    assert [len(b) for b in got] == [len(b) for b in wanted]
    assert got == wanted
