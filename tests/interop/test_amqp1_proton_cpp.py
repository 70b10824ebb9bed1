"""The proton C++ examples against a real server: ``colour_send`` sends red and green messages to a
queue, ``selected_recv`` (a receiver with the selector ``colour = 'green'``) prints only the green
ones and the red ones stay in the queue; ``queue_browser`` (distribution-mode copy) prints what a
queue holds and leaves it there. Skipped, saying why, when the examples cannot be compiled."""

from __future__ import annotations

import subprocess
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

proton = pytest.importorskip("proton")

from proton import Message  # noqa: E402
from proton.utils import BlockingConnection  # noqa: E402

from tests.support import proton_cpp  # noqa: E402
from tests.support.amqp1 import body_str  # noqa: E402


@pytest.fixture(scope="module")
def examples(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    directory = tmp_path_factory.mktemp("proton-cpp")
    built: dict[str, Path] = {}
    for name in ("colour_send", "selected_recv", "queue_browser"):
        binary = proton_cpp.build(name, directory)
        if isinstance(binary, str):
            pytest.skip(binary)
        built[name] = binary
    return built


class Printer:
    """A long-running example (it receives until killed): the lines it prints, as they come."""

    def __init__(self, args: list[str]) -> None:
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines: list[str] = []
        self.changed = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self.changed:
                self.lines.append(line.rstrip("\n"))
                self.changed.notify_all()

    def wait_for(self, n: int, timeout: float = 10) -> list[str]:
        with self.changed:
            self.changed.wait_for(lambda: len(self.lines) >= n, timeout)
            return list(self.lines)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def conn(amqp1_url: str) -> Iterator[BlockingConnection]:
    c = BlockingConnection(amqp1_url, timeout=10)
    try:
        yield c
    finally:
        c.close()


def held(conn: BlockingConnection, address: str) -> list[str]:
    receiver = conn.create_receiver(address, credit=50, name=f"check-{uuid.uuid4().hex[:6]}")
    got = []
    while True:
        try:
            got.append(body_str(receiver.receive(timeout=0.5)))
        except proton.Timeout:
            break
        receiver.accept()
    receiver.close()
    return got


def test_colour_send_and_selected_recv(
    examples: dict[str, Path], amqp1_url: str, conn: BlockingConnection
) -> None:
    queue = f"colours-{uuid.uuid4().hex[:8]}"
    receiver = Printer([str(examples["selected_recv"]), f"//{amqp1_url}", queue])
    try:
        sent = subprocess.run(
            [str(examples["colour_send"]), "-a", f"{amqp1_url}/{queue}", "-m", "10"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert sent.returncode == 0, sent.stdout + sent.stderr
        lines = receiver.wait_for(5)
    finally:
        receiver.stop()
    assert lines[:5] == [f"green {n}" for n in (1, 3, 5, 7, 9)]
    assert held(conn, queue) == [f"red {n}" for n in (2, 4, 6, 8, 10)]  # left for other receivers


def test_queue_browser_leaves_the_queue_as_it_was(
    examples: dict[str, Path], amqp1_url: str, conn: BlockingConnection
) -> None:
    queue = f"browse-{uuid.uuid4().hex[:8]}"
    sender = conn.create_sender(queue, name="fill")
    for body in ("one", "two", "three"):
        sender.send(Message(body=body))
    sender.close()
    browser = Printer([str(examples["queue_browser"]), f"//{amqp1_url}", queue])
    try:
        lines = browser.wait_for(3)
    finally:
        browser.stop()
    assert lines[:3] == ["one", "two", "three"]
    assert held(conn, queue) == ["one", "two", "three"]
