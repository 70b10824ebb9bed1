"""Debian's Mosquitto on a free loopback port, for the tests that run the same clients against it."""

from __future__ import annotations

import getpass
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
def running_mosquitto(
    directory: Path, extra_conf: str = "", *, port: int | None = None, persistence: bool = False
) -> Iterator[int]:
    """Mosquitto with anonymous access and ``extra_conf`` (e.g. an ``acl_file`` line), its config in
    ``directory``; yields its port (``port``: that one, to start it again where it was).
    ``persistence``: its sessions and queued messages saved in ``directory`` when it stops, and
    loaded when it starts there again. Skips the test when it is missing or does not start."""
    if shutil.which("mosquitto") is None:
        pytest.skip("Mosquitto is not installed (apt-get install mosquitto; scripts/system-deps.sh)")
    port = port or unused_port()
    conf = directory / "mosquitto.conf"
    saving = (
        f"persistence true\npersistence_location {directory}/\n" if persistence else "persistence false\n"
    )
    # Run as root, Mosquitto becomes the mosquitto user, who can neither write its data nor read the
    # tests' certificates in a test's directory.
    user = f"user {getpass.getuser()}\n"
    conf.write_text(f"{user}listener {port} 127.0.0.1\nallow_anonymous true\n{saving}{extra_conf}")
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
