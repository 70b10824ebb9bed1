"""Print the rooms one durable AMQP 0.9.1 publish enters on the server's event loop.

``python -m tests.support.trace_publish``: a real server in-process (tests/support/budget.py), one
publisher with confirms on a durable queue and no consumer; the loop thread's entries into the
rooms of ``trimaran/`` (tests/support/rooms.py) from the publish's bytes to its confirm, in legs,
leaving out the legs that touch neither a hull, the queues nor storage (the timers' ticks).
"""

from __future__ import annotations

import sys
import tempfile
import threading
import types
from collections.abc import Callable
from pathlib import Path

from tests.support.budget import LOOP_THREAD, InProcessServer, ThreadCounts
from tests.support.budget_load import PAYLOAD, Amqp091Client
from tests.support.rooms import RoomTrace
from trimaran.amqp091 import spec
from trimaran.amqp091.frames import MethodFrame, encode_content
from trimaran.amqp091.properties import BasicProperties

QUEUE = "trace-durable"
WATCHED = ("amqp091/", "queue/", "storage/")


def trace_one_publish() -> RoomTrace:
    trace = RoomTrace()
    tracing = threading.Event()
    with tempfile.TemporaryDirectory() as data:
        server = InProcessServer(Path(data))

        def counting(counts: ThreadCounts) -> Callable[[types.FrameType, str, object], None]:
            loop = counts.name == LOOP_THREAD

            def profile(frame: types.FrameType, event: str, arg: object) -> None:
                if loop and tracing.is_set():
                    trace._profile(frame, event, arg)

            return profile

        server.counter._counting = counting  # type: ignore[method-assign]
        server.start()
        try:
            client = Amqp091Client(server.port("amqp"))
            client.call(spec.QueueDeclare(queue=QUEUE, durable=True), spec.QueueDeclareOk)
            client.call(spec.ConfirmSelect(), spec.ConfirmSelectOk)
            props = BasicProperties(delivery_mode=2)
            wire = encode_content(1, spec.BasicPublish(routing_key=QUEUE), props, PAYLOAD, 131072)
            for warm in (True, False):  # the first publish warms the caches; the second is traced
                if not warm:
                    tracing.set()
                client.sock.sendall(wire)
                confirmed = False
                while not confirmed:
                    for frame in client.read():
                        confirmed = isinstance(frame, MethodFrame) and isinstance(frame.method, spec.BasicAck)
            tracing.clear()
            client.sock.close()
        finally:
            server.stop()
    return trace


def main() -> None:
    trace = trace_one_publish()
    for leg in trace.legs():
        if any(e.room.startswith(WATCHED) for e in leg):
            twice = trace.rooms_entered_twice(leg)
            print(" -> ".join(map(str, leg)) + (f"   [twice: {', '.join(twice)}]" if twice else ""))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
