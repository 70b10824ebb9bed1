"""Run the real server as a subprocess on port 0 and learn its bound ports from its log."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

READY_LINE = re.compile(r"(\S+) listener ready on (\S+):(\d+)")


def unused_port() -> int:
    """A loopback port nobody listens on (bound and released: free for a moment)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


_held_refusing: list[socket.socket] = []


def refused_port() -> int:
    """A loopback port that refuses connections for the whole test session.

    The socket stays bound and never listens, so a connect gets ECONNREFUSED and no server
    started later (port 0) is given the port: an unused_port() taken at import time could
    be someone's listener by the time a late test connects to it.
    """
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    _held_refusing.append(sock)
    return int(sock.getsockname()[1])


# TRIMARAN_AUTH__USERS for the tests' one user, alice (password "wonderland"), and
# TRIMARAN_AUTH__PERMISSIONS letting her into / (no permission, no entry: guest has / from the start).
ALICE = '[{"name": "alice", "password": "wonderland"}]'
ALICE_PERMISSIONS = '[{"user": "alice", "vhost": "/"}]'

ALL_OFF = ["--mqtt", "off", "--mqtt-ws", "off", "--amqp", "off", "--http", "off"]


class RunningServer:
    """``trimaran serve`` in a child process; ``ports[name]`` is each listener's real port."""

    def __init__(
        self,
        args: list[str],
        *,
        cwd: Path,
        env: dict[str, str] | None = None,
        command: list[str] | None = None,
    ) -> None:
        self.args = args
        # What runs ``serve``: this interpreter's trimaran, or e.g. an installed ``trimaran`` script.
        self.command = command or [sys.executable, "-m", "trimaran"]
        self.cwd = cwd
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        self.ports: dict[str, int] = {}
        self.is_ready = False
        self.lines: list[str] = []
        self.process: subprocess.Popen[str] | None = None
        self._ready = threading.Event()
        self._reader: threading.Thread | None = None

    def start(self, timeout: float = 30.0) -> RunningServer:
        self.process = subprocess.Popen(
            [*self.command, "serve", *self.args],
            cwd=self.cwd,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        if not self._ready.wait(timeout):
            self.kill()
            raise RuntimeError("server did not become ready:\n" + self.output())
        if not self.is_ready:
            self.process.wait(10)
            raise RuntimeError("server exited at start:\n" + self.output())
        return self

    def _read(self) -> None:
        assert self.process is not None and self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line)
            match = READY_LINE.search(line)
            if match:
                self.ports.setdefault(match.group(1), int(match.group(3)))
            if "trimaran ready" in line:
                self.is_ready = True
                self._ready.set()
        self._ready.set()

    def status(self, field: str) -> int:
        """A number of the server's ``/proc`` status (Linux): ``VmRSS``, ``VmHWM`` (kB), or the
        context switches of its main thread, the event loop's (``voluntary_ctxt_switches``)."""
        assert self.process is not None
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1])
        raise AssertionError(f"no {field}")

    def output(self) -> str:
        return "".join(self.lines)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 10.0) -> int:
        assert self.process is not None
        if self.process.poll() is None:
            self.process.send_signal(sig)
        try:
            code = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            code = self.process.wait()
        if self._reader is not None:
            self._reader.join(5)
        return code

    def kill(self) -> None:
        """SIGKILL: the crash tests' way to stop."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        if self._reader is not None:
            self._reader.join(5)

    def wait_for_log_count(self, text: str, count: int, timeout: float = 10.0) -> bool:
        """Whether ``text`` is in the log ``count`` times (or more) within ``timeout``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.output().count(text) >= count:
                return True
            time.sleep(0.02)
        return False

    def wait_for_log(self, text: str, timeout: float = 10.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if text in self.output():
                return True
            time.sleep(0.02)
        return False


@contextmanager
def serving(server: RunningServer) -> Iterator[RunningServer]:
    """Hand out a started server; afterwards stop it and check that it exited cleanly (code 0), with
    its log as the failure message otherwise. In a fixture: ``with serving(...) as s: yield s``."""
    try:
        yield server
    finally:
        assert server.stop() == 0, server.output()
