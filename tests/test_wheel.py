"""The wheel's build (setup.py, scripts/mypyc_build.py): compiled with mypyc where a C compiler, the
Python headers and mypyc are, a pure ``py3-none-any`` wheel said in one line where they are not, and
``TRIMARAN_BUILD=pure|compiled`` to force either. The decision is tested here without compiling;
the compiled wheel itself, built, checked by auditwheel and installed into a fresh venv, is the
slow test at the end (minutes of CPU: ``-m slow -k compiled_wheel``)."""

from __future__ import annotations

import importlib.util
import re
import shutil
import sys
import sysconfig
import zipfile
from pathlib import Path
from types import ModuleType, SimpleNamespace

import pytest
from setuptools import Distribution
from setuptools.command.build_ext import build_ext

from tests.test_release import copy_sources, outside_env, run

ROOT = Path(__file__).resolve().parent.parent


def load(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def builder(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.delenv("TRIMARAN_BUILD", raising=False)
    monkeypatch.delenv("CC", raising=False)
    return load(ROOT / "scripts" / "mypyc_build.py", "mypyc_build_under_test")


@pytest.fixture
def setup_py(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.delenv("TRIMARAN_BUILD", raising=False)
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.chdir(ROOT)
    return load(ROOT / "setup.py", "setup_under_test")


def headers(tmp_path: Path) -> str:
    (tmp_path / "Python.h").touch()
    return str(tmp_path)


def test_with_a_compiler_and_headers_the_wheel_is_compiled(builder: ModuleType, tmp_path: Path) -> None:
    assert builder.plan({}, cc=sys.executable, include=headers(tmp_path)) is None
    assert builder.plan({"TRIMARAN_BUILD": "compiled"}, cc=sys.executable, include=headers(tmp_path)) is None


def test_without_a_compiler_or_headers_the_wheel_is_pure_and_says_why(builder: ModuleType) -> None:
    assert builder.plan({}, cc="no-such-cc-here -O2") == "no C compiler (no-such-cc-here)"
    why = builder.plan({}, cc=sys.executable, include="/nonexistent/include")
    assert why.startswith("no Python headers (/nonexistent/include/Python.h")


def test_the_variable_forces_either(builder: ModuleType, tmp_path: Path) -> None:
    assert builder.plan({"TRIMARAN_BUILD": "pure"}, cc=sys.executable, include=headers(tmp_path)) == (
        "TRIMARAN_BUILD=pure"
    )
    with pytest.raises(builder.CannotCompile, match=r"TRIMARAN_BUILD=compiled, but no C compiler"):
        builder.plan({"TRIMARAN_BUILD": "compiled"}, cc="no-such-cc-here")
    with pytest.raises(builder.CannotCompile, match=r"one of auto, pure, compiled"):
        builder.plan({"TRIMARAN_BUILD": "fast"})


def test_setup_falls_back_in_one_line_without_a_compiler(
    setup_py: ModuleType, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("CC", "no-such-cc-here")
    monkeypatch.setattr(sys, "argv", ["setup.py", "bdist_wheel", "--dist-dir", "dist"])
    assert setup_py.ext_modules() == []
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err.startswith("trimaran: a pure py3-none-any wheel, the hot modules not compiled: no C compiler")

    monkeypatch.setenv("TRIMARAN_BUILD", "compiled")
    with pytest.raises(setup_py.mypyc_build.CannotCompile):
        setup_py.ext_modules()


@pytest.mark.parametrize("command", ["egg_info", "sdist", "dist_info", "editable_wheel"])
def test_metadata_the_sdist_and_the_editable_install_never_compile(
    setup_py: ModuleType, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    """The editable install's tree is `make compile`'s to build in place."""
    monkeypatch.setattr(sys, "argv", ["setup.py", command])
    monkeypatch.setattr(setup_py.mypyc_build, "extensions", lambda root: pytest.fail("compiled"))
    assert setup_py.ext_modules() == []
    assert capsys.readouterr().err == ""


def test_a_failed_c_build_gives_the_pure_wheel(
    setup_py: ModuleType, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def fails(self: build_ext) -> None:
        (tmp_path / "trimaran").mkdir(exist_ok=True)
        (tmp_path / "trimaran" / "half.so").touch()
        raise RuntimeError("gcc: internal compiler error")

    monkeypatch.setattr(build_ext, "run", fails)
    dist = Distribution({"name": "trimaran"})
    wheel = SimpleNamespace(root_is_pure=False)
    dist.command_obj["bdist_wheel"] = wheel  # type: ignore[assignment]
    command = setup_py.BuildExt(dist)
    command.build_lib = str(tmp_path)
    command.run()
    assert wheel.root_is_pure and dist.ext_modules == [] and not list(tmp_path.rglob("*.so"))
    assert "the C build failed (RuntimeError: gcc: internal compiler error)" in capsys.readouterr().err

    monkeypatch.setenv("TRIMARAN_BUILD", "compiled")
    with pytest.raises(RuntimeError):
        command.run()


def can_compile() -> str | None:
    builder = load(ROOT / "scripts" / "mypyc_build.py", "mypyc_build_probe")
    return builder.cannot_build()


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_the_compiled_wheel_installs_and_runs_compiled(tmp_path: Path) -> None:
    """What `python -m build` gives where gcc and the headers are: a platform wheel with the
    extensions beside their sources, clean for auditwheel, that runs compiled when installed alone."""
    lacking = can_compile()
    if lacking is not None:
        pytest.skip(f"cannot compile here: {lacking}")
    source = copy_sources(tmp_path / "source")
    out = tmp_path / "dist"
    env = {k: v for k, v in outside_env().items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["TRIMARAN_BUILD"] = "compiled"  # fail, not fall back
    log = run(
        [sys.executable, "-m", "build", "--wheel", "--outdir", str(out), str(source)],
        cwd=tmp_path,
        env=env,
        timeout=1700,
    )
    (wheel,) = out.glob("*.whl")
    tag = sysconfig.get_config_var("SOABI").split("-")[1]  # cpython-311-x86_64-linux-gnu -> 311
    assert re.fullmatch(rf"trimaran-[^-]+-cp{tag}-cp{tag}-linux_[a-z0-9_]+\.whl", wheel.name), (
        wheel.name,
        log,
    )
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    assert "trimaran/mqtt/codec.py" in names
    assert any(re.fullmatch(r"trimaran/mqtt/codec\..*\.so", name) for name in names)
    assert any(re.fullmatch(r"trimaran/_mypyc__mypyc\..*\.so", name) for name in names)

    auditwheel = shutil.which("auditwheel") or str(Path(sys.executable).parent / "auditwheel")
    if Path(auditwheel).exists():
        shown = run([auditwheel, "show", str(wheel)], cwd=tmp_path, env=env, timeout=120)
        # auditwheel wraps its lines: "... is consistent with the\nfollowing platform tag: ..."
        assert 'is consistent with the following platform tag: "manylinux_' in " ".join(shown.split()), shown

    home = tmp_path / "user"
    home.mkdir()
    venv = home / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", str(venv)], cwd=home, env=outside_env(), timeout=120)
    python = venv / "bin" / "python"
    run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", str(wheel)],
        cwd=home,
        env=outside_env(),
        timeout=600,
    )
    version = run([str(python), "-m", "trimaran", "version"], cwd=home, env=outside_env(), timeout=60)
    assert "build: compiled" in version, version
    probe = (
        "import trimaran, trimaran.compiled as c; print(trimaran.__file__); print(c.why_interpreted()); "
        "print(len(c.compiled_modules()), len(c.MODULES))"
    )
    where, why, counts = run([str(python), "-c", probe], cwd=home, env=outside_env(), timeout=60).split("\n")[
        :3
    ]
    assert Path(where).is_relative_to(venv) and why == "None", (where, why)
    running, listed = counts.split()
    assert running == listed and int(running) > 0, counts  # compiled_modules(): all of MODULES
