"""Every failure a person can cause ends in one line naming the cause, a non-zero status and no
traceback: ports in use, missing files, a database that cannot be reached, a typo, a closed pipe."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from trimaran.cli import build_parser, main
from trimaran.errors import StartupError, bind_failure, startup_problem

ALL_OFF = ["--mqtt", "off", "--mqtt-ws", "off", "--amqp", "off", "--http", "off"]


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in list(os.environ):
        if name.startswith("TRIMARAN_"):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)


@pytest.fixture
def busy_port() -> Iterator[int]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def trimaran(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "trimaran", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**os.environ, **(env or {})},
        timeout=60,
    )


def last_line(result: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in result.stderr, result.stderr
    return result.stderr.strip().splitlines()[-1]


def test_mqtt_port_in_use_names_listener_and_port(tmp_path: Path, busy_port: int) -> None:
    args = [*ALL_OFF, "--mqtt", f"127.0.0.1:{busy_port}"]
    result = trimaran("serve", *args, cwd=tmp_path)
    assert result.returncode == 2
    assert last_line(result) == (
        f"trimaran: cannot start: mqtt listener cannot bind 127.0.0.1:{busy_port}: "
        "address already in use (another process listens there)"
    )


def test_unreachable_postgresql_is_one_line(tmp_path: Path, busy_port: int) -> None:
    # A port that accepts and never speaks PostgreSQL would hang; a closed one refuses at once.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed = sock.getsockname()[1]
    result = trimaran(
        "serve", *ALL_OFF, "--storage", f"postgresql://u:secret@127.0.0.1:{closed}/db", cwd=tmp_path
    )
    assert result.returncode == 2
    line = last_line(result)
    assert line.startswith(
        f"trimaran: cannot start: cannot open the database postgresql+psycopg://u:***@127.0.0.1:{closed}/db: "
    )
    assert "refused" in line.lower()
    assert "secret" not in result.stderr


def test_db_upgrade_on_unreachable_database_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed = sock.getsockname()[1]
    assert main(["db", "upgrade", "--storage", f"postgresql://u@127.0.0.1:{closed}/db"]) == 2
    assert capsys.readouterr().err.startswith("trimaran: cannot open the database")


def test_missing_tls_file_named_before_the_database_is_created(tmp_path: Path) -> None:
    env = {
        "TRIMARAN_LISTENERS__TLS__CERT_FILE": str(tmp_path / "nope" / "cert.pem"),
        "TRIMARAN_LISTENERS__TLS__KEY_FILE": str(tmp_path / "nope" / "key.pem"),
    }
    result = trimaran(
        "serve", *ALL_OFF, "--mqtt-tls", "127.0.0.1:0", "--data-dir", "d", cwd=tmp_path, env=env
    )
    assert result.returncode == 2
    assert last_line(result) == (
        f"trimaran: cannot start: invalid setting listeners.tls: cert_file {tmp_path / 'nope' / 'cert.pem'} "
        "does not exist or is not a file"
    )
    assert not (tmp_path / "d").exists()


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["serv"], "did you mean 'serve'?"),
        (["queues", "lst"], "did you mean 'list'?"),
        (["serve", "--mqtt-tsl", "1"], "did you mean '--mqtt-tls'?"),
        (["clients", "list", "--jsn"], "did you mean '--json'?"),
    ],
)
def test_typo_gets_did_you_mean(argv: list[str], expected: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert expected in err
    assert len(err.strip().splitlines()) == 1


def test_unknown_setting_gets_did_you_mean(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "trimaran.toml").write_text("[listeners]\nmqtt_wss_paths = []\n[log]\nlevl = 'info'\n")
    assert main(["config", "show"]) == 2
    err = capsys.readouterr().err
    assert "invalid setting listeners.mqtt_wss_paths: unknown setting; did you mean 'mqtt_ws_paths'?" in err
    assert "invalid setting log.levl: unknown setting; did you mean 'level'?" in err


def test_version_flag_and_command(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.startswith("trimaran 0.")


def test_every_subcommand_has_a_description() -> None:
    def walk(parser: object, path: str) -> Iterator[tuple[str, object]]:
        import argparse

        assert isinstance(parser, argparse.ArgumentParser)
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                helps = {choice.dest: choice.help for choice in action._choices_actions}
                for name, sub in action.choices.items():
                    assert helps.get(name), f"{path} {name} has no help line"
                    yield f"{path} {name}", sub
                    yield from walk(sub, f"{path} {name}")

    found = dict(walk(build_parser(), "trimaran"))
    assert {
        "trimaran serve",
        "trimaran clients kick",
        "trimaran queues purge",
        "trimaran config example",
    } <= set(found)
    for name, parser in found.items():
        assert getattr(parser, "description", None), f"{name} has no description"


def test_config_show_into_a_closed_pipe_is_quiet(tmp_path: Path) -> None:
    script = f"{sys.executable} -m trimaran config show | head -n 1"
    result = subprocess.run(["bash", "-c", script], capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert result.stdout == "{\n"
    assert result.stderr == ""


def test_audit_without_java_is_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.delenv("JAVA_HOME", raising=False)
    assert main(["audit"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("trimaran: audit cannot run: ")
    assert len(err.strip().splitlines()) == 1


def test_audit_without_pyspark_is_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "pyspark" else real(name, *a)
    )
    assert main(["export", "--output", "x"]) == 2
    assert (
        capsys.readouterr().err
        == "trimaran: export cannot run: PySpark is not installed (pip install 'trimaran[analytics]')\n"
    )


def test_startup_problem_looks_inside_groups() -> None:
    error = bind_failure("amqp", "0.0.0.0:5672", OSError(98, "in use"))
    nested = ExceptionGroup("outer", [ExceptionGroup("inner", [error])])
    assert (
        startup_problem(nested)
        == "amqp listener cannot bind 0.0.0.0:5672: address already in use (another process listens there)"
    )
    assert startup_problem(ExceptionGroup("bug", [KeyError("x")])) is None
    assert isinstance(error, StartupError)
