"""Debian's Mosquitto on a free loopback port, for the tests that run the same clients against it."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.support.server import unused_port


@contextmanager
def running_mosquitto(directory: Path, extra_conf: str = "") -> Iterator[int]:
    """Mosquitto with anonymous access, no persistence and ``extra_conf`` (e.g. an ``acl_file`` line),
    its config in ``directory``; yields its port. Skips the test when it is missing or does not start."""
    if shutil.which("mosquitto") is None:
        pytest.skip("Mosquitto is not installed (apt-get install mosquitto; scripts/system-deps.sh)")
    port = unused_port()
    conf = directory / "mosquitto.conf"
    conf.write_text(f"listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\n{extra_conf}")
    process = subprocess.Popen(
        ["mosquitto", "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    pytest.skip("Mosquitto did not start")
                time.sleep(0.1)
        yield port
    finally:
        process.terminate()
        process.wait(10)
