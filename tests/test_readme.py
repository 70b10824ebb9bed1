"""The README is the front door: short, and its quick start runs as written.

The quick start's set-up block names ``make run`` and ``make test``; ``make run`` is started here as
written, with flags through ``ARGS`` so that every listener takes a free port (port 0) and the data goes
to a temporary directory, and each Python block then runs against it with the port it bound in place
of the default. ``make test`` is the command running this test, so it is only checked to be what CI
calls.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
READY_LINE = re.compile(r"(\S+) listener ready on (\S+):(\d+)")


def _section(title: str) -> str:
    start = README.index(f"\n## {title}\n")
    end = README.find("\n## ", start + 1)
    return README[start : end if end != -1 else None]


def _blocks(text: str, language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", text, flags=re.S)


def test_readme_is_under_200_lines_and_links_only_inside_the_repository() -> None:
    assert README.count("\n") < 200
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README):
        if not target.startswith(("http://", "https://")):
            assert (ROOT / target).exists(), target
    assert "../" not in README


def test_the_two_set_up_commands_are_what_ci_runs() -> None:
    (block,) = _blocks(_section("Set up"), "sh")
    commands = [line.split("#")[0].strip() for line in block.splitlines() if line.strip()]
    assert commands == ["make run", "make test"]
    assert "make test" in (ROOT / ".ci" / "run").read_text()


@pytest.fixture
def served(tmp_path: Path) -> dict[str, int]:
    """``make run`` as the README writes it, every listener on port 0."""
    (block,) = _blocks(_section("Set up"), "sh")
    run = next(line.split("#")[0].split() for line in block.splitlines() if line.startswith("make run"))
    args = f"--mqtt 127.0.0.1:0 --mqtt-ws off --amqp 127.0.0.1:0 --http 127.0.0.1:0 --data-dir {tmp_path}"
    # `make test` installed the venv this test runs from: -o keeps `make run` from installing it again.
    command = [*run, "-o", ".venv/.installed-run", f"ARGS={args}"]
    # The source, as the rest of `make test` runs it: `make run` would otherwise build the hot modules
    # first (minutes; tests/test_compile.py covers that step) and leave the build to the tests after.
    env = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "TRIMARAN_LIMITS__SYS_INTERVAL": "0",
        "TRIMARAN_INTERPRETED": "1",
    }
    process = subprocess.Popen(
        command,
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    lines: list[str] = []
    ports: dict[str, int] = {}
    ready = threading.Event()

    def read() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            lines.append(line)
            match = READY_LINE.search(line)
            if match:
                ports[match.group(1)] = int(match.group(3))
            if "trimaran ready" in line:
                ready.set()
        ready.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert ready.wait(60) and process.poll() is None, "".join(lines)
        yield ports
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)  # make and the server it runs
        process.wait(20)
        reader.join(5)
    assert "trimaran stopped" in "".join(lines), "".join(lines)


def test_quick_start_publishes_and_consumes_on_each_protocol(served: dict[str, int]) -> None:
    blocks = _blocks(_section("Quick start"), "python")
    assert len(blocks) == 3
    expected = [b"hello over MQTT", b"hello over AMQP 0.9.1", b"hello over AMQP 1.0"]
    for block, text in zip(blocks, expected, strict=True):
        code = block.replace("port=1883", f"port={served['mqtt']}").replace("5672", str(served["amqp"]))
        result = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT
        )
        assert result.returncode == 0, result.stderr
        assert text.decode() in result.stdout, (block, result.stdout, result.stderr)


def test_getting_started_shows_the_same_quick_start() -> None:
    """The manual's first publish and consume are the README's, which the test above runs."""
    page = (ROOT / "docs" / "getting-started.md").read_text(encoding="utf-8")
    shown = [block.split("\n", 1)[1] for block in _blocks(page, "python") if block.startswith("# ")]
    for block in _blocks(_section("Quick start"), "python"):
        assert block in shown
