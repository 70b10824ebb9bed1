"""The Qpid Proton C ``broker`` example (Debian ``libqpid-proton11-dev-examples``), compiled here with
gcc against libqpid-proton (``libqpid-proton11-dev``) and run on a free port: the reference AMQP 1.0
peer for behaviours that are the C broker's to copy (issue 22)."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

SOURCE = Path("/usr/share/proton/examples/c/broker.c")


def build(directory: Path) -> Path | str:
    """The compiled broker, or why it cannot be had."""
    if not SOURCE.exists():
        return f"{SOURCE} is missing (Debian package libqpid-proton11-dev-examples)"
    gcc = shutil.which("gcc")
    if gcc is None:
        return "gcc is not installed: cannot compile the proton C broker example"
    flags: list[str] = []
    if shutil.which("pkg-config"):
        found = subprocess.run(
            ["pkg-config", "--cflags", "--libs", "libqpid-proton"], capture_output=True, text=True
        )
        flags = found.stdout.split() if found.returncode == 0 else []
    binary = directory / "broker"
    done = subprocess.run(
        [gcc, "-O1", "-o", str(binary), str(SOURCE), *(flags or ["-lqpid-proton"]), "-lpthread"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if done.returncode != 0:
        tail = done.stderr.strip().splitlines()[-3:]
        return f"cannot compile the proton C broker example (Debian package libqpid-proton11-dev?): {tail}"
    return binary


@contextmanager
def proton_c_broker(binary: Path) -> Iterator[int]:
    """Run the broker on 127.0.0.1, port 0; yield the port it prints (``listening on N``)."""
    proc = subprocess.Popen(
        [str(binary), "127.0.0.1", "0"],
        cwd=binary.parent,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 10
        port = 0
        for line in proc.stdout:  # "Failed to set up server certificate" first: TLS is not used here
            if line.startswith("listening on "):
                port = int(line.split()[-1])
                break
            if time.monotonic() > deadline:
                break
        if not port:
            raise RuntimeError(f"the proton C broker did not start (exit {proc.poll()})")
        yield port
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
