"""proton's own python examples for the transactions and the selector (Debian's
``libqpid-proton11-dev-examples``), run as they are against a real server: ``tx_send`` commits its
batches and ``tx_recv`` accepts them in transactions, ``colour_send`` then ``selected_recv`` (the
selector ``colour = 'green'``) gets the green half."""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

import pytest

pytest.importorskip("proton")

EXAMPLES = Path("/usr/share/proton/examples/python")


def run(example: str, *args: str) -> list[str]:
    script = EXAMPLES / example
    if not script.exists():
        pytest.skip(f"{script} is missing (Debian package libqpid-proton11-dev-examples)")
    done = subprocess.run(
        [sys.executable, str(script), *args], capture_output=True, text=True, timeout=60, cwd=EXAMPLES
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout.splitlines()


def test_tx_send_then_tx_recv(amqp1_url: str) -> None:
    address = f"{amqp1_url}/tx-{uuid.uuid4().hex[:8]}"
    assert run("tx_send.py", "-a", address, "-m", "20", "-b", "5")[-1] == "all messages committed"
    received = run("tx_recv.py", "-a", address, "-m", "20", "-b", "5")
    assert received == [f"{{'sequence': {n}}}" for n in range(1, 21)]


def test_colour_send_then_selected_recv(amqp1_url: str) -> None:
    address = f"{amqp1_url}/colours-{uuid.uuid4().hex[:8]}"
    assert run("colour_send.py", "-a", address, "-m", "10")[-1] == "all messages confirmed"
    assert run("selected_recv.py", "-a", address, "-m", "5") == [f"green {n}" for n in (1, 3, 5, 7, 9)]
