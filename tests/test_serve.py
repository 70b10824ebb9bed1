"""The real server process: start on port 0, health endpoints, graceful stop on signals."""

from __future__ import annotations

import json
import signal
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.support.server import ALL_OFF, RunningServer


def get(port: int, path: str) -> tuple[int, dict[str, object]]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_serve_health_and_graceful_stop(tmp_path: Path, sig: int) -> None:
    server = RunningServer([*ALL_OFF, "--http", "127.0.0.1:0"], cwd=tmp_path).start()
    try:
        port = server.ports["http"]
        assert port != 0
        status, body = get(port, "/healthz")
        assert status == 200 and body["status"] == "ok"
        status, body = get(port, "/readyz")
        assert status == 200 and body["status"] == "ready"
        assert get(port, "/nowhere")[0] == 404
    finally:
        started = time.monotonic()
        code = server.stop(sig)
    assert code == 0, server.output()
    assert time.monotonic() - started < 5
    assert (tmp_path / "data" / "trimaran.db").exists()
    assert "trimaran stopped" in server.output()


def test_second_server_on_one_data_dir_is_refused(tmp_path: Path) -> None:
    """Both would run the same queues from memory and each deliver every job."""
    first = RunningServer([*ALL_OFF, "--http", "127.0.0.1:0"], cwd=tmp_path).start()
    try:
        second = RunningServer([*ALL_OFF, "--http", "127.0.0.1:0"], cwd=tmp_path)
        with pytest.raises(RuntimeError, match=r"exited at start|did not become ready"):
            second.start(timeout=20)
        assert second.process is not None and second.process.wait(10) == 2
        assert first.process is not None
        assert f"is in use by another trimaran (pid {first.process.pid}," in second.output()
        assert "Traceback" not in second.output()
    finally:
        first.stop()
    third = RunningServer([*ALL_OFF, "--http", "127.0.0.1:0"], cwd=tmp_path).start()  # released at exit
    third.stop()


def test_damaged_database_fails_cleanly(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "trimaran.db").write_bytes(b"not a database" * 1000)
    server = RunningServer([*ALL_OFF, "--http", "127.0.0.1:0"], cwd=tmp_path)
    with pytest.raises(RuntimeError, match=r"exited at start|did not become ready"):
        server.start(timeout=20)
    assert server.process is not None and server.process.wait(10) == 2
    assert "is damaged: file is not a database" in server.output()
    assert "Traceback" not in server.output()


def test_port_in_use_fails_cleanly(tmp_path: Path) -> None:
    first = RunningServer([*ALL_OFF, "--http", "127.0.0.1:0"], cwd=tmp_path).start()
    try:
        port = first.ports["http"]
        second = RunningServer(
            [*ALL_OFF, "--http", f"127.0.0.1:{port}", "--data-dir", str(tmp_path / "other")], cwd=tmp_path
        )
        with pytest.raises(RuntimeError, match=r"exited at start|did not become ready"):
            second.start(timeout=20)
        assert second.process is not None and second.process.wait(10) == 2
        assert f"cannot start: http listener cannot bind 127.0.0.1:{port}: address already in use" in (
            second.output()
        )
        assert "Traceback" not in second.output()
    finally:
        first.stop()
