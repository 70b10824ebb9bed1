"""scripts/compile.py: ``make compile`` builds the hot modules; ``make run``'s ``--if-possible`` step
builds them only when no current build is there and falls back to the source, saying why in one line,
where it cannot (no compiler, no headers, a failed build). The build itself is CI's second run
(``make test-compiled``); these tests never start one."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from trimaran import compiled

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def script(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    spec = importlib.util.spec_from_file_location("compile_script", ROOT / "scripts" / "compile.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    # Never the checkout's own tree: a failed build removes the extensions under ROOT/trimaran.
    monkeypatch.setattr(module, "ROOT", tmp_path)
    monkeypatch.setattr(module, "LOG", tmp_path / "build" / "mypyc" / "compile.log")
    monkeypatch.delenv(compiled.ENV, raising=False)
    return module


def no_build_may_start(*args: object, **kwargs: object) -> subprocess.CompletedProcess[bytes]:
    raise AssertionError(f"a build was started: {args}")


def test_a_current_build_is_left_as_it_is(
    script: ModuleType, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(compiled, "why_interpreted", lambda: None)
    monkeypatch.setattr(subprocess, "run", no_build_may_start)
    assert script.if_possible() == 0
    assert capsys.readouterr().out == ""


def test_the_variable_skips_the_build(
    script: ModuleType, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(compiled.ENV, "1")
    monkeypatch.setattr(subprocess, "run", no_build_may_start)
    assert script.if_possible() == 0
    assert capsys.readouterr().out == ""


def test_without_a_compiler_the_source_runs_and_the_line_says_why(
    script: ModuleType, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    lacking = script.cannot_build(cc="no-such-cc-here -O2")
    assert lacking == "no C compiler (no-such-cc-here)"
    monkeypatch.setattr(compiled, "why_interpreted", lambda: "no build")
    monkeypatch.setattr(script, "cannot_build", lambda: lacking)
    monkeypatch.setattr(subprocess, "run", no_build_may_start)
    assert script.if_possible() == 0
    assert capsys.readouterr().out == (
        "compile: no C compiler (no-such-cc-here), so the interpreted source runs (docs/performance.md)\n"
    )


def test_without_python_headers_the_source_runs(script: ModuleType) -> None:
    lacking = script.cannot_build(cc=sys.executable, include="/nonexistent/include")
    assert lacking is not None and lacking.startswith("no Python headers (/nonexistent/include/Python.h")


def test_a_failed_build_leaves_no_half_build_and_the_source_runs(
    script: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    half = tmp_path / "trimaran" / "router" / "table.cpython-311-x86_64-linux-gnu.so"
    half.parent.mkdir(parents=True)
    half.write_bytes(b"")
    started: list[list[str]] = []

    def failing(cmd: list[str], **kwargs: object) -> subprocess.CompletedProcess[bytes]:
        started.append(cmd)
        return subprocess.CompletedProcess(cmd, 1)

    monkeypatch.setattr(compiled, "why_interpreted", lambda: "no build")
    monkeypatch.setattr(script, "cannot_build", lambda: None)
    monkeypatch.setattr(subprocess, "run", failing)
    assert script.if_possible() == 0
    assert started == [[sys.executable, script.__file__]]
    assert not half.exists()
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("compile: building the hot modules with mypyc (no build; once, a few minutes")
    assert out[1] == f"compile: the build failed (log: {script.LOG}), so the interpreted source runs"


def test_make_run_builds_first_if_it_can() -> None:
    makefile = (ROOT / "Makefile").read_text()
    recipe = makefile.split("\nrun: ", 1)[1].split("\n\n", 1)[0].splitlines()[1:]
    assert [line.strip() for line in recipe] == [
        "$(BIN)/python scripts/compile.py --if-possible",
        "$(BIN)/trimaran serve $(ARGS)",
    ]
