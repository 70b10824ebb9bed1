"""The Qpid Proton C++ examples (``colour_send``, ``selected_recv``, ``queue_browser`` ...) that
Debian ships as source in ``libqpid-proton11-dev-examples``, compiled here with g++ against
``libqpid-proton-cpp12-dev``: real third-party AMQP 1.0 clients for the tests (issue 34)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

EXAMPLES = Path("/usr/share/proton/examples/cpp")
LIBRARY = "libqpid-proton-cpp12-dev"


def build(name: str, directory: Path) -> Path | str:
    """The compiled example ``name``, or why it cannot be had."""
    source = EXAMPLES / f"{name}.cpp"
    if not source.exists():
        return f"{source} is missing (Debian package libqpid-proton11-dev-examples)"
    compiler = shutil.which("g++")
    if compiler is None:
        return "g++ is not installed: cannot compile the proton C++ examples"
    binary = directory / name
    done = subprocess.run(
        [compiler, "-O1", f"-I{EXAMPLES}", "-o", str(binary), str(source), "-lqpid-proton-cpp"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if done.returncode != 0:
        tail = done.stderr.strip().splitlines()[-3:]
        return f"cannot compile the proton C++ example {name} (Debian package {LIBRARY}?): {tail}"
    return binary
