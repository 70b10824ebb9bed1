"""The release as a user gets it: the sdist and the wheel build without a warning, their metadata
passes ``twine check --strict``, and the wheel, installed into a fresh venv away from the checkout,
serves: one MQTT publish to ``$queue/`` and one AMQP 0.9.1 consume of it, then a clean SIGTERM.

The build runs from a copy of the checkout (so the checkout gets no ``build/`` or ``*.egg-info``),
with build isolation, as a packager's would. The fresh venv's dependencies come from the package
index through pip's cache. Marked ``release``: ``-m "not slow and not release"`` leaves it out of a
quick local run; ``make test`` (CI) runs it.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import zipfile
from dataclasses import dataclass
from email.parser import HeaderParser
from pathlib import Path

import pika
import pytest

import trimaran
from tests.support import paho
from tests.support.server import RunningServer

# The module took 8 s here with a warm pip cache and 12 s with an empty one; the fresh venv's
# dependencies come from the package index, so the timeout leaves room for a slow one.
pytestmark = [pytest.mark.release, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parent.parent

# Anything the build prints that looks like a warning fails the check: setuptools' own
# (``SetuptoolsDeprecationWarning: ...``, ``WARNING `project.license` ...``, framed by ``!!``) and
# distutils' log lines (``warning: no files found matching ...``).
WARNING_LINE = re.compile(r"(?i)warn|deprecat|^\s*!!\s*$")

# Top-level entries of a checkout that are not sources: local state, caches, earlier builds.
NOT_SOURCES = {
    ".git",
    ".venv",
    "data",
    "build",
    "dist",
    ".pytest_cache",
    ".mypy_cache",
    ".ruff_cache",
    ".hypothesis",
    "spark-warehouse",
}

# The environment a user's shell would give a fresh install: nothing that points back at the
# checkout or at the test run's interpreter, and no settings of the test run's own.
LEAKS = {"PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "VIRTUAL_ENV", "PYTHONDONTWRITEBYTECODE"}


def outside_env() -> dict[str, str]:
    return {
        name: value
        for name, value in os.environ.items()
        if name not in LEAKS and not name.startswith(("TRIMARAN_", "PYTEST_"))
    }


def build_warnings(log: str) -> list[str]:
    return [line for line in log.splitlines() if WARNING_LINE.search(line)]


@dataclass
class Built:
    log: str
    sdist: Path
    wheel: Path


def copy_sources(destination: Path) -> Path:
    def skip(directory: str, names: list[str]) -> set[str]:
        at_top = Path(directory) == ROOT
        return {
            name
            for name in names
            if (at_top and name in NOT_SOURCES) or name == "__pycache__" or name.endswith(".egg-info")
        }

    shutil.copytree(ROOT, destination, ignore=skip)
    return destination


def run(command: list[str], *, cwd: Path, env: dict[str, str], timeout: float) -> str:
    """Run to completion; the combined output, or a failure that shows it."""
    done = subprocess.run(
        command,
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, f"{' '.join(command)} exited {done.returncode}:\n{done.stdout}"
    return done.stdout


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    work = tmp_path_factory.mktemp("release")
    source = copy_sources(work / "source")
    out = work / "dist"
    # PYTHONPATH stays (it may be how this interpreter finds build); bytecode settings do not, as
    # distutils warns when it cannot byte-compile.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    # The pure wheel: compiling is minutes of CPU, tests/test_wheel.py's slow test builds that one.
    env["TRIMARAN_BUILD"] = "pure"
    log = run(
        [sys.executable, "-m", "build", "--outdir", str(out), str(source)], cwd=work, env=env, timeout=300
    )
    sdists, wheels = sorted(out.glob("*.tar.gz")), sorted(out.glob("*.whl"))
    assert len(sdists) == 1 and len(wheels) == 1, log
    return Built(log, sdists[0], wheels[0])


@pytest.mark.parametrize(
    "line",
    [
        "  setuptools/config/_apply_pyprojecttoml.py:82: SetuptoolsDeprecationWarning: `project.license`",
        "WARNING `project.license` as a TOML table is deprecated",
        "  !!",
        "warning: no files found matching 'CHANGES' under directory 'docs'",
        "UserWarning: Unknown distribution option: 'tests_require'",
    ],
)
def test_a_build_warning_is_caught(line: str) -> None:
    assert build_warnings(f"running sdist\n{line}\nadding 'trimaran/__init__.py'\n") == [line]


def test_build_is_warning_free(built: Built) -> None:
    assert built.log.strip(), "the build printed nothing: its log is not being captured"
    assert build_warnings(built.log) == [], built.log


def test_the_pure_wheel_says_so_in_one_line(built: Built) -> None:
    assert built.wheel.name == f"trimaran-{trimaran.__version__}-py3-none-any.whl"
    said = [line for line in built.log.splitlines() if line.startswith("trimaran: ")]
    assert said == [
        "trimaran: a pure py3-none-any wheel, the hot modules not compiled: TRIMARAN_BUILD=pure "
        "(docs/performance.md; TRIMARAN_BUILD=compiled makes this an error)"
    ], built.log


def test_metadata_passes_twine_check(built: Built) -> None:
    run(
        [sys.executable, "-m", "twine", "check", "--strict", str(built.sdist), str(built.wheel)],
        cwd=built.wheel.parent,
        env={**os.environ, "NO_COLOR": "1"},
        timeout=120,
    )
    with zipfile.ZipFile(built.wheel) as wheel:
        names = set(wheel.namelist())
        dist_info = f"trimaran-{trimaran.__version__}.dist-info"
        metadata = HeaderParser().parsestr(wheel.read(f"{dist_info}/METADATA").decode())
    assert metadata["Name"] == "trimaran"
    assert metadata["Version"] == trimaran.__version__
    assert metadata["License-Expression"] == "Apache-2.0"
    assert f"{dist_info}/licenses/LICENSE" in names
    # What the server reads at run time besides modules: the migrations and the typing marker.
    assert "trimaran/py.typed" in names
    assert "trimaran/storage/migrations/script.py.mako" in names
    assert any(name.startswith("trimaran/storage/migrations/versions/0001_") for name in names)
    with tarfile.open(built.sdist) as sdist:
        top = f"trimaran-{trimaran.__version__}"
        members = set(sdist.getnames())
    assert {f"{top}/LICENSE", f"{top}/CHANGELOG.md", f"{top}/README.md", f"{top}/pyproject.toml"} <= members
    # The test suite whole (setuptools alone ships only tests/test*.py, which import tests.support).
    assert {f"{top}/tests/conftest.py", f"{top}/tests/support/server.py"} <= members
    assert not [name for name in members if "__pycache__" in name]


def test_installed_wheel_serves_mqtt_to_amqp_and_stops_cleanly(
    built: Built, tmp_path_factory: pytest.TempPathFactory
) -> None:
    home = tmp_path_factory.mktemp("user")  # away from the checkout: nothing there to import
    env = outside_env()
    venv = home / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", str(venv)], cwd=home, env=env, timeout=120)
    python, script = venv / "bin" / "python", venv / "bin" / "trimaran"
    # This interpreter's pip installs into the fresh venv (--python), so it needs no pip of its own.
    run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", str(built.wheel)],
        cwd=home,
        env=env,
        timeout=540,
    )

    imported = run(
        [str(python), "-c", "import trimaran; print(trimaran.__file__)"], cwd=home, env=env, timeout=60
    )
    assert Path(imported.strip()).is_relative_to(venv), imported
    assert run([str(script), "--version"], cwd=home, env=env, timeout=60).strip() == (
        f"trimaran {trimaran.__version__}"
    )

    args = ["--mqtt", "127.0.0.1:0", "--mqtt-ws", "off", "--amqp", "127.0.0.1:0", "--http", "127.0.0.1:0"]
    server = RunningServer(args, cwd=home, command=[str(script)])
    server.env = {**env, "PYTHONUNBUFFERED": "1"}
    server.start()
    try:
        publisher = paho.connect(paho.Endpoints("127.0.0.1", server.ports["mqtt"]), "release-publisher")
        try:
            publisher.publish("$queue/release-smoke", b"from the wheel", qos=1)  # PUBACK after the commit
        finally:
            publisher.disconnect()

        connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", server.ports["amqp"]))
        try:
            channel = connection.channel()
            method, _properties, body = next(channel.consume("release-smoke", inactivity_timeout=10))
            assert method is not None, "no message consumed from release-smoke within 10 s"
            assert body == b"from the wheel"
            channel.basic_ack(method.delivery_tag)
            channel.cancel()
        finally:
            connection.close()
    finally:
        code = server.stop(signal.SIGTERM, timeout=20)
    assert code == 0, server.output()
    assert "trimaran stopped" in server.output()
    assert (home / "data" / "trimaran.db").exists()  # the wheel's migrations ran
