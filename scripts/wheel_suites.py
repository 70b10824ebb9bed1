"""The release check of the compiled wheel: the protocol suites run against the installed package.

``make test-wheel`` builds the wheel the way a user's pip does (``python -m build``: the sdist, then
the wheel from it, with ``TRIMARAN_BUILD=compiled`` so that a failed compile fails), installs it
alone in a fresh venv with its ``dev`` extra (the test peers, from the package index), and runs the
suites of ``make test-compiled`` from a copy of ``tests/`` in a directory that holds no
``trimaran/``: what imports is the installed package, not the checkout. ``--wheel PATH`` checks a
wheel built elsewhere (a cibuildwheel artifact); other arguments go to pytest.

Usage: python scripts/wheel_suites.py [--wheel PATH] [--keep DIR] TESTS... [-- PYTEST ARGS]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# What must not reach the fresh venv's processes from the one that starts them.
LEAKS = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONDONTWRITEBYTECODE")


def clean_env() -> dict[str, str]:
    return {
        k: v for k, v in os.environ.items() if k not in LEAKS and not k.startswith(("TRIMARAN_", "PYTEST_"))
    }


def say(line: str) -> None:
    print(f"wheel-suites: {line}", flush=True)


def build(out: Path, tree: Path = ROOT, log: Path | None = None) -> Path:
    """The compiled wheel of ``tree`` (``TRIMARAN_BUILD=compiled``: a failed compile fails), into
    ``out``; the build's output to ``log`` when given."""
    env = clean_env() | {"TRIMARAN_BUILD": "compiled"}
    say(f"building the compiled wheel of {tree} into {out} (python -m build: minutes of CPU)")
    command = [sys.executable, "-m", "build", "--outdir", str(out), str(tree)]
    with contextlib.ExitStack() as stack:
        output = stack.enter_context(log.open("w")) if log is not None else None
        subprocess.run(command, env=env, stdout=output, stderr=output, check=True)
    (wheel,) = out.glob("*.whl")
    return wheel


def install(wheel: Path, venv: Path, extras: str = "[dev,postgres]") -> Path:
    """``wheel`` (with ``extras``) installed alone in a fresh venv; returns its python."""
    subprocess.run([sys.executable, "-m", "venv", str(venv)], env=clean_env(), check=True)
    python = venv / "bin" / "python"
    say(f"installing {wheel.name}{extras} alone in {venv}")
    pip = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    subprocess.run([*pip, f"{wheel}{extras}"], env=clean_env(), check=True)
    return python


def installed(python: Path, venv: Path, cwd: Path) -> str:
    """The installed package's build, checked to be the venv's own and compiled."""
    probe = (
        "import trimaran, trimaran.compiled as c; print(trimaran.__file__); print(c.build(), c.describe())"
    )
    done = subprocess.run(
        [str(python), "-c", probe], cwd=cwd, env=clean_env(), capture_output=True, text=True, check=True
    )
    where, build = done.stdout.splitlines()[:2]
    if not Path(where).resolve().is_relative_to(venv.resolve()):
        raise SystemExit(f"wheel-suites: trimaran imports from {where}, not the fresh venv")
    if not build.startswith("compiled"):
        raise SystemExit(f"wheel-suites: the installed wheel runs {build}")
    return build


def suites(python: Path, run: Path, tests: list[str], pytest_args: list[str]) -> int:
    shutil.copytree(ROOT / "tests", run / "tests", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", run / "pyproject.toml")  # the pytest settings and markers
    env = clean_env() | {"TRIMARAN_REQUIRE_COMPILED": "1"}
    command = [str(python), "-m", "pytest", "-p", "no:cacheprovider", *tests, *pytest_args]
    say(f"running {' '.join(tests)} against the installed package")
    return subprocess.run(command, cwd=run, env=env).returncode


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--wheel", type=Path, help="a built wheel to check (default: build one)")
    parser.add_argument("--keep", type=Path, help="work here and keep it (default: a temporary directory)")
    parser.add_argument("tests", nargs="+", help="test paths, as for make test-compiled")
    args, pytest_args = parser.parse_known_args(argv)
    with tempfile.TemporaryDirectory(prefix="trimaran-wheel-") as scratch:
        work = args.keep or Path(scratch)
        work.mkdir(parents=True, exist_ok=True)
        wheel = args.wheel.resolve() if args.wheel else build(work / "dist")
        venv = work / "venv"
        python = install(wheel, venv)
        run = work / "run"
        run.mkdir()
        say(f"installed build: {installed(python, venv, run)}")
        return suites(python, run, args.tests, [a for a in pytest_args if a != "--"])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
