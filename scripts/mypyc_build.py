"""One way to build the hot modules (trimaran/compiled.py MODULES) with mypyc, for both builds:
``make compile`` / ``make run`` in place (scripts/compile.py) and the wheel (setup.py).

Whether the wheel is compiled is :func:`plan`'s decision: ``TRIMARAN_BUILD=pure`` never compiles,
``TRIMARAN_BUILD=compiled`` fails the build where it cannot, and by default (``auto``) the wheel is
compiled where a C compiler, the Python headers and mypyc are, and otherwise is a pure
``py3-none-any`` wheel, said in one line (:func:`say`).

Standard library only at import: setup.py imports this before anything is known to be installed, and
trimaran/compiled.py is read by its path, not through the package (whose dependencies an isolated
build does not have).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import sysconfig
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
MODE_ENV = "TRIMARAN_BUILD"
MODES = ("auto", "pure", "compiled")
# Where the generated C goes, relative to the root (the objects go to build_ext's own build-temp).
TARGET_DIR = "build/mypyc"


class CannotCompile(RuntimeError):
    """TRIMARAN_BUILD=compiled where the build cannot compile."""


def compiled_module(root: Path = ROOT) -> ModuleType:
    """trimaran/compiled.py, loaded on its own (it imports nothing of the package)."""
    spec = importlib.util.spec_from_file_location("_trimaran_compiled", root / "trimaran" / "compiled.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def mode(environ: dict[str, str] | os._Environ[str] = os.environ) -> str:
    value = environ.get(MODE_ENV, "").strip().lower() or "auto"
    if value not in MODES:
        raise CannotCompile(f"{MODE_ENV}={value!r}: one of {', '.join(MODES)}")
    return value


def cannot_build(cc: str | None = None, include: str | None = None) -> str | None:
    """What this machine lacks to build (with this C compiler and these headers: $CC or Python's
    own compiler, and Python's own headers, by default), or None."""
    compiler = (cc or os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(compiler) is None:
        return f"no C compiler ({compiler})"
    headers = Path(include or sysconfig.get_paths()["include"]) / "Python.h"
    if not headers.exists():
        return f"no Python headers ({headers}; Debian: python3-dev)"
    for module in ("mypyc", "setuptools"):
        if importlib.util.find_spec(module) is None:
            return f"no {module} in this Python (pip install -e '.[compile]')"
    return None


def plan(
    environ: dict[str, str] | os._Environ[str] = os.environ, cc: str | None = None, include: str | None = None
) -> str | None:
    """None: compile. Otherwise why the build is pure (the line :func:`say` prints). Raises
    :class:`CannotCompile` when ``TRIMARAN_BUILD=compiled`` and this machine cannot."""
    chosen = mode(environ)
    if chosen == "pure":
        return f"{MODE_ENV}=pure"
    lacking = cannot_build(cc, include)
    if lacking is not None and chosen == "compiled":
        raise CannotCompile(f"{MODE_ENV}=compiled, but {lacking}")
    return lacking


def say(why: str) -> None:
    """The one line a build prints when its wheel is pure."""
    print(
        f"trimaran: a pure py3-none-any wheel, the hot modules not compiled: {why} "
        f"(docs/performance.md; {MODE_ENV}=compiled makes this an error)",
        file=sys.stderr,
        flush=True,
    )


def extensions(root: Path = ROOT) -> list[Any]:
    """The mypyc extensions of the hot modules, with their shared library (compiled.GROUP); paths are
    relative to ``root``, which must be the working directory."""
    from mypyc.build import mypycify

    compiled = compiled_module(root)
    sources = [str(Path(*name.split(".")).with_suffix(".py")) for name in compiled.MODULES]
    return list(mypycify(sources, opt_level="3", group_name=compiled.GROUP, target_dir=TARGET_DIR))


def build_in_place(root: Path = ROOT) -> None:
    """``make compile``: each extension beside its ``.py`` file, objects under build/mypyc/."""
    from setuptools import Distribution

    os.chdir(root)
    dist = Distribution({"name": "trimaran-compiled", "ext_modules": extensions(root)})
    dist.script_args = [
        "build_ext",
        "--inplace",
        "--build-temp",
        f"{TARGET_DIR}/objects",
        "--build-lib",
        f"{TARGET_DIR}/lib",
    ]
    dist.parse_command_line()
    dist.run_commands()
