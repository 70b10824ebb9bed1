from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trimaran.cli import main


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in list(os.environ):
        if name.startswith("TRIMARAN_"):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["version"]) == 0
    assert capsys.readouterr().out.startswith("trimaran 0.")


def test_config_show_applies_flags_and_masks(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "trimaran.toml").write_text('[http]\ntokens = ["tok-123"]\n')
    assert main(["config", "show", "--storage", "sqlite:///x.db", "--log-format", "json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["storage"]["url"] == "sqlite:///x.db"
    assert shown["log"]["format"] == "json"
    assert shown["http"]["tokens"] == ["**********"]


def test_bad_setting_exits_2_with_message(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("TRIMARAN_STORAGE__URL", "mysql://nope")
    assert main(["config", "show"]) == 2
    assert "invalid setting storage.url" in capsys.readouterr().err


def test_python_dash_m_bad_flag_exits_2(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "trimaran", "serve", "--mqtt", "nope"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=60,
    )
    assert result.returncode == 2
    assert "invalid setting listeners.mqtt" in result.stderr


def test_db_upgrade_then_current(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["db", "current", "--data-dir", str(tmp_path / "d")]) == 0
    assert capsys.readouterr().out.startswith("empty")
    assert main(["db", "upgrade", "--data-dir", str(tmp_path / "d")]) == 0
    assert "(head)" in capsys.readouterr().out
    assert main(["db", "current", "--data-dir", str(tmp_path / "d")]) == 0
    assert "up to date" in capsys.readouterr().out
    assert (tmp_path / "d" / "trimaran.db").exists()
