"""The real server process: start on port 0, health endpoints, graceful stop on signals."""

from __future__ import annotations

import contextlib
import json
import signal
import socket
import sys
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


def _limited(soft: int, hard: int) -> list[str]:
    """``python -m trimaran`` in a process whose open files are limited to (soft, hard)."""
    start = (
        "import resource, runpy, sys; "
        f"resource.setrlimit(resource.RLIMIT_NOFILE, ({soft}, {hard})); "
        "sys.argv = ['trimaran', *sys.argv[1:]]; runpy.run_module('trimaran', run_name='__main__')"
    )
    return [sys.executable, "-c", start]


def test_serve_raises_its_open_files_limit_for_max_connections(tmp_path: Path) -> None:
    env = {"TRIMARAN_LIMITS__MAX_CONNECTIONS": "1000"}
    server = RunningServer(ALL_OFF, cwd=tmp_path, env=env, command=_limited(300, 5000)).start()
    server.stop()
    assert "open files: soft limit raised from 300 to 1256 for 1000 connections" in server.output()


def test_connections_past_the_open_files_limit_are_refused_in_the_log(tmp_path: Path) -> None:
    """libuv resets a connection it cannot take a descriptor for, unseen; the runtime keeps below
    the hard limit and refuses the rest itself, each in a log line."""
    env = {"TRIMARAN_LIMITS__MAX_CONNECTIONS": "1000"}
    args = ["--mqtt", "127.0.0.1:0", "--mqtt-ws", "off", "--amqp", "off", "--http", "off"]
    server = RunningServer(args, cwd=tmp_path, env=env, command=_limited(300, 400)).start()
    room = 400 - 256
    clients: list[socket.socket] = []
    try:
        assert (
            f"open files limited to 400 (the hard limit): at most {room} connections, not 1000"
            in server.output()
        )
        answered = 0
        for i in range(room + 10):
            sock = socket.create_connection(("127.0.0.1", server.ports["mqtt"]), timeout=5)
            clients.append(sock)
            # CONNECT, MQTT 3.1.1, clean session, keep-alive 60, client id "c<i>"
            client_id = f"c{i}".encode()
            body = b"\x00\x04MQTT\x04\x02\x00\x3c" + len(client_id).to_bytes(2, "big") + client_id
            sock.sendall(bytes([0x10, len(body)]) + body)
            with contextlib.suppress(ConnectionResetError):  # refused
                answered += sock.recv(4)[:1] == b"\x20"
        assert answered == room
        deadline = time.monotonic() + 5
        while server.output().count(": max_connections") < 10 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert server.output().count("refused connection from 127.0.0.1:") == 10
    finally:
        for sock in clients:
            sock.close()
        server.stop()


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="counts wake-ups in /proc (Linux)")
def test_a_server_with_nothing_to_do_wakes_for_nothing(tmp_path: Path) -> None:
    """Issue 47: idle costs nothing. With MQTT and AMQP listening and nothing connected, declared or
    due, the housekeeping of every front end and the queue timers sleep until they are told of
    something; what is left is the disk watermark's measurement (every 10 s this far from it) and
    $SYS (every 10 s). Before, four tasks woke on a period: about 12 wake-ups in these 3 s, each a
    cancel scope's work."""
    server = RunningServer(
        ["--mqtt", "127.0.0.1:0", "--mqtt-ws", "off", "--amqp", "127.0.0.1:0", "--http", "off"], cwd=tmp_path
    ).start()
    try:
        time.sleep(1.0)  # what start-up scheduled
        before = server.status("voluntary_ctxt_switches")
        time.sleep(3.0)
        woke = server.status("voluntary_ctxt_switches") - before
    finally:
        assert server.stop() == 0, server.output()
    assert woke <= 3, f"{woke} wake-ups in 3 s"
